// test_engine.c - the engine (common/engine) on the CUDA backend against the same engine on the CPU
// backend, with the micro base model (models/micro, loaded with model_load(dir, kernels_cuda())):
//   * engine_step logits for batches mixing prefill chunks, decode rows, forked sequences (copy on
//     write of a shared KV block) and base rows, over three adapters of different ranks and targets;
//   * training: log-probs and entropies, and the RL loss (clipped ratio + k3 KL, shared prompt
//     prefixes) with LoRA gradients per slot and full-parameter gradients, tensor by tensor;
//   * a short GRPO run entirely on the GPU (generator, RL loss, AdamW on device memory) whose toy
//     reward rises;
//   * the continuous-batching generator (through rl_runtime_wrap) produces the same greedy
//     completions as on the CPU;
//   * every architecture variant of tests/unit/archutil.h (o_proj and MLP biases, qwen3's q/k norms
//     with head_dim != hidden/heads, gelu and gelu_tanh, llama3 / yarn / linear / dynamic RoPE,
//     mistral's window): logits of prefill + decode steps, log-probs, LoRA and full gradients;
//   * bf16 base weights (model_to_bf16 on the GPU): the conversion is the CPU's rounding bit for
//     bit, and logits, log-probs and LoRA gradients match the CPU engine on an fp32 model with the
//     same bf16-rounded matrices (tu_bf16_reference) within bf16 tolerances (below); full-parameter
//     training is refused; the GRPO run's reward rises with bf16 weights too.
// Built by `make CUDA=1` into build/cuda/bin/marlaas-gpu-tests next to test_kernels.c, whose
// report hooks print the run's SKIPPED / summary lines. Without a visible GPU every test here is
// skipped by the suite's init, with the reason. On a machine without a GPU, tests/gpu/emu/run.sh
// runs these tests against the CPU emulation of the backend, also with strict host/device
// separation (any host dereference of device memory crashes).
//
// Tolerances (fp32 on both sides, different summation orders; on a GPU also FMA contraction and
// CUDA's expf/logf): logits |cuda - cpu| < 1e-3 absolute (logits are O(1..10)); log-probs and
// entropies < 2e-4 absolute; gradients: per tensor max |cuda - cpu| / max |cpu| < 1e-3. The
// emulation measures about 1e-6 on all of them; an indexing or memory bug gives O(0.1..1).
//
// bf16 tolerances: both sides multiply by the same bf16 weights, but gemm_bf16w on the GPU also
// rounds its fp32 input X to bf16 (relative error <= 2^-9 per element, kernels/cuda/cuda.h) in
// each of the 7 products per layer and the head, forward and backward, where the CPU keeps X
// exact: a perturbation of the same size as the weights' own bf16 rounding. On micro the
// emulation (which rounds X as the GPU does) measures logits 0.049 absolute (0.5% of the largest,
// ~14), log-probs 0.059 (0.24% of the largest, ~24; mean 0.011), entropies 0.027, LoRA gradients
// 1.4% of each tensor's largest magnitude. Bounds, about 4x that: logits < 0.2, log-probs < 0.25,
// entropies < 0.1 absolute, LoRA gradients < 0.05 relative per tensor (CE loss: no clipping
// thresholds that rounding could flip). A wrong orientation of W, a wrong layer offset or a
// matrix of another layer gives O(1) relative differences.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/engine/generate.h"
#include "common/engine/optim.h"
#include "common/rl/rl.h"
#include "kernels/cuda/cuda.h"
#include "tests/unit/archutil.h"

#define MICRO "models/micro"

static const kernels_t *G;   // cuda
static const kernels_t *C;   // cpu (reference)

static void setup(void) {
    char why[512];
    setenv("MARLAAS_CUDA_SYNC", "1", 1);   // a faulting kernel is named at its launch
    if (!kernels_cuda_available(why, sizeof why)) cr_skip_test("CUDA engine test skipped: %s", why);
    G = kernels_cuda();
    C = kernels_cpu();
}

TestSuite(engine_cuda, .init = setup, .timeout = 900);

// --- fixtures: the same model and adapters on both backends ----------------------------------------

enum { CPU = 0, GPU = 1 };

typedef struct {
    const kernels_t *k;
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
} side_t;

typedef struct {
    hf_config_t c;
    side_t s[2];
} pair_t;

// bf16: the GPU model is converted with model_to_bf16 and the CPU model is tu_bf16_reference of
// the loaded one (the same bf16 matrices in fp32; micro's tied head untied into a rounded copy).
static pair_t pair_new_as(int n_slots, bool bf16) {
    pair_t p;
    char err[ERR_LEN];
    for (int b = 0; b < 2; b++) {
        side_t *s = &p.s[b];
        s->k = b == GPU ? G : C;
        s->m = model_load(MICRO, s->k, err);
        cr_assert_not_null(s->m, "model_load(%s, %s): %s", MICRO, s->k->name, err);
        s->pool = lora_pool_new(n_slots);
        s->e = engine_new(s->m, s->pool, err);
        cr_assert_not_null(s->e, "%s", err);
    }
    p.c = p.s[CPU].m->cfg;
    // The device copy of the weights is the file's, bit for bit.
    size_t n = p.s[CPU].m->n_params;
    float *back = malloc(sizeof(float) * n);
    G->to_host(back, p.s[GPU].m->params, sizeof(float) * n);
    cr_assert_eq(memcmp(back, p.s[CPU].m->params, sizeof(float) * n), 0, "weights differ after model_load on cuda");
    free(back);
    if (bf16) {
        model_t *ref = tu_bf16_reference(p.s[CPU].m);
        cr_assert_not_null(ref);
        engine_destroy(&p.s[CPU].e);
        model_destroy(&p.s[CPU].m);
        p.s[CPU].m = ref;
        p.s[CPU].e = engine_new(ref, p.s[CPU].pool, err);
        cr_assert_not_null(p.s[CPU].e, "%s", err);
        cr_assert_eq(model_to_bf16(p.s[GPU].m, err), 0, "%s", err);
        // the device's conversion is the CPU's rounding, bit for bit: params16 holds the matrices
        // in arena order, as bf16 of the reference's (rounded, hence exact) matrices
        const model_t *g = p.s[GPU].m;
        uint16_t *dev = malloc(sizeof(uint16_t) * g->n_bf16), *want = malloc(sizeof(uint16_t) * g->n_bf16);
        G->to_host(dev, g->params16, sizeof(uint16_t) * g->n_bf16);
        size_t sizes[MODEL_N_TENSORS], off = 0, at = 0;
        model_param_sizes(&ref->cfg, sizes);
        for (int i = 0; i < MODEL_N_TENSORS; i++) {
            if (tu_kind_is_matrix(i)) {
                cr_assert_leq(at + sizes[i], g->n_bf16);
                C->to_bf16(want + at, ref->params + off, sizes[i]);
                at += sizes[i];
            }
            off += sizes[i];
        }
        cr_assert_eq(at, g->n_bf16, "bf16 arena of %zu values, the matrices have %zu", g->n_bf16, at);
        cr_assert_eq(memcmp(dev, want, sizeof(uint16_t) * at), 0, "model_to_bf16 on cuda differs from the CPU's rounding");
        free(dev);
        free(want);
    }
    return p;
}

static pair_t pair_new(int n_slots) { return pair_new_as(n_slots, false); }

static void pair_free(pair_t *p) {
    for (int b = 0; b < 2; b++) {
        engine_destroy(&p->s[b].e);
        lora_pool_destroy(&p->s[b].pool);
        model_destroy(&p->s[b].m);
    }
}

// The same random adapter (A and B random: a fresh adapter's B = 0 would hide bugs) in `slot` of
// both pools; the device one is made on the device and filled with to_dev.
static void pair_adapter(pair_t *p, int slot, int r, unsigned targets, uint64_t seed) {
    char err[ERR_LEN];
    lora_t *a = tu_adapter(&p->c, r, targets, seed);
    cr_assert_not_null(a);
    lora_t *g = lora_new(&p->c, &a->cfg, G, seed, err);
    cr_assert_not_null(g, "%s", err);
    cr_assert_eq(g->n_params, a->n_params);
    G->to_dev(g->params, a->params, sizeof(float) * a->n_params);
    cr_assert_eq(lora_pool_set(p->s[CPU].pool, slot, &a, err), 0, "%s", err);
    cr_assert_eq(lora_pool_set(p->s[GPU].pool, slot, &g, err), 0, "%s", err);
}

// Slots 0..2: ranks 2, 5 and 8 on different target sets.
static void three_adapters(pair_t *p) {
    pair_adapter(p, 0, 2, LORA_ALL_TARGETS, 101);
    pair_adapter(p, 1, 5, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_DOWN, 102);
    pair_adapter(p, 2, 8, LORA_ALL_TARGETS, 103);
}

static void rand_tokens(int32_t *t, int n, int V, uint64_t seed) {
    rng_t r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rng_next(&r) % (uint64_t)V);
}

// max |a - b| / max |b| over n floats (NaN counts as infinite); *bmax receives max |b|.
static double rel_err(const float *a, const float *b, size_t n, double *bmax, size_t *where) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (isnan(x)) x = INFINITY;
        if (x > d) d = x, *where = i;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    *bmax = m;
    return m > 0 ? d / m : d;
}

// --- (a) inference: engine_step logits ----------------------------------------------------------------

// Runs the same step on both backends and compares the logits rows (n_rows of them): every
// |cuda - cpu| < tol.
static float step_both(pair_t *p, kvcache_t *kc[2], engine_seq_t *q[2], int n, int n_rows, float tol,
                       const char *what) {
    char err[ERR_LEN];
    size_t V = (size_t)p->c.vocab_size;
    float *out[2];
    for (int b = 0; b < 2; b++) {
        out[b] = malloc(sizeof(float) * (size_t)(n_rows ? n_rows : 1) * V);
        cr_assert_eq(engine_step(p->s[b].e, kc[b], q[b], n, out[b], err), 0, "%s on %s: %s", what,
                     p->s[b].k->name, err);
    }
    size_t w = 0;
    float d = tu_max_abs_diff(out[GPU], out[CPU], (size_t)n_rows * V, &w);
    cr_assert_lt(d, tol, "%s: max |cuda - cpu| logit %g at row %zu token %zu (cuda %g, cpu %g)", what, d, w / V,
                 w % V, out[GPU][w], out[CPU][w]);
    free(out[0]);
    free(out[1]);
    return d;
}

Test(engine_cuda, step_logits_match_cpu) {
    pair_t p = pair_new(4);
    three_adapters(&p);
    char err[ERR_LEN];
    int V = p.c.vocab_size, L = p.c.num_hidden_layers, KVd = p.c.num_key_value_heads * p.c.head_dim;
    enum { S = 6, F = 2, T = 40 };
    int32_t tok[S + F][T];
    for (int i = 0; i < S + F; i++) rand_tokens(tok[i], T, V, 500 + i);
    // A cache per backend made for it; block size 4, so a 9-token prompt leaves its last block
    // partial and shared by the forks below (their first decode copies it on the device).
    kvcache_t *kc[2];
    for (int b = 0; b < 2; b++) {
        kc[b] = kvcache_new_on(p.s[b].k, L, KVd, 4, 96, 16, err);
        cr_assert_not_null(kc[b], "%s", err);
        cr_assert_eq(kvcache_backend(kc[b]), p.s[b].k);
    }
    // A cache of the wrong backend is refused, not written.
    engine_seq_t bad = {.tokens = tok[0], .n_tokens = 1, .kv_seq = kvcache_seq_new(kc[CPU], err), .slot = -1,
                        .logits = ENGINE_LOGITS_LAST};
    float dummy[128];
    cr_assert_eq(engine_step(p.s[GPU].e, kc[CPU], &bad, 1, dummy, err), -1);
    cr_assert(strstr(err, "backend"), "%s", err);
    kvcache_seq_free(kc[CPU], bad.kv_seq);

    int seq[2][S + F];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < S; i++) seq[b][i] = kvcache_seq_new(kc[b], err);
    int slot[S] = {0, 1, 2, -1, 0, 1}, len[S] = {9, 3, 12, 1, 7, 6};
    engine_seq_t qs[2][S + F + 1], *q[2] = {qs[0], qs[1]};
    float worst = 0.0f;

    // step 1: prefill sequences 0..4 (sequence 2 with every row's logits), in scrambled order
    int order1[5] = {3, 0, 4, 2, 1}, rows = 0, n = 0;
    for (int j = 0; j < 5; j++) {
        int i = order1[j];
        int lg = i == 2 ? ENGINE_LOGITS_ALL : ENGINE_LOGITS_LAST;
        for (int b = 0; b < 2; b++)
            q[b][n] = (engine_seq_t){.tokens = tok[i], .n_tokens = len[i], .kv_seq = seq[b][i], .slot = slot[i],
                                     .logits = lg};
        rows += lg == ENGINE_LOGITS_ALL ? len[i] : 1;
        n++;
    }
    worst = fmaxf(worst, step_both(&p, kc, q, n, rows, 1e-3f, "step 1 (prefill)"));
    // two forks of sequence 0 (9 tokens: blocks 0-1 full, block 2 partial and shared)
    for (int b = 0; b < 2; b++)
        for (int f = 0; f < F; f++) seq[b][S + f] = kvcache_seq_fork(kc[b], seq[b][0], err);
    cr_assert_eq(kvcache_block_refs(kc[GPU], seq[GPU][S], 8), 3);
    // steps 2..5: decode rows of everything live (forks included), plus in step 2 the prefill of
    // sequence 5 (all rows) and in step 4 a second prefill chunk of sequence 3 (not last: no logits)
    int pos[S + F];
    for (int i = 0; i < S; i++) pos[i] = len[i];
    pos[S] = pos[S + 1] = len[0];
    for (int step = 2; step <= 5; step++) {
        n = 0, rows = 0;
        for (int i = S + F - 1; i >= 0; i--) {   // reverse order: slots interleave
            int si = i >= S ? 0 : slot[i];
            if (i == 5 && step > 2) {
                // decode
            } else if (i == 5) {
                for (int b = 0; b < 2; b++)
                    q[b][n] = (engine_seq_t){.tokens = tok[5], .n_tokens = len[5], .kv_seq = seq[b][5], .slot = si,
                                             .logits = ENGINE_LOGITS_ALL};
                n++, rows += len[5];
                continue;
            }
            if (i == 3 && step == 4) {
                for (int b = 0; b < 2; b++)
                    q[b][n] = (engine_seq_t){.tokens = &tok[3][pos[3]], .n_tokens = 5, .kv_seq = seq[b][3],
                                             .slot = si, .logits = ENGINE_LOGITS_NONE};
                n++, pos[3] += 5;
                continue;
            }
            for (int b = 0; b < 2; b++)
                q[b][n] = (engine_seq_t){.tokens = &tok[i][pos[i]], .n_tokens = 1, .kv_seq = seq[b][i], .slot = si,
                                         .logits = ENGINE_LOGITS_LAST};
            n++, rows++, pos[i]++;
        }
        char what[64];
        snprintf(what, sizeof what, "step %d (decode + prefill)", step);
        worst = fmaxf(worst, step_both(&p, kc, q, n, rows, 1e-3f, what));
    }
    cr_assert_eq(kvcache_free_blocks(kc[GPU]), kvcache_free_blocks(kc[CPU]));
    fprintf(stderr, "engine_cuda step_logits_match_cpu: max |cuda - cpu| logit over 5 steps: %.3g (bound 1e-3)\n",
            (double)worst);
    for (int b = 0; b < 2; b++) kvcache_destroy(&kc[b]);
    pair_free(&p);
}

// --- (b) training: log-probs and RL-loss gradients ------------------------------------------------------

enum { NB = 9, MAXL = 48 };

typedef struct {
    int32_t tok[NB][MAXL];
    float w[NB][MAXL], old[NB][MAXL], ref[NB][MAXL];
    engine_train_seq_t s[NB];
} tbatch_t;

// Nine sequences: two GRPO groups of a prompt-prefix sequence + 2 samples sharing its tokens
// (slots 0 and 2), plus plain sequences on slot 1, slot 0 and the base (-1).
static void make_tbatch(tbatch_t *b, int V) {
    rng_t r;
    rng_seed(&r, 77);
    memset(b, 0, sizeof *b);
    int slot[NB] = {0, 0, 0, 2, 2, 2, 1, -1, 0};
    int len[NB] = {7, 19, 23, 10, 30, 14, 37, 12, 44};
    for (int i = 0; i < NB; i++) {
        rand_tokens(b->tok[i], len[i], V, 900 + i);
        for (int t = 1; t < len[i]; t++) b->w[i][t] = 0.5f + rng_uniform(&r);
        b->s[i] = (engine_train_seq_t){.tokens = b->tok[i], .len = len[i], .slot = slot[i], .weight = b->w[i],
                                       .old_logp = b->old[i], .ref_logp = b->ref[i],
                                       .advantage = 2.0f * rng_uniform(&r) - 1.0f, .on_policy = i % 2 == 0};
    }
    // groups: sequence 0 (7 tokens, no loss) is the prefix of 1 and 2; sequence 3 (10) of 4 and 5
    for (int g = 0; g < 2; g++) {
        int root = 3 * g;
        memset(b->w[root], 0, sizeof b->w[root]);
        b->s[root].weight = NULL;
        for (int k = 1; k <= 2; k++) {
            int i = root + k;
            memcpy(b->tok[i], b->tok[root], sizeof(int32_t) * (size_t)len[root]);
            for (int t = 0; t <= len[root]; t++) b->w[i][t] = 0.0f;
            b->s[i].prefix_of = root + 1;
            b->s[i].prefix_len = len[root];
        }
    }
}

// Log-probs and entropies of the batch at temperature T on both sides (lp, en: [side][seq][t],
// zeroed first); *dlp and *den: max |cuda - cpu| of each.
static void logprobs_both(pair_t *p, tbatch_t *tb, float T, float lp[2][NB][MAXL], float en[2][NB][MAXL], float *dlp,
                          float *den) {
    char err[ERR_LEN];
    memset(lp, 0, sizeof(float) * 2 * NB * MAXL);
    memset(en, 0, sizeof(float) * 2 * NB * MAXL);
    for (int b = 0; b < 2; b++) {
        float *lpp[NB], *enp[NB];
        for (int i = 0; i < NB; i++) lpp[i] = lp[b][i], enp[i] = en[b][i];
        cr_assert_eq(engine_logprobs(p->s[b].e, tb->s, NB, T, lpp, enp, err), 0, "%s: %s", p->s[b].k->name, err);
    }
    *dlp = tu_max_abs_diff(&lp[GPU][0][0], &lp[CPU][0][0], (size_t)NB * MAXL, NULL);
    *den = tu_max_abs_diff(&en[GPU][0][0], &en[CPU][0][0], (size_t)NB * MAXL, NULL);
}

// Full-parameter gradients, tensor by tensor (kind and layer slices together): per tensor
// max |cuda - cpu| / max |cpu| < tol, and no tensor all zero. Host arrays in the model's parameter
// layout; `what` names the case in a failure. Returns the worst relative error.
static double compare_model_grads(const pair_t *p, const float *cpu, const float *cuda, double tol, const char *what) {
    size_t sizes[MODEL_N_TENSORS], off = 0;
    model_param_sizes(&p->c, sizes);
    double worst = 0.0;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        if (sizes[i]) {
            double mx;
            size_t w = 0;
            double e = rel_err(cuda + off, cpu + off, sizes[i], &mx, &w);
            cr_assert_gt(mx, 0.0, "%s model tensor %d: zero gradient", what, i);
            cr_assert_lt(e, tol, "%s model tensor %d: relative error %g at %zu (cuda %.9g, cpu %.9g; bound %g)", what, i,
                         e, w, cuda[off + w], cpu[off + w], tol);
            worst = fmax(worst, e);
        }
        off += sizes[i];
    }
    return worst;
}

// LoRA gradients of slots 0..n_slots-1, tensor by tensor (slot, target, A/B): per tensor
// max |cuda - cpu| / max |cpu| < tol, and no tensor all zero. cpu and cuda are host arrays in the
// layout of each slot's adapter. Returns the worst relative error; *tensors counts the tensors.
static double compare_lora_grads(const pair_t *p, int n_slots, float *const *cpu, float *const *cuda, double tol,
                                 int *tensors) {
    double worst = 0.0;
    *tensors = 0;
    for (int s = 0; s < n_slots; s++) {
        const lora_t *a = lora_pool_get(p->s[CPU].pool, s);
        float *cA[LORA_N_TARGETS], *cB[LORA_N_TARGETS], *gA[LORA_N_TARGETS], *gB[LORA_N_TARGETS];
        lora_point(cA, cB, cpu[s], &p->c, &a->cfg);
        lora_point(gA, gB, cuda[s], &p->c, &a->cfg);
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            if (!cA[t]) continue;
            int in, out;
            lora_target_dims(&p->c, t, &in, &out);
            size_t nl = (size_t)p->c.num_hidden_layers * a->cfg.r, nA = nl * in, nB = nl * out;
            const float *gv[2] = {gA[t], gB[t]}, *cv[2] = {cA[t], cB[t]};
            size_t nn[2] = {nA, nB};
            for (int ab = 0; ab < 2; ab++) {
                double mx;
                size_t w = 0;
                double e = rel_err(gv[ab], cv[ab], nn[ab], &mx, &w);
                cr_assert_gt(mx, 0.0, "slot %d target %s %c: zero gradient, nothing compared", s,
                             peft_target_name(t), "AB"[ab]);
                cr_assert_lt(e, tol, "slot %d target %s lora_%c: relative error %g at %zu (cuda %.9g, cpu %.9g; bound %g)",
                             s, peft_target_name(t), "AB"[ab], e, w, gv[ab][w], cv[ab][w], tol);
                worst = fmax(worst, e);
                (*tensors)++;
            }
        }
    }
    return worst;
}

Test(engine_cuda, train_logprobs_and_lora_grads_match_cpu) {
    pair_t p = pair_new(3);
    three_adapters(&p);
    char err[ERR_LEN];
    int V = p.c.vocab_size;
    static tbatch_t tb;
    make_tbatch(&tb, V);
    const float T = 0.8f;

    // log-probs and entropies
    static float lp[2][NB][MAXL], en[2][NB][MAXL];
    float dlp, den;
    logprobs_both(&p, &tb, T, lp, en, &dlp, &den);
    cr_assert_lt(dlp, 2e-4f, "log-probs: max |cuda - cpu| %g", dlp);
    cr_assert_lt(den, 2e-4f, "entropies: max |cuda - cpu| %g", den);
    // behaviour / reference log-probs around the current ones: some ratios clipped, some not
    rng_t r;
    rng_seed(&r, 5);
    for (int i = 0; i < NB; i++)
        for (int t = 0; t < MAXL; t++) {
            tb.old[i][t] = lp[CPU][i][t] + 0.6f * (rng_uniform(&r) - 0.5f);
            tb.ref[i][t] = lp[CPU][i][t] + 0.4f * (rng_uniform(&r) - 0.5f);
        }

    // RL loss with KL: LoRA gradients of the three slots and full-parameter gradients
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = T, .clip_low = 0.2f, .clip_high = 0.28f, .kl_coef = 0.05f};
    size_t np = p.s[CPU].m->n_params, na[3];
    float *mg[2], *lg[2][3], *host_mg = malloc(sizeof(float) * np), *host_lg[3];
    loss_stats_t st[2][4];
    for (int s = 0; s < 3; s++) na[s] = lora_pool_get(p.s[CPU].pool, s)->n_params;
    for (int b = 0; b < 2; b++) {
        const kernels_t *k = p.s[b].k;
        mg[b] = k->alloc(sizeof(float) * np);
        for (int s = 0; s < 3; s++) lg[b][s] = k->alloc(sizeof(float) * na[s]);
        memset(st[b], 0, sizeof st[b]);
        cr_assert_eq(engine_train(p.s[b].e, tb.s, NB, &lc, mg[b], lg[b], st[b], 4, err), 0, "%s: %s", k->name, err);
    }
    for (int s = 0; s < 3; s++) {
        host_lg[s] = malloc(sizeof(float) * na[s]);
        G->to_host(host_lg[s], lg[GPU][s], sizeof(float) * na[s]);
    }
    G->to_host(host_mg, mg[GPU], sizeof(float) * np);
    // statistics per group (index slot + 1)
    for (int g = 0; g < 4; g++) {
        const loss_stats_t *a = &st[GPU][g], *c = &st[CPU][g];
        cr_assert_gt(c->tokens, 0.0, "group %d has no tokens: the batch does not cover it", g);
        cr_assert_float_eq(a->tokens, c->tokens, 1e-9, "group %d tokens", g);
        cr_assert(fabs(a->loss - c->loss) < 1e-4 * fmax(1.0, fabs(c->loss)), "group %d loss cuda %.9g cpu %.9g", g,
                  a->loss, c->loss);
        cr_assert(fabs(a->kl - c->kl) < 1e-4, "group %d kl cuda %.9g cpu %.9g", g, a->kl, c->kl);
        cr_assert(fabs(a->entropy - c->entropy) < 1e-4, "group %d entropy", g);
        cr_assert(fabs(a->ratio_mean - c->ratio_mean) < 1e-4, "group %d ratio", g);
        cr_assert(fabs(a->clip_frac - c->clip_frac) < 1e-9, "group %d clip fraction cuda %g cpu %g", g, a->clip_frac,
                  c->clip_frac);
    }
    cr_assert(st[CPU][1].clip_frac > 0.0 && st[CPU][1].clip_frac < 1.0, "slot 0: some tokens clipped, not all (%g)",
              st[CPU][1].clip_frac);
    // LoRA gradients, tensor by tensor (slot, target, A/B)
    int tensors = 0;
    double worst = compare_lora_grads(&p, 3, lg[CPU], host_lg, 1e-3, &tensors);
    // full-parameter gradients, tensor by tensor (kind and layer slices together)
    double worst_m = compare_model_grads(&p, mg[CPU], host_mg, 1e-3, "train");
    fprintf(stderr,
            "engine_cuda train: log-probs max |diff| %.3g, entropies %.3g (bound 2e-4); LoRA gradients: %d tensors, "
            "worst relative error %.3g; model gradients worst %.3g (bound 1e-3)\n",
            (double)dlp, (double)den, tensors, worst, worst_m);
    for (int b = 0; b < 2; b++) {
        p.s[b].k->free(mg[b]);
        for (int s = 0; s < 3; s++) p.s[b].k->free(lg[b][s]);
    }
    for (int s = 0; s < 3; s++) free(host_lg[s]);
    free(host_mg);
    pair_free(&p);
}

// --- (c) GRPO on the GPU -----------------------------------------------------------------------------------

// Toy reward: the fraction of the NEW generated tokens that are lowercase letters (ids 66..91 in
// micro's vocabulary: printable ASCII from id 1 = ' '). After these symbol prompts the base model
// rarely writes one; a few GRPO steps teach the adapter to. Sampling at T = 1.3 with groups of 16
// explores enough that every one of 30 seed sets tried on the CPU rose (first 3 steps' mean
// reward 0.00..0.48, last 3 steps' 0.94..1.00), so the numerics of a GPU, which change the samples,
// should not matter.
enum { NEW = 6 };
static double lowercase_reward(const gen_sample_t *s) {
    int good = 0;
    for (int i = 0; i < s->n; i++) good += s->tokens[i] >= 66 && s->tokens[i] <= 91;
    return (double)good / NEW;
}

// The GRPO run on micro loaded on the GPU, its matrices in bf16 (model_to_bf16) or fp32.
// The rollout (paged attention, decode rows) and the trainer (packed attention) compute the same
// log-probs up to fp32 rounding: the mean |difference| must stay under 1e-5 with fp32 weights.
// With bf16 weights gemm_bf16w rounds each product's input to bf16, and an fp32 difference of
// one ulp in an element can flip its rounding, a 2^-9 relative jump: the bound is 1e-3 (the
// emulation measures up to 2e-5 under GPU-like numerics).
static void grpo_on_gpu(bool bf16) {
    const double tol_mismatch = bf16 ? 1e-3 : 1e-5;
    char err[ERR_LEN];
    model_t *m = model_load(MICRO, G, err);
    cr_assert_not_null(m, "%s", err);
    if (bf16) cr_assert_eq(model_to_bf16(m, err), 0, "%s", err);
    hf_config_t c = m->cfg;
    lora_pool_t *pool = lora_pool_new(1);
    peft_config_t pc = {.r = 4, .alpha = 8.0f, .targets = LORA_ALL_TARGETS};
    lora_t *a = lora_new(&c, &pc, G, 9, err);
    cr_assert_not_null(a, "%s", err);
    size_t np = a->n_params;
    cr_assert_eq(lora_pool_set(pool, 0, &a, err), 0, "%s", err);
    lora_t *ad = lora_pool_get(pool, 0);
    engine_t *e = engine_new(m, pool, err);
    kvcache_t *kc = kvcache_new_on(G, c.num_hidden_layers, c.num_key_value_heads * c.head_dim, 8, 128, 64, err);
    cr_assert_not_null(kc, "%s", err);
    gen_t *gn = gen_new(e, kc, NULL, 256, err);
    optim_cfg_t oc = optim_defaults();
    oc.lr = 2e-2f;
    optim_t *o = optim_new(&oc, G, np);
    float *grad = G->alloc(sizeof(float) * np);   // device memory, like the adapter and the moments
    float *grads[1] = {grad};
    enum { NG = 16, P = 4, STEPS = 12, AVG = 3 };
    const float temp = 1.3f;
    double early = 0, late = 0, curve[STEPS];
    for (int step = 0; step < STEPS; step++) {
        int32_t prompt[P] = {60, (int32_t)(step % 5) + 70, 12, 1};
        gen_request_t rq = {.prompt = prompt, .prompt_len = P, .slot = 0, .n_samples = NG, .max_new_tokens = NEW,
                            .sp = {.temperature = temp, .top_k = 0, .top_p = 1.0f}, .seed = 1000 + (uint64_t)step};
        cr_assert_geq(gen_submit(gn, &rq, err), 0, "%s", err);
        cr_assert_eq(gen_run(gn, err), 0, "%s", err);
        gen_result_t *res = gen_take(gn);
        cr_assert_not_null(res);
        double rw[NG], mean = 0, var = 0;
        for (int i = 0; i < NG; i++) mean += (rw[i] = lowercase_reward(&res->samples[i])) / NG;
        for (int i = 0; i < NG; i++) var += (rw[i] - mean) * (rw[i] - mean) / NG;
        curve[step] = mean;
        if (step < AVG) early += mean / AVG;
        if (step >= STEPS - AVG) late += mean / AVG;
        int32_t tok[NG][P + NEW];
        float w[NG][P + NEW], old[NG][P + NEW];
        engine_train_seq_t ts[NG];
        for (int i = 0; i < NG; i++) {
            const gen_sample_t *s = &res->samples[i];
            memcpy(tok[i], prompt, sizeof prompt);
            memset(w[i], 0, sizeof w[i]);
            for (int t = 0; t < s->n; t++) {
                tok[i][P + t] = s->tokens[t];
                old[i][P + t] = s->logprobs[t];
                w[i][P + t] = 1.0f;
            }
            ts[i] = (engine_train_seq_t){.tokens = tok[i], .len = P + s->n, .slot = 0, .weight = w[i],
                                         .old_logp = old[i], .on_policy = true,
                                         .advantage = (float)((rw[i] - mean) / (sqrt(var) + 1e-4))};
        }
        gen_result_free(&res);
        if (var == 0) continue;
        loss_cfg_t lc = {.kind = LOSS_RL, .temperature = temp, .clip_low = 0.2f, .clip_high = 0.28f};
        G->zero(grad, sizeof(float) * np);
        loss_stats_t st[2];
        cr_assert_eq(engine_train(e, ts, NG, &lc, NULL, grads, st, 2, err), 0, "%s", err);
        // on-policy: the trainer's log-probs equal the rollout's (both on the GPU), up to tol
        cr_assert_float_eq(st[1].ratio_mean, 1.0, 10 * tol_mismatch);
        cr_assert_gt(st[1].mismatch_tokens, 0);
        cr_assert_lt(st[1].mismatch, tol_mismatch, "rollout/trainer log-prob mismatch %g (bound %g)", st[1].mismatch,
                     tol_mismatch);
        double norm = optim_step(o, ad->params, grad);
        cr_assert(isfinite(norm) && norm > 0.0, "grad norm %g", norm);
    }
    fprintf(stderr, "engine_cuda grpo (%s weights): mean reward per step:", bf16 ? "bf16" : "fp32");
    for (int s = 0; s < STEPS; s++) fprintf(stderr, " %.2f", curve[s]);
    fprintf(stderr, "; first %d steps %.3f -> last %d steps %.3f (needs +0.4)\n", AVG, early, AVG, late);
    cr_assert_gt(late, early + 0.4, "mean reward %.3f -> %.3f", early, late);
    // the adapter really lives on the device and changed there
    float *host = malloc(sizeof(float) * np);
    G->to_host(host, ad->params, sizeof(float) * np);
    float *A[LORA_N_TARGETS], *B[LORA_N_TARGETS];
    lora_point(A, B, host, &c, &pc);
    double bsum = 0;
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        int in, out;
        lora_target_dims(&c, t, &in, &out);
        for (size_t i = 0; i < (size_t)c.num_hidden_layers * pc.r * out; i++) bsum += fabs(B[t][i]);
    }
    cr_assert_gt(bsum, 0.0, "lora_B still zero after training");
    free(host);
    G->free(grad);
    optim_destroy(&o);
    gen_destroy(&gn);
    kvcache_destroy(&kc);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

Test(engine_cuda, grpo_raises_toy_reward_on_gpu) { grpo_on_gpu(false); }

// bf16 weights change the samples; the reward still rises.
Test(engine_cuda, grpo_raises_toy_reward_on_gpu_bf16) { grpo_on_gpu(true); }

// --- (d) the generator: greedy completions equal ----------------------------------------------------------

// A runtime (model + tokenizer + engine + KV cache on the model's backend + generator) on k.
static rl_runtime_t *runtime_on(const kernels_t *k) {
    char err[ERR_LEN];
    model_t *m = model_load(MICRO, k, err);
    cr_assert_not_null(m, "%s", err);
    tokenizer_t *t = tokenizer_load(MICRO "/tokenizer.json", err);
    cr_assert_not_null(t, "%s", err);
    rl_runtime_cfg_t cfg = {.n_slots = 2, .kv_blocks = 128, .max_seqs = 32, .max_batch_tokens = 24};
    rl_runtime_t *rt = rl_runtime_wrap(&m, &t, &cfg, err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_eq(kvcache_backend(rt->kc), k, "the runtime's KV cache is not on the model's backend");
    return rt;
}

Test(engine_cuda, greedy_generation_matches_cpu) {
    char err[ERR_LEN];
    rl_runtime_t *rt[2] = {runtime_on(C), runtime_on(G)};
    // slot 1 holds the same random adapter on both
    const hf_config_t *cf = &rt[CPU]->model->cfg;
    lora_t *a = tu_adapter(cf, 4, LORA_ALL_TARGETS, 321);
    lora_t *g = lora_new(cf, &a->cfg, G, 321, err);
    G->to_dev(g->params, a->params, sizeof(float) * a->n_params);
    cr_assert_eq(lora_pool_set(rt[CPU]->pool, 1, &a, err), 0, "%s", err);
    cr_assert_eq(lora_pool_set(rt[GPU]->pool, 1, &g, err), 0, "%s", err);
    static const char *tasks[] = {"add1", "rev", "len", "csort", "upper", "maj"};
    enum { NP = 6, MAXNEW = 24 };
    int ids[2][NP];
    gen_result_t *res[2][NP];
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < NP; i++) {
            task_example_t ex;
            task_example(task_find(tasks[i]), TASK_EVAL, (uint64_t)i, &ex);
            int32_t *tok = NULL;
            int n = tokenizer_encode(rt[b]->tok, ex.prompt, strlen(ex.prompt), &tok, err);
            cr_assert_gt(n, 0, "%s", err);
            // every request at once: one continuous batch mixing prompts, slots and forks
            gen_request_t rq = {.prompt = tok, .prompt_len = n, .slot = i % 3 == 2 ? 1 : -1,
                                .n_samples = i % 2 ? 2 : 1, .max_new_tokens = MAXNEW,
                                .sp = {.temperature = 0.0f, .top_p = 1.0f}, .seed = (uint64_t)i,
                                .stop_ids = rt[b]->eos_ids, .n_stop_ids = rt[b]->n_eos, .user = (uint64_t)i};
            ids[b][i] = gen_submit(rt[b]->gen, &rq, err);
            cr_assert_geq(ids[b][i], 0, "%s", err);
            free(tok);
            task_example_free(&ex);
        }
        cr_assert_eq(gen_run(rt[b]->gen, err), 0, "%s on %s", err, rt[b]->model->k->name);
        gen_result_t *r;
        while ((r = gen_take(rt[b]->gen))) res[b][r->user] = r;
        cr_assert_eq(kvcache_free_blocks(rt[b]->kc), kvcache_total_blocks(rt[b]->kc), "every block returned");
    }
    int total = 0, samples = 0;
    float worst = 0.0f;
    for (int i = 0; i < NP; i++) {
        cr_assert_eq(res[GPU][i]->n_samples, res[CPU][i]->n_samples);
        for (int s = 0; s < res[CPU][i]->n_samples; s++) {
            const gen_sample_t *x = &res[GPU][i]->samples[s], *y = &res[CPU][i]->samples[s];
            cr_assert_eq(x->n, y->n, "prompt %d (%s) sample %d: cuda %d tokens, cpu %d", i, tasks[i], s, x->n, y->n);
            cr_assert_eq(memcmp(x->tokens, y->tokens, sizeof(int32_t) * (size_t)y->n), 0,
                         "prompt %d (%s) sample %d: greedy completions differ", i, tasks[i], s);
            cr_assert_eq(x->finish, y->finish);
            for (int t = 0; t < y->n; t++) worst = fmaxf(worst, fabsf(x->logprobs[t] - y->logprobs[t]));
            total += y->n;
            samples++;
        }
    }
    cr_assert_lt(worst, 2e-4f, "greedy token log-probs: max |cuda - cpu| %g", worst);
    fprintf(stderr,
            "engine_cuda generate: %d prompts (%d samples, %d tokens) identical on cuda and cpu; token log-probs max "
            "|diff| %.3g\n",
            NP, samples, total, (double)worst);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < NP; i++) gen_result_free(&res[b][i]);
        rl_runtime_close(&rt[b]);
    }
}

// --- (e) bf16 base weights ------------------------------------------------------------------------------

// The GPU engine on micro in bf16 against the CPU engine on the fp32 model with the same rounded
// matrices (pair_new_as checks the conversion bit for bit), bf16 tolerances (top of the file):
// a prefill of five sequences on three adapters and the base, then three decode steps; log-probs
// and entropies of the training batch (shared prefixes included); LoRA gradients of the CE loss;
// and full-parameter training refused on the GPU.
Test(engine_cuda, bf16_weights_match_cpu_on_rounded_weights) {
    pair_t p = pair_new_as(3, true);
    three_adapters(&p);
    char err[ERR_LEN];
    int V = p.c.vocab_size, L = p.c.num_hidden_layers, KVd = p.c.num_key_value_heads * p.c.head_dim;
    const float tol_logit = 0.2f, tol_lp = 0.25f, tol_en = 0.1f;
    const double tol_grad = 0.05;

    // (1) engine_step: prefill (all rows' logits for sequence 2), then decode steps
    enum { S = 5, T = 24, P = 11 };
    int32_t tok[S][T];
    for (int i = 0; i < S; i++) rand_tokens(tok[i], T, V, 700 + i);
    int slot[S] = {0, 1, 2, -1, 0};
    kvcache_t *kc[2];
    int seq[2][S];
    for (int b = 0; b < 2; b++) {
        kc[b] = kvcache_new_on(p.s[b].k, L, KVd, 4, 64, 8, err);
        cr_assert_not_null(kc[b], "%s", err);
        for (int i = 0; i < S; i++) seq[b][i] = kvcache_seq_new(kc[b], err);
    }
    engine_seq_t qs[2][S], *q[2] = {qs[0], qs[1]};
    int rows = 0;
    for (int i = 0; i < S; i++) {
        int lg = i == 2 ? ENGINE_LOGITS_ALL : ENGINE_LOGITS_LAST;
        for (int b = 0; b < 2; b++)
            q[b][i] = (engine_seq_t){.tokens = tok[i], .n_tokens = P - i, .kv_seq = seq[b][i], .slot = slot[i],
                                     .logits = lg};
        rows += lg == ENGINE_LOGITS_ALL ? P - i : 1;
    }
    float worst_logit = step_both(&p, kc, q, S, rows, tol_logit, "bf16 prefill");
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < S; i++)
            for (int b = 0; b < 2; b++)
                q[b][i] = (engine_seq_t){.tokens = &tok[i][P - i + step], .n_tokens = 1, .kv_seq = seq[b][i],
                                         .slot = slot[i], .logits = ENGINE_LOGITS_LAST};
        worst_logit = fmaxf(worst_logit, step_both(&p, kc, q, S, S, tol_logit, "bf16 decode"));
    }
    for (int b = 0; b < 2; b++) kvcache_destroy(&kc[b]);

    // (2) log-probs and entropies of the training batch
    static tbatch_t tb;
    make_tbatch(&tb, V);
    static float lp[2][NB][MAXL], en[2][NB][MAXL];
    float dlp, den;
    logprobs_both(&p, &tb, 0.8f, lp, en, &dlp, &den);
    cr_assert_lt(dlp, tol_lp, "bf16 log-probs: max |cuda - cpu| %g", dlp);
    cr_assert_lt(den, tol_en, "bf16 entropies: max |cuda - cpu| %g", den);

    // (3) LoRA gradients of the CE loss on the same batch; full-parameter gradients refused
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 0.8f};
    float *lg[2][3], *host_lg[3];
    size_t na[3];
    for (int s = 0; s < 3; s++) na[s] = lora_pool_get(p.s[CPU].pool, s)->n_params;
    for (int b = 0; b < 2; b++) {
        const kernels_t *k = p.s[b].k;
        for (int s = 0; s < 3; s++) lg[b][s] = k->alloc(sizeof(float) * na[s]);
        cr_assert_eq(engine_train(p.s[b].e, tb.s, NB, &lc, NULL, lg[b], NULL, 0, err), 0, "%s: %s", k->name, err);
    }
    for (int s = 0; s < 3; s++) {
        host_lg[s] = malloc(sizeof(float) * na[s]);
        G->to_host(host_lg[s], lg[GPU][s], sizeof(float) * na[s]);
    }
    int tensors = 0;
    double worst = compare_lora_grads(&p, 3, lg[CPU], host_lg, tol_grad, &tensors);
    float *mg = G->alloc(sizeof(float) * p.s[GPU].m->n_params);
    err[0] = '\0';
    cr_assert_eq(engine_train(p.s[GPU].e, tb.s, NB, &lc, mg, lg[GPU], NULL, 0, err), -1);
    cr_assert(strstr(err, "full-parameter training needs fp32 weights") != NULL, "message: %s", err);
    fprintf(stderr,
            "engine_cuda bf16: logits max |cuda - cpu| %.3g (bound %g); log-probs %.3g (bound %g), entropies %.3g "
            "(bound %g); LoRA gradients: %d tensors, worst relative error %.3g (bound %g)\n",
            (double)worst_logit, (double)tol_logit, (double)dlp, (double)tol_lp, (double)den, (double)tol_en, tensors,
            worst, tol_grad);
    G->free(mg);
    for (int b = 0; b < 2; b++)
        for (int s = 0; s < 3; s++) p.s[b].k->free(lg[b][s]);
    for (int s = 0; s < 3; s++) free(host_lg[s]);
    pair_free(&p);
}

// --- (f) architecture variants --------------------------------------------------------------------------

// The variant's random CPU model and the same weights on the GPU, a random adapter in slot 0 of both.
static pair_t pair_variant(int v) {
    pair_t p;
    char err[ERR_LEN];
    p.c = au_config(v, 32, 48, 4, 2, 8, 53);
    p.s[CPU].k = C, p.s[GPU].k = G;
    p.s[CPU].m = tu_model(&p.c, 300 + v);
    cr_assert_not_null(p.s[CPU].m);
    p.s[GPU].m = model_new(&p.c, G, err);
    cr_assert_not_null(p.s[GPU].m, "%s", err);
    G->to_dev(p.s[GPU].m->params, p.s[CPU].m->params, sizeof(float) * p.s[CPU].m->n_params);
    for (int b = 0; b < 2; b++) {
        p.s[b].pool = lora_pool_new(1);
        p.s[b].e = engine_new(p.s[b].m, p.s[b].pool, err);
        cr_assert_not_null(p.s[b].e, "%s", err);
    }
    // the RoPE tables are computed on the host for both: the same bits
    size_t nt = (size_t)p.s[CPU].m->n_pos * p.c.head_dim / 2;
    float *back = malloc(sizeof(float) * nt);
    G->to_host(back, p.s[GPU].m->rope_cos, sizeof(float) * nt);
    cr_assert_eq(memcmp(back, p.s[CPU].m->rope_cos, sizeof(float) * nt), 0, "%s: rope tables differ", au_name(v));
    free(back);
    pair_adapter(&p, 0, 4, LORA_ALL_TARGETS, 400 + v);
    return p;
}

Test(engine_cuda, architecture_variants_match_cpu) {
    enum { P = 13, NDEC = 6, L0 = 19, L1 = 11 };
    for (int v = 0; v < AU_N_VARIANTS; v++) {
        pair_t p = pair_variant(v);
        char err[ERR_LEN];
        int V = p.c.vocab_size;
        // inference: a prefill of 13 tokens on the adapter, then 6 decode steps
        int32_t tok[P + NDEC];
        rand_tokens(tok, P + NDEC, V, 90 + v);
        kvcache_t *kc[2];
        engine_seq_t q[2][1];
        engine_seq_t *qp[2] = {q[0], q[1]};
        for (int b = 0; b < 2; b++) {
            kc[b] = kvcache_new_on(p.s[b].k, p.c.num_hidden_layers, p.c.num_key_value_heads * p.c.head_dim, 4, 32, 4,
                                   err);
            cr_assert_not_null(kc[b], "%s", err);
            q[b][0] = (engine_seq_t){.tokens = tok, .n_tokens = P, .kv_seq = kvcache_seq_new(kc[b], err), .slot = 0,
                                     .logits = ENGINE_LOGITS_ALL};
        }
        char what[96];
        snprintf(what, sizeof what, "%s prefill", au_name(v));
        float dl = step_both(&p, kc, qp, 1, P, 1e-3f, what);
        for (int t = 0; t < NDEC; t++) {
            for (int b = 0; b < 2; b++)
                q[b][0].tokens = tok + P + t, q[b][0].n_tokens = 1, q[b][0].logits = ENGINE_LOGITS_LAST;
            snprintf(what, sizeof what, "%s decode %d", au_name(v), t);
            dl = fmaxf(dl, step_both(&p, kc, qp, 1, 1, 1e-3f, what));
        }
        for (int b = 0; b < 2; b++) kvcache_destroy(&kc[b]);
        // training: log-probs, then CE with LoRA and full-parameter gradients
        int32_t t0[L0], t1[L1];
        rand_tokens(t0, L0, V, 70 + v);
        rand_tokens(t1, L1, V, 80 + v);
        float w0[L0], w1[L1];
        for (int t = 0; t < L0; t++) w0[t] = t >= 3;
        for (int t = 0; t < L1; t++) w1[t] = t >= 2;
        engine_train_seq_t ts[2] = {{.tokens = t0, .len = L0, .slot = 0, .weight = w0},
                                    {.tokens = t1, .len = L1, .slot = -1, .weight = w1}};
        float lp[2][2][L0], *lpp[2][2] = {{lp[0][0], lp[0][1]}, {lp[1][0], lp[1][1]}};
        for (int b = 0; b < 2; b++)
            cr_assert_eq(engine_logprobs(p.s[b].e, ts, 2, 1.0f, lpp[b], NULL, err), 0, "%s", err);
        float dlp = fmaxf(tu_max_abs_diff(lp[GPU][0], lp[CPU][0], L0, NULL),
                          tu_max_abs_diff(lp[GPU][1], lp[CPU][1], L1, NULL));
        cr_assert_lt(dlp, 2e-4f, "%s: log-probs max |cuda - cpu| %g", au_name(v), dlp);
        loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
        size_t np = p.s[CPU].m->n_params, na = lora_pool_get(p.s[CPU].pool, 0)->n_params;
        float *mg[2], *lg[2][1], *host_mg = malloc(sizeof(float) * np), *host_lg[1] = {malloc(sizeof(float) * na)};
        for (int b = 0; b < 2; b++) {
            mg[b] = p.s[b].k->alloc(sizeof(float) * np);
            lg[b][0] = p.s[b].k->alloc(sizeof(float) * na);
            cr_assert_eq(engine_train(p.s[b].e, ts, 2, &lc, mg[b], lg[b], NULL, 0, err), 0, "%s", err);
        }
        G->to_host(host_mg, mg[GPU], sizeof(float) * np);
        G->to_host(host_lg[0], lg[GPU][0], sizeof(float) * na);
        int tensors = 0;
        double worst_l = compare_lora_grads(&p, 1, lg[CPU], host_lg, 1e-3, &tensors);
        double worst_m = compare_model_grads(&p, mg[CPU], host_mg, 1e-3, au_name(v));
        fprintf(stderr, "engine_cuda %s: logits %.3g, log-probs %.3g, LoRA gradients %.3g, model gradients %.3g\n",
                au_name(v), (double)dl, (double)dlp, worst_l, worst_m);
        for (int b = 0; b < 2; b++) {
            p.s[b].k->free(mg[b]);
            p.s[b].k->free(lg[b][0]);
        }
        free(host_mg);
        free(host_lg[0]);
        pair_free(&p);
    }
}

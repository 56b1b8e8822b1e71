// test_bf16.c - bf16 base models (model_to_bf16) on the CPU backend: the engine on a bf16 model
// against the engine on an fp32 model whose matrices hold the same bf16-rounded values (logits
// of engine_step on the prefill and the few-rows decode paths, log-probs of engine_logprobs,
// LoRA gradients of engine_train), against the unrounded fp32 model (a bounded, nonzero
// difference: the bf16 weights are the ones used), the memory layout after conversion, and
// what a bf16 model refuses (full-parameter training, model_save). Untied and tied heads. Also
// the services' --weights setting (kernels_weights_bf16, model_load_as).
//
// Tolerances: the CPU backend's gemm_bf16w multiplies by exactly the bf16 values and, on its
// avx512, avx2 and scalar variants, uses X exactly, so against the rounded fp32 model only the
// fp32 summation order differs (the backward adds W in blocks): about 1e-7 relative per
// product, a few 1e-7 after the layers. The checks allow 1e-5 relative to the largest
// magnitude of each output, 10-100x that, while the bf16 rounding of the weights (up to 2^-8
// relative per weight) moves the outputs by ~1e-2 relative: the unrounded model must differ
// by more than 1e-4 (the bf16 path is used) and less than 5e-2 (it is the same model). These
// tests run on avx512 where the CPU has AVX512_BF16 (tu_x_exact_variant). The avx512-bf16 and
// amx variants round X to bf16 too (kernels.h), which moves their outputs as much as the
// weights' rounding does: there the rounded model is only required within the same 5e-2 (the
// *_x_rounded tests; test_cpu_isa.c checks those products exactly).
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/svc/svc.h"
#include "testutil.h"

typedef struct {
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
} rig_t;

// An engine on m (ownership moves) with the same random adapter in slot 0 of every rig.
static rig_t rig_new(model_t *m) {
    char err[ERR_LEN];
    rig_t g = {.m = m, .pool = lora_pool_new(2)};
    lora_t *a = tu_adapter(&m->cfg, 4, LORA_ALL_TARGETS, 5);
    cr_assert_not_null(a);
    cr_assert_eq(lora_pool_set(g.pool, 0, &a, err), 0, "%s", err);
    g.e = engine_new(m, g.pool, err);
    cr_assert_not_null(g.e, "%s", err);
    return g;
}

static void rig_free(rig_t *g) {
    engine_destroy(&g->e);
    lora_pool_destroy(&g->pool);
    model_destroy(&g->m);
}

// The three rigs: the bf16 model, the fp32 model with rounded matrices, the unrounded one.
enum { BF16, ROUNDED, FP32, N_RIGS };

static void rigs_new(rig_t g[N_RIGS], bool tied) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    c.tie_word_embeddings = tied;
    model_t *m = tu_model(&c, 21);
    cr_assert_not_null(m);
    model_t *b = tu_model(&c, 21);
    cr_assert_eq(model_to_bf16(b, err), 0, "%s", err);
    model_t *r = tu_bf16_reference(m);
    cr_assert_not_null(r);
    g[ROUNDED] = rig_new(r);
    g[BF16] = rig_new(b);
    g[FP32] = rig_new(m);
}

static void rigs_free(rig_t g[N_RIGS]) {
    for (int i = 0; i < N_RIGS; i++) rig_free(&g[i]);
}

static const char *rig_name[N_RIGS] = {"bf16", "fp32 rounded", "fp32"};

// max |got - want| over n, against the largest |want|: got within rel * max |want| of want.
static double rel_diff(const float *got, const float *want, size_t n) {
    double mx = 0.0, d = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
        if (fabs((double)want[i]) > mx) mx = fabs((double)want[i]);
    }
    return d / (mx > 0.0 ? mx : 1.0);
}

// bf16 agrees with the rounded model to 1e-5 (to 5e-2 where X is rounded to bf16 too: x_rounded)
// and differs from the unrounded one by 1e-4 .. 5e-2.
static void expect_bf16(const char *what, const float *out[N_RIGS], size_t n, bool x_rounded) {
    double near = rel_diff(out[BF16], out[ROUNDED], n), far = rel_diff(out[BF16], out[FP32], n);
    double near_max = x_rounded ? 5e-2 : 1e-5;
    cr_log_info("%s: bf16 vs %s %.3g, vs %s %.3g (relative to the largest magnitude)", what, rig_name[ROUNDED], near,
                rig_name[FP32], far);
    cr_assert(near <= near_max, "%s: bf16 model vs fp32 model with bf16-rounded matrices: %.3g > %g", what, near,
              near_max);
    cr_assert(far > 1e-4 && far < 5e-2, "%s: bf16 model vs unrounded fp32 model: %.3g outside (1e-4, 5e-2)", what,
              far);
}

// Prefill (12 and 9 tokens, with and without the adapter: the blocked sgemm path), then three
// decode steps of the two sequences (2 rows: the few-rows path), every logit of every step.
static void check_step(bool tied) {
    rig_t g[N_RIGS];
    rigs_new(g, tied);
    char err[ERR_LEN];
    int V = g[BF16].m->cfg.vocab_size;
    enum { P0 = 12, P1 = 9, STEPS = 3 };
    int32_t t0[P0 + STEPS], t1[P1 + STEPS];
    for (int i = 0; i < P0 + STEPS; i++) t0[i] = (int32_t)((7 * i + 3) % V);
    for (int i = 0; i < P1 + STEPS; i++) t1[i] = (int32_t)((11 * i + 5) % V);
    size_t n = (size_t)(P0 + P1 + 2 * STEPS) * V;
    float *out[N_RIGS];
    for (int r = 0; r < N_RIGS; r++) {
        out[r] = calloc(n, sizeof(float));
        kvcache_t *kc = kvcache_new(g[r].m->cfg.num_hidden_layers, g[r].m->cfg.num_key_value_heads * g[r].m->cfg.head_dim,
                                    4, 64, 4, err);
        cr_assert_not_null(kc, "%s", err);
        int s0 = kvcache_seq_new(kc, err), s1 = kvcache_seq_new(kc, err);
        engine_seq_t q[2] = {{.tokens = t0, .n_tokens = P0, .kv_seq = s0, .slot = 0, .logits = ENGINE_LOGITS_ALL},
                             {.tokens = t1, .n_tokens = P1, .kv_seq = s1, .slot = -1, .logits = ENGINE_LOGITS_ALL}};
        cr_assert_eq(engine_step(g[r].e, kc, q, 2, out[r], err), 0, "%s: %s", rig_name[r], err);
        for (int s = 0; s < STEPS; s++) {
            q[0] = (engine_seq_t){.tokens = t0 + P0 + s, .n_tokens = 1, .kv_seq = s0, .slot = 0, .logits = ENGINE_LOGITS_LAST};
            q[1] = (engine_seq_t){.tokens = t1 + P1 + s, .n_tokens = 1, .kv_seq = s1, .slot = -1, .logits = ENGINE_LOGITS_LAST};
            cr_assert_eq(engine_step(g[r].e, kc, q, 2, out[r] + (size_t)(P0 + P1 + 2 * s) * V, err), 0, "%s: %s",
                         rig_name[r], err);
        }
        kvcache_destroy(&kc);
    }
    expect_bf16("prefill logits", (const float *[]){out[0], out[1], out[2]}, (size_t)(P0 + P1) * V,
                tu_bf16_rounds_x(true, P0 + P1));
    size_t off = (size_t)(P0 + P1) * V;
    expect_bf16("decode logits", (const float *[]){out[0] + off, out[1] + off, out[2] + off}, n - off,
                tu_bf16_rounds_x(true, 2));
    for (int r = 0; r < N_RIGS; r++) free(out[r]);
    rigs_free(g);
}

Test(bf16, step_logits, .init = tu_x_exact_variant) { check_step(false); }
Test(bf16, step_logits_tied_head, .init = tu_x_exact_variant) { check_step(true); }

// The amx and avx512-bf16 variants (the default where the CPU has AMX or AVX512_BF16) round X:
// the same checks with the bound of X's rounding, on the better of the two the CPU runs.
static void want_x_rounded(void) {
    const char *isa = kernels_cpu_variant("amx") ? "amx" : kernels_cpu_variant("avx512-bf16") ? "avx512-bf16" : NULL;
    if (isa) setenv("MARLAAS_CPU_ISA", isa, 1);
}
#define NEED_X_ROUNDED()                                                    \
    if (strcmp(kernels_cpu_isa(), "amx") != 0 && strcmp(kernels_cpu_isa(), "avx512-bf16") != 0) \
    cr_skip_test("this CPU (or its kernel) runs neither the amx nor the avx512-bf16 variant")
Test(bf16, step_logits_x_rounded, .init = want_x_rounded) {
    NEED_X_ROUNDED();
    check_step(false);
}

enum { NS = 3, LEN = 11 };

// Three sequences (two on the adapter, one on the base model), weights from token 3 on.
static void train_batch(engine_train_seq_t s[NS], int32_t tok[NS][LEN], float w[NS][LEN], int V) {
    for (int i = 0; i < NS; i++) {
        for (int t = 0; t < LEN; t++) {
            tok[i][t] = (int32_t)((5 * t + 13 * i + 1) % V);
            w[i][t] = t >= 3 ? 1.0f : 0.0f;
        }
        s[i] = (engine_train_seq_t){.tokens = tok[i], .len = LEN - i, .slot = i == 2 ? -1 : 0, .weight = w[i]};
    }
}

static void check_train(bool tied) {
    rig_t g[N_RIGS];
    rigs_new(g, tied);
    char err[ERR_LEN];
    int V = g[BF16].m->cfg.vocab_size;
    int32_t tok[NS][LEN];
    float w[NS][LEN], lp[N_RIGS][NS][LEN], *grad[N_RIGS];
    engine_train_seq_t s[NS];
    train_batch(s, tok, w, V);
    size_t np = lora_pool_get(g[BF16].pool, 0)->n_params;
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 0.8f};
    for (int r = 0; r < N_RIGS; r++) {
        float *lpp[NS] = {lp[r][0], lp[r][1], lp[r][2]};
        cr_assert_eq(engine_logprobs(g[r].e, s, NS, 0.8f, lpp, NULL, err), 0, "%s: %s", rig_name[r], err);
        grad[r] = calloc(np, sizeof(float));
        float *gs[2] = {grad[r], NULL};
        cr_assert_eq(engine_train(g[r].e, s, NS, &lc, NULL, gs, NULL, 0, err), 0, "%s: %s", rig_name[r], err);
    }
    // log-probs of every sequence (the unused tail of shorter ones is the same zero fill)
    float flat[N_RIGS][NS * LEN];
    for (int r = 0; r < N_RIGS; r++)
        for (int i = 0; i < NS; i++)
            for (int t = 0; t < LEN; t++) flat[r][i * LEN + t] = t < s[i].len ? lp[r][i][t] : 0.0f;
    // every product has more than 8 rows: the blocked (amx, avx512-bf16: tiled) path, both directions
    bool xr = tu_bf16_rounds_x(false, 3 * LEN - 3);
    expect_bf16("log-probs", (const float *[]){flat[0], flat[1], flat[2]}, NS * LEN, xr);
    expect_bf16("LoRA gradients", (const float *[]){grad[0], grad[1], grad[2]}, np, xr);
    for (int r = 0; r < N_RIGS; r++) free(grad[r]);
    rigs_free(g);
}

Test(bf16, logprobs_and_lora_gradients, .init = tu_x_exact_variant) { check_train(false); }
Test(bf16, logprobs_and_lora_gradients_tied_head, .init = tu_x_exact_variant) { check_train(true); }
Test(bf16, logprobs_and_lora_gradients_x_rounded, .init = want_x_rounded) {
    NEED_X_ROUNDED();
    check_train(false);
}

// The fp32 arena keeps the vectors only, the matrices sit in the bf16 arena (with a head copy of
// embed when tied), the pointers say so, and conversion twice changes nothing.
static void check_layout(bool tied) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    c.tie_word_embeddings = tied;
    model_t *m = tu_model(&c, 3);
    size_t sz[MODEL_N_TENSORS], mat = 0, vec = 0;
    size_t total = model_param_sizes(&c, sz);
    for (int i = 0; i < MODEL_N_TENSORS; i++) *(tu_kind_is_matrix(i) ? &mat : &vec) += sz[i];
    size_t head = (size_t)c.vocab_size * c.hidden_size;
    cr_assert_eq(m->n_f32, total);
    float *embed = malloc(sizeof(float) * head);
    memcpy(embed, m->w.embed, sizeof(float) * head);
    cr_assert_eq(model_to_bf16(m, err), 0, "%s", err);
    cr_assert(m->bf16);
    cr_assert_eq(m->n_params, total, "n_params stays the parameter count");
    cr_assert_eq(m->n_f32, vec, "fp32 arena: %zu floats, want %zu (embed, norms, biases)", m->n_f32, vec);
    cr_assert_eq(m->n_bf16, mat + (tied ? head : 0));
    cr_assert_lt(m->n_f32 * 4 + m->n_bf16 * 2, total * 4 * 3 / 4, "a bf16 model must take well under the fp32 bytes");
    cr_assert_null(m->w.wq);
    cr_assert_null(m->w.wd);
    cr_assert_null(m->w.lm_head);
    cr_assert_not_null(m->w16.wq);
    cr_assert_not_null(m->w16.lm_head);
    cr_assert_not_null(m->w.bq);
    cr_assert(m->w.embed == m->params && m->w.final_norm + c.hidden_size == m->params + m->n_f32,
              "the vectors fill the new fp32 arena");
    cr_assert_eq(memcmp(m->w.embed, embed, sizeof(float) * head), 0, "embed stays exact fp32");
    uint16_t *h = malloc(sizeof(uint16_t) * head);
    kernels_cpu()->to_bf16(h, embed, head);
    if (tied) cr_assert_eq(memcmp(m->w16.lm_head, h, sizeof(uint16_t) * head), 0, "tied head: bf16(embed)");
    uint16_t *p16 = m->params16;
    cr_assert_eq(model_to_bf16(m, err), 0, "%s", err);
    cr_assert(m->params16 == p16 && m->n_f32 == vec, "a second conversion changes nothing");
    free(h);
    free(embed);
    model_destroy(&m);
}

Test(bf16, layout_after_conversion) { check_layout(false); }
Test(bf16, layout_after_conversion_tied_head) { check_layout(true); }

Test(bf16, full_parameter_training_and_save_refused) {
    rig_t g[N_RIGS];
    rigs_new(g, false);
    char err[ERR_LEN];
    int32_t tok[NS][LEN];
    float w[NS][LEN];
    engine_train_seq_t s[NS];
    train_batch(s, tok, w, g[BF16].m->cfg.vocab_size);
    float *mg = calloc(g[BF16].m->n_params, sizeof(float));
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
    err[0] = '\0';
    cr_assert_eq(engine_train(g[BF16].e, s, NS, &lc, mg, NULL, NULL, 0, err), -1);
    cr_assert(strstr(err, "full-parameter training needs fp32 weights") != NULL, "message: %s", err);
    for (size_t i = 0; i < g[BF16].m->n_params; i++) cr_assert_eq(mg[i], 0.0f, "gradient %zu written", i);
    // the same batch trains the rounded fp32 model's weights
    cr_assert_eq(engine_train(g[ROUNDED].e, s, NS, &lc, mg, NULL, NULL, 0, err), 0, "%s", err);
    char dir[256];
    tu_tmpdir(dir, sizeof dir, "bf16-save");
    err[0] = '\0';
    cr_assert_eq(model_save(g[BF16].m, dir, err), -1);
    cr_assert(strstr(err, "bf16") != NULL, "message: %s", err);
    free(mg);
    rigs_free(g);
}

// --weights: bf16 converts, fp32 and auto (on the CPU backend) keep fp32, anything else is an
// error that names the setting.
Test(bf16, weights_setting_of_the_services) {
    char err[ERR_LEN];
    unsetenv("MARLAAS_WEIGHTS");
    static const struct {
        const char *value;
        int bf16;
    } cases[] = {{"bf16", 1}, {"fp32", 0}, {"auto", 0}, {NULL, 0}, {"fp16", -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {"marlaas-trainer", "--insecure", "--model", "models/micro", "--weights", (char *)cases[i].value,
                        NULL};
        svc_t s;
        cr_assert_eq(svc_init(&s, "trainer", cases[i].value ? 6 : 4, argv, ""), 0);
        err[0] = '\0';
        int bf16 = kernels_weights_bf16(kernels_cpu(), svc_get(&s, SVC_WEIGHTS), err, ERR_LEN);
        cr_assert_eq(bf16, cases[i].bf16, "--weights %s", cases[i].value);
        if (cases[i].bf16 < 0) {
            cr_assert(strstr(err, "weights") && strstr(err, "fp32, bf16 or auto"), "message: %s", err);
            continue;
        }
        model_t *m = model_load_as(svc_get(&s, SVC_MODEL), kernels_cpu(), bf16 == 1, err);
        cr_assert_not_null(m, "--weights %s: %s", cases[i].value, err);
        cr_assert_eq(m->bf16, cases[i].bf16 == 1, "--weights %s", cases[i].value);
        model_destroy(&m);
    }
}

// --backend: cpu is the CPU table; an unknown name and, in a build without it, cuda are refused
// with the reason.
Test(bf16, backend_by_name) {
    char why[ERR_LEN] = "";
    cr_assert_eq(kernels_by_name("cpu", why, sizeof why), kernels_cpu());
    cr_assert_null(kernels_by_name("tpu", why, sizeof why));
    cr_assert(strstr(why, "unknown backend 'tpu'") && strstr(why, "known: cpu, cuda"), "message: %s", why);
#ifndef MARLAAS_CUDA
    cr_assert_null(kernels_by_name("cuda", why, sizeof why));
    cr_assert(strstr(why, "no CUDA backend"), "message: %s", why);
#endif
}

// The rollout's bf16 adapter copies (lora_pool_bf16_copies): decode steps of one row per adapter
// on a bf16 model read the adapters' bf16 copies. Against a pool of the same adapters rounded to
// bf16 and no copies: the same values, only the fp32 summation order differs (1e-5 relative);
// against the unrounded adapters: a nonzero difference (the copies are read) within the 5e-2 of
// bf16. Prefill segments (the sgemm path) and a forward kept for backward (training) read the
// fp32 parameters: bit for bit the same with and without copies. Copies made when turned on for
// adapters already in the pool, and dropped when turned off.
Test(bf16, adapter_copies_for_decode, .init = tu_x_exact_variant) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    enum { COPIES, ROUNDED_AD, PLAIN, N_POOLS, NA = 3, P = 6, STEPS = 3 };
    model_t *m[N_POOLS];
    lora_pool_t *pool[N_POOLS];
    engine_t *e[N_POOLS];
    for (int p = 0; p < N_POOLS; p++) {
        m[p] = tu_model(&c, 21);
        cr_assert_eq(model_to_bf16(m[p], err), 0, "%s", err);
        pool[p] = lora_pool_new(NA);
        if (p == COPIES) lora_pool_bf16_copies(pool[p], true);
        for (int s = 0; s < NA; s++) {
            lora_t *a = tu_adapter(&c, 4, LORA_ALL_TARGETS, 5 + (uint64_t)s);
            cr_assert_not_null(a);
            if (p == ROUNDED_AD) {
                uint16_t *h = malloc(sizeof(uint16_t) * a->n_params);
                kernels_cpu()->to_bf16(h, a->params, a->n_params);
                kernels_cpu()->from_bf16(a->params, h, a->n_params);
                free(h);
            }
            cr_assert_eq(lora_pool_set(pool[p], s, &a, err), 0, "%s", err);
        }
        cr_assert_eq(lora_pool_get(pool[p], 0)->params16 != NULL, p == COPIES);
        e[p] = engine_new(m[p], pool[p], err);
        cr_assert_not_null(e[p], "%s", err);
    }
    int V = c.vocab_size;
    int32_t tok[NA][P + STEPS];
    for (int s = 0; s < NA; s++)
        for (int i = 0; i < P + STEPS; i++) tok[s][i] = (int32_t)((7 * i + 3 * s + 1) % V);
    size_t n_pre = (size_t)NA * P * V, n_dec = (size_t)STEPS * NA * V;
    float *out[N_POOLS];
    for (int p = 0; p < N_POOLS; p++) {
        out[p] = calloc(n_pre + n_dec, sizeof(float));
        kvcache_t *kc = kvcache_new(c.num_hidden_layers, c.num_key_value_heads * c.head_dim, 4, 64, NA, err);
        cr_assert_not_null(kc, "%s", err);
        engine_seq_t q[NA];
        for (int s = 0; s < NA; s++)
            q[s] = (engine_seq_t){.tokens = tok[s], .n_tokens = P, .kv_seq = kvcache_seq_new(kc, err), .slot = s,
                                  .logits = ENGINE_LOGITS_ALL};
        cr_assert_eq(engine_step(e[p], kc, q, NA, out[p], err), 0, "%s", err);
        for (int st = 0; st < STEPS; st++) {
            for (int s = 0; s < NA; s++)
                q[s].tokens = tok[s] + P + st, q[s].n_tokens = 1, q[s].logits = ENGINE_LOGITS_LAST;
            cr_assert_eq(engine_step(e[p], kc, q, NA, out[p] + n_pre + (size_t)st * NA * V, err), 0, "%s", err);
        }
        kvcache_destroy(&kc);
    }
    // prefill and decode: segments of 6 and 1 rows (fewer than 8: the few-rows path, which reads
    // the copies)
    for (int part = 0; part < 2; part++) {
        const float *a = out[COPIES] + (part ? n_pre : 0), *r = out[ROUNDED_AD] + (part ? n_pre : 0),
                    *u = out[PLAIN] + (part ? n_pre : 0);
        size_t n = part ? n_dec : n_pre;
        double near = rel_diff(a, r, n), far = rel_diff(a, u, n);
        cr_log_info("%s: copies vs rounded adapters %.3g, vs unrounded %.3g", part ? "decode" : "prefill", near, far);
        cr_assert(near <= 1e-5, "%s: bf16 copies vs adapters rounded to bf16: %.3g > 1e-5", part ? "decode" : "prefill",
                  near);
        cr_assert(far > 0.0 && far < 5e-2, "%s: bf16 copies vs unrounded adapters: %.3g outside (0, 5e-2)",
                  part ? "decode" : "prefill", far);
    }
    // log-probs and LoRA gradients (a forward kept for backward; sequences of 5 tokens: segments
    // of the few-rows path) read the fp32 parameters: the same bits with and without copies
    enum { TLEN = 5 };
    engine_train_seq_t ts[NA];
    float w[NA][TLEN], lp[2][NA][TLEN];
    for (int s = 0; s < NA; s++) {
        for (int t = 0; t < TLEN; t++) w[s][t] = t >= 1 ? 1.0f : 0.0f;
        ts[s] = (engine_train_seq_t){.tokens = tok[s], .len = TLEN, .slot = s, .weight = w[s]};
    }
    size_t np = lora_pool_get(pool[PLAIN], 0)->n_params;
    float *grad[2];
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
    const int which[2] = {COPIES, PLAIN};
    for (int i = 0; i < 2; i++) {
        float *lpp[NA] = {lp[i][0], lp[i][1], lp[i][2]};
        cr_assert_eq(engine_logprobs(e[which[i]], ts, NA, 1.0f, lpp, NULL, err), 0, "%s", err);
        grad[i] = calloc(np * NA, sizeof(float));
        float *gs[NA] = {grad[i], grad[i] + np, grad[i] + 2 * np};
        cr_assert_eq(engine_train(e[which[i]], ts, NA, &lc, NULL, gs, NULL, 0, err), 0, "%s", err);
    }
    cr_assert_eq(memcmp(lp[0], lp[1], sizeof lp[0]), 0, "log-probs read the copies");
    cr_assert_eq(memcmp(grad[0], grad[1], sizeof(float) * np * NA), 0, "LoRA gradients read the copies");
    free(grad[0]), free(grad[1]);
    for (int p = 0; p < N_POOLS; p++) free(out[p]);
    lora_pool_bf16_copies(pool[COPIES], false);
    cr_assert_null(lora_pool_get(pool[COPIES], 0)->params16, "turned off: the copies are dropped");
    lora_pool_bf16_copies(pool[PLAIN], true);
    cr_assert_not_null(lora_pool_get(pool[PLAIN], 2)->params16, "turned on: adapters in the pool get copies");
    for (int p = 0; p < N_POOLS; p++) {
        engine_destroy(&e[p]);
        lora_pool_destroy(&pool[p]);
        model_destroy(&m[p]);
    }
}

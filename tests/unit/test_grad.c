// test_grad.c - backward pass against central finite differences (Richardson-extrapolated, so
// the truncation error is O(h^4)) for every base weight kind under cross-entropy and every
// LoRA A/B target under the RL loss with KL, on the Qwen2-like base config and on every
// architecture variant (o_proj and MLP biases, q/k norms with head_dim != hidden/heads, gelu and
// gelu_tanh, RoPE scalings, yarn's scaled cos/sin); the gated-MLP activations' backward op; and
// the zero gradient of clipped tokens.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "archutil.h"

static hf_config_t small_cfg(void) {
    hf_config_t c = tu_config();
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 8;
    c.vocab_size = 23;
    return c;
}

typedef struct {
    engine_t *e;
    engine_train_seq_t *s;
    int n;
    loss_cfg_t lc;
    int n_groups;
} lossfn_t;

// Sum over groups of the token-mean loss (each group's parameters only move its own term).
static double eval_loss(const lossfn_t *f) {
    char err[ERR_LEN];
    loss_stats_t st[8];
    cr_assert_eq(engine_train(f->e, f->s, f->n, &f->lc, NULL, NULL, st, (int)(sizeof st / sizeof st[0]), err), 0, "%s", err);
    double l = 0.0;
    for (int g = 0; g < f->n_groups; g++) l += st[g].loss;
    return l;
}

static double fd(const lossfn_t *f, float *p, double h) {
    float old = *p;
    *p = old + (float)h;
    double lp = eval_loss(f);
    *p = old - (float)h;
    double lm = eval_loss(f);
    *p = old;
    return (lp - lm) / (2.0 * h);
}

// Checks the k (<= 4) largest-magnitude gradient entries of one tensor against finite
// differences; a tensor whose gradient vanished fails (nothing would have been checked).
static void check_tensor(const lossfn_t *f, const char *what, float *param, const float *grad, size_t n, int k) {
    size_t top[4];
    int nt = 0;
    for (size_t i = 0; i < n; i++) {
        int j = nt < k ? nt++ : k;   // insertion into a sorted top-k list
        while (j > 0 && fabsf(grad[top[j - 1]]) < fabsf(grad[i])) {
            if (j < k) top[j] = top[j - 1];
            j--;
        }
        if (j < k) top[j] = i;
    }
    for (int rep = 0; rep < nt; rep++) {
        size_t best = top[rep];
        double h = 4e-2 * fmax(1.0, fabs(param[best]));
        double d1 = fd(f, param + best, h), d2 = fd(f, param + best, h / 2);
        double num = (4.0 * d2 - d1) / 3.0;
        double an = grad[best];
        double rel = fabs(num - an) / fmax(fmax(fabs(num), fabs(an)), 1e-6);
        cr_assert_gt(fabs(an), 1e-6, "%s: gradient vanished (%g), nothing checked", what, an);
        cr_assert_lt(rel, 1e-3, "%s[%zu]: analytic %.8g numeric %.8g rel err %.3g", what, best, an, num, rel);
    }
}

Test(grad, base_weights_cross_entropy) {
    char err[ERR_LEN];
    hf_config_t c = small_cfg();
    for (int tie = 0; tie <= 1; tie++) {
        c.tie_word_embeddings = tie;
        model_t *m = tu_model(&c, 21 + tie);
        lora_pool_t *pool = lora_pool_new(1);
        engine_t *e = engine_new(m, pool, err);
        int32_t t0[7] = {1, 5, 9, 2, 22, 3, 7}, t1[5] = {4, 4, 8, 0, 11};
        float w0[7] = {0, 1, 1, 0.5f, 1, 1, 2}, w1[5] = {0, 0, 1, 1, 1};
        engine_train_seq_t s[2] = {{.tokens = t0, .len = 7, .slot = -1, .weight = w0},
                                   {.tokens = t1, .len = 5, .slot = -1, .weight = w1}};
        lossfn_t f = {.e = e, .s = s, .n = 2, .lc = {.kind = LOSS_CE, .temperature = 1.0f}, .n_groups = 1};
        float *g = calloc(m->n_params, sizeof(float));
        loss_stats_t st[2];
        cr_assert_eq(engine_train(e, s, 2, &f.lc, g, NULL, st, (int)(sizeof st / sizeof st[0]), err), 0, "%s", err);
        cr_assert_float_eq(st[0].tokens, 9.5, 1e-9);
        size_t sizes[MODEL_N_TENSORS], off = 0;
        model_param_sizes(&c, sizes);
        static const char *names[MODEL_N_TENSORS] = {"embed", "attn_norm", "wq", "bq", "wk", "bk", "wv", "bv",
                                                     "wo", "mlp_norm", "wg", "wu", "wd", "final_norm", "lm_head"};
        int checked = 0;
        for (int i = 0; i < MODEL_N_TENSORS; i++) {
            if (sizes[i]) {
                check_tensor(&f, names[i], m->params + off, g + off, sizes[i], 3);
                checked++;
            }
            off += sizes[i];
        }
        cr_assert_eq(checked, tie ? 14 : 15);
        free(g);
        engine_destroy(&e);
        lora_pool_destroy(&pool);
        model_destroy(&m);
    }
}

Test(grad, lora_targets_rl_loss_with_kl) {
    char err[ERR_LEN];
    hf_config_t c = small_cfg();
    model_t *m = tu_model(&c, 5);
    lora_pool_t *pool = lora_pool_new(2);
    engine_t *e = engine_new(m, pool, err);
    int ranks[2] = {2, 3};
    for (int sl = 0; sl < 2; sl++) {
        lora_t *a = tu_adapter(&c, ranks[sl], LORA_ALL_TARGETS, 40 + sl);
        cr_assert_eq(lora_pool_set(pool, sl, &a, err), 0, "%s", err);
    }
    enum { NS = 4, LEN = 8 };
    int32_t tok[NS][LEN];
    float w[NS][LEN], old[NS][LEN], ref[NS][LEN], cur[NS][LEN];
    engine_train_seq_t s[NS];
    rng_t r;
    rng_seed(&r, 99);
    for (int i = 0; i < NS; i++) {
        for (int t = 0; t < LEN; t++) {
            tok[i][t] = (int32_t)(rng_next(&r) % 23);
            w[i][t] = t >= 3 ? 1.0f : 0.0f;   // prompt of 3 tokens carries no loss
        }
        s[i] = (engine_train_seq_t){.tokens = tok[i], .len = LEN - (i & 1), .slot = i % 2, .weight = w[i],
                                    .old_logp = old[i], .ref_logp = ref[i], .advantage = (i < 2) ? 1.0f : -0.7f};
    }
    float *lp[NS] = {cur[0], cur[1], cur[2], cur[3]};
    cr_assert_eq(engine_logprobs(e, s, NS, 0.9f, lp, NULL, err), 0, "%s", err);
    // behaviour / reference log-probs near the current ones: ratios stay inside the clip range
    for (int i = 0; i < NS; i++)
        for (int t = 0; t < LEN; t++) {
            old[i][t] = cur[i][t] + 0.05f * (2.0f * rng_uniform(&r) - 1.0f);
            ref[i][t] = cur[i][t] + 0.3f * (2.0f * rng_uniform(&r) - 1.0f);
        }
    lossfn_t f = {.e = e, .s = s, .n = NS, .n_groups = 3,
                  .lc = {.kind = LOSS_RL, .temperature = 0.9f, .clip_low = 0.2f, .clip_high = 0.28f, .kl_coef = 0.1f}};
    float *g[2];
    for (int sl = 0; sl < 2; sl++) g[sl] = calloc(lora_pool_get(pool, sl)->n_params, sizeof(float));
    loss_stats_t st[3];
    cr_assert_eq(engine_train(e, s, NS, &f.lc, NULL, g, st, (int)(sizeof st / sizeof st[0]), err), 0, "%s", err);
    cr_assert_float_eq(st[1].clip_frac, 0.0, 1e-12);
    cr_assert_gt(st[1].kl, 0.0);
    for (int sl = 0; sl < 2; sl++) {
        lora_t *a = lora_pool_get(pool, sl);
        float *gA[LORA_N_TARGETS], *gB[LORA_N_TARGETS];
        lora_point(gA, gB, g[sl], &c, &a->cfg);
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            int in, out;
            lora_target_dims(&c, t, &in, &out);
            size_t na = (size_t)c.num_hidden_layers * a->cfg.r * in, nb = (size_t)c.num_hidden_layers * a->cfg.r * out;
            char what[64];
            snprintf(what, sizeof what, "slot%d %s A", sl, peft_target_name(t));
            check_tensor(&f, what, a->A[t], gA[t], na, 2);
            snprintf(what, sizeof what, "slot%d %s B", sl, peft_target_name(t));
            check_tensor(&f, what, a->B[t], gB[t], nb, 2);
        }
    }
    free(g[0]), free(g[1]);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

Test(grad, clipped_tokens_carry_no_gradient) {
    char err[ERR_LEN];
    hf_config_t c = small_cfg();
    model_t *m = tu_model(&c, 6);
    lora_pool_t *pool = lora_pool_new(1);
    engine_t *e = engine_new(m, pool, err);
    lora_t *a = tu_adapter(&c, 2, LORA_ALL_TARGETS, 3);
    lora_pool_set(pool, 0, &a, err);
    int32_t tok[6] = {1, 2, 3, 4, 5, 6};
    float w[6] = {0, 1, 1, 1, 1, 1}, cur[6], old[6];
    engine_train_seq_t s = {.tokens = tok, .len = 6, .slot = 0, .weight = w, .old_logp = old, .advantage = 1.0f};
    float *lp[1] = {cur};
    engine_logprobs(e, &s, 1, 1.0f, lp, NULL, err);
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.2f};
    size_t n = lora_pool_get(pool, 0)->n_params;
    float *g = calloc(n, sizeof(float));
    float *gs[1] = {g};
    loss_stats_t st[2];
    // ratio = e > 1.2 with a positive advantage: every token clipped, gradient exactly zero
    for (int t = 0; t < 6; t++) old[t] = cur[t] - 1.0f;
    cr_assert_eq(engine_train(e, &s, 1, &lc, NULL, gs, st, (int)(sizeof st / sizeof st[0]), err), 0, "%s", err);
    cr_assert_float_eq(st[1].clip_frac, 1.0, 1e-9);
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    cr_assert_eq(ss, 0.0);
    // ratio = 1/e < 0.8 with a positive advantage: not clipped (min picks the unclipped term)
    for (int t = 0; t < 6; t++) old[t] = cur[t] + 1.0f;
    cr_assert_eq(engine_train(e, &s, 1, &lc, NULL, gs, st, (int)(sizeof st / sizeof st[0]), err), 0, "%s", err);
    cr_assert_float_eq(st[1].clip_frac, 0.0, 1e-9);
    ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    cr_assert_gt(ss, 0.0);
    free(g);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

// --- architecture variants ---------------------------------------------------------------------------

static const char *const kind_names[MODEL_N_TENSORS] = {
    "embed", "attn_norm", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "mlp_norm", "wg", "wu", "wd", "final_norm",
    "lm_head", "bo", "q_norm", "k_norm", "bg", "bu", "bd"};

Test(grad, variants_every_base_weight_cross_entropy) {
    for (int v = 0; v < AU_N_VARIANTS; v++) {
        char err[ERR_LEN];
        hf_config_t c = au_config(v, 16, 24, 2, 1, 8, 23);
        model_t *m = tu_model(&c, 41 + v);
        cr_assert_not_null(m);
        lora_pool_t *pool = lora_pool_new(1);
        engine_t *e = engine_new(m, pool, err);
        int32_t t0[9] = {1, 5, 9, 2, 22, 3, 7, 7, 14}, t1[6] = {4, 4, 8, 0, 11, 19};
        float w0[9] = {0, 1, 1, 0.5f, 1, 1, 2, 1, 1}, w1[6] = {0, 0, 1, 1, 1, 1};
        engine_train_seq_t s[2] = {{.tokens = t0, .len = 9, .slot = -1, .weight = w0},
                                   {.tokens = t1, .len = 6, .slot = -1, .weight = w1}};
        lossfn_t f = {.e = e, .s = s, .n = 2, .lc = {.kind = LOSS_CE, .temperature = 1.0f}, .n_groups = 1};
        float *g = calloc(m->n_params, sizeof(float));
        loss_stats_t st[2];
        cr_assert_eq(engine_train(e, s, 2, &f.lc, g, NULL, st, 2, err), 0, "%s", err);
        size_t sizes[MODEL_N_TENSORS], off = 0;
        model_param_sizes(&c, sizes);
        int checked = 0, want = 0;
        for (int i = 0; i < MODEL_N_TENSORS; i++) {
            if (sizes[i]) {
                char what[96];
                snprintf(what, sizeof what, "%s %s", au_name(v), kind_names[i]);
                check_tensor(&f, what, m->params + off, g + off, sizes[i], 3);
                checked++;
            }
            off += sizes[i];
        }
        // every kind the variant has: the 11 of every model (embed, 3 norms, 7 matrices), the head, its own
        want = 11 + !c.tie_word_embeddings + (c.qkv_bias ? 3 : 0) + (c.o_bias ? 1 : 0) + (c.qk_norm ? 2 : 0) +
               (c.mlp_bias ? 3 : 0);
        cr_assert_eq(checked, want, "%s: %d kinds checked, %d expected", au_name(v), checked, want);
        free(g);
        engine_destroy(&e);
        lora_pool_destroy(&pool);
        model_destroy(&m);
    }
}

Test(grad, variants_lora_targets_rl_loss) {
    for (int v = 0; v < AU_N_VARIANTS; v++) {
        char err[ERR_LEN];
        hf_config_t c = au_config(v, 16, 24, 2, 1, 8, 23);
        model_t *m = tu_model(&c, 51 + v);
        lora_pool_t *pool = lora_pool_new(1);
        engine_t *e = engine_new(m, pool, err);
        lora_t *a = tu_adapter(&c, 2, LORA_ALL_TARGETS, 60 + v);
        cr_assert_eq(lora_pool_set(pool, 0, &a, err), 0, "%s", err);
        enum { LEN = 8 };
        int32_t tok[2][LEN];
        float w[2][LEN], old[2][LEN], cur[2][LEN];
        rng_t r;
        rng_seed(&r, 7 + v);
        engine_train_seq_t s[2];
        for (int i = 0; i < 2; i++) {
            for (int t = 0; t < LEN; t++) {
                tok[i][t] = (int32_t)(rng_next(&r) % 23);
                w[i][t] = t >= 2 ? 1.0f : 0.0f;
            }
            s[i] = (engine_train_seq_t){.tokens = tok[i], .len = LEN - i, .slot = 0, .weight = w[i], .old_logp = old[i],
                                        .advantage = i ? -0.6f : 1.0f};
        }
        float *lp[2] = {cur[0], cur[1]};
        cr_assert_eq(engine_logprobs(e, s, 2, 1.0f, lp, NULL, err), 0, "%s", err);
        for (int i = 0; i < 2; i++)
            for (int t = 0; t < LEN; t++) old[i][t] = cur[i][t] + 0.05f * (2.0f * rng_uniform(&r) - 1.0f);
        lossfn_t f = {.e = e, .s = s, .n = 2, .n_groups = 2,
                      .lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f}};
        lora_t *ad = lora_pool_get(pool, 0);
        float *g = calloc(ad->n_params, sizeof(float)), *gs[1] = {g};
        loss_stats_t st[2];
        cr_assert_eq(engine_train(e, s, 2, &f.lc, NULL, gs, st, 2, err), 0, "%s", err);
        float *gA[LORA_N_TARGETS], *gB[LORA_N_TARGETS];
        lora_point(gA, gB, g, &c, &ad->cfg);
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            int in, out;
            lora_target_dims(&c, t, &in, &out);
            size_t na = (size_t)c.num_hidden_layers * ad->cfg.r * in, nb = (size_t)c.num_hidden_layers * ad->cfg.r * out;
            char what[96];
            snprintf(what, sizeof what, "%s %s A", au_name(v), peft_target_name(t));
            check_tensor(&f, what, ad->A[t], gA[t], na, 2);
            snprintf(what, sizeof what, "%s %s B", au_name(v), peft_target_name(t));
            check_tensor(&f, what, ad->B[t], gB[t], nb, 2);
        }
        free(g);
        engine_destroy(&e);
        lora_pool_destroy(&pool);
        model_destroy(&m);
    }
}

// The gated-MLP op against an independent double-precision evaluation of each activation, and its
// backward against central differences of that evaluation.
static double act_ref(kern_act_t a, double x) {
    if (a == KERN_ACT_GELU) return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    if (a == KERN_ACT_GELU_TANH) return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    return x / (1.0 + exp(-x));
}

Test(grad, glu_activations_and_backward) {
    const kernels_t *k = kernels_cpu();
    enum { N = 401 };
    float g[N], u[N], dh[N], h[N], dg[N], du[N];
    for (int i = 0; i < N; i++) {
        g[i] = -8.0f + 16.0f * (float)i / (N - 1);   // through the bend and both tails
        u[i] = 0.5f + 0.25f * sinf((float)i);
        dh[i] = 1.0f - 0.003f * (float)i;
    }
    static const kern_act_t acts[] = {KERN_ACT_SILU, KERN_ACT_GELU, KERN_ACT_GELU_TANH};
    for (int ai = 0; ai < 3; ai++) {
        kern_act_t a = acts[ai];
        k->glu(h, g, u, N, a);
        k->glu_bwd(dg, du, dh, g, u, N, a);
        double worst_f = 0, worst_g = 0, worst_u = 0;
        for (int i = 0; i < N; i++) {
            double x = g[i], ref = act_ref(a, x) * u[i];
            worst_f = fmax(worst_f, fabs(h[i] - ref) / fmax(1.0, fabs(ref)));
            double hh = 1e-4;
            double dnum = (act_ref(a, x + hh) - act_ref(a, x - hh)) / (2 * hh) * u[i] * dh[i];
            worst_g = fmax(worst_g, fabs(dg[i] - dnum) / fmax(1.0, fabs(dnum)));
            worst_u = fmax(worst_u, fabs(du[i] - act_ref(a, x) * dh[i]) / fmax(1.0, fabs(act_ref(a, x) * dh[i])));
        }
        cr_assert_lt(worst_f, 2e-6, "act %d: forward rel err %g", (int)a, worst_f);
        cr_assert_lt(worst_g, 1e-5, "act %d: dg rel err %g", (int)a, worst_g);
        cr_assert_lt(worst_u, 2e-6, "act %d: du rel err %g", (int)a, worst_u);
    }
    // the three differ (a kernel that ignored act would pass the loop above for SiLU only)
    float hs[N], hg[N];
    k->glu(hs, g, u, N, KERN_ACT_SILU);
    k->glu(hg, g, u, N, KERN_ACT_GELU);
    cr_assert_gt(tu_max_abs_diff(hs, hg, N, NULL), 1e-2f);
}

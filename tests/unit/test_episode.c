// test_episode.c - training on multi-turn episodes: the tokens an environment wrote
// (observations between model turns) carry no loss and no gradient, checked numerically.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "testutil.h"

// prompt (6) | model turn (4) | observation (3) | model turn (3) | observation (2) | model turn (2)
enum { LEN = 20 };
static const int32_t toks[LEN] = {3, 9, 14, 5, 22, 7, 11, 30, 4, 18, 25, 26, 27, 12, 6, 19, 25, 27, 8, 2};
static const uint8_t is_env[LEN] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0};
#define PROMPT 6

typedef struct {
    engine_t *e;
    lora_t *a;
    engine_train_seq_t s;
    float old[LEN];
    float A;
} ep_t;

// -(1/|S|) sum over tokens t in S of A * exp(logp_t - old_t): the RL surrogate with the clip
// range far away, over the model's tokens only (with_env = 0) or over the environment's too.
static double ref_loss(ep_t *p, int with_env) {
    char err[ERR_LEN];
    float lp[LEN] = {0};
    float *lps[1] = {lp};
    engine_train_seq_t s = p->s;
    cr_assert_eq(engine_logprobs(p->e, &s, 1, 1.0f, lps, NULL, err), 0, "%s", err);
    double sum = 0;
    int n = 0;
    for (int t = PROMPT; t < LEN; t++) {
        if (is_env[t] && !with_env) continue;
        sum += -p->A * exp((double)lp[t] - p->old[t]);
        n++;
    }
    return sum / n;
}

// Directional derivative of ref_loss along d (central differences, Richardson-extrapolated).
static double fd_dir(ep_t *p, const float *d, int with_env) {
    size_t n = p->a->n_params;
    float *base = malloc(sizeof(float) * n);
    memcpy(base, p->a->params, sizeof(float) * n);
    double est[2];
    for (int k = 0; k < 2; k++) {
        double h = k ? 1e-2 : 2e-2, lpm[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            for (size_t i = 0; i < n; i++) p->a->params[i] = base[i] + (float)((sgn ? -h : h) * d[i]);
            lpm[sgn] = ref_loss(p, with_env);
        }
        est[k] = (lpm[0] - lpm[1]) / (2 * h);
    }
    memcpy(p->a->params, base, sizeof(float) * n);
    free(base);
    return (4 * est[1] - est[0]) / 3;
}

Test(episode, observation_tokens_carry_no_gradient) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    c.hidden_size = 16, c.intermediate_size = 24, c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 8;
    model_t *m = tu_model(&c, 5);
    lora_pool_t *pool = lora_pool_new(1);
    lora_t *a = tu_adapter(&c, 4, LORA_ALL_TARGETS, 9);
    cr_assert_eq(lora_pool_set(pool, 0, &a, err), 0, "%s", err);
    ep_t p = {.e = engine_new(m, pool, err), .a = lora_pool_get(pool, 0), .A = 0.8f};
    cr_assert_not_null(p.e, "%s", err);
    float w[LEN];
    for (int t = 0; t < LEN; t++) w[t] = t >= PROMPT && !is_env[t] ? 1.0f : 0.0f;
    p.s = (engine_train_seq_t){.tokens = toks, .len = LEN, .slot = 0, .weight = w, .old_logp = p.old, .advantage = p.A};
    // behaviour log-probs = the current policy's (ratio 1), clip range out of reach
    float *olds[1] = {p.old};
    cr_assert_eq(engine_logprobs(p.e, &p.s, 1, 1.0f, olds, NULL, err), 0, "%s", err);
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.9f, .clip_high = 9.0f};
    size_t n = p.a->n_params;
    float *g = calloc(n, sizeof(float)), *d = malloc(sizeof(float) * n);
    float *grads[1] = {g};
    loss_stats_t st[2];
    cr_assert_eq(engine_train(p.e, &p.s, 1, &lc, NULL, grads, st, 2, err), 0, "%s", err);
    // the loss the engine reports is the model-token mean
    cr_assert_float_eq(st[1].loss, ref_loss(&p, 0), 1e-5, "engine loss %g vs model-token reference %g", st[1].loss,
                       ref_loss(&p, 0));
    cr_assert_float_eq(st[1].tokens, 9.0, 1e-9, "weighted tokens %g, expected the 9 model tokens", st[1].tokens);
    rng_t r;
    rng_seed(&r, 77);
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < n; i++) d[i] = 2.0f * rng_uniform(&r) - 1.0f;
        double an = 0;
        for (size_t i = 0; i < n; i++) an += (double)g[i] * d[i];
        double num = fd_dir(&p, d, 0), with_env = fd_dir(&p, d, 1);
        double rel = fabs(num - an) / fmax(fabs(num), 1e-6);
        cr_assert_lt(rel, 1e-3, "direction %d: analytic %.8g vs finite differences over model tokens %.8g (rel %.3g)",
                     rep, an, num, rel);
        // the check can tell: counting the observation tokens too moves the derivative by far more
        // than the finite differences' error
        cr_assert_gt(fabs(with_env - an), 20 * fabs(num - an) + 1e-7,
                     "direction %d: the derivative with observation tokens (%.8g) is not told apart from %.8g "
                     "(finite differences %.8g)", rep, with_env, an, num);
    }
    free(g), free(d);
    engine_destroy(&p.e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

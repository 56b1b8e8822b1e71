// testpass.h - a GRPO training pass for the data-parallel tests (CPU: tests/unit/test_dp.c, GPU:
// tests/gpu/test_dp.c) and the comparison of gradients. Include after criterion.h.
#ifndef MARLAAS_TESTPASS_H
#define MARLAAS_TESTPASS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/engine/engine.h"
#include "common/engine/sampler.h"
#include "common/rl/batch.h"

// A GRPO pass packed by rl_batch_add_job: for slots 0 and 2, 3 groups sharing their prompt (5, 3
// and 3 samples; random tokens, behaviour log-probs and rewards, a fifth of the completion tokens
// the environment's, every other group drawn with the previous adapter version), then for slot 2
// a group of 2 samples whose prompt is not shared. The batch owns everything; s and n are its
// sequences.
typedef struct {
    rl_batch_t b;
    engine_train_seq_t *s;
    int n;
} tp_pass_t;

static inline void tp_pass_build(tp_pass_t *p, uint64_t seed, bool bad_token) {
    rng_t r;
    rng_seed(&r, seed);
    memset(p, 0, sizeof *p);
    char err[ERR_LEN];
    int32_t prompt[3][8], tok[3][5][8];
    float lp[3][5][8];
    uint8_t env[3][5][8];
    rl_sample_t sm[3][5];
    rl_group_t gr[3];
    const int slots[2] = {0, 2};
    for (int si = 0; si < 2; si++) {
        for (int g = 0; g < 3; g++) {
            int plen = 3 + (int)(rng_uniform(&r) * 4), G = 3 + (g == 0 ? 2 : 0);
            for (int t = 0; t < plen; t++) prompt[g][t] = 3 + (int)(rng_uniform(&r) * 37);
            for (int k = 0; k < G; k++) {
                int n = 2 + (int)(rng_uniform(&r) * 6);
                for (int t = 0; t < n; t++) {
                    tok[g][k][t] = 3 + (int)(rng_uniform(&r) * 37);
                    env[g][k][t] = rng_uniform(&r) < 0.2f;
                    lp[g][k][t] = -3.0f + rng_uniform(&r);
                }
                sm[g][k] = (rl_sample_t){.tokens = tok[g][k], .logprobs = lp[g][k], .env = env[g][k], .n = n,
                                         .reward = rng_uniform(&r)};
            }
            gr[g] = (rl_group_t){.prompt = prompt[g], .n_prompt = plen, .samples = sm[g], .n_samples = G,
                                 .version = (uint32_t)(1 - g % 2)};
        }
        rl_job_cfg_t c = {.slot = slots[si], .version = 1, .std_norm = true, .share_prompt = true};
        if (rl_batch_add_job(&p->b, &c, gr, 3, err) < 0) cr_assert_fail("tp_pass_build: %s", err);
    }
    // without a shared prompt: a prompt of 2 tokens
    for (int k = 0; k < 2; k++) {
        int n = 4 + k;
        for (int t = 0; t < n; t++) tok[0][k][t] = 3 + (int)(rng_uniform(&r) * 37), lp[0][k][t] = -3.5f;
        sm[0][k] = (rl_sample_t){.tokens = tok[0][k], .logprobs = lp[0][k], .n = n, .reward = k ? 0.9f : 0.2f};
    }
    prompt[0][0] = 5, prompt[0][1] = 7;
    if (bad_token) tok[0][1][1] = 1000;   // outside the vocabulary
    gr[0] = (rl_group_t){.prompt = prompt[0], .n_prompt = 2, .samples = sm[0], .n_samples = 2, .version = 1};
    rl_job_cfg_t c = {.slot = 2, .version = 1, .std_norm = true};
    if (rl_batch_add_job(&p->b, &c, gr, 1, err) < 0) cr_assert_fail("tp_pass_build: %s", err);
    p->s = p->b.seqs;
    p->n = p->b.n;
}

static inline void tp_pass_free(tp_pass_t *p) { rl_batch_free(&p->b); }

// |a - b| <= tol (|b| + max |b|) element-wise (sums in another order); the reference must not be 0
static inline void tp_expect_close(const char *what, const float *a, const float *b, size_t n, float tol) {
    float mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmaxf(mx, fabsf(b[i]));
    cr_assert(mx > 0, "%s: the reference gradient is zero (the test would prove nothing)", what);
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= tol * (fabsf(b[i]) + mx), "%s[%zu]: data-parallel %.9g, single %.9g", what, i,
                  a[i], b[i]);
}

#endif

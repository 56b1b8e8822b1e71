// testpass.h - a GRPO-like training pass for the data-parallel tests (CPU: tests/unit/test_dp.c,
// GPU: tests/gpu/test_dp.c) and the comparison of gradients. Include after criterion.h.
#ifndef MARLAAS_TESTPASS_H
#define MARLAAS_TESTPASS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/engine/engine.h"
#include "common/engine/sampler.h"

// A GRPO-like pass: for slots 0 and 2, groups of a shared prompt and 3 samples, plus two sequences
// without a prefix. Arrays owned by the pass.
typedef struct {
    engine_train_seq_t s[64];
    int32_t *tok[64];
    float *w[64], *old[64];
    int n;
} tp_pass_t;

static inline void tp_pass_build(tp_pass_t *p, uint64_t seed, bool bad_token) {
    rng_t r;
    rng_seed(&r, seed);
    memset(p, 0, sizeof *p);
    const int slots[2] = {0, 2};
    for (int si = 0; si < 2; si++)
        for (int g = 0; g < 3; g++) {
            int plen = 3 + (int)(rng_uniform(&r) * 4), root = p->n;
            int32_t prompt[8];
            for (int t = 0; t < plen; t++) prompt[t] = 3 + (int)(rng_uniform(&r) * 37);
            p->tok[p->n] = malloc(sizeof(int32_t) * (size_t)(plen - 1));
            memcpy(p->tok[p->n], prompt, sizeof(int32_t) * (size_t)(plen - 1));
            p->s[p->n++] = (engine_train_seq_t){.tokens = p->tok[root], .len = plen - 1, .slot = slots[si]};
            for (int k = 0; k < 3 + (g == 0 ? 2 : 0); k++) {
                int len = plen + 2 + (int)(rng_uniform(&r) * 6), i = p->n++;
                p->tok[i] = malloc(sizeof(int32_t) * (size_t)len);
                p->w[i] = calloc((size_t)len, sizeof(float));
                p->old[i] = calloc((size_t)len, sizeof(float));
                memcpy(p->tok[i], prompt, sizeof(int32_t) * (size_t)plen);
                for (int t = plen; t < len; t++) {
                    p->tok[i][t] = 3 + (int)(rng_uniform(&r) * 37);
                    p->w[i][t] = rng_uniform(&r) < 0.8f ? 1.0f : 0.0f;
                    p->old[i][t] = -3.0f + rng_uniform(&r);
                }
                p->s[i] = (engine_train_seq_t){.tokens = p->tok[i], .len = len, .slot = slots[si], .weight = p->w[i],
                                               .old_logp = p->old[i], .advantage = 2.0f * rng_uniform(&r) - 1.0f,
                                               .on_policy = k % 2 == 0, .prefix_of = root + 1,
                                               .prefix_len = plen - 1};
            }
        }
    for (int k = 0; k < 2; k++) {   // without a prefix
        int len = 6 + k, i = p->n++;
        p->tok[i] = malloc(sizeof(int32_t) * (size_t)len);
        p->w[i] = calloc((size_t)len, sizeof(float));
        p->old[i] = calloc((size_t)len, sizeof(float));
        for (int t = 0; t < len; t++) {
            p->tok[i][t] = 3 + (int)(rng_uniform(&r) * 37);
            p->w[i][t] = t >= 2 ? 1.0f : 0.0f;
            p->old[i][t] = -3.5f;
        }
        p->s[i] = (engine_train_seq_t){.tokens = p->tok[i], .len = len, .slot = k ? 2 : 0, .weight = p->w[i],
                                       .old_logp = p->old[i], .advantage = k ? 0.7f : -0.4f, .on_policy = true};
    }
    if (bad_token) p->tok[p->n - 1][3] = 1000;   // outside the vocabulary
}

static inline void tp_pass_free(tp_pass_t *p) {
    for (int i = 0; i < p->n; i++) free(p->tok[i]), free(p->w[i]), free(p->old[i]);
}

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

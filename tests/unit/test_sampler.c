// test_sampler.c - RNG, log-probabilities, greedy / temperature / top-k / top-p sampling and
// entropy against naive double-precision references and empirical frequencies.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "common/engine/sampler.h"

static void random_logits(rng_t *r, float *z, int n, float scale) {
    for (int i = 0; i < n; i++) z[i] = (rng_uniform(r) * 2.0f - 1.0f) * scale;
}

// Naive reference: no max shift (the test logits are small), plain double sums.
static double ref_logprob(const float *z, int n, double t, int tok) {
    double sum = 0.0;
    for (int j = 0; j < n; j++) sum += exp((double)z[j] / t);
    return (double)z[tok] / t - log(sum);
}

static void ref_probs(const float *z, int n, double t, double *p) {
    double sum = 0.0;
    for (int j = 0; j < n; j++) sum += exp((double)z[j] / t);
    for (int j = 0; j < n; j++) p[j] = exp((double)z[j] / t) / sum;
}

// Counts n_draws samples into counts[0..vocab).
static void histogram(const sampler_params_t *p, uint64_t seed, const float *z, int vocab, int n_draws, int *counts) {
    sampler_scratch_t s;
    sampler_scratch_init(&s, vocab);
    rng_t r;
    rng_seed(&r, seed);
    for (int j = 0; j < vocab; j++) counts[j] = 0;
    for (int i = 0; i < n_draws; i++) {
        int tok = sampler_sample(p, &r, z, vocab, &s, NULL);
        cr_assert(tok >= 0 && tok < vocab);
        counts[tok]++;
    }
    sampler_scratch_free(&s);
}

Test(sampler, rng_reproducible_and_seed_dependent) {
    rng_t a, b, c;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    rng_seed(&c, 43);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = rng_next(&a), y = rng_next(&b), w = rng_next(&c);
        cr_assert_eq(x, y, "draw %d", i);
        same_c += x == w;
    }
    cr_assert_eq(same_c, 0);
    // Seed 0 must not collapse to the all-zero state.
    rng_t z;
    rng_seed(&z, 0);
    uint64_t acc = 0;
    for (int i = 0; i < 8; i++) acc |= rng_next(&z);
    cr_assert_neq(acc, 0);
}

Test(sampler, rng_matches_reference_xoshiro) {
    // First output of xoshiro256** from a hand-set state, computed from the published
    // algorithm: rotl(s1 * 5, 7) * 9 with s1 = 2 -> rotl(10, 7) * 9 = 1280 * 9.
    rng_t r = {.s = {1, 2, 3, 4}};
    cr_assert_eq(rng_next(&r), 11520ULL);
    // splitmix64(0) first output, a well-known constant.
    rng_t q;
    rng_seed(&q, 0);
    cr_assert_eq(q.s[0], 0xe220a8397b1dcdafULL);
}

Test(sampler, uniform_range_and_mean) {
    rng_t r;
    rng_seed(&r, 7);
    double sum = 0.0;
    for (int i = 0; i < 100000; i++) {
        float u = rng_uniform(&r);
        cr_assert(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    cr_assert(fabs(sum / 100000 - 0.5) < 0.01, "mean %f", sum / 100000);
}

Test(sampler, greedy_argmax_lowest_id_on_ties) {
    sampler_params_t p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};
    const float z[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 2.0f};
    float lp = 0.0f;
    cr_assert_eq(sampler_sample(&p, NULL, z, 6, NULL, &lp), 1);
    cr_assert_float_eq(lp, ref_logprob(z, 6, 1.0, 1), 1e-6);
    const float w[4] = {-3.0f, -1.0f, -2.0f, 5.0f};
    cr_assert_eq(sampler_sample(&p, NULL, w, 4, NULL, NULL), 3);
    // Greedy does not consume randomness.
    rng_t r, r0;
    rng_seed(&r, 5);
    r0 = r;
    sampler_sample(&p, &r, w, 4, NULL, NULL);
    cr_assert_eq(rng_next(&r), rng_next(&r0));
}

Test(sampler, logprob_matches_reference) {
    rng_t r;
    rng_seed(&r, 11);
    enum { V = 257 };
    float z[V];
    const float temps[3] = {0.5f, 1.0f, 2.0f};
    for (int trial = 0; trial < 20; trial++) {
        random_logits(&r, z, V, 8.0f);
        for (int ti = 0; ti < 3; ti++) {
            for (int tok = 0; tok < V; tok += 17) {
                double ref = ref_logprob(z, V, temps[ti], tok);
                float got = sampler_logprob(z, V, temps[ti], tok);
                cr_assert(fabs(got - ref) < 1e-6 * fmax(1.0, fabs(ref)), "T=%g tok %d: %.9g vs %.9g", temps[ti], tok,
                          got, ref);
            }
        }
    }
    // T <= 0 is treated as 1.
    cr_assert_eq(sampler_logprob(z, V, 0.0f, 3), sampler_logprob(z, V, 1.0f, 3));
    cr_assert_eq(sampler_logprob(z, V, -2.0f, 3), sampler_logprob(z, V, 1.0f, 3));
    // Large logits: the max shift keeps it finite.
    const float big[3] = {1000.0f, 999.0f, -1000.0f};
    float lp = sampler_logprob(big, 3, 1.0f, 0);
    cr_assert(fabs(lp - (-log1p(exp(-1.0)))) < 1e-6, "%g", lp);
    cr_assert(isinf(sampler_logprob(big, 3, 1.0f, 2)) || sampler_logprob(big, 3, 1.0f, 2) < -1999.0f);
}

Test(sampler, frequencies_match_softmax) {
    const float z[5] = {1.0f, 0.2f, -0.5f, 0.8f, -2.0f};
    const float temps[2] = {1.0f, 0.7f};
    for (int ti = 0; ti < 2; ti++) {
        sampler_params_t p = {.temperature = temps[ti], .top_k = 0, .top_p = 1.0f};
        int counts[5];
        double ref[5];
        histogram(&p, 1234 + ti, z, 5, 200000, counts);
        ref_probs(z, 5, temps[ti], ref);
        for (int j = 0; j < 5; j++)
            cr_assert(fabs(counts[j] / 200000.0 - ref[j]) < 0.01, "T=%g tok %d: %f vs %f", temps[ti], j,
                      counts[j] / 200000.0, ref[j]);
    }
}

Test(sampler, same_seed_same_samples) {
    enum { V = 50 };
    float z[V];
    rng_t g;
    rng_seed(&g, 3);
    random_logits(&g, z, V, 3.0f);
    sampler_params_t p = {.temperature = 0.9f, .top_k = 20, .top_p = 0.9f};
    sampler_scratch_t s;
    sampler_scratch_init(&s, V);
    rng_t a, b;
    rng_seed(&a, 99);
    rng_seed(&b, 99);
    for (int i = 0; i < 500; i++) {
        int ta = sampler_sample(&p, &a, z, V, &s, NULL);
        cr_assert_eq(ta, sampler_sample(&p, &b, z, V, &s, NULL), "draw %d", i);
    }
    sampler_scratch_free(&s);
}

Test(sampler, top_k_one_is_greedy) {
    enum { V = 300 };
    float z[V];
    rng_t g, r;
    rng_seed(&g, 21);
    rng_seed(&r, 22);
    sampler_scratch_t s;
    sampler_scratch_init(&s, V);
    sampler_params_t greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f};
    sampler_params_t k1 = {.temperature = 1.5f, .top_k = 1, .top_p = 1.0f};
    for (int trial = 0; trial < 200; trial++) {
        random_logits(&g, z, V, 4.0f);
        if (trial % 2) z[trial % V] = z[(trial * 7) % V] = 10.0f;  // ties at the top
        int gt = sampler_sample(&greedy, NULL, z, V, NULL, NULL);
        cr_assert_eq(sampler_sample(&k1, &r, z, V, &s, NULL), gt, "trial %d", trial);
    }
    sampler_scratch_free(&s);
}

static int cmp_desc_ids(const float *z, int a, int b) { return z[a] > z[b] || (z[a] == z[b] && a < b); }

Test(sampler, top_k_never_leaves_top_set) {
    enum { V = 1000, K = 10 };
    float z[V];
    rng_t g;
    rng_seed(&g, 8);
    random_logits(&g, z, V, 2.0f);
    z[500] = z[501] = z[502] = 3.0f;  // a three-way tie inside the top set
    // Reference top-K by selection sort on a copy of the ids.
    int ids[V];
    for (int i = 0; i < V; i++) ids[i] = i;
    for (int i = 0; i < K; i++)
        for (int j = i + 1; j < V; j++)
            if (cmp_desc_ids(z, ids[j], ids[i])) {
                int t = ids[i];
                ids[i] = ids[j];
                ids[j] = t;
            }
    bool in_top[V] = {false};
    for (int i = 0; i < K; i++) in_top[ids[i]] = true;
    sampler_params_t p = {.temperature = 2.0f, .top_k = K, .top_p = 1.0f};
    static int counts[V];
    histogram(&p, 77, z, V, 50000, counts);
    int seen = 0;
    for (int j = 0; j < V; j++) {
        if (!in_top[j]) cr_assert_eq(counts[j], 0, "token %d outside top-%d sampled", j, K);
        seen += counts[j] > 0;
    }
    cr_assert_eq(seen, K, "every kept token should appear at T=2");

    // top_k = 2 on a small vocabulary, renormalised frequencies.
    const float w[5] = {0.1f, 1.2f, -0.3f, 1.0f, 0.9f};
    sampler_params_t p2 = {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f};
    int c2[5];
    histogram(&p2, 5, w, 5, 100000, c2);
    cr_assert_eq(c2[0] + c2[2] + c2[4], 0);
    double e1 = exp(1.2), e3 = exp(1.0);
    cr_assert(fabs(c2[1] / 100000.0 - e1 / (e1 + e3)) < 0.01);
}

Test(sampler, top_k_ties_break_to_lower_id) {
    const float z[5] = {0.0f, 1.0f, 1.0f, 1.0f, -1.0f};
    sampler_params_t p = {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f};
    int c[5];
    histogram(&p, 9, z, 5, 20000, c);
    cr_assert_eq(c[0] + c[3] + c[4], 0);
    cr_assert(c[1] > 0 && c[2] > 0);
}

Test(sampler, top_p_nucleus) {
    const float a[3] = {logf(0.6f), logf(0.3f), logf(0.1f)};
    sampler_params_t p = {.temperature = 1.0f, .top_k = 0, .top_p = 0.5f};
    int c[3];
    histogram(&p, 1, a, 3, 20000, c);
    cr_assert_eq(c[0], 20000);

    // Order in the vocabulary must not matter: same distribution, permuted.
    const float b[3] = {logf(0.25f), logf(0.4f), logf(0.35f)};
    sampler_params_t q = {.temperature = 1.0f, .top_k = 0, .top_p = 0.7f};
    int cb[3];
    histogram(&q, 2, b, 3, 200000, cb);
    cr_assert_eq(cb[0], 0);
    cr_assert(fabs(cb[1] / 200000.0 - 0.4 / 0.75) < 0.01, "%f", cb[1] / 200000.0);
    cr_assert(fabs(cb[2] / 200000.0 - 0.35 / 0.75) < 0.01, "%f", cb[2] / 200000.0);

    const float d[3] = {logf(0.4f), logf(0.35f), logf(0.25f)};
    histogram(&q, 3, d, 3, 200000, cb);
    cr_assert_eq(cb[2], 0);
    cr_assert(fabs(cb[0] / 200000.0 - 0.4 / 0.75) < 0.01, "%f", cb[0] / 200000.0);
    cr_assert(fabs(cb[1] / 200000.0 - 0.35 / 0.75) < 0.01, "%f", cb[1] / 200000.0);

    // top_p runs on the top-k renormalised distribution: after top_k = 2 the masses are
    // 0.533 / 0.467, so top_p = 0.5 keeps only token 0.
    sampler_params_t kp = {.temperature = 1.0f, .top_k = 2, .top_p = 0.5f};
    histogram(&kp, 4, d, 3, 20000, cb);
    cr_assert_eq(cb[0], 20000);

    // A tiny top_p still keeps one token.
    sampler_params_t tiny = {.temperature = 1.0f, .top_k = 0, .top_p = 1e-9f};
    histogram(&tiny, 5, d, 3, 1000, cb);
    cr_assert_eq(cb[0], 1000);
}

Test(sampler, reported_logprob_is_untruncated) {
    const float z[4] = {2.0f, 1.5f, 0.0f, -1.0f};
    sampler_params_t p = {.temperature = 0.8f, .top_k = 2, .top_p = 0.9f};
    sampler_scratch_t s;
    sampler_scratch_init(&s, 4);
    rng_t r;
    rng_seed(&r, 17);
    for (int i = 0; i < 200; i++) {
        float lp = 1.0f;
        int tok = sampler_sample(&p, &r, z, 4, &s, &lp);
        cr_assert(tok == 0 || tok == 1);
        cr_assert(fabs(lp - ref_logprob(z, 4, 0.8, tok)) < 1e-6, "tok %d: %g", tok, lp);
        cr_assert_eq(lp, sampler_logprob(z, 4, 0.8f, tok));
        // The truncated (top-2 renormalised) log-prob would be clearly larger.
        double trunc = (double)z[tok] / 0.8 - log(exp(2.0 / 0.8) + exp(1.5 / 0.8));
        cr_assert(fabs(lp - trunc) > 1e-3);
    }
    sampler_scratch_free(&s);
    cr_assert_null(s.probs);
    cr_assert_null(s.idx);
    sampler_scratch_free(NULL);
}

Test(sampler, masked_tokens_never_sampled) {
    const float z[6] = {-INFINITY, 0.0f, -INFINITY, 0.5f, -INFINITY, -INFINITY};
    sampler_params_t p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f};
    int c[6];
    histogram(&p, 6, z, 6, 20000, c);
    cr_assert_eq(c[0] + c[2] + c[4] + c[5], 0);
    sampler_params_t k = {.temperature = 1.0f, .top_k = 4, .top_p = 0.99f};
    histogram(&k, 7, z, 6, 20000, c);
    cr_assert_eq(c[0] + c[2] + c[4] + c[5], 0);
    cr_assert(isinf(sampler_logprob(z, 6, 1.0f, 0)));
    cr_assert(fabs(sampler_entropy(z, 6, 1.0f) - sampler_entropy((const float[]){0.0f, 0.5f}, 2, 1.0f)) < 1e-6);
}

Test(sampler, entropy) {
    enum { V = 128 };
    float z[V];
    for (int j = 0; j < V; j++) z[j] = 3.25f;
    cr_assert(fabs(sampler_entropy(z, V, 1.0f) - log((double)V)) < 1e-5);
    cr_assert(fabs(sampler_entropy(z, V, 0.3f) - log((double)V)) < 1e-5);
    rng_t g;
    rng_seed(&g, 31);
    random_logits(&g, z, V, 5.0f);
    const float temps[3] = {0.5f, 1.0f, 2.0f};
    for (int ti = 0; ti < 3; ti++) {
        double p[V], h = 0.0;
        ref_probs(z, V, temps[ti], p);
        for (int j = 0; j < V; j++) h -= p[j] * log(p[j]);
        cr_assert(fabs(sampler_entropy(z, V, temps[ti]) - h) < 1e-5, "T=%g", temps[ti]);
    }
    const float one_hot[3] = {100.0f, 0.0f, 0.0f};
    cr_assert(sampler_entropy(one_hot, 3, 1.0f) < 1e-6f);
}

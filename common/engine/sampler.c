// sampler.c - xoshiro256** RNG, temperature / top-k / top-p sampling, log-probs and entropy.
//
// Candidate selection uses binary heaps over the scratch index array, ordered by probability
// with the lower token id first on ties, so results never depend on sort stability:
//   - top-k keeps a heap of the k best seen so far, worst at the root: O(V log k);
//   - top-p heapifies the candidates best-first and pops only until the nucleus mass is
//     reached: O(V + n_nucleus log V) rather than a full sort.
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/util/util.h"

// --- RNG -----------------------------------------------------------------------------------

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rng_seed(rng_t *r, uint64_t seed) {
    // splitmix64 is a bijection on consecutive counters, so at most one word can be zero and
    // the all-zero state (a fixed point of xoshiro) is unreachable.
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t rng_next(rng_t *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float rng_uniform(rng_t *r) {
    // 24 bits fit a float mantissa exactly, so the result is < 1 without rounding up.
    return (float)(rng_next(r) >> 40) * 0x1p-24f;
}

// --- log-probabilities ---------------------------------------------------------------------

static double effective_temp(float t) { return t > 0 ? (double)t : 1.0; }

// Fills w[j] = exp(z_j/T - m) (when w is not NULL) and returns log sum_j exp(z_j/T - m) + m.
// sampler_logprob and sampler_sample both go through here so the reported log-prob of a
// sampled token is bit-identical to a separate sampler_logprob call. *wsum receives the sum of
// the stored float weights, the normaliser consistent with walking w.
static double tempered_lse(const float *logits, int vocab, double temp, float *w, double *wsum) {
    float zmax = logits[0];
    for (int j = 1; j < vocab; j++)
        if (logits[j] > zmax) zmax = logits[j];
    double m = (double)zmax / temp;
    double sum = 0.0, fsum = 0.0;
    for (int j = 0; j < vocab; j++) {
        double e = exp((double)logits[j] / temp - m);
        sum += e;
        if (w) {
            w[j] = (float)e;
            fsum += (double)w[j];
        }
    }
    if (wsum) *wsum = fsum;
    return m + log(sum);
}

float sampler_logprob(const float *logits, int vocab, float temperature, int token) {
    ASSERT(logits != NULL && vocab > 0);
    ASSERT(token >= 0 && token < vocab);
    double temp = effective_temp(temperature);
    double lse = tempered_lse(logits, vocab, temp, NULL, NULL);
    return (float)((double)logits[token] / temp - lse);
}

float sampler_entropy(const float *logits, int vocab, float temperature) {
    ASSERT(logits != NULL && vocab > 0);
    double temp = effective_temp(temperature);
    float zmax = logits[0];
    for (int j = 1; j < vocab; j++)
        if (logits[j] > zmax) zmax = logits[j];
    double m = (double)zmax / temp;
    // H = log Z - sum_j w_j y_j / Z with y_j = z_j/T - m and w_j = exp(y_j).
    double z = 0.0, wy = 0.0;
    for (int j = 0; j < vocab; j++) {
        double y = (double)logits[j] / temp - m;
        double w = exp(y);
        z += w;
        // Masked tokens (y = -inf) contribute 0, not 0 * -inf.
        if (w > 0) wy += w * y;
    }
    return (float)(log(z) - wy / z);
}

// --- scratch -------------------------------------------------------------------------------

void sampler_scratch_init(sampler_scratch_t *s, int vocab) {
    ASSERT(s != NULL && vocab > 0);
    s->probs = falloc((size_t)vocab);
    s->idx = xmalloc((size_t)vocab * sizeof(int));
    s->vocab = vocab;
}

void sampler_scratch_free(sampler_scratch_t *s) {
    if (!s) return;
    free(s->probs);
    free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
    s->vocab = 0;
}

// --- candidate heaps -----------------------------------------------------------------------

// Strict total order on tokens: higher weight first, lower id first on equal weight.
static bool better(const float *w, int a, int b) { return w[a] > w[b] || (w[a] == w[b] && a < b); }

// Whether a belongs nearer the root than b: best_root heaps keep the best token at the root,
// the others the worst.
static bool above(const float *w, int a, int b, bool best_root) {
    return best_root ? better(w, a, b) : better(w, b, a);
}

static void sift_down(const float *w, int *h, int n, int i, bool best_root) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && above(w, h[c + 1], h[c], best_root)) c++;
        if (!above(w, h[c], h[i], best_root)) return;
        int t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

static void heapify(const float *w, int *h, int n, bool best_root) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(w, h, n, i, best_root);
}

// Leaves the k best tokens of 0..vocab-1 in h[0..k).
static void select_top_k(const float *w, int vocab, int k, int *h) {
    for (int j = 0; j < k; j++) h[j] = j;
    heapify(w, h, k, false);
    for (int j = k; j < vocab; j++) {
        if (better(w, j, h[0])) {
            h[0] = j;
            sift_down(w, h, k, 0, false);
        }
    }
}

// Reduces the n candidates in h to the smallest best-first prefix whose weight reaches
// top_p * mass (mass = their total weight). The nucleus ends up in h[*first..n); returns its
// weight.
static double select_top_p(const float *w, int *h, int n, double mass, float top_p, int *first) {
    double target = (double)top_p * mass;
    double cum = 0.0;
    heapify(w, h, n, true);
    int m = n;
    while (m > 0) {
        int best = h[0];
        h[0] = h[m - 1];
        h[m - 1] = best;
        m--;
        sift_down(w, h, m, 0, true);
        cum += (double)w[best];
        if (cum >= target) break;
    }
    *first = m;
    return cum;
}

// --- sampling ------------------------------------------------------------------------------

static int argmax(const float *logits, int vocab) {
    int best = 0;
    for (int j = 1; j < vocab; j++)
        if (logits[j] > logits[best] || (isnan(logits[best]) && !isnan(logits[j]))) best = j;
    return best;
}

// Inverse-CDF draw over the candidates ids[0..n) (ids NULL: tokens 0..n-1) with total weight
// mass. Zero-weight tokens are never chosen; when rounding leaves u * mass at or past the
// accumulated total, the last positive candidate is taken.
static int draw(const float *w, const int *ids, int n, double mass, rng_t *rng) {
    double target = (double)rng_uniform(rng) * mass;
    double cum = 0.0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        int id = ids ? ids[i] : i;
        if (!(w[id] > 0)) continue;
        cum += (double)w[id];
        last = id;
        if (cum > target) return id;
    }
    // Only reachable without any positive weight when the logits themselves are degenerate
    // (NaN or all -inf); any candidate is as good as another then.
    return last >= 0 ? last : (ids ? ids[0] : 0);
}

int sampler_sample(const sampler_params_t *p, rng_t *rng, const float *logits, int vocab, sampler_scratch_t *s,
                   float *logprob) {
    ASSERT(p != NULL && logits != NULL && vocab > 0);
    if (!(p->temperature > 0)) {
        int tok = argmax(logits, vocab);
        if (logprob) *logprob = sampler_logprob(logits, vocab, 1.0f, tok);
        return tok;
    }
    ASSERT(rng != NULL && s != NULL && s->vocab >= vocab);

    double temp = (double)p->temperature;
    float *w = s->probs;
    double mass;
    double lse = tempered_lse(logits, vocab, temp, w, &mass);

    const int *ids = NULL;
    int n = vocab;
    if (p->top_k > 0 && p->top_k < vocab) {
        select_top_k(w, vocab, p->top_k, s->idx);
        ids = s->idx;
        n = p->top_k;
        mass = 0.0;
        for (int i = 0; i < n; i++) mass += (double)w[ids[i]];
    }
    if (p->top_p < 1.0f) {
        if (!ids) {
            for (int j = 0; j < vocab; j++) s->idx[j] = j;
            ids = s->idx;
        }
        int first;
        // The nucleus is taken relative to what top-k kept, as top-p runs on the top-k
        // renormalised distribution.
        mass = select_top_p(w, s->idx, n, mass, p->top_p, &first);
        ids = s->idx + first;
        n -= first;
    }
    int tok = draw(w, ids, n, mass, rng);
    if (logprob) *logprob = (float)((double)logits[tok] / temp - lse);
    return tok;
}

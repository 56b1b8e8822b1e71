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
#include "kernels/kernels.h"

// --- log-probabilities ---------------------------------------------------------------------

static double effective_temp(float t) { return t > 0 ? (double)t : 1.0; }

// The log-sum-exp of the tempered logits is the CPU backend's (kernels_cpu_tempered_lse), which
// its sample op and so sampler_sample use too: the reported log-prob of a sampled token is
// bit-identical to a separate sampler_logprob call.
float sampler_logprob(const float *logits, int vocab, float temperature, int token) {
    ASSERT(logits != NULL && vocab > 0);
    ASSERT(token >= 0 && token < vocab);
    double temp = effective_temp(temperature);
    double lse = kernels_cpu_tempered_lse(logits, vocab, temp, NULL, NULL);
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

// --- sampling ------------------------------------------------------------------------------

static int argmax(const float *logits, int vocab) {
    int best = 0;
    for (int j = 1; j < vocab; j++)
        if (logits[j] > logits[best] || (isnan(logits[best]) && !isnan(logits[j]))) best = j;
    return best;
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
    // temperature, top-k, top-p and the inverse-CDF draw: the CPU backend's sample op, row by row
    // (one uniform draw per non-greedy sample)
    float u = rng_uniform(rng), lp;
    int tok = kernels_cpu_sample_row(logits, vocab, p->temperature, p->top_k, p->top_p, u, s->probs, s->idx, &lp);
    if (logprob) *logprob = lp;
    return tok;
}

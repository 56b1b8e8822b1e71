// sampler.h - per-sequence token sampling with log-probabilities.
//
// Every sampled token comes with its log-probability under softmax(logits / T), T the
// sequence's temperature, over the FULL vocabulary - before top-k / top-p truncation. That is
// the quantity the trainer recomputes from the same logits (with the same T), so rollout and
// trainer agree. Greedy decoding (temperature 0) reports the log-prob under softmax(logits)
// (T = 1). The log-sum-exp is accumulated in double.
//
// RNG: common/util/rng.h, seeded per sequence, so a sequence's samples depend only on its seed
// and its logits, never on batch composition or thread count.
#ifndef MARLAAS_SAMPLER_H
#define MARLAAS_SAMPLER_H

#include <stdint.h>

#include "common/util/rng.h"

typedef struct {
    float temperature;   // 0 = greedy (argmax, lowest id on ties)
    int top_k;           // 0 = no top-k
    float top_p;         // 1 = no nucleus truncation; (0, 1]
} sampler_params_t;

// Scratch space for sample(): reused across calls, sized for a vocabulary.
typedef struct {
    float *probs;        // (vocab)
    int *idx;            // (vocab)
    int vocab;
} sampler_scratch_t;

void sampler_scratch_init(sampler_scratch_t *s, int vocab);
void sampler_scratch_free(sampler_scratch_t *s);

// log softmax(logits / T)[token], T <= 0 treated as 1.
float sampler_logprob(const float *logits, int vocab, float temperature, int token);
// Samples a token id; writes its log-prob (see above) into *logprob when not NULL.
// Applies temperature, then top-k, then top-p (smallest set of tokens, by descending
// probability, whose mass reaches top_p), renormalises, draws with rng.
int sampler_sample(const sampler_params_t *p, rng_t *rng, const float *logits, int vocab, sampler_scratch_t *s,
                   float *logprob);
// Entropy of softmax(logits / T) in nats.
float sampler_entropy(const float *logits, int vocab, float temperature);

#endif

// rng.h - the project's random numbers: xoshiro256** seeded through splitmix64. A stream depends
// only on its seed, so a sequence's samples, a task's examples and a dataset's split never depend
// on batch composition, thread count or what else ran.
#ifndef MARLAAS_RNG_H
#define MARLAAS_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} rng_t;

void rng_seed(rng_t *r, uint64_t seed);
uint64_t rng_next(rng_t *r);
// Uniform in [0, 1) with 24 bits of precision.
float rng_uniform(rng_t *r);

#endif

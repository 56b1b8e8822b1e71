// perturb.h - GPU-like numerics for the emulator's second build (tests/gpu/emu/run.sh): the
// results of expf/logf/erff/tanhf/coshf (CUDA: <= 2 ulp) and exp/log (double) are moved by up to 2 ulp (float)
// or 1 ulp (double) at random, so that the tests' tolerances are checked against errors of the
// size CUDA's math library makes. EMU_SEED=<n> varies the sequence. Included by the transformed
// cuda.cu right after its own headers; redefines the seven names for the rest of that file.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline uint32_t emu_rnd(void) {
    static uint64_t s = 0;
    if (!s) {
        const char *e = getenv("EMU_SEED");
        s = 88172645463325252ull ^ (e ? strtoull(e, 0, 10) * 0x9e3779b97f4a7c15ull : 0);
    }
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (uint32_t)s;
}
static inline float emu_pf(float x) {
    int k = (int)(emu_rnd() % 5) - 2;
    for (; k > 0; k--) x = nextafterf(x, INFINITY);
    for (; k < 0; k++) x = nextafterf(x, -INFINITY);
    return x;
}
static inline double emu_pd(double x) {
    int k = (int)(emu_rnd() % 3) - 1;
    for (; k > 0; k--) x = nextafter(x, INFINITY);
    for (; k < 0; k++) x = nextafter(x, -INFINITY);
    return x;
}
// Exact results stay exact (CUDA's expf(0) is 1, underflow is 0).
static inline float emu_expf(float x) {
    float r = expf(x);
    return (r == 0.0f || r == 1.0f || isinf(r)) ? r : emu_pf(r);
}
static inline float emu_logf(float x) {
    float r = logf(x);
    return (r == 0.0f || isinf(r)) ? r : emu_pf(r);
}
static inline double emu_exp(double x) {
    double r = exp(x);
    return (r == 0.0 || r == 1.0 || isinf(r)) ? r : emu_pd(r);
}
static inline double emu_log(double x) {
    double r = log(x);
    return (r == 0.0 || isinf(r)) ? r : emu_pd(r);
}
static inline float emu_erff(float x) {
    float r = erff(x);
    if (r == 0.0f || r == 1.0f || r == -1.0f) return r;
    r = emu_pf(r);
    return r > 1.0f ? 1.0f : r < -1.0f ? -1.0f : r;
}
static inline float emu_tanhf(float x) {
    float r = tanhf(x);
    if (r == 0.0f || r == 1.0f || r == -1.0f) return r;
    r = emu_pf(r);
    return r > 1.0f ? 1.0f : r < -1.0f ? -1.0f : r;   // CUDA's tanhf stays within [-1, 1]
}
static inline float emu_coshf(float x) {
    float r = coshf(x);
    return (r == 1.0f || isinf(r)) ? r : emu_pf(r);
}
#define expf emu_expf
#define coshf emu_coshf
#define erff emu_erff
#define tanhf emu_tanhf
#define logf emu_logf
#define exp emu_exp
#define log emu_log

// test_bench_step.c - the tenancy benchmark's trainer workload (bench/bench_tenancy.c, compiled
// into this test) on models/micro: every mode (unshared, one by one, mixed) at 1, 8 and 32 jobs,
// two rounds each. The 32 adapters it trains and the workload's sizes are fingerprinted
// (testfp.h): the benchmark must compute them bit for bit as recorded.
#include <criterion/criterion.h>

#include "tests/unit/testfp.h"

// The benchmark is a program of its own: the test compiles it in, under another name for main.
#define main bench_tenancy_main
#include "bench/bench_tenancy.c"
#undef main

Test(bench_step, trainer_fingerprint, .timeout = 120) {
    tfp_pin_threads();
    static const tfp_recorded_t recorded[] = {
        {"gcc12/avx512f/SkylakeX", 0x133be6a48c44415bull},
        {"gcc12/avx512f/SkylakeX/san", 0xb5ce0eb19f9a2ca9ull},
    };
    // the shortest minimum time: trainer_rate runs its untimed first round and one timed round
    min_seconds = 1e-300;
    twork_t w;
    twork_open(&w, "models/micro");
    tfp_t f;
    tfp_init(&f);
    const int ks[] = {1, 8, 32};
    for (int ki = 0; ki < 3; ki++)
        for (int mode = 0; mode < 3; mode++)
            trainer_rate(w.rt, mode == 0 ? w.plain : w.shared, &w.all, ks[ki], mode == 2, w.grads, w.opt);
    for (int j = 0; j < MAXJ; j++) {
        const lora_t *a = lora_pool_get(w.rt->pool, j);
        tfp_bytes(&f, a->params, sizeof(float) * a->n_params);
        tfp_double(&f, w.tokens[j]);
        tfp_double(&f, w.flops[j]);
    }
    twork_close(&w);
    tfp_expect("benchmark trainer steps", f.h, recorded);
}

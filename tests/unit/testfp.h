// testfp.h - fingerprints of training results: a 64-bit FNV-1a hash of the bytes a computation
// produced (adapter parameters, loss statistics), compared with a value recorded for the platform.
//
// A CPU training step is bit-reproducible on one platform only: OpenBLAS's kernel set, the CPU
// kernel variant in use (kernels_cpu_isa: its vector width orders the `omp simd` reductions and
// the few-rows products), the optimisation and the sanitizers' instrumentation (which vectorise
// loops differently) and the thread count all change the order of float sums. The tests pin one
// thread (tfp_pin_threads) and key recorded values by compiler, CPU kernel variant, OpenBLAS
// kernel set and build (tfp_platform); on a platform without a recorded value the test is skipped
// and prints the value to record (MARLAAS_CPU_ISA runs another variant). Include after
// criterion.h.
#ifndef MARLAAS_TESTFP_H
#define MARLAAS_TESTFP_H

#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/util.h"
#include "kernels/kernels.h"

typedef struct {
    uint64_t h;
} tfp_t;

static inline void tfp_init(tfp_t *f) { f->h = 0xcbf29ce484222325ull; }

static inline void tfp_bytes(tfp_t *f, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) f->h = (f->h ^ b[i]) * 0x100000001b3ull;
}

static inline void tfp_str(tfp_t *f, const char *s) { tfp_bytes(f, s, strlen(s) + 1); }

static inline void tfp_double(tfp_t *f, double v) { tfp_bytes(f, &v, sizeof v); }

// The bytes of a file; -1 when it cannot be read.
static inline int tfp_file(tfp_t *f, const char *path) {
    size_t len = 0;
    char err[ERR_LEN];
    char *d = util_read_file(path, &len, err);
    if (!d) return -1;
    tfp_bytes(f, d, len);
    free(d);
    return 0;
}

// One thread for OpenBLAS and OpenMP in this process (models created later keep it).
static inline void tfp_pin_threads(void) {
    setenv("MARLAAS_THREADS", "1", 1);
    util_threads_init();
}

// "gcc<major>/<CPU kernel variant>/<OpenBLAS kernel set>", then "/O0" for a build without
// optimisation and "/san" for one with AddressSanitizer (make SAN=1). The variants avx512 and
// avx512-bf16 differ only in gemm_bf16w's few-rows path (bf16 weights), so both key as "avx512f",
// the name the values recorded by -march=native builds on AVX-512 machines carry (the avx512
// variant computes what those builds did, bit for bit: see the Makefile's CPU_ISAS); a test on
// bf16 weights would have to tell them apart.
static inline const char *tfp_platform(void) {
    static char buf[128];
    const char *isa = kernels_cpu_isa();
    if (!strncmp(isa, "avx512", 6)) isa = "avx512f";
#ifdef __GNUC__
    int cc = __GNUC__;
#else
    int cc = 0;
#endif
#ifdef __OPTIMIZE__
    const char *opt = "";
#else
    const char *opt = "/O0";
#endif
#ifdef __SANITIZE_ADDRESS__
    const char *san = "/san";
#else
    const char *san = "";
#endif
    snprintf(buf, sizeof buf, "gcc%d/%s/%s%s%s", cc, isa, openblas_get_corename(), opt, san);
    return buf;
}

typedef struct {
    const char *platform;
    uint64_t value;
} tfp_recorded_t;

// Asserts that `got` equals the value recorded for this platform; skips (printing the value)
// where none is recorded.
#define tfp_expect(what, got, table)                                                                              \
    do {                                                                                                           \
        const char *plat_ = tfp_platform();                                                                        \
        const tfp_recorded_t *rec_ = NULL;                                                                         \
        for (size_t i_ = 0; i_ < sizeof(table) / sizeof((table)[0]); i_++)                                       \
            if (!strcmp((table)[i_].platform, plat_)) rec_ = &(table)[i_];                                         \
        if (!rec_)                                                                                                 \
            cr_skip_test("%s: fingerprint 0x%016llx on %s, where none is recorded (record it in %s once this "   \
                         "platform's results are trusted)",                                                        \
                         what, (unsigned long long)(got), plat_, __FILE__);                                        \
        cr_assert_eq((got), rec_->value,                                                                           \
                     "%s: fingerprint 0x%016llx on %s, recorded 0x%016llx: the step no longer computes what it "  \
                     "computed, bit for bit",                                                                      \
                     what, (unsigned long long)(got), plat_, (unsigned long long)rec_->value);                   \
    } while (0)

#endif

// bench_util.h - what the benchmark programs share: the machine line and OpenBLAS sgemm's
// GFLOP/s, measured in the same run as the figures they put in context.
#ifndef MARLAAS_BENCH_UTIL_H
#define MARLAAS_BENCH_UTIL_H

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util/util.h"
#include "kernels/kernels.h"

// "machine: CPU, cores, MARLAAS_THREADS, time" on stdout.
static inline void bench_machine(void) {
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) snprintf(model, sizeof model, "%s", c + 2);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    time_t t = time(NULL);
    char ts[64];
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("machine: %s, %ld cores online, MARLAAS_THREADS=%d, OpenBLAS kernels %s, %s\n", model,
           sysconf(_SC_NPROCESSORS_ONLN), util_threads(), kernels_cpu_blas_core(), ts);
}

// GFLOP/s of C = A B^T (M x K times N x K) at the current thread count, timed for `seconds`.
static inline double bench_sgemm_gflops(int M, int N, int K, double seconds) {
    float *A = falloc((size_t)M * K), *B = falloc((size_t)N * K), *C = falloc((size_t)M * N);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * K; i++) B[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, A, K, B, K, 0, C, N);
    int reps = 0;
    double t0 = util_now(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, A, K, B, K, 0, C, N);
        reps++;
    } while ((t = util_now() - t0) < seconds);
    free(A), free(B), free(C);
    return 2.0 * M * N * K * reps / t / 1e9;
}

#endif

// bench_util.h - what the benchmark programs share: the machine line and OpenBLAS sgemm's
// GFLOP/s, measured in the same run as the figures they put in context.
#ifndef MARLAAS_BENCH_UTIL_H
#define MARLAAS_BENCH_UTIL_H

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util/util.h"
#include "kernels/kernels.h"

// "machine: CPU, cores, MARLAAS_THREADS, CPU kernel variant, OpenBLAS kernels, time" on stdout.
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
    printf("machine: %s, %ld cores online, MARLAAS_THREADS=%d, CPU kernels %s, OpenBLAS kernels %s, %s\n", model,
           sysconf(_SC_NPROCESSORS_ONLN), util_threads(), kernels_cpu_isa(), kernels_cpu_blas_core(), ts);
}

extern void openblas_set_num_threads(int n);

// GFLOP/s of OpenBLAS's own C = A B^T (M x K times N x K) on util_threads() threads (its own
// threading: the reference), timed for `seconds`; OpenBLAS is set back to one thread after.
static inline double bench_sgemm_gflops(int M, int N, int K, double seconds) {
    openblas_set_num_threads(util_threads());
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
    openblas_set_num_threads(1);
    return 2.0 * M * N * K * reps / t / 1e9;
}

// Bytes of the read-bandwidth buffer: twice the last-level cache, at least 256 MiB.
static inline size_t bench_read_buffer_bytes(void) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    size_t b = llc > 0 ? 2 * (size_t)llc : 0;
    return b < ((size_t)256 << 20) ? (size_t)256 << 20 : b;
}

// The sum of n floats (n a multiple of 64) with four independent vector accumulators: bound by
// the memory, not by the latency of one addition chain. Compiled for the widest vectors the CPU
// has (chosen at run time, like the kernels).
typedef float bench_v16 __attribute__((vector_size(64)));
__attribute__((target_clones("avx512f", "avx2", "default"))) static float bench_read_sum(const float *a, size_t n) {
    bench_v16 acc[4] = {{0}};
    for (size_t i = 0; i + 64 <= n; i += 64) {
        bench_v16 x[4];
        memcpy(x, a + i, sizeof x);
        acc[0] += x[0], acc[1] += x[1], acc[2] += x[2], acc[3] += x[3];
    }
    bench_v16 s = acc[0] + acc[1] + acc[2] + acc[3];
    float t = 0;
    for (int j = 0; j < 16; j++) t += s[j];
    return t;
}

// GB/s of a vectorised read of the n floats at a (n a multiple of 64) on `threads` threads (each
// reads its contiguous share), the best of rounds over `seconds` (at least three, the first not
// counted).
static inline double bench_read_gbs_of(const float *a, size_t n, int threads, double seconds) {
    double best = 0, t_end = util_now() + seconds;
    volatile float sink = 0;
    for (int round = 0; round < 3 || util_now() < t_end; round++) {
        double t0 = util_now();
        float tot = 0;
#pragma omp parallel num_threads(threads) reduction(+ : tot)
        {
            size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
            size_t lo = n / 64 * id / nt * 64, hi = n / 64 * (id + 1) / nt * 64;
            tot += bench_read_sum(a + lo, hi - lo);
        }
        double t = util_now() - t0;
        sink += tot;
        if (round > 0 && (double)(n * sizeof(float)) / t / 1e9 > best) best = (double)(n * sizeof(float)) / t / 1e9;
        if (round > 50) break;
    }
    (void)sink;
    return best;
}

// A buffer of bench_read_buffer_bytes() for bench_read_gbs_of (n floats; free it), in the pages the
// weights it is compared with live in (kernels_host_alloc: transparent huge pages; in 4 KiB pages
// the same read runs slower on a VM, where each TLB miss walks two page tables).
static inline float *bench_read_buffer(size_t *n) {
    *n = bench_read_buffer_bytes() / sizeof(float) / 64 * 64;
    float *a = kernels_host_alloc(*n * sizeof(float));
    if (!a) {
        fprintf(stderr, "bench: cannot allocate the read buffer (%zu bytes)\n", *n * sizeof(float));
        exit(1);
    }
    for (size_t i = 0; i < *n; i++) a[i] = (float)(i & 7);
    return a;
}

// GB/s of a vectorised read of bench_read_buffer_bytes() on `threads` threads: the bound a
// bandwidth-bound phase (decode at small batch) is measured against.
static inline double bench_read_gbs(int threads, double seconds) {
    size_t n;
    float *a = bench_read_buffer(&n);
    double best = bench_read_gbs_of(a, n, threads, seconds);
    free(a);
    return best;
}

#endif

// cpu.c - the CPU compute backend: OpenBLAS sgemm for dense products, hand-written kernels for the
// products of a few rows with a weight matrix (decode), C loops (vectorised by the compiler,
// threaded with OpenMP) for everything else. This is the reference backend: every other backend
// is tested against these functions.
//
// This file is compiled once per kernel variant (cpu_variants.h), with KERN_CPU_ISA and the
// variant's -march (Makefile: CPU_ISAS); everything here is static but the variant's tables.
// What must exist once per process (the variant's choice, OpenBLAS's kernel set, the row sampler
// shared with common/engine/sampler.c) is in cpu_host.c.
#include <cblas.h>
#include <limits.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_variants.h"
#include "kernels/kernels.h"
#include "kernels/cpu/pool.h"

#ifndef KERN_CPU_ISA
#error "cpu.c is compiled once per variant with -DKERN_CPU_ISA=... (see the Makefile's CPU_ISAS)"
#endif
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__FMA__)
#error "the avx512 variant is compiled with -march=x86-64-v4"
#endif
#include <immintrin.h>
#elif KERN_CPU_ISA == KERN_CPU_ISA_AVX2
#if !defined(__AVX2__) || !defined(__FMA__) || defined(__AVX512F__)
#error "the avx2 variant is compiled with -march=x86-64-v3"
#endif
#include <immintrin.h>
#elif KERN_CPU_ISA != KERN_CPU_ISA_SCALAR
#error "unknown KERN_CPU_ISA"
#endif

// --- memory --------------------------------------------------------------------------------

static void *cpu_alloc(size_t bytes) {
    void *p = kernels_host_alloc(bytes);
    if (!p) {
        fprintf(stderr, "FATAL out of memory allocating %zu bytes at %s:%d\n", bytes, __FILE__, __LINE__);
        abort();
    }
    return p;
}

static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memcpy(dst, src, bytes);
}
static void cpu_zero(void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}

// --- parallel loops --------------------------------------------------------------------------
// Every parallel loop runs on the backend's pool (kernels/cpu/pool.h): chunks that whoever is
// running takes, so a thread the scheduler has taken away delays nothing but its own chunk.
// par_for runs fn over [0, n) on the caller when n <= serial (too little work to share), else on
// the pool in about four chunks per thread of at least min_grain items.
static void par_for(size_t n, size_t serial, size_t min_grain, void (*fn)(void *, size_t, size_t), void *ctx) {
    if (n == 0) return;
    if (n <= serial || kpool_threads() == 1) {
        fn(ctx, 0, n);
        return;
    }
    kpool_for(n, kpool_grain(n, 4, min_grain), fn, ctx);
}

// Elementwise loops share from this many items on.
#define PAR_ELEMS 65536

// --- dense ---------------------------------------------------------------------------------

// sgemm on the pool: OpenBLAS runs single-threaded (util_threads_init sets it so) in chunks of
// C's columns (or rows, when C is taller than wide), so a contended machine slows a product by
// the chunks a descheduled thread holds, not by a barrier of every thread. Every element of C is
// computed by one OpenBLAS call over the whole K, as in one call: splitting M or N does not change
// the order of any sum. Products too small to share run in one call.
// OpenBLAS's OpenMP build takes its thread count from the calling thread's OpenMP setting
// (omp_get_max_threads, a per-thread value that starts at the number of cores in every new
// thread), not from openblas_set_num_threads alone: called from a pool thread it would start a
// team of its own inside the pool. Every thread that calls it sets its own to 1 once.
static _Thread_local bool blas_one;
static inline void blas_single(void) {
    if (blas_one) return;
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    blas_one = true;
}

typedef struct {
    bool ta, tb, by_cols;
    int M, N, K, blk, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
} sgemm_t;

static void sgemm_chunk(void *c_, size_t lo, size_t hi) {
    const sgemm_t *c = c_;
    blas_single();
    CBLAS_TRANSPOSE ta = c->ta ? CblasTrans : CblasNoTrans, tb = c->tb ? CblasTrans : CblasNoTrans;
    for (size_t b = lo; b < hi; b++) {
        int x0 = (int)b * c->blk, len = c->by_cols ? c->N - x0 : c->M - x0;
        if (len > c->blk) len = c->blk;
        if (c->by_cols)
            cblas_sgemm(CblasRowMajor, ta, tb, c->M, len, c->K, c->alpha, c->A, c->lda,
                        c->tb ? c->B + (size_t)x0 * c->ldb : c->B + x0, c->ldb, c->beta, c->C + x0, c->ldc);
        else
            cblas_sgemm(CblasRowMajor, ta, tb, len, c->N, c->K, c->alpha, c->ta ? c->A + x0 : c->A + (size_t)x0 * c->lda,
                        c->lda, c->B, c->ldb, c->beta, c->C + (size_t)x0 * c->ldc, c->ldc);
    }
}

// Products below this many multiply-adds run in one call (a few microseconds of work).
#define SGEMM_POOL_MIN_MACS (1 << 21)

static void sgemm_pool(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    int T = kpool_threads();
    bool by_cols = N >= M;
    int len = by_cols ? N : M;
    // about four blocks per thread, a multiple of 16 wide, at least 32
    int blk = (len + 4 * T - 1) / (4 * T);
    blk = (blk + 15) / 16 * 16;
    if (blk < 32) blk = 32;
    blas_single();
    if (T == 1 || (double)M * N * K < SGEMM_POOL_MIN_MACS || blk >= len) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                    lda, B, ldb, beta, C, ldc);
        return;
    }
    sgemm_t c = {.ta = ta, .tb = tb, .by_cols = by_cols, .M = M, .N = N, .K = K, .blk = blk, .lda = lda, .ldb = ldb,
                 .ldc = ldc, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C};
    kpool_for((size_t)((len + blk - 1) / blk), 1, sgemm_chunk, &c);
}

// `omp simd reduction` lets the compiler split the sum over vector lanes (plain C would force a
// serial chain of dependent adds). The order is fixed for a build, so results stay deterministic
// and the inference and training paths, which share this function, agree.
static inline __attribute__((always_inline)) float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// --- exp ---------------------------------------------------------------------------------------
// y[i] = expf(x[i]) for n floats, bit for bit what the C library's expf returns on the CPUs the
// vector variants run on, 8 (AVX2) or 16 (AVX-512) at a time: attention's softmax and its
// backward call expf once per score, and as a function call it took a tenth of a training pass
// (models/micro, 32 jobs). glibc's expf on a CPU with FMA and AVX2 (its __expf_fma, since glibc
// 2.27: sysdeps/ieee754/flt-32/e_expf.c) computes in double: z = x * 32/ln 2 rounded to an
// integer k by adding 1.5 * 2^52, r = x * 32/ln 2 - k (both fused), s = 2^(k/32) from a 32-entry
// table with k/32's integer part added to the exponent bits, then (C0 r + C1) r^2 + (C2 r + 1)
// times s, each step fused as there, rounded to float once. These are those operations with the
// same constants and table, on every lane; a lane whose |x| is 88 or more (overflow, underflow,
// inf, NaN: the library's own branch) is computed by expf itself. The scalar variant calls expf.
// tests/unit/test_cpu_isa.c compares the two over a sweep of the floats.
#if KERN_CPU_ISA != KERN_CPU_ISA_SCALAR
static const uint64_t EXPF_TAB[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};
#define EXPF_INVLN2N 0x40471547652b82feull   // 32 / ln 2
#define EXPF_C0 0x3ebc6af84b912394ull
#define EXPF_C1 0x3f2ebfce50fac4f3ull
#define EXPF_C2 0x3f962e42ff0c52d6ull
#define EXPF_SHIFT 0x4338000000000000ull     // 1.5 * 2^52
#define EXPF_ONE 0x3ff0000000000000ull
#define EXPF_TOP_SLOW 0x42b                  // (bits >> 20) & 0x7ff from |x| = 88 up: expf's own branch
#endif

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
// 8 lanes of double: expf of the floats x (as doubles xd).
static inline __m256 expf8_pd(__m512d xd) {
    const __m512d inv = _mm512_castsi512_pd(_mm512_set1_epi64((long long)EXPF_INVLN2N));
    const __m512d shift = _mm512_castsi512_pd(_mm512_set1_epi64((long long)EXPF_SHIFT));
    __m512d z = _mm512_fmadd_pd(inv, xd, shift);
    __m512i ki = _mm512_castpd_si512(z);
    __m512d kd = _mm512_sub_pd(z, shift);
    __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    __m512i t = _mm512_i64gather_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(31)), (const void *)EXPF_TAB, 8);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    __m512d p = _mm512_fmadd_pd(r, _mm512_castsi512_pd(_mm512_set1_epi64((long long)EXPF_C0)),
                                _mm512_castsi512_pd(_mm512_set1_epi64((long long)EXPF_C1)));
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_castsi512_pd(_mm512_set1_epi64((long long)EXPF_C2)),
                                _mm512_castsi512_pd(_mm512_set1_epi64((long long)EXPF_ONE)));
    y = _mm512_fmadd_pd(p, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

static void exp_rows(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), _mm512_set1_epi32(0x7ff));
        __mmask16 slow = _mm512_cmpge_epi32_mask(top, _mm512_set1_epi32(EXPF_TOP_SLOW));
        __m256 lo = expf8_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        __m256 hi = expf8_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
        if (slow) {
            float xs[16];
            memcpy(xs, x + i, sizeof xs);
            _mm256_storeu_ps(y + i, lo);
            _mm256_storeu_ps(y + i + 8, hi);
            for (int l = 0; l < 16; l++)
                if (slow & (1u << l)) y[i + l] = expf(xs[l]);
            continue;
        }
        _mm256_storeu_ps(y + i, lo);
        _mm256_storeu_ps(y + i + 8, hi);
    }
    for (; i < n; i++) y[i] = expf(x[i]);
}
#elif KERN_CPU_ISA == KERN_CPU_ISA_AVX2
// 4 lanes of double: expf of the floats x (as doubles xd).
static inline __m128 expf4_pd(__m256d xd) {
    const __m256d inv = _mm256_castsi256_pd(_mm256_set1_epi64x((long long)EXPF_INVLN2N));
    const __m256d shift = _mm256_castsi256_pd(_mm256_set1_epi64x((long long)EXPF_SHIFT));
    __m256d z = _mm256_fmadd_pd(inv, xd, shift);
    __m256i ki = _mm256_castpd_si256(z);
    __m256d kd = _mm256_sub_pd(z, shift);
    __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)EXPF_TAB, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    __m256d p = _mm256_fmadd_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x((long long)EXPF_C0)),
                                _mm256_castsi256_pd(_mm256_set1_epi64x((long long)EXPF_C1)));
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x((long long)EXPF_C2)),
                                _mm256_castsi256_pd(_mm256_set1_epi64x((long long)EXPF_ONE)));
    y = _mm256_fmadd_pd(p, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

static void exp_rows(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 20), _mm256_set1_epi32(0x7ff));
        int slow = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(EXPF_TOP_SLOW - 1))));
        __m128 lo = expf4_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        __m128 hi = expf4_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        float xs[8];
        if (slow) memcpy(xs, x + i, sizeof xs);
        _mm_storeu_ps(y + i, lo);
        _mm_storeu_ps(y + i + 4, hi);
        if (slow)
            for (int l = 0; l < 8; l++)
                if (slow & (1 << l)) y[i + l] = expf(xs[l]);
    }
    for (; i < n; i++) y[i] = expf(x[i]);
}
#else
static void exp_rows(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
}
#endif

// --- bf16 ------------------------------------------------------------------------------------
// bf16 is the upper half of an fp32: 1 sign, 8 exponent, 7 mantissa bits, stored as uint16_t.

// Round to nearest, ties to even (adding 0x7fff plus the kept part's lowest bit carries into the
// kept half exactly when the dropped half is above the midpoint, or at it with an odd kept half);
// finite values too large round to +-inf like any IEEE rounding. NaN: the top half with the quiet
// bit set, so that a NaN whose payload sits only in the dropped bits does not become inf.
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) float dot_bf16(const float *restrict x, const uint16_t *restrict w,
                                                            int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += x[i] * bf16_to_f32(w[i]);
    return s;
}

// --- few rows times a weight matrix (GEMV) ------------------------------------------------------
// C (M,N) = alpha X W^T + beta C with W (N,K) row-major and M small: a decode step's products.
// Such a product reads W once and does 2 flops per weight, so it runs at the speed W streams
// from memory. OpenBLAS 0.3.21's sgemm packs the whole of W for every call and its sgemv takes
// one row of X at a time; these kernels read each W row once for all rows of X. The AVX-512
// variants read W one row after the other (tiles of R = 1 W row), the AVX2 one R rows at a time;
// measured (Zen 4, 2 threads, the matrices of a 100M model out of cache, the pool's two threads
// taking chunks from both ends): reading W row by row streams bf16 at 0.97x and fp32 at 1.03x of
// a plain read of the same bytes, tiles of 8 rows at 0.57-0.63x (8 interleaved streams, which
// the prefetchers follow worse than one); one thread, bf16: 28 -> 40 GB/s.
//
// Every (i, j) has one vector accumulator over K in chunks of the vector width (the last chunk
// masked), reduced once at the end: the same operations whatever M, the tile shape or the thread
// split, so a row's result does not depend on the rows beside it or on the thread count.
// Threads split W's rows when W is large enough to pay for the parallel region
// (GEMV_PAR_MIN_BYTES), and are not used below it; the chunks are guided (gemv_cuts).
//
// GEMV_MAX_M: measured (Xeon, AVX-512, W 896x896 and 4864x896 out of L2) these kernels beat
// OpenBLAS 0.3.21's sgemm at every M tried up to 32 (2.5-3x at M <= 4, 1.3x at M = 32, 1 or 2
// threads); the path stops at 8 rows, the decode batches it is for, so that the products of
// training (packed batches of more rows) stay with sgemm and compute what they computed: the
// recorded trainer fingerprints (tests/unit/test_tjobs.c, test_bench_step.c) hold with 8 and
// change with 16. The same bound as gemm_bf16w's few-rows path (BF16_SMALL_M).
// GEMV_PAR_MIN_BYTES: measured on 2 threads, 128x512 (fp32 256 KiB: 11 -> 7 us; bf16 128 KiB:
// 6.9 -> 4.9 us) gains; a W of one chunk (<= 64 rows) cannot be split and only pays the region.
#define GEMV_MAX_M 8          // fp32 gemm (trans_b) takes this path up to this many rows of X
#define GEMV_TILE_M 4         // rows of X per tile
#define GEMV_CHUNK 64         // W rows per block of a chunk with more than one tile of X rows
#define GEMV_MIN_CHUNK_BYTES 16384   // W bytes of the smallest chunk
#define GEMV_MAX_CUTS 512     // chunks of one loop at most
#define GEMV_PAR_MIN_BYTES (128 * 1024)

// C[i, j] from the dot product s.
static inline void gemv_store(float *C, int ldc, int i, int j, float alpha, float beta, float s) {
    float *c = C + (size_t)i * ldc + j;
    float v = alpha * s;
    *c = beta == 0.0f ? v : v + beta * *c;
}

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
// One W row per zmm register of 16 floats; tiles of m rows of X by R rows of W: m R
// accumulators, m X vectors and a W vector in the 32 registers.
typedef __m512 vf_t;
#define VF_W 16
#define VF_ZERO() _mm512_setzero_ps()
#define VF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VF_SUM(v) _mm512_reduce_add_ps(v)
#define VF_LOAD(p) _mm512_loadu_ps(p)
// the first n < 16 floats of p, zeros after (nothing beyond them is read)
#define VF_LOAD_TAIL(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1), p)
// 16 bf16 widened to fp32 (a bf16 is the upper half of its fp32)
#define VF_LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VF_LOAD_BF16_TAIL(p, n) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)((1u << (n)) - 1), p)), 16))
#define GEMV_R_OF(m) 1   // W row by row (see the top of this section)
#elif KERN_CPU_ISA == KERN_CPU_ISA_AVX2
// 8 floats per ymm register, 16 registers: m R accumulators + m X vectors + a W vector <= 16.
typedef __m256 vf_t;
#define VF_W 8
#define VF_ZERO() _mm256_setzero_ps()
#define VF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VF_LOAD(p) _mm256_loadu_ps(p)
static inline float vf_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define VF_SUM(v) vf_sum(v)
static inline __m256 vf_load_tail(const float *p, int n) {
    static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i *)(ones + 8 - n)));
}
#define VF_LOAD_TAIL(p, n) vf_load_tail(p, n)
#define VF_LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
// AVX2 has no masked 16-bit load: the n < 8 values through a zero-padded copy
static inline __m256 vf_load_bf16_tail(const uint16_t *p, int n) {
    uint16_t t[8] = {0};
    memcpy(t, p, sizeof(uint16_t) * (size_t)n);
    return VF_LOAD_BF16(t);
}
#define VF_LOAD_BF16_TAIL(p, n) vf_load_bf16_tail(p, n)
#define GEMV_R_OF(m) ((m) == 1 ? 8 : (m) == 2 ? 4 : 2)
#endif

#ifdef VF_W
#define GEMV_MAX_R 8

// Software prefetch of W rows after the tile's (pf bytes further, the same column): the
// hardware prefetchers follow the tile's R streams but start a new row late; measured, 1 thread,
// 512x512 and 1536x512 out of cache: fp32 11 -> 13 GB/s, bf16 (vdpbf16ps) 7-8 -> 12 GB/s. The
// distance is whole tiles of rows, at least GEMV_PREFETCH_BYTES: one tile (a row of 1-2 KiB on
// the small shapes) is read in about the memory's latency, too late; measured on Zen 4, 2
// threads, decode batch 1, one tile -> 8 KiB, interleaved in one process: 25M fp32 +10 %, bf16
// +3-7 %, 100M bf16 +2-5 %, 100M fp32 (rows of 3 KiB) -1 / +2 %; 12-16 KiB no better. The address
// is computed as an integer (it may lie past W: a prefetch never faults).
#define GEMV_PREFETCH(p, pf) _mm_prefetch((const char *)((uintptr_t)(p) + (uintptr_t)(pf)), _MM_HINT_T0)
#define GEMV_PREFETCH_BYTES 8192
static inline size_t gemv_pf(size_t tile) { return (GEMV_PREFETCH_BYTES + tile - 1) / tile * tile; }

// s[i R + r] = x[i] . w[r] over K (x fp32, w fp32 or bf16), for m rows of X and R of W (both
// compile-time constants after inlining: the accumulators stay in registers); pf: see above.
#define GEMV_TILE_BODY(WLOAD, WLOAD_TAIL)                                                                 \
    vf_t acc[GEMV_TILE_M * GEMV_MAX_R];                                                                   \
    _Pragma("GCC unroll 32") for (int t = 0; t < m * R; t++) acc[t] = VF_ZERO();                          \
    int k = 0;                                                                                            \
    for (; k + VF_W <= K; k += VF_W) {                                                                    \
        vf_t xv[GEMV_TILE_M];                                                                             \
        _Pragma("GCC unroll 4") for (int i = 0; i < m; i++) xv[i] = VF_LOAD(x[i] + k);                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                             \
            GEMV_PREFETCH(w[r] + k, pf);                                                                  \
            vf_t wv = WLOAD(w[r] + k);                                                                    \
            _Pragma("GCC unroll 4") for (int i = 0; i < m; i++) acc[i * R + r] = VF_FMA(xv[i], wv, acc[i * R + r]); \
        }                                                                                                 \
    }                                                                                                     \
    if (k < K) {                                                                                          \
        vf_t xv[GEMV_TILE_M];                                                                             \
        _Pragma("GCC unroll 4") for (int i = 0; i < m; i++) xv[i] = VF_LOAD_TAIL(x[i] + k, K - k);        \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                             \
            vf_t wv = WLOAD_TAIL(w[r] + k, K - k);                                                        \
            _Pragma("GCC unroll 4") for (int i = 0; i < m; i++) acc[i * R + r] = VF_FMA(xv[i], wv, acc[i * R + r]); \
        }                                                                                                 \
    }                                                                                                     \
    _Pragma("GCC unroll 32") for (int t = 0; t < m * R; t++) s[t] = VF_SUM(acc[t]);

static inline __attribute__((always_inline)) void gemv_tile_f32(const int m, const int R, int K,
                                                                const float *const *x, const float *const *w,
                                                                size_t pf, float *s) {
    GEMV_TILE_BODY(VF_LOAD, VF_LOAD_TAIL)
}

static inline __attribute__((always_inline)) void gemv_tile_bf16(const int m, const int R, int K,
                                                                 const float *const *x, const uint16_t *const *w,
                                                                 size_t pf, float *s) {
    GEMV_TILE_BODY(VF_LOAD_BF16, VF_LOAD_BF16_TAIL)
}
#endif

// W rows [j0, j1) against rows i0 .. i0+m-1 of X: tiles of R W rows, then the W rows left one by
// one; TILE(m, R, K, x, w, pf, s) is a tile function for X's element type XT and W's WT, pf the
// distance to the rows it prefetches (the next tile's). Instantiated per m (and so R) by the
// switches below, so that each tile is compiled with its sizes known.
#define GEMV_ROWS_BODY(TILE, XT, WT)                                                                      \
    const XT *x[GEMV_TILE_M];                                                                             \
    for (int i = 0; i < m; i++) x[i] = X + (size_t)(i0 + i) * ldx;                                        \
    float s[GEMV_TILE_M * GEMV_MAX_R];                                                                    \
    const WT *w[GEMV_MAX_R];                                                                              \
    int j = j0;                                                                                           \
    for (; j + R <= j1; j += R) {                                                                         \
        for (int r = 0; r < R; r++) w[r] = W + (size_t)(j + r) * ldw;                                     \
        TILE(m, R, K, x, w, gemv_pf(R * ldw * sizeof(WT)), s);                                            \
        for (int i = 0; i < m; i++)                                                                       \
            for (int r = 0; r < R; r++) gemv_store(C, ldc, i0 + i, j + r, alpha, beta, s[i * R + r]);     \
    }                                                                                                     \
    for (; j < j1; j++) {                                                                                 \
        w[0] = W + (size_t)j * ldw;                                                                       \
        TILE(m, 1, K, x, w, (size_t)ldw * sizeof(WT), s);                                                 \
        for (int i = 0; i < m; i++) gemv_store(C, ldc, i0 + i, j, alpha, beta, s[i]);                     \
    }

// The tile height m (1..4) as a constant, so each case compiles its own unrolled tile.
#define GEMV_ROWS_SWITCH(rows_m)                                                                          \
    switch (m) {                                                                                          \
    case 1: rows_m(GEMV_R_OF(1), i0, 1, j0, j1, K, alpha, X, ldx, W, ldw, beta, C, ldc); break;            \
    case 2: rows_m(GEMV_R_OF(2), i0, 2, j0, j1, K, alpha, X, ldx, W, ldw, beta, C, ldc); break;            \
    case 3: rows_m(GEMV_R_OF(3), i0, 3, j0, j1, K, alpha, X, ldx, W, ldw, beta, C, ldc); break;            \
    default: rows_m(GEMV_R_OF(4), i0, 4, j0, j1, K, alpha, X, ldx, W, ldw, beta, C, ldc); break;           \
    }

#define GEMV_ARGS int i0, int m, int j0, int j1, int K, float alpha, const XT_ *X, int ldx, const WT_ *W, int ldw, \
                  float beta, float *C, int ldc

#define XT_ float
#ifdef VF_W
#define WT_ float
static inline __attribute__((always_inline)) void gemv_rows_f32_m(const int R, GEMV_ARGS) {
    GEMV_ROWS_BODY(gemv_tile_f32, float, float)
}
static void gemv_rows_f32(GEMV_ARGS) {
    GEMV_ROWS_SWITCH(gemv_rows_f32_m)
}
#undef WT_
#define WT_ uint16_t
static inline __attribute__((always_inline)) void gemv_rows_bf16_m(const int R, GEMV_ARGS) {
    GEMV_ROWS_BODY(gemv_tile_bf16, float, uint16_t)
}
static void gemv_rows_bf16(GEMV_ARGS) {
    GEMV_ROWS_SWITCH(gemv_rows_bf16_m)
}
#undef WT_
#else
// scalar: the compiler's vectorisation of the plain dot products (SSE2), the reference.
#define WT_ float
static void gemv_rows_f32(GEMV_ARGS) {
    for (int j = j0; j < j1; j++)
        for (int i = i0; i < i0 + m; i++)
            gemv_store(C, ldc, i, j, alpha, beta, dot(X + (size_t)i * ldx, W + (size_t)j * ldw, K));
}
#undef WT_
#define WT_ uint16_t
static void gemv_rows_bf16(GEMV_ARGS) {
    for (int j = j0; j < j1; j++)
        for (int i = i0; i < i0 + m; i++)
            gemv_store(C, ldc, i, j, alpha, beta, dot_bf16(X + (size_t)i * ldx, W + (size_t)j * ldw, K));
}
#undef WT_
#endif
#undef XT_

// All M rows against all N rows of W: guided chunks of W rows on the pool (gemv_cuts; kpool_for;
// the caller alone when W is under GEMV_PAR_MIN_BYTES), each chunk taking the rows of X
// GEMV_TILE_M at a time, in blocks of GEMV_CHUNK W rows when X has more than one tile (the
// block's W rows stay in cache for the next tile). GEMV_DRIVER_FN(name, ROWS, ATTR) defines the
// chunk function name_chunk for a ROWS kernel; GEMV_DRIVER runs it.
typedef struct {
    int M, N, K, ldx, ldw, ldc;
    float alpha, beta;
    const void *X, *W;
    float *C;
    const int *cut;   // chunk c is W rows [cut[c], cut[c + 1])
} gemv_job_t;

// Guided chunks of W's rows [0, total) (total >= 1) into cut[0..n], n returned (<= GEMV_MAX_CUTS).
// The pool gives each pair of threads one contiguous range of chunks, one thread walking it from
// the front and the other from the back (kernels/cpu/pool.c); here each such range of rows is cut
// into chunks of a quarter of what is left of it, from both ends in turn, down to min_rows, and
// chunks of min_rows where the two threads meet. So each thread streams W in long runs (measured
// on Zen 4, 2 threads, decode batch 1: uniform chunks of 64 rows reached 5-9 % less tok/s on the
// 25M and 100M shapes, as short runs restart the prefetchers and every claim moves a shared
// cache line), while the threads still end within a small chunk of each other (one range cut
// in halves would leave a slower thread's share to wait for). Cuts are multiples of 8 rows (the
// widest tile) but at the end.
static int gemv_cuts(int total, int min_rows, int *cut) {
    int nr = (kpool_threads() + 1) / 2;
    if (nr > total / min_rows) nr = total / min_rows > 0 ? total / min_rows : 1;
    int budget = GEMV_MAX_CUTS / nr, n = 0;   // chunks per range at most (>= 2 with nr <= 256)
    cut[0] = 0;
    for (int r = 0; r < nr; r++) {
        int a = cut[n], end = r == nr - 1 ? total : (int)((long)total * (r + 1) / nr) / 8 * 8, b = end;
        int back[GEMV_MAX_CUTS / 2], nb = 0, used = 0;
        for (int sz; (sz = (b - a) / 4 / 8 * 8) >= min_rows && used + 2 + 5 <= budget; used += 2) {
            cut[++n] = a += sz;
            back[nb++] = b -= sz;
        }
        // [a, b) is left: chunks of min_rows (under five: a quarter of it is under min_rows), the
        // last one taking the rest
        for (int x = a + min_rows; x + min_rows <= b && used + 2 < budget; x += min_rows, used++) cut[++n] = x;
        for (int i = nb - 1; i >= 0; i--) cut[++n] = back[i];
        cut[++n] = end;
    }
    return n;
}

// cut[0..n] for W of `total` rows of K elements of wsize bytes, n returned: guided chunks of at
// least GEMV_MIN_CHUNK_BYTES (8 rows, a multiple of 8) when W pays for the pool
// (GEMV_PAR_MIN_BYTES), else one chunk.
static int gemv_plan(int total, int K, size_t wsize, int *cut) {
    cut[0] = 0, cut[1] = total;
    if ((size_t)total * K * wsize < GEMV_PAR_MIN_BYTES) return 1;
    size_t r = GEMV_MIN_CHUNK_BYTES / ((size_t)K * wsize);
    return gemv_cuts(total, r <= 8 ? 8 : (int)((r + 7) / 8 * 8), cut);
}

#define GEMV_DRIVER_FN(name, ROWS, ATTR)                                                                   \
    static ATTR void name##_chunk(void *c_, size_t lo, size_t hi) {                                        \
        const gemv_job_t *g = c_;                                                                          \
        for (size_t c = lo; c < hi; c++) {                                                                 \
            /* more than one tile of X: blocks of GEMV_CHUNK W rows, in cache for the next tile */        \
            int end = g->cut[c + 1], step = g->M <= GEMV_TILE_M ? end : GEMV_CHUNK;                        \
            for (int j0 = g->cut[c]; j0 < end; j0 += step) {                                               \
                int j1 = end - j0 > step ? j0 + step : end;                                                \
                for (int i0 = 0; i0 < g->M; i0 += GEMV_TILE_M)                                             \
                    ROWS(i0, g->M - i0 < GEMV_TILE_M ? g->M - i0 : GEMV_TILE_M, j0, j1, g->K, g->alpha, g->X,  \
                         g->ldx, g->W, g->ldw, g->beta, g->C, g->ldc);                                     \
            }                                                                                              \
        }                                                                                                  \
    }

#define GEMV_DRIVER(name, wsize)                                                                          \
    int cut_[GEMV_MAX_CUTS + 1];                                                                           \
    gemv_job_t job = {M, N, K, ldx, ldw, ldc, alpha, beta, X, W, C, cut_};                                 \
    int n_ = gemv_plan(N, K, wsize, cut_);                                                                 \
    if (n_ > 1) kpool_for((size_t)n_, 1, name##_chunk, &job);                                              \
    else name##_chunk(&job, 0, 1);

GEMV_DRIVER_FN(gemv_f32, gemv_rows_f32, )
GEMV_DRIVER_FN(gemv_bf16, gemv_rows_bf16, )

static void gemv_f32(int M, int N, int K, float alpha, const float *X, int ldx, const float *W, int ldw, float beta,
                     float *C, int ldc) {
    GEMV_DRIVER(gemv_f32, sizeof(float))
}

static void gemv_bf16(int M, int N, int K, float alpha, const float *X, int ldx, const uint16_t *W, int ldw,
                      float beta, float *C, int ldc) {
    GEMV_DRIVER(gemv_bf16, sizeof(uint16_t))
}

// --- dense ---------------------------------------------------------------------------------

static void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        // BLAS leaves C untouched for K = 0 only when beta = 1; make the semantics explicit.
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    // A few rows against a weight matrix (decode at small batch), the forward's shape: the GEMV
    // kernels above.
    if (M <= GEMV_MAX_M && !ta && tb) {
        gemv_f32(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    // The other orientation (X W, a backward's shape) at one or two rows: matrix-vector
    // products, which read W once per row, where sgemm would pack all of W for every call.
    if (M <= 2 && !ta) {
        blas_single();
        for (int i = 0; i < M; i++)
            cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, tb ? N : K, tb ? K : N, alpha, B, ldb,
                        A + (size_t)i * lda, 1, beta, C + (size_t)i * ldc, 1);
        return;
    }
    sgemm_pool(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// --- bf16 ops ----------------------------------------------------------------------------------

typedef struct {
    uint16_t *h;
    float *f;
    const uint16_t *hc;
    const float *fc;
} conv_t;

static void to_bf16_chunk(void *c_, size_t lo, size_t hi) {
    const conv_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->h[i] = f32_to_bf16(c->fc[i]);
}

static void from_bf16_chunk(void *c_, size_t lo, size_t hi) {
    const conv_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->f[i] = bf16_to_f32(c->hc[i]);
}

static void cpu_to_bf16(uint16_t *dst, const float *src, size_t n) {
    conv_t c = {.h = dst, .fc = src};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4, to_bf16_chunk, &c);
}

static void cpu_from_bf16(float *dst, const uint16_t *src, size_t n) {
    conv_t c = {.f = dst, .hc = src};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4, from_bf16_chunk, &c);
}

// The fp32 copy of a block of W rows (gemm_bf16w), or X rounded to bf16: one grow-only buffer
// per calling thread, freed when the thread exits (a pthread key's destructor; the main thread's
// stays reachable).
static pthread_key_t bf16_buf_key, pack_buf_key;
static pthread_once_t bf16_buf_once = PTHREAD_ONCE_INIT;
static _Thread_local float *bf16_buf;
static _Thread_local size_t bf16_buf_cap;

static void bf16_buf_key_init(void) {
    if (pthread_key_create(&bf16_buf_key, free) != 0 || pthread_key_create(&pack_buf_key, free) != 0) {
        fprintf(stderr, "FATAL pthread_key_create failed at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
}

// *buf grown to n floats (64-byte aligned, contents not kept), registered under *key (read after
// the keys are created: they exist only once pthread_once has run).
static float *scratch_grow(float **buf, size_t *cap, const pthread_key_t *key, size_t n) {
    if (n > *cap) {
        pthread_once(&bf16_buf_once, bf16_buf_key_init);
        free(*buf);
        *buf = NULL;
        *cap = 0;
        size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
        *buf = aligned_alloc(64, bytes);
        if (!*buf) {
            fprintf(stderr, "FATAL out of memory allocating %zu bytes at %s:%d\n", bytes, __FILE__, __LINE__);
            abort();
        }
        *cap = n;
        pthread_setspecific(*key, *buf);
    }
    return *buf;
}

static float *bf16_scratch(size_t n) { return scratch_grow(&bf16_buf, &bf16_buf_cap, &bf16_buf_key, n); }

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
// A second buffer of the calling thread: the AMX path's packed W (beside X in bf16_scratch).
static _Thread_local float *pack_buf;
static _Thread_local size_t pack_buf_cap;
static float *pack_scratch(size_t n) { return scratch_grow(&pack_buf, &pack_buf_cap, &pack_buf_key, n); }
#endif

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
// The avx512-bf16 variant's few-rows path: X rounded to bf16 once per call, then vdpbf16ps, which
// multiplies 32 bf16 pairs and adds them into 16 fp32 lanes per instruction (2 products per lane,
// each added with one rounding; bf16 subnormals count as zero, results below 2^-126 become zero),
// where widening W takes a conversion, a shift and two FMAs per 32 weights. vdpbf16ps issues at
// half the FMA rate on the Xeon measured, yet the path takes 0.8x the time of widening with W in
// L2, and out of cache both stream W. These functions are compiled for AVX512_BF16 and called
// only where the CPU has it (cpu_host.c picks the avx512-bf16 table only then).
#define BF16DP_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
#define DP_W 32   // bf16 values per 512-bit register

// s[i R + r] = xb[i] . w[r] over K; the rows of xb are padded with zeros to a multiple of DP_W.
static inline __attribute__((always_inline)) BF16DP_TARGET void gemv_tile_dp(const int m, const int R, int K,
                                                                           const uint16_t *const *x,
                                                                           const uint16_t *const *w, size_t pf,
                                                                           float *s) {
    __m512 acc[GEMV_TILE_M * GEMV_MAX_R];
#pragma GCC unroll 32
    for (int t = 0; t < m * R; t++) acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += DP_W) {
        __mmask32 mk = K - k >= DP_W ? ~(__mmask32)0 : (__mmask32)((1u << (K - k)) - 1);
        __m512bh xv[GEMV_TILE_M];
#pragma GCC unroll 4
        for (int i = 0; i < m; i++) xv[i] = (__m512bh)_mm512_loadu_si512(x[i] + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            GEMV_PREFETCH(w[r] + k, pf);
            __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, w[r] + k);
#pragma GCC unroll 4
            for (int i = 0; i < m; i++) acc[i * R + r] = _mm512_dpbf16_ps(acc[i * R + r], xv[i], wv);
        }
    }
#pragma GCC unroll 32
    for (int t = 0; t < m * R; t++) s[t] = _mm512_reduce_add_ps(acc[t]);
}

#define XT_ uint16_t
#define WT_ uint16_t
static inline __attribute__((always_inline)) BF16DP_TARGET void gemv_rows_dp_m(const int R, GEMV_ARGS) {
    GEMV_ROWS_BODY(gemv_tile_dp, uint16_t, uint16_t)
}
static BF16DP_TARGET void gemv_rows_dp(GEMV_ARGS) {
    GEMV_ROWS_SWITCH(gemv_rows_dp_m)
}
#undef XT_
#undef WT_

GEMV_DRIVER_FN(gemv_dp, gemv_rows_dp, BF16DP_TARGET)

static BF16DP_TARGET void gemv_dp_run(int M, int N, int K, float alpha, const uint16_t *X, int ldx, const uint16_t *W,
                                      int ldw, float beta, float *C, int ldc) {
    GEMV_DRIVER(gemv_dp, sizeof(uint16_t))
}

// dst (n) = bf16(src): f32_to_bf16, 16 at a time.
static void round_row_bf16(uint16_t *dst, const float *src, int n) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + k));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(hi, one))), 16);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
        _mm256_storeu_si256((__m256i *)(dst + k), _mm512_cvtepi32_epi16(r));
    }
    for (; k < n; k++) dst[k] = f32_to_bf16(src[k]);
}

// X (M, K) rounded to bf16 into the calling thread's buffer, rows of *kp (K padded with zeros to
// a multiple of DP_W).
static uint16_t *gemv_dp_round_x(int M, int K, const float *X, int ldx, int *kp) {
    *kp = (K + DP_W - 1) / DP_W * DP_W;
    uint16_t *xb = (uint16_t *)bf16_scratch(((size_t)M * *kp + 1) / 2);
    for (int i = 0; i < M; i++) {
        uint16_t *bi = xb + (size_t)i * *kp;
        round_row_bf16(bi, X + (size_t)i * ldx, K);
        for (int k = K; k < *kp; k++) bi[k] = 0;
    }
    return xb;
}

static void gemv_bf16_dp(int M, int N, int K, float alpha, const float *X, int ldx, const uint16_t *W, int ldw,
                         float beta, float *C, int ldc) {
    int kp;
    uint16_t *xb = gemv_dp_round_x(M, K, X, ldx, &kp);
    gemv_dp_run(M, N, K, alpha, xb, kp, W, ldw, beta, C, ldc);
}

// --- AMX (the amx table): gemm_bf16w beyond the few-rows path --------------------------------------
// Intel AMX multiplies bf16 tiles into fp32 tiles: tdpbf16ps adds A (16 rows x 32 bf16) times B
// (16 rows of 16 column pairs: 32 K values x 16 columns, "VNNI" layout) into C (16 x 16 fp32),
// 16 x 16 x 32 products per instruction, each pair of products added with one rounding (bf16
// subnormals count as zero, as in vdpbf16ps). A call rounds X to bf16 (nearest even, as the
// few-rows path and the cuda backend do) into rows padded with zeros to a multiple of 32 values,
// and packs W into B tiles (zeros past N and K); then every block of 32 x 32 outputs (2 x 2 C
// tiles, the 8 tile registers: 4 for C, 2 for A, 2 for B) runs over K on the pool, blocks of one
// column block one after another (its B tiles stay in cache while X's rows pass). Packing reads
// X and W once (O(M K + N K)) against the product's O(M N K). The CPU must have AMX-TILE and
// AMX-BF16 and the kernel must have granted the process the tile state (cpu_host.c asks,
// arch_prctl ARCH_REQ_XCOMP_PERM); the table is chosen only then.
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))
#define AMX_K 32                     // bf16 values of K per tile row (64 bytes)
#define AMX_TILE_U16 (16 * AMX_K)    // uint16 per packed B tile (1 KiB)

typedef struct __attribute__((aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg_t;

// A weight matrix packed in pairs of K for tdpbf16ps / vdpbf16ps (vnni_pack).
typedef struct {
    bool trans;
    const uint16_t *W;
    int ldw, N, K, kbn;
    uint16_t *dst;
} vnni_pack_t;

// An AMX product (gemm_bf16w_amx); the vdpbf16ps path (gemm_bf16w_dpg) fills its X fields to
// round X with amx_pack_x_chunk.
typedef struct {
    const float *X;
    int ldx, M, N, K, kp, kbn;   // kp: K padded to AMX_K, kbn = kp / AMX_K
    uint16_t *xb, *wp;           // X rounded, rows of kp; W's tiles, [N/16 groups][kbn][16][32]
    float alpha, beta;
    float *C;
    int ldc, mb;                 // mb: 32-row blocks
} amx_job_t;

// Rows [lo, hi) of xb: X rounded to bf16, zeros past K (and whole rows past M).
static void amx_pack_x_chunk(void *c_, size_t lo, size_t hi) {
    const amx_job_t *j = c_;
    for (size_t i = lo; i < hi; i++) {
        uint16_t *bi = j->xb + i * (size_t)j->kp;
        int k0 = 0;
        if ((int)i < j->M) {
            round_row_bf16(bi, j->X + i * (size_t)j->ldx, j->K);
            k0 = j->K;
        }
        memset(bi + k0, 0, sizeof(uint16_t) * (size_t)(j->kp - k0));
    }
}

// Column groups [lo, hi) of 16 (output columns n) into B tiles: tile (g, kb) row r holds, for
// n = 0..15, the pair (w(k, n), w(k + 1, n)) at k = kb * 32 + 2 r, where w(k, n) = W[n][k] with
// trans_w (W (N, K)) and W[k][n] without (W (K, N)); zero past N or K. Group g is kbn tiles in a
// row: kp / 2 pairs of 16 columns, 64 bytes each (the layout vdpbf16ps multiplies as well).
static void vnni_pack_chunk(const vnni_pack_t *j, size_t lo, size_t hi) {
    for (size_t g = lo; g < hi; g++) {
        int n0 = (int)g * 16, cols = j->N - n0 < 16 ? j->N - n0 : 16;
        for (int kb = 0; kb < j->kbn; kb++) {
            uint16_t *t = j->dst + (g * (size_t)j->kbn + (size_t)kb) * AMX_TILE_U16;
            int k0 = kb * AMX_K, rem = j->K - k0 < AMX_K ? j->K - k0 : AMX_K;
            if (j->trans) {
                // row n of W holds the 16 pairs of column n: a 16 x 16 transpose of 32-bit pairs
                uint32_t tmp[16][16] __attribute__((aligned(64)));
                __mmask32 km = rem >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << rem) - 1);
                for (int n = 0; n < 16; n++) {
                    __m512i v = n < cols ? _mm512_maskz_loadu_epi16(km, j->W + (size_t)(n0 + n) * j->ldw + k0)
                                         : _mm512_setzero_si512();
                    _mm512_store_si512(tmp[n], v);
                }
                uint32_t *t32 = (uint32_t *)t;
                for (int r = 0; r < 16; r++)
                    for (int n = 0; n < 16; n++) t32[r * 16 + n] = tmp[n][r];
            } else {
                // rows k and k + 1 of W, interleaved
                __mmask16 cm = (__mmask16)((1u << cols) - 1);
                for (int r = 0; r < 16; r++) {
                    int k = k0 + 2 * r;
                    __m256i a = k < j->K ? _mm256_maskz_loadu_epi16(cm, j->W + (size_t)k * j->ldw + n0)
                                         : _mm256_setzero_si256();
                    __m256i b = k + 1 < j->K ? _mm256_maskz_loadu_epi16(cm, j->W + (size_t)(k + 1) * j->ldw + n0)
                                             : _mm256_setzero_si256();
                    __m512i v = _mm512_or_si512(_mm512_cvtepu16_epi32(a),
                                                _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
                    _mm512_storeu_si512(t + r * AMX_K, v);
                }
            }
        }
    }
}

static void vnni_pack_fn(void *c_, size_t lo, size_t hi) { vnni_pack_chunk(c_, lo, hi); }

// dst = the (N / 16 rounded up) groups of W's columns as above, on the pool.
static void vnni_pack(uint16_t *dst, bool trans, const uint16_t *W, int ldw, int N, int K, int kbn) {
    vnni_pack_t j = {.trans = trans, .W = W, .ldw = ldw, .N = N, .K = K, .kbn = kbn, .dst = dst};
    par_for((size_t)(N + 15) / 16, (size_t)(PAR_ELEMS / (kbn * AMX_K) / 16), 1, vnni_pack_fn, &j);
}

// Blocks [lo, hi) of 32 x 32 outputs, block b = column block (b / mb), row block (b % mb).
static AMX_TARGET void amx_mul_chunk(void *c_, size_t lo, size_t hi) {
    const amx_job_t *j = c_;
    amx_cfg_t cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    float out[32 * 32] __attribute__((aligned(64)));
    const size_t tile_col = (size_t)j->kbn * AMX_TILE_U16;   // uint16 per column group of tiles
    const int xs = j->kp * (int)sizeof(uint16_t);
    for (size_t b = lo; b < hi; b++) {
        int jb = (int)(b / (size_t)j->mb), ib = (int)(b % (size_t)j->mb);
        const uint16_t *a0 = j->xb + (size_t)ib * 32 * j->kp, *a1 = a0 + (size_t)16 * j->kp;
        const uint16_t *b0 = j->wp + (size_t)(2 * jb) * tile_col, *b1 = b0 + tile_col;
        bool two = 2 * jb + 1 < (j->N + 15) / 16;   // the second column group exists
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kb = 0; kb < j->kbn; kb++) {
            _tile_loadd(4, a0 + kb * AMX_K, xs);
            _tile_loadd(5, a1 + kb * AMX_K, xs);
            _tile_loadd(6, b0 + (size_t)kb * AMX_TILE_U16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            if (two) {
                _tile_loadd(7, b1 + (size_t)kb * AMX_TILE_U16, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, out, 128);
        _tile_stored(1, out + 16, 128);
        _tile_stored(2, out + 16 * 32, 128);
        _tile_stored(3, out + 16 * 32 + 16, 128);
        int i0 = ib * 32, j0 = jb * 32;
        int rows = j->M - i0 < 32 ? j->M - i0 : 32, cols = j->N - j0 < 32 ? j->N - j0 : 32;
        for (int i = 0; i < rows; i++) {
            float *ci = j->C + (size_t)(i0 + i) * j->ldc + j0;
            const float *oi = out + i * 32;
            if (j->beta == 0.0f)
                for (int c = 0; c < cols; c++) ci[c] = j->alpha * oi[c];
            else
                for (int c = 0; c < cols; c++) ci[c] = j->alpha * oi[c] + j->beta * ci[c];
        }
    }
    _tile_release();
}

// gemm_bf16w on AMX (M, N, K >= 1).
static void gemm_bf16w_amx(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                           const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    amx_job_t j = {.X = X, .ldx = ldx, .M = M, .N = N, .K = K,
                   .alpha = alpha, .beta = beta, .C = C, .ldc = ldc};
    j.kp = (K + AMX_K - 1) / AMX_K * AMX_K;
    j.kbn = j.kp / AMX_K;
    j.mb = (M + 31) / 32;
    int groups = (N + 15) / 16, nb = (N + 31) / 32;
    size_t xn = (size_t)j.mb * 32 * j.kp, wn = (size_t)groups * j.kbn * AMX_TILE_U16;
    j.xb = (uint16_t *)bf16_scratch((xn + 1) / 2);
    j.wp = (uint16_t *)pack_scratch((wn + 1) / 2);
    par_for((size_t)j.mb * 32, (size_t)(PAR_ELEMS / j.kp), 16, amx_pack_x_chunk, &j);
    vnni_pack(j.wp, trans_w, W, ldw, N, K, j.kbn);
    par_for((size_t)j.mb * nb, 1, 1, amx_mul_chunk, &j);
}

// --- vdpbf16ps, many rows (the avx512-bf16 table): gemm_bf16w beyond the few-rows path ---------
// The AVX-512 BF16 form of the AMX path above, for CPUs with vdpbf16ps but no AMX (Zen 4, Cooper
// Lake): X rounded to bf16 (nearest even) and the same pair arithmetic, register tiles of
// MR rows x NG groups of 16 columns, acc += broadcast(a pair) . (16 b pairs), over all of K.
// A is a row-major bf16 matrix read in pairs along K, B pair-packed groups of 16 columns
// (vnni_pack). With trans_w, A is W itself (N rows, read straight from the weights, no copy) and
// B is X rounded and packed (M / 16 groups, O(M K)): the tiles hold C transposed. Without
// trans_w (the backward dX = dY W), A is X rounded and B is W packed (O(N K)). Tiles are items
// on the pool, ordered so that consecutive tiles share A's rows (with trans_w: W's rows stay in
// L1 while X's groups pass) or B's group (without: W's packed columns stay in L2). Each output
// is one lane's sum over K in order: the bits do not depend on the thread count or the tiling.

typedef struct {
    const uint16_t *a;      // A: na rows, row r at a + r lda
    size_t lda;
    int na, nb;             // B: nb columns in groups of 16 at b + g ldb
    const uint16_t *b;
    size_t ldb;
    int kpairs;             // pairs of K read from A and B
    bool tail;              // then element 2 kpairs of A's rows (K odd, A = W)
    bool trans_out;         // C[j][i] (i: A's row, j: B's column) instead of C[i][j]
    bool a_major;           // consecutive tiles share A's rows (else B's group)
    int mr, ng, at, bt;     // tile: mr rows of A x ng groups of B; at x bt tiles
    float alpha, beta;
    float *C;
    int ldc;
} dpg_job_t;

static inline __attribute__((always_inline)) uint32_t dpg_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

// One tile of mr (<= MR) rows: acc[r NG + g] = A row r . B group g.
static inline __attribute__((always_inline)) BF16DP_TARGET void dpg_tile(const int mr, const int NG,
                                                                        const dpg_job_t *j, const uint16_t *a,
                                                                        const uint16_t *b, __m512 *acc) {
#pragma GCC unroll 24
    for (int t = 0; t < mr * NG; t++) acc[t] = _mm512_setzero_ps();
    const size_t lda = j->lda, ldb = j->ldb;
    for (int p = 0; p < j->kpairs; p++) {
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) bv[g] = (__m512bh)_mm512_load_si512(b + g * ldb + (size_t)p * 32);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)dpg_pair(a + r * lda + 2 * (size_t)p));
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) acc[r * NG + g] = _mm512_dpbf16_ps(acc[r * NG + g], av, bv[g]);
        }
    }
    if (j->tail) {
        size_t p = (size_t)j->kpairs;
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) bv[g] = (__m512bh)_mm512_load_si512(b + g * ldb + p * 32);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * lda + 2 * p]);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) acc[r * NG + g] = _mm512_dpbf16_ps(acc[r * NG + g], av, bv[g]);
        }
    }
}

// v[0..7] (16 floats each) transposed: column l (l < rows) of the 8 x 16 block, its first cnt
// values, to c + l ldc (+ beta times what is there). Unpacks and shuffles in three rounds; column
// l ends in one half of a register (for s = l % 4: columns s and 4 + s in x, 8 + s and 12 + s in y).
static inline __attribute__((always_inline)) void dpg_store_t8(const __m512 v[8], int cnt, int rows, float beta,
                                                              float *c, int ldc) {
    __m512 t[8], u[8];
    for (int q = 0; q < 4; q++) {
        t[2 * q] = _mm512_unpacklo_ps(v[2 * q], v[2 * q + 1]);
        t[2 * q + 1] = _mm512_unpackhi_ps(v[2 * q], v[2 * q + 1]);
    }
    for (int q = 0; q < 2; q++) {   // u[4 q + s]: rows 4 q .. 4 q + 3 of columns s, 4 + s, 8 + s, 12 + s
        u[4 * q + 0] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
        u[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
        u[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
        u[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
    }
    const __mmask8 m = (__mmask8)((1u << cnt) - 1);
    for (int s = 0; s < 4; s++) {
        __m512 x = _mm512_shuffle_f32x4(u[s], u[4 + s], _MM_SHUFFLE(1, 0, 1, 0));
        __m512 y = _mm512_shuffle_f32x4(u[s], u[4 + s], _MM_SHUFFLE(3, 2, 3, 2));
        x = _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(3, 1, 2, 0));
        y = _mm512_shuffle_f32x4(y, y, _MM_SHUFFLE(3, 1, 2, 0));
        __m256 col[4] = {_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1), _mm512_castps512_ps256(y),
                         _mm512_extractf32x8_ps(y, 1)};
        for (int b = 0; b < 4; b++) {
            int l = 4 * b + s;
            if (l >= rows) continue;
            float *cl = c + (size_t)l * ldc;
            __m256 o = col[b];
            if (beta != 0.0f) o = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskz_loadu_ps(m, cl), o);
            _mm256_mask_storeu_ps(cl, m, o);
        }
    }
}

// C from a tile's sums: rows i0 .. i0 + mr - 1 of A, columns j0 .. of B (ng groups, those < nb).
static BF16DP_TARGET void dpg_store(const dpg_job_t *j, int mr, int ng, int i0, int j0, const __m512 *acc) {
    const __m512 va = _mm512_set1_ps(j->alpha), vb = _mm512_set1_ps(j->beta);
    if (!j->trans_out) {
        for (int r = 0; r < mr; r++)
            for (int g = 0; g < ng; g++) {
                int c0 = j0 + 16 * g, cols = j->nb - c0 < 16 ? j->nb - c0 : 16;
                if (cols <= 0) break;
                __mmask16 m = (__mmask16)((1u << cols) - 1);
                float *cp = j->C + (size_t)(i0 + r) * j->ldc + c0;
                __m512 v = _mm512_mul_ps(va, acc[r * ng + g]);
                if (j->beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cp), v);
                _mm512_mask_storeu_ps(cp, m, v);
            }
        return;
    }
    // C[j0 + c][i0 + r]: per group of 16 columns, blocks of up to 8 rows transposed in registers
    for (int g = 0; g < ng; g++) {
        int rows = j->nb - j0 - 16 * g;
        if (rows <= 0) break;
        if (rows > 16) rows = 16;
        for (int h = 0; h < mr; h += 8) {
            int cnt = mr - h < 8 ? mr - h : 8;
            __m512 v[8];
            for (int r = 0; r < 8; r++) v[r] = r < cnt ? _mm512_mul_ps(va, acc[(h + r) * ng + g]) : _mm512_setzero_ps();
            dpg_store_t8(v, cnt, rows, j->beta, j->C + (size_t)(j0 + 16 * g) * j->ldc + i0 + h, j->ldc);
        }
    }
}

#define DPG_RUN(MR_, NG_)                   \
    case MR_: {                             \
        __m512 acc[MR_ * NG_];              \
        dpg_tile(MR_, NG_, j, a, b, acc);   \
        dpg_store(j, MR_, NG_, i0, j0, acc); \
        return;                             \
    }

// Tile (ti, tj): A rows from ti mr, B groups from tj ng.
static BF16DP_TARGET void dpg_one(const dpg_job_t *j, int ti, int tj) {
    int i0 = ti * j->mr, j0 = tj * j->ng * 16, mr = j->na - i0 < j->mr ? j->na - i0 : j->mr;
    int ng = (j->nb - j0 + 15) / 16 < j->ng ? (j->nb - j0 + 15) / 16 : j->ng;
    const uint16_t *a = j->a + (size_t)i0 * j->lda, *b = j->b + (size_t)(j0 / 16) * j->ldb;
    switch (ng) {
    case 4:
        switch (mr) { DPG_RUN(1, 4) DPG_RUN(2, 4) DPG_RUN(3, 4) DPG_RUN(4, 4) DPG_RUN(5, 4) DPG_RUN(6, 4) }
        break;
    case 3:
        switch (mr) {
            DPG_RUN(1, 3) DPG_RUN(2, 3) DPG_RUN(3, 3) DPG_RUN(4, 3) DPG_RUN(5, 3) DPG_RUN(6, 3) DPG_RUN(7, 3)
            DPG_RUN(8, 3)
        }
        break;
    case 2:
        switch (mr) {
            DPG_RUN(1, 2) DPG_RUN(2, 2) DPG_RUN(3, 2) DPG_RUN(4, 2) DPG_RUN(5, 2) DPG_RUN(6, 2) DPG_RUN(7, 2)
            DPG_RUN(8, 2) DPG_RUN(9, 2) DPG_RUN(10, 2) DPG_RUN(11, 2) DPG_RUN(12, 2)
        }
        break;
    default:
        switch (mr) {
            DPG_RUN(1, 1) DPG_RUN(2, 1) DPG_RUN(3, 1) DPG_RUN(4, 1) DPG_RUN(5, 1) DPG_RUN(6, 1) DPG_RUN(7, 1)
            DPG_RUN(8, 1) DPG_RUN(9, 1) DPG_RUN(10, 1) DPG_RUN(11, 1) DPG_RUN(12, 1)
        }
        break;
    }
}
#undef DPG_RUN

static BF16DP_TARGET void dpg_chunk(void *c_, size_t lo, size_t hi) {
    const dpg_job_t *j = c_;
    for (size_t t = lo; t < hi; t++) {
        int ti = j->a_major ? (int)(t / (size_t)j->bt) : (int)(t % (size_t)j->at);
        int tj = j->a_major ? (int)(t % (size_t)j->bt) : (int)(t / (size_t)j->at);
        dpg_one(j, ti, tj);
    }
}

// The tile for nb columns of B: 4 groups (64 columns) x 6 rows, or fewer groups and more rows
// where B is narrow (X of 9 .. 47 rows with trans_w: batched decode steps).
static void dpg_run(dpg_job_t *j) {
    int groups = (j->nb + 15) / 16;
    j->ng = groups >= 4 ? 4 : groups;
    j->mr = j->ng == 4 ? 6 : j->ng == 3 ? 8 : 12;
    j->at = (j->na + j->mr - 1) / j->mr;
    j->bt = (groups + j->ng - 1) / j->ng;
    par_for((size_t)j->at * j->bt, 1, 1, dpg_chunk, j);
}

// gemm_bf16w with vdpbf16ps (M, N, K >= 1), in blocks that bound the calling thread's buffers
// to about DPG_BLOCK_U16 bf16 values each: with trans_w, blocks of X's rows (each block's X
// rounded and packed, then all of W against it; W is read once per block, 2 (block rows) flops
// per byte read); without, blocks of K (X's columns rounded, W's rows packed; C accumulates the
// blocks, beta applied with the first).
#define DPG_BLOCK_U16 (2 * 1024 * 1024)

static void gemm_bf16w_dpg(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                           const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    int kp = (K + AMX_K - 1) / AMX_K * AMX_K, kbn = kp / AMX_K;
    dpg_job_t j = {.alpha = alpha, .beta = beta, .ldc = ldc};
    if (trans_w) {
        // C^T (N, rows) = W X^T for each block of X's rows: A = W, B = the block packed
        int mb = DPG_BLOCK_U16 / kp;
        mb = mb < 64 ? 64 : mb & ~15;
        if (mb > M) mb = M;
        uint16_t *xb = (uint16_t *)bf16_scratch(((size_t)mb * kp + 1) / 2);
        uint16_t *xp = (uint16_t *)pack_scratch(((size_t)(mb + 15) / 16 * kbn * AMX_TILE_U16 + 1) / 2);
        for (int i0 = 0; i0 < M; i0 += mb) {
            int rows = M - i0 < mb ? M - i0 : mb;
            amx_job_t x = {.X = X + (size_t)i0 * ldx, .ldx = ldx, .M = rows, .K = K, .kp = kp, .xb = xb};
            par_for((size_t)rows, (size_t)(PAR_ELEMS / kp), 16, amx_pack_x_chunk, &x);
            vnni_pack(xp, true, xb, kp, rows, K, kbn);
            j.a = W, j.lda = (size_t)ldw, j.na = N, j.b = xp, j.nb = rows, j.ldb = (size_t)kbn * AMX_TILE_U16;
            j.kpairs = K / 2, j.tail = K & 1, j.trans_out = true, j.a_major = true, j.C = C + (size_t)i0 * ldc;
            dpg_run(&j);
        }
        return;
    }
    // C (M, N) += X[:, k0 : k0 + kb] W[k0 : k0 + kb, :] for each block of K: A = X's columns
    // rounded, B = W's rows packed
    int kb = DPG_BLOCK_U16 / ((N + 15) / 16 * 16);
    kb = kb < AMX_K ? AMX_K : kb / AMX_K * AMX_K;
    if (kb > K) kb = K;
    int kbp = (kb + AMX_K - 1) / AMX_K * AMX_K;
    uint16_t *xb = (uint16_t *)bf16_scratch(((size_t)M * kbp + 1) / 2);
    uint16_t *wp = (uint16_t *)pack_scratch(((size_t)(N + 15) / 16 * (kbp / AMX_K) * AMX_TILE_U16 + 1) / 2);
    for (int k0 = 0; k0 < K; k0 += kb) {
        int ks = K - k0 < kb ? K - k0 : kb, ksp = (ks + AMX_K - 1) / AMX_K * AMX_K;
        amx_job_t x = {.X = X + k0, .ldx = ldx, .M = M, .K = ks, .kp = ksp, .xb = xb};
        par_for((size_t)M, (size_t)(PAR_ELEMS / ksp), 16, amx_pack_x_chunk, &x);
        vnni_pack(wp, false, W + (size_t)k0 * ldw, ldw, N, ks, ksp / AMX_K);
        j.a = xb, j.lda = (size_t)ksp, j.na = M, j.b = wp, j.nb = N, j.ldb = (size_t)(ksp / AMX_K) * AMX_TILE_U16;
        j.kpairs = (ks + 1) / 2, j.tail = false, j.trans_out = false, j.a_major = false, j.C = C;
        j.beta = k0 == 0 ? beta : 1.0f;
        dpg_run(&j);
    }
}
#endif

// trans_w (C = alpha X W^T + beta C, W (N,K)): up to BF16_SMALL_M rows of X (decode) take the
// GEMV kernels above, one pass over W converting on the fly (half the bytes of an fp32 W;
// measured faster than sgemm on an fp32 W up to ~8 rows), threads over W's rows; on the
// avx512-bf16 variant X is rounded to bf16 first (vdpbf16ps), and more rows, in both
// directions, take gemm_bf16w_dpg above. Otherwise, more rows: W converted block by
// block (at least BF16_MIN_ROWS rows, about BF16_BLOCK_FLOATS floats, 4 MiB) into the calling
// thread's buffer, each block multiplied by OpenBLAS sgemm. Extra cost against sgemm on an fp32
// W: one read of W and one write of its fp32 copy per call, O(N K) against the product's
// O(M N K) (measured, 1 thread, 512x896x896: ~0.2 ms, ~3% of the product), plus the thread's
// buffer.
// !trans_w (C = alpha X W + beta C, W (K,N), the backward dX = dY W): the same blocks, now runs
// of W's K rows; each block's sgemm adds X[:, k0:k0+kb] W[k0:k0+kb, :] into C, the first one
// with beta and the rest with 1, so beta is applied once and X is used exactly.
#define BF16_SMALL_M 8
#define BF16_BLOCK_FLOATS (1024 * 1024)
#define BF16_MIN_ROWS 256

// Rows per converted block of a W with `cols` columns (a multiple of 16 unless it is the minimum).
static int bf16_block_rows(int cols, int rows) {
    int nb = BF16_BLOCK_FLOATS / cols;
    nb = nb < BF16_MIN_ROWS ? BF16_MIN_ROWS : nb & ~15;
    return nb > rows ? rows : nb;
}

typedef struct {
    float *buf;
    const uint16_t *W;
    int ldw, r0, cols;
} rows_conv_t;

static void rows_to_f32_chunk(void *c_, size_t lo, size_t hi) {
    const rows_conv_t *c = c_;
    for (size_t j = lo; j < hi; j++) {
        const uint16_t *wj = c->W + (size_t)(c->r0 + (int)j) * c->ldw;
        float *bj = c->buf + j * (size_t)c->cols;
        for (int k = 0; k < c->cols; k++) bj[k] = bf16_to_f32(wj[k]);
    }
}

// buf (rows, cols) contiguous = fp32 of W's rows r0 .. r0+rows-1 (row stride ldw).
static void bf16_rows_to_f32(float *buf, const uint16_t *W, int ldw, int r0, int rows, int cols) {
    rows_conv_t c = {buf, W, ldw, r0, cols};
    if (rows > 0) par_for((size_t)rows, (size_t)(PAR_ELEMS / (cols > 0 ? cols : 1)), 16, rows_to_f32_chunk, &c);
}

// dp: the few-rows path multiplies with vdpbf16ps (the avx512-bf16 table).
static void gemm_bf16w(bool dp, bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                       const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
    if (dp && M > BF16_SMALL_M) {
        gemm_bf16w_dpg(trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
        return;
    }
#endif
    if (!trans_w) {
        int kb = bf16_block_rows(N, K);
        float *buf = bf16_scratch((size_t)kb * N);
        for (int k0 = 0; k0 < K; k0 += kb) {
            int rows = K - k0 < kb ? K - k0 : kb;
            bf16_rows_to_f32(buf, W, ldw, k0, rows, N);
            sgemm_pool(false, false, M, N, rows, alpha, X + k0, ldx, buf, N, k0 == 0 ? beta : 1.0f, C, ldc);
        }
        return;
    }
    if (M <= BF16_SMALL_M) {
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
        if (dp) {
            gemv_bf16_dp(M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
            return;
        }
#else
        (void)dp;
#endif
        gemv_bf16(M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
        return;
    }
    int nb = bf16_block_rows(K, N);
    float *buf = bf16_scratch((size_t)nb * K);
    for (int j0 = 0; j0 < N; j0 += nb) {
        int rows = N - j0 < nb ? N - j0 : nb;
        bf16_rows_to_f32(buf, W, ldw, j0, rows, K);
        sgemm_pool(false, true, M, rows, K, alpha, X, ldx, buf, K, beta, C + j0, ldc);
    }
}

static void cpu_gemm_bf16w(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                           const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    gemm_bf16w(false, trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
}

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
static void cpu_gemm_bf16w_dp(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                              const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    gemm_bf16w(true, trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
}

// The amx table: the few-rows path of avx512-bf16 (trans_w, M <= BF16_SMALL_M), AMX for the rest.
static void cpu_gemm_bf16w_amx(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                               const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    if (M > BF16_SMALL_M && N > 0 && K > 0)
        gemm_bf16w_amx(trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
    else
        gemm_bf16w(true, trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
}
#endif

// gemm_parts (kernels.h): up to KERN_PARTS_MAX products of one X; when all are few-rows
// products of one precision (the GEMV kernels: decode steps), their chunks of W rows form one
// loop on the pool, part after part, each chunk computed by the very function a separate call
// runs (the avx512-bf16 variant rounds X to bf16 once for all parts); otherwise the separate
// calls.
typedef struct {
    void (*chunk)(void *, size_t, size_t);
    gemv_job_t job[KERN_PARTS_MAX];
    size_t first[KERN_PARTS_MAX + 1];   // chunk offsets of the parts
    int n;
} parts_job_t;

static void parts_chunk(void *c_, size_t lo, size_t hi) {
    parts_job_t *j = c_;
    for (int p = 0; p < j->n && lo < hi; p++) {
        size_t a = j->first[p], b = j->first[p + 1];
        if (lo >= b) continue;
        size_t e = hi < b ? hi : b;
        j->chunk(&j->job[p], lo - a, e - a);
        lo = e;
    }
}

typedef void (*bf16w_fn_t)(bool, int, int, int, float, const float *, int, const uint16_t *, int, float, float *, int);

// bf16w: the table's gemm_bf16w (the separate calls); dp: its few-rows path is vdpbf16ps.
static void gemm_parts(bf16w_fn_t bf16w, bool dp, int M, int K, const float *X, const kern_part_t *pt, int n) {
    bool bf16 = n > 0 && pt[0].W16;
    bool one_loop = n >= 2 && n <= KERN_PARTS_MAX && M >= 1 && K >= 1 && M <= (bf16 ? BF16_SMALL_M : GEMV_MAX_M);
    for (int p = 0; p < n && one_loop; p++) one_loop = (pt[p].W16 != NULL) == bf16 && pt[p].N >= 1;
    if (!one_loop) {
        for (int p = 0; p < n; p++) {
            if (pt[p].W16)
                bf16w(true, M, pt[p].N, K, 1.0f, X, K, pt[p].W16, K, pt[p].beta, pt[p].C, pt[p].N);
            else
                cpu_gemm(false, true, M, pt[p].N, K, 1.0f, X, K, pt[p].W, K, pt[p].beta, pt[p].C, pt[p].N);
        }
        return;
    }
    parts_job_t j = {.n = n, .chunk = bf16 ? gemv_bf16_chunk : gemv_f32_chunk};
    const void *x = X;
    int ldx = K;
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
    if (bf16 && dp) {
        x = gemv_dp_round_x(M, K, X, K, &ldx);
        j.chunk = gemv_dp_chunk;
    }
#else
    (void)dp;
#endif
    // the guided chunks of all parts' rows one after the other, cut again at the parts' ends
    int total = 0;
    for (int p = 0; p < n; p++) total += pt[p].N;
    int all[GEMV_MAX_CUTS + 1], mine[GEMV_MAX_CUTS + 2 * KERN_PARTS_MAX + 1];
    int n_all = gemv_plan(total, K, bf16 ? sizeof(uint16_t) : sizeof(float), all), used = 0, row0 = 0, a = 1;
    for (int p = 0; p < n; p++) {
        const kern_part_t *q = &pt[p];
        int *cut = mine + used, nc = 0;
        cut[0] = 0;
        for (; a < n_all && all[a] < row0 + q->N; a++)
            if (all[a] > row0) cut[++nc] = all[a] - row0;
        cut[++nc] = q->N;
        used += nc + 1;
        row0 += q->N;
        j.job[p] = (gemv_job_t){M, q->N, K, ldx, K, q->N, 1.0f, q->beta, x, bf16 ? (const void *)q->W16 : q->W, q->C, cut};
        j.first[p + 1] = j.first[p] + (size_t)nc;
    }
    if (n_all > 1) kpool_for(j.first[n], 1, parts_chunk, &j);
    else parts_chunk(&j, 0, j.first[n]);
}

static void cpu_gemm_parts(int M, int K, const float *X, const kern_part_t *parts, int n_parts) {
    gemm_parts(cpu_gemm_bf16w, false, M, K, X, parts, n_parts);
}

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
// avx512-bf16 and amx: their few-rows path (vdpbf16ps) for bf16 parts
static void cpu_gemm_parts_dp(int M, int K, const float *X, const kern_part_t *parts, int n_parts) {
    gemm_parts(cpu_gemm_bf16w_dp, true, M, K, X, parts, n_parts);
}

static void cpu_gemm_parts_amx(int M, int K, const float *X, const kern_part_t *parts, int n_parts) {
    gemm_parts(cpu_gemm_bf16w_amx, true, M, K, X, parts, n_parts);
}
#endif

typedef struct {
    float alpha;
    const float *x;
    float *y;
} axpy_t;

static void axpy_chunk(void *c_, size_t lo, size_t hi) {
    const axpy_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->y[i] += c->alpha * c->x[i];
}

static void cpu_axpy(size_t n, float alpha, const float *x, float *y) {
    axpy_t c = {alpha, x, y};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4, axpy_chunk, &c);
}

static void scale_chunk(void *c_, size_t lo, size_t hi) {
    const axpy_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->y[i] *= c->alpha;
}

static void cpu_scale(size_t n, float alpha, float *x) {
    axpy_t c = {alpha, NULL, x};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4, scale_chunk, &c);
}

// Reductions: one partial result per chunk, combined in chunk order, so the result depends on the
// chunking (fixed by n and the thread count), never on which thread ran what. One thread: one
// chunk, the plain loop.
typedef struct {
    const float *x;
    size_t grain;
    double *part;
    int *bad;
} reduce_t;

static size_t reduce_grain(size_t n) { return kpool_threads() == 1 || n <= PAR_ELEMS ? n : kpool_grain(n, 4, PAR_ELEMS / 4); }

static void sumsq_chunk(void *c_, size_t lo, size_t hi) {
    const reduce_t *c = c_;
    double s = 0.0;
    for (size_t i = lo; i < hi; i++) s += (double)c->x[i] * c->x[i];
    c->part[lo / c->grain] = s;
}

static double cpu_sumsq(size_t n, const float *x) {
    if (n == 0) return 0.0;
    size_t grain = reduce_grain(n), nc = (n + grain - 1) / grain;
    double one, *part = nc == 1 ? &one : malloc(sizeof(double) * nc);
    if (!part) {
        fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
    reduce_t c = {.x = x, .grain = grain, .part = part};
    if (nc == 1) sumsq_chunk(&c, 0, n);
    else kpool_for(n, grain, sumsq_chunk, &c);
    double s = 0.0;
    for (size_t i = 0; i < nc; i++) s += part[i];
    if (part != &one) free(part);
    return s;
}

static void finite_chunk(void *c_, size_t lo, size_t hi) {
    const reduce_t *c = c_;
    int bad = 0;
    for (size_t i = lo; i < hi; i++) bad |= !isfinite(c->x[i]);
    if (bad) __atomic_store_n(c->bad, 1, __ATOMIC_RELAXED);
}

static bool cpu_all_finite(size_t n, const float *x) {
    int bad = 0;
    reduce_t c = {.x = x, .bad = &bad};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4, finite_chunk, &c);
    return !__atomic_load_n(&bad, __ATOMIC_RELAXED);
}

// --- transformer pieces ----------------------------------------------------------------------

typedef struct {
    float *dst;
    const size_t *off;
    const float *src;
    int row_len;
} scatter_t;

static void scatter_chunk(void *c_, size_t lo, size_t hi) {
    const scatter_t *c = c_;
    for (size_t r = lo; r < hi; r++)
        memcpy(c->dst + c->off[r], c->src + r * (size_t)c->row_len, sizeof(float) * (size_t)c->row_len);
}

static void cpu_scatter_rows(float *dst, const size_t *off, const float *src, int n, int row_len) {
    scatter_t c = {dst, off, src, row_len};
    par_for(n > 0 ? (size_t)n : 0, 64, 16, scatter_chunk, &c);
}

typedef struct {
    float *out;
    const float *table;
    const int32_t *tokens;
    int dim;
} embed_t;

static void embed_chunk(void *c_, size_t lo, size_t hi) {
    const embed_t *c = c_;
    for (size_t i = lo; i < hi; i++)
        memcpy(c->out + i * (size_t)c->dim, c->table + (size_t)c->tokens[i] * c->dim, (size_t)c->dim * sizeof(float));
}

static void cpu_embed(float *out, const float *table, const int32_t *tokens, int n, int dim) {
    embed_t c = {out, table, tokens, dim};
    par_for(n > 0 ? (size_t)n : 0, 64, 16, embed_chunk, &c);
}

static void cpu_embed_bwd(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    // Serial: two rows may share a token.
    for (int i = 0; i < n; i++) {
        float *d = dtable + (size_t)tokens[i] * dim;
        const float *g = dout + (size_t)i * dim;
        for (int j = 0; j < dim; j++) d[j] += g[j];
    }
}

typedef struct {
    float *out, *rstd;
    const float *x, *w, *dout;
    int dim;
    float eps;
} norm_t;

static void rmsnorm_chunk(void *c_, size_t lo, size_t hi) {
    const norm_t *c = c_;
    int dim = c->dim;
    for (size_t i = lo; i < hi; i++) {
        const float *xi = c->x + i * (size_t)dim;
        float *oi = c->out + i * (size_t)dim;
        float ss = dot(xi, xi, dim);
        float r = 1.0f / sqrtf(ss / dim + c->eps);
        if (c->rstd) c->rstd[i] = r;
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * r * c->w[j];
    }
}

static void cpu_rmsnorm(float *out, float *rstd, const float *x, const float *w, int n, int dim, float eps) {
    norm_t c = {.out = out, .rstd = rstd, .x = x, .w = w, .dim = dim, .eps = eps};
    par_for(n > 0 ? (size_t)n : 0, 16, 4, rmsnorm_chunk, &c);
}

// y = x * r * w, r = (mean(x^2) + eps)^-1/2:
//   dx = r * (dy*w) - x * r^3 / dim * sum(dy*w*x);   dw = sum_rows dy * x * r
static void rmsnorm_bwd_chunk(void *c_, size_t lo, size_t hi) {
    const norm_t *c = c_;
    int dim = c->dim;
    const float *w = c->w;
    for (size_t i = lo; i < hi; i++) {
        const float *xi = c->x + i * (size_t)dim, *gi = c->dout + i * (size_t)dim;
        float *di = c->out + i * (size_t)dim;
        float r = c->rstd[i];
        float gwx = 0.0f;
#pragma omp simd reduction(+ : gwx)
        for (int j = 0; j < dim; j++) gwx += gi[j] * w[j] * xi[j];
        float cc = gwx * r * r * r / dim;
        for (int j = 0; j < dim; j++) di[j] += r * gi[j] * w[j] - cc * xi[j];
    }
}

static void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                            int n, int dim) {
    norm_t c = {.out = dx, .rstd = (float *)rstd, .x = x, .w = w, .dout = dout, .dim = dim};
    par_for(n > 0 ? (size_t)n : 0, 16, 4, rmsnorm_bwd_chunk, &c);
    if (dw) {
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
            float r = rstd[i];
            for (int j = 0; j < dim; j++) dw[j] += gi[j] * xi[j] * r;
        }
    }
}

static void add_bias_chunk(void *c_, size_t lo, size_t hi) {
    const norm_t *c = c_;
    for (size_t i = lo; i < hi; i++) {
        float *xi = c->out + i * (size_t)c->dim;
        for (int j = 0; j < c->dim; j++) xi[j] += c->w[j];
    }
}

static void cpu_add_bias(float *x, const float *b, int n, int dim) {
    norm_t c = {.out = x, .w = b, .dim = dim};
    par_for(n > 0 ? (size_t)n : 0, 64, 16, add_bias_chunk, &c);
}

static void cpu_bias_bwd(float *db, const float *dy, int n, int dim) {
    for (int i = 0; i < n; i++) {
        const float *g = dy + (size_t)i * dim;
        for (int j = 0; j < dim; j++) db[j] += g[j];
    }
}

typedef struct {
    float *x;
    const int32_t *pos;
    int n_heads, head_dim;
    const float *cos_t, *sin_t;
    float sgn;
} rope_t;

static void rope_chunk(void *c_, size_t lo, size_t hi) {
    const rope_t *c = c_;
    int half = c->head_dim / 2;
    for (size_t i = lo; i < hi; i++) {
        const float *cs = c->cos_t + (size_t)c->pos[i] * half, *s = c->sin_t + (size_t)c->pos[i] * half;
        for (int h = 0; h < c->n_heads; h++) {
            float *v = c->x + (i * (size_t)c->n_heads + (size_t)h) * (size_t)c->head_dim;
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half], sj = c->sgn * s[j];
                v[j] = a * cs[j] - b * sj;
                v[j + half] = b * cs[j] + a * sj;
            }
        }
    }
}

static void cpu_rope(float *x, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
                     const float *sin_t, bool inverse) {
    rope_t c = {x, pos, n_heads, head_dim, cos_t, sin_t, inverse ? -1.0f : 1.0f};
    par_for(n > 0 ? (size_t)n : 0, 16, 4, rope_chunk, &c);
}

#define GELU_ALPHA ((float)M_SQRT1_2)                      // 1/sqrt(2)
#define GELU_BETA ((float)(M_2_SQRTPI * M_SQRT1_2 * 0.5))   // 1/sqrt(2 pi)
#define GELU_TANH_BETA ((float)(M_SQRT2 * M_2_SQRTPI * 0.5))   // sqrt(2/pi)
#define GELU_TANH_KAPPA 0.044715f

static inline float gelu(float x) { return x * 0.5f * (1.0f + erff(x * GELU_ALPHA)); }

static inline float gelu_tanh(float x) {
    float inner = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner));
}

typedef struct {
    float *h, *dg, *du;
    const float *g, *u, *dh;
} glu_t;

static void glu_gelu_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->h[i] = gelu(c->g[i]) * c->u[i];
}

static void glu_gelu_tanh_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->h[i] = gelu_tanh(c->g[i]) * c->u[i];
}

// exp(-g) of a block of gate values (exp_rows), for silu and its derivative.
#define SILU_BLOCK 256
static inline void exp_neg(float *e, const float *g, size_t n) {
    for (size_t i = 0; i < n; i++) e[i] = -g[i];
    exp_rows(e, e, (int)n);
}

static void glu_silu_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    float e[SILU_BLOCK];
    for (size_t b = lo; b < hi; b += SILU_BLOCK) {
        size_t n = hi - b < SILU_BLOCK ? hi - b : SILU_BLOCK;
        exp_neg(e, c->g + b, n);
        // silu(g) = g / (1 + exp(-g))
        for (size_t i = 0; i < n; i++) c->h[b + i] = c->g[b + i] / (1.0f + e[i]) * c->u[b + i];
    }
}

static void cpu_glu(float *h, const float *g, const float *u, size_t n, kern_act_t act) {
    glu_t c = {.h = h, .g = g, .u = u};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4,
            act == KERN_ACT_GELU ? glu_gelu_chunk : act == KERN_ACT_GELU_TANH ? glu_gelu_tanh_chunk : glu_silu_chunk, &c);
}

static void glu_bwd_gelu_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    for (size_t i = lo; i < hi; i++) {
        float x = c->g[i], d = c->dh[i];
        float cdf = 0.5f * (1.0f + erff(x * GELU_ALPHA)), pdf = GELU_BETA * expf(x * x * -0.5f);
        c->du[i] = d * (x * cdf);
        c->dg[i] = d * c->u[i] * (cdf + x * pdf);
    }
}

static void glu_bwd_gelu_tanh_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    for (size_t i = lo; i < hi; i++) {
        float x = c->g[i], d = c->dh[i], x2 = x * x;
        float z = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * (x2 * x)), t = tanhf(z), ch = coshf(z);
        // 1 - t^2 as 1 / cosh^2: no cancellation where t is near +-1 (0 once cosh^2 overflows)
        float sech2 = 1.0f / (ch * ch);
        c->du[i] = d * (0.5f * x * (1.0f + t));
        float dact = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_TANH_BETA * (1.0f + 3.0f * GELU_TANH_KAPPA * x2);
        c->dg[i] = d * c->u[i] * dact;
    }
}

static void glu_bwd_silu_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    float e[SILU_BLOCK];
    for (size_t b = lo; b < hi; b += SILU_BLOCK) {
        size_t n = hi - b < SILU_BLOCK ? hi - b : SILU_BLOCK;
        exp_neg(e, c->g + b, n);
        for (size_t k = 0; k < n; k++) {
            size_t i = b + k;
            float s = 1.0f / (1.0f + e[k]);
            float sg = c->g[i] * s;
            float d = c->dh[i];
            c->du[i] = d * sg;
            c->dg[i] = d * c->u[i] * (s + sg * (1.0f - s));
        }
    }
}

// act'(x): silu s + x s (1 - s); gelu Phi(x) + x phi(x); gelu_tanh 0.5 (1 + t) + 0.5 x sech^2(z) beta (1 + 3 kappa x^2)
// with z the tanh argument and t = tanh(z).
static void cpu_glu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n, kern_act_t act) {
    glu_t c = {.dg = dg, .du = du, .dh = dh, .g = g, .u = u};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4,
            act == KERN_ACT_GELU        ? glu_bwd_gelu_chunk
            : act == KERN_ACT_GELU_TANH ? glu_bwd_gelu_tanh_chunk
                                        : glu_bwd_silu_chunk,
            &c);
}

// Lanes of dot()'s partial sums as this variant compiles it: its `omp simd` reduction keeps
// DOT_LANES sums, lane l adding a[l] b[l], a[l + DOT_LANES] b[l + DOT_LANES], ... of the whole
// blocks of DOT_LANES elements, then the elements after the last whole block into lane 0, and
// returns 0 + lane 0 + lane 1 + ... in that order (GCC 12 at -O2; at -O0 and under the sanitizers
// dot() is compiled otherwise and the sums below agree with it to rounding only).
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
#define DOT_LANES 16
#elif KERN_CPU_ISA == KERN_CPU_ISA_AVX2
#define DOT_LANES 8
#else
#define DOT_LANES 4
#endif
#define PANEL_COLS 16

// out[c] = dot(x, column c of T) for c in [0, n), T holding hd rows of ld floats (ld a multiple of
// PANEL_COLS, every column below it finite): each column's sum in dot()'s order (DOT_LANES).
typedef float panel_v __attribute__((vector_size(PANEL_COLS * sizeof(float)), aligned(4), may_alias));
static void dots_cols(float *restrict out, const float *restrict x, const float *restrict T, size_t ld, int hd,
                      int n) {
    int whole = hd / DOT_LANES * DOT_LANES;
    for (int c0 = 0; c0 < n; c0 += PANEL_COLS) {
        panel_v sum = {0};
        for (int l = 0; l < DOT_LANES; l++) {
            panel_v lane = {0};
            for (int i = l; i < whole; i += DOT_LANES) lane = lane + x[i] * *(const panel_v *)(T + (size_t)i * ld + c0);
            if (l == 0)
                for (int i = whole; i < hd; i++) lane = lane + x[i] * *(const panel_v *)(T + (size_t)i * ld + c0);
            sum = sum + lane;
        }
        int m = n - c0 < PANEL_COLS ? n - c0 : PANEL_COLS;
        if (m == PANEL_COLS) *(panel_v *)(out + c0) = sum;
        else
            for (int c = 0; c < m; c++) out[c0 + c] = sum[c];
    }
}

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
// out[c] = dot(x, rows[c], hd) for 16 rows, hd a multiple of 16, the same bits: each row's 16 lane
// sums as dot() keeps them (vertical, block after block: one vector per row), then the 16 vectors
// transposed in registers so that adding the lanes in order (0 + lane 0 + lane 1 + ...) is 16
// vector additions for the 16 rows at once, where dot() adds them one by one per row.
static void dots16_rows(float *restrict out, const float *restrict x, const float *const *restrict rows, int hd) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) r[c] = _mm512_setzero_ps();
    for (int b = 0; b < hd; b += 16) {
        __m512 xb = _mm512_loadu_ps(x + b);
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) r[c] = _mm512_add_ps(r[c], _mm512_mul_ps(xb, _mm512_loadu_ps(rows[c] + b)));
    }
    // 16 x 16 transpose: 32-bit, 64-bit, then 128-bit pieces
#pragma GCC unroll 8
    for (int c = 0; c < 16; c += 2) {
        t[c] = _mm512_unpacklo_ps(r[c], r[c + 1]);
        t[c + 1] = _mm512_unpackhi_ps(r[c], r[c + 1]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 16; c += 4) {
        r[c] = _mm512_shuffle_ps(t[c], t[c + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[c + 1] = _mm512_shuffle_ps(t[c], t[c + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[c + 2] = _mm512_shuffle_ps(t[c + 1], t[c + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[c + 3] = _mm512_shuffle_ps(t[c + 1], t[c + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 2
    for (int c = 0; c < 16; c += 8)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            t[c + k] = _mm512_shuffle_f32x4(r[c + k], r[c + k + 4], 0x88);
            t[c + k + 4] = _mm512_shuffle_f32x4(r[c + k], r[c + k + 4], 0xdd);
        }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
    __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int l = 0; l < 16; l++) sum = _mm512_add_ps(sum, r[l]);
    _mm512_storeu_ps(out, sum);
}

// out[0 .. 16 NV) = sum over p of w[p] v_p, added in p's order from 0 as attn_row's loop adds them
// (out[d] += w v[d]), NV vectors of 16 held in registers instead of in out between two rows.
static inline __attribute__((always_inline)) void wsum16(float *restrict out, const float *restrict w,
                                                         const float *const *restrict vp, int ctx, float inv,
                                                         const int NV) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) acc[k] = _mm512_setzero_ps();
    for (int p = 0; p < ctx; p++) {
        __m512 wp = _mm512_set1_ps(w[p] * inv);
#pragma GCC unroll 8
        for (int k = 0; k < NV; k++) acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(wp, _mm512_loadu_ps(vp[p] + 16 * k)));
    }
#pragma GCC unroll 8
    for (int k = 0; k < NV; k++) _mm512_storeu_ps(out + 16 * k, acc[k]);
}
#endif

// One query row against ctx key/value rows: scores, softmax (two passes over a scratch of ctx
// floats), weighted sum of the value rows given by a pointer array. The scores: with key row
// pointers kp, dot(q, kp[p]); without (NULL), the caller's in scores (as dot() computes them).
// Returns the log-sum-exp of the scaled scores (saved for the backward pass). restrict lets the
// value loop vectorise.
static float attn_row(float *restrict out, const float *restrict q, const float *const *restrict kp,
                      const float *const *restrict vp, int ctx, int hd, float scale, float *restrict scores) {
    float mx = -INFINITY;
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
    if (kp && hd % 16 == 0) {
        int p = 0;
        for (; p + 16 <= ctx; p += 16) dots16_rows(scores + p, q, kp + p, hd);
        for (; p < ctx; p++) scores[p] = dot(q, kp[p], hd);
        kp = NULL;
    }
#endif
    for (int p = 0; p < ctx; p++) {
        float s = (kp ? dot(q, kp[p], hd) : scores[p]) * scale;
        scores[p] = s;
        mx = s > mx ? s : mx;
    }
    for (int p = 0; p < ctx; p++) scores[p] -= mx;
    exp_rows(scores, scores, ctx);
    float sum = 0.0f;
    for (int p = 0; p < ctx; p++) sum += scores[p];
    float inv = 1.0f / sum;
#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
    switch (hd) {
    case 16: wsum16(out, scores, vp, ctx, inv, 1); return mx + logf(sum);
    case 32: wsum16(out, scores, vp, ctx, inv, 2); return mx + logf(sum);
    case 64: wsum16(out, scores, vp, ctx, inv, 4); return mx + logf(sum);
    case 128: wsum16(out, scores, vp, ctx, inv, 8); return mx + logf(sum);
    default: break;
    }
#endif
    for (int d = 0; d < hd; d++) out[d] = 0.0f;
    for (int p = 0; p < ctx; p++) {
        const float *restrict v = vp[p];
        float w = scores[p] * inv;
#pragma omp simd
        for (int d = 0; d < hd; d++) out[d] += w * v[d];
    }
    return mx + logf(sum);
}

// Per-thread scratch: scores plus K and V row pointer arrays for up to n positions.
typedef struct {
    float *scores;
    const float **kp, **vp;
} attn_scratch_t;

static attn_scratch_t scratch_new(int n) {
    if (n < 1) n = 1;
    attn_scratch_t s = {malloc(sizeof(float) * (size_t)n), malloc(sizeof(float *) * (size_t)n),
                        malloc(sizeof(float *) * (size_t)n)};
    if (!s.scores || !s.kp || !s.vp) {
        fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
    return s;
}

static void scratch_free(attn_scratch_t *s) {
    free(s->scores);
    free(s->kp);
    free(s->vp);
}

typedef struct {
    float *out, *lse;
    const float *q, *k, *v;
    const kern_paged_attn_t *pa;
    const kern_packed_attn_t *a;
    float scale;
} attn_t;

// Items are (token, KV head) pairs, token-major: a decode step of one sequence still splits
// across threads (by KV head); every output row is computed by attn_row alone, whatever the split.
static void attn_paged_chunk(void *c_, size_t lo, size_t hi) {
    const attn_t *c = c_;
    const kern_paged_attn_t *a = c->pa;
    int H = a->n_heads, hd = a->head_dim, grp = a->n_heads / a->n_kv_heads, kvd = a->n_kv_heads * hd;
    int bs = a->block_size;
    attn_scratch_t sc = scratch_new(a->max_ctx);
    for (size_t it = lo; it < hi; it++) {
        size_t i = it / (size_t)a->n_kv_heads;
        int kh = (int)(it % (size_t)a->n_kv_heads);
        const int *tab = a->tables[a->seq_of[i]];
        int ctx = a->pos[i] + 1;
        for (int p = 0; p < ctx; p++) {
            size_t off = (size_t)tab[p / bs] * a->block_stride + (size_t)(p % bs) * kvd + (size_t)kh * hd;
            sc.kp[p] = a->k_base + off;
            sc.vp[p] = a->v_base + off;
        }
        for (int h = kh * grp; h < (kh + 1) * grp; h++)
            attn_row(c->out + (i * H + h) * hd, c->q + (i * H + h) * hd, sc.kp, sc.vp, ctx, hd, c->scale,
                     sc.scores);
    }
    scratch_free(&sc);
}

static void cpu_attn_paged(float *out, const float *q, const kern_paged_attn_t *a) {
    attn_t c = {.out = out, .q = q, .pa = a, .scale = 1.0f / sqrtf((float)a->head_dim)};
    size_t items = (size_t)a->n_tokens * (size_t)a->n_kv_heads;
    if (items > 0) kpool_for(items, a->n_tokens > 1 ? (size_t)a->n_kv_heads : 1, attn_paged_chunk, &c);
}

// Items are sequences. The keys of a (sequence, kv head) are copied transposed into a panel once,
// then every query row of its heads takes its scores from it 16 at a time (dots_cols: dot()'s
// bits), where a dot product per (query, key) pair spent most of its time summing its partial sums.
static void attn_fwd_chunk(void *c_, size_t lo, size_t hi) {
    const attn_t *c = c_;
    const kern_packed_attn_t *a = c->a;
    int H = a->n_heads, hd = a->head_dim, grp = a->n_heads / a->n_kv_heads, kvd = a->n_kv_heads * hd;
    bool pre = a->pre_start && a->pre_len;
    const float *k = c->k, *v = c->v;
    attn_scratch_t sc = scratch_new(a->max_len);
    int most = 1;
    for (size_t s = lo; s < hi; s++) {
        int nk = (pre ? a->pre_len[s] : 0) + a->len[s];
        most = nk > most ? nk : most;
    }
    size_t ld = ((size_t)most + PANEL_COLS - 1) / PANEL_COLS * PANEL_COLS;
    float *Kt = malloc(sizeof(float) * (size_t)hd * ld);
    if (!Kt) {
        fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
    for (size_t s = lo; s < hi; s++) {
        // context = the prefix rows (if any), then the sequence's own rows
        int np = pre ? a->pre_len[s] : 0, nk = np + a->len[s];
        size_t nk16 = ((size_t)nk + PANEL_COLS - 1) / PANEL_COLS * PANEL_COLS;
        for (int kh = 0; kh < a->n_kv_heads; kh++) {
            size_t koff = (size_t)kh * hd, base = (size_t)a->start[s] * kvd + koff;
            for (int p = 0; p < np; p++) {
                size_t off = (size_t)(a->pre_start[s] + p) * kvd + koff;
                sc.kp[p] = k + off;
                sc.vp[p] = v + off;
            }
            for (int p = 0; p < a->len[s]; p++) {
                sc.kp[np + p] = k + base + (size_t)p * kvd;
                sc.vp[np + p] = v + base + (size_t)p * kvd;
            }
            for (int p = 0; p < nk; p++)
                for (int d = 0; d < hd; d++) Kt[(size_t)d * ld + p] = sc.kp[p][d];
            for (int d = 0; d < hd; d++)   // the last block's columns past nk: read, never used
                for (size_t p = (size_t)nk; p < nk16; p++) Kt[(size_t)d * ld + p] = 0.0f;
            for (int t = 0; t < a->len[s]; t++) {
                size_t i = (size_t)a->start[s] + t;
                for (int h = kh * grp; h < (kh + 1) * grp; h++) {
                    dots_cols(sc.scores, c->q + (i * H + h) * hd, Kt, ld, hd, np + t + 1);
                    c->lse[i * H + h] = attn_row(c->out + (i * H + h) * hd, NULL, NULL, sc.vp, np + t + 1, hd,
                                                 c->scale, sc.scores);
                }
            }
        }
    }
    free(Kt);
    scratch_free(&sc);
}

static void cpu_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                         const kern_packed_attn_t *a) {
    attn_t c = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .a = a, .scale = 1.0f / sqrtf((float)a->head_dim)};
    if (a->n_seqs > 0) kpool_for((size_t)a->n_seqs, 1, attn_fwd_chunk, &c);
}

// Backward of softmax attention with P recomputed from lse:
//   P_tj = exp(s_tj - lse_t), dP_tj = dout_t . v_j, D_t = dout_t . out_t,
//   dS_tj = P_tj (dP_tj - D_t), dq_t = scale sum_j dS_tj k_j,
//   dk_j += scale dS_tj q_t, dv_j += P_tj dout_t.
// Computed per query row against all of its keys at once: the keys (prefix rows first, then the
// sequence's own) are copied transposed into a panel, so that the dot products of one query row
// with 16 keys are 16 lanes of one vector, and dq, dk and dv are updated a vector of head_dim at a
// time. Every sum keeps the order of additions of the one-pair-at-a-time form it replaces (dot(),
// then dq over the keys in order, dk and dv over the queries in order): the same bits.

// Backward of sequence s for kv head kh: its queries' dq, and dk/dv of its own rows and of its np
// prefix rows from pbase (np = 0: none), accumulated.
static void attn_bwd_seq(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                         const float *q, const float *k, const float *v, const kern_packed_attn_t *a, int s, int kh,
                         int np, size_t pbase) {
    int H = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = H / KV, kvd = KV * hd, len = a->len[s];
    float scale = 1.0f / sqrtf((float)hd);
    size_t base = (size_t)a->start[s], koff = (size_t)kh * hd;
    int nk = np + len;
    size_t ld = ((size_t)nk + PANEL_COLS - 1) / PANEL_COLS * PANEL_COLS;
    // Kt, Vt (hd x ld), then P, dP, dS (ld each); the columns past nk zero
    float *Kt = calloc((size_t)(2 * hd + 3) * ld, sizeof(float));
    size_t *row = malloc(sizeof(size_t) * (size_t)(nk + 1));
    if (!Kt || !row) {
        fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
    float *Vt = Kt + (size_t)hd * ld, *P = Vt + (size_t)hd * ld, *dP = P + ld, *dS = dP + ld;
    for (int c = 0; c < nk; c++) {
        row[c] = ((c < np ? pbase + (size_t)c : base + (size_t)(c - np)) * (size_t)kvd) + koff;
        for (int d = 0; d < hd; d++) {
            Kt[(size_t)d * ld + c] = k[row[c] + d];
            Vt[(size_t)d * ld + c] = v[row[c] + d];
        }
    }
    for (int g = 0; g < grp; g++) {
        int h = kh * grp + g;
        for (int t = 0; t < len; t++) {
            size_t i = base + t;
            const float *restrict qh = q + (i * H + h) * hd, *restrict doh = dout + (i * H + h) * hd,
                                  *oh = out + (i * H + h) * hd;
            float *restrict dqh = dq + (i * H + h) * hd;
            float L = lse[i * H + h];
            float D = dot(doh, oh, hd);
            int n = np + t + 1;   // the prefix and own rows 0..t
            dots_cols(P, qh, Kt, ld, hd, n);
            for (int c = 0; c < n; c++) P[c] = P[c] * scale - L;
            exp_rows(P, P, np);
            exp_rows(P + np, P + np, t + 1);
            dots_cols(dP, doh, Vt, ld, hd, n);
            for (int c = 0; c < n; c++) dS[c] = P[c] * (dP[c] - D) * scale;
            for (int c = 0; c < n; c++) {
                const float *restrict kc = k + row[c];
                float *restrict dkc = dk + row[c], *restrict dvc = dv + row[c];
                float ds = dS[c], pc = P[c];
#pragma omp simd
                for (int d = 0; d < hd; d++) {
                    dqh[d] = dqh[d] + ds * kc[d];
                    dkc[d] = dkc[d] + ds * qh[d];
                    dvc[d] = dvc[d] + pc * doh[d];
                }
            }
        }
    }
    free(row);
    free(Kt);
}

// Row range [lo, hi) that sequence seq writes dk/dv into.
typedef struct {
    int lo, hi, seq;
} attn_span_t;

static int span_cmp(const void *x, const void *y) {
    const attn_span_t *a = x, *b = y;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int uf_find(int *parent, int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
}

// Groups the sequences whose dk/dv rows (own rows and prefix rows) overlap, transitively, so that
// one task owns every dk/dv row it writes and no two threads add into the same row. Fills order
// (n_seqs) with the sequences group after group, increasing within a group (a fixed summation
// order: results do not depend on the thread count), and grp0 (n_seqs + 1) with the groups'
// offsets into order. Returns the number of groups.
static int attn_write_groups(const kern_packed_attn_t *a, int *order, int *grp0) {
    int n = a->n_seqs, ns = 0;
    attn_span_t *sp = malloc(sizeof(attn_span_t) * (size_t)(2 * n + 1));
    int *parent = malloc(sizeof(int) * (size_t)(2 * n + 1)), *id = parent + n;
    if (!sp || !parent) {
        fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
    for (int s = 0; s < n; s++) {
        parent[s] = s;
        if (a->len[s] > 0) sp[ns++] = (attn_span_t){a->start[s], a->start[s] + a->len[s], s};
        if (a->pre_len[s] > 0) sp[ns++] = (attn_span_t){a->pre_start[s], a->pre_start[s] + a->pre_len[s], s};
    }
    qsort(sp, (size_t)ns, sizeof *sp, span_cmp);
    for (int i = 0, hi = -1, rep = -1; i < ns; i++) {
        if (sp[i].lo < hi) {
            int x = uf_find(parent, sp[i].seq), y = uf_find(parent, rep);
            if (x != y) parent[x > y ? x : y] = x < y ? x : y;
            if (sp[i].hi > hi) hi = sp[i].hi;
        } else {
            hi = sp[i].hi;
            rep = sp[i].seq;
        }
    }
    int ng = 0;
    for (int s = 0; s < n; s++) id[s] = -1;
    for (int s = 0; s <= n; s++) grp0[s] = 0;
    for (int s = 0; s < n; s++) {
        int r = uf_find(parent, s);
        if (id[r] < 0) id[r] = ng++;
        grp0[id[r] + 1]++;
    }
    for (int g = 0; g < ng; g++) grp0[g + 1] += grp0[g];
    // fill: grp0[g] doubles as the cursor of group g, restored afterwards
    for (int s = 0; s < n; s++) order[grp0[id[uf_find(parent, s)]]++] = s;
    for (int g = ng; g > 0; g--) grp0[g] = grp0[g - 1];
    grp0[0] = 0;
    free(sp);
    free(parent);
    return ng;
}

typedef struct {
    float *dq, *dk, *dv;
    const float *dout, *out, *lse, *q, *k, *v;
    const kern_packed_attn_t *a;
    const int *order, *grp0;
    float scale;
} attn_bwd_t;

// Items g * KV + kh: group g of sequences writing the same dk/dv rows, kv head kh.
static void attn_bwd_groups_chunk(void *c_, size_t lo, size_t hi) {
    const attn_bwd_t *c = c_;
    int KV = c->a->n_kv_heads;
    for (size_t it = lo; it < hi; it++) {
        int g = (int)(it / (size_t)KV), kh = (int)(it % (size_t)KV);
        for (int m = c->grp0[g]; m < c->grp0[g + 1]; m++)
            attn_bwd_seq(c->dq, c->dk, c->dv, c->dout, c->out, c->lse, c->q, c->k, c->v, c->a, c->order[m], kh,
                         c->a->pre_len[c->order[m]], (size_t)c->a->pre_start[c->order[m]]);
    }
}

// Items s * KV + kh: sequence s, kv head kh.
static void attn_bwd_chunk(void *c_, size_t lo, size_t hi) {
    const attn_bwd_t *c = c_;
    int KV = c->a->n_kv_heads;
    for (size_t it = lo; it < hi; it++)
        attn_bwd_seq(c->dq, c->dk, c->dv, c->dout, c->out, c->lse, c->q, c->k, c->v, c->a, (int)(it / (size_t)KV),
                     (int)(it % (size_t)KV), 0, 0);
}

// Parallel over (sequence, kv head) so that every thread owns the dk/dv rows it writes; with
// shared prefixes over (group of sequences writing the same rows, kv head).
static void cpu_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                         const float *q, const float *k, const float *v, const kern_packed_attn_t *a) {
    int H = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, kvd = KV * hd;
    memset(dq, 0, sizeof(float) * (size_t)a->n_tokens * H * hd);
    memset(dk, 0, sizeof(float) * (size_t)a->n_tokens * kvd);
    memset(dv, 0, sizeof(float) * (size_t)a->n_tokens * kvd);
    attn_bwd_t c = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .out = out, .lse = lse, .q = q, .k = k, .v = v,
                    .a = a, .scale = 1.0f / sqrtf((float)hd)};
    if (a->pre_start && a->pre_len) {
        int *order = malloc(sizeof(int) * (size_t)(2 * a->n_seqs + 1)), *grp0 = order + a->n_seqs;
        if (!order) {
            fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
            abort();
        }
        int ng = attn_write_groups(a, order, grp0);
        c.order = order, c.grp0 = grp0;
        if (ng > 0) kpool_for((size_t)ng * KV, 1, attn_bwd_groups_chunk, &c);
        free(order);
        return;
    }
    if (a->n_seqs > 0) kpool_for((size_t)a->n_seqs * KV, 1, attn_bwd_chunk, &c);
}

// --- multi-LoRA -------------------------------------------------------------------------------
// Large segments (prefill, training) go to sgemm; the many one-row segments of a decode step
// with many adapters are done together in one threaded loop, where a BLAS call per segment
// would cost more in call overhead than in arithmetic.
#define LORA_GEMM_MIN_ROWS 8

typedef struct {
    float *T, *Y;
    int ldt, in, out;
    const float *X, *Tc;
    const kern_lora_seg_t *seg;
} lora_t;

// The segments of fewer than LORA_GEMM_MIN_ROWS rows, one chunk per segment (decode steps of
// many jobs: a segment per adapter). Shrink: the segment's rows against A (rank, in) through the
// few-rows GEMV kernels, which read each row of A once for all of the segment's rows (from 2
// rows and LORA_GEMV_MIN_IN columns). Expand:
// each run of EXPAND_COLS columns of B (rank x EXPAND_COLS floats, from L1) is applied to every
// row of the segment before the next run is read, so B too is read once per segment; each output
// element is still y + c_0 b_0 + c_1 b_1 + ... in that order, the arithmetic of one row alone.
#define EXPAND_COLS 64
// A segment of one row, or a narrow A (a small model: the GEMV driver's setup costs more than
// its single pass saves), takes plain dot products, each row against A's rows.
#define LORA_GEMV_MIN_IN 256

// t[j] = x . a16[j] for the rank rows of a bf16 A (in columns), four rows at a time: four
// independent sums in flight (one sum is a chain of dependent additions, which holds a core to a
// quarter of the rate at which it can read a bf16 A), and x read once for four rows.
static void shrink_row_bf16(float *t, const float *restrict x, const uint16_t *restrict a16, int rank, int in) {
    int j = 0;
    for (; j + 4 <= rank; j += 4) {
        const uint16_t *restrict a0 = a16 + (size_t)j * in, *restrict a1 = a0 + in, *restrict a2 = a1 + in,
                                 *restrict a3 = a2 + in;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int i = 0; i < in; i++) {
            s0 += x[i] * bf16_to_f32(a0[i]);
            s1 += x[i] * bf16_to_f32(a1[i]);
            s2 += x[i] * bf16_to_f32(a2[i]);
            s3 += x[i] * bf16_to_f32(a3[i]);
        }
        t[j] = s0, t[j + 1] = s1, t[j + 2] = s2, t[j + 3] = s3;
    }
    for (; j < rank; j++) t[j] = dot_bf16(x, a16 + (size_t)j * in, in);
}

static void shrink_chunk(void *c_, size_t lo, size_t hi) {
    const lora_t *c = c_;
    for (size_t s = lo; s < hi; s++) {
        const kern_lora_seg_t *g = &c->seg[s];
        if (g->n_rows >= LORA_GEMM_MIN_ROWS) continue;
        if (g->A16) {
            if (g->n_rows >= 2 && c->in >= LORA_GEMV_MIN_IN) {
                gemv_bf16(g->n_rows, g->rank, c->in, 1.0f, c->X + (size_t)g->row0 * c->in, c->in, g->A16, c->in, 0.0f,
                          c->T + (size_t)g->row0 * c->ldt, c->ldt);
                continue;
            }
            for (int r = g->row0; r < g->row0 + g->n_rows; r++)
                shrink_row_bf16(c->T + (size_t)r * c->ldt, c->X + (size_t)r * c->in, g->A16, g->rank, c->in);
            continue;
        }
        if (g->n_rows >= 2 && c->in >= LORA_GEMV_MIN_IN) {
            gemv_f32(g->n_rows, g->rank, c->in, 1.0f, c->X + (size_t)g->row0 * c->in, c->in, g->A, c->in, 0.0f,
                     c->T + (size_t)g->row0 * c->ldt, c->ldt);
            continue;
        }
        for (int r = g->row0; r < g->row0 + g->n_rows; r++)
            for (int j = 0; j < g->rank; j++)
                c->T[(size_t)r * c->ldt + j] = dot(c->X + (size_t)r * c->in, g->A + (size_t)j * c->in, c->in);
    }
}

static void expand_chunk(void *c_, size_t lo, size_t hi) {
    const lora_t *c = c_;
    int out = c->out;
    for (size_t s = lo; s < hi; s++) {
        const kern_lora_seg_t *g = &c->seg[s];
        if (g->n_rows >= LORA_GEMM_MIN_ROWS) continue;
        // one row: B's rows whole, one after the other (one stream from memory, which the
        // prefetchers follow better than rank interleaved ones; the row of Y stays in L1)
        int cols = g->n_rows == 1 ? out : EXPAND_COLS;
        for (int o0 = 0; o0 < out; o0 += cols) {
            int o1 = out - o0 < cols ? out : o0 + cols;
            for (int r = g->row0; r < g->row0 + g->n_rows; r++) {
                const float *tr = c->Tc + (size_t)r * c->ldt;
                float *restrict y = c->Y + (size_t)r * out;
                if (g->B16) {
                    for (int j = 0; j < g->rank; j++) {
                        const uint16_t *restrict b = g->B16 + (size_t)j * out;
                        float cj = g->scale * tr[j];
#pragma omp simd
                        for (int o = o0; o < o1; o++) y[o] += cj * bf16_to_f32(b[o]);
                    }
                    continue;
                }
                for (int j = 0; j < g->rank; j++) {
                    const float *restrict b = g->B + (size_t)j * out;
                    float cj = g->scale * tr[j];
#pragma omp simd
                    for (int o = o0; o < o1; o++) y[o] += cj * b[o];
                }
            }
        }
    }
}

// A segment of many rows whose two products are each too small to share between threads
// (sgemm_pool's bound): one OpenBLAS call each wherever it runs, so such segments run side by side,
// a segment per chunk, instead of one after the other on the caller (a prefill of many jobs: 32
// adapters x 64 rows on a small model, 1,800 such calls per step, had the second core idle).
static bool lora_seg_alone(const kern_lora_seg_t *g, int in, int out) {
    double rk = (double)g->n_rows * g->rank;
    return g->n_rows >= LORA_GEMM_MIN_ROWS && (rk * in >= SGEMM_POOL_MIN_MACS || rk * out >= SGEMM_POOL_MIN_MACS);
}

// A segment of LORA_GEMM_MIN_ROWS rows or more: its shrink and its expand through cpu_gemm.
static void lora_seg_gemms(const kern_lora_seg_t *g, float *Y, int out, float *T, int ldt, const float *X, int in) {
    float *t = T + (size_t)g->row0 * ldt;
    cpu_gemm(false, true, g->n_rows, g->rank, in, 1.0f, X + (size_t)g->row0 * in, in, g->A, in, 0.0f, t, ldt);
    cpu_gemm(false, false, g->n_rows, out, g->rank, g->scale, t, ldt, g->B, out, 1.0f, Y + (size_t)g->row0 * out, out);
}

// Both halves of a segment in one chunk: the segment's T rows, still in L1, are expanded as soon
// as they are made, and the loop is one parallel region instead of two.
static void apply_chunk(void *c_, size_t lo, size_t hi) {
    const lora_t *c = c_;
    for (size_t s = lo; s < hi; s++) {
        const kern_lora_seg_t *g = &c->seg[s];
        if (g->n_rows < LORA_GEMM_MIN_ROWS) {
            shrink_chunk(c_, s, s + 1);
            expand_chunk(c_, s, s + 1);
        } else if (!lora_seg_alone(g, c->in, c->out)) {
            lora_seg_gemms(g, c->Y, c->out, c->T, c->ldt, c->X, c->in);
        }
    }
}

static void cpu_lora_apply(float *Y, int out, float *T, int ldt, const float *X, int in, const kern_lora_seg_t *seg,
                           int n_seg) {
    int rest = 0;
    for (int s = 0; s < n_seg; s++) {
        const kern_lora_seg_t *g = &seg[s];
        if (lora_seg_alone(g, in, out)) {
            lora_seg_gemms(g, Y, out, T, ldt, X, in);   // large enough to share: on the pool
        } else {
            rest++;
        }
    }
    if (!rest) return;
    // a few chunks of segments per thread: a chunk per one-row segment costs more in claiming
    // than the segment's arithmetic on a small model
    lora_t c = {.T = T, .Y = Y, .ldt = ldt, .in = in, .out = out, .X = X, .Tc = T, .seg = seg};
    kpool_for((size_t)n_seg, kpool_grain((size_t)n_seg, 2, 1), apply_chunk, &c);
}

static void cpu_lora_shrink(float *T, int ldt, const float *X, int in, const kern_lora_seg_t *seg, int n_seg) {
    int small = 0;
    for (int s = 0; s < n_seg; s++) {
        const kern_lora_seg_t *g = &seg[s];
        if (g->n_rows >= LORA_GEMM_MIN_ROWS)
            cpu_gemm(false, true, g->n_rows, g->rank, in, 1.0f, X + (size_t)g->row0 * in, in, g->A, in, 0.0f,
                     T + (size_t)g->row0 * ldt, ldt);
        else
            small++;
    }
    if (!small) return;
    lora_t c = {.T = T, .ldt = ldt, .X = X, .in = in, .seg = seg};
    kpool_for((size_t)n_seg, 1, shrink_chunk, &c);
}

static void cpu_lora_expand(float *Y, int out, const float *T, int ldt, const kern_lora_seg_t *seg, int n_seg) {
    int small = 0;
    for (int s = 0; s < n_seg; s++) {
        const kern_lora_seg_t *g = &seg[s];
        if (g->n_rows >= LORA_GEMM_MIN_ROWS)
            cpu_gemm(false, false, g->n_rows, out, g->rank, g->scale, T + (size_t)g->row0 * ldt, ldt, g->B, out, 1.0f,
                     Y + (size_t)g->row0 * out, out);
        else
            small++;
    }
    if (!small) return;
    lora_t c = {.Y = Y, .ldt = ldt, .out = out, .Tc = T, .seg = seg};
    kpool_for((size_t)n_seg, 1, expand_chunk, &c);
}

// --- losses ----------------------------------------------------------------------------------

typedef struct {
    float *logp, *entropy, *logits;
    const float *dlogp;
    const int32_t *target;
    int V;
    float invT;
} logp_t;

static void token_logprobs_chunk(void *c_, size_t lo, size_t hi) {
    const logp_t *c = c_;
    int V = c->V;
    float invT = c->invT;
    for (size_t r = lo; r < hi; r++) {
        const float *z = c->logits + r * (size_t)V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            if (z[j] * invT > mx) mx = z[j] * invT;
        double sum = 0.0, sz = 0.0;
        for (int j = 0; j < V; j++) {
            double e = exp((double)(z[j] * invT - mx));
            sum += e;
            sz += e * (double)(z[j] * invT - mx);
        }
        double lse = (double)mx + log(sum);
        c->logp[r] = (float)((double)(z[c->target[r]] * invT) - lse);
        // H = lse - E[z/T]
        if (c->entropy) c->entropy[r] = (float)(log(sum) - sz / sum);
    }
}

static void cpu_token_logprobs(float *logp, float *entropy, const float *logits, const int32_t *target, int n, int V,
                               float T) {
    if (T <= 0.0f) T = 1.0f;
    logp_t c = {.logp = logp, .entropy = entropy, .logits = (float *)logits, .target = target, .V = V, .invT = 1.0f / T};
    par_for(n > 0 ? (size_t)n : 0, 8, 2, token_logprobs_chunk, &c);
}

static void logprob_bwd_chunk(void *c_, size_t lo, size_t hi) {
    const logp_t *c = c_;
    int V = c->V;
    float invT = c->invT;
    for (size_t r = lo; r < hi; r++) {
        float *z = c->logits + r * (size_t)V;
        float g = c->dlogp[r];
        if (g == 0.0f) {
            memset(z, 0, sizeof(float) * V);
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            if (z[j] * invT > mx) mx = z[j] * invT;
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += exp((double)(z[j] * invT - mx));
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < V; j++) z[j] = -g * invT * expf(z[j] * invT - mx) * inv;
        z[c->target[r]] += g * invT;
    }
}

static void cpu_logprob_bwd(float *logits, const float *dlogp, const int32_t *target, int n, int V, float T) {
    if (T <= 0.0f) T = 1.0f;
    logp_t c = {.logits = logits, .dlogp = dlogp, .target = target, .V = V, .invT = 1.0f / T};
    par_for(n > 0 ? (size_t)n : 0, 8, 2, logprob_bwd_chunk, &c);
}

// --- sampling ----------------------------------------------------------------------------------
// The sample op: kernels_cpu_sample_row (cpu_host.c, one function for every variant and the host
// sampler) over rows.

typedef struct {
    int32_t *tokens;
    float *logprobs;
    const float *logits, *temperature, *top_p, *u;
    const int *top_k;
    int V;
} sample_t;

// A chunk of rows with its own scratch (about two chunks per thread: few allocations).
static void sample_chunk(void *c_, size_t lo, size_t hi) {
    const sample_t *c = c_;
    float *w = malloc(sizeof(float) * (size_t)c->V);
    int *idx = malloc(sizeof(int) * (size_t)c->V);
    if (!w || !idx) {
        fprintf(stderr, "FATAL out of memory at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
    for (size_t r = lo; r < hi; r++) {
        float lp;
        c->tokens[r] = kernels_cpu_sample_row(c->logits + r * (size_t)c->V, c->V, c->temperature[r], c->top_k[r],
                                              c->top_p[r], c->u[r], w, idx, &lp);
        if (c->logprobs) c->logprobs[r] = lp;
    }
    free(w);
    free(idx);
}

// Rows in parallel, each chunk with its own scratch: results do not depend on the thread count.
static void cpu_sample(int32_t *tokens, float *logprobs, const float *logits, int n, int V, const float *temperature,
                       const int *top_k, const float *top_p, const float *u) {
    if (n <= 0 || V <= 0) return;
    sample_t c = {tokens, logprobs, logits, temperature, top_p, u, top_k, V};
    kpool_for((size_t)n, kpool_grain((size_t)n, 2, 1), sample_chunk, &c);
}

// --- optimizer -------------------------------------------------------------------------------

typedef struct {
    float *p, *m, *v;
    const float *g;
    float lr, b1, b2, eps, wd, bc1, bc2, gscale;
} adamw_t;

static void adamw_chunk(void *c_, size_t lo, size_t hi) {
    const adamw_t *c = c_;
    float *p = c->p, *m = c->m, *v = c->v;
    const float *g = c->g;
    float lr = c->lr, b1 = c->b1, b2 = c->b2, eps = c->eps, wd = c->wd, bc1 = c->bc1, bc2 = c->bc2, gscale = c->gscale;
    for (size_t i = lo; i < hi; i++) {
        float gi = g[i] * gscale;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float mh = m[i] / bc1, vh = v[i] / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                      float wd, float bc1, float bc2, float gscale) {
    adamw_t c = {p, m, v, g, lr, b1, b2, eps, wd, bc1, bc2, gscale};
    par_for(n, PAR_ELEMS, PAR_ELEMS / 4, adamw_chunk, &c);
}

// The variant's tables (cpu_variants.h): every op but gemm_bf16w and gemm_parts is the same in
// all of avx512's.
#define CPU_OPS                              \
    .name = "cpu",                           \
    .alloc = cpu_alloc,                      \
    .free = cpu_free,                        \
    .to_dev = cpu_copy,                      \
    .to_host = cpu_copy,                     \
    .copy = cpu_copy,                        \
    .zero = cpu_zero,                        \
    .gemm = cpu_gemm,                        \
    .to_bf16 = cpu_to_bf16,                  \
    .from_bf16 = cpu_from_bf16,              \
    .axpy = cpu_axpy,                        \
    .scale = cpu_scale,                      \
    .sumsq = cpu_sumsq,                      \
    .all_finite = cpu_all_finite,            \
    .scatter_rows = cpu_scatter_rows,        \
    .embed = cpu_embed,                      \
    .embed_bwd = cpu_embed_bwd,              \
    .rmsnorm = cpu_rmsnorm,                  \
    .rmsnorm_bwd = cpu_rmsnorm_bwd,          \
    .add_bias = cpu_add_bias,                \
    .bias_bwd = cpu_bias_bwd,                \
    .rope = cpu_rope,                        \
    .glu = cpu_glu,                          \
    .glu_bwd = cpu_glu_bwd,                  \
    .attn_paged = cpu_attn_paged,            \
    .attn_fwd = cpu_attn_fwd,                \
    .attn_bwd = cpu_attn_bwd,                \
    .lora_shrink = cpu_lora_shrink,          \
    .lora_expand = cpu_lora_expand,          \
    .lora_apply = cpu_lora_apply,            \
    .token_logprobs = cpu_token_logprobs,    \
    .logprob_bwd = cpu_logprob_bwd,          \
    .sample = cpu_sample,                    \
    .adamw = cpu_adamw,

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
void kern_cpu_exp_avx512(float *y, const float *x, int n) { exp_rows(y, x, n); }
#elif KERN_CPU_ISA == KERN_CPU_ISA_AVX2
void kern_cpu_exp_avx2(float *y, const float *x, int n) { exp_rows(y, x, n); }
#else
void kern_cpu_exp_scalar(float *y, const float *x, int n) { exp_rows(y, x, n); }
#endif

#if KERN_CPU_ISA == KERN_CPU_ISA_AVX512
const kernels_t kernels_cpu_avx512 = {CPU_OPS .gemm_bf16w = cpu_gemm_bf16w, .gemm_parts = cpu_gemm_parts};
const kernels_t kernels_cpu_avx512_bf16 = {CPU_OPS .gemm_bf16w = cpu_gemm_bf16w_dp, .gemm_parts = cpu_gemm_parts_dp};
const kernels_t kernels_cpu_amx = {CPU_OPS .gemm_bf16w = cpu_gemm_bf16w_amx, .gemm_parts = cpu_gemm_parts_amx};
#elif KERN_CPU_ISA == KERN_CPU_ISA_AVX2
const kernels_t kernels_cpu_avx2 = {CPU_OPS .gemm_bf16w = cpu_gemm_bf16w, .gemm_parts = cpu_gemm_parts};
#else
const kernels_t kernels_cpu_scalar = {CPU_OPS .gemm_bf16w = cpu_gemm_bf16w, .gemm_parts = cpu_gemm_parts};
#endif

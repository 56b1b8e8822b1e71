// cpu.c - the CPU compute backend: OpenBLAS sgemm for dense products, C loops (vectorised by
// the compiler, threaded with OpenMP) for everything else. This is the reference backend:
// every other backend is tested against these functions.
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/cpu/pool.h"

// --- OpenBLAS's kernel set -------------------------------------------------------------------
// OpenBLAS picks its kernels from the CPU's family and model when the library loads. A model its
// table does not know yet (0.3.21, Debian 12's, on Emerald Rapids: family 6 model 207) falls back
// to "Prescott", the SSE3 kernels: sgemm runs at a sixth of the AVX-512 kernels' speed (26 vs 168
// GFLOP/s on 2 threads here). The kernels are chosen before main and are fixed after that, so when
// OpenBLAS reports a pre-AVX2 kernel set on a CPU with AVX2/FMA or AVX-512, the process sets
// OPENBLAS_CORETYPE to the set the CPU supports and executes itself again, once, before any of
// its code runs. OPENBLAS_CORETYPE given by the user is left as it is; under valgrind (which
// reports its own CPU) nothing is done.
extern char *openblas_get_corename(void) __attribute__((weak));

static char blas_core_note[160];

static bool blas_core_is_legacy(const char *name) {
    static const char *const legacy[] = {"Prescott", "Katmai",  "Coppermine", "Northwood", "Banias",  "Core2",
                                         "Penryn",   "Dunnington", "Nehalem", "Atom",      "Sandybridge", "Unknown"};
    for (size_t i = 0; i < sizeof legacy / sizeof *legacy; i++)
        if (!strcasecmp(name, legacy[i])) return true;
    return false;
}

__attribute__((constructor)) static void blas_core_check(int argc, char **argv, char **envp) {
    (void)argc;
    (void)envp;
    const char *fixed_from = getenv("MARLAAS_BLAS_DETECTED");
    if (fixed_from && openblas_get_corename) {   // the second start: say what was done
        snprintf(blas_core_note, sizeof blas_core_note, "%s (OpenBLAS detected %s on this CPU; set by OPENBLAS_CORETYPE)",
                 openblas_get_corename(), fixed_from);
        unsetenv("MARLAAS_BLAS_DETECTED");   // children choose for themselves
        return;
    }
    if (!openblas_get_corename || getenv("OPENBLAS_CORETYPE") || !argv || !argv[0]) return;
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "vgpreload")) return;
    const char *core = openblas_get_corename();
    if (!core || !blas_core_is_legacy(core)) return;
    __builtin_cpu_init();
    const char *want = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
    if (!want) return;
    char detected[64];
    snprintf(detected, sizeof detected, "%s", core);
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("MARLAAS_BLAS_DETECTED", detected, 1);
    execv("/proc/self/exe", argv);
    // Not possible (no /proc): run on, with the slow kernels, and say so.
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("MARLAAS_BLAS_DETECTED");
    snprintf(blas_core_note, sizeof blas_core_note, "%s (slow: set OPENBLAS_CORETYPE=%s; re-execution failed)", core, want);
}

const char *kernels_cpu_blas_core(void) {
    if (blas_core_note[0]) return blas_core_note;
    if (!openblas_get_corename) return "not OpenBLAS";
    return openblas_get_corename();
}

// --- memory --------------------------------------------------------------------------------

static void *cpu_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (!p) {
        fprintf(stderr, "FATAL out of memory allocating %zu bytes at %s:%d\n", bytes, __FILE__, __LINE__);
        abort();
    }
    memset(p, 0, n);
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
typedef struct {
    bool ta, tb, by_cols;
    int M, N, K, blk, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
} sgemm_t;

static void sgemm_chunk(void *c_, size_t lo, size_t hi) {
    const sgemm_t *c = c_;
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
    if (T == 1 || (double)M * N * K < SGEMM_POOL_MIN_MACS || blk >= len) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                    lda, B, ldb, beta, C, ldc);
        return;
    }
    sgemm_t c = {.ta = ta, .tb = tb, .by_cols = by_cols, .M = M, .N = N, .K = K, .blk = blk, .lda = lda, .ldb = ldb,
                 .ldc = ldc, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C};
    kpool_for((size_t)((len + blk - 1) / blk), 1, sgemm_chunk, &c);
}

static void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        // BLAS leaves C untouched for K = 0 only when beta = 1; make the semantics explicit.
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    // A few rows against a weight matrix (decode at small batch): sgemm would pack the whole
    // weight matrix for every call; matrix-vector products read it once per row instead.
    if (M <= 2 && !ta) {
        for (int i = 0; i < M; i++)
            cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, tb ? N : K, tb ? K : N, alpha, B, ldb,
                        A + (size_t)i * lda, 1, beta, C + (size_t)i * ldc, 1);
        return;
    }
    sgemm_pool(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

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

static void cpu_to_bf16(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

static void cpu_from_bf16(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

// The fp32 copy of a block of W rows (gemm_bf16w): one grow-only buffer per calling thread,
// freed when the thread exits (a pthread key's destructor; the main thread's stays reachable).
static pthread_key_t bf16_buf_key;
static pthread_once_t bf16_buf_once = PTHREAD_ONCE_INIT;
static _Thread_local float *bf16_buf;
static _Thread_local size_t bf16_buf_cap;

static void bf16_buf_key_init(void) {
    if (pthread_key_create(&bf16_buf_key, free) != 0) {
        fprintf(stderr, "FATAL pthread_key_create failed at %s:%d\n", __FILE__, __LINE__);
        abort();
    }
}

static float *bf16_scratch(size_t n) {
    if (n > bf16_buf_cap) {
        pthread_once(&bf16_buf_once, bf16_buf_key_init);
        free(bf16_buf);
        bf16_buf = NULL;
        bf16_buf_cap = 0;
        size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
        bf16_buf = aligned_alloc(64, bytes);
        if (!bf16_buf) {
            fprintf(stderr, "FATAL out of memory allocating %zu bytes at %s:%d\n", bytes, __FILE__, __LINE__);
            abort();
        }
        bf16_buf_cap = n;
        pthread_setspecific(bf16_buf_key, bf16_buf);
    }
    return bf16_buf;
}

static inline __attribute__((always_inline)) float dot_bf16(const float *restrict x, const uint16_t *restrict w,
                                                            int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += x[i] * bf16_to_f32(w[i]);
    return s;
}

// trans_w (C = alpha X W^T + beta C, W (N,K)): up to BF16_SMALL_M rows of X (decode) take one
// pass over W converting on the fly (half the bytes of an fp32 W; measured faster than sgemm on
// an fp32 W up to ~8 rows), threads over W's rows. More rows: W converted block by block (at
// least BF16_MIN_ROWS rows, about BF16_BLOCK_FLOATS floats, 4 MiB) into the calling thread's
// buffer, each block multiplied by OpenBLAS sgemm. Extra cost against sgemm on an fp32 W: one
// read of W and one write of its fp32 copy per call, O(N K) against the product's O(M N K)
// (measured, 1 thread, 512x896x896: ~0.2 ms, ~3% of the product), plus the thread's buffer.
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

// buf (rows, cols) contiguous = fp32 of W's rows r0 .. r0+rows-1 (row stride ldw).
static void bf16_rows_to_f32(float *buf, const uint16_t *W, int ldw, int r0, int rows, int cols) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols > 65536)
    for (int j = 0; j < rows; j++) {
        const uint16_t *wj = W + (size_t)(r0 + j) * ldw;
        float *bj = buf + (size_t)j * cols;
        for (int k = 0; k < cols; k++) bj[k] = bf16_to_f32(wj[k]);
    }
}

static void cpu_gemm_bf16w(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                           const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (!trans_w) {
        int kb = bf16_block_rows(N, K);
        float *buf = bf16_scratch((size_t)kb * N);
        for (int k0 = 0; k0 < K; k0 += kb) {
            int rows = K - k0 < kb ? K - k0 : kb;
            bf16_rows_to_f32(buf, W, ldw, k0, rows, N);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, rows, alpha, X + k0, ldx, buf, N,
                        k0 == 0 ? beta : 1.0f, C, ldc);
        }
        return;
    }
    if (M <= BF16_SMALL_M) {
#pragma omp parallel for schedule(static) if ((size_t)N * K > 65536)
        for (int j = 0; j < N; j++) {
            const uint16_t *wj = W + (size_t)j * ldw;
            for (int i = 0; i < M; i++) {
                float s = alpha * dot_bf16(X + (size_t)i * ldx, wj, K);
                float *c = C + (size_t)i * ldc + j;
                *c = beta == 0.0f ? s : s + beta * *c;
            }
        }
        return;
    }
    int nb = bf16_block_rows(K, N);
    float *buf = bf16_scratch((size_t)nb * K);
    for (int j0 = 0; j0 < N; j0 += nb) {
        int rows = N - j0 < nb ? N - j0 : nb;
        bf16_rows_to_f32(buf, W, ldw, j0, rows, K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, rows, K, alpha, X, ldx, buf, K, beta, C + j0, ldc);
    }
}

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

// `omp simd reduction` lets the compiler split the sum over vector lanes (plain C would force a
// serial chain of dependent adds). The order is fixed for a build, so results stay deterministic
// and the inference and training paths, which share this function, agree.
static inline __attribute__((always_inline)) float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

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

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

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

static void glu_silu_chunk(void *c_, size_t lo, size_t hi) {
    const glu_t *c = c_;
    for (size_t i = lo; i < hi; i++) c->h[i] = silu(c->g[i]) * c->u[i];
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
    for (size_t i = lo; i < hi; i++) {
        float s = 1.0f / (1.0f + expf(-c->g[i]));
        float sg = c->g[i] * s;
        float d = c->dh[i];
        c->du[i] = d * sg;
        c->dg[i] = d * c->u[i] * (s + sg * (1.0f - s));
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

// One query row against ctx key/value rows given by pointer arrays: scores, softmax (two
// passes over a scratch of ctx floats), weighted sum of values. Returns the log-sum-exp of the
// scaled scores (saved for the backward pass). restrict lets the value loop vectorise.
static float attn_row(float *restrict out, const float *restrict q, const float *const *restrict kp,
                      const float *const *restrict vp, int ctx, int hd, float scale, float *restrict scores) {
    float mx = -INFINITY;
    for (int p = 0; p < ctx; p++) {
        float s = dot(q, kp[p], hd) * scale;
        scores[p] = s;
        mx = s > mx ? s : mx;
    }
    float sum = 0.0f;
    for (int p = 0; p < ctx; p++) {
        scores[p] = expf(scores[p] - mx);
        sum += scores[p];
    }
    float inv = 1.0f / sum;
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

static void attn_paged_chunk(void *c_, size_t lo, size_t hi) {
    const attn_t *c = c_;
    const kern_paged_attn_t *a = c->pa;
    int H = a->n_heads, hd = a->head_dim, grp = a->n_heads / a->n_kv_heads, kvd = a->n_kv_heads * hd;
    int bs = a->block_size;
    attn_scratch_t sc = scratch_new(a->max_ctx);
    for (size_t i = lo; i < hi; i++) {
        const int *tab = a->tables[a->seq_of[i]];
        int ctx = a->pos[i] + 1;
        for (int kh = 0; kh < a->n_kv_heads; kh++) {
            for (int p = 0; p < ctx; p++) {
                size_t off = (size_t)tab[p / bs] * a->block_stride + (size_t)(p % bs) * kvd + (size_t)kh * hd;
                sc.kp[p] = a->k_base + off;
                sc.vp[p] = a->v_base + off;
            }
            for (int h = kh * grp; h < (kh + 1) * grp; h++)
                attn_row(c->out + (i * H + h) * hd, c->q + (i * H + h) * hd, sc.kp, sc.vp, ctx, hd, c->scale,
                         sc.scores);
        }
    }
    scratch_free(&sc);
}

static void cpu_attn_paged(float *out, const float *q, const kern_paged_attn_t *a) {
    attn_t c = {.out = out, .q = q, .pa = a, .scale = 1.0f / sqrtf((float)a->head_dim)};
    if (a->n_tokens > 0) kpool_for((size_t)a->n_tokens, 1, attn_paged_chunk, &c);
}

static void attn_fwd_chunk(void *c_, size_t lo, size_t hi) {
    const attn_t *c = c_;
    const kern_packed_attn_t *a = c->a;
    int H = a->n_heads, hd = a->head_dim, grp = a->n_heads / a->n_kv_heads, kvd = a->n_kv_heads * hd;
    bool pre = a->pre_start && a->pre_len;
    const float *k = c->k, *v = c->v;
    attn_scratch_t sc = scratch_new(a->max_len);
    for (size_t s = lo; s < hi; s++) {
        // context = the prefix rows (if any), then the sequence's own rows
        int np = pre ? a->pre_len[s] : 0;
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
            for (int t = 0; t < a->len[s]; t++) {
                size_t i = (size_t)a->start[s] + t;
                for (int h = kh * grp; h < (kh + 1) * grp; h++)
                    c->lse[i * H + h] = attn_row(c->out + (i * H + h) * hd, c->q + (i * H + h) * hd, sc.kp, sc.vp,
                                                 np + t + 1, hd, c->scale, sc.scores);
            }
        }
    }
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
// One (query t, key j) term of it, for one head; qh, doh, dqh belong to t, kj, vj, dkj, dvj to j.
static inline __attribute__((always_inline)) void attn_bwd_pair(float *restrict dqh, float *restrict dkj,
                                                                float *restrict dvj, const float *qh,
                                                                const float *doh, const float *kj, const float *vj,
                                                                float L, float D, float scale, int hd) {
    float P = expf(dot(qh, kj, hd) * scale - L);
    float dP = dot(doh, vj, hd);
    float dS = P * (dP - D) * scale;
    for (int d = 0; d < hd; d++) {
        dqh[d] += dS * kj[d];
        dkj[d] += dS * qh[d];
        dvj[d] += P * doh[d];
    }
}

// Backward of sequence s for kv head kh when s has pre_len[s] prefix rows: its queries' dq, and
// dk/dv of its own rows and of its prefix rows (accumulated).
static void attn_bwd_prefixed(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                              const float *q, const float *k, const float *v, const kern_packed_attn_t *a, int s,
                              int kh) {
    int H = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = H / KV, kvd = KV * hd;
    float scale = 1.0f / sqrtf((float)hd);
    size_t base = (size_t)a->start[s], pbase = (size_t)a->pre_start[s], koff = (size_t)kh * hd;
    int np = a->pre_len[s];
    for (int g = 0; g < grp; g++) {
        int h = kh * grp + g;
        for (int t = 0; t < a->len[s]; t++) {
            size_t i = base + t;
            const float *qh = q + (i * H + h) * hd, *doh = dout + (i * H + h) * hd, *oh = out + (i * H + h) * hd;
            float *dqh = dq + (i * H + h) * hd;
            float L = lse[i * H + h];
            float D = dot(doh, oh, hd);
            for (int j = 0; j < np; j++) {
                size_t r = (pbase + j) * kvd + koff;
                attn_bwd_pair(dqh, dk + r, dv + r, qh, doh, k + r, v + r, L, D, scale, hd);
            }
            for (int j = 0; j <= t; j++) {
                size_t r = (base + j) * kvd + koff;
                attn_bwd_pair(dqh, dk + r, dv + r, qh, doh, k + r, v + r, L, D, scale, hd);
            }
        }
    }
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
            attn_bwd_prefixed(c->dq, c->dk, c->dv, c->dout, c->out, c->lse, c->q, c->k, c->v, c->a, c->order[m], kh);
    }
}

// Items s * KV + kh: sequence s, kv head kh.
static void attn_bwd_chunk(void *c_, size_t lo, size_t hi) {
    const attn_bwd_t *c = c_;
    const kern_packed_attn_t *a = c->a;
    int H = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, grp = H / KV, kvd = KV * hd;
    const float *q = c->q, *k = c->k, *v = c->v, *dout = c->dout, *out = c->out, *lse = c->lse;
    float *dq = c->dq, *dk = c->dk, *dv = c->dv, scale = c->scale;
    for (size_t it = lo; it < hi; it++) {
        int s = (int)(it / (size_t)KV), kh = (int)(it % (size_t)KV);
        size_t base = (size_t)a->start[s];
        size_t koff = (size_t)kh * hd;
        for (int g = 0; g < grp; g++) {
            int h = kh * grp + g;
            for (int t = 0; t < a->len[s]; t++) {
                size_t i = base + t;
                const float *qh = q + (i * H + h) * hd, *doh = dout + (i * H + h) * hd, *oh = out + (i * H + h) * hd;
                float *dqh = dq + (i * H + h) * hd;
                float L = lse[i * H + h];
                float D = dot(doh, oh, hd);
                for (int j = 0; j <= t; j++) {
                    const float *kj = k + (base + j) * kvd + koff, *vj = v + (base + j) * kvd + koff;
                    float P = expf(dot(qh, kj, hd) * scale - L);
                    float dP = dot(doh, vj, hd);
                    float dS = P * (dP - D) * scale;
                    float *dkj = dk + (base + j) * kvd + koff, *dvj = dv + (base + j) * kvd + koff;
                    for (int d = 0; d < hd; d++) {
                        dqh[d] += dS * kj[d];
                        dkj[d] += dS * qh[d];
                        dvj[d] += P * doh[d];
                    }
                }
            }
        }
    }
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

// The segments of fewer than LORA_GEMM_MIN_ROWS rows, one chunk per segment.
static void shrink_chunk(void *c_, size_t lo, size_t hi) {
    const lora_t *c = c_;
    for (size_t s = lo; s < hi; s++) {
        const kern_lora_seg_t *g = &c->seg[s];
        if (g->n_rows >= LORA_GEMM_MIN_ROWS) continue;
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
        for (int r = g->row0; r < g->row0 + g->n_rows; r++) {
            const float *tr = c->Tc + (size_t)r * c->ldt;
            float *restrict y = c->Y + (size_t)r * out;
            for (int j = 0; j < g->rank; j++) {
                const float *restrict b = g->B + (size_t)j * out;
                float cj = g->scale * tr[j];
#pragma omp simd
                for (int o = 0; o < out; o++) y[o] += cj * b[o];
            }
        }
    }
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
// The sampler of the whole project: common/engine/sampler.c's sampler_sample draws its uniform
// number from the sequence's RNG and calls kernels_cpu_sample_row; the sample op runs it over
// rows with the caller's uniform numbers. The GPU backend rebuilds the same candidate order (the
// same heaps) for its inverse-CDF draw; tests/unit/test_kernel_ops.c and tests/gpu check both.

// Fills w[j] = exp(z_j/T - m) (when w is not NULL) and returns log sum_j exp(z_j/T - m) + m;
// *wsum receives the sum of the stored float weights.
double kernels_cpu_tempered_lse(const float *logits, int vocab, double temp, float *w, double *wsum) {
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

// Strict total order on tokens: higher weight first, lower id first on equal weight.
static bool smp_better(const float *w, int a, int b) { return w[a] > w[b] || (w[a] == w[b] && a < b); }

static bool smp_above(const float *w, int a, int b, bool best_root) {
    return best_root ? smp_better(w, a, b) : smp_better(w, b, a);
}

static void smp_sift_down(const float *w, int *h, int n, int i, bool best_root) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && smp_above(w, h[c + 1], h[c], best_root)) c++;
        if (!smp_above(w, h[c], h[i], best_root)) return;
        int t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

static void smp_heapify(const float *w, int *h, int n, bool best_root) {
    for (int i = n / 2 - 1; i >= 0; i--) smp_sift_down(w, h, n, i, best_root);
}

// Leaves the k best tokens of 0..vocab-1 in h[0..k) (a heap, worst at the root).
static void smp_top_k(const float *w, int vocab, int k, int *h) {
    for (int j = 0; j < k; j++) h[j] = j;
    smp_heapify(w, h, k, false);
    for (int j = k; j < vocab; j++) {
        if (smp_better(w, j, h[0])) {
            h[0] = j;
            smp_sift_down(w, h, k, 0, false);
        }
    }
}

// The smallest best-first prefix of the n candidates in h whose weight reaches top_p * mass ends
// up in h[*first..n), worst first; returns its weight.
static double smp_top_p(const float *w, int *h, int n, double mass, float top_p, int *first) {
    double target = (double)top_p * mass;
    double cum = 0.0;
    smp_heapify(w, h, n, true);
    int m = n;
    while (m > 0) {
        int best = h[0];
        h[0] = h[m - 1];
        h[m - 1] = best;
        m--;
        smp_sift_down(w, h, m, 0, true);
        cum += (double)w[best];
        if (cum >= target) break;
    }
    *first = m;
    return cum;
}

static int smp_argmax(const float *logits, int vocab) {
    int best = 0;
    for (int j = 1; j < vocab; j++)
        if (logits[j] > logits[best] || (isnan(logits[best]) && !isnan(logits[j]))) best = j;
    return best;
}

// Inverse-CDF draw with the uniform u over the candidates ids[0..n) (ids NULL: 0..n-1) of total
// weight mass; zero weights are never chosen; past the end (rounding), the last positive one.
static int smp_draw(const float *w, const int *ids, int n, double mass, float u) {
    double target = (double)u * mass;
    double cum = 0.0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        int id = ids ? ids[i] : i;
        if (!(w[id] > 0)) continue;
        cum += (double)w[id];
        last = id;
        if (cum > target) return id;
    }
    return last >= 0 ? last : (ids ? ids[0] : 0);
}

// One row; w (V floats) and idx (V ints) are scratch.
int32_t kernels_cpu_sample_row(const float *logits, int vocab, float temperature, int top_k, float top_p, float u,
                               float *w, int *idx, float *logprob) {
    if (!(temperature > 0)) {
        int tok = smp_argmax(logits, vocab);
        double lse = kernels_cpu_tempered_lse(logits, vocab, 1.0, NULL, NULL);
        *logprob = (float)((double)logits[tok] / 1.0 - lse);
        return tok;
    }
    double temp = (double)temperature;
    double mass;
    double lse = kernels_cpu_tempered_lse(logits, vocab, temp, w, &mass);
    const int *ids = NULL;
    int n = vocab;
    if (top_k > 0 && top_k < vocab) {
        smp_top_k(w, vocab, top_k, idx);
        ids = idx;
        n = top_k;
        mass = 0.0;
        for (int i = 0; i < n; i++) mass += (double)w[ids[i]];
    }
    if (top_p < 1.0f) {
        if (!ids) {
            for (int j = 0; j < vocab; j++) idx[j] = j;
            ids = idx;
        }
        int first;
        mass = smp_top_p(w, idx, n, mass, top_p, &first);
        ids = idx + first;
        n -= first;
    }
    int tok = smp_draw(w, ids, n, mass, u);
    *logprob = (float)((double)logits[tok] / temp - lse);
    return tok;
}

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

static const kernels_t cpu_kernels = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_dev = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .gemm = cpu_gemm,
    .gemm_bf16w = cpu_gemm_bf16w,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .all_finite = cpu_all_finite,
    .scatter_rows = cpu_scatter_rows,
    .embed = cpu_embed,
    .embed_bwd = cpu_embed_bwd,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .add_bias = cpu_add_bias,
    .bias_bwd = cpu_bias_bwd,
    .rope = cpu_rope,
    .glu = cpu_glu,
    .glu_bwd = cpu_glu_bwd,
    .attn_paged = cpu_attn_paged,
    .attn_fwd = cpu_attn_fwd,
    .attn_bwd = cpu_attn_bwd,
    .lora_shrink = cpu_lora_shrink,
    .lora_expand = cpu_lora_expand,
    .token_logprobs = cpu_token_logprobs,
    .logprob_bwd = cpu_logprob_bwd,
    .sample = cpu_sample,
    .adamw = cpu_adamw,
};

const kernels_t *kernels_cpu(void) { return &cpu_kernels; }

// test_kernels.c - the CUDA backend (kernels/cuda) against the CPU reference (kernels/cpu): every
// op of the table on random inputs, odd sizes included. Built by `make CUDA=1` as
// build/cuda/bin/marlaas-gpu-tests.
//
// Without a visible GPU every test is skipped (the suite's init skips it, with the reason), and
// a line before the run says so: the tests never pass vacuously and never fail for want of a GPU.
//
// Tolerances: fp32 on both sides, with different summation orders (and FMA contraction and
// CUDA's expf, <= 2 ulp, on the GPU), so each comparison allows |cuda - cpu| <= atol + rtol * |cpu|
// with the bounds stated at each test; they are about 10-100x the differences expected from
// rounding alone, and far below what an indexing or semantics bug produces (O(0.01..1)).
// cuBLAS runs with CUBLAS_COMPUTE_32F (no TF32): a TF32 gemm would fail the gemm test.
//
// On a machine without a GPU, tests/gpu/emu/run.sh runs these same tests against a CPU emulation
// of the backend (the kernels' logic only; see tests/gpu/emu/emu_rt.h).
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/cuda.h"
#include "tests/unit/testbits.h"

static const kernels_t *G;   // cuda
static const kernels_t *C;   // cpu (reference)

// --- buffers: everything allocated by a test is freed by the suite's fini -----------------------

#define MAX_BUFS 4096
static void *dev_bufs[MAX_BUFS], *host_bufs[MAX_BUFS];
static int n_dev_bufs, n_host_bufs;

static void setup(void) {
    char why[512];
    setenv("MARLAAS_CUDA_SYNC", "1", 1);   // a faulting kernel is named at its launch
    if (!kernels_cuda_available(why, sizeof why)) cr_skip_test("CUDA backend test skipped: %s", why);
    G = kernels_cuda();
    C = kernels_cpu();
}

static void teardown(void) {
    for (int i = 0; i < n_dev_bufs; i++) G->free(dev_bufs[i]);
    for (int i = 0; i < n_host_bufs; i++) free(host_bufs[i]);
    n_dev_bufs = n_host_bufs = 0;
}

TestSuite(cuda, .init = setup, .fini = teardown, .timeout = 300);

static void *hmem(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    cr_assert(p != NULL && n_host_bufs < MAX_BUFS, "out of host memory or buffer slots");
    host_bufs[n_host_bufs++] = p;
    return p;
}

static float *hbuf(size_t n) { return hmem(sizeof(float) * n); }
static int *ibuf(size_t n) { return hmem(sizeof(int) * n); }

static void *dmem(size_t bytes) {
    cr_assert(n_dev_bufs < MAX_BUFS, "out of buffer slots");
    void *p = G->alloc(bytes);
    cr_assert(p != NULL, "alloc returned NULL");
    dev_bufs[n_dev_bufs++] = p;
    return p;
}

// A device copy of n host floats.
static float *dcopy(const float *h, size_t n) {
    float *d = dmem(sizeof(float) * n);
    G->to_dev(d, h, sizeof(float) * n);
    return d;
}

// A host copy of n device floats.
static float *hback(const float *d, size_t n) {
    float *h = hbuf(n);
    G->to_host(h, d, sizeof(float) * n);
    return h;
}

// --- random numbers (splitmix64: fixed seeds, the same inputs every run) ----------------------------

static uint64_t rng_state;
static void seed(uint64_t s) { rng_state = s; }
static uint64_t next64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float unif(float lo, float hi) { return lo + (hi - lo) * (float)((next64() >> 40) * (1.0 / 16777216.0)); }
static int irand(int n) { return (int)(next64() % (uint64_t)n); }

static float *hrand(size_t n, float lo, float hi) {
    float *p = hbuf(n);
    for (size_t i = 0; i < n; i++) p[i] = unif(lo, hi);
    return p;
}

// --- comparison ------------------------------------------------------------------------------------

// |got - want| <= atol + rtol * |want| for every element (NaN never passes).
static void expect_close(const char *what, const float *got, const float *want, size_t n, double atol, double rtol) {
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]), lim = atol + rtol * fabs((double)want[i]);
        if (!(d <= lim))
            cr_assert_fail("%s: element %zu of %zu: cuda %.9g, cpu %.9g (|diff| %.3g > %.3g = atol %.1g + rtol %.1g * |cpu|)",
                           what, i, n, got[i], want[i], d, lim, atol, rtol);
    }
}

static void expect_equal(const char *what, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            cr_assert_fail("%s: element %zu of %zu: cuda %.9g, cpu %.9g (expected bit-identical)", what, i, n, got[i],
                           want[i]);
}

// --- report: one clear line before and after the run ---------------------------------------------------

// Asks a child process whether a GPU is usable: this (runner) process must not initialise CUDA,
// because Criterion forks the tests from it and CUDA does not survive a fork.
static int probe_gpu(char *why, size_t n) {
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(why, n, "pipe failed");
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "fork failed");
        close(fd[0]);
        close(fd[1]);
        return 0;
    }
    if (pid == 0) {
        close(fd[0]);
        char buf[600];
        char w[512];
        int ok = kernels_cuda_available(w, sizeof w);
        int len = snprintf(buf, sizeof buf, "%d%s", ok, w);
        ssize_t wr = write(fd[1], buf, (size_t)len + 1);
        (void)wr;
        _exit(0);
    }
    close(fd[1]);
    char buf[600];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    buf[got] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (got == 0) {
        snprintf(why, n, "the GPU probe process died (status %d)", st);
        return 0;
    }
    size_t len = strlen(buf + 1);
    if (len >= n) len = n - 1;
    memcpy(why, buf + 1, len);
    why[len] = '\0';
    return buf[0] == '1';
}

ReportHook(PRE_ALL)(struct criterion_test_set *set) {
    (void)set;
    char why[512];
    if (probe_gpu(why, sizeof why))
        fprintf(stderr, "marlaas-gpu-tests: a CUDA device is visible: comparing the CUDA backend with the CPU backend\n");
    else
        fprintf(stderr, "marlaas-gpu-tests: SKIPPED: %s; every CUDA backend test is skipped (nothing was tested)\n", why);
}

ReportHook(POST_ALL)(struct criterion_global_stats *st) {
    fprintf(stderr, "marlaas-gpu-tests: %zu tests: %zu passed, %zu failed, %zu crashed, %zu skipped\n", st->nb_tests,
            st->tests_passed, st->tests_failed, st->tests_crashed, st->tests_skipped);
}

// --- memory --------------------------------------------------------------------------------------------

// Every entry of the table is set.
Test(cuda, table_complete) {
    cr_assert_str_eq(G->name, "cuda");
    const void *fns[] = {
        (const void *)G->alloc,       (const void *)G->free,          (const void *)G->to_dev,
        (const void *)G->to_host,     (const void *)G->copy,          (const void *)G->zero,
        (const void *)G->gemm,        (const void *)G->axpy,          (const void *)G->scale,
        (const void *)G->sumsq,       (const void *)G->all_finite,    (const void *)G->embed,
        (const void *)G->embed_bwd,   (const void *)G->rmsnorm,       (const void *)G->rmsnorm_bwd,
        (const void *)G->add_bias,    (const void *)G->bias_bwd,      (const void *)G->rope,
        (const void *)G->glu,         (const void *)G->glu_bwd,       (const void *)G->attn_paged,
        (const void *)G->attn_fwd,    (const void *)G->attn_bwd,      (const void *)G->lora_shrink,
        (const void *)G->lora_expand, (const void *)G->token_logprobs, (const void *)G->logprob_bwd,
        (const void *)G->adamw,       (const void *)G->gemm_bf16w,    (const void *)G->to_bf16,
        (const void *)G->from_bf16,   (const void *)G->sample,        (const void *)G->scatter_rows,
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) cr_assert(fns[i] != NULL, "table entry %zu is NULL", i);
    cr_assert_eq(sizeof(kernels_t), sizeof(const char *) + sizeof fns, "kernels_t gained an entry this test does not list");
}

// Exact: alloc is zero-filled; to_dev/to_host/copy/zero move bytes.
Test(cuda, memory) {
    size_t n = 100003;
    float *d = dmem(sizeof(float) * n);
    float *h = hback(d, n), *zero = hbuf(n);
    expect_equal("alloc is zero-filled", h, zero, n);
    void *d0 = dmem(0);   // a zero-byte allocation is a valid pointer, as on the CPU
    cr_assert(d0 != NULL);

    seed(1);
    float *src = hrand(n, -3.0f, 3.0f);
    G->to_dev(d, src, sizeof(float) * n);
    expect_equal("to_dev/to_host round trip", hback(d, n), src, n);

    float *d2 = dmem(sizeof(float) * n);
    G->copy(d2 + 7, d + 3, sizeof(float) * 1000);
    float *want = hbuf(n);
    memcpy(want + 7, src + 3, sizeof(float) * 1000);
    expect_equal("copy", hback(d2, n), want, n);

    G->zero(d + 11, sizeof(float) * 500);
    memset(src + 11, 0, sizeof(float) * 500);
    expect_equal("zero", hback(d, n), src, n);
    G->copy(d, d, sizeof(float) * n);   // same pointer: nothing happens
    G->zero(d, 0);
    G->copy(d2, d, 0);
    expect_equal("empty copy/zero", hback(d, n), src, n);
}

// --- dense ---------------------------------------------------------------------------------------------

// Tolerance: atol 1e-4, rtol 1e-4. Inputs in [-1, 1], K <= 129: the two fp32 sums (cuBLAS vs
// OpenBLAS, different blocking) differ by ~1e-6 typically; a wrong transpose/leading dimension
// gives O(0.1); TF32 (10-bit mantissa) would give ~1e-3.
Test(cuda, gemm) {
    static const int sizes[] = {1, 3, 17, 64, 129};
    seed(2);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int mi = 0; mi < 5; mi++)
                for (int ni = 0; ni < 5; ni++)
                    for (int ki = 0; ki < 5; ki++) {
                        int M = sizes[mi], N = sizes[ni], K = sizes[ki];
                        // op(A) is (M,K): A is (K,M) when transposed; leading dimensions padded
                        int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                        int lda = ac + 3, ldb = bc + 1, ldc = N + 2;
                        float alpha = 0.7f, beta = (mi + ni + ki) % 2 ? 0.3f : 0.0f;
                        float *A = hrand((size_t)ar * lda, -1, 1), *B = hrand((size_t)br * ldb, -1, 1);
                        float *Cc = hrand((size_t)M * ldc, -1, 1);
                        float *dA = dcopy(A, (size_t)ar * lda), *dB = dcopy(B, (size_t)br * ldb),
                              *dC = dcopy(Cc, (size_t)M * ldc);
                        C->gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cc, ldc);
                        G->gemm(ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc);
                        char what[96];
                        snprintf(what, sizeof what, "gemm ta=%d tb=%d M=%d N=%d K=%d beta=%g", ta, tb, M, N, K, beta);
                        expect_close(what, hback(dC, (size_t)M * ldc), Cc, (size_t)M * ldc, 1e-4, 1e-4);
                        teardown();   // keep the device footprint small
                    }
}

// K = 0: C = beta * C (0 when beta = 0). Exact.
Test(cuda, gemm_k0) {
    seed(3);
    for (int b = 0; b < 2; b++) {
        float beta = b ? 0.5f : 0.0f;
        int M = 5, N = 7, ldc = 9;
        float *Cc = hrand((size_t)M * ldc, -1, 1), *A = hrand(64, -1, 1);
        float *dC = dcopy(Cc, (size_t)M * ldc), *dA = dcopy(A, 64);
        C->gemm(false, false, M, N, 0, 1.0f, A, 1, A, N, beta, Cc, ldc);
        G->gemm(false, false, M, N, 0, 1.0f, dA, 1, dA, N, beta, dC, ldc);
        expect_equal("gemm K=0", hback(dC, (size_t)M * ldc), Cc, (size_t)M * ldc);
    }
}

static const size_t vec_sizes[] = {1, 3, 1000, 70001, (1u << 20) + 5};
#define N_VEC_SIZES (sizeof vec_sizes / sizeof vec_sizes[0])

// axpy: atol 1e-6, rtol 1e-6 (one rounding, or none under FMA). scale: one product, exact.
Test(cuda, axpy_scale) {
    seed(4);
    for (size_t si = 0; si < N_VEC_SIZES; si++) {
        size_t n = vec_sizes[si];
        float *x = hrand(n, -2, 2), *y = hrand(n, -2, 2);
        float *dx = dcopy(x, n), *dy = dcopy(y, n);
        C->axpy(n, -0.37f, x, y);
        G->axpy(n, -0.37f, dx, dy);
        expect_close("axpy", hback(dy, n), y, n, 1e-6, 1e-6);
        C->scale(n, 1.7f, x);
        G->scale(n, 1.7f, dx);
        expect_equal("scale", hback(dx, n), x, n);
        teardown();
    }
}

// Relative 1e-12: both sum float squares in double, in different orders.
Test(cuda, sumsq) {
    seed(5);
    for (size_t si = 0; si < N_VEC_SIZES; si++) {
        size_t n = vec_sizes[si];
        float *x = hrand(n, -3, 3);
        float *dx = dcopy(x, n);
        double a = G->sumsq(n, dx), b = C->sumsq(n, x);
        cr_assert(fabs(a - b) <= 1e-12 * fabs(b), "sumsq n=%zu: cuda %.17g, cpu %.17g", n, a, b);
    }
    cr_assert(G->sumsq(0, NULL) == 0.0);
}

// Exact (a boolean).
Test(cuda, all_finite) {
    seed(6);
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t si = 0; si < N_VEC_SIZES; si++) {
        size_t n = vec_sizes[si];
        float *x = hrand(n, -1, 1);
        x[n / 2] = 3.4e38f;   // large but finite
        float *dx = dcopy(x, n);
        cr_assert(G->all_finite(n, dx) && C->all_finite(n, x), "all_finite n=%zu: finite input", n);
        size_t where[] = {0, n / 3, n - 1};
        for (int w = 0; w < 3; w++)
            for (int b = 0; b < 3; b++) {
                float keep = x[where[w]];
                x[where[w]] = bad[b];
                G->to_dev(dx, x, sizeof(float) * n);
                bool gc = G->all_finite(n, dx), cc = C->all_finite(n, x);
                cr_assert(!gc && !cc, "all_finite n=%zu: %g at %zu not found (cuda %d, cpu %d)", n, bad[b], where[w],
                          gc, cc);
                x[where[w]] = keep;
            }
        G->to_dev(dx, x, sizeof(float) * n);
        cr_assert(G->all_finite(n, dx), "all_finite n=%zu after restoring", n);
        teardown();
    }
    cr_assert(G->all_finite(0, NULL));
}

// --- bf16 -------------------------------------------------------------------------------------------------

// Exact: the same integer rounding on both sides. Every bf16 pattern with low halves around the
// rounding midpoint (ties included), NaN payloads, infinities, subnormals, at odd offsets.
Test(cuda, bf16_convert) {
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    size_t nl = sizeof lows / sizeof lows[0], n = 65536 * nl + 3;
    float *x = hbuf(n);
    for (uint32_t h = 0; h < 65536; h++)
        for (size_t l = 0; l < nl; l++) {
            uint32_t u = (h << 16) | lows[l];
            memcpy(&x[3 + h * nl + l], &u, sizeof u);
        }
    float *dx = dcopy(x, n);
    uint16_t *hb = hmem(2 * n), *db = dmem(2 * n), *back = hmem(2 * n);
    C->to_bf16(hb, x, n);
    G->to_bf16(db + 1, dx + 1, n - 1);   // an odd offset and length
    C->to_bf16(hb + 1, x + 1, n - 1);
    G->to_host(back + 1, db + 1, 2 * (n - 1));
    for (size_t i = 1; i < n; i++)
        cr_assert(back[i] == hb[i], "to_bf16(0x%08x): cuda 0x%04x, cpu 0x%04x", tu_f2u(x[i]), back[i], hb[i]);
    float *df = dmem(sizeof(float) * n), *hf = hbuf(n);
    G->from_bf16(df + 1, db + 1, n - 1);
    C->from_bf16(hf + 1, hb + 1, n - 1);
    expect_equal("from_bf16", hback(df, n) + 1, hf + 1, n - 1);
    G->to_bf16(db, dx, 0);
    G->from_bf16(df, db, 0);
}

// trans_w: C = alpha X W^T + beta C with W (N,K) bf16; !trans_w: C = alpha X W + beta C with W
// (K,N) bf16 (the backward's dX = dY W). The GPU rounds X to bf16 (unit roundoff u16 = 2^-8),
// the CPU reference does not (but its avx512-bf16 variant for trans_w at M <= 8, which rounds X
// the same way: kernels.h; both checks then hold a fortiori), so per element, with
// B = |alpha| sum_k |x_k| |w_k|:
//   |cuda - cpu| <= u16 B  (X rounding)  +  2 (K+2) 2^-23 B  (two fp32 accumulations in any
//   order, doubled for tensor cores that truncate)  +  2^-22 |beta c|
// (a rigorous bound; the typical X-rounding error is ~u16/sqrt(3) * sqrt(sum (x w)^2), far
// smaller). Against a CPU reference on the bf16-rounded X, only the fp32 terms remain: that
// tighter check shows the GPU rounds X to nearest bf16 and accumulates in fp32; an error in
// indexing or layout (W read in the other orientation included) gives O(1) differences, a
// product with X kept in fp32 fails it by ~u16.
static void gemm_bf16w_case(bool trans_w, int M, int N, int K, float alpha, float beta, int pad, bool nan_c) {
    int ldx = K + pad, ldw = (trans_w ? K : N) + 2 * pad, ldc = N + pad, wrows = trans_w ? N : K;
    size_t nx = (size_t)M * ldx, nw = (size_t)wrows * ldw, nc = (size_t)M * ldc;
    float *X = hrand(nx + 1, -1, 1), *Wf = hrand(nw + 1, -1, 1), *Cc = hrand(nc, -1, 1);
    if (nan_c)
        for (size_t i = 0; i < nc; i++) Cc[i] = NAN;
    uint16_t *W = hmem(2 * (nw + 1));
    C->to_bf16(W, Wf, nw);
    C->from_bf16(Wf, W, nw);   // the weights as multiplied
    float *Xr = hbuf(nx + 1);   // X rounded to bf16, for the tight reference
    uint16_t *tmp = hmem(2 * (nx + 1));
    C->to_bf16(tmp, X, nx);
    C->from_bf16(Xr, tmp, nx);
    float *dX = dcopy(X, nx + 1), *dC = dcopy(Cc, nc);
    uint16_t *dW = dmem(2 * (nw + 1));
    G->to_dev(dW, W, 2 * nw);
    float *want = hbuf(nc), *want_r = hbuf(nc);
    memcpy(want, Cc, sizeof(float) * nc);
    memcpy(want_r, Cc, sizeof(float) * nc);
    C->gemm_bf16w(trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, want, ldc);
    C->gemm_bf16w(trans_w, M, N, K, alpha, Xr, ldx, W, ldw, beta, want_r, ldc);
    G->gemm_bf16w(trans_w, M, N, K, alpha, dX, ldx, dW, ldw, beta, dC, ldc);
    float *got = hback(dC, nc);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            size_t e = (size_t)i * ldc + j;
            if (j >= N) {
                cr_assert(memcmp(&got[e], &Cc[e], sizeof(float)) == 0, "gemm_bf16w trans_w=%d: padding C[%d,%d] changed",
                          trans_w, i, j);
                continue;
            }
            double B = 0.0;
            for (int k = 0; k < K; k++)
                B += fabs((double)X[(size_t)i * ldx + k] * (trans_w ? Wf[(size_t)j * ldw + k] : Wf[(size_t)k * ldw + j]));
            B *= fabs(alpha);
            double bc = beta == 0.0f ? 0.0 : fabs((double)beta * Cc[e]);
            double acc = 2.0 * (K + 2) * 0x1p-23 * B + 0x1p-22 * bc + 1e-30;
            double d = fabs((double)got[e] - want[e]), dr = fabs((double)got[e] - want_r[e]);
            if (!(d <= 0x1p-8 * B + acc))
                cr_assert_fail("gemm_bf16w trans_w=%d M=%d N=%d K=%d alpha=%g beta=%g: C[%d,%d] cuda %.9g, cpu (fp32 X) "
                               "%.9g: |diff| %.3g > bound %.3g",
                               trans_w, M, N, K, alpha, beta, i, j, got[e], want[e], d, 0x1p-8 * B + acc);
            if (!(dr <= acc))
                cr_assert_fail("gemm_bf16w trans_w=%d M=%d N=%d K=%d alpha=%g beta=%g: C[%d,%d] cuda %.9g, cpu (bf16 X) "
                               "%.9g: |diff| %.3g > bound %.3g",
                               trans_w, M, N, K, alpha, beta, i, j, got[e], want_r[e], dr, acc);
        }
}

Test(cuda, gemm_bf16w) {
    static const int sizes[] = {1, 3, 17, 64, 129};
    seed(19);
    for (int t = 0; t < 2; t++) {
        for (int mi = 0; mi < 5; mi++)
            for (int ni = 0; ni < 5; ni++)
                for (int ki = 0; ki < 5; ki++) {
                    int v = mi + ni + ki;
                    gemm_bf16w_case(t == 0, sizes[mi], sizes[ni], sizes[ki], v % 3 ? 0.7f : 1.0f,
                                    v % 2 ? 0.3f : 0.0f, v % 4, false);
                    teardown();
                }
        // a model-sized K (forward) or N (backward); beta = 0 overwrites NaN
        gemm_bf16w_case(t == 0, 64, t == 0 ? 300 : 896, t == 0 ? 896 : 300, 1.0f, 0.0f, 0, true);
        teardown();
        gemm_bf16w_case(t == 0, 5, 7, 33, -1.5f, 1.0f, 1, false);
        teardown();
    }
}

// K = 0: C = beta * C (0 when beta = 0), as gemm. Exact.
Test(cuda, gemm_bf16w_k0) {
    seed(20);
    for (int b = 0; b < 4; b++) {
        float beta = b % 2 ? 0.5f : 0.0f;
        bool trans_w = b < 2;
        int M = 5, N = 7, ldc = 9;
        float *Cc = hrand((size_t)M * ldc, -1, 1), *X = hrand(8, -1, 1);
        uint16_t W[8] = {0};
        float *dC = dcopy(Cc, (size_t)M * ldc), *dX = dcopy(X, 8);
        uint16_t *dW = dmem(16);
        C->gemm_bf16w(trans_w, M, N, 0, 1.0f, X, 1, W, 1, beta, Cc, ldc);
        G->gemm_bf16w(trans_w, M, N, 0, 1.0f, dX, 1, dW, 1, beta, dC, ldc);
        expect_equal("gemm_bf16w K=0", hback(dC, (size_t)M * ldc), Cc, (size_t)M * ldc);
    }
}

// --- transformer pieces ----------------------------------------------------------------------------------

// embed: a copy, exact. embed_bwd: the same additions in the same order (rows in increasing order
// per token) as the CPU, so expected bit-identical; atol/rtol 1e-6 leave room for nothing else.
Test(cuda, embed) {
    static const int dims[] = {1, 3, 64, 129};
    seed(7);
    for (int di = 0; di < 4; di++) {
        int V = 50, n = 37, dim = dims[di];
        float *table = hrand((size_t)V * dim, -1, 1);
        int32_t tok[37];
        for (int i = 0; i < n; i++) tok[i] = i % 5 == 0 ? 7 : irand(V);   // repeated tokens
        float *dtab = dcopy(table, (size_t)V * dim);
        float *out = hrand((size_t)n * dim, -1, 1), *dout = dmem(sizeof(float) * n * dim);
        C->embed(out, table, tok, n, dim);
        G->embed(dout, dtab, tok, n, dim);
        expect_equal("embed", hback(dout, (size_t)n * dim), out, (size_t)n * dim);

        float *g = hrand((size_t)n * dim, -1, 1), *dg = dcopy(g, (size_t)n * dim);
        C->embed_bwd(table, g, tok, n, dim);   // += into the (random) table
        G->embed_bwd(dtab, dg, tok, n, dim);
        expect_close("embed_bwd", hback(dtab, (size_t)V * dim), table, (size_t)V * dim, 1e-6, 1e-6);
    }
}

// scatter_rows: exact (copies). Rows go to shuffled, gapped offsets of a larger buffer whose other
// entries must stay untouched.
Test(cuda, scatter_rows) {
    static const int lens[] = {1, 3, 128, 257};
    seed(11);
    for (int li = 0; li < 4; li++) {
        int n = 45, len = lens[li], slots = 2 * n + 3;
        size_t off[45];
        int *perm = ibuf((size_t)slots);
        for (int i = 0; i < slots; i++) perm[i] = i;
        for (int i = slots - 1; i > 0; i--) {
            int j = irand(i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int r = 0; r < n; r++) off[r] = (size_t)perm[r] * len;
        float *dst = hrand((size_t)slots * len, -1, 1), *src = hrand((size_t)n * len, -1, 1);
        float *ddst = dcopy(dst, (size_t)slots * len), *dsrc = dcopy(src, (size_t)n * len);
        C->scatter_rows(dst, off, src, n, len);
        G->scatter_rows(ddst, off, dsrc, n, len);
        expect_equal("scatter_rows", hback(ddst, (size_t)slots * len), dst, (size_t)slots * len);
    }
}

// rmsnorm: atol 1e-5, rtol 1e-5 (a float sum of dim squares in a different order, then 1/sqrt).
// rmsnorm_bwd: atol 2e-5, rtol 1e-4 (dw sums n rows; dx involves a dim-long dot product).
Test(cuda, rmsnorm) {
    static const int dims[] = {1, 3, 17, 64, 129, 1000};
    static const int ns[] = {1, 5, 33};
    seed(8);
    for (int di = 0; di < 6; di++)
        for (int ni = 0; ni < 3; ni++) {
            int dim = dims[di], n = ns[ni];
            size_t nd = (size_t)n * dim;
            float *x = hrand(nd, -2, 2), *w = hrand(dim, 0.5f, 1.5f);
            float *dx_ = dcopy(x, nd), *dw_ = dcopy(w, dim);
            float *out = hbuf(nd), *rstd = hbuf(n), *dout = dmem(sizeof(float) * nd), *drstd = dmem(sizeof(float) * n);
            C->rmsnorm(out, rstd, x, w, n, dim, 1e-6f);
            G->rmsnorm(dout, drstd, dx_, dw_, n, dim, 1e-6f);
            expect_close("rmsnorm out", hback(dout, nd), out, nd, 1e-5, 1e-5);
            expect_close("rmsnorm rstd", hback(drstd, n), rstd, n, 1e-5, 1e-5);
            float *dout2 = dmem(sizeof(float) * nd);
            G->rmsnorm(dout2, NULL, dx_, dw_, n, dim, 1e-6f);   // rstd may be NULL
            expect_close("rmsnorm out (rstd NULL)", hback(dout2, nd), out, nd, 1e-5, 1e-5);

            // backward, += into random dx and dw; then with dw NULL
            float *gy = hrand(nd, -1, 1), *gx = hrand(nd, -1, 1), *gw = hrand(dim, -1, 1);
            float *dgy = dcopy(gy, nd), *dgx = dcopy(gx, nd), *dgw = dcopy(gw, dim);
            C->rmsnorm_bwd(gx, gw, gy, x, w, rstd, n, dim);
            G->rmsnorm_bwd(dgx, dgw, dgy, dx_, dw_, drstd, n, dim);
            expect_close("rmsnorm_bwd dx", hback(dgx, nd), gx, nd, 2e-5, 1e-4);
            expect_close("rmsnorm_bwd dw", hback(dgw, dim), gw, dim, 2e-5, 1e-4);
            C->rmsnorm_bwd(gx, NULL, gy, x, w, rstd, n, dim);
            G->rmsnorm_bwd(dgx, NULL, dgy, dx_, dw_, drstd, n, dim);
            expect_close("rmsnorm_bwd dx (dw NULL)", hback(dgx, nd), gx, nd, 2e-5, 1e-4);
            teardown();
        }
}

// add_bias: one addition, exact. bias_bwd: the rows added in the CPU's order, atol/rtol 1e-6.
Test(cuda, bias) {
    static const int dims[] = {1, 3, 129};
    seed(9);
    for (int di = 0; di < 3; di++) {
        int n = 41, dim = dims[di];
        size_t nd = (size_t)n * dim;
        float *x = hrand(nd, -1, 1), *b = hrand(dim, -1, 1), *db = hrand(dim, -1, 1);
        float *dx = dcopy(x, nd), *dbias = dcopy(b, dim), *ddb = dcopy(db, dim);
        C->add_bias(x, b, n, dim);
        G->add_bias(dx, dbias, n, dim);
        expect_equal("add_bias", hback(dx, nd), x, nd);
        C->bias_bwd(db, x, n, dim);
        G->bias_bwd(ddb, dx, n, dim);
        expect_close("bias_bwd", hback(ddb, dim), db, dim, 1e-6, 1e-6);
    }
}

// atol 1e-6, rtol 1e-6: two products and a sum per element (FMA on the GPU).
Test(cuda, rope) {
    static const int hds[] = {8, 24, 64, 7};   // 7: odd, the last dimension is left alone
    static const int heads[] = {1, 3, 4};
    seed(10);
    int P = 64;
    for (int hi = 0; hi < 4; hi++)
        for (int hh = 0; hh < 3; hh++)
            for (int inv = 0; inv < 2; inv++) {
                int hd = hds[hi], H = heads[hh], half = hd / 2, n = 13;
                float *ct = hbuf((size_t)P * half), *st = hbuf((size_t)P * half);
                for (int p = 0; p < P; p++)
                    for (int j = 0; j < half; j++) {
                        float a = p * powf(10000.0f, -2.0f * j / hd);
                        ct[(size_t)p * half + j] = cosf(a);
                        st[(size_t)p * half + j] = sinf(a);
                    }
                int32_t pos[13];
                for (int i = 0; i < n; i++) pos[i] = irand(P);
                size_t nx = (size_t)n * H * hd;
                float *x = hrand(nx, -1, 1);
                float *dx = dcopy(x, nx), *dct = dcopy(ct, (size_t)P * half), *dst = dcopy(st, (size_t)P * half);
                C->rope(x, pos, n, H, hd, ct, st, inv);
                G->rope(dx, pos, n, H, hd, dct, dst, inv);
                char what[64];
                snprintf(what, sizeof what, "rope hd=%d H=%d inverse=%d", hd, H, inv);
                expect_close(what, hback(dx, nx), x, nx, 1e-6, 1e-6);
                teardown();
            }
}

// glu (SiLU, exact GELU, tanh GELU): rtol 1e-5, atol 1e-6 for SiLU; expf, erff, tanhf are a few ulp
// on the GPU, then a handful of products. The GELUs compute 1 + erf and 1 + tanh as PyTorch does,
// which cancel for negative g: an error of 2 ulp of 1 (1.2e-7) in erf/tanh becomes 0.5 |g| |u| 1.2e-7
// absolute, up to 1.1e-6 at |g| = 8, |u| = 2.25: atol 3e-6 for them. glu_bwd: the same bounds
// (its tanh-GELU derivative uses 1/cosh^2, not 1 - tanh^2, which would cancel the same way and
// then be multiplied by ~|g|^3).
Test(cuda, glu) {
    seed(11);
    static const kern_act_t acts[] = {KERN_ACT_SILU, KERN_ACT_GELU, KERN_ACT_GELU_TANH};
    for (int ai = 0; ai < 3; ai++)
        for (size_t si = 0; si < N_VEC_SIZES; si++) {
            size_t n = vec_sizes[si];
            kern_act_t act = acts[ai];
            float *gg = hrand(n, -8, 8), *u = hrand(n, -2, 2), *dh = hrand(n, -1, 1);
            float *dgg = dcopy(gg, n), *du = dcopy(u, n), *ddh = dcopy(dh, n);
            float *h = hbuf(n), *dh_out = dmem(sizeof(float) * n);
            char what[64];
            C->glu(h, gg, u, n, act);
            G->glu(dh_out, dgg, du, n, act);
            double atol = act == KERN_ACT_SILU ? 1e-6 : 3e-6;
            snprintf(what, sizeof what, "glu act=%d", (int)act);
            expect_close(what, hback(dh_out, n), h, n, atol, 1e-5);
            float *dg = hrand(n, -1, 1), *duo = hrand(n, -1, 1);   // overwritten
            float *ddg = dcopy(dg, n), *dduo = dcopy(duo, n);
            C->glu_bwd(dg, duo, dh, gg, u, n, act);
            G->glu_bwd(ddg, dduo, ddh, dgg, du, n, act);
            snprintf(what, sizeof what, "glu_bwd dg act=%d", (int)act);
            expect_close(what, hback(ddg, n), dg, n, atol, 1e-5);
            snprintf(what, sizeof what, "glu_bwd du act=%d", (int)act);
            expect_close(what, hback(dduo, n), duo, n, atol, 1e-5);
            teardown();
        }
}

// --- attention -----------------------------------------------------------------------------------------

typedef struct {
    int H, KV, hd;
} heads_t;

static const heads_t head_cfgs[] = {{4, 2, 8}, {3, 1, 24}, {2, 2, 64}, {8, 2, 64}};
#define N_HEAD_CFGS (int)(sizeof head_cfgs / sizeof head_cfgs[0])

// Paged attention: 3 sequences (contexts up to 40) in a pool of blocks handed out in a shuffled
// order, with a padded block stride; tokens of several sequences mixed, one sequence with a
// chunk of 3 consecutive positions. Block sizes 1, 4, 16. Tolerance: atol 2e-5, rtol 1e-4 (the
// output is a convex combination of values in [-1, 1]; the online softmax rescales in a
// different order).
Test(cuda, attn_paged) {
    static const int bss[] = {1, 4, 16};
    seed(12);
    for (int ci = 0; ci < N_HEAD_CFGS; ci++)
        for (int bi = 0; bi < 3; bi++) {
            heads_t hc = head_cfgs[ci];
            int bs = bss[bi], kvd = hc.KV * hc.hd;
            int ctx_len[3] = {1, 23, 40};
            int nb[3], nblocks = 3;   // 3 unused blocks
            for (int s = 0; s < 3; s++) nblocks += nb[s] = (ctx_len[s] + bs - 1) / bs;
            int *perm = ibuf(nblocks);
            for (int i = 0; i < nblocks; i++) perm[i] = i;
            for (int i = nblocks - 1; i > 0; i--) {
                int j = irand(i + 1), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            int *tabs[3], used = 0;
            for (int s = 0; s < 3; s++) {
                tabs[s] = ibuf(nb[s]);
                for (int b = 0; b < nb[s]; b++) tabs[s][b] = perm[used++];
            }
            size_t stride = (size_t)bs * kvd + 5, pool = (size_t)nblocks * stride;
            float *kp = hrand(pool, -1, 1), *vp = hrand(pool, -1, 1);
            float *dkp = dcopy(kp, pool), *dvp = dcopy(vp, pool);
            int seq_of[] = {2, 0, 1, 1, 1, 2};
            int32_t pos[] = {39, 0, 20, 21, 22, 17};
            int n = 6;
            size_t nq = (size_t)n * hc.H * hc.hd;
            float *q = hrand(nq, -1, 1), *dq = dcopy(q, nq);
            kern_paged_attn_t a = {.k_base = kp, .v_base = vp, .block_stride = stride, .block_size = bs,
                                   .tables = (const int *const *)tabs, .seq_of = seq_of, .pos = pos, .n_tokens = n,
                                   .n_heads = hc.H, .n_kv_heads = hc.KV, .head_dim = hc.hd, .max_ctx = 40};
            float *out = hrand(nq, -1, 1), *dout = dmem(sizeof(float) * nq);
            C->attn_paged(out, q, &a);
            a.k_base = dkp;
            a.v_base = dvp;
            G->attn_paged(dout, dq, &a);
            char what[96];
            snprintf(what, sizeof what, "attn_paged H=%d KV=%d hd=%d bs=%d", hc.H, hc.KV, hc.hd, bs);
            expect_close(what, hback(dout, nq), out, nq, 2e-5, 1e-4);
            teardown();
        }
}

// Packed layouts. No prefix: 4 sequences of lengths 1, 5, 17, 33 with a row between two of them
// and one at the end that no sequence owns. Prefix: a 9-row prompt (sequence 0) shared whole by
// sequences 1 and 2, its first 4 rows by sequence 3; sequence 4 has none and is itself the
// 5-row prefix of sequence 5; a last row owned by nobody.
typedef struct {
    int n_seqs, N, max_len;
    int start[8], len[8], pre_start[8], pre_len[8];
    bool pre;
} layout_t;

static layout_t layout_plain(void) {
    layout_t l = {.n_seqs = 4, .N = 58, .start = {0, 1, 7, 24}, .len = {1, 5, 17, 33}, .pre = false};
    l.max_len = 33;
    return l;
}

static layout_t layout_prefix(void) {
    layout_t l = {.n_seqs = 6,
                  .N = 36,
                  .start = {0, 9, 15, 16, 27, 32},
                  .len = {9, 6, 1, 11, 5, 3},
                  .pre_start = {0, 0, 0, 0, 0, 27},
                  .pre_len = {0, 9, 9, 4, 0, 5},
                  .pre = true};
    l.max_len = 16;   // max of pre_len + len
    return l;
}

static kern_packed_attn_t packed_args(const layout_t *l, heads_t hc) {
    return (kern_packed_attn_t){.start = l->start, .len = l->len, .pre_start = l->pre ? l->pre_start : NULL,
                                .pre_len = l->pre ? l->pre_len : NULL, .n_seqs = l->n_seqs, .n_tokens = l->N,
                                .n_heads = hc.H, .n_kv_heads = hc.KV, .head_dim = hc.hd, .max_len = l->max_len};
}

// Forward: out and lse. atol 2e-5, rtol 1e-4 for out (as paged); lse atol 1e-5, rtol 1e-5.
// Rows owned by no sequence are left as they were (random) by both.
Test(cuda, attn_fwd) {
    seed(13);
    for (int li = 0; li < 2; li++)
        for (int ci = 0; ci < N_HEAD_CFGS; ci++) {
            layout_t l = li ? layout_prefix() : layout_plain();
            heads_t hc = head_cfgs[ci];
            kern_packed_attn_t a = packed_args(&l, hc);
            size_t nq = (size_t)l.N * hc.H * hc.hd, nk = (size_t)l.N * hc.KV * hc.hd, nl = (size_t)l.N * hc.H;
            float *q = hrand(nq, -1, 1), *k = hrand(nk, -1, 1), *v = hrand(nk, -1, 1);
            float *out = hrand(nq, -1, 1), *lse = hrand(nl, -1, 1);
            float *dq = dcopy(q, nq), *dk = dcopy(k, nk), *dv = dcopy(v, nk), *dout = dcopy(out, nq),
                  *dlse = dcopy(lse, nl);
            C->attn_fwd(out, lse, q, k, v, &a);
            G->attn_fwd(dout, dlse, dq, dk, dv, &a);
            char what[96];
            snprintf(what, sizeof what, "attn_fwd %s H=%d KV=%d hd=%d: out", li ? "prefix" : "plain", hc.H, hc.KV,
                     hc.hd);
            expect_close(what, hback(dout, nq), out, nq, 2e-5, 1e-4);
            snprintf(what, sizeof what, "attn_fwd %s H=%d KV=%d hd=%d: lse", li ? "prefix" : "plain", hc.H, hc.KV,
                     hc.hd);
            expect_close(what, hback(dlse, nl), lse, nl, 1e-5, 1e-5);
            teardown();
        }
}

// Backward from the same out/lse (the CPU forward's, uploaded) on both: dq, dk, dv overwritten
// (both start from random). Tolerance atol 5e-5, rtol 5e-4: a prefix row's dk/dv sums the
// contributions of every query of every sequence sharing it (up to ~100 terms) in a different
// order than the CPU.
Test(cuda, attn_bwd) {
    seed(14);
    for (int li = 0; li < 2; li++)
        for (int ci = 0; ci < N_HEAD_CFGS; ci++) {
            layout_t l = li ? layout_prefix() : layout_plain();
            heads_t hc = head_cfgs[ci];
            kern_packed_attn_t a = packed_args(&l, hc);
            size_t nq = (size_t)l.N * hc.H * hc.hd, nk = (size_t)l.N * hc.KV * hc.hd, nl = (size_t)l.N * hc.H;
            float *q = hrand(nq, -1, 1), *k = hrand(nk, -1, 1), *v = hrand(nk, -1, 1);
            float *out = hbuf(nq), *lse = hbuf(nl), *gout = hrand(nq, -1, 1);
            C->attn_fwd(out, lse, q, k, v, &a);
            float *gq = hrand(nq, -1, 1), *gk = hrand(nk, -1, 1), *gv = hrand(nk, -1, 1);
            float *d_q = dcopy(q, nq), *d_k = dcopy(k, nk), *d_v = dcopy(v, nk), *d_out = dcopy(out, nq),
                  *d_lse = dcopy(lse, nl), *d_gout = dcopy(gout, nq);
            float *d_gq = dcopy(gq, nq), *d_gk = dcopy(gk, nk), *d_gv = dcopy(gv, nk);
            C->attn_bwd(gq, gk, gv, gout, out, lse, q, k, v, &a);
            G->attn_bwd(d_gq, d_gk, d_gv, d_gout, d_out, d_lse, d_q, d_k, d_v, &a);
            char what[96];
            const char *lay = li ? "prefix" : "plain";
            snprintf(what, sizeof what, "attn_bwd %s H=%d KV=%d hd=%d: dq", lay, hc.H, hc.KV, hc.hd);
            expect_close(what, hback(d_gq, nq), gq, nq, 5e-5, 5e-4);
            snprintf(what, sizeof what, "attn_bwd %s H=%d KV=%d hd=%d: dk", lay, hc.H, hc.KV, hc.hd);
            expect_close(what, hback(d_gk, nk), gk, nk, 5e-5, 5e-4);
            snprintf(what, sizeof what, "attn_bwd %s H=%d KV=%d hd=%d: dv", lay, hc.H, hc.KV, hc.hd);
            expect_close(what, hback(d_gv, nk), gv, nk, 5e-5, 5e-4);
            teardown();
        }
}

// --- multi-LoRA ------------------------------------------------------------------------------------------

// Segments of mixed ranks (1..16) with rows between them that no segment owns, one of them large
// enough for the CPU's sgemm path (>= 8 rows), one empty. T starts at a sentinel everywhere on
// both sides (rows and columns outside the segments must stay untouched); Y starts random
// (expand adds). Tolerance: atol 1e-4, rtol 1e-4 (dot products over in <= 129, as gemm).
Test(cuda, lora) {
    static const int ins[] = {1, 17, 64, 129};
    static const int outs[] = {1, 3, 129};
    seed(15);
    for (int ii = 0; ii < 4; ii++)
        for (int oi = 0; oi < 3; oi++) {
            int in = ins[ii], out = outs[oi], N = 60, ldt = 16;
            kern_lora_seg_t seg[6] = {
                {.row0 = 0, .n_rows = 1, .rank = 1, .scale = 2.0f},
                {.row0 = 3, .n_rows = 9, .rank = 16, .scale = 0.5f},
                {.row0 = 13, .n_rows = 2, .rank = 4, .scale = 1.0f},
                {.row0 = 20, .n_rows = 17, .rank = 8, .scale = 1.5f},
                {.row0 = 40, .n_rows = 1, .rank = 3, .scale = -1.0f},
                {.row0 = 41, .n_rows = 0, .rank = 5, .scale = 1.0f},
            };
            kern_lora_seg_t dseg[6];
            for (int s = 0; s < 6; s++) {
                float *A = hrand((size_t)seg[s].rank * in, -1, 1), *B = hrand((size_t)seg[s].rank * out, -1, 1);
                seg[s].A = A;
                seg[s].B = B;
                dseg[s] = seg[s];
                dseg[s].A = dcopy(A, (size_t)seg[s].rank * in);
                dseg[s].B = dcopy(B, (size_t)seg[s].rank * out);
            }
            float *X = hrand((size_t)N * in, -1, 1), *dX = dcopy(X, (size_t)N * in);
            float *T = hbuf((size_t)N * ldt);
            for (size_t i = 0; i < (size_t)N * ldt; i++) T[i] = 7.0f;
            float *dT = dcopy(T, (size_t)N * ldt);
            C->lora_shrink(T, ldt, X, in, seg, 6);
            G->lora_shrink(dT, ldt, dX, in, dseg, 6);
            char what[64];
            snprintf(what, sizeof what, "lora_shrink in=%d", in);
            expect_close(what, hback(dT, (size_t)N * ldt), T, (size_t)N * ldt, 1e-4, 1e-4);

            float *T2 = hrand((size_t)N * ldt, -1, 1), *dT2 = dcopy(T2, (size_t)N * ldt);
            float *Y = hrand((size_t)N * out, -1, 1), *dY = dcopy(Y, (size_t)N * out);
            C->lora_expand(Y, out, T2, ldt, seg, 6);
            G->lora_expand(dY, out, dT2, ldt, dseg, 6);
            snprintf(what, sizeof what, "lora_expand out=%d", out);
            expect_close(what, hback(dY, (size_t)N * out), Y, (size_t)N * out, 1e-4, 1e-4);
            teardown();
        }
}

// --- losses -------------------------------------------------------------------------------------------------

// Temperatures 1, 0.7, 1.6 and 0 (treated as 1). The scaled logits are the same floats on both
// sides and the sums are in double: logp and entropy atol 2e-6, rtol 2e-6 (one float rounding
// of a double result, plus the double sums' order).
Test(cuda, token_logprobs) {
    static const int Vs[] = {1, 3, 1000, 50001};
    static const int ns[] = {1, 7, 33};
    static const float Ts[] = {1.0f, 0.7f, 1.6f, 0.0f};
    seed(16);
    for (int vi = 0; vi < 4; vi++)
        for (int ni = 0; ni < 3; ni++)
            for (int ti = 0; ti < 4; ti++) {
                int V = Vs[vi], n = ns[ni];
                float T = Ts[ti];
                size_t nv = (size_t)n * V;
                float *z = hrand(nv, -8, 8), *dz = dcopy(z, nv);
                int32_t tgt[33];
                for (int r = 0; r < n; r++) tgt[r] = irand(V);
                float *lp = hbuf(n), *en = hbuf(n), *dlp = dmem(sizeof(float) * n), *den = dmem(sizeof(float) * n);
                C->token_logprobs(lp, en, z, tgt, n, V, T);
                G->token_logprobs(dlp, den, dz, tgt, n, V, T);
                char what[80];
                snprintf(what, sizeof what, "token_logprobs V=%d n=%d T=%g: logp", V, n, T);
                expect_close(what, hback(dlp, n), lp, n, 2e-6, 2e-6);
                snprintf(what, sizeof what, "token_logprobs V=%d n=%d T=%g: entropy", V, n, T);
                expect_close(what, hback(den, n), en, n, 2e-6, 2e-6);
                float *dlp2 = dmem(sizeof(float) * n);
                G->token_logprobs(dlp2, NULL, dz, tgt, n, V, T);   // entropy may be NULL
                snprintf(what, sizeof what, "token_logprobs V=%d n=%d T=%g: logp (entropy NULL)", V, n, T);
                expect_close(what, hback(dlp2, n), lp, n, 2e-6, 2e-6);
                teardown();
            }
}

// In place, rows with dlogp = 0 zeroed. atol 1e-6, rtol 1e-5: expf is <= 2 ulp on the GPU, and
// the target's entry dlogp/T * (1 - p) cancels when p is near 1, leaving a few ulp of
// |dlogp / T| <= 2.5 (~2.4e-7 each) as absolute error.
Test(cuda, logprob_bwd) {
    static const int Vs[] = {1, 3, 1000, 50001};
    static const float Ts[] = {1.0f, 0.7f, 1.6f, 0.0f};
    seed(17);
    for (int vi = 0; vi < 4; vi++)
        for (int ti = 0; ti < 4; ti++) {
            int V = Vs[vi], n = 9;
            float T = Ts[ti];
            size_t nv = (size_t)n * V;
            float *z = hrand(nv, -8, 8), *dz = dcopy(z, nv);
            float *g = hrand(n, -1.5f, 1.5f);
            g[2] = 0.0f;
            g[7] = 0.0f;
            float *dg = dcopy(g, n);
            int32_t tgt[9];
            for (int r = 0; r < n; r++) tgt[r] = irand(V);
            C->logprob_bwd(z, g, tgt, n, V, T);
            G->logprob_bwd(dz, dg, tgt, n, V, T);
            char what[64];
            snprintf(what, sizeof what, "logprob_bwd V=%d T=%g", V, T);
            expect_close(what, hback(dz, nv), z, nv, 1e-6, 1e-5);
            teardown();
        }
}

// --- sampling ---------------------------------------------------------------------------------------------

// Logits of kind: 0 uniform in [-8, 8]; 1 integers in [-3, 3] (many exact ties); 2 LM-like, a
// few large logits over a low background, a third masked to -inf, one at 9; 3 all equal.
static void fill_logits(float *z, int V, int kind) {
    for (int j = 0; j < V; j++) {
        switch (kind) {
        case 0: z[j] = unif(-8, 8); break;
        case 1: z[j] = (float)(irand(7) - 3); break;
        case 2: z[j] = irand(3) == 0 ? -INFINITY : (irand(200) == 0 ? unif(4, 12) : unif(-6, 2)); break;
        default: z[j] = 0.25f; break;
        }
    }
    if (kind == 2) z[irand(V)] = 9.0f;   // never all -inf (a NaN row: see sample_degenerate_rows)
}

static float clamp_u(float u) { return u < 0.0f ? 0.0f : (u >= 1.0f ? 0x1.fffffep-1f : u); }

// One row on the CPU with its own parameters.
static int cpu_sample1(const float *z, int V, float T, int k, float p, float u, float *lp) {
    int32_t tok;
    C->sample(&tok, lp, z, 1, V, &T, &k, &p, &u);
    return tok;
}

// The n rows (n, V) on both backends. Tokens must be identical, except in a threshold case: the
// GPU's token is what the CPU draws with u or top_p moved by SAMPLE_EPS (1e-6, i.e. a millionth
// of the renormalised mass): the mass of the full row is summed in another order on the GPU and
// CUDA's exp may differ by an ulp, so u * mass or the top-p target within ~1e-12 of a cumulative
// boundary may fall on the other side. Such cases must stay rare (at most max_exempt rows; -1:
// 1 + n/50), so a systematic error cannot hide behind them. Greedy rows: identical always. Log-probs (of the
// token the GPU chose): within 1e-5 (both compute z/T - lse in double; ~1e-7 expected).
#define SAMPLE_EPS 1e-6f
static void sample_case(const char *what, const float *z, int n, int V, const float *T, const int *K, const float *P,
                        const float *U, int max_exempt) {
    if (max_exempt < 0) max_exempt = 1 + n / 50;
    float *dz = dcopy(z, (size_t)n * V);
    int32_t *gt = hmem(sizeof(int32_t) * n), *ct = hmem(sizeof(int32_t) * n), *gt2 = hmem(sizeof(int32_t) * n);
    float *gl = hbuf(n), *cl = hbuf(n), *gl2 = hbuf(n);
    G->sample(gt, gl, dz, n, V, T, K, P, U);
    C->sample(ct, cl, z, n, V, T, K, P, U);
    G->sample(gt2, gl2, dz, n, V, T, K, P, U);   // deterministic
    cr_assert(memcmp(gt, gt2, sizeof(int32_t) * n) == 0 && memcmp(gl, gl2, sizeof(float) * n) == 0,
              "%s: two identical calls differ", what);
    int exempt = 0;
    for (int r = 0; r < n; r++) {
        const float *zr = z + (size_t)r * V;
        cr_assert(gt[r] >= 0 && gt[r] < V, "%s row %d: token %d outside 0..%d", what, r, gt[r], V - 1);
        float want_lp = cl[r];
        if (gt[r] != ct[r]) {
            bool ok = false;
            if (T[r] > 0) {
                float us[2] = {clamp_u(U[r] - SAMPLE_EPS), clamp_u(U[r] + SAMPLE_EPS)};
                for (int q = 0; q < 2 && !ok; q++) ok = cpu_sample1(zr, V, T[r], K[r], P[r], us[q], &want_lp) == gt[r];
                if (P[r] < 1.0f) {
                    float ps[2] = {P[r] - SAMPLE_EPS, P[r] + SAMPLE_EPS < 1.0f ? P[r] + SAMPLE_EPS : 0x1.fffffep-1f};
                    for (int q = 0; q < 2 && !ok; q++)
                        ok = cpu_sample1(zr, V, T[r], K[r], ps[q], U[r], &want_lp) == gt[r];
                }
            }
            cr_assert(ok, "%s row %d (V=%d T=%g top_k=%d top_p=%g u=%.9g): cuda token %d, cpu %d, not a threshold case",
                      what, r, V, T[r], K[r], P[r], U[r], gt[r], ct[r]);
            exempt++;
        }
        if (isnan(want_lp))
            cr_assert(isnan(gl[r]), "%s row %d: cpu log-prob NaN, cuda %.9g", what, r, gl[r]);
        else
            cr_assert(fabsf(gl[r] - want_lp) <= 1e-5f,
                      "%s row %d (V=%d T=%g top_k=%d top_p=%g): log-prob cuda %.9g, cpu %.9g", what, r, V, T[r], K[r],
                      P[r], gl[r], want_lp);
    }
    cr_assert(exempt <= max_exempt, "%s: %d of %d rows differ (threshold cases), more than %d", what, exempt, n,
              max_exempt);
    if (exempt) fprintf(stderr, "%s: %d of %d rows were threshold cases\n", what, exempt, n);
}

// Every path of the kernel on vocabularies up to 5000: greedy; no truncation; top-k (small, the
// shared-memory maximum 4096, V - 1, V = off); top-p (the sorted small nucleus; flat rows take
// the bisection path); top-k then top-p; over the four kinds of rows.
Test(cuda, sample) {
    static const int Vs[] = {1, 2, 7, 100, 1000, 5000};
    static const float Ts[] = {0.0f, 0.6f, 1.0f, 1.5f};
    static const float Ps[] = {1.0f, 0.9f, 0.5f, 0.0f};
    seed(21);
    for (int vi = 0; vi < 6; vi++) {
        int V = Vs[vi];
        int Ks[] = {0, 1, 7, 50, V - 1, V, 4096};
        int n = 4 * 7 * 4;
        float *T = hbuf(n), *P = hbuf(n), *U = hbuf(n), *z = hbuf((size_t)n * V);
        int *Kk = ibuf(n);
        int r = 0;
        for (int ti = 0; ti < 4; ti++)
            for (int ki = 0; ki < 7; ki++)
                for (int pi = 0; pi < 4; pi++, r++) {
                    T[r] = Ts[ti];
                    Kk[r] = Ks[ki] > 4096 && Ks[ki] < V ? 4096 : Ks[ki];
                    P[r] = Ps[pi];
                    U[r] = unif(0, 1);
                    // every (top_k, top_p) pair meets every kind as the temperature varies
                    fill_logits(z + (size_t)r * V, V, (ti + ki + pi) % 4);
                }
        char what[48];
        snprintf(what, sizeof what, "sample V=%d", V);
        sample_case(what, z, n, V, T, Kk, P, U, -1);
        teardown();
    }
}

// A Qwen2-sized vocabulary: uniform logits with top-p 0.9 keep ~50k candidates above the
// compaction threshold (the bisection path); LM-like rows take the sorted path; the top-k heap
// streams 151936 weights.
Test(cuda, sample_large_vocab) {
    enum { NR = 8 };
    int V = 151936;
    float T[NR] = {1.0f, 0.7f, 1.0f, 1.0f, 0.0f, 1.2f, 1.0f, 0.8f};
    int Kk[NR] = {0, 50, 0, 0, 0, 1000, 4096, 0};
    float P[NR] = {1.0f, 1.0f, 0.9f, 0.95f, 1.0f, 0.8f, 0.95f, 0.99f};
    int kinds[NR] = {0, 0, 0, 2, 0, 2, 0, 2};
    seed(22);
    float *z = hbuf((size_t)NR * V), *U = hbuf(NR);
    for (int r = 0; r < NR; r++) {
        fill_logits(z + (size_t)r * V, V, kinds[r]);
        U[r] = unif(0, 1);
    }
    sample_case("sample V=151936", z, NR, V, T, Kk, P, U, -1);
}

// Flat and two-level rows (exact ties everywhere: the bisection's tie groups, the heap's id order,
// the sorted path's ties), with u at both ends of [0, 1) and at 0.25 and 0.5, where u * mass and
// the top-p targets (top_p 0.5 of an even count of equal weights) land exactly on a cumulative
// boundary:
// both backends must resolve the exact comparisons (> in the draw, >= for the nucleus) the same
// way. The weights of a flat row are all exactly 1, so every sum is exact in any order: no
// threshold case is allowed there. V = 1000 takes the sorted path, V = 10000 the bisections.
Test(cuda, sample_ties_and_u_extremes) {
    static const float ps[] = {1.0f, 0.5f, 0.9f, 0.999f, 0.3f, 0.0f};
    static const int ks[] = {0, 100};
    float us[] = {0.0f, 0.5f, 0.25f, 0x1.fffffep-1f, 0.0f};
    seed(23);
    for (int vi = 0; vi < 2; vi++)
        for (int shape = 0; shape < 2; shape++) {
            int V = vi ? 10000 : 1000, n = 6 * 2 * 5 + 1, r = 0;
            float *z = hbuf((size_t)n * V), *T = hbuf(n), *P = hbuf(n), *U = hbuf(n);
            int *Kk = ibuf(n);
            for (int pi = 0; pi < 6; pi++)
                for (int ki = 0; ki < 2; ki++)
                    for (int ui = 0; ui < 5; ui++, r++) {
                        float *zr = z + (size_t)r * V;
                        for (int j = 0; j < V; j++) zr[j] = shape ? (j % 3 == 0 ? 1.0f : 0.0f) : 0.0f;
                        T[r] = 1.0f;
                        Kk[r] = ks[ki];
                        P[r] = ps[pi];
                        U[r] = ui == 4 ? unif(0, 1) : us[ui];
                    }
            for (int j = 0; j < V; j++) z[(size_t)r * V + j] = shape ? (j % 7 == 3 ? 2.0f : 1.0f) : 1.0f;
            T[r] = 0.0f;   // greedy on ties: the lowest id
            Kk[r] = 0;
            P[r] = 1.0f;
            U[r] = 0.5f;
            char what[64];
            snprintf(what, sizeof what, "sample %s rows V=%d", shape ? "two-level" : "flat", V);
            sample_case(what, z, n, V, T, Kk, P, U, shape ? -1 : 0);
            teardown();
        }
}

// Rows with NaN or infinite logits: a token in range and a NaN log-prob on both; greedy rows pick
// the same token (NaN loses, lowest id among the largest).
Test(cuda, sample_degenerate_rows) {
    enum { NR = 8 };
    int V = 300;
    seed(24);
    float *z = hrand((size_t)NR * V, -2, 2), *dz;
    float T[NR] = {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f};
    int Kk[NR] = {0, 0, 0, 10, 0, 0, 0, 0};
    float P[NR] = {1.0f, 0.9f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    float U[NR] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    z[0 * V + 0] = NAN;   // greedy: NaN at 0 loses
    z[1 * V + 7] = NAN;
    z[2 * V + 5] = INFINITY;
    z[3 * V + 9] = INFINITY;
    for (int j = 0; j < V; j++) z[4 * V + j] = z[5 * V + j] = -INFINITY;
    for (int j = 0; j < V; j++) z[6 * V + j] = NAN;
    z[7 * V + 3] = NAN;
    dz = dcopy(z, (size_t)NR * V);
    int32_t gt[NR], ct[NR];
    float gl[NR], cl[NR];
    G->sample(gt, gl, dz, NR, V, T, Kk, P, U);
    C->sample(ct, cl, z, NR, V, T, Kk, P, U);
    for (int r = 0; r < NR; r++) {
        cr_assert(gt[r] >= 0 && gt[r] < V, "row %d: token %d outside 0..%d", r, gt[r], V - 1);
        cr_assert(isnan(gl[r]) && isnan(cl[r]), "row %d: log-probs cuda %g, cpu %g, want NaN", r, gl[r], cl[r]);
        if (T[r] <= 0) cr_assert(gt[r] == ct[r], "greedy row %d: cuda %d, cpu %d", r, gt[r], ct[r]);
    }
}

// --- optimizer ---------------------------------------------------------------------------------------------

// Three steps on the same state; p, m, v atol 1e-7, rtol 1e-5 (FMA contraction on the GPU; the
// division by sqrt(v) amplifies the relative error of v at most by 1/2).
Test(cuda, adamw) {
    seed(18);
    for (size_t si = 0; si < N_VEC_SIZES; si++) {
        size_t n = vec_sizes[si];
        float *p = hrand(n, -1, 1), *m = hbuf(n), *v = hbuf(n);
        float *dp = dcopy(p, n), *dm = dcopy(m, n), *dv = dcopy(v, n);
        float b1 = 0.9f, b2 = 0.999f;
        for (int t = 1; t <= 3; t++) {
            float *g = hrand(n, -0.1f, 0.1f), *dg = dcopy(g, n);
            float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
            C->adamw(p, g, m, v, n, 1e-3f, b1, b2, 1e-8f, 0.01f, bc1, bc2, 0.8f);
            G->adamw(dp, dg, dm, dv, n, 1e-3f, b1, b2, 1e-8f, 0.01f, bc1, bc2, 0.8f);
        }
        expect_close("adamw p", hback(dp, n), p, n, 1e-7, 1e-5);
        expect_close("adamw m", hback(dm, n), m, n, 1e-7, 1e-5);
        expect_close("adamw v", hback(dv, n), v, n, 1e-7, 1e-5);
        teardown();
    }
}

// --- unsupported sizes fail loudly ----------------------------------------------------------------------------

// Runs fn in a child process and expects it to abort with `expect` in its stderr. The backend
// checks sizes on the host before touching the device, so the child never uses CUDA (which it
// could not: the parent has initialised it).
static void expect_abort(void (*fn)(void), const char *expect) {
    int fd[2];
    cr_assert(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn();
        _exit(0);   // not reached when the backend aborts
    }
    close(fd[1]);
    char buf[1024];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    buf[got] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "expected an abort for \"%s\"; status %d, stderr: %s", expect,
              st, buf);
    cr_assert(strstr(buf, expect) != NULL, "expected \"%s\" in stderr, got: %s", expect, buf);
}

static void bad_head_dim(void) {
    int start = 0, len = 1;
    kern_packed_attn_t a = {.start = &start, .len = &len, .n_seqs = 1, .n_tokens = 1, .n_heads = 1, .n_kv_heads = 1,
                            .head_dim = 300, .max_len = 1};
    float x = 0;
    G->attn_fwd(&x, &x, &x, &x, &x, &a);
}

static void bad_rank(void) {
    kern_lora_seg_t s = {.row0 = 0, .n_rows = 1, .rank = 9, .A = (const float *)8, .B = (const float *)8, .scale = 1};
    float x = 0;
    G->lora_shrink(&x, 8, &x, 1, &s, 1);
}

static void bad_target(void) {
    int32_t t = 5;
    float x = 0;
    G->token_logprobs(&x, NULL, &x, &t, 1, 5, 1.0f);
}

static void bad_ld_bf16(void) {
    float x = 0;
    uint16_t w = 0;
    G->gemm_bf16w(true, 1, 1, 8, 1.0f, &x, 2, &w, 8, 0.0f, &x, 1);
}

static void bad_ldw_bf16(void) {
    float x = 0;
    uint16_t w = 0;
    G->gemm_bf16w(false, 1, 6, 8, 1.0f, &x, 8, &w, 5, 0.0f, &x, 6);
}

static void bad_top_k(void) {
    float x = 0, T[2] = {0.0f, 1.0f}, P[2] = {1.0f, 1.0f}, U[2] = {0.5f, 0.5f};
    int K[2] = {0, 5000};
    int32_t tok[2];
    G->sample(tok, NULL, &x, 2, 10000, T, K, P, U);
}

static void bad_u(void) {
    float x = 0, T = 0.5f, P = 1.0f, U = 1.0f;
    int K = 0;
    int32_t tok;
    G->sample(&tok, NULL, &x, 1, 10, &T, &K, &P, &U);
}

static void bad_vocab(void) {
    float x = 0, T = 0.5f, P = 1.0f, U = 0.0f;
    int K = 0;
    int32_t tok;
    G->sample(&tok, NULL, &x, 1, 0, &T, &K, &P, &U);
}

Test(cuda, unsupported_sizes_abort) {
    expect_abort(bad_ld_bf16, "marlaas cuda: gemm_bf16w failed: ldx 2 must be >= K 8");
    expect_abort(bad_ldw_bf16, "marlaas cuda: gemm_bf16w failed: ldw 5 must be >= N 6 (W not transposed)");
    expect_abort(bad_top_k, "marlaas cuda: sample failed: row 1: top_k 5000 > 4096");
    expect_abort(bad_u, "marlaas cuda: sample failed: row 0: u = 1 outside [0, 1)");
    expect_abort(bad_vocab, "marlaas cuda: sample failed: V 0 outside the supported range 1..16777216");
    expect_abort(bad_head_dim, "marlaas cuda: attn_fwd failed: head_dim 300 outside the supported range 1..256");
    expect_abort(bad_rank, "marlaas cuda: lora_shrink failed: segment 0: rank 9 > ldt 8");
    expect_abort(bad_target, "marlaas cuda: token_logprobs failed: target[0] = 5 outside 0..4");
}

// test_cpu_isa.c - the CPU backend's kernel variants (kernels_cpu_variant: amx, avx512-bf16,
// avx512, avx2, scalar; each one this CPU runs): the few-rows products (gemm with trans_b and gemm_bf16w
// with trans_w at M <= 8: the GEMV kernels; M = 9 crosses to the many-rows paths) against a double-precision
// reference, with row strides larger than the rows, alpha and beta (beta = 0 over a NaN-filled
// C), odd sizes; the variants against each other; a row's result independent of the rows beside
// it and of the thread count; and the choice of the variant (MARLAAS_CPU_ISA honoured, a bad
// value refused).
//
// Tolerances: an fp32 dot product of K terms summed in any order, with or without FMA, is within
// K u sum_k |x_k w_k| of the exact one (u = 2^-24); the checks allow twice that plus the alpha
// and beta roundings, ~1e-6 relative at these sizes, far below a wrong index (O(1)). The
// avx512-bf16 variant's few-rows gemm_bf16w rounds X to bf16 first (kernels.h): it is checked
// against the reference on the rounded X with the same bound (its products of two bf16 are exact
// in fp32; bf16 subnormals, flushed by vdpbf16ps, do not occur in these inputs), and against the
// other variants with the rounding's own bound added, 2^-8 |alpha| sum_k |x_k w_k| (bf16 keeps 8
// significant bits). The avx512-bf16 and amx variants round X in gemm_bf16w beyond the few rows
// too (vdpbf16ps or AMX tiles, both directions): checked the same way at many rows, with and
// without trans_w.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/pool.h"
#include "kernels/kernels.h"

static const char *const isas[] = {"amx", "avx512-bf16", "avx512", "avx2", "scalar"};
#define N_ISAS (sizeof isas / sizeof *isas)

// The few-rows paths' bounds in kernels/cpu/cpu.c (GEMV_MAX_M, BF16_SMALL_M): the sizes the
// tests cross.
#define GEMV_M 8
#define BF16_M 8

// splitmix64: fixed inputs every run.
static uint64_t ci_state;
static uint64_t ci_next(void) {
    uint64_t z = (ci_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float ci_unif(float lo, float hi) { return lo + (hi - lo) * (float)((ci_next() >> 40) * 0x1p-24); }

// One problem: C (M,N) = alpha X W^T + beta C, W (N,K) fp32 (gemm) or bf16 (gemm_bf16w).
typedef struct {
    bool bf16;
    int M, N, K, ldx, ldw, ldc;
    float alpha, beta;
    float *X, *Xr;   // Xr: X rounded to bf16 (as floats)
    float *Wf;       // W as floats (the bf16 values for bf16)
    uint16_t *W16;
    float *C0;
} prob_t;

static prob_t prob_new(bool bf16, int M, int N, int K, float alpha, float beta, int pad, bool nan_c) {
    const kernels_t *k = kernels_cpu();
    prob_t p = {.bf16 = bf16, .M = M, .N = N, .K = K, .ldx = K + pad, .ldw = K + 2 * pad, .ldc = N + pad,
                .alpha = alpha, .beta = beta};
    size_t nx = (size_t)M * p.ldx, nw = (size_t)N * p.ldw, nc = (size_t)M * p.ldc;
    p.X = k->alloc(sizeof(float) * nx);
    p.Xr = k->alloc(sizeof(float) * nx);
    p.Wf = k->alloc(sizeof(float) * nw);
    p.W16 = k->alloc(sizeof(uint16_t) * (nx > nw ? nx : nw));
    p.C0 = k->alloc(sizeof(float) * nc);
    for (size_t i = 0; i < nx; i++) p.X[i] = ci_unif(-1, 1);
    for (size_t i = 0; i < nw; i++) p.Wf[i] = ci_unif(-1, 1);
    for (size_t i = 0; i < nc; i++) p.C0[i] = nan_c ? NAN : ci_unif(-1, 1);
    k->to_bf16(p.W16, p.X, nx);
    k->from_bf16(p.Xr, p.W16, nx);
    if (bf16) {
        k->to_bf16(p.W16, p.Wf, nw);
        k->from_bf16(p.Wf, p.W16, nw);   // the exact values the op multiplies by
    }
    return p;
}

static void prob_free(prob_t *p) {
    const kernels_t *k = kernels_cpu();
    k->free(p->X);
    k->free(p->Xr);
    k->free(p->Wf);
    k->free(p->W16);
    k->free(p->C0);
}

// C = C0, then the op of variant k.
static float *prob_run(const prob_t *p, const kernels_t *k) {
    float *C = k->alloc(sizeof(float) * (size_t)p->M * p->ldc);
    memcpy(C, p->C0, sizeof(float) * (size_t)p->M * p->ldc);
    if (p->bf16)
        k->gemm_bf16w(true, p->M, p->N, p->K, p->alpha, p->X, p->ldx, p->W16, p->ldw, p->beta, C, p->ldc);
    else
        k->gemm(false, true, p->M, p->N, p->K, p->alpha, p->X, p->ldx, p->Wf, p->ldw, p->beta, C, p->ldc);
    return C;
}

// Does variant isa round X on this problem?
static bool rounds_x(const prob_t *p, const char *isa) {
    return p->bf16 && (!strcmp(isa, "avx512-bf16") || !strcmp(isa, "amx"));   // trans_w here
}

// The exact C[i, j] (X rounded or not) and its error bound.
static double ref(const prob_t *p, bool xr, int i, int j, double *bound, double *mag_out) {
    const float *X = xr ? p->Xr : p->X;
    double s = 0.0, mag = 0.0;
    for (int k = 0; k < p->K; k++) {
        double t = (double)X[(size_t)i * p->ldx + k] * p->Wf[(size_t)j * p->ldw + k];
        s += t;
        mag += fabs(t);
    }
    double c0 = p->C0[(size_t)i * p->ldc + j];
    double bc = p->beta == 0.0f ? 0.0 : (double)p->beta * c0;   // beta = 0: C is not read
    *bound = 2.0 * ((p->K + 2) * 0x1p-24 * fabs(p->alpha) * mag + 0x1p-23 * fabs(bc)) + p->K * 0x1p-126 + 1e-30;
    if (mag_out) *mag_out = mag;
    return (double)p->alpha * s + bc;
}

static void check(const prob_t *p, const char *isa, const float *C) {
    bool xr = rounds_x(p, isa);
    for (int i = 0; i < p->M; i++)
        for (int j = 0; j < p->ldc; j++) {
            float got = C[(size_t)i * p->ldc + j], c0 = p->C0[(size_t)i * p->ldc + j];
            if (j >= p->N) {   // padding: untouched
                cr_assert(memcmp(&got, &c0, sizeof got) == 0, "%s %s M=%d N=%d K=%d: padding C[%d,%d] changed",
                          isa, p->bf16 ? "gemm_bf16w" : "gemm", p->M, p->N, p->K, i, j);
                continue;
            }
            double bound, want = ref(p, xr, i, j, &bound, NULL);
            cr_assert(fabs(got - want) <= bound,
                      "%s %s M=%d N=%d K=%d alpha=%g beta=%g ld=%d,%d,%d: C[%d,%d] = %.9g, want %.9g%s (bound %.3g)",
                      isa, p->bf16 ? "gemm_bf16w" : "gemm", p->M, p->N, p->K, p->alpha, p->beta, p->ldx, p->ldw,
                      p->ldc, i, j, got, want, xr ? " (X rounded to bf16)" : "", bound);
        }
}

// Variant b's C against variant a's: each within its bound of its reference, so within the sum
// of the bounds of each other, plus the rounding of X where one of them rounds it.
static void check_agree(const prob_t *p, const char *isa_a, const float *Ca, const char *isa_b, const float *Cb) {
    bool ra = rounds_x(p, isa_a), rb = rounds_x(p, isa_b);
    for (int i = 0; i < p->M; i++)
        for (int j = 0; j < p->N; j++) {
            double ba, bb, mag;
            ref(p, ra, i, j, &ba, &mag);
            ref(p, rb, i, j, &bb, NULL);
            double tol = ba + bb + (ra != rb ? 0x1p-8 * fabs(p->alpha) * mag * 1.01 : 0.0);
            double a = Ca[(size_t)i * p->ldc + j], b = Cb[(size_t)i * p->ldc + j];
            cr_assert(fabs(a - b) <= tol, "%s vs %s, %s M=%d N=%d K=%d: C[%d,%d] = %.9g vs %.9g (tolerance %.3g)",
                      isa_a, isa_b, p->bf16 ? "gemm_bf16w" : "gemm", p->M, p->N, p->K, i, j, a, b, tol);
        }
}

// Every runnable variant on one problem, against the reference and against kernels_cpu()'s.
static void run_all(bool bf16, int M, int N, int K, float alpha, float beta, int pad, bool nan_c) {
    prob_t p = prob_new(bf16, M, N, K, alpha, beta, pad, nan_c);
    float *base = prob_run(&p, kernels_cpu());
    for (size_t v = 0; v < N_ISAS; v++) {
        const kernels_t *k = kernels_cpu_variant(isas[v]);
        if (!k) continue;
        float *C = prob_run(&p, k);
        check(&p, isas[v], C);
        check_agree(&p, kernels_cpu_isa(), base, isas[v], C);
        k->free(C);
    }
    kernels_cpu()->free(base);
    prob_free(&p);
}

static void run_sizes(bool bf16) {
    static const int Ns[] = {1, 7, 33, 515};
    static const int Ks[] = {1, 7, 33, 515};
    int maxm = (bf16 ? BF16_M : GEMV_M) + 1;
    ci_state = bf16 ? 11 : 10;
    for (int M = 1; M <= maxm; M++)
        for (int ni = 0; ni < 4; ni++)
            for (int ki = 0; ki < 4; ki++) {
                int v = M + ni + ki;
                float alpha = v % 3 ? 0.7f : 1.0f, beta = v % 2 ? 0.3f : 0.0f;
                run_all(bf16, M, Ns[ni], Ks[ki], alpha, beta, v % 4 == 0 ? 0 : 1 + v % 5, beta == 0.0f && v % 4 == 1);
            }
}

Test(cpu_isa, the_variant_in_use_is_one_of_the_runnable) {
    const char *isa = kernels_cpu_isa();
    cr_assert_not_null(isa);
    cr_assert_eq(kernels_cpu_variant(isa), kernels_cpu(), "kernels_cpu_variant(\"%s\") is kernels_cpu()", isa);
    cr_assert_str_eq(kernels_cpu()->name, "cpu");
    cr_assert_not_null(kernels_cpu_variant("scalar"), "the scalar variant runs everywhere");
    cr_assert_null(kernels_cpu_variant("avx3"));
    cr_assert_null(kernels_cpu_variant(NULL));
    // the best runnable one is chosen (MARLAAS_CPU_ISA is not set by the test runner)
    if (!getenv("MARLAAS_CPU_ISA"))
        for (size_t v = 0; v < N_ISAS; v++)
            if (kernels_cpu_variant(isas[v])) {
                cr_assert_str_eq(isa, isas[v], "the best variant this CPU runs");
                break;
            }
}

Test(cpu_isa, gemm_few_rows_every_variant) { run_sizes(false); }
Test(cpu_isa, gemm_bf16w_few_rows_every_variant) { run_sizes(true); }

// NaN in C with beta = 0 never reaches the result; K = 0 gives beta * C.
Test(cpu_isa, beta_zero_and_k_zero) {
    ci_state = 12;
    for (int b = 0; b < 2; b++) {
        run_all(b, 3, 515, 33, 1.0f, 0.0f, 3, true);
        run_all(b, 1, 40, 515, 0.5f, 0.0f, 0, true);
    }
    for (size_t v = 0; v < N_ISAS; v++) {
        const kernels_t *k = kernels_cpu_variant(isas[v]);
        if (!k) continue;
        float C[6] = {1, 2, 3, 4, 5, 6}, x = 1, w = 1;
        uint16_t w16 = 0x3f80;
        k->gemm(false, true, 2, 3, 0, 1.0f, &x, 1, &w, 1, 0.5f, C, 3);
        for (int i = 0; i < 6; i++) cr_assert(C[i] == 0.5f * (float)(i + 1), "%s gemm K=0: C[%d] = %g", isas[v], i, C[i]);
        k->gemm_bf16w(true, 2, 3, 0, 1.0f, &x, 1, &w16, 1, 0.0f, C, 3);
        for (int i = 0; i < 6; i++) cr_assert(C[i] == 0.0f, "%s gemm_bf16w K=0 beta=0: C[%d] = %g", isas[v], i, C[i]);
    }
}

// The avx512-bf16 variant rounds X to bf16 to nearest, ties to even, as to_bf16 does: X holding
// the midpoints 1 + 2^-8 (-> 1) and 1 + 3 2^-8 (-> 1 + 2^-6) and a value just above a midpoint
// (-> up), against W = 1: the sums are exact.
Test(cpu_isa, bf16_x_rounding_ties_to_even) {
    const kernels_t *k = kernels_cpu_variant("avx512-bf16");
    if (!k) cr_skip_test("this CPU cannot run the avx512-bf16 variant");
    enum { K = 37 };   // two full vectors of 16 and a tail
    float x[K], c = -1.0f;
    uint16_t w[K];
    double want = 0.0;
    for (int i = 0; i < K; i++) {
        w[i] = 0x3f80;   // 1
        int kind = i % 3;
        x[i] = kind == 0 ? 1.0f + 0x1p-8f : kind == 1 ? 1.0f + 3 * 0x1p-8f : 1.0f + 0x1p-8f + 0x1p-20f;
        want += kind == 0 ? 1.0 : kind == 1 ? 1.0 + 0x1p-6 : 1.0 + 0x1p-7;
    }
    k->gemm_bf16w(true, 1, 1, K, 1.0f, x, K, w, K, 0.0f, &c, 1);
    cr_assert_eq(c, (float)want, "sum of the rounded X: %.9g, want %.9g", c, want);
}

// Each (i, j) is summed in the same order whatever the other rows and the thread count: row i of
// a 4-row product equals the 1-row product of row i, and 2 threads equal 1, bit for bit (W large
// enough for the kernels to use threads).
Test(cpu_isa, rows_and_threads_do_not_change_the_bits) {
    ci_state = 13;
    for (int b = 0; b < 2; b++) {
        prob_t p = prob_new(b, 4, 4100, 300, 1.0f, 0.0f, 1, false);
        for (size_t v = 0; v < N_ISAS; v++) {
            const kernels_t *k = kernels_cpu_variant(isas[v]);
            if (!k) continue;
            omp_set_num_threads(1);
            float *one = prob_run(&p, k);
            omp_set_num_threads(2);
            float *two = prob_run(&p, k);
            omp_set_num_threads(1);
            cr_assert(memcmp(one, two, sizeof(float) * (size_t)p.M * p.ldc) == 0,
                      "%s %s: 2 threads computed other bits than 1", isas[v], b ? "gemm_bf16w" : "gemm");
            for (int i = 0; i < p.M; i++) {
                prob_t q = p;   // row i alone
                q.M = 1;
                q.X = p.X + (size_t)i * p.ldx;
                q.C0 = p.C0 + (size_t)i * p.ldc;
                float *row = prob_run(&q, k);
                cr_assert(memcmp(row, one + (size_t)i * p.ldc, sizeof(float) * (size_t)p.N) == 0,
                          "%s %s: row %d alone differs from row %d of 4", isas[v], b ? "gemm_bf16w" : "gemm", i, i);
                k->free(row);
            }
            k->free(one);
            k->free(two);
        }
        prob_free(&p);
    }
}

// The many-rows paths of the variants that round X (amx: AMX tiles; avx512-bf16: vdpbf16ps
// register tiles): gemm_bf16w at M > BF16_M, with trans_w (W (N, K)) and without (W (K, N)),
// sizes off the 16 / 32 multiples and the tiles' 6 / 8 / 12 rows, strides above the rows, alpha
// and beta (beta = 0 over NaN), against the double-precision reference on X rounded to bf16 and
// against the avx512 variant (X exact) within the rounding's bound; 2 threads give the bits of 1.
static void rounding_case(const char *isa, const kernels_t *kv, const kernels_t *ref_k, bool trans, int M, int N,
                          int K, float alpha, float beta) {
    const kernels_t *k = kernels_cpu();
    int ldx = K + 3, wr = trans ? N : K, wc = trans ? K : N, ldw = wc + 5, ldc = N + 2;
    float *X = k->alloc(sizeof(float) * (size_t)M * ldx), *Xr = k->alloc(sizeof(float) * (size_t)M * ldx);
    float *Wf = k->alloc(sizeof(float) * (size_t)wr * ldw);
    uint16_t *W16 = k->alloc(sizeof(uint16_t) * (size_t)(M * ldx > wr * ldw ? M * ldx : wr * ldw));
    float *C0 = k->alloc(sizeof(float) * (size_t)M * ldc), *C = k->alloc(sizeof(float) * (size_t)M * ldc);
    float *Ce = k->alloc(sizeof(float) * (size_t)M * ldc), *C1 = k->alloc(sizeof(float) * (size_t)M * ldc);
    for (int i = 0; i < M * ldx; i++) X[i] = ci_unif(-1, 1);
    for (int i = 0; i < wr * ldw; i++) Wf[i] = ci_unif(-1, 1);
    for (int i = 0; i < M * ldc; i++) C0[i] = beta == 0.0f ? NAN : ci_unif(-1, 1);
    k->to_bf16(W16, X, (size_t)M * ldx);
    k->from_bf16(Xr, W16, (size_t)M * ldx);
    k->to_bf16(W16, Wf, (size_t)wr * ldw);
    k->from_bf16(Wf, W16, (size_t)wr * ldw);
    memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
    memcpy(Ce, C0, sizeof(float) * (size_t)M * ldc);
    memcpy(C1, C0, sizeof(float) * (size_t)M * ldc);
    kpool_set_threads(2);
    kv->gemm_bf16w(trans, M, N, K, alpha, X, ldx, W16, ldw, beta, C, ldc);
    kpool_set_threads(1);
    kv->gemm_bf16w(trans, M, N, K, alpha, X, ldx, W16, ldw, beta, C1, ldc);
    ref_k->gemm_bf16w(trans, M, N, K, alpha, X, ldx, W16, ldw, beta, Ce, ldc);
    kpool_set_threads(2);
    cr_assert(memcmp(C, C1, sizeof(float) * (size_t)M * ldc) == 0, "%s trans=%d M=%d N=%d K=%d: 2 threads != 1",
              isa, trans, M, N, K);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            float got = C[(size_t)i * ldc + j], c0 = C0[(size_t)i * ldc + j];
            if (j >= N) {
                cr_assert(memcmp(&got, &c0, sizeof got) == 0, "%s: padding C[%d,%d] changed", isa, i, j);
                continue;
            }
            double sr = 0, se = 0, mag = 0;
            for (int q = 0; q < K; q++) {
                double w = trans ? Wf[(size_t)j * ldw + q] : Wf[(size_t)q * ldw + j];
                sr += (double)Xr[(size_t)i * ldx + q] * w;
                se += (double)X[(size_t)i * ldx + q] * w;
                mag += fabs((double)X[(size_t)i * ldx + q] * w);
            }
            double bc = beta == 0.0f ? 0.0 : (double)beta * c0;
            double bound = 2.0 * ((K + 2) * 0x1p-24 * fabs(alpha) * mag * 1.01 + 0x1p-23 * fabs(bc)) + 1e-30;
            double want = alpha * sr + bc;
            cr_assert(fabs(got - want) <= bound, "%s trans=%d M=%d N=%d K=%d: C[%d,%d] = %.9g, want %.9g (bound %.3g)",
                      isa, trans, M, N, K, i, j, got, want, bound);
            double exact = Ce[(size_t)i * ldc + j], tol = 2 * bound + 0x1p-8 * fabs(alpha) * mag * 1.01;
            cr_assert(fabs(got - exact) <= tol && fabs(exact - (alpha * se + bc)) <= bound,
                      "%s vs X exact, trans=%d M=%d N=%d K=%d: C[%d,%d] = %.9g vs %.9g", isa, trans, M, N, K, i, j, got, exact);
        }
    k->free(X), k->free(Xr), k->free(Wf), k->free(W16), k->free(C0), k->free(C), k->free(Ce), k->free(C1);
}

static void many_rows(const char *isa) {
    const kernels_t *k = kernels_cpu_variant(isa), *ref_k = kernels_cpu_variant("avx512");
    if (!k) cr_skip_test("this CPU (or its kernel) cannot run the %s variant", isa);
    ci_state = 14;
    static const int Ms[] = {9, 16, 33, 70}, Ns[] = {1, 16, 33, 100}, Ks[] = {1, 31, 33, 100};
    for (int t = 0; t < 2; t++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 4; c++) {
                    int v = a + b + c + t;
                    rounding_case(isa, k, ref_k, t, Ms[a], Ns[b], Ks[c], v % 3 ? 0.7f : 1.0f, v % 2 ? 0.3f : 0.0f);
                }
    rounding_case(isa, k, ref_k, true, 512, 300, 520, 1.0f, 0.0f);   // many blocks on the pool
    rounding_case(isa, k, ref_k, false, 512, 520, 300, 1.0f, 1.0f);
    // avx512-bf16 bounds its buffers: blocks of X's rows (trans_w, long K) or of K (without)
    rounding_case(isa, k, ref_k, true, 300, 40, 16400, 0.7f, 0.3f);
    rounding_case(isa, k, ref_k, false, 20, 1000, 5000, 0.7f, 0.3f);
}

Test(cpu_isa, gemm_bf16w_many_rows_amx) { many_rows("amx"); }
Test(cpu_isa, gemm_bf16w_many_rows_avx512_bf16) { many_rows("avx512-bf16"); }

// --- the choice of the variant -------------------------------------------------------------------
// Made once per process, at the first kernels_cpu(): each Criterion test runs in a process of its
// own, so .init sets MARLAAS_CPU_ISA before it.

static void want_avx2(void) { setenv("MARLAAS_CPU_ISA", "avx2", 1); }
static void want_scalar(void) { setenv("MARLAAS_CPU_ISA", "scalar", 1); }

Test(cpu_isa, override_avx2, .init = want_avx2) {
    if (!kernels_cpu_variant("avx2")) cr_skip_test("this CPU cannot run the avx2 variant");
    cr_assert_str_eq(kernels_cpu_isa(), "avx2");
    cr_assert_eq(kernels_cpu(), kernels_cpu_variant("avx2"));
}

Test(cpu_isa, override_scalar, .init = want_scalar) {
    cr_assert_str_eq(kernels_cpu_isa(), "scalar");
    cr_assert_eq(kernels_cpu(), kernels_cpu_variant("scalar"));
}

// kernels_cpu() in a child process with MARLAAS_CPU_ISA=isa: its exit status, its stderr in err.
static int child_choice(const char *isa, char *err, size_t n) {
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        setenv("MARLAAS_CPU_ISA", isa, 1);
        kernels_cpu();
        _exit(0);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t r;
    while (len + 1 < n && (r = read(fd[0], err + len, n - 1 - len)) > 0) len += (size_t)r;
    err[len] = 0;
    close(fd[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A value that names no variant, or one this CPU cannot run: exit status 2, and a message that
// names the valid values and the CPU's best.
Test(cpu_isa, bad_override_refused) {
    char err[512], best[32] = "";
    for (size_t v = 0; v < N_ISAS && !best[0]; v++)
        if (kernels_cpu_variant(isas[v])) snprintf(best, sizeof best, "%s", isas[v]);
    cr_assert_eq(child_choice("avx3", err, sizeof err), 2, "MARLAAS_CPU_ISA=avx3: %s", err);
    cr_assert(strstr(err, "MARLAAS_CPU_ISA=avx3") && strstr(err, "amx, avx512-bf16, avx512, avx2, scalar") && strstr(err, best),
              "the message names the value, the valid ones and the best (%s): %s", best, err);
    cr_assert_eq(child_choice("scalar", err, sizeof err), 0, "MARLAAS_CPU_ISA=scalar: %s", err);
    for (size_t v = 0; v < N_ISAS; v++)
        if (!kernels_cpu_variant(isas[v])) {
            cr_assert_eq(child_choice(isas[v], err, sizeof err), 2, "MARLAAS_CPU_ISA=%s (not runnable here): %s",
                         isas[v], err);
            cr_assert(strstr(err, "cannot run") && strstr(err, best), "%s", err);
        }
}

// gemm_parts: each part's C equals that of its own call (gemm with trans_b, or the variant's
// gemm_bf16w with trans_w), bit for bit, on every variant: 1 to 9 rows (the few-rows loop and the
// separate calls beyond it), parts of one chunk and of many, beta 0 over NaN and beta 1, one part
// and four, 1 and 2 threads; parts of mixed precision take the separate calls.
static void parts_case(const char *isa, const kernels_t *k, bool bf16, int M, int K, int n, const int *Ns) {
    const kernels_t *h = kernels_cpu();
    float *X = h->alloc(sizeof(float) * (size_t)M * K);
    for (int i = 0; i < M * K; i++) X[i] = ci_unif(-1, 1);
    kern_part_t parts[KERN_PARTS_MAX];
    float *Wf[KERN_PARTS_MAX], *want[KERN_PARTS_MAX], *got[KERN_PARTS_MAX];
    uint16_t *W16[KERN_PARTS_MAX];
    for (int p = 0; p < n; p++) {
        size_t nw = (size_t)Ns[p] * K, nc = (size_t)M * Ns[p];
        Wf[p] = h->alloc(sizeof(float) * nw);
        W16[p] = h->alloc(sizeof(uint16_t) * nw);
        want[p] = h->alloc(sizeof(float) * nc);
        got[p] = h->alloc(sizeof(float) * nc);
        for (size_t i = 0; i < nw; i++) Wf[p][i] = ci_unif(-1, 1);
        h->to_bf16(W16[p], Wf[p], nw);
        float beta = p % 2 ? 1.0f : 0.0f;
        parts[p] = (kern_part_t){.W = bf16 ? NULL : Wf[p], .W16 = bf16 ? W16[p] : NULL, .N = Ns[p], .beta = beta,
                                 .C = got[p]};
    }
    for (int t = 1; t <= 2; t++) {
        kpool_set_threads(t);
        for (int p = 0; p < n; p++) {   // C's start (NaN where beta = 0), then the separate call
            size_t nc = (size_t)M * Ns[p];
            for (size_t i = 0; i < nc; i++) got[p][i] = parts[p].beta == 0.0f ? NAN : (float)(i % 11) - 5.0f;
            memcpy(want[p], got[p], sizeof(float) * nc);
            if (bf16)
                k->gemm_bf16w(true, M, Ns[p], K, 1.0f, X, K, W16[p], K, parts[p].beta, want[p], Ns[p]);
            else
                k->gemm(false, true, M, Ns[p], K, 1.0f, X, K, Wf[p], K, parts[p].beta, want[p], Ns[p]);
        }
        k->gemm_parts(M, K, X, parts, n);
        for (int p = 0; p < n; p++)
            cr_assert(memcmp(got[p], want[p], sizeof(float) * (size_t)M * Ns[p]) == 0,
                      "%s %s gemm_parts M=%d K=%d part %d of %d (N=%d), %d threads: not the bits of its own call", isa,
                      bf16 ? "bf16" : "fp32", M, K, p, n, Ns[p], t);
    }
    kpool_set_threads(2);
    for (int p = 0; p < n; p++) h->free(Wf[p]), h->free(W16[p]), h->free(want[p]), h->free(got[p]);
    h->free(X);
}

Test(cpu_isa, gemm_parts_are_the_separate_calls) {
    static const int Ns[][KERN_PARTS_MAX] = {{512, 256, 256, 0}, {1, 70, 300, 33}, {1536, 1536, 0, 0}, {65, 0, 0, 0}};
    static const int ns[] = {3, 4, 2, 1};
    for (size_t v = 0; v < N_ISAS; v++) {
        const kernels_t *k = kernels_cpu_variant(isas[v]);
        if (!k) continue;
        cr_assert_not_null(k->gemm_parts, "%s has gemm_parts", isas[v]);
        ci_state = 15;
        for (int b = 0; b < 2; b++)
            for (int M = 1; M <= 9; M += (M < 3 ? 1 : 3))
                for (int c = 0; c < 4; c++) parts_case(isas[v], k, b, M, c % 2 ? 257 : 512, ns[c], Ns[c]);
    }
    // mixed precision: the separate calls
    const kernels_t *k = kernels_cpu();
    float X[2 * 8], Wf[3 * 8], C1[2 * 3], C2[2 * 3], ref1[2 * 3], ref2[2 * 3];
    uint16_t W16[3 * 8];
    for (int i = 0; i < 16; i++) X[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < 24; i++) Wf[i] = (float)(i % 7) - 3.0f;
    k->to_bf16(W16, Wf, 24);
    k->gemm(false, true, 2, 3, 8, 1.0f, X, 8, Wf, 8, 0.0f, ref1, 3);
    k->gemm_bf16w(true, 2, 3, 8, 1.0f, X, 8, W16, 8, 0.0f, ref2, 3);
    kern_part_t mixed[2] = {{.W = Wf, .N = 3, .C = C1}, {.W16 = W16, .N = 3, .C = C2}};
    k->gemm_parts(2, 8, X, mixed, 2);
    cr_assert(memcmp(C1, ref1, sizeof C1) == 0 && memcmp(C2, ref2, sizeof C2) == 0, "mixed precision parts");
}

// The few-rows products cut W's rows into guided chunks that depend on the pool's thread count
// and on W's size (kernels/cpu/cpu.c, gemv_cuts): every thread count gives the bits of one thread
// (and so every row is computed once, and rows left out would stay NaN), for gemm and
// gemm_bf16w on every variant, sizes off the 8-row cuts and the 64-row blocks, and gemm_parts
// with as many threads gives the bits of the separate calls on one.
Test(cpu_isa, few_rows_chunks_and_threads_do_not_change_the_bits) {
    static const int sizes[][2] = {{1000, 300}, {77, 4100}, {2050, 96}, {9, 20000}, {4864, 64}};
    static const int threads[] = {2, 3, 4, 8, 32};
    const kernels_t *h = kernels_cpu();
    ci_state = 21;
    for (size_t v = 0; v < N_ISAS; v++) {
        const kernels_t *k = kernels_cpu_variant(isas[v]);
        if (!k) continue;
        for (int b = 0; b < 2; b++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                for (int M = 1; M <= GEMV_M; M += 3) {
                    int N = sizes[s][0], K = sizes[s][1];
                    float *X = h->alloc(sizeof(float) * (size_t)M * K), *W = h->alloc(sizeof(float) * (size_t)N * K);
                    uint16_t *W16 = h->alloc(sizeof(uint16_t) * (size_t)N * K);
                    float *one = h->alloc(sizeof(float) * (size_t)M * N), *got = h->alloc(sizeof(float) * (size_t)M * N);
                    for (int i = 0; i < M * K; i++) X[i] = ci_unif(-1, 1);
                    for (size_t i = 0; i < (size_t)N * K; i++) W[i] = ci_unif(-1, 1);
                    h->to_bf16(W16, W, (size_t)N * K);
                    for (int ti = -1; ti < (int)(sizeof threads / sizeof *threads); ti++) {
                        kpool_set_threads(ti < 0 ? 1 : threads[ti]);
                        float *C = ti < 0 ? one : got;
                        for (int i = 0; i < M * N; i++) C[i] = NAN;
                        if (b) k->gemm_bf16w(true, M, N, K, 1.0f, X, K, W16, K, 0.0f, C, N);
                        else k->gemm(false, true, M, N, K, 1.0f, X, K, W, K, 0.0f, C, N);
                        if (ti < 0) {
                            for (int i = 0; i < M * N; i++)
                                cr_assert(!isnan(one[i]), "%s M=%d N=%d K=%d: C[%d] not computed", isas[v], M, N, K, i);
                            continue;
                        }
                        cr_assert(memcmp(got, one, sizeof(float) * (size_t)M * N) == 0,
                                  "%s %s M=%d N=%d K=%d: %d threads computed other bits than 1", isas[v],
                                  b ? "gemm_bf16w" : "gemm", M, N, K, threads[ti]);
                    }
                    kpool_set_threads(2);
                    h->free(X), h->free(W), h->free(W16), h->free(one), h->free(got);
                }
        static const int Ns[] = {700, 33, 1030};
        int K = 300, M = 3;
        float *X = h->alloc(sizeof(float) * (size_t)M * K);
        for (int i = 0; i < M * K; i++) X[i] = ci_unif(-1, 1);
        for (int b = 0; b < 2; b++) {
            kern_part_t parts[3];
            float *W[3], *want[3];
            uint16_t *W16[3];
            for (int p = 0; p < 3; p++) {
                W[p] = h->alloc(sizeof(float) * (size_t)Ns[p] * K);
                W16[p] = h->alloc(sizeof(uint16_t) * (size_t)Ns[p] * K);
                want[p] = h->alloc(sizeof(float) * (size_t)M * Ns[p]);
                for (int i = 0; i < Ns[p] * K; i++) W[p][i] = ci_unif(-1, 1);
                h->to_bf16(W16[p], W[p], (size_t)Ns[p] * K);
                kpool_set_threads(1);
                if (b) k->gemm_bf16w(true, M, Ns[p], K, 1.0f, X, K, W16[p], K, 0.0f, want[p], Ns[p]);
                else k->gemm(false, true, M, Ns[p], K, 1.0f, X, K, W[p], K, 0.0f, want[p], Ns[p]);
                parts[p] = (kern_part_t){.W = b ? NULL : W[p], .W16 = b ? W16[p] : NULL, .N = Ns[p],
                                         .C = h->alloc(sizeof(float) * (size_t)M * Ns[p])};
            }
            for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
                kpool_set_threads(threads[ti]);
                for (int p = 0; p < 3; p++)
                    for (int i = 0; i < M * Ns[p]; i++) parts[p].C[i] = NAN;
                k->gemm_parts(M, K, X, parts, 3);
                for (int p = 0; p < 3; p++)
                    cr_assert(memcmp(parts[p].C, want[p], sizeof(float) * (size_t)M * Ns[p]) == 0,
                              "%s %s gemm_parts part %d, %d threads: not the bits of its own call on one thread",
                              isas[v], b ? "bf16" : "fp32", p, threads[ti]);
            }
            kpool_set_threads(2);
            for (int p = 0; p < 3; p++) h->free(W[p]), h->free(W16[p]), h->free(want[p]), h->free(parts[p].C);
        }
        h->free(X);
    }
}

// The exponential the variants use for softmax and silu (cpu.c, "exp") is the C library's expf
// bit for bit: every 61st float bit pattern (negative and positive, normal and subnormal, every
// exponent), every 29th float in [-1, 0], the branch thresholds and their neighbours,
// +-0, +-inf and NaN, in runs of every length 1..40 (the vector loops' tails). A variant this CPU
// cannot run is left out.
static bool same_float(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4), memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

static void exp_check(const char *name, void (*fn)(float *, const float *, int), const float *x, int n, float *y) {
    fn(y, x, n);
    for (int i = 0; i < n; i++) {
        float want = expf(x[i]);
        cr_assert(same_float(y[i], want), "%s: exp(%a) = %a, expf gives %a", name, (double)x[i], (double)y[i],
                  (double)want);
    }
}

Test(cpu_isa, exp_is_the_librarys_expf_bit_for_bit) {
    struct {
        const char *isa;
        void (*fn)(float *, const float *, int);
    } v[3] = {{"avx512", kern_cpu_exp_avx512}, {"avx2", kern_cpu_exp_avx2}, {"scalar", kern_cpu_exp_scalar}};
    enum { B = 4096 };
    float *x = malloc(sizeof(float) * B), *y = malloc(sizeof(float) * B);
    int tested = 0;
    for (int k = 0; k < 3; k++) {
        if (!kernels_cpu_variant(v[k].isa)) continue;
        tested++;
        int n = 0;
        for (uint64_t b = 0; b <= 0xffffffffull; b += 61) {
            uint32_t u = (uint32_t)b;
            memcpy(&x[n++], &u, 4);
            if (n == B) exp_check(v[k].isa, v[k].fn, x, n, y), n = 0;
        }
        float lo = -1.0f;
        uint32_t u;
        memcpy(&u, &lo, 4);
        for (uint32_t w = u; w > 0x80000000u; w -= 29) {   // -1 .. -0 going up
            memcpy(&x[n++], &w, 4);
            if (n == B) exp_check(v[k].isa, v[k].fn, x, n, y), n = 0;
            if (w < 0x80000000u + 29) break;
        }
        const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.0f, -88.0f, 88.72283935546875f,
                                 -103.97207641601562f, 0x1p-149f, -0x1p-149f, 1e-30f, -87.9999f, 87.9999f};
        for (size_t s = 0; s < sizeof special / sizeof *special; s++)
            for (int d = -2; d <= 2; d++) {
                float f = special[s];
                if (isfinite(f) && d) f = nextafterf(f, d < 0 ? -INFINITY : INFINITY);
                if (isfinite(f) && (d == 2 || d == -2)) f = nextafterf(f, d < 0 ? -INFINITY : INFINITY);
                x[n++] = f;
            }
        exp_check(v[k].isa, v[k].fn, x, n, y);
        // every length of a run: the tails after whole vectors, with a slow lane anywhere
        for (int len = 1; len <= 40; len++)
            for (int slow = -1; slow < len; slow++) {
                for (int i = 0; i < len; i++) x[i] = -0.37f * (float)(i + 1) + 0.01f * (float)len;
                if (slow >= 0) x[slow] = slow % 2 ? -200.0f : 100.0f;
                exp_check(v[k].isa, v[k].fn, x, len, y);
            }
    }
    cr_assert_geq(tested, 1);
    free(x), free(y);
}

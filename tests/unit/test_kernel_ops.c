// test_kernel_ops.c - the CPU backend's bf16 ops (to_bf16, from_bf16, gemm_bf16w) against naive
// references, and its batched sampling op (sample) against common/engine/sampler.c's
// sampler_sample, which it must reproduce exactly given the same uniform draw.
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/engine/sampler.h"
#include "kernels/cpu/pool.h"
#include "kernels/kernels.h"
#include "tests/unit/testbits.h"

// splitmix64: fixed inputs every run.
static uint64_t tk_state;
static uint64_t tk_next(void) {
    uint64_t z = (tk_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float tk_unif(float lo, float hi) { return lo + (hi - lo) * (float)((tk_next() >> 40) * 0x1p-24); }

// --- bf16 conversion ----------------------------------------------------------------------------

// The value of bf16 bit pattern h as a double; the pattern after the largest finite one (0x7f80,
// inf) counts as 2^128, which makes "nearest" round to inf exactly from max + half an ulp, as
// IEEE overflow does.
static double bf16_value(uint16_t h) {
    if ((h & 0x7fff) == 0x7f80) return (h & 0x8000) ? -0x1p128 : 0x1p128;
    return (double)tu_u2f((uint32_t)h << 16);
}

// Reference rounding of a non-NaN float: the nearer of the two bf16 neighbours (truncation and
// the next pattern away from zero), the even one on a tie. Independent of the bit trick.
static uint16_t ref_to_bf16(float f) {
    uint32_t u = tu_f2u(f);
    uint16_t lo = (uint16_t)(u >> 16);
    if ((u & 0xffff) == 0 || (lo & 0x7fff) == 0x7f80) return lo;   // exact, or inf
    uint16_t hi = (uint16_t)(lo + 1);
    double x = fabs((double)f), dlo = fabs(bf16_value(lo)), dhi = fabs(bf16_value(hi));
    if (x - dlo < dhi - x) return lo;
    if (x - dlo > dhi - x) return hi;
    return (lo & 1) ? hi : lo;
}

Test(kernel_ops, bf16_rounding_every_pattern) {
    const kernels_t *K = kernels_cpu();
    // Every bf16 pattern with low halves covering exact, just below / at / just above the
    // midpoint, the extremes, and random bits: 65536 * 10 floats.
    static const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff, 0, 0};
    enum { NL = sizeof lows / sizeof lows[0] };
    size_t n = (size_t)65536 * NL;
    float *src = K->alloc(sizeof(float) * n);
    uint16_t *dst = K->alloc(sizeof(uint16_t) * n);
    tk_state = 1;
    for (uint32_t h = 0; h < 65536; h++)
        for (int l = 0; l < NL; l++) {
            uint32_t low = l < NL - 2 ? lows[l] : (uint32_t)(tk_next() & 0xffff);
            src[(size_t)h * NL + l] = tu_u2f((h << 16) | low);
        }
    K->to_bf16(dst, src, n);
    for (size_t i = 0; i < n; i++) {
        float f = src[i];
        if (isnan(f)) {
            uint16_t want = (uint16_t)((tu_f2u(f) >> 16) | 0x40);
            cr_assert(dst[i] == want, "NaN 0x%08x -> 0x%04x, want 0x%04x (quiet, sign and upper payload kept)", tu_f2u(f),
                      dst[i], want);
        } else {
            uint16_t want = ref_to_bf16(f);
            cr_assert(dst[i] == want, "%.9g (0x%08x) -> 0x%04x, want 0x%04x", f, tu_f2u(f), dst[i], want);
        }
    }
    K->free(src);
    K->free(dst);
}

Test(kernel_ops, bf16_special_values) {
    const kernels_t *K = kernels_cpu();
    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000, 0x3f80},   // 1
        {0x3f808000, 0x3f80},   // 1 + 2^-8: tie, even below
        {0x3f818000, 0x3f82},   // tie, odd below: up
        {0x3f808001, 0x3f81},   // just above the midpoint
        {0x3f807fff, 0x3f80},   // just below
        {0x80000000, 0x8000},   // -0
        {0x00000000, 0x0000},   // +0
        {0x00008000, 0x0000},   // subnormal tie, even below
        {0x00018000, 0x0002},   // subnormal tie, odd below
        {0x007fffff, 0x0080},   // largest subnormal rounds up to the smallest normal
        {0x7f7fffff, 0x7f80},   // FLT_MAX: overflow to inf
        {0x7f7f8000, 0x7f80},   // max bf16 + half an ulp: tie, even is inf
        {0x7f7f7fff, 0x7f7f},   // below it: max bf16
        {0xff7fffff, 0xff80},   // -FLT_MAX: -inf
        {0x7f800000, 0x7f80},   // inf
        {0xff800000, 0xff80},   // -inf
        {0x7fc00000, 0x7fc0},   // quiet NaN
        {0xffc00001, 0xffc0},   // negative NaN
        {0x7f800001, 0x7fc0},   // signalling NaN, payload only in the dropped half: still NaN
        {0x7fa00000, 0x7fe0},   // signalling NaN with upper payload: kept, quieted
    };
    int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < nc; i++) {
        float f = tu_u2f(cases[i].in), back;
        uint16_t h;
        K->to_bf16(&h, &f, 1);
        cr_assert(h == cases[i].out, "to_bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].in, h, cases[i].out);
        K->from_bf16(&back, &h, 1);
        cr_assert(tu_f2u(back) == (uint32_t)h << 16, "from_bf16(0x%04x) = 0x%08x", h, tu_f2u(back));
        if (isnan(f)) cr_assert(isnan(back));
    }
}

// from_bf16 is exact and to_bf16 inverts it on every pattern (NaNs come back quiet).
Test(kernel_ops, bf16_round_trip) {
    const kernels_t *K = kernels_cpu();
    uint16_t *h = K->alloc(sizeof(uint16_t) * 65536), *h2 = K->alloc(sizeof(uint16_t) * 65536);
    float *f = K->alloc(sizeof(float) * 65536);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    K->from_bf16(f, h, 65536);
    K->to_bf16(h2, f, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        cr_assert(tu_f2u(f[i]) == i << 16, "from_bf16(0x%04x) = 0x%08x", i, tu_f2u(f[i]));
        uint16_t want = isnan(f[i]) ? (uint16_t)(i | 0x40) : (uint16_t)i;
        cr_assert(h2[i] == want, "to_bf16(from_bf16(0x%04x)) = 0x%04x, want 0x%04x", i, h2[i], want);
    }
    K->free(h);
    K->free(h2);
    K->free(f);
}

// --- gemm_bf16w ----------------------------------------------------------------------------------

// trans_w: C = alpha X W^T + beta C, W (N,K); !trans_w: C = alpha X W + beta C, W (K,N); against
// a double-precision reference on the same (bf16) W. Error bound of an fp32 dot product of K
// terms in any order (with or without FMA, in one sum or in blocks added into C): K u sum |x w|
// with u = 2^-24, plus the scaling and beta terms; twice that, so the check is rigorous yet ~1e-6
// relative for these sizes, far below a wrong index (O(1)) or a bf16 rounding of X (2^-8). The
// avx512-bf16 and amx variants round X to bf16 (kernels.h: trans_w, or M > 8): there the
// reference is computed on the rounded X, with the same bound.
// pad > 0 gives row strides larger than the rows (ldx, ldw, ldc); C's padding must stay as it was.
static void check_gemm_bf16w(bool trans_w, int M, int N, int K, float alpha, float beta, int pad, bool nan_c) {
    const kernels_t *B = kernels_cpu();
    int ldx = K + pad, ldw = (trans_w ? K : N) + 2 * pad, ldc = N + pad, wrows = trans_w ? N : K;
    float *X = B->alloc(sizeof(float) * (size_t)M * (ldx > 0 ? ldx : 1));
    float *Wf = B->alloc(sizeof(float) * (size_t)(wrows > 0 ? wrows : 1) * ldw);
    uint16_t *W = B->alloc(sizeof(uint16_t) * (size_t)(wrows > 0 ? wrows : 1) * ldw);
    float *C = B->alloc(sizeof(float) * (size_t)M * ldc), *C0 = B->alloc(sizeof(float) * (size_t)M * ldc);
    for (size_t i = 0; i < (size_t)M * ldx; i++) X[i] = tk_unif(-1, 1);
    for (size_t i = 0; i < (size_t)wrows * ldw; i++) Wf[i] = tk_unif(-1, 1);
    for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = nan_c ? NAN : tk_unif(-1, 1);
    memcpy(C0, C, sizeof(float) * (size_t)M * ldc);
    B->to_bf16(W, Wf, (size_t)wrows * ldw);
    B->from_bf16(Wf, W, (size_t)wrows * ldw);   // the exact values the op multiplies by
    B->gemm_bf16w(trans_w, M, N, K, alpha, X, ldx, W, ldw, beta, C, ldc);
    const char *isa = kernels_cpu_isa();
    bool x_rounded = (!strcmp(isa, "amx") || !strcmp(isa, "avx512-bf16")) && (trans_w || M > 8);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            float got = C[(size_t)i * ldc + j], c0 = C0[(size_t)i * ldc + j];
            if (j >= N) {   // padding: untouched
                cr_assert(memcmp(&got, &c0, sizeof got) == 0, "trans_w=%d M=%d N=%d K=%d: padding C[%d,%d] changed",
                          trans_w, M, N, K, i, j);
                continue;
            }
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                double w = trans_w ? Wf[(size_t)j * ldw + k] : Wf[(size_t)k * ldw + j];
                float x = X[(size_t)i * ldx + k];
                if (x_rounded) B->from_bf16(&x, (uint16_t[]){ref_to_bf16(x)}, 1);
                double p = (double)x * w;
                s += p;
                mag += fabs(p);
            }
            double bc = beta == 0.0f ? 0.0 : (double)beta * c0;   // beta = 0: C is not read
            double want = (double)alpha * s + bc;
            double bound = 2.0 * ((K + 2) * 0x1p-24 * fabs(alpha) * mag + 0x1p-23 * fabs(bc)) + 1e-30;
            cr_assert(fabs(got - want) <= bound,
                      "trans_w=%d M=%d N=%d K=%d alpha=%g beta=%g: C[%d,%d] = %.9g, want %.9g (bound %.3g)", trans_w,
                      M, N, K, alpha, beta, i, j, got, want, bound);
        }
    B->free(X);
    B->free(Wf);
    B->free(W);
    B->free(C);
    B->free(C0);
}

Test(kernel_ops, gemm_bf16w_sizes) {
    static const int Ms[] = {1, 2, 3, 8, 9, 17, 64};
    static const int Ns[] = {1, 3, 17, 130};
    static const int Ks[] = {1, 7, 129, 300};
    tk_state = 2;
    for (int t = 0; t < 2; t++)
        for (int mi = 0; mi < 7; mi++)
            for (int ni = 0; ni < 4; ni++)
                for (int ki = 0; ki < 4; ki++) {
                    int v = mi + ni + ki;
                    check_gemm_bf16w(t == 0, Ms[mi], Ns[ni], Ks[ki], v % 3 ? 0.7f : 1.0f, v % 2 ? 0.3f : 0.0f, v % 4,
                                     false);
                }
}

// trans_w: several W blocks (K = 1024: 1024-row blocks, the last one partial; K = 4100: 256-row
// blocks) and the few-rows path. !trans_w: blocks of W's K rows (N = 600: 1744-row blocks, so
// K = 4100 takes three, beta applied by the first only; N = 4100: 256-row blocks). beta = 0
// overwrites a NaN-filled C on every path; K = 0 gives beta * C.
Test(kernel_ops, gemm_bf16w_blocks_and_edges) {
    tk_state = 3;
    for (int t = 0; t < 2; t++) {
        bool tw = t == 0;
        check_gemm_bf16w(tw, 9, 2100, 1024, 1.0f, 0.5f, 1, false);
        check_gemm_bf16w(tw, 9, 600, 4100, 1.0f, 0.5f, 0, false);
        check_gemm_bf16w(tw, 8, 600, 4100, 0.5f, 1.0f, 3, false);
        check_gemm_bf16w(tw, 33, 70, 129, 1.0f, 0.0f, 2, true);
        check_gemm_bf16w(tw, 2, 70, 129, 1.0f, 0.0f, 2, true);
    }
    check_gemm_bf16w(false, 13, 600, 4100, 1.0f, 0.0f, 1, true);    // NaN C, beta = 0, several blocks
    check_gemm_bf16w(false, 11, 4100, 700, 0.7f, 0.3f, 2, false);   // 256-row blocks, 3 of them
    const kernels_t *B = kernels_cpu();
    for (int t = 0; t < 2; t++) {
        float C[6] = {1, 2, 3, 4, 5, 6}, x = 1;
        uint16_t w = 0x3f80;
        B->gemm_bf16w(t == 0, 2, 3, 0, 1.0f, &x, 1, &w, 1, 0.5f, C, 3);
        for (int i = 0; i < 6; i++) cr_assert(C[i] == 0.5f * (float)(i + 1), "K=0: C[%d] = %g", i, C[i]);
        B->gemm_bf16w(t == 0, 2, 3, 0, 1.0f, &x, 1, &w, 1, 0.0f, C, 3);
        for (int i = 0; i < 6; i++) cr_assert(C[i] == 0.0f, "K=0 beta=0: C[%d] = %g", i, C[i]);
    }
    for (int t = 0; t < 2; t++) check_gemm_bf16w(t == 0, 5, 7, 0, 1.0f, 0.5f, 2, false);   // K = 0, padded
}

// --- sample vs sampler_sample ---------------------------------------------------------------------

// n rows of logits of kind: 0 uniform in [-8, 8]; 1 integers in [-3, 3] (many exact ties); 2 a
// peaked row (one large logit) with a third of the entries masked to -inf; 3 all equal.
static void fill_logits(float *z, int V, int kind) {
    for (int j = 0; j < V; j++) {
        switch (kind) {
        case 0: z[j] = tk_unif(-8, 8); break;
        case 1: z[j] = (float)((int)(tk_next() % 7) - 3); break;
        case 2: z[j] = tk_next() % 3 == 0 ? -INFINITY : tk_unif(-4, 4); break;
        default: z[j] = 0.25f; break;
        }
    }
    if (kind == 2) z[tk_next() % (uint64_t)V] = 12.0f;
}

// Runs the op on n rows and sampler_sample on each row with a per-row RNG; the op's u is drawn
// from a copy of that RNG exactly when the row is not greedy. Tokens must be equal, log-probs
// within 1e-6, and both RNGs must end in the same state (the op's caller draws what
// sampler_sample draws).
static void compare_rows(int V, int n, const float *T, const int *topk, const float *topp, int kind, uint64_t seed) {
    const kernels_t *B = kernels_cpu();
    float *z = B->alloc(sizeof(float) * (size_t)n * V);
    for (int r = 0; r < n; r++) fill_logits(z + (size_t)r * V, V, kind);
    float *u = calloc((size_t)n, sizeof(float)), *lp = calloc((size_t)n, sizeof(float));
    int32_t *tok = calloc((size_t)n, sizeof(int32_t));
    rng_t *ra = calloc((size_t)n, sizeof(rng_t)), *rb = calloc((size_t)n, sizeof(rng_t));
    cr_assert(u && lp && tok && ra && rb);
    for (int r = 0; r < n; r++) {
        rng_seed(&ra[r], seed + (uint64_t)r);
        rb[r] = ra[r];
        u[r] = T[r] > 0 ? rng_uniform(&rb[r]) : 0.5f;
    }
    B->sample(tok, lp, z, n, V, T, topk, topp, u);
    sampler_scratch_t s;
    sampler_scratch_init(&s, V);
    for (int r = 0; r < n; r++) {
        sampler_params_t p = {.temperature = T[r], .top_k = topk[r], .top_p = topp[r]};
        float want_lp;
        int want = sampler_sample(&p, &ra[r], z + (size_t)r * V, V, &s, &want_lp);
        cr_assert(tok[r] == want, "V=%d kind=%d row %d (T=%g top_k=%d top_p=%g u=%.9g): op %d, sampler %d", V, kind, r,
                  T[r], topk[r], topp[r], u[r], tok[r], want);
        cr_assert(fabsf(lp[r] - want_lp) <= 1e-6f, "V=%d kind=%d row %d: log-prob op %.9g, sampler %.9g", V, kind, r,
                  lp[r], want_lp);
        cr_assert(memcmp(&ra[r], &rb[r], sizeof(rng_t)) == 0, "V=%d row %d: the RNG streams diverged", V, r);
    }
    // logprobs may be NULL: same tokens.
    int32_t *tok2 = calloc((size_t)n, sizeof(int32_t));
    cr_assert(tok2);
    B->sample(tok2, NULL, z, n, V, T, topk, topp, u);
    cr_assert(memcmp(tok, tok2, sizeof(int32_t) * (size_t)n) == 0, "V=%d: tokens differ with logprobs NULL", V);
    sampler_scratch_free(&s);
    free(u);
    free(lp);
    free(tok);
    free(tok2);
    free(ra);
    free(rb);
    B->free(z);
}

// Every combination of temperature (greedy included), top-k (off, small, V-1, V, beyond V) and
// top-p (off, 0.95, 0.5, tiny) over the row kinds, several draws each.
Test(kernel_ops, sample_matches_sampler) {
    static const int Vs[] = {1, 2, 7, 100, 1000};
    static const float Ts[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float Ps[] = {1.0f, 0.95f, 0.5f, 1e-6f};
    tk_state = 4;
    for (int vi = 0; vi < 5; vi++) {
        int V = Vs[vi];
        int Ks[] = {0, 1, 5, V - 1, V, V + 3};
        enum { NR = 4 * 6 * 4 * 3 };
        float T[NR], P[NR];
        int Kk[NR];
        int n = 0;
        for (int ti = 0; ti < 4; ti++)
            for (int ki = 0; ki < 6; ki++)
                for (int pi = 0; pi < 4; pi++)
                    for (int rep = 0; rep < 3; rep++) {
                        T[n] = Ts[ti];
                        Kk[n] = Ks[ki];
                        P[n] = Ps[pi];
                        n++;
                    }
        for (int kind = 0; kind < 4; kind++) compare_rows(V, n, T, Kk, P, kind, 1000u * (uint64_t)vi + 10u * kind);
    }
}

// A Qwen2-sized vocabulary, typical settings.
Test(kernel_ops, sample_matches_sampler_large_vocab) {
    int V = 151936;
    float T[] = {1.0f, 0.7f, 1.0f, 1.0f, 0.0f, 1.2f};
    int Kk[] = {0, 50, 0, 20, 0, 1000};
    float P[] = {1.0f, 1.0f, 0.9f, 0.95f, 1.0f, 0.8f};
    tk_state = 5;
    compare_rows(V, 6, T, Kk, P, 0, 77);
    compare_rows(V, 6, T, Kk, P, 2, 78);
}

// Many draws on one small row: every u the RNG produces maps to the same token.
Test(kernel_ops, sample_many_draws) {
    enum { NR = 2000, V = 37 };
    static float T[NR], P[NR];
    static int Kk[NR];
    tk_state = 6;
    for (int r = 0; r < NR; r++) {
        T[r] = r % 5 == 0 ? 0.0f : 0.3f + (float)(r % 7) * 0.3f;
        Kk[r] = (int)(tk_next() % 12);
        P[r] = r % 3 == 0 ? 1.0f : tk_unif(0.05f, 1.0f);
    }
    compare_rows(V, NR, T, Kk, P, 1, 99);
    compare_rows(V, NR, T, Kk, P, 0, 98);
}

// scatter_rows on the CPU: every row lands at its offset, nothing else changes; n = 0 is a no-op.
Test(kernel_ops, scatter_rows) {
    const kernels_t *k = kernels_cpu();
    enum { N = 7, LEN = 5, SLOTS = 16 };
    float dst[SLOTS * LEN], want[SLOTS * LEN], src[N * LEN];
    size_t off[N] = {3 * LEN, 0, 15 * LEN, 7 * LEN, 1 * LEN + 0, 9 * LEN, 12 * LEN};
    tk_state = 5;
    for (int i = 0; i < SLOTS * LEN; i++) dst[i] = want[i] = tk_unif(-1, 1);
    for (int i = 0; i < N * LEN; i++) src[i] = tk_unif(-1, 1);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < LEN; j++) want[off[r] + (size_t)j] = src[r * LEN + j];
    k->scatter_rows(dst, off, src, N, LEN);
    cr_assert_eq(memcmp(dst, want, sizeof dst), 0);
    k->scatter_rows(dst, off, src, 0, LEN);
    cr_assert_eq(memcmp(dst, want, sizeof dst), 0);
}

// Multi-LoRA: lora_apply (one call) against lora_shrink then lora_expand, bit for bit, on
// segments of 1 and 3 rows (the few-rows path), 9 and 40 rows (one OpenBLAS call each, side by
// side in lora_apply) and 900 rows (products large enough to share: on the pool), with fp32
// matrices and with bf16 copies; and the bf16 copies against fp32 matrices holding the same
// rounded values (only the summation order may differ).
Test(kernel_ops, lora_apply_is_shrink_then_expand) {
    const kernels_t *k = kernels_cpu();
    enum { IN = 300, OUT = 200, R = 8, NSEG = 5, N = 953 };
    const int rows[NSEG] = {1, 3, 9, 900, 40};
    int threads = kpool_threads();
    kpool_set_threads(2);   // segments side by side on two threads, as on the services' machines
    tk_state = 17;
    float *A = malloc(sizeof(float) * NSEG * R * IN), *B = malloc(sizeof(float) * NSEG * R * OUT);
    float *Ar = malloc(sizeof(float) * NSEG * R * IN), *Br = malloc(sizeof(float) * NSEG * R * OUT);
    uint16_t *A16 = malloc(sizeof(uint16_t) * NSEG * R * IN), *B16 = malloc(sizeof(uint16_t) * NSEG * R * OUT);
    for (int i = 0; i < NSEG * R * IN; i++) A[i] = tk_unif(-0.1f, 0.1f);
    for (int i = 0; i < NSEG * R * OUT; i++) B[i] = tk_unif(-0.1f, 0.1f);
    k->to_bf16(A16, A, (size_t)NSEG * R * IN), k->from_bf16(Ar, A16, (size_t)NSEG * R * IN);
    k->to_bf16(B16, B, (size_t)NSEG * R * OUT), k->from_bf16(Br, B16, (size_t)NSEG * R * OUT);
    size_t ny = sizeof(float) * N * OUT, nt = sizeof(float) * N * R;
    float *X = malloc(sizeof(float) * N * IN), *Y0 = malloc(ny), *Yfp = malloc(ny), *Y[3], *T[3];
    for (int v = 0; v < 3; v++) Y[v] = malloc(ny), T[v] = malloc(nt);
    for (int i = 0; i < N * IN; i++) X[i] = tk_unif(-1.0f, 1.0f);
    for (int i = 0; i < N * OUT; i++) Y0[i] = tk_unif(-1.0f, 1.0f);
    for (int copies = 0; copies < 2; copies++) {
        kern_lora_seg_t seg[NSEG], segr[NSEG];
        for (int s = 0, r0 = 0; s < NSEG; r0 += rows[s++]) {
            seg[s] = (kern_lora_seg_t){.row0 = r0, .n_rows = rows[s], .rank = R, .scale = 1.5f,
                                       .A = A + (size_t)s * R * IN, .B = B + (size_t)s * R * OUT};
            if (copies) seg[s].A16 = A16 + (size_t)s * R * IN, seg[s].B16 = B16 + (size_t)s * R * OUT;
            segr[s] = seg[s], segr[s].A = Ar + (size_t)s * R * IN, segr[s].B = Br + (size_t)s * R * OUT;
            segr[s].A16 = NULL, segr[s].B16 = NULL;
        }
        for (int v = 0; v < 3; v++) memcpy(Y[v], Y0, ny), memset(T[v], 0, nt);
        k->lora_apply(Y[0], OUT, T[0], R, X, IN, seg, NSEG);
        k->lora_shrink(T[1], R, X, IN, seg, NSEG);
        k->lora_expand(Y[1], OUT, T[1], R, seg, NSEG);
        cr_assert_eq(memcmp(T[0], T[1], nt), 0, "copies %d: lora_apply's T", copies);
        cr_assert_eq(memcmp(Y[0], Y[1], ny), 0, "copies %d: lora_apply's Y", copies);
        if (!copies) {
            memcpy(Yfp, Y[0], ny);
            continue;
        }
        k->lora_apply(Y[2], OUT, T[2], R, X, IN, segr, NSEG);
        int r1 = rows[0] + rows[1];
        double dmax = 0.0;
        for (int i = 0; i < r1 * OUT; i++) dmax = fmax(dmax, fabs((double)Y[0][i] - Y[2][i]));
        cr_assert_lt(dmax, 1e-5, "bf16 copies vs the rounded fp32 matrices: %.3g", dmax);
        // the segments of 8 rows or more read the fp32 matrices, copies or not
        cr_assert_eq(memcmp(Y[0] + r1 * OUT, Yfp + r1 * OUT, sizeof(float) * (N - r1) * OUT), 0);
        cr_assert_neq(memcmp(Y[0], Yfp, sizeof(float) * r1 * OUT), 0, "the copies hold other values");
    }
    for (int v = 0; v < 3; v++) free(Y[v]), free(T[v]);
    free(X), free(Y0), free(Yfp);
    free(A), free(B), free(Ar), free(Br), free(A16), free(B16);
    kpool_set_threads(threads);
}

// The VmFlags line of the mapping of /proc/self/smaps that holds p ("" when none is found).
static void vm_flags_of(const void *p, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return;
    char line[512];
    bool inside = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, n, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

// Host memory: zero-filled every time (a block freed dirty and handed out again included), 64-byte
// aligned, large blocks on 2 MiB boundaries and advised as huge pages; sizes that wrap are refused.
Test(kernel_ops, host_alloc_zeroed_aligned_huge) {
    const size_t sizes[] = {1, 100, (4u << 20) + 3, (9u << 20) + 100};
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            unsigned char *p = kernels_host_alloc(sizes[i]);
            cr_assert_not_null(p);
            cr_assert_eq((uintptr_t)p % 64, 0);
            if (sizes[i] >= (4u << 20)) cr_assert_eq((uintptr_t)p % (2u << 20), 0, "%zu bytes at %p", sizes[i], (void *)p);
            for (size_t j = 0; j < sizes[i]; j++)
                if (p[j]) cr_assert_fail("byte %zu of %zu is %d (round %d)", j, sizes[i], p[j], round);
            if (sizes[i] >= (4u << 20) && access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
                char flags[512];
                vm_flags_of(p + sizes[i] / 2, flags, sizeof flags);
                cr_assert(strstr(flags, " hg"), "the block's mapping is not advised as huge pages: VmFlags:%s", flags);
            }
            memset(p, 0xa5, sizes[i]);   // freed dirty: the next round must get zeros again
            free(p);
        }
    cr_assert_null(kernels_host_alloc(SIZE_MAX - 10));
    cr_assert_null(kernels_host_alloc(SIZE_MAX - (1u << 20)));
}

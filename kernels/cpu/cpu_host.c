// cpu_host.c - the part of the CPU backend that exists once per process, compiled for the
// baseline x86-64 ISA like the rest of the project: the choice of the CPU kernel variant
// (kernels_cpu), OpenBLAS's kernel set, and the row sampler that common/engine/sampler.c and
// every variant's sample op share (one compiled copy, so the host sampler and the op agree bit
// for bit whichever variant runs). The vectorised ops are in cpu.c, compiled once per variant
// (see cpu_variants.h).
#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/cpu_variants.h"
#include "kernels/kernels.h"

// --- host memory ----------------------------------------------------------------------------

#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)

void *kernels_host_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    if (n < bytes) return NULL;   // wrapped
    void *p;
    if (n >= HUGE_MIN) {
        size_t h = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        if (h < n) return NULL;
        p = aligned_alloc(HUGE_PAGE, h);
        // a hint: where the kernel has no huge page to give, the range faults in 4 KiB pages
        if (p) (void)madvise(p, h, MADV_HUGEPAGE), n = h;
    } else {
        p = aligned_alloc(64, n);
    }
    if (p) memset(p, 0, n);
    return p;
}

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


// --- the kernel variant ------------------------------------------------------------------------
// The project is compiled for the x86-64 baseline, so that one binary runs on any x86-64 CPU; the
// ops of the CPU backend come in variants compiled for wider vector instruction sets
// (cpu_variants.h), of which each process uses one: the best its CPU runs (__builtin_cpu_supports
// also checks that the OS saves the vector registers), chosen at the first kernels_cpu() call.
// Under valgrind, whose CPU has no AVX-512, that is avx2.
//
// MARLAAS_CPU_ISA=amx|avx512-bf16|avx512|avx2|scalar asks for one (to compare the variants, or to
// compute on this machine what another one computes: the variants sum in different orders, so
// their results differ in the last bits). A value that names no variant, or one this CPU cannot
// run, stops the process (exit status 2) with the valid values: kernels other than the ones asked
// for would give other results without a word.

typedef struct {
    const char *name;
    const kernels_t *table;
    const char *needs;   // what the CPU must have, for the refusal's message
} cpu_variant_t;

// AMX for this process: the CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7: EDX bits 24 and 22),
// the OS saves the tile state (XCR0 bits 17 and 18), and Linux grants the process the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, once; without it the first tile instruction kills the process).
#if defined(__x86_64__)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return;   // OSXSAVE: xgetbv runs
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static bool amx_usable(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}
#endif

// Best first.
static const cpu_variant_t cpu_variants[] = {
#if defined(__x86_64__)
    {"amx", &kernels_cpu_amx, "x86-64-v4, AVX512_BF16, AMX-TILE and AMX-BF16 (and the kernel's grant of the tile state)"},
    {"avx512-bf16", &kernels_cpu_avx512_bf16, "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) and AVX512_BF16"},
    {"avx512", &kernels_cpu_avx512, "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL)"},
    {"avx2", &kernels_cpu_avx2, "x86-64-v3 (AVX2, FMA, BMI2, F16C)"},
#endif
    {"scalar", &kernels_cpu_scalar, "nothing"},
};
#define N_CPU_VARIANTS (sizeof cpu_variants / sizeof *cpu_variants)

static bool cpu_variant_runs(const cpu_variant_t *v) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (v->table == &kernels_cpu_amx)
        return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16") && amx_usable();
    if (v->table == &kernels_cpu_avx512_bf16)
        return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16");
    if (v->table == &kernels_cpu_avx512) return __builtin_cpu_supports("x86-64-v4");
    if (v->table == &kernels_cpu_avx2) return __builtin_cpu_supports("x86-64-v3");
#endif
    return v->table == &kernels_cpu_scalar;
}

static const cpu_variant_t *cpu_variant_named(const char *name) {
    for (size_t i = 0; i < N_CPU_VARIANTS; i++)
        if (!strcmp(cpu_variants[i].name, name)) return &cpu_variants[i];
    return NULL;
}

static const cpu_variant_t *cpu_variant_best(void) {
    for (size_t i = 0; i < N_CPU_VARIANTS; i++)
        if (cpu_variant_runs(&cpu_variants[i])) return &cpu_variants[i];
    return &cpu_variants[N_CPU_VARIANTS - 1];
}

// "a, b, c": the variants (those this CPU runs when runnable_only).
static void cpu_variant_list(char *buf, size_t n, bool runnable_only) {
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_CPU_VARIANTS && len < n; i++) {
        if (runnable_only && !cpu_variant_runs(&cpu_variants[i])) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", cpu_variants[i].name);
        if (w > 0) len += (size_t)w;
    }
}

static pthread_once_t cpu_choice_once = PTHREAD_ONCE_INIT;
static const cpu_variant_t *cpu_choice;

static void cpu_choose(void) {
    const cpu_variant_t *best = cpu_variant_best();
    const char *want = getenv("MARLAAS_CPU_ISA");
    if (!want || !*want) {
        cpu_choice = best;
        return;
    }
    const cpu_variant_t *v = cpu_variant_named(want);
    char list[128];
    if (!v) {
        cpu_variant_list(list, sizeof list, false);
        fprintf(stderr, "FATAL MARLAAS_CPU_ISA=%s names no CPU kernel variant: use one of %s (this CPU's best: %s)\n",
                want, list, best->name);
        exit(2);
    }
    if (!cpu_variant_runs(v)) {
        cpu_variant_list(list, sizeof list, true);
        fprintf(stderr, "FATAL MARLAAS_CPU_ISA=%s: this CPU cannot run the %s kernels (they need %s); it runs %s "
                "(best: %s)\n", want, v->name, v->needs, list, best->name);
        exit(2);
    }
    cpu_choice = v;
}

const kernels_t *kernels_cpu(void) {
    pthread_once(&cpu_choice_once, cpu_choose);
    return cpu_choice->table;
}

const char *kernels_cpu_isa(void) {
    pthread_once(&cpu_choice_once, cpu_choose);
    return cpu_choice->name;
}

const kernels_t *kernels_cpu_variant(const char *isa) {
    const cpu_variant_t *v = isa ? cpu_variant_named(isa) : NULL;
    return v && cpu_variant_runs(v) ? v->table : NULL;
}

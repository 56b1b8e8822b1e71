// cmd_info.c - `marlaas info`: what this binary computes with on this machine: the CPU kernel
// variant chosen at run time (and the ones the CPU runs), OpenBLAS's kernel set, the thread
// count, the CUDA backend. One "name value" line each, for people and for scripts
// (tests/integration/test_cpu_dispatch.sh reads cpu-kernels).
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/util/util.h"
#include "kernels/kernels.h"

int cmd_info(int argc, char **argv) {
    if (argc > 1) {
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
            printf("usage: marlaas info\n"
                   "The compute setup of this binary on this machine, one \"name value\" line each:\n"
                   "  cpu-kernels  the CPU kernel variant in use (the best this CPU runs, or MARLAAS_CPU_ISA's)\n"
                   "  cpu-runs     the variants this CPU runs, best first\n"
                   "  openblas     OpenBLAS's kernel set\n"
                   "  threads      compute threads per process (MARLAAS_THREADS)\n"
                   "  cuda         whether the cuda backend is usable, or why not\n");
            return 0;
        }
        fprintf(stderr, "marlaas info: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    static const char *const isas[] = {"avx512-bf16", "avx512", "avx2", "scalar"};
    printf("cpu-kernels  %s\n", kernels_cpu_isa());
    printf("cpu-runs    ");
    for (size_t i = 0; i < sizeof isas / sizeof *isas; i++)
        if (kernels_cpu_variant(isas[i])) printf(" %s", isas[i]);
    printf("\n");
    printf("openblas     %s\n", kernels_cpu_blas_core());
    printf("threads      %d\n", util_threads());
    char why[256];
    if (kernels_by_name("cuda", why, sizeof why))
        printf("cuda         available\n");
    else
        printf("cuda         no: %s\n", why);
    return 0;
}

// threads.c - util_threads_init (util.h), in a file of its own: only programs that compute link
// OpenMP through it (the verifier, which computes nothing, does not).
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/util/util.h"

// OpenBLAS exports this; declared here so no BLAS header is needed in util.
extern void openblas_set_num_threads(int n) __attribute__((weak));

void util_threads_init(void) {
    int n = util_threads();
    if (openblas_set_num_threads) openblas_set_num_threads(n);
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
}

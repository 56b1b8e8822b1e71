// threads.c - util_threads_init (util.h), in a file of its own: only programs that compute link
// OpenMP through it (the verifier, which computes nothing, does not).
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/util/util.h"

// OpenBLAS exports this; declared here so no BLAS header is needed in util.
extern void openblas_set_num_threads(int n) __attribute__((weak));
// The CPU backend's pool (kernels/cpu/pool.h), where the program links it.
extern void kpool_set_threads(int n) __attribute__((weak));

void util_threads_init(void) {
    int n = util_threads();
    // The CPU backend's own pool shares every loop, dense products included (it calls OpenBLAS
    // from its threads in chunks): OpenBLAS and OpenMP run one thread, so no second set of
    // threads spins beside the pool's.
    if (kpool_set_threads) kpool_set_threads(n);
    if (openblas_set_num_threads) openblas_set_num_threads(1);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
}

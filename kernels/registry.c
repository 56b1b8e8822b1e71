// registry.c - the backends by name (kernels.h): the only place outside kernels/cuda that names
// the CUDA backend.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#ifdef MARLAAS_CUDA
#include "kernels/cuda/cuda.h"
#endif

// The simulated backend's table: the CPU backend's ops under the name "sim". Engines on it
// compute nothing of the model (the engine models each step's duration instead); what they run
// on the table is host bookkeeping of small arrays (optimiser state of adapters without weights).
static kernels_t sim_table;
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;
static void sim_init(void) {
    sim_table = *kernels_cpu();
    sim_table.name = "sim";
}

const kernels_t *kernels_sim(void) {
    pthread_once(&sim_once, sim_init);
    return &sim_table;
}

const kernels_t *kernels_by_name(const char *name, char *why, size_t n) {
    if (!strcmp(name, "cpu")) return kernels_cpu();
    if (!strncmp(name, "sim:", 4) && name[4]) return kernels_sim();
    if (strcmp(name, "cuda") != 0) {
        snprintf(why, n, "unknown backend '%s' (known: cpu, cuda, sim:DEVICE)", name);
        return NULL;
    }
#ifdef MARLAAS_CUDA
    char w[200];
    if (!kernels_cuda_available(w, sizeof w)) {
        snprintf(why, n, "no usable GPU (%s)", w);
        return NULL;
    }
    return kernels_cuda();
#else
    snprintf(why, n, "this build has no CUDA backend (build with make CUDA=1, or use the CUDA image)");
    return NULL;
#endif
}

int kernels_weights_bf16(const kernels_t *k, const char *weights, char *why, size_t n) {
    if (!strcmp(weights, "fp32")) return 0;
    if (!strcmp(weights, "bf16")) return 1;
    if (!strcmp(weights, "auto")) return k != kernels_cpu() && k != kernels_sim();
    snprintf(why, n, "unknown weights '%s': use fp32, bf16 or auto (bf16 on cuda, fp32 on cpu)", weights);
    return -1;
}

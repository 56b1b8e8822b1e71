// strict_check.c - proves that the strict host/device separation build of the emulator is active
// (tests/gpu/emu/run.sh): device memory moves through to_dev / to_host / copy and kernels, and a
// direct host read of it must then die of SIGSEGV with the emulator's report. Exits 0 only if the
// read unexpectedly succeeded, which run.sh treats as a failure.
#include <stdio.h>

#include "kernels/cuda/cuda.h"

int main(void) {
    const kernels_t *k = kernels_cuda();
    float host[4] = {1, 2, 3, 4}, back[4] = {0};
    float *dev = k->alloc(sizeof host), *dev2 = k->alloc(sizeof host);
    k->to_dev(dev, host, sizeof host);
    k->copy(dev2, dev, sizeof host);
    k->scale(4, 2.0f, dev2);
    k->to_host(back, dev2, sizeof back);
    if (back[3] != 8.0f) {
        fprintf(stderr, "strict_check: the device round trip gave %g, expected 8\n", back[3]);
        return 2;
    }
    fprintf(stderr, "strict_check: device round trip fine; now reading device memory on the host (must crash)\n");
    volatile float x = dev[1];
    fprintf(stderr, "strict_check: the host read device memory (%g) without a fault: strict mode is NOT active\n", x);
    return 0;
}

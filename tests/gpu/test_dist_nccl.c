// test_dist_nccl.c - NCCL all-reduce of device buffers through dist_nccl (GPU tests; skipped
// without a GPU, like every test of tests/gpu). One rank on one GPU always; two ranks, one
// process per GPU, where two GPUs are visible: the sum is exact and reaches both; a rank that
// never calls the all-reduce makes the other fail at its timeout instead of hanging.
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <czmq.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rl/dist.h"
#include "common/rl/dist_nccl.h"
#include "common/util/util.h"
#include "kernels/cuda/cuda.h"
#include "tests/gpu/gpuprobe.h"
#include "tests/unit/testbits.h"

static int gpus;
static void setup(void) {
    char why[512];
    if (!gpu_probe(&gpus, why, sizeof why)) cr_skip_test("NCCL test skipped: %s", why);
}
TestSuite(nccl, .init = setup, .timeout = 120);

#define N 4097

// One rank: sums N floats (rank r contributes r + i) on GPU `rank`; returns 0 when the result
// is exact. skip_sum: join, then never call the all-reduce (a hung rank).
static int rank_main(int rank, int world, const char *ep, int skip_sum, double timeout_s, char *err) {
    if (cudaSetDevice(rank) != cudaSuccess) return 10;
    dist_t *d = dist_open(rank, world, ep, 30, err);
    if (!d) return 11;
    dist_nccl_t *c = dist_nccl_open(d, timeout_s, err);
    if (!c) return 12;
    float *h = malloc(sizeof(float) * N), *dev = NULL;
    for (int i = 0; i < N; i++) h[i] = (float)(rank + i);
    cudaMalloc((void **)&dev, sizeof(float) * N);
    cudaMemcpy(dev, h, sizeof(float) * N, cudaMemcpyHostToDevice);
    int rc = 0;
    if (skip_sum) {
        sleep((unsigned)(timeout_s + 3));
    } else if (dist_nccl_allreduce_sum(c, dev, N, err)) {
        rc = 13;
    } else {
        cudaMemcpy(h, dev, sizeof(float) * N, cudaMemcpyDeviceToHost);
        for (int i = 0; i < N && !rc; i++) {
            float want = 0;
            for (int r = 0; r < world; r++) want += (float)(r + i);
            if (h[i] != want) rc = 14;
        }
    }
    cudaFree(dev);
    free(h);
    dist_nccl_close(&c);
    dist_close(&d);
    return rc;
}

Test(nccl, one_rank_sums_in_place) {
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port());
    char err[ERR_LEN] = "";
    int rc = rank_main(0, 1, ep, 0, 30, err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
}

static int n_gpus(void) { return gpus; }

Test(nccl, two_ranks_two_gpus) {
    if (n_gpus() < 2) cr_skip_test("two-rank NCCL test needs 2 GPUs (%d visible)", n_gpus());
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port());
    pid_t p = fork();
    if (p == 0) {
        char err[ERR_LEN] = "";
        int rc = rank_main(1, 2, ep, 0, 30, err);
        if (rc) fprintf(stderr, "rank 1: %d %s\n", rc, err);
        zsys_shutdown();
        _exit(rc);
    }
    char err[ERR_LEN] = "";
    int rc = rank_main(0, 2, ep, 0, 30, err);
    int st = 0;
    waitpid(p, &st, 0);
    cr_assert_eq(rc, 0, "rank 0: rc %d: %s", rc, err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 failed");
}

Test(nccl, a_hung_rank_fails_the_other_at_its_timeout) {
    if (n_gpus() < 2) cr_skip_test("two-rank NCCL test needs 2 GPUs (%d visible)", n_gpus());
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port());
    pid_t p = fork();
    if (p == 0) {
        char err[ERR_LEN] = "";
        int rc = rank_main(1, 2, ep, 1, 3, err);
        zsys_shutdown();
        _exit(rc);
    }
    char err[ERR_LEN] = "";
    double t0 = util_now();
    int rc = rank_main(0, 2, ep, 0, 3, err);
    double dt = util_now() - t0;
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    cr_assert_eq(rc, 13, "rank 0 should fail in the all-reduce (rc %d: %s)", rc, err);
    cr_assert(strstr(err, "did not complete within 3 s"), "%s", err);
    cr_assert(dt < 30, "took %.1f s", dt);
}

// test_dp.c - data-parallel training passes (common/rl/dp.h) on the CUDA backend with the micro
// model: rank 0 is the test process, rank 1 a forked process (forked before the test touches
// CUDA). Each pass's summed gradient equals rank 0's single-process gradient on the GPU, and after
// three AdamW steps rank 1's replicas of the adapters equal rank 0's bit for bit.
//   * two ranks on one GPU, gradients summed on the host over the group (dp_sum=host): runs on
//     any machine with a GPU;
//   * two ranks on two GPUs, gradients summed with NCCL: skipped with fewer than 2 GPUs.
// Tolerance: |dp - single| <= 1e-4 (|single| + max |single|) per element: the two shares' partial
// sums are added in another order than one pass's (the CPU version of this test passes at 1e-5).
#include <criterion/criterion.h>

#include <czmq.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rl/dp.h"
#include "kernels/cuda/cuda.h"
#include "tests/gpu/gpuprobe.h"
#include "tests/unit/testbits.h"
#include "tests/unit/testpass.h"
#include "tests/unit/testutil.h"

#define MICRO "models/micro"
#define SLOTS 3

static int gpus;
static void setup(void) {
    char why[512];
    if (!gpu_probe(&gpus, why, sizeof why)) cr_skip_test("data-parallel GPU test skipped: %s", why);
}
TestSuite(dp_cuda, .init = setup, .timeout = 300);

static bool never(void) { return false; }

typedef struct {
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
} rig_t;

// The micro model on the GPU; on rank 0 three adapters of mixed ranks (the workers get them
// through dp_load). 0 or -1 + err.
static int rig_open(rig_t *r, bool adapters, char *err) {
    const kernels_t *G = kernels_cuda();
    r->m = model_load(MICRO, G, err);
    if (!r->m) return -1;
    r->pool = lora_pool_new(SLOTS);
    for (int s = 0; adapters && s < SLOTS; s++) {
        lora_t *c = tu_adapter(&r->m->cfg, 2 + 2 * s, 0x7f, 100 + s), *g = NULL;
        uint8_t *blob = NULL;
        size_t len = 0;
        if (!c || lora_serialize(c, &blob, &len, err)) return -1;
        g = lora_deserialize(blob, len, &r->m->cfg, G, err);
        free(blob);
        lora_destroy(&c);
        if (!g || lora_pool_set(r->pool, s, &g, err)) return -1;
    }
    r->e = engine_new(r->m, r->pool, err);
    return r->e ? 0 : -1;
}

static void rig_close(rig_t *r) {
    engine_destroy(&r->e);
    lora_pool_destroy(&r->pool);
    model_destroy(&r->m);
}

// The adapters' parameters (host copies), slot after slot, into path.
static int write_params(lora_pool_t *pool, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (int s = 0; s < SLOTS; s++) {
        lora_t *a = lora_pool_get(pool, s);
        if (!a) continue;
        float *h = malloc(sizeof(float) * a->n_params);
        a->k->to_host(h, a->params, sizeof(float) * a->n_params);
        fwrite(h, sizeof(float), a->n_params, f);
        free(h);
    }
    return fclose(f);
}

static void params_path(char *buf, size_t n, int parent, int rank) {
    snprintf(buf, n, "build/test-tmp/dpgpu-%d-%d.bin", parent, rank);
}

// Rank 1 (a child): follows rank 0 on GPU dev, then writes its replicas. Exit status 0 = fine.
// The device is chosen with CUDA_VISIBLE_DEVICES, as a deployment does (one GPU per process).
static int worker(int dev, bool host_sum, const char *ep) {
    char err[ERR_LEN] = "", devs[16];
    rig_t r = {0};
    snprintf(devs, sizeof devs, "%d", dev);
    setenv("CUDA_VISIBLE_DEVICES", devs, 1);
    if (rig_open(&r, false, err)) {
        fprintf(stderr, "rank 1: cannot set up on GPU %d: %s\n", dev, err);
        return 1;
    }
    dp_cfg_t c = {.rank = 1, .world = 2, .endpoint = ep, .timeout_s = 60, .host_sum = host_sum};
    dp_t *d = dp_open(&c, r.e, err);
    int rc = !d ? 2 : dp_serve(d, never, err) ? 3 : 0;
    if (rc) fprintf(stderr, "rank 1: %s\n", err);
    char path[256];
    params_path(path, sizeof path, (int)getppid(), 1);
    if (!rc && write_params(r.pool, path)) rc = 4;
    dp_close(&d);
    rig_close(&r);
    return rc;
}

static void run_pair(int dev1, bool host_sum) {
    char ep[64], err[ERR_LEN] = "", dir[256];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port());
    tu_tmpdir(dir, sizeof dir, "dpgpu");
    pid_t kid = fork();
    cr_assert_neq(kid, -1);
    if (kid == 0) {
        int rc = worker(dev1, host_sum, ep);
        zsys_shutdown();
        _exit(rc);
    }
    // rank 0: CUDA only now, after the fork, on device 0
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    rig_t r0 = {0};
    cr_assert_eq(rig_open(&r0, true, err), 0, "%s", err);
    const kernels_t *G = r0.m->k;
    dp_cfg_t c = {.rank = 0, .world = 2, .endpoint = ep, .timeout_s = 60, .host_sum = host_sum};
    dp_t *d = dp_open(&c, r0.e, err);
    cr_assert_not_null(d, "%s", err);
    optim_t *opt[SLOTS];
    optim_cfg_t oc = optim_defaults();
    oc.lr = 0.01f;
    float *want[SLOTS], *got[SLOTS];
    for (int s = 0; s < SLOTS; s++) {
        size_t n = lora_pool_get(r0.pool, s)->n_params;
        opt[s] = optim_new(&oc, G, n);
        want[s] = G->alloc(sizeof(float) * n);
        got[s] = G->alloc(sizeof(float) * n);
        cr_assert_eq(dp_load(d, s, opt[s], err), 0, "%s", err);
    }
    const int slots[2] = {0, 2};
    const loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f};
    for (int step = 0; step < 3; step++) {
        tp_pass_t p;
        tp_pass_build(&p, 1000 + step, false);
        cr_assert_eq(dp_pass(NULL, r0.e, p.s, p.n, &lc, want, slots, 2, NULL, 0, err), 0, "%s", err);
        cr_assert_eq(dp_pass(d, r0.e, p.s, p.n, &lc, got, slots, 2, NULL, 0, err), 0, "%s", err);
        for (int i = 0; i < 2; i++) {
            int s = slots[i];
            size_t n = lora_pool_get(r0.pool, s)->n_params;
            float *hw = malloc(sizeof(float) * n), *hg = malloc(sizeof(float) * n);
            G->to_host(hw, want[s], sizeof(float) * n);
            G->to_host(hg, got[s], sizeof(float) * n);
            char what[96];
            snprintf(what, sizeof what, "%s step %d slot %d", host_sum ? "host sums" : "NCCL", step, s);
            tp_expect_close(what, hg, hw, n, 1e-4f);
            free(hw), free(hg);
            optim_step(opt[s], lora_pool_get(r0.pool, s)->params, got[s]);
        }
        tp_pass_free(&p);
    }
    dp_close(&d);
    int st = 0;
    waitpid(kid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 failed (status %d)", st);
    char p0[256], p1[256];
    params_path(p0, sizeof p0, (int)getpid(), 0);
    params_path(p1, sizeof p1, (int)getpid(), 1);
    cr_assert_eq(write_params(r0.pool, p0), 0);
    FILE *a = fopen(p0, "rb"), *b = fopen(p1, "rb");
    cr_assert(a && b, "parameter files missing");
    size_t n = 0;
    for (int ca, cb;;) {
        ca = fgetc(a), cb = fgetc(b);
        cr_assert_eq(ca, cb, "rank 1's replicas differ from rank 0's adapters at byte %zu", n);
        if (ca == EOF) break;
        n++;
    }
    cr_assert(n > 0);
    fclose(a), fclose(b);
    unlink(p0), unlink(p1);
    for (int s = 0; s < SLOTS; s++) optim_destroy(&opt[s]), G->free(want[s]), G->free(got[s]);
    rig_close(&r0);
}

Test(dp_cuda, two_ranks_one_gpu_host_sums) { run_pair(0, true); }

Test(dp_cuda, two_ranks_two_gpus_nccl) {
    if (gpus < 2) cr_skip_test("two-rank NCCL test needs 2 GPUs (%d visible)", gpus);
    run_pair(1, false);
}

// dist_nccl.c - NCCL all-reduce with timeouts (non-blocking communicator, polled). Compiled to
// nothing without MARLAAS_CUDA.
#include "common/rl/dist_nccl.h"

#ifdef MARLAAS_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util/util.h"

struct dist_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    double timeout_s;
    int rank, world;
    bool broken;
};

static void nap(void) {
    struct timespec ts = {0, 200 * 1000};   // 0.2 ms between polls
    nanosleep(&ts, NULL);
}

// Polls the communicator until its pending operation left ncclInProgress. 0, or -1 + err.
static int wait_comm(dist_nccl_t *c, const char *what, char *err) {
    double deadline = util_now() + c->timeout_s;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t rc = ncclCommGetAsyncError(c->comm, &st);
        if (rc != ncclSuccess) st = rc;
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) {
            c->broken = true;
            ncclCommAbort(c->comm);
            return err_set(err, "nccl: rank %d: %s failed: %s (%s); the group stops", c->rank, what,
                           ncclGetErrorString(st), ncclGetLastError(c->comm));
        }
        if (util_now() > deadline) {
            c->broken = true;
            ncclCommAbort(c->comm);
            return err_set(err, "nccl: rank %d: %s did not complete within %.0f s: another rank died or hangs; the "
                           "communicator was aborted", c->rank, what, c->timeout_s);
        }
        nap();
    }
}

dist_nccl_t *dist_nccl_open(dist_t *d, double timeout_s, char *err) {
    ncclUniqueId id;
    void *data = NULL;
    size_t len = 0;
    if (dist_rank(d) == 0) {
        ncclResult_t rc = ncclGetUniqueId(&id);
        if (rc != ncclSuccess) {
            err_set(err, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(rc));
            return NULL;
        }
        data = &id, len = sizeof id;
    }
    if (dist_bcast(d, &data, &len, err)) return NULL;
    if (dist_rank(d) != 0) {
        if (len != sizeof id) {
            free(data);
            err_set(err, "nccl: rank %d: the unique id from rank 0 has %zu bytes, not %zu (different NCCL versions?)",
                    dist_rank(d), len, sizeof id);
            return NULL;
        }
        memcpy(&id, data, sizeof id);
        free(data);
    }
    dist_nccl_t *c = xcalloc(1, sizeof *c);
    c->timeout_s = timeout_s > 0 ? timeout_s : 60;
    c->rank = dist_rank(d), c->world = dist_world(d);
    cudaError_t ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        err_set(err, "nccl: cudaStreamCreate: %s", cudaGetErrorString(ce));
        free(c);
        return NULL;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&c->comm, c->world, id, c->rank, &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        err_set(err, "nccl: rank %d: ncclCommInitRankConfig: %s", c->rank, ncclGetErrorString(rc));
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    if (wait_comm(c, "creating the communicator", err)) {
        cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    return c;
}

int dist_nccl_allreduce_sum(dist_nccl_t *c, float *dev, size_t n, char *err) {
    if (c->broken) return err_set(err, "nccl: rank %d: the communicator was aborted after an earlier error", c->rank);
    cudaError_t ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) return err_set(err, "nccl: rank %d: the gradients' kernels failed: %s", c->rank, cudaGetErrorString(ce));
    ncclResult_t rc = ncclAllReduce(dev, dev, n, ncclFloat32, ncclSum, c->comm, c->stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        c->broken = true;
        ncclCommAbort(c->comm);
        return err_set(err, "nccl: rank %d: ncclAllReduce: %s", c->rank, ncclGetErrorString(rc));
    }
    if (wait_comm(c, "enqueueing the all-reduce", err)) return -1;
    double deadline = util_now() + c->timeout_s;
    for (;;) {
        ce = cudaStreamQuery(c->stream);
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) {
            c->broken = true;
            ncclCommAbort(c->comm);
            return err_set(err, "nccl: rank %d: the all-reduce failed: %s", c->rank, cudaGetErrorString(ce));
        }
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(c->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            c->broken = true;
            ncclCommAbort(c->comm);
            return err_set(err, "nccl: rank %d: the all-reduce failed: %s", c->rank, ncclGetErrorString(st));
        }
        if (util_now() > deadline) {
            c->broken = true;
            ncclCommAbort(c->comm);
            return err_set(err, "nccl: rank %d: the all-reduce of %zu floats did not complete within %.0f s: another "
                           "rank died or hangs; the communicator was aborted", c->rank, n, c->timeout_s);
        }
        nap();
    }
}

void dist_nccl_close(dist_nccl_t **pc) {
    dist_nccl_t *c = *pc;
    if (!c) return;
    if (!c->broken) {
        char err[ERR_LEN];
        ncclResult_t rc = ncclCommFinalize(c->comm);
        if (rc != ncclSuccess && rc != ncclInProgress) ncclCommAbort(c->comm);
        else if (wait_comm(c, "finalizing the communicator", err) == 0) ncclCommDestroy(c->comm);
    }
    cudaStreamDestroy(c->stream);
    free(c);
    *pc = NULL;
}
#endif

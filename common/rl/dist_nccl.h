// dist_nccl.h - NCCL all-reduce of device buffers for data-parallel training on GPUs (one
// process per GPU), bootstrapped over a dist_t group (rank 0 creates the NCCL unique id and
// broadcasts it). Only in CUDA builds (MARLAAS_CUDA); the ZeroMQ group (dist.h) is the path
// without GPUs and the one every rank uses for everything but the gradient sums.
//
// Timeouts: the communicator is non-blocking (ncclConfig_t.blocking = 0); its creation and every
// all-reduce are polled until done, an NCCL error, or the group's timeout, and a timeout aborts
// the communicator (ncclCommAbort) and fails the call with a message: a dead or hung rank makes
// the others fail loudly, never hang inside NCCL.
#ifndef MARLAAS_DIST_NCCL_H
#define MARLAAS_DIST_NCCL_H

#include <stddef.h>

#include "common/rl/dist.h"

typedef struct dist_nccl dist_nccl_t;

// A communicator over the ranks of d on the CUDA device current in this thread. NULL + err.
dist_nccl_t *dist_nccl_open(dist_t *d, double timeout_s, char *err);
void dist_nccl_close(dist_nccl_t **c);
// Sums n floats of device memory over all ranks, in place. Waits for the device's queued work
// first (the gradients must be complete), then for the sum. 0, or -1 + err (the communicator is
// then aborted; every later call fails).
int dist_nccl_allreduce_sum(dist_nccl_t *c, float *dev, size_t n, char *err);

#endif

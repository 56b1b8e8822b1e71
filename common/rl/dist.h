// dist.h - a process group for data parallelism: `world` ranks (one process per GPU, or per CPU
// socket) that sum gradients together and share what rank 0 decides. Over ZeroMQ (rank 0 binds a
// ROUTER, the other ranks connect a DEALER), so it works between any hosts and without GPUs;
// CUDA builds reduce device buffers with NCCL (dist_nccl.h) and use this group to bootstrap it.
//
// Every operation has a deadline (the group's timeout): a rank that died or hangs makes the
// others fail with an error naming it within that time, never wait forever. After an error the
// group is unusable (every later call fails at once); the caller stops, and its supervisor
// (Kubernetes, the operator) restarts the group.
//
// Results are bitwise identical on every rank: rank 0 sums the contributions in rank order
// (rank 0 + rank 1 + ... ) and sends the sum back.
#ifndef MARLAAS_DIST_H
#define MARLAAS_DIST_H

#include <stddef.h>

typedef struct dist dist_t;

// Joins the group. Rank 0 binds endpoint's port on all interfaces (tcp://HOST:PORT) and waits
// for the other world - 1 ranks; they connect to it. Returns when every rank has joined (all
// agree on world), or NULL + err after timeout_s (naming the ranks that did not join), for a
// rank outside 0..world-1, a second process claiming a taken rank, or a world that differs.
dist_t *dist_open(int rank, int world, const char *endpoint, double timeout_s, char *err);
void dist_close(dist_t **d);
int dist_rank(const dist_t *d);
int dist_world(const dist_t *d);

// Sums n floats (host memory) over all ranks; every rank gets the sum in buf. Every rank must
// call it with the same n. 0, or -1 + err (timeout, a lost rank, a size mismatch).
int dist_allreduce_sum(dist_t *d, float *buf, size_t n, char *err);
// Rank 0's bytes to every rank: on rank 0 *data / *len are sent (and kept); on the others they
// receive a malloc'd copy (caller frees). 0 or -1 + err.
int dist_bcast(dist_t *d, void **data, size_t *len, char *err);
// Returns once every rank has called it. 0 or -1 + err.
int dist_barrier(dist_t *d, char *err);

#endif

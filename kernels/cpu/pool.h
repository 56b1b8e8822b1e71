// pool.h - the CPU backend's thread pool: parallel loops that degrade gracefully when the cores
// are shared (another process, a Kubernetes CPU quota, a second engine on the same machine).
//
// Why not OpenMP's parallel for. A parallel region ends at a barrier: every thread of the team
// must arrive, so when the scheduler has taken a core from one of them (a competing process)
// the whole region waits for that thread's next time slice, and an engine step of a hundred
// small regions waits a hundred times; threads that spin while they wait burn the time slices
// the competitor needed. Measured: with one busy process beside it, 2-thread decode fell to
// 6-20 % of its idle speed.
//
// Here a loop [0, n) is cut into chunks that whoever is running takes (from both ends of
// contiguous ranges, pool.c): the calling thread takes part, workers that are awake join, and the
// loop is over when every chunk is done, not when every thread has shown up. A worker that wakes too late finds nothing
// left and goes back to sleep; the caller waits only for chunks already being computed. Idle
// workers spin for a few tens of microseconds (back-to-back loops of one engine step find them
// awake) and then sleep in the kernel (futex), so an idle pool uses no CPU; a thread whose core
// is shared (it waited for the core: kpool_contended) sleeps at once instead of spinning.
//
// kpool_for may be called from any thread. One loop runs on the pool at a time: a call made
// while another thread's loop holds it, or from inside a chunk (nested), runs on its caller
// alone. Results must not depend on which thread ran a chunk (chunks write disjoint outputs).
#ifndef MARLAAS_KERNELS_CPU_POOL_H
#define MARLAAS_KERNELS_CPU_POOL_H

#include <stdbool.h>
#include <stddef.h>

// Computes fn(ctx, lo, hi) over [0, n) in chunks [lo, hi) of `grain` items (the last may be
// shorter; grain 0 counts as 1), on the pool's threads and the caller. A loop the pool cannot take
// (one thread, nested, another loop in flight) runs chunk by chunk on the caller.
void kpool_for(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx);

// A grain for n items on the pool: about `per_thread` chunks per thread (more chunks balance a
// contended machine better, fewer cost less), never below min_grain.
size_t kpool_grain(size_t n, int per_thread, size_t min_grain);

// Threads that compute (the caller included): MARLAAS_THREADS, else the online cores (util.h's
// util_threads), read when the pool first runs; kpool_set_threads changes it (1..256).
int kpool_threads(void);
void kpool_set_threads(int n);

// Whether the calling thread found its core shared lately: more than 1/8 of its time runnable but
// waiting for the core (/proc/thread-self/schedstat) at one of its looks (every 5 ms at most) in
// the last 50 ms. While it is, the thread sleeps instead of spinning when it waits for a loop.
bool kpool_contended(void);

// Chunks run by the caller and by the workers since the process started (tests, benchmarks).
void kpool_stats(unsigned long long *by_caller, unsigned long long *by_workers);

#endif

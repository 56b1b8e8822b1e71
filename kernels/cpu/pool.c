// pool.c - the CPU backend's thread pool (pool.h).
//
// State of the loop in flight: the chunks [0, n_chunks) are cut into n_ranges contiguous ranges,
// one 64-bit word each (`range`: next unclaimed chunk from the front in the low 32 bits, one past
// the last unclaimed chunk in the high 32). Thread t (the caller is 0, worker i is i + 1) starts
// on range t / 2, taking chunks from its front when t is even and from its back when t is odd;
// when its range is empty it takes from the back of the others. So with two threads the caller
// walks the rows of a matrix-vector product upwards from the first and the worker downwards from
// the last, each reading memory in long ascending runs (a chunk's rows are read in order), which
// the hardware prefetchers follow; chunks handed out alternately from one counter interleave the
// two threads' streams and read W at 0.8x the speed (measured: 2 threads, matrices of a 100M
// model out of cache, Zen 4). Which thread runs a chunk never changes the chunk: chunk c is
// always items [c grain, (c + 1) grain) (reductions index their partial sums by it).
//
// A claim is a compare-and-swap on a range word. Only the loop in flight has a word with a chunk
// left (the caller returns only after every chunk of its loop was computed, and it writes every
// word of the next loop before publishing its generation), so a successful claim is a chunk of
// the loop in flight, whatever generation the claiming thread saw; the thread reads the loop's
// fields (fn, ctx, n, grain) after the claim, which (acquire) sees the caller's writes of them,
// made before the word's (release). The caller returns when `done` reaches n_chunks, and a chunk
// is counted done only after it was computed, so ctx outlives every chunk.
//
// Waiting: a worker spins on the generation for SPIN_NS (not at all while its core is shared:
// contended()), then sleeps on it (futex); the caller wakes sleepers only when there are some.
// The caller, once no chunk is left to claim, spins on `done` the same way, then sleeps on it;
// the worker that completes the last chunk wakes it.
#include "kernels/cpu/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define MAX_RANGES (MAX_THREADS / 2)
// How long an idle thread spins before it sleeps: longer than the gap between two loops of one
// engine step (microseconds), far shorter than a scheduler time slice (milliseconds).
#define SPIN_NS 50000
// ... unless its core is shared: a thread that spent more than 1/8 of the time since its last
// look runnable but waiting for a core (another task had it: /proc/thread-self/schedstat) spins
// no more for CONTENDED_HOLD_NS and sleeps at once, so the time it would spin goes to the task it
// shares the core with, and the scheduler, crediting the time it slept, gives it the core back
// sooner when it is woken. A thread looks at most every CHECK_NS (an open, read and close).
#define CONTENDED_HOLD_NS 50000000ull
#define CHECK_NS 5000000ull

static struct {
    pthread_mutex_t lock;   // one loop at a time (trylock: a second caller runs alone)
    pthread_once_t once;
    _Atomic int threads;    // computing threads, the caller included
    int started;            // workers running
    pthread_t tid[MAX_THREADS];

    _Atomic uint32_t gen;          // the loop's generation (futex word of the workers)
    _Atomic uint32_t n_ranges;     // ranges of the loop in flight
    _Atomic uint32_t done;         // chunks computed (futex word of the caller)
    _Atomic int sleepers;          // workers asleep on gen
    _Atomic int caller_sleeps;     // the caller asleep on done
    _Atomic(void (*)(void *, size_t, size_t)) fn;
    _Atomic(void *) ctx;
    _Atomic uint32_t n, grain;

    _Atomic unsigned long long by_caller, by_workers;
    _Atomic uint64_t range[MAX_RANGES];   // (end << 32) | next: unclaimed chunks [next, end)
} P = {.lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

static _Thread_local bool in_chunk;   // nested loops run on their caller

static long futex(_Atomic uint32_t *w, int op, uint32_t val) {
    return syscall(SYS_futex, (uint32_t *)w, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

// The calling thread's time spent runnable but waiting for a core (/proc/thread-self/schedstat,
// second field, ns); false when the kernel does not say.
static bool rq_wait_ns(uint64_t *w) {
    int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[96];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    unsigned long long run, wait;
    if (sscanf(buf, "%llu %llu", &run, &wait) != 2) return false;
    *w = wait;
    return true;
}

// Whether the calling thread's core is shared (see CONTENDED_HOLD_NS), looking again when its
// last look is CHECK_NS old; never when the kernel does not say.
static bool contended(uint64_t now) {
    static _Thread_local uint64_t looked, quiet_until, waited;
    if (now - looked >= CHECK_NS) {
        uint64_t w;
        if (rq_wait_ns(&w)) {
            if (looked && w - waited > (now - looked) / 8) quiet_until = now + CONTENDED_HOLD_NS;
            waited = w;
        }
        looked = now;
    }
    return now < quiet_until;
}

// How long the calling thread may spin before it sleeps.
static inline uint64_t spin_budget(uint64_t now) { return contended(now) ? 0 : SPIN_NS; }

static int env_threads(void) {
    const char *s = getenv("MARLAAS_THREADS");
    if (s && *s) {
        int n = atoi(s);
        if (n >= 1 && n <= MAX_THREADS) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

// Claims chunk from range r, from its back when `back`; false when the range is empty.
static inline bool claim(uint32_t r, bool back, uint32_t *chunk) {
    uint64_t w = atomic_load_explicit(&P.range[r], memory_order_acquire);
    for (;;) {
        uint32_t next = (uint32_t)w, end = (uint32_t)(w >> 32);
        if (next >= end) return false;
        uint64_t to = back ? (uint64_t)(end - 1) << 32 | next : (uint64_t)end << 32 | (next + 1);
        if (atomic_compare_exchange_weak_explicit(&P.range[r], &w, to, memory_order_acq_rel, memory_order_acquire)) {
            *chunk = back ? end - 1 : next;
            return true;
        }
    }
}

// Claims and computes chunks as thread t until no range has one left; returns the chunks run.
static unsigned long long work(int t) {
    unsigned long long chunks = 0;
    uint32_t nr = atomic_load_explicit(&P.n_ranges, memory_order_acquire);
    if (nr == 0 || nr > MAX_RANGES) return 0;
    uint32_t home = (uint32_t)t / 2 % nr;
    for (uint32_t i = 0; i < nr; i++) {
        uint32_t r = (home + i) % nr, c;
        bool back = i > 0 || (t & 1);
        while (claim(r, back, &c)) {
            // the loop in flight (see the top of this file): its fields are stable until done
            void (*fn)(void *, size_t, size_t) = atomic_load_explicit(&P.fn, memory_order_acquire);
            void *ctx = atomic_load_explicit(&P.ctx, memory_order_acquire);
            uint32_t n = atomic_load_explicit(&P.n, memory_order_acquire),
                     grain = atomic_load_explicit(&P.grain, memory_order_acquire);
            size_t lo = (size_t)c * grain, hi = lo + grain < n ? lo + grain : n;
            in_chunk = true;
            fn(ctx, lo, hi);
            in_chunk = false;
            chunks++;
            uint32_t n_chunks = (n + grain - 1) / grain;
            // seq_cst here and on the caller's side (caller_sleeps, then done): one of the two sees
            // the other, so the caller never sleeps through the last chunk
            uint32_t d = atomic_fetch_add(&P.done, 1) + 1;
            if (d == n_chunks && atomic_load(&P.caller_sleeps)) futex(&P.done, FUTEX_WAKE, 1);
        }
    }
    return chunks;
}

static void *worker(void *arg) {
    int index = (int)(intptr_t)arg;   // 0 for the first worker: it computes while threads >= 2
    uint32_t seen = atomic_load_explicit(&P.gen, memory_order_acquire);
    for (;;) {
        uint32_t g = atomic_load_explicit(&P.gen, memory_order_acquire);
        if (g == seen) {
            uint64_t t0 = now_ns(), budget = spin_budget(t0);
            unsigned spins = 0;
            while (budget && (g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen) {
                cpu_relax();
                if ((++spins & 255) == 0 && now_ns() - t0 > budget) break;
            }
            if (g == seen) {
                // seq_cst with the caller's gen store then sleepers load (see kpool_for); the kernel
                // sleeps only while gen still equals seen
                atomic_fetch_add(&P.sleepers, 1);
                futex(&P.gen, FUTEX_WAIT, seen);
                atomic_fetch_sub(&P.sleepers, 1);
                continue;
            }
        }
        seen = g;
        if (index >= atomic_load(&P.threads) - 1) continue;   // beyond kpool_set_threads' figure
        atomic_fetch_add_explicit(&P.by_workers, work(index + 1), memory_order_relaxed);
    }
    return NULL;
}

static void pool_init(void) {
    if (!atomic_load(&P.threads)) atomic_store(&P.threads, env_threads());
}

// Starts workers up to threads - 1 (under P.lock).
static void ensure_workers(void) {
    while (P.started < P.threads - 1) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, (size_t)8 << 20);
        int rc = pthread_create(&P.tid[P.started], &a, worker, (void *)(intptr_t)P.started);
        pthread_attr_destroy(&a);
        if (rc) {
            fprintf(stderr, "marlaas: kernels: cannot start a compute thread (%d running): errno %d; the pool runs "
                    "with fewer\n", P.started + 1, rc);
            P.threads = P.started + 1;
            return;
        }
        pthread_detach(P.tid[P.started]);
        P.started++;
    }
}

// The loop on its caller alone, chunk by chunk (a chunk never exceeds the grain).
static void inline_loop(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx) {
    for (size_t lo = 0; lo < n; lo += grain) fn(ctx, lo, n - lo > grain ? lo + grain : n);
}

void kpool_for(size_t n, size_t grain, void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx) {
    if (n == 0) return;
    if (grain < 1) grain = 1;
    pthread_once(&P.once, pool_init);
    if (n <= grain || P.threads <= 1 || in_chunk || n > UINT32_MAX || grain > UINT32_MAX ||
        pthread_mutex_trylock(&P.lock) != 0) {
        inline_loop(n, grain, fn, ctx);
        return;
    }
    ensure_workers();
    if (P.started == 0) {
        pthread_mutex_unlock(&P.lock);
        inline_loop(n, grain, fn, ctx);
        return;
    }
    uint32_t g = atomic_load_explicit(&P.gen, memory_order_relaxed) + 1;
    uint32_t n_chunks = (uint32_t)((n + grain - 1) / grain), nr = (uint32_t)(P.threads + 1) / 2;
    if (nr > n_chunks) nr = n_chunks;
    if (nr > MAX_RANGES) nr = MAX_RANGES;
    atomic_store_explicit(&P.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&P.ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&P.n, (uint32_t)n, memory_order_relaxed);
    atomic_store_explicit(&P.grain, (uint32_t)grain, memory_order_relaxed);
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    atomic_store_explicit(&P.n_ranges, nr, memory_order_relaxed);
    for (uint32_t r = 0; r < nr; r++) {
        uint64_t lo = (uint64_t)n_chunks * r / nr, hi = (uint64_t)n_chunks * (r + 1) / nr;
        atomic_store_explicit(&P.range[r], hi << 32 | lo, memory_order_release);
    }
    atomic_store(&P.gen, g);
    if (atomic_load(&P.sleepers)) futex(&P.gen, FUTEX_WAKE, INT_MAX);
    atomic_fetch_add_explicit(&P.by_caller, work(0), memory_order_relaxed);
    // every chunk is claimed: wait for those still being computed
    uint64_t t0 = now_ns(), budget = spin_budget(t0);
    unsigned spins = 0;
    uint32_t d;
    while ((d = atomic_load_explicit(&P.done, memory_order_acquire)) != n_chunks) {
        cpu_relax();
        if (budget && ((++spins & 255) || now_ns() - t0 < budget)) continue;
        atomic_store(&P.caller_sleeps, 1);
        d = atomic_load(&P.done);
        if (d != n_chunks) futex(&P.done, FUTEX_WAIT, d);
        atomic_store(&P.caller_sleeps, 0);
        t0 = now_ns(), budget = spin_budget(t0);
    }
    pthread_mutex_unlock(&P.lock);
}

size_t kpool_grain(size_t n, int per_thread, size_t min_grain) {
    pthread_once(&P.once, pool_init);
    size_t chunks = (size_t)P.threads * (size_t)(per_thread > 0 ? per_thread : 1);
    size_t g = (n + chunks - 1) / chunks;
    return g < min_grain ? (min_grain ? min_grain : 1) : g;
}

int kpool_threads(void) {
    pthread_once(&P.once, pool_init);
    return P.threads;
}

void kpool_set_threads(int n) {
    pthread_once(&P.once, pool_init);
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&P.lock);
    // workers started before and now beyond n skip the loops they are woken for
    atomic_store(&P.threads, n);
    pthread_mutex_unlock(&P.lock);
}

void kpool_stats(unsigned long long *by_caller, unsigned long long *by_workers) {
    if (by_caller) *by_caller = atomic_load(&P.by_caller);
    if (by_workers) *by_workers = atomic_load(&P.by_workers);
}

bool kpool_contended(void) { return contended(now_ns()); }

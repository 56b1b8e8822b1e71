// test_pool.c - the CPU backend's thread pool (kernels/cpu/pool.h): every item computed exactly
// once for any n and grain, on any thread count; nested loops and loops from several threads at
// once complete; the workers take part; an idle pool sleeps instead of spinning; a thread that
// shares its core finds it contended.
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/pool.h"

typedef struct {
    _Atomic int *hits;
    _Atomic size_t calls;
    size_t grain, n;
    _Atomic int bad;
} count_t;

static void count(void *arg, size_t lo, size_t hi) {
    count_t *c = arg;
    if (hi <= lo || hi > c->n || hi - lo > c->grain) atomic_store(&c->bad, 1);
    for (size_t i = lo; i < hi && i < c->n; i++) atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->calls, 1);
}

static void check_once(size_t n, size_t grain) {
    count_t c = {.hits = calloc(n ? n : 1, sizeof(_Atomic int)), .grain = grain < 1 ? 1 : grain, .n = n};
    kpool_for(n, grain, count, &c);
    cr_assert_eq(atomic_load(&c.bad), 0, "n %zu grain %zu: a chunk out of range or larger than the grain", n, grain);
    for (size_t i = 0; i < n; i++) cr_assert_eq(atomic_load(&c.hits[i]), 1, "n %zu grain %zu: item %zu ran %d times", n,
                                                grain, i, atomic_load(&c.hits[i]));
    free(c.hits);
}

Test(pool, every_item_once_for_any_size_and_thread_count) {
    static const size_t ns[] = {0, 1, 2, 7, 64, 65, 1000, 4099};
    static const size_t grains[] = {0, 1, 3, 64, 5000};
    for (int t = 1; t <= 4; t++) {
        kpool_set_threads(t);
        cr_assert_eq(kpool_threads(), t);
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof grains / sizeof *grains; b++) check_once(ns[a], grains[b]);
    }
    kpool_set_threads(2);
}

// A loop whose chunks run loops of their own: the inner ones run on the chunk's thread.
static void outer(void *arg, size_t lo, size_t hi) {
    count_t *inner = arg;
    for (size_t i = lo; i < hi; i++) {
        count_t c = {.hits = inner->hits + i * 16, .grain = 4, .n = 16};
        kpool_for(16, 4, count, &c);
        if (atomic_load(&c.bad)) atomic_store(&inner->bad, 1);
    }
}

Test(pool, nested_loops_complete) {
    kpool_set_threads(2);
    count_t c = {.hits = calloc(64 * 16, sizeof(_Atomic int)), .n = 64, .grain = 8};
    kpool_for(64, 8, outer, &c);
    cr_assert_eq(atomic_load(&c.bad), 0);
    for (int i = 0; i < 64 * 16; i++) cr_assert_eq(atomic_load(&c.hits[i]), 1, "item %d", i);
    free(c.hits);
}

static void *many_loops(void *arg) {
    (void)arg;
    for (int r = 0; r < 200; r++) check_once(1000 + (size_t)r, 16);
    return NULL;
}

Test(pool, loops_from_several_threads_at_once) {
    kpool_set_threads(2);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, many_loops, NULL), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
}

static void busy(void *arg, size_t lo, size_t hi) {
    volatile double *x = arg;
    for (size_t i = lo; i < hi; i++)
        for (int k = 0; k < 2000; k++) *x += 1e-9;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// The workers compute chunks (not only the caller), and once the loops stop the pool sleeps:
// over 300 ms of idleness the process uses far less than one core.
Test(pool, workers_take_part_and_an_idle_pool_sleeps) {
    kpool_set_threads(2);
    unsigned long long c0, w0, c1, w1;
    kpool_stats(&c0, &w0);
    volatile double x = 0;
    for (int r = 0; r < 2000; r++) kpool_for(64, 1, busy, (void *)&x);
    kpool_stats(&c1, &w1);
    cr_assert_eq((c1 - c0) + (w1 - w0), 2000ull * 64, "chunks counted: %llu", (c1 - c0) + (w1 - w0));
    cr_assert_gt(w1 - w0, 0, "no chunk ran on a worker in 2000 loops");
    usleep(20000);
    double t0 = cpu_seconds();
    usleep(300000);
    double used = cpu_seconds() - t0;
    cr_assert_lt(used, 0.05, "an idle pool used %.3f CPU-seconds in 0.3 s (it spins)", used);
}

// Which thread ran each chunk, in the order the chunks were taken.
typedef struct {
    pthread_t caller;
    _Atomic int next;
    int chunk[64];
    pthread_t by[64];
    size_t grain;
    _Atomic int bad;
} order_t;

static void record(void *arg, size_t lo, size_t hi) {
    order_t *o = arg;
    if (lo % o->grain || (hi - lo != o->grain && hi != 64 * o->grain - 3)) atomic_store(&o->bad, 1);
    int at = atomic_fetch_add(&o->next, 1);
    if (at < 64) o->chunk[at] = (int)(lo / o->grain), o->by[at] = pthread_self();
    volatile double x = 0;
    for (int k = 0; k < 20000; k++) x += 1e-9;
}

// With two threads the caller takes the chunks from the first upwards and the worker from the
// last downwards (each reads memory in one ascending run per chunk, and the two runs do not
// interleave); chunk c is always items [c grain, (c + 1) grain), whoever runs it.
Test(pool, two_threads_take_the_chunks_from_both_ends) {
    kpool_set_threads(2);
    int with_worker = 0;
    for (int round = 0; round < 50 && with_worker < 3; round++) {
        order_t o = {.caller = pthread_self(), .grain = 5};
        kpool_for(64 * 5 - 3, 5, record, &o);
        cr_assert_eq(atomic_load(&o.bad), 0, "a chunk not aligned to the grain");
        cr_assert_eq(atomic_load(&o.next), 64);
        // the caller's chunks: 0, 1, 2, ... in turn; every other thread's: downwards (a worker
        // left over from a loop on more threads may join the one worker of two)
        int caller_last = -1, by_worker = 0;
        bool seen[64] = {false};
        for (int i = 0; i < 64; i++) {
            int c = o.chunk[i];
            cr_assert(!seen[c], "chunk %d ran twice", c);
            seen[c] = true;
            if (pthread_equal(o.by[i], o.caller)) {
                cr_assert_eq(c, caller_last + 1, "the caller took chunk %d after %d", c, caller_last);
                caller_last = c;
                continue;
            }
            by_worker++;
            for (int j = 0; j < i; j++)
                if (pthread_equal(o.by[j], o.by[i]))
                    cr_assert_lt(c, o.chunk[j], "a worker took chunk %d after %d", c, o.chunk[j]);
        }
        if (by_worker) with_worker++;
    }
    cr_assert_gt(with_worker, 0, "the worker took no chunk in 50 loops");
}

static _Atomic int hog_stop;

static void *hog(void *arg) {
    cpu_set_t *one = arg;
    pthread_setaffinity_np(pthread_self(), sizeof *one, one);
    volatile unsigned long x = 0;
    while (!atomic_load_explicit(&hog_stop, memory_order_relaxed)) x++;
    return NULL;
}

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A thread that shares its core with a busy thread finds it shared (and then sleeps instead of
// spinning when it waits for a loop, pool.c): both pinned to one core, it computes for up to
// 0.5 s and asks every millisecond.
Test(pool, a_thread_sharing_its_core_with_a_busy_one_finds_it_contended) {
    if (access("/proc/thread-self/schedstat", R_OK) != 0) cr_skip_test("the kernel gives no schedstat");
    cpu_set_t all, one;
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    int c = 0;
    while (c < CPU_SETSIZE && !CPU_ISSET(c, &all)) c++;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    cr_assert_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    atomic_store(&hog_stop, 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, hog, &one), 0);
    double t0 = wall_now(), found = -1;
    volatile double x = 0;
    while (found < 0 && wall_now() - t0 < 0.5) {
        double t1 = wall_now();
        while (wall_now() - t1 < 0.001) x += 1e-9;
        if (kpool_contended()) found = wall_now() - t0;
    }
    atomic_store(&hog_stop, 1);
    pthread_join(th, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof all, &all);
    cr_assert_geq(found, 0, "computing for 0.5 s beside a busy thread on its core, the thread never found it shared");
}

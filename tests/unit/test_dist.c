// test_dist.c - the data-parallel process group: real processes (fork) over real ZeroMQ sockets
// on loopback. Sums are exact and identical on every rank; broadcasts arrive whole; a rank that
// never joins, dies mid-run or disagrees on sizes makes every other rank fail within the
// timeout with an error naming it; impostors (wrong world, a taken rank) are refused.
#include <criterion/criterion.h>

#include <czmq.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rl/dist.h"
#include "common/util/util.h"
#include "tests/unit/testbits.h"

static char ep[64];
static void new_endpoint(void) { snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port()); }

// Child processes report through their exit status: 0 = as expected.
static pid_t spawn(int (*fn)(int rank, int world), int rank, int world) {
    pid_t p = fork();
    cr_assert_neq(p, -1);
    if (p == 0) {
        int rc = fn(rank, world);
        // as a normal exit would: ZeroMQ delivers what is still queued (the sockets' linger)
        zsys_shutdown();
        _exit(rc);
    }
    return p;
}
static int wait_ok(pid_t p) {
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

#define N 1000
static float value(int rank, int i) { return (float)((rank + 1) * i) + 0.25f * (float)rank; }

// Five rounds of sum, broadcast and barrier; every check inside. Returns 0 when all hold.
static int run_rounds(int rank, int world) {
    char err[ERR_LEN];
    dist_t *d = dist_open(rank, world, ep, 10, err);
    if (!d) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    float *buf = malloc(sizeof(float) * N);
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) buf[i] = value(rank, i) + (float)round;
        if (dist_allreduce_sum(d, buf, N, err)) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            return 2;
        }
        for (int i = 0; i < N; i++) {
            float want = 0;
            for (int r = 0; r < world; r++) want += value(r, i) + (float)round;
            if (buf[i] != want) {
                fprintf(stderr, "rank %d round %d: [%d] = %g, want %g\n", rank, round, i, buf[i], want);
                return 3;
            }
        }
        char msg[64];
        snprintf(msg, sizeof msg, "round %d from rank 0", round);
        void *data = rank == 0 ? msg : NULL;
        size_t len = rank == 0 ? strlen(msg) + 1 : 0;
        if (dist_bcast(d, &data, &len, err)) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            return 4;
        }
        if (len != strlen(msg) + 1 || strcmp(data, msg)) return 5;
        if (rank != 0) free(data);
        if (dist_barrier(d, err)) return 6;
    }
    free(buf);
    cr_assert_eq(dist_rank(d), rank);
    cr_assert_eq(dist_world(d), world);
    dist_close(&d);
    return 0;
}

Test(dist, sums_broadcasts_and_barriers_over_four_processes) {
    new_endpoint();
    pid_t p[4];
    for (int r = 3; r >= 0; r--) p[r] = spawn(run_rounds, r, 4);   // rank 0 last: the others wait for it
    for (int r = 0; r < 4; r++) cr_assert_eq(wait_ok(p[r]), 0, "rank %d failed", r);
}

Test(dist, a_world_of_one_needs_no_peers) {
    char err[ERR_LEN];
    dist_t *d = dist_open(0, 1, NULL, 1, err);
    cr_assert_not_null(d, "%s", err);
    float x[3] = {1, 2, 3};
    cr_assert_eq(dist_allreduce_sum(d, x, 3, err), 0);
    cr_assert_float_eq(x[2], 3, 0);
    dist_close(&d);
    cr_assert_null(dist_open(1, 1, "tcp://127.0.0.1:1", 1, err));
    cr_assert(strstr(err, "outside 0..0"), "%s", err);
    cr_assert_null(dist_open(0, 2, "127.0.0.1:5000", 1, err));
    cr_assert(strstr(err, "tcp://HOST:PORT"), "%s", err);
}

// Rank 2 of 3 never starts.
static int expect_join_failure(int rank, int world) {
    char err[ERR_LEN] = "";
    double t0 = util_now();
    // rank 1 waits longer than rank 0: it hears from rank 0 why the group did not form
    dist_t *d = dist_open(rank, world, ep, rank == 0 ? 1.5 : 6, err);
    double dt = util_now() - t0;
    if (d) return 1;
    const char *want = rank == 0 ? "ranks 2 of 3 did not join" : "ranks 2 of 3 did not join";
    if (!strstr(err, want)) {
        fprintf(stderr, "rank %d: unexpected error: %s\n", rank, err);
        return 2;
    }
    return dt < 5 ? 0 : 3;
}

Test(dist, a_rank_that_never_joins_fails_everyone_in_time) {
    new_endpoint();
    pid_t a = spawn(expect_join_failure, 1, 3), b = spawn(expect_join_failure, 0, 3);
    cr_assert_eq(wait_ok(b), 0, "rank 0");
    cr_assert_eq(wait_ok(a), 0, "rank 1 (told by rank 0 why the group stopped)");
}

// Rank 2 joins, then dies before the first sum.
static int die_after_join(int rank, int world) {
    char err[ERR_LEN];
    static dist_t *volatile d;   // kept reachable: what a crash leaves behind is no leak of ours
    d = dist_open(rank, world, ep, 10, err);
    if (!d) _exit(1);
    // a crash: no goodbye, nothing closed or flushed
    raise(SIGKILL);
    return 2;
}
static int expect_sum_failure(int rank, int world) {
    char err[ERR_LEN] = "";
    dist_t *d = dist_open(rank, world, ep, 2, err);
    if (!d) return 1;
    float x[4] = {1, 2, 3, 4};
    double t0 = util_now();
    int rc = dist_allreduce_sum(d, x, 4, err);
    double dt = util_now() - t0;
    if (rc == 0) return 2;
    // rank 0 names the missing rank; rank 1 hears it from rank 0 at once
    if (!strstr(err, "ranks 2 did not take part")) {
        fprintf(stderr, "rank %d: unexpected error: %s\n", rank, err);
        return 3;
    }
    if (dt > 4) return 4;
    // the group is unusable from now on: the next call fails at once with the same reason
    char err2[ERR_LEN];
    if (dist_barrier(d, err2) == 0 || strcmp(err, err2) != 0) return 5;
    dist_close(&d);
    return 0;
}

Test(dist, a_rank_that_dies_fails_the_others_with_its_name) {
    new_endpoint();
    pid_t c = spawn(die_after_join, 2, 3), b = spawn(expect_sum_failure, 1, 3), a = spawn(expect_sum_failure, 0, 3);
    cr_assert_eq(wait_ok(c), 100 + SIGKILL, "rank 2 did not join and die");
    cr_assert_eq(wait_ok(a), 0, "rank 0");
    cr_assert_eq(wait_ok(b), 0, "rank 1");
}

static int sum_of(int rank, int world, size_t n, const char *want) {
    char err[ERR_LEN] = "";
    dist_t *d = dist_open(rank, world, ep, 5, err);
    if (!d) return 1;
    float x[8] = {0};
    int rc = dist_allreduce_sum(d, x, n, err);
    dist_close(&d);
    if (rc == 0) return 2;
    if (!strstr(err, want)) {
        fprintf(stderr, "rank %d: unexpected error: %s\n", rank, err);
        return 3;
    }
    return 0;
}
static int sum5(int rank, int world) { return sum_of(rank, world, 5, "rank 1 contributed 4 floats to a sum of 5"); }
static int sum4(int rank, int world) { return sum_of(rank, world, 4, "contributed 4 floats to a sum of 5"); }

Test(dist, ranks_that_disagree_on_sizes_fail_loudly) {
    new_endpoint();
    pid_t b = spawn(sum4, 1, 2), a = spawn(sum5, 0, 2);
    cr_assert_eq(wait_ok(a), 0, "rank 0");
    cr_assert_eq(wait_ok(b), 0, "rank 1");
}

static int impostor_world(int rank, int world) {
    char err[ERR_LEN] = "";
    (void)world;
    dist_t *d = dist_open(rank, 5, ep, 5, err);   // the group has world 2
    if (d) return 1;
    return strstr(err, "world 5 differs from rank 0's 2") ? 0 : 2;
}
static int plain_join(int rank, int world) {
    char err[ERR_LEN];
    dist_t *d = dist_open(rank, world, ep, 5, err);
    if (!d) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    int rc = dist_barrier(d, err);
    dist_close(&d);
    return rc ? 2 : 0;
}

Test(dist, impostors_are_refused_and_the_group_still_forms) {
    new_endpoint();
    // rank 0 waits for its group; an impostor comes and is refused; then the real rank 1 joins
    pid_t a = spawn(plain_join, 0, 2), i = spawn(impostor_world, 1, 2);
    cr_assert_eq(wait_ok(i), 0, "impostor not refused with the reason");
    pid_t b = spawn(plain_join, 1, 2);
    cr_assert_eq(wait_ok(a), 0, "rank 0");
    cr_assert_eq(wait_ok(b), 0, "rank 1");
}

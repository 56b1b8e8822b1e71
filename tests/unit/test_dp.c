// test_dp.c - data-parallel training passes: real processes (fork) in a real ZeroMQ process group
// on loopback, each with its own engine on a tiny random model. The summed gradient of a pass split
// over 2 and 3 ranks equals the single-process gradient (to float rounding); statistics too; the
// workers' replicas of adapters and optimiser states stay identical to rank 0's bit for bit after
// several AdamW steps; a refused pass refuses on every rank and leaves the group usable; a worker
// that dies makes rank 0 fail within the deadline with a message naming it.
#include <criterion/criterion.h>

#include <czmq.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rl/dp.h"
#include "common/rl/rl.h"
#include "tests/unit/testbits.h"
#include "tests/unit/testpass.h"
#include "tests/unit/testutil.h"

#define SLOTS 3
static char ep[64];
static bool never(void) { return false; }

typedef struct {
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
} rig_t;

// The same model on every rank; adapters only on rank 0 (the workers get them with dp_load).
static void rig_open(rig_t *r, bool adapters) {
    hf_config_t c = tu_config();
    r->m = tu_model(&c, 7);
    r->pool = lora_pool_new(SLOTS);
    char err[ERR_LEN];
    for (int s = 0; adapters && s < SLOTS; s++) {
        lora_t *a = tu_adapter(&c, 2 + 2 * s, 0x7f, 100 + s);   // mixed ranks, every target
        cr_assert_eq(lora_pool_set(r->pool, s, &a, err), 0, "%s", err);
    }
    r->e = engine_new(r->m, r->pool, err);
    cr_assert_not_null(r->e, "%s", err);
}

static void rig_close(rig_t *r) {
    engine_destroy(&r->e);
    lora_pool_destroy(&r->pool);
    model_destroy(&r->m);
}

static const loss_cfg_t LC = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f};

// A worker: joins, follows rank 0, then writes its adapters' parameters to build/test-tmp/dp-R.bin.
static int worker(int rank, int world) {
    rig_t r;
    rig_open(&r, false);
    char err[ERR_LEN];
    dp_cfg_t c = {.rank = rank, .world = world, .endpoint = ep, .timeout_s = 10};
    dp_t *d = dp_open(&c, r.e, err);
    if (!d) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    int rc = dp_serve(d, never, err);
    if (rc) fprintf(stderr, "rank %d: %s\n", rank, err);
    char path[256];
    snprintf(path, sizeof path, "build/test-tmp/dp-%d-%d.bin", (int)getppid(), rank);
    FILE *f = fopen(path, "wb");
    for (int s = 0; f && s < SLOTS; s++) {
        lora_t *a = lora_pool_get(r.pool, s);
        if (a) fwrite(a->params, sizeof(float), a->n_params, f);
    }
    if (f) fclose(f);
    dp_close(&d);
    rig_close(&r);
    return rc ? 2 : 0;
}

static pid_t spawn(int rank, int world) {
    pid_t p = fork();
    cr_assert_neq(p, -1);
    if (p == 0) {
        int rc = worker(rank, world);
        zsys_shutdown();
        _exit(rc);
    }
    return p;
}

static int wait_rc(pid_t p) {
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static float **grads_new(lora_pool_t *pool) {
    float **g = calloc(SLOTS, sizeof(float *));
    for (int s = 0; s < SLOTS; s++) g[s] = calloc(lora_pool_get(pool, s)->n_params, sizeof(float));
    return g;
}
static void grads_free(float **g) {
    for (int s = 0; s < SLOTS; s++) free(g[s]);
    free(g);
}

static void run_world(int world) {
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port());
    char err[ERR_LEN], dir[256];
    tu_tmpdir(dir, sizeof dir, "dp");
    pid_t kids[4];
    for (int r = 1; r < world; r++) kids[r] = spawn(r, world);
    rig_t r0;
    rig_open(&r0, true);
    dp_cfg_t c = {.rank = 0, .world = world, .endpoint = ep, .timeout_s = 10};
    dp_t *d = dp_open(&c, r0.e, err);
    cr_assert_not_null(d, "%s", err);
    optim_t *opt[SLOTS];
    optim_cfg_t oc = optim_defaults();
    oc.lr = 0.01f;
    for (int s = 0; s < SLOTS; s++) {
        opt[s] = optim_new(&oc, kernels_cpu(), lora_pool_get(r0.pool, s)->n_params);
        cr_assert_eq(dp_load(d, s, opt[s], err), 0, "%s", err);
    }
    float **want = grads_new(r0.pool), **got = grads_new(r0.pool);
    const int slots[2] = {0, 2};
    for (int step = 0; step < 3; step++) {
        tp_pass_t p;
        tp_pass_build(&p, 1000 + step, false);
        loss_stats_t sw[SLOTS + 1] = {0}, sg[SLOTS + 1] = {0};
        cr_assert_eq(dp_pass(NULL, r0.e, p.s, p.n, &LC, want, slots, 2, sw, SLOTS + 1, err), 0, "%s", err);
        cr_assert_eq(dp_pass(d, r0.e, p.s, p.n, &LC, got, slots, 2, sg, SLOTS + 1, err), 0, "%s", err);
        for (int i = 0; i < 2; i++) {
            int s = slots[i];
            char what[64];
            snprintf(what, sizeof what, "world %d step %d slot %d", world, step, s);
            tp_expect_close(what, got[s], want[s], lora_pool_get(r0.pool, s)->n_params, 1e-5f);
            const loss_stats_t *a = &sg[s + 1], *b = &sw[s + 1];
            cr_assert(b->tokens > 0 && a->tokens == b->tokens, "%s: tokens %g vs %g", what, a->tokens, b->tokens);
            cr_assert(fabs(a->loss - b->loss) <= 1e-5 * (1 + fabs(b->loss)), "%s: loss %g vs %g", what, a->loss, b->loss);
            cr_assert(fabs(a->ratio_mean - b->ratio_mean) <= 1e-5, "%s: ratio %g vs %g", what, a->ratio_mean, b->ratio_mean);
            cr_assert(fabs(a->entropy - b->entropy) <= 1e-4 * (1 + b->entropy), "%s: entropy", what);
            cr_assert(fabs(a->mismatch - b->mismatch) <= 1e-4 * (1 + b->mismatch) && a->mismatch_tokens == b->mismatch_tokens,
                      "%s: mismatch %g (%g tokens) vs %g (%g)", what, a->mismatch, a->mismatch_tokens, b->mismatch,
                      b->mismatch_tokens);
            optim_step(opt[s], lora_pool_get(r0.pool, s)->params, got[s]);
        }
        tp_pass_free(&p);
    }
    // a pass with a token outside the vocabulary: refused everywhere, nothing summed, group usable
    tp_pass_t bad;
    tp_pass_build(&bad, 77, true);
    cr_assert_eq(dp_pass(d, r0.e, bad.s, bad.n, &LC, got, slots, 2, NULL, 0, err), DP_REFUSED);
    cr_assert(strstr(err, "outside") || strstr(err, "refused"), "refusal reason: %s", err);
    for (size_t i = 0; i < lora_pool_get(r0.pool, 0)->n_params; i++) cr_assert_eq(got[0][i], 0.0f);
    tp_pass_free(&bad);
    cr_assert_eq(dp_ping(d, err), 0, "%s", err);
    // a freed slot is free everywhere; its replica is not written by the workers
    cr_assert_eq(dp_clear(d, 1, err), 0, "%s", err);
    dp_close(&d);
    for (int r = 1; r < world; r++) cr_assert_eq(wait_rc(kids[r]), 0, "rank %d failed", r);
    // replicas identical to rank 0's adapters (slots 0 and 2) bit for bit
    for (int r = 1; r < world; r++) {
        char path[256];
        snprintf(path, sizeof path, "build/test-tmp/dp-%d-%d.bin", (int)getpid(), r);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "rank %d wrote no parameters", r);
        for (int i = 0; i < 2; i++) {
            lora_t *a = lora_pool_get(r0.pool, slots[i]);
            float *buf = malloc(sizeof(float) * a->n_params);
            cr_assert_eq(fread(buf, sizeof(float), a->n_params, f), a->n_params, "rank %d: short file", r);
            cr_assert_eq(memcmp(buf, a->params, sizeof(float) * a->n_params), 0,
                         "rank %d: the replica of slot %d differs from rank 0's adapter", r, slots[i]);
            free(buf);
        }
        char c1;
        cr_assert_eq(fread(&c1, 1, 1, f), 0, "rank %d still holds the cleared slot", r);
        fclose(f);
        unlink(path);
    }
    for (int s = 0; s < SLOTS; s++) optim_destroy(&opt[s]);
    grads_free(want), grads_free(got);
    rig_close(&r0);
}

Test(dp, two_ranks_equal_one, .timeout = 120) { run_world(2); }
// three ranks: 8 units of very different sizes; every rank trains a share
Test(dp, three_ranks_equal_one, .timeout = 120) { run_world(3); }

Test(dp, shard_keeps_groups_and_balances) {
    tp_pass_t p;
    tp_pass_build(&p, 5, false);
    int owner[64], rows[3] = {0};
    char err[ERR_LEN];
    cr_assert_eq(dp_shard(p.s, p.n, 3, owner, err), 0, "%s", err);
    for (int i = 0; i < p.n; i++) {
        if (p.s[i].prefix_of) cr_assert_eq(owner[i], owner[p.s[i].prefix_of - 1], "sample %d left its prompt", i);
        rows[owner[i]] += p.s[i].len - p.s[i].prefix_len;
    }
    int mx = 0, mn = 1 << 30, unit = 0;
    for (int r = 0; r < 3; r++) mx = rows[r] > mx ? rows[r] : mx, mn = rows[r] < mn ? rows[r] : mn;
    for (int i = 0; i < p.n; i++) {
        if (p.s[i].prefix_of) continue;
        int u = p.s[i].len;
        for (int j = i + 1; j < p.n; j++)
            if (p.s[j].prefix_of == i + 1) u += p.s[j].len - p.s[j].prefix_len;
        unit = u > unit ? u : unit;
    }
    cr_assert(mn > 0 && mx - mn <= unit, "rows per rank %d %d %d (largest unit %d)", rows[0], rows[1], rows[2], unit);
    p.s[3].prefix_of = 5;   // names a later sequence
    cr_assert_eq(dp_shard(p.s, p.n, 3, owner, err), -1);
    cr_assert(strstr(err, "prefix_of"), "%s", err);
    tp_pass_free(&p);
}

// A worker killed in the middle: rank 0's next pass fails within the deadline, naming rank 1.
Test(dp, dead_rank_fails_loudly, .timeout = 60) {
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", tu_free_port());
    char err[ERR_LEN];
    pid_t kid = spawn(1, 2);
    rig_t r0;
    rig_open(&r0, true);
    dp_cfg_t c = {.rank = 0, .world = 2, .endpoint = ep, .timeout_s = 3};
    dp_t *d = dp_open(&c, r0.e, err);
    cr_assert_not_null(d, "%s", err);
    kill(kid, SIGKILL);
    cr_assert_eq(wait_rc(kid), 100 + SIGKILL);
    float **g = grads_new(r0.pool);
    tp_pass_t p;
    tp_pass_build(&p, 9, false);
    const int slots[2] = {0, 2};
    double t0 = util_now();
    int rc = dp_pass(d, r0.e, p.s, p.n, &LC, g, slots, 2, NULL, 0, err);
    double took = util_now() - t0;
    cr_assert_eq(rc, DP_BROKEN, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "rank") && strstr(err, "1"), "the message names the rank: %s", err);
    cr_assert(took < 10, "failed after %.1f s (deadline 3 s)", took);
    cr_assert_eq(dp_ping(d, err), DP_BROKEN, "a broken group stays broken");
    tp_pass_free(&p);
    grads_free(g);
    dp_close(&d);
    rig_close(&r0);
}

// test_policy.c - the scheduler's decisions (common/rl/policy.h) in simulated rounds: fair share
// against the bounds its rule implies, the in-flight cap and the staleness it guarantees, lease
// expiry at its deadline and re-issue, reports applied once.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/policy.h"

// A job that always has room (running, far from max_steps, nothing in flight).
static policy_job_t open_job(void) {
    return (policy_job_t){.running = true, .max_steps = 1000000, .prompts = 1000000, .staleness = 1};
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

// Runs `rounds` issuing decisions over jobs that always have room, tasks of `chunk` groups.
// Checks after every round that the virtual times stay within chunk / min weight of each other
// (the smallest is charged each time), and between two tasks of job i every other job j got at
// most floor(w_j / w_i) + 1 tasks. Returns the groups issued per job in g.
static void simulate_share(policy_job_t *jobs, const double *w, int n, int rounds, int chunk, long *g) {
    int since[16] = {0};   // tasks of other jobs since job i's last task
    double wmin = w[0];
    for (int i = 1; i < n; i++) wmin = fmin(wmin, w[i]);
    for (int r = 0; r < rounds; r++) {
        int k = policy_next_job(POLICY_ASYNC, jobs, n);
        cr_assert_geq(k, 0, "round %d: no job chosen although all have room", r);
        uint32_t sz = policy_task_size(policy_room(POLICY_ASYNC, &jobs[k]), chunk);
        cr_assert_eq(sz, (uint32_t)chunk);
        jobs[k].vtime = policy_charge(jobs[k].vtime, sz, w[k]);
        g[k] += sz;
        for (int i = 0; i < n; i++) {
            if (i == k) {
                since[i] = 0;
                continue;
            }
            since[i]++;
            int bound = 0;
            for (int j = 0; j < n; j++)
                if (j != i) bound += (int)floor(w[j] / w[i]) + 1;
            cr_assert_leq(since[i], bound, "round %d: job %d (weight %.2f) not issued for %d tasks (bound %d)", r, i, w[i],
                          since[i], bound);
        }
        double lo = jobs[0].vtime, hi = jobs[0].vtime;
        for (int i = 1; i < n; i++) lo = fmin(lo, jobs[i].vtime), hi = fmax(hi, jobs[i].vtime);
        cr_assert_leq(hi - lo, chunk / wmin + 1e-9, "round %d: virtual times spread %.3f > %.3f", r, hi - lo, chunk / wmin);
    }
}

Test(policy, equal_weights_share_equally_and_starve_no_job) {
    enum { N = 5, ROUNDS = 10000, CHUNK = 8 };
    policy_job_t jobs[N];
    double w[N];
    long g[N] = {0};
    for (int i = 0; i < N; i++) jobs[i] = open_job(), w[i] = 1.0;
    simulate_share(jobs, w, N, ROUNDS, CHUNK, g);
    // round robin: every job within one task of the others
    for (int i = 0; i < N; i++) cr_assert_eq(g[i], (long)ROUNDS / N * CHUNK, "job %d: %ld groups", i, g[i]);
}

Test(policy, weights_are_respected_in_proportion) {
    enum { N = 4, ROUNDS = 20000, CHUNK = 8 };
    const double w[N] = {1.0, 2.0, 5.0, 0.5};
    policy_job_t jobs[N];
    long g[N] = {0}, total = 0;
    double wsum = 0;
    for (int i = 0; i < N; i++) jobs[i] = open_job(), wsum += w[i];
    simulate_share(jobs, w, N, ROUNDS, CHUNK, g);
    for (int i = 0; i < N; i++) total += g[i];
    for (int i = 0; i < N; i++) {
        // groups / weight equal within one task of the lightest job (chunk / min weight)
        cr_assert_leq(fabs((double)g[i] / w[i] - (double)g[0] / w[0]), CHUNK / 0.5 + 1e-9, "job %d: %ld groups", i, g[i]);
        double share = (double)g[i] / (double)total, want = w[i] / wsum;
        cr_assert_leq(fabs(share - want), 0.002, "job %d: share %.4f, weight share %.4f", i, share, want);
    }
}

Test(policy, ties_go_to_the_earlier_job_and_full_jobs_are_passed_over) {
    policy_job_t jobs[3] = {open_job(), open_job(), open_job()};
    jobs[0].vtime = jobs[1].vtime = jobs[2].vtime = 4.0;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 3), 0);
    jobs[0].vtime = 4.5;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 3), 1);
    // the job furthest behind is at its cap: the next one gets the task
    jobs[1].prompts = 16, jobs[1].staleness = 1, jobs[1].in_flight = 32;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 3), 2);
    // finished, not running: passed over too
    jobs[2].step = jobs[2].max_steps;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 3), 0);
    jobs[0].running = false;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 3), -1);
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 0), -1);
}

// Fair share per tenant first: tenant B's one job beside tenant A's eight gets half the groups
// (not 1/9), A's jobs split A's half evenly, and neither tenant waits long between tasks.
Test(policy, tenants_share_first_then_their_jobs) {
    enum { NA = 8, N = NA + 1, CHUNK = 8, ROUNDS = 1800 };
    policy_job_t jobs[N];
    double tv[2] = {0, 0};
    long g[N] = {0};
    for (int i = 0; i < N; i++) jobs[i] = open_job(), jobs[i].tenant = i < NA ? 0 : 1;
    int since_b = 0, worst_b = 0;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < N; i++) jobs[i].tenant_vtime = tv[jobs[i].tenant];
        int k = policy_next_job(POLICY_ASYNC, jobs, N);
        cr_assert_geq(k, 0);
        jobs[k].vtime = policy_charge(jobs[k].vtime, CHUNK, 1.0);
        tv[jobs[k].tenant] = policy_charge(tv[jobs[k].tenant], CHUNK, 1.0);
        g[k] += CHUNK;
        since_b = k == NA ? 0 : since_b + 1;
        worst_b = since_b > worst_b ? since_b : worst_b;
    }
    long a = 0;
    for (int i = 0; i < NA; i++) a += g[i];
    double share_b = (double)g[NA] / (double)(a + g[NA]);
    cr_assert_geq(share_b, 0.45, "tenant B's one job got %.1f %% of the groups beside 8 jobs of A", 100 * share_b);
    cr_assert_leq(share_b, 0.55, "tenant B got %.1f %%", 100 * share_b);
    cr_assert_leq(worst_b, 1, "tenant B waited %d tasks in a row", worst_b);
    for (int i = 0; i < NA; i++)
        cr_assert(labs(g[i] - a / NA) <= CHUNK, "A's job %d got %ld groups, A's mean %ld", i, g[i], a / NA);
    // a tenant that joins late starts at the smallest running tenant's time, not at 0
    for (int i = 0; i < N; i++) jobs[i].tenant_vtime = tv[jobs[i].tenant];
    cr_assert_float_eq(policy_tenant_start_vtime(jobs, N, 0.0), fmin(tv[0], tv[1]), 1e-9);
    cr_assert_float_eq(policy_tenant_start_vtime(jobs, N, 1e9), 1e9, 0);   // nor does it go back
    cr_assert_float_eq(policy_tenant_start_vtime(jobs, 0, 5.0), 5.0, 0);
}

// A tenant at its quota of in-flight groups gets nothing while its time is the smallest: the
// other tenant's job is issued, and the full tenant again as soon as it is below its quota.
Test(policy, a_tenant_at_its_group_quota_is_passed_over) {
    policy_job_t jobs[2] = {open_job(), open_job()};
    jobs[1].tenant = 1;
    jobs[0].tenant_vtime = 0, jobs[1].tenant_vtime = 100;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 2), 0);
    jobs[0].tenant_full = true;
    cr_assert_eq(policy_room(POLICY_ASYNC, &jobs[0]), 0);
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 2), 1);
    jobs[1].tenant_full = true;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 2), -1);
    jobs[0].tenant_full = false;
    cr_assert_eq(policy_next_job(POLICY_ASYNC, jobs, 2), 0);
}

Test(policy, a_job_that_joins_starts_at_the_smallest_running_vtime) {
    enum { N = 5, CHUNK = 8 };
    const double w[N] = {1, 1, 1, 1, 1};
    policy_job_t jobs[N];
    long g[N] = {0};
    for (int i = 0; i < N; i++) jobs[i] = open_job();
    // job 3 is queued (not running) with a virtual time of 0: it is no reference for a joiner
    jobs[3].running = false;
    // the three running jobs have been issued for a while; job 4 is not yet in the table
    simulate_share(jobs, w, 3, 999, CHUNK, g);
    double vmin = fmin(jobs[0].vtime, fmin(jobs[1].vtime, jobs[2].vtime));
    cr_assert_float_eq(policy_start_vtime(jobs, 4, 0), vmin, 1e-12);
    cr_assert_float_eq(policy_start_vtime(jobs, 0, 0), 0.0, 0);
    cr_assert_float_eq(policy_start_vtime(jobs, 4, 7), 0.0, 0);   // a tenant with no running job
    jobs[4].vtime = policy_start_vtime(jobs, 4, 0);
    // from now on the joiner takes its share, no catch-up burst and no wait: 4 running jobs, so
    // a quarter of the next 40 tasks, give or take one
    int mine = 0, first = -1;
    for (int r = 0; r < 40; r++) {
        policy_job_t run[4] = {jobs[0], jobs[1], jobs[2], jobs[4]};
        int k = policy_next_job(POLICY_ASYNC, run, 4);
        int idx = k == 3 ? 4 : k;
        jobs[idx].vtime = policy_charge(jobs[idx].vtime, CHUNK, 1.0);
        if (idx == 4) {
            mine++;
            if (first < 0) first = r;
        }
    }
    cr_assert(first >= 0 && first < 4, "the joiner waited %d tasks for its first", first);
    cr_assert(mine >= 9 && mine <= 11, "the joiner got %d of 40 tasks", mine);
}

// Issues tasks to one job until the policy gives it no more room; returns the groups in flight.
static int fill(sched_policy_t p, policy_job_t *j, int chunk) {
    for (int guard = 0; guard < 1000; guard++) {
        if (policy_next_job(p, j, 1) < 0) return j->in_flight;
        uint32_t n = policy_task_size(policy_room(p, j), chunk);
        cr_assert_gt(n, 0u);
        j->in_flight += (int)n;
        cr_assert_leq(j->in_flight, policy_cap(p, j->prompts, j->staleness), "in flight %d over the cap", j->in_flight);
        if (policy_sync_full(p, j->in_flight, j->prompts)) j->sync_waiting = true;
    }
    cr_assert_fail("the policy never stopped issuing");
    return -1;
}

Test(policy, async_in_flight_cap_is_staleness_plus_one_batches) {
    for (int eta = 0; eta <= 3; eta++) {
        policy_job_t j = {.running = true, .max_steps = 10, .prompts = 16, .staleness = eta};
        cr_assert_eq(policy_cap(POLICY_ASYNC, 16, eta), (eta + 1) * 16);
        // chunk 5 does not divide the cap: the last task is cut to fit exactly
        cr_assert_eq(fill(POLICY_ASYNC, &j, 5), (eta + 1) * 16, "staleness %d", eta);
        cr_assert_eq(policy_room(POLICY_ASYNC, &j), 0);
        // the trainer consumes a batch: exactly a batch of room again
        j.in_flight -= 16;
        cr_assert_eq(policy_room(POLICY_ASYNC, &j), 16);
        cr_assert_eq(fill(POLICY_ASYNC, &j, 5), (eta + 1) * 16);
    }
}

Test(policy, sync_issues_one_batch_then_waits_for_the_step) {
    policy_job_t j = {.running = true, .max_steps = 10, .prompts = 16, .staleness = 3};
    cr_assert_eq(policy_cap(POLICY_SYNC, 16, 3), 16);
    cr_assert_not(policy_sync_full(POLICY_SYNC, 15, 16));
    cr_assert(policy_sync_full(POLICY_SYNC, 16, 16));
    cr_assert_not(policy_sync_full(POLICY_ASYNC, 16, 16));
    cr_assert_eq(fill(POLICY_SYNC, &j, 5), 16);
    cr_assert(j.sync_waiting);
    // groups verified and even consumed: still no work until the step is reported
    j.in_flight = 0;
    cr_assert_eq(policy_room(POLICY_SYNC, &j), 0);
    cr_assert_eq(policy_next_job(POLICY_SYNC, &j, 1), -1);
    // the step report clears the wait (sched_report)
    j.sync_waiting = false;
    cr_assert_eq(policy_room(POLICY_SYNC, &j), 16);
}

Test(policy, admission_async_all_sync_one_at_a_time) {
    cr_assert(policy_admit(POLICY_ASYNC, 0, 0));
    cr_assert(policy_admit(POLICY_ASYNC, 7, 0));
    cr_assert(policy_admit(POLICY_SYNC, 0, 0));
    cr_assert_not(policy_admit(POLICY_SYNC, 1, 0));
    // a bound on running jobs (the trainer's capacity): async admits up to it, sync stays one
    cr_assert(policy_admit(POLICY_ASYNC, 47, 48));
    cr_assert_not(policy_admit(POLICY_ASYNC, 48, 48));
    cr_assert_not(policy_admit(POLICY_SYNC, 1, 48));
}

Test(policy, staleness_bound) {
    cr_assert_not(policy_stale(5, 5, 0));
    cr_assert(policy_stale(6, 5, 0));
    cr_assert_not(policy_stale(6, 5, 1));
    cr_assert(policy_stale(7, 5, 1));
    // a version the trainer never published: refused, whatever the distance (no wrap-around)
    cr_assert(policy_stale(3, 5, 0));
    cr_assert(policy_stale(5, UINT32_MAX, 1));
    cr_assert(policy_stale(0, 1, 4));
    cr_assert_not(policy_stale(UINT32_MAX, UINT32_MAX - 2, 2));
    cr_assert(policy_stale(UINT32_MAX, 0, 4));
}

// The cap is what keeps groups trainable: a job issued under the async cap, whose groups come back
// from the rollouts in the order they were issued (random amounts per round), and a trainer that
// steps on the oldest B groups: no group it trains is stale.
Test(policy, the_async_cap_keeps_in_order_groups_within_staleness) {
    for (int eta = 0; eta <= 2; eta++) {
        enum { B = 6, Q = 4096 };
        uint32_t fifo[Q];   // versions of the groups in flight, oldest first (rollout, then trainer)
        int head = 0, tail = 0, verified = 0;   // [head, head + verified) have reached the trainer
        uint32_t version = 0;
        uint64_t rng = 42 + (uint64_t)eta;
        int steps = 0;
        policy_job_t j = {.running = true, .max_steps = 1000000, .prompts = B, .staleness = eta};
        for (int r = 0; r < 3000 && tail < Q - 64; r++) {
            j.in_flight = tail - head;
            while (policy_next_job(POLICY_ASYNC, &j, 1) == 0) {
                uint32_t n = policy_task_size(policy_room(POLICY_ASYNC, &j), 4);
                for (uint32_t k = 0; k < n; k++) fifo[tail++] = version;
                j.in_flight += (int)n;
            }
            int done = (int)(lcg(&rng) % 8);
            verified += done;
            if (verified > tail - head) verified = tail - head;
            while (verified >= B) {
                for (int k = 0; k < B; k++)
                    cr_assert_not(policy_stale(version, fifo[head + k], eta),
                                  "staleness %d: a group of version %u trains version %u", eta, fifo[head + k], version);
                head += B, verified -= B, version++, steps++;
            }
        }
        cr_assert_gt(steps, 100, "staleness %d: only %d steps simulated", eta, steps);
    }
}

// --- leases -----------------------------------------------------------------------------------

static const uint64_t IDX[4] = {10, 11, 12, 13};

Test(policy, a_lease_runs_out_at_its_deadline_not_before) {
    cr_assert_not(policy_lease_expired(100.0, 99.999));
    cr_assert(policy_lease_expired(100.0, 100.0));
    cr_assert(policy_lease_expired(100.0, 250.0));
    cr_assert(policy_lease_expired(0, 1e-3));   // a `task failed` report: deadline 0
    policy_leases_t t = {0};
    policy_lease_add(&t, 1, "j-1", PROTO_KIND_TRAIN, IDX, 4, 3, 0, 100.0);
    cr_assert_eq(policy_lease_next_expired(&t, 0, 99.999), -1);
    cr_assert_eq(policy_lease_next_expired(&t, 0, 100.0), 0);
    policy_leases_free(&t);
    cr_assert_eq(t.n, 0);
}

// The scheduler's scan (sched_tick): every lease past its deadline at `now` is taken and issued
// again exactly once under a new id with a new deadline; the others stay as they are.
Test(policy, every_expired_lease_is_reissued_once_and_no_other) {
    policy_leases_t t = {0};
    const double deadline[8] = {5, 12, 10, 9.99, 10.01, 0, 30, 10};
    for (int i = 0; i < 8; i++) policy_lease_add(&t, (uint64_t)i, "j-1", PROTO_KIND_TRAIN, IDX, 4, 1, 0, deadline[i]);
    const double now = 10.0, lease_s = 3.0;
    uint64_t next_id = 100;
    int reissued[8] = {0};
    for (int i = 0; (i = policy_lease_next_expired(&t, i, now)) >= 0;) {
        policy_lease_t k;
        policy_lease_take(&t, i, &k);
        uint32_t ver = 0;
        cr_assert(policy_reissue(&k, 0, 7, 0, &ver));
        cr_assert_eq(ver, 7u, "a training task goes out again on the current version");
        cr_assert_lt(k.id, 8u, "a lease issued again in this scan came round again");
        reissued[k.id]++;
        policy_lease_add(&t, next_id++, k.job, k.kind, k.index, k.n, ver, k.round, now + lease_s);
        free(k.index);
    }
    for (int i = 0; i < 8; i++)
        cr_assert_eq(reissued[i], deadline[i] <= now ? 1 : 0, "lease %d (deadline %.2f): issued again %d times", i,
                     deadline[i], reissued[i]);
    cr_assert_eq(t.n, 8);
    for (int i = 0; i < 8; i++) {
        const policy_lease_t *k = &t.v[i];
        if (k->id >= 100) cr_assert_float_eq(k->deadline, now + lease_s, 0);
        else cr_assert_gt(k->deadline, now);
        cr_assert_eq(k->n, 4u);
        cr_assert_eq(memcmp(k->index, IDX, sizeof IDX), 0);
    }
    cr_assert_eq(policy_lease_next_expired(&t, 0, now), -1);
    policy_leases_free(&t);
}

Test(policy, eval_leases_go_out_again_only_in_their_round_on_its_version) {
    policy_lease_t k = {.kind = PROTO_KIND_EVAL, .round = 4, .version = 2};
    uint32_t ver = 99;
    cr_assert(policy_reissue(&k, 4, 9, 2, &ver));
    cr_assert_eq(ver, 2u);
    ver = 99;
    cr_assert_not(policy_reissue(&k, 5, 9, 6, &ver));
    cr_assert_not(policy_reissue(&k, 0, 9, 6, &ver));
    cr_assert_eq(ver, 99u);
    k.kind = PROTO_KIND_TRAIN;
    cr_assert(policy_reissue(&k, 5, 9, 6, &ver));
    cr_assert_eq(ver, 9u);
}

Test(policy, trainer_groups_counted_lost_after_train_lease) {
    cr_assert(policy_trainer_lost(160.5, 100, 60, 16, 16));
    cr_assert_not(policy_trainer_lost(160.0, 100, 60, 16, 16), "lost only after more than train_lease_s");
    cr_assert_not(policy_trainer_lost(500, 100, 60, 15, 16), "less than a batch waits for more groups, not a step");
    cr_assert(policy_trainer_lost(500, 100, 60, 40, 16));
}

// --- reports ----------------------------------------------------------------------------------

// Groups moved to the trainer by a sequence of episodes reports, as sched_report applies them.
static int apply(policy_leases_t *t, const uint64_t *ids, int n, int eval_round, int *eval_reports) {
    int at_trainer = 0;
    for (int i = 0; i < n; i++) {
        policy_lease_t k;
        policy_result_t what = policy_result(t, ids[i], eval_round, &k);
        if (what == POLICY_RESULT_TRAIN) at_trainer += (int)k.n;
        if (what == POLICY_RESULT_EVAL) ++*eval_reports;
        if (what == POLICY_RESULT_IGNORE && !k.index) cr_assert_eq(k.n, 0u);
        free(k.index);
    }
    return at_trainer;
}

// Sync policy, B = 16 groups in two tasks of 8: the trainer steps on all 16 and reports before the
// verifier's report of the second task. The scheduler then issues the next step's first task while
// that second task still holds its lease: counted in flight, it made the step look issued in full
// (16), the job waited for a step the trainer could never make from 8 groups, and the run hung
// (bench/run.sh --quick, 32 jobs, step 44 of the first). Groups consumed ahead are not in flight.
Test(policy, sync_groups_consumed_before_their_report_are_not_in_flight) {
    int in_rollout = 0, at = 0, ahead = 0;
    in_rollout += 8, in_rollout += 8;   // step 1: tasks A and B
    cr_assert(policy_sync_full(POLICY_SYNC, policy_in_flight(in_rollout, at, ahead), 16));
    in_rollout -= 8, policy_trainer_verified(&at, &ahead, 8);   // A verified
    policy_trainer_released(&at, &ahead, 16, 32);                // the step consumed A and B
    cr_assert(at == 0 && ahead == 8);
    cr_assert_eq(policy_in_flight(in_rollout, at, ahead), 0, "B was consumed: nothing is in flight");
    in_rollout += 8;   // step 2: task C
    cr_assert_not(policy_sync_full(POLICY_SYNC, policy_in_flight(in_rollout, at, ahead), 16),
                  "8 groups of step 2 issued: the job must not wait yet");
    in_rollout += 8;   // task D
    cr_assert(policy_sync_full(POLICY_SYNC, policy_in_flight(in_rollout, at, ahead), 16));
    in_rollout -= 8, policy_trainer_verified(&at, &ahead, 8);   // B's late report adds nothing
    cr_assert(at == 0 && ahead == 0);
    cr_assert_eq(policy_in_flight(in_rollout, at, ahead), 16);
    cr_assert_eq(policy_in_flight(0, 0, 3), 0, "never negative");
}

// The verifier's episodes and the trainer's step travel on different links: a step may release
// groups before their episodes report is applied. Without the ahead count the late report put
// them back at the trainer, and a job at staleness 0 waited for the trainer lease (60 s).
Test(policy, a_step_before_its_groups_reports_counts_them_once) {
    int at = 0, ahead = 0;
    // 8 groups: 7 reported verified, then the step that consumed all 8, then the 8th's report
    for (int g = 0; g < 7; g++) policy_trainer_verified(&at, &ahead, 1);
    policy_trainer_released(&at, &ahead, 8, 8);
    cr_assert_eq(at, 0);
    cr_assert_eq(ahead, 1);
    policy_trainer_verified(&at, &ahead, 1);
    cr_assert_eq(at, 0, "the late report of a consumed group adds nothing");
    cr_assert_eq(ahead, 0);
    // the next step's groups count as usual
    policy_trainer_verified(&at, &ahead, 3);
    cr_assert_eq(at, 3);
    // in order: nothing ahead
    policy_trainer_released(&at, &ahead, 3, 8);
    cr_assert(at == 0 && ahead == 0);
    // a step whose reports never come cannot hold more than the job's in-flight budget ahead
    policy_trainer_released(&at, &ahead, 50, 16);
    cr_assert_eq(ahead, 16);
    cr_assert_eq(at, 0);
    // a report of more groups than are ahead: the rest are at the trainer
    policy_trainer_verified(&at, &ahead, 20);
    cr_assert(at == 4 && ahead == 0);
}

Test(policy, a_result_is_applied_once) {
    policy_leases_t t = {0};
    policy_lease_add(&t, 7, "j-1", PROTO_KIND_TRAIN, IDX, 4, 1, 0, 60);
    policy_lease_add(&t, 8, "j-1", PROTO_KIND_TRAIN, IDX, 3, 1, 0, 60);
    int evals = 0;
    // 7 reported twice (a duplicate), 8 once, 9 never leased
    const uint64_t ids[] = {7, 7, 8, 9, 8};
    cr_assert_eq(apply(&t, ids, 5, 0, &evals), 4 + 3);
    cr_assert_eq(t.n, 0);
    cr_assert_eq(evals, 0);
    policy_leases_free(&t);
}

Test(policy, the_late_result_of_a_reissued_task_is_not_counted_again) {
    policy_leases_t t = {0};
    policy_lease_add(&t, 7, "j-1", PROTO_KIND_TRAIN, IDX, 4, 1, 0, 60);
    // the lease runs out and the prompts go out again as task 8
    int i = policy_lease_next_expired(&t, 0, 60);
    cr_assert_eq(i, 0);
    policy_lease_t k;
    policy_lease_take(&t, i, &k);
    policy_lease_add(&t, 8, k.job, k.kind, k.index, k.n, 2, 0, 120);
    free(k.index);
    int evals = 0;
    // the original's result arrives late, then the re-issue's, then the original's once more
    const uint64_t ids[] = {7, 8, 7, 8};
    cr_assert_eq(apply(&t, ids, 4, 0, &evals), 4);
    policy_leases_free(&t);
}

Test(policy, eval_results_count_once_and_only_for_the_current_round) {
    policy_leases_t t = {0};
    policy_lease_add(&t, 1, "j-1", PROTO_KIND_EVAL, IDX, 4, 0, 3, 60);
    policy_lease_add(&t, 2, "j-1", PROTO_KIND_EVAL, IDX, 4, 0, 2, 60);   // a round that is over
    policy_lease_add(&t, 3, "j-1", PROTO_KIND_EVAL, IDX, 4, 0, 3, 60);
    int evals = 0;
    const uint64_t ids[] = {1, 2, 1, 3, 3, 2};
    cr_assert_eq(apply(&t, ids, 6, 3, &evals), 0, "eval groups never go to the trainer");
    cr_assert_eq(evals, 2);
    cr_assert_eq(t.n, 0, "the old round's lease is released as well");
    policy_leases_free(&t);
}

Test(policy, leases_are_found_by_task_and_job_and_dropped_by_job) {
    policy_leases_t t = {0};
    uint64_t idx[4] = {1, 2, 3, 4};
    for (int i = 0; i < 300; i++)   // past the first growth of the table
        policy_lease_add(&t, (uint64_t)i, i % 3 ? "j-a" : "j-b", PROTO_KIND_TRAIN, idx, 4, 0, 0, 10 + i);
    idx[0] = 99;   // the lease keeps its own copy
    int p = policy_lease_find(&t, 42, NULL);
    cr_assert_geq(p, 0);
    cr_assert_eq(t.v[p].id, 42u);
    cr_assert_eq(t.v[p].index[0], 1u);
    cr_assert_eq(policy_lease_find(&t, 42, "j-b"), p);
    cr_assert_eq(policy_lease_find(&t, 42, "j-a"), -1);
    cr_assert_eq(policy_lease_find(&t, 300, NULL), -1);
    policy_leases_drop_job(&t, "j-b");
    cr_assert_eq(t.n, 200);
    for (int i = 0; i < t.n; i++) cr_assert_str_eq(t.v[i].job, "j-a");
    policy_leases_drop_job(&t, "j-a");
    cr_assert_eq(t.n, 0);
    policy_leases_free(&t);
}

Test(policy, step_reports_only_move_forward) {
    uint32_t step = 0, version = 0;
    policy_step_report(&step, &version, 3, 3);
    cr_assert(step == 3 && version == 3);
    policy_step_report(&step, &version, 2, 2);   // a late report of an earlier step
    cr_assert(step == 3 && version == 3);
    policy_step_report(&step, &version, 3, 3);   // the same report again
    cr_assert(step == 3 && version == 3);
    policy_step_report(&step, &version, 5, 5);
    cr_assert(step == 5 && version == 5);
}

// --- adapter slots ------------------------------------------------------------------------------

static policy_slot_t slot_of(const char *job, uint32_t version, int refs, double last_used) {
    policy_slot_t s = {.version = version, .refs = refs, .loaded = true, .last_used = last_used};
    snprintf(s.job, sizeof s.job, "%s", job);
    return s;
}

// A held adapter is found where it is; otherwise an empty slot is taken before any loaded one,
// then the least recently used slot that no task uses; a slot in use is never evicted.
Test(policy, adapter_slots_lru) {
    bool hit;
    policy_slot_t s[4] = {slot_of("j-1", 3, 0, 10), slot_of("j-2", 1, 2, 1), slot_of("j-3", 7, 0, 5), {.loaded = false}};
    cr_assert_eq(policy_adapter_slot(s, 4, "j-3", 7, &hit), 2);
    cr_assert(hit);
    cr_assert_eq(policy_adapter_slot(s, 4, "j-3", 8, &hit), 3, "another version: the empty slot");
    cr_assert(!hit);
    s[3] = slot_of("j-4", 1, 1, 20);
    cr_assert_eq(policy_adapter_slot(s, 4, "j-5", 1, &hit), 2, "the oldest unused slot (j-2's is older but in use)");
    cr_assert(!hit);
    s[2].refs = 1;
    cr_assert_eq(policy_adapter_slot(s, 4, "j-5", 1, &hit), 0);
    s[0].refs = 1;
    cr_assert_eq(policy_adapter_slot(s, 4, "j-5", 1, &hit), -1, "every slot in use: the task waits");
    cr_assert_eq(policy_adapter_slot(s, 4, "j-1", 3, &hit), 0, "a held adapter is shared even while in use");
    cr_assert(hit);
    // over many uses, the evicted slot is always the least recently used unused one
    policy_slot_t t[8];
    for (int i = 0; i < 8; i++) t[i] = slot_of("x", (uint32_t)i, 0, i);
    for (int round = 0; round < 100; round++) {
        int want = 0;
        for (int i = 1; i < 8; i++)
            if (t[i].last_used < t[want].last_used) want = i;
        char job[16];
        snprintf(job, sizeof job, "n-%d", round);
        int got = policy_adapter_slot(t, 8, job, 0, &hit);
        cr_assert_eq(got, want, "round %d", round);
        t[got] = slot_of(job, 0, 0, 100 + round);
    }
}

// --- the trainer's training passes -----------------------------------------------------------

// A trainer's table of jobs in simulated calls: job i of tenant tenant[i], weight w[i], rows per
// step rows[i] (100 when rows is NULL).
typedef struct {
    policy_tjob_t j[16];
    policy_ttenant_t t[4];
    int n, nt;
    long steps[16];
} tsim_t;

static void tsim_init(tsim_t *s, int n, const int *tenant, const double *w, const double *tw, int nt) {
    memset(s, 0, sizeof *s);
    s->n = n, s->nt = nt;
    for (int t = 0; t < nt; t++) s->t[t] = (policy_ttenant_t){.weight = tw ? tw[t] : 1.0};
    for (int i = 0; i < n; i++)
        s->j[i] = (policy_tjob_t){.present = true, .ready = true, .active = true, .tenant = tenant[i],
                                  .weight = w ? w[i] : 1.0, .rows = 100};
}

// One call: picks, checks the pass against the budget and max, charges; returns the jobs taken
// (their indices in got, in the order taken) and counts their steps.
static int tsim_call(tsim_t *s, double budget, int max, int *got) {
    int np = policy_train_pick(s->j, s->n, s->t, s->nt, budget, 1, max, got);
    double rows = 0;
    bool seen[16] = {false};
    for (int p = 0; p < np; p++) {
        cr_assert(got[p] >= 0 && got[p] < s->n && s->j[got[p]].present && s->j[got[p]].ready, "job %d taken", got[p]);
        cr_assert(!seen[got[p]], "job %d taken twice in one pass", got[p]);
        seen[got[p]] = true;
        rows += s->j[got[p]].rows;
        s->steps[got[p]]++;
    }
    cr_assert_leq(np, max);
    if (np > 1) cr_assert_leq(rows, budget, "a pass of %d jobs holds %.0f rows, over the budget %.0f", np, rows, budget);
    policy_train_charge(s->j, s->n, s->t, s->nt, got, np);
    return np;
}

static long tsim_tenant_steps(const tsim_t *s, int t) {
    long n = 0;
    for (int i = 0; i < s->n; i++) n += s->j[i].tenant == t ? s->steps[i] : 0;
    return n;
}

// Tenant B's one job beside eight of A, all always ready, the trainer the bottleneck: every pass
// trains one of A's jobs and B's, so B gets half the steps (not 1/9) and A's jobs share A's half
// evenly. Either tenant first in the table.
Test(policy, train_passes_tenants_first) {
    for (int order = 0; order < 2; order++) {
        // order 1: B's job first in the table and B tenant 0
        int tenant[9], a = order ? 1 : 0, b = order ? 0 : 1;
        for (int i = 0; i < 9; i++) tenant[i] = i == (order ? 0 : 8) ? b : a;
        tsim_t s;
        tsim_init(&s, 9, tenant, NULL, NULL, 2);
        int got[16];
        for (int c = 0; c < 800; c++) {
            int np = tsim_call(&s, 1e9, 64, got);
            cr_assert_eq(np, 2, "order %d call %d: %d jobs in the pass", order, c, np);
            cr_assert_neq(s.j[got[0]].tenant, s.j[got[1]].tenant, "call %d: both jobs of one tenant", c);
        }
        long sa = tsim_tenant_steps(&s, a), sb = tsim_tenant_steps(&s, b);
        double share = (double)sb / (double)(sa + sb);
        cr_assert_geq(share, 0.45, "B's one job got %.1f %% of the steps beside 8 jobs of A", 100 * share);
        cr_assert_leq(share, 0.55, "B got %.1f %%", 100 * share);
        for (int i = 0; i < 9; i++)
            if (tenant[i] == a) cr_assert(labs(s.steps[i] - sa / 8) <= 1, "A's job %d: %ld steps of %ld", i, s.steps[i], sa);
    }
}

// A choice of several passes (a trainer with lanes): jobs of 100 rows with a budget of 250 fill
// two per pass, so 2 passes take 4 jobs and 3 take 6; a job of 300 rows fills a pass alone; and
// tenant B's one job beside eight of A still gets half the steps however many passes a choice may
// fill (the fair order stops where one pass stopped).
Test(policy, train_passes_several_per_choice) {
    int tenant[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0}, got[16];
    tsim_t s;
    tsim_init(&s, 8, tenant, NULL, NULL, 1);
    for (int passes = 1; passes <= 4; passes++) {
        int np = policy_train_pick(s.j, s.n, s.t, s.nt, 250, passes, 64, got);
        cr_assert_eq(np, passes * 2 < 8 ? passes * 2 : 8, "%d passes: %d jobs", passes, np);
    }
    s.j[0].rows = 300, s.j[1].rows = 300;
    cr_assert_eq(policy_train_pick(s.j, s.n, s.t, s.nt, 250, 3, 64, got), 4, "two jobs over the budget, one pass each");
    cr_assert_eq(policy_train_pick(s.j, s.n, s.t, s.nt, 250, 1, 64, got), 1, "one pass: the first job alone");
    for (int i = 0; i < 9; i++) tenant[i] = i == 8 ? 1 : 0;
    tsim_init(&s, 9, tenant, NULL, NULL, 2);
    long sb = 0, all = 0;
    for (int c = 0; c < 400; c++) {
        int np = policy_train_pick(s.j, s.n, s.t, s.nt, 1e9, 4, 64, got);
        cr_assert_eq(np, 2, "call %d: %d jobs", c, np);
        for (int p = 0; p < np; p++) sb += s.j[got[p]].tenant == 1, all++;
        policy_train_charge(s.j, s.n, s.t, s.nt, got, np);
    }
    cr_assert_eq(2 * sb, all, "B's one job: %ld of %ld steps", sb, all);
}

// Tenant weights: A at 2 beside B at 1 takes two steps per B's one; B at 2 with its one job steps
// alone every other pass (two thirds); four jobs each at 2:1 with a budget of three jobs a pass,
// 2:1 too.
Test(policy, train_passes_tenant_weights) {
    int tenant[9];
    for (int i = 0; i < 9; i++) tenant[i] = i < 8 ? 0 : 1;
    const double heavy_a[2] = {2, 1}, heavy_b[2] = {1, 2};
    const double *tw[2] = {heavy_a, heavy_b};
    const double want[2] = {2.0, 0.5};   // A's steps / B's
    for (int k = 0; k < 2; k++) {
        tsim_t s;
        tsim_init(&s, 9, tenant, NULL, tw[k], 2);
        int got[16];
        for (int c = 0; c < 900; c++) tsim_call(&s, 1e9, 64, got);
        double ratio = (double)tsim_tenant_steps(&s, 0) / (double)tsim_tenant_steps(&s, 1);
        cr_assert(fabs(ratio - want[k]) <= 0.05 * want[k], "weights %g:%g: A/B steps %.3f, want %.2f", tw[k][0], tw[k][1],
                  ratio, want[k]);
    }
    int t8[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    tsim_t s;
    tsim_init(&s, 8, t8, NULL, heavy_a, 2);
    int got[16];
    for (int c = 0; c < 900; c++) cr_assert_eq(tsim_call(&s, 300, 64, got), 3);
    double ratio = (double)tsim_tenant_steps(&s, 0) / (double)tsim_tenant_steps(&s, 1);
    cr_assert(fabs(ratio - 2.0) <= 0.05, "4 jobs each, weights 2:1, 3 jobs a pass: A/B steps %.3f", ratio);
}

// One tenant: every ready job steps in every call (as before tenants were counted), whatever is
// ready; with a budget, at least one job and never over it, each job in turn.
Test(policy, train_passes_one_tenant_steps_every_ready_job) {
    int tenant[6] = {0, 0, 0, 0, 0, 0};
    tsim_t s;
    tsim_init(&s, 6, tenant, NULL, NULL, 1);
    uint64_t seed = 7;
    int got[16];
    for (int c = 0; c < 500; c++) {
        int want = 0;
        for (int i = 0; i < 6; i++) {
            s.j[i].ready = lcg(&seed) % 3 != 0;
            s.j[i].active = true;
            want += s.j[i].ready;
        }
        int np = tsim_call(&s, 1e9, 64, got);
        cr_assert_eq(np, want, "call %d: %d of %d ready jobs stepped", c, np, want);
    }
    // a budget of 2.5 jobs: two a pass, round robin
    tsim_init(&s, 6, tenant, NULL, NULL, 1);
    for (int c = 0; c < 300; c++) cr_assert_eq(tsim_call(&s, 250, 64, got), 2);
    for (int i = 0; i < 6; i++) cr_assert_eq(s.steps[i], 100, "job %d: %ld steps", i, s.steps[i]);
    // a job larger than the budget steps alone; max caps the pass
    s.j[0].rows = 1000;
    s.j[0].vtime = -1;
    cr_assert_eq(tsim_call(&s, 250, 64, got), 1);
    cr_assert_eq(got[0], 0);
    cr_assert_eq(tsim_call(&s, 1e9, 3, got), 3);
    cr_assert_eq(policy_train_pick(s.j, 6, s.t, 1, 1e9, 1, 0, got), 0);
    for (int i = 0; i < 6; i++) s.j[i].ready = false;
    cr_assert_eq(policy_train_pick(s.j, 6, s.t, 1, 1e9, 1, 64, got), 0);
}

// Job weights within a tenant: A's jobs at 1, 2 and 3 beside B's one job (so A steps one job a
// pass) step 1:2:3.
Test(policy, train_passes_job_weights_within_a_tenant) {
    int tenant[4] = {0, 0, 0, 1};
    const double w[4] = {1, 2, 3, 1};
    tsim_t s;
    tsim_init(&s, 4, tenant, w, NULL, 2);
    int got[16];
    for (int c = 0; c < 1200; c++) cr_assert_eq(tsim_call(&s, 1e9, 64, got), 2);
    for (int i = 0; i < 3; i++)
        cr_assert(labs(s.steps[i] - 200 * (i + 1)) <= 2, "A's job of weight %g: %ld steps of 1200", w[i], s.steps[i]);
    cr_assert_eq(s.steps[3], 1200);
}

// No banked credit: B, idle (nothing ready or arriving) while A trained, does not take every pass
// when it comes back, and a tenant that joins late starts at the smallest time present. An active
// tenant whose job waits for its next batch holds A to one job a pass; an idle one does not.
Test(policy, train_passes_idle_tenants_bank_no_credit) {
    int tenant[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    tsim_t s;
    tsim_init(&s, 8, tenant, NULL, NULL, 2);
    int got[16];
    for (int i = 4; i < 8; i++) s.j[i].ready = s.j[i].active = false;
    for (int c = 0; c < 500; c++) cr_assert_eq(tsim_call(&s, 200, 64, got), 2, "A alone: two jobs a pass (budget)");
    for (int i = 4; i < 8; i++) s.j[i].ready = s.j[i].active = true;
    long b0 = tsim_tenant_steps(&s, 1);
    for (int c = 0; c < 20; c++) tsim_call(&s, 200, 64, got);
    long b = tsim_tenant_steps(&s, 1) - b0;
    cr_assert(b >= 19 && b <= 21, "B, back after 500 passes, got %ld of the next 40 steps", b);
    // a B whose jobs are not ready does not hold A back, whether its data is on its way or not
    // (work-conserving: the pass takes every ready job of A within the budget)
    for (int i = 4; i < 8; i++) s.j[i].ready = false;
    cr_assert_eq(tsim_call(&s, 1e9, 64, got), 4);
    for (int i = 4; i < 8; i++) s.j[i].active = false;
    cr_assert_eq(tsim_call(&s, 1e9, 64, got), 4);
    // a tenant and a job that join start at the smallest time present
    double tmin = fmin(s.t[0].vtime, s.t[1].vtime);
    cr_assert_float_eq(policy_train_tenant_start(s.j, 8, s.t, 2), tmin, 1e-9);
    cr_assert_float_eq(policy_train_tenant_start(s.j, 0, s.t, 2), 0.0, 0);
    double jmin = s.j[4].vtime;
    for (int i = 5; i < 8; i++) jmin = fmin(jmin, s.j[i].vtime);
    cr_assert_float_eq(policy_train_job_start(s.j, 8, 1), jmin, 1e-9);
    cr_assert_float_eq(policy_train_job_start(s.j, 8, 2), 0.0, 0);
    // C joins with two jobs beside A and B (all ready): a third of the steps from its first pass on
    tsim_t u = s;
    u.nt = 3, u.n = 10;
    u.t[2] = (policy_ttenant_t){.weight = 1, .vtime = policy_train_tenant_start(s.j, 8, s.t, 2)};
    for (int i = 0; i < 8; i++) u.j[i].ready = u.j[i].active = true;
    for (int i = 8; i < 10; i++)
        u.j[i] = (policy_tjob_t){.present = true, .ready = true, .active = true, .tenant = 2, .weight = 1, .rows = 100,
                                 .vtime = policy_train_job_start(u.j, 8, 2)};
    memset(u.steps, 0, sizeof u.steps);
    for (int c = 0; c < 30; c++) tsim_call(&u, 300, 64, got);
    for (int t = 0; t < 3; t++) {
        long n = tsim_tenant_steps(&u, t);
        cr_assert(n >= 28 && n <= 32, "tenant %d got %ld of 90 steps after C joined", t, n);
    }
}

// policy.h - the scheduler's decisions as functions of their inputs, the clock passed in as
// `now` (seconds, util_now's clock): which job gets the next rollout task, how many groups a job
// may have in flight, when a lease has run out and what is issued again, which reports are
// applied. services/scheduler/sched.c holds the state (Redis, sockets, the clock) and asks these;
// the trainer's staleness filter is policy_stale and its choice of the jobs of a training pass
// policy_train_pick (below, "Training passes").
//
// Fair share. Every job has a virtual time: groups issued to it divided by its weight (jobspec
// `weight`, (0, 100], default 1), at two levels: tenants first, then the jobs of a tenant. The
// next training task goes to the tenant with the smallest virtual time (its groups issued / the
// tenant's weight, 1) among those with an eligible job, and of its eligible jobs to the one with
// the smallest virtual time; on a tie, to the job earlier in the table (submission order, or
// restore order after a scheduler restart). A tenant's share does not grow with its number of
// jobs: one job of B beside eight of A gets half the groups. A job's virtual time grows when a task is issued
// (policy_charge), not when it completes, and a lease issued again is not charged twice. A job
// that joins starts at the smallest virtual time of the running jobs (0 when none): it neither
// catches up on the time it was not running nor waits out the others' history. Eval tasks are
// outside fair share: the scheduler sends eval rounds before any training task.
// Between two tasks of job i, every other job j is issued at most floor(w_j / w_i) + 1 tasks
// while all jobs stay eligible and tasks are the same size (tests/unit/test_policy.c checks this
// bound over many rounds, and the groups of each job in proportion to its weight).
//
// In-flight cap (the staleness bound). A job's groups in flight are those in rollout tasks
// holding a lease plus those verified and waiting at the trainer. Under the async policy a job
// may have at most (staleness + 1) * B of them (B = prompts per step), so a group sampled with
// version g reaches the trainer while the job is at most at version g + staleness, the bound the
// trainer enforces (policy_stale). Under the sync policy the cap is B, and once a step's worth is
// in flight the job waits (sync_waiting) until the trainer reports the step or its groups are
// counted lost. A task holds min(chunk, room) prompts.
//
// Admission. Async admits every queued job at once; sync admits one job while none runs, in
// table order (first come, first served).
//
// Leases. A task's lease runs out lease_s after it is issued (or after a continuation of its
// episodes was forwarded); a `task failed` report sets its deadline to 0. A lease is expired at
// `now` when now >= deadline. An expired task of a job that is not running is dropped; a training
// task of a running job is issued again, the same prompts under a new task id, on the job's
// current adapter version; an eval task is issued again on its round's version while its round
// is the job's round in progress, and dropped otherwise. Groups at the trainer are counted lost
// when the job has a full batch (>= B) there and no step for more than train_lease_s.
//
// Reports. An episodes report is applied only while its task holds a lease; applying it removes
// the lease, so a second copy of the report, or the late report of a task whose lease ran out
// and whose prompts went out again under another id, is not counted again (its episodes still
// reach the trainer: data, not a step). An eval report counts only for the job's current round.
// A step report moves step and version forward only.
#ifndef MARLAAS_POLICY_H
#define MARLAAS_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/net/proto.h"

typedef enum { POLICY_ASYNC = 0, POLICY_SYNC = 1 } sched_policy_t;

// --- fair share and the in-flight cap --------------------------------------------------------

// What the issuing decision reads of a job.
typedef struct {
    bool running;            // admitted and not finished, cancelled or failed
    uint32_t step;           // optimiser steps reported
    uint32_t max_steps;
    int prompts;             // B: groups per optimiser step
    int staleness;           // jobspec staleness (eta)
    int in_flight;           // groups in leased rollout tasks + groups at the trainer
    bool sync_waiting;       // sync: a step's worth issued, waiting for the trainer
    double vtime;            // virtual time: groups issued / weight, from its start
    int tenant;              // the tenant's index in the scheduler's table (jobs of one tenant share it)
    double tenant_vtime;     // the tenant's virtual time: its groups issued / the tenant's weight
    bool tenant_full;        // the tenant's jobs hold all the in-flight groups its quota allows
} policy_job_t;

// Groups a job may have in flight: B (sync) or (staleness + 1) * B (async).
int policy_cap(sched_policy_t p, int prompts, int staleness);
// Groups the job may be issued now: 0 when it is not running, has reached max_steps (an eval
// round in progress does not stop training), waits for its step (sync), is at its cap, or its
// tenant is at its quota of in-flight groups.
int policy_room(sched_policy_t p, const policy_job_t *j);
// Index of the job that gets the next training task, -1 when none may take more: of the tenants
// with a job that may take more, the one with the smallest virtual time; of its jobs, the one
// with the smallest virtual time; ties to the earlier in the table.
int policy_next_job(sched_policy_t p, const policy_job_t *jobs, int n);
// Prompts in the next task of a job with `room`: min(room, chunk).
uint32_t policy_task_size(int room, int chunk);
// The job's virtual time after a task of n groups.
double policy_charge(double vtime, uint32_t n, double weight);
// Virtual time of a job of `tenant` that joins now: the smallest of that tenant's running jobs',
// 0 when none runs.
double policy_start_vtime(const policy_job_t *jobs, int n, int tenant);
// Virtual time of a tenant whose first job joins now (its `own` time from earlier jobs): the
// smallest of the tenants with running jobs when that is larger (no catch-up on idle time),
// `own` when no job runs.
double policy_tenant_start_vtime(const policy_job_t *jobs, int n, double own);
// Groups of a job at the trainer, from two reports on two links: the verifier's `episodes` (n
// groups verified: policy_trainer_verified) and the trainer's `step` (n consumed or dropped:
// policy_trainer_released), in either order. A step may release groups whose `episodes` has not
// come yet: they are kept in *ahead (at most cap, the job's in-flight budget) and their late report
// adds nothing, so a group is never counted at the trainer after it was consumed.
void policy_trainer_verified(int *at_trainer, int *ahead, int n);
void policy_trainer_released(int *at_trainer, int *ahead, int n, int cap);
// Groups of a job in flight: in tasks holding a lease (in_rollout) or at the trainer, less those
// the trainer reported consumed before their verifier's report (ahead: they still hold their
// task's lease until that report comes, and are no longer in flight). Never negative.
int policy_in_flight(int in_rollout, int at_trainer, int ahead);
// Sync policy: true once a step's worth (B groups) is in flight; the job then waits for its step.
bool policy_sync_full(sched_policy_t p, int in_flight, int prompts);
// Whether a queued job is admitted while `running` jobs run: async while fewer than max_running
// run (0: no bound), sync while none runs.
bool policy_admit(sched_policy_t p, int running, int max_running);
// A group sampled with adapter version `sampled` may not train version `current`: more than
// `staleness` versions old, or newer than `current` (never published, so never sampled).
bool policy_stale(uint32_t current, uint32_t sampled, int staleness);

// --- training passes (the trainer's fair share) -----------------------------------------------
//
// Which of the trainer's ready jobs (a full batch buffered) step in its next pass, fair per
// tenant first, then per job within its tenant, with weights at both levels: the job's jobspec
// `weight`, the `weight` field of the tenant's hash tenant:{id} (default 1). Every tenant and
// every job has a virtual time: rows trained / weight. The scheduler's fair share orders
// generation; this one orders training, which decides the step rates when the trainer is the
// bottleneck.
//
// A pass takes jobs one at a time: of the tenants with a ready job not yet taken, the one with
// the smallest virtual time counting the jobs it already has in this pass (its tentative time),
// and of that tenant's ready jobs the one with the smallest virtual time; ties to the earlier in
// the arrays. A choice may fill several passes (a trainer with lanes computes them at once): the
// jobs fill the first pass up to `budget` rows, then the next (a job of more rows fills one
// alone). The choice stops (holding at least one job either way) when
//   - the next job would take the last pass over `budget` rows, or the choice over `max` jobs;
//   - the tenant next in line has reached the tentative time of a tenant in play (one with a
//     ready job at the start of the pass) whose ready jobs are all in the pass: that tenant
//     cannot take more now, so more of the other's jobs would go beyond its weighted share. One
//     job of tenant B beside eight of A steps in every pass with one of A's (half the steps
//     each, not 1/9); A at weight 2 takes two per B's one; B at weight 2 steps alone in every
//     other pass (two thirds of the steps). A tenant with no ready job does not hold a pass
//     back (its data is still on its way: the pass is work-conserving, and a passes of many
//     jobs computes more rows per second than passes of one or two).
// With one tenant in play every ready job steps within the budget.
//
// After the pass (policy_train_charge) the jobs taken and their tenants are charged rows /
// weight, and nothing banks credit: while some tenant has ready jobs left out of the pass, a
// tenant without any ready job is lifted to the smallest virtual time of those left out (it
// neither bursts when its jobs are ready again nor holds the others back); when every ready job
// stepped, nobody waited and every tenant is lifted to the largest time of those that stepped.
// Jobs within their tenant likewise. A tenant or job that joins starts at the smallest virtual
// time present (policy_train_tenant_start, policy_train_job_start).

// A job held by the trainer, as the pass decision reads it (an entry with present = false is an
// empty slot and is ignored).
typedef struct {
    bool present;            // a job is held in this entry
    bool ready;              // it may step now: a full batch buffered, not finished
    bool active;             // it may step soon: ready, or its data is arriving (ready implies
                             // active)
    int tenant;              // its tenant's index in the tenants array
    double weight;           // jobspec weight, > 0 (anything else counts as 1)
    double rows;             // rows its step computes (ready jobs)
    double vtime;            // rows trained / weight
} policy_tjob_t;

typedef struct {
    double weight;           // tenant weight, > 0 (anything else counts as 1)
    double vtime;            // rows its jobs trained / weight
} policy_ttenant_t;

// Fills picked[] with the indices of the jobs of the next `passes` passes (1 or more), in the order
// taken; returns how many (0 when no job is ready or max < 1). Tenants are the indices the jobs name.
int policy_train_pick(const policy_tjob_t *jobs, int n, const policy_ttenant_t *tenants, int n_tenants,
                      double budget, int passes, int max, int *picked);
// Charges the jobs of a pass (picked[n_picked], as policy_train_pick gave them) and their
// tenants, then lifts those that could not have used more (see above).
void policy_train_charge(policy_tjob_t *jobs, int n, policy_ttenant_t *tenants, int n_tenants, const int *picked,
                         int n_picked);
// Virtual time of a tenant whose first job joins: the smallest of the tenants with a present
// job, 0 when none.
double policy_train_tenant_start(const policy_tjob_t *jobs, int n, const policy_ttenant_t *tenants, int n_tenants);
// Virtual time of a job that joins `tenant`: the smallest of that tenant's present jobs, 0 when
// none.
double policy_train_job_start(const policy_tjob_t *jobs, int n, int tenant);

// --- leases -----------------------------------------------------------------------------------

typedef struct {
    uint64_t id;              // task id
    char job[PROTO_MAX_ID];
    proto_kind_t kind;
    uint32_t n;               // prompts (training: groups)
    uint64_t *index;          // (n) example indices, owned by the lease
    uint32_t version;         // adapter version the task samples
    int round;                // eval tasks: their round
    double deadline;          // the lease runs out at this time
} policy_lease_t;

// The leases held, in no particular order. Zero-initialised is empty; owns its leases.
typedef struct {
    policy_lease_t *v;
    int n, cap;
} policy_leases_t;

void policy_leases_free(policy_leases_t *t);
// Records a lease on task `id` until `deadline`, with a copy of index[n].
void policy_lease_add(policy_leases_t *t, uint64_t id, const char *job, proto_kind_t kind, const uint64_t *index,
                      uint32_t n, uint32_t version, int round, double deadline);
// Position of the lease on task `id` (of `job` when job is not NULL), -1 when none is held.
int policy_lease_find(const policy_leases_t *t, uint64_t id, const char *job);
// Removes the lease at position i and hands it, index array included, to *out (the caller frees
// out->index), or frees it when out is NULL. The last lease takes position i.
void policy_lease_take(policy_leases_t *t, int i, policy_lease_t *out);
// Removes every lease of a job.
void policy_leases_drop_job(policy_leases_t *t, const char *job);
// Whether a lease with this deadline has run out at `now`.
bool policy_lease_expired(double deadline, double now);
// Position of the first lease at or after `from` that has run out at `now`, -1 when none.
int policy_lease_next_expired(const policy_leases_t *t, int from, double now);
// Whether the expired lease k of a running job is issued again, and on which adapter version
// (*version): see "Leases" above. eval_round, version and eval_version are the job's.
bool policy_reissue(const policy_lease_t *k, int eval_round, uint32_t version, uint32_t eval_version,
                    uint32_t *reissue_version);
// Groups at the trainer are counted lost: a full batch there and no step for more than lease_s.
bool policy_trainer_lost(double now, double last_step_time, double lease_s, int at_trainer, int prompts);

// --- reports ----------------------------------------------------------------------------------

typedef enum {
    POLICY_RESULT_IGNORE,    // no lease on the task, or an eval of a round that is over
    POLICY_RESULT_TRAIN,     // training episodes: move the lease's groups to the trainer
    POLICY_RESULT_EVAL,      // eval episodes of the round in progress: count them
} policy_result_t;

// An episodes report of task `id` for a job whose eval round in progress is `eval_round`: takes
// the task's lease into *out when one is held (the caller frees out->index; NULL when none was
// held) and says what to do with the report. A second report of the same task finds no lease and
// is ignored.
policy_result_t policy_result(policy_leases_t *t, uint64_t id, int eval_round, policy_lease_t *out);
// A step report: step and version move to the report's when either is ahead of the job's.
void policy_step_report(uint32_t *step, uint32_t *version, uint32_t rep_step, uint32_t rep_version);

// --- adapter slots (the rollout's LoRA pool) --------------------------------------------------

typedef struct {
    char job[PROTO_MAX_ID];
    uint32_t version;
    int refs;              // tasks using the slot
    bool loaded;
    double last_used;
} policy_slot_t;

// The slot for version `version` of job's adapter: the one that holds it (*hit); else an empty
// slot; else the least recently used slot no task uses (the caller loads the adapter into it,
// evicting what it held); -1 when every slot is in use (the task waits).
int policy_adapter_slot(const policy_slot_t *slots, int n, const char *job, uint32_t version, bool *hit);

#endif

// jobs.h - the trainer's per-job state: adapter slot, optimizer, buffer of scored groups, and
// the training step (several ready jobs share one forward/backward pass).
#ifndef MARLAAS_TRAINER_JOBS_H
#define MARLAAS_TRAINER_JOBS_H

#include "common/engine/engine.h"
#include "common/engine/optim.h"
#include "common/net/proto.h"
#include "common/net/store.h"
#include "common/rl/batch.h"   // RL_MAX_LANES
#include "common/rl/dp.h"
#include "common/rl/jobspec.h"

typedef struct tjobs tjobs_t;

// Outcome of one job's step, for the caller to announce.
typedef struct {
    char job[PROTO_MAX_ID];
    uint32_t step, version;
    uint32_t consumed, dropped;    // groups trained / dropped as too stale
    bool drop_only;                // no step: groups were dropped as too stale and the job has no
                                   // step's worth left, so the scheduler hears of them now and
                                   // issues more (step and version are the job's current ones)
    bool failed;
    char error[ERR_LEN];
} tjobs_result_t;

typedef struct {
    int max_jobs;          // adapter slots (jobs trained at once)
    int keep_versions;     // adapter versions kept in Redis (>= 2)
    int optim_every;       // optimizer state saved every K steps
    int pass_rows;         // a mixed-adapter pass takes whole jobs up to about this many rows (at
                           // least one job): beyond a few thousand rows the activations leave the
                           // caches and a pass gets slower per row than two smaller ones
    bool shared_prefix;    // a group's prompt is computed once for its G samples (engine_train_seq_t
                           // prefix_of); false: every sample is a full sequence of its own
    dp_t *dp;              // data-parallel group whose rank 0 this is (borrowed; NULL = none): loads,
                           // evictions and passes go to every rank (common/rl/dp.h)
    int lanes;             // passes computed at once (0 counts as 1): a step takes up to two passes'
                           // worth of ready jobs per lane and computes its passes on `lanes` threads (the
                           // caller and lanes - 1 of tjobs' own), each with an engine of its own over the
                           // same model and adapters. Jobs are independent, so two passes need no
                           // synchronisation and a pass computes what it computes alone. 1..RL_MAX_LANES;
                           // above 1 only on the CPU backend and without data parallelism
} tjobs_cfg_t;

// tjobs_add's answer to a batch whose data no correct rollout and verifier produce.
enum { TJOBS_INVALID = -2 };

tjobs_t *tjobs_new(engine_t *e, store_t *st, const tjobs_cfg_t *cfg, char *err);
void tjobs_destroy(tjobs_t **t);
// Adds a scored batch (ownership of its arrays moves to the trainer; m is zeroed). Duplicate
// task ids are ignored. Loads the job (spec, latest adapter, optimizer state, tenant) from Redis
// on first sight. A training batch is checked whole before any of it is buffered: token ids in
// the model's vocabulary, prompt and completion non-empty and within its context, the job's
// group size, finite log-probs <= 0, rewards in [0, 1], well-formed environment marks. Returns 0;
// 1 when ignored (duplicate, eval batch, finished job); TJOBS_INVALID + err naming the job, task,
// group, sample and field when the data is invalid (nothing of it kept; the caller counts it;
// after 8 such batches of a job in a row, none accepted between, the next tjobs_step fails that
// job); -1 + err for any other refusal (unknown job, a version never published, no free slot).
// On a refusal m is the caller's to free.
int tjobs_add(tjobs_t *t, proto_batch_t *m, char *err);
// Fails the jobs tjobs_add condemned, then trains ready jobs (a full batch buffered) chosen fair
// per tenant, then per job (policy_train_pick: tenant weight from tenant:{id} `weight`, job
// weight from its spec): one pass of at most pass_rows rows (at least one job), or with lanes up
// to two such passes per lane, at most max jobs in all; and publishes their new versions. A pass the engine refuses is run again
// job by job, so only a job whose own pass is refused fails. Fills up to max results; returns how
// many.
int tjobs_step(tjobs_t *t, tjobs_result_t *res, int max);
// Jobs currently held.
int tjobs_count(const tjobs_t *t);
// Jobs it can hold at once (its job slots: max_jobs).
int tjobs_capacity(const tjobs_t *t);
// Scored groups waiting for their job's next step (the trainer's queue depth).
int tjobs_buffered(const tjobs_t *t);
// Seconds spent computing steps since start (busy accounting).
double tjobs_busy_seconds(const tjobs_t *t);
// The data-parallel group broke (a rank died, hung or diverged): why, or NULL. The trainer must
// stop then (nothing more is trained or published) so that its supervisor restarts the group.
const char *tjobs_broken(const tjobs_t *t);

#endif

// sched.h - the scheduler's job table and work issuing: fair share across running jobs,
// per-job staleness bound, leases with re-issue, periodic greedy evals, completion. Redis is
// the source of truth; the in-memory table is rebuilt from it after a restart. The decisions
// themselves (which job, how much, which lease, which report) are common/rl/policy.h's.
#ifndef MARLAAS_SCHED_H
#define MARLAAS_SCHED_H

#include <czmq.h>
#include <stdbool.h>

#include "common/formats/chat.h"
#include "common/formats/hfconfig.h"
#include "common/svc/metrics.h"
#include "common/net/proto.h"
#include "common/net/store.h"
#include "common/rl/jobspec.h"
#include "common/rl/policy.h"   // sched_policy_t; the decisions sched.c applies

typedef struct sched sched_t;

typedef struct {
    sched_policy_t policy;
    double lease_s;          // a task not verified within this time is issued again
    double train_lease_s;    // groups at the trainer with no step for this long count as lost
    int chunk;               // prompts per rollout task
    int max_running;         // async: jobs running at once, the rest queued in order (0: no bound);
                             // at or below the trainer's job capacity (its max_jobs)
} sched_cfg_t;

sched_t *sched_new(store_t *st, zsock_t *work, const hf_config_t *model, const sched_cfg_t *cfg, char *err);
void sched_destroy(sched_t **s);
// Loads every job that is queued or running from Redis (after a restart). Returns the count.
int sched_restore(sched_t *s, char *err);
// A job was created in Redis (status queued); start scheduling it.
int sched_add_job(sched_t *s, const char *job, char *err);
// The job was cancelled through the API.
void sched_cancel(sched_t *s, const char *job);
// Applies a report from a verifier, rollout or trainer; -1 + err for one the job's state
// refutes (a step or version the store does not hold, a job failure with neither a task of the
// job's nor the failure in the store).
int sched_report(sched_t *s, const proto_report_t *r, char *err);
// A "cont" frame from a verifier (episodes awaiting their next turn): forwarded to the rollouts
// as is, and the task's lease renewed. -1 + err for a malformed frame.
int sched_continue(sched_t *s, const void *frame, size_t len, char *err);
// Issues work, expires leases, finishes jobs. Call often (every few ms).
void sched_tick(sched_t *s);
// Number of jobs queued or running.
int sched_active(const sched_t *s);
// The job slots of the live trainers (the sum of their heartbeats' max_jobs; 0: none known). The
// async policy then admits no more running jobs than that (and than max_running when set): a
// trainer whose slots all hold jobs with pending data refuses other jobs' batches, whose rollouts
// are then wasted. Returns the bound now in force (0: none).
int sched_set_trainer_slots(sched_t *s, int slots);
// Publishes job progress on this PUB socket (topic "job", a JSON object per event: job, tenant
// is not included; status, step, version, eval results).
void sched_set_events(sched_t *s, zsock_t *pub);
// The base model's chat template (borrowed; NULL with the reason when it has none): chat jobs'
// prompts are rendered with it when their tasks are issued.
void sched_set_chat(sched_t *s, const chat_template_t *ct, const char *why_none);

// Live counters: declares the scheduler's families in m (global and per job); sched_export
// brings them up to date (call about once a second) and returns the number of queued jobs.
void sched_set_metrics(sched_t *s, metrics_t *m);
int sched_export(sched_t *s);

#endif

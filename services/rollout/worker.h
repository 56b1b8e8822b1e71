// worker.h - the rollout worker: turns rollout tasks of many jobs into generation requests on
// one continuous-batching generator, keeps the jobs' adapters resident (LRU over adapter
// slots, fetched from Redis by version on a miss), and assembles each task's completions.
#ifndef MARLAAS_ROLLOUT_WORKER_H
#define MARLAAS_ROLLOUT_WORKER_H

#include "common/net/proto.h"
#include "common/net/store.h"
#include "common/rl/rl.h"

typedef struct worker worker_t;

worker_t *worker_new(rl_runtime_t *rt, store_t *st, const char *id, char *err);
void worker_destroy(worker_t **w);
// Takes a task (ownership moves; *m zeroed). Tasks wait when no adapter slot is free.
void worker_add(worker_t *w, proto_task_t *m);
// Takes the episodes of a "cont" batch (ownership moves; *b freed): the pending samples get
// their observation appended and generate their next turn; the batch then goes out again.
void worker_add_cont(worker_t *w, proto_batch_t *b);
// Admits waiting tasks, runs one generation step. Returns rows computed (0 = idle).
int worker_step(worker_t *w);
// A finished task's batch ("done"), or NULL; caller frees with proto_batch_destroy.
// A task that failed (adapter missing, prompt too long) comes back with n_groups = 0 and
// its error in *error (static storage of the worker, valid until the next call).
proto_batch_t *worker_take(worker_t *w, const char **error);
// A new adapter version was announced: a resident older version with no running requests is
// replaced at once.
void worker_adapter_event(worker_t *w, const char *job, uint32_t version);
int worker_pending(const worker_t *w);
double worker_busy_seconds(const worker_t *w);
uint64_t worker_tokens(const worker_t *w);

#endif

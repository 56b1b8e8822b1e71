// score.h - the verifier's scoring: built-in task and dataset verifiers, and external reward
// services over ZeroMQ (asynchronous: a slow or dead service delays only its own job).
#ifndef MARLAAS_VERIFIER_SCORE_H
#define MARLAAS_VERIFIER_SCORE_H

#include <czmq.h>

#include "common/net/proto.h"
#include "common/net/store.h"

typedef struct scorer scorer_t;

scorer_t *scorer_new(store_t *st, char *err);
void scorer_destroy(scorer_t **s);
// Takes a "done" batch (ownership moves; *b zeroed) and starts scoring it.
void scorer_add(scorer_t *s, proto_batch_t *b);
// Sockets of external reward services to poll (NULL-terminated array owned by the scorer).
zsock_t **scorer_sockets(scorer_t *s, int *n);
// Handles replies on any reward socket, retries and times out requests. Call often.
void scorer_poll(scorer_t *s);
// A fully scored batch, or NULL. *job_failed is set (and *error filled) when the job's reward
// service failed and its spec says on_failure = "fail". Caller frees with proto_batch_destroy.
proto_batch_t *scorer_take(scorer_t *s, bool *job_failed, bool *cont, char *error);
int scorer_pending(const scorer_t *s);
double scorer_busy_seconds(const scorer_t *s);

#endif

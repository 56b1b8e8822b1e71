// score.h - the verifier's scoring: built-in task and dataset verifiers, and external reward
// services over ZeroMQ (asynchronous: a slow or dead service delays only its own job).
//
// Tenants' services are untrusted. Each request carries a random 64-bit id, and a reply is
// applied only when it comes on the socket its request went out on, with that request's id:
// a service answers for nothing but the requests it was sent. Sockets are per (tenant,
// endpoint), at most per_tenant for one tenant and SCORER_MAX_ENDPOINTS in all, closed once no
// request has used them for idle_s; endpoints pass the operator's rules (endpoint.h) first.
#ifndef MARLAAS_VERIFIER_SCORE_H
#define MARLAAS_VERIFIER_SCORE_H

#include <czmq.h>

#include "common/net/endpoint.h"
#include "common/net/proto.h"
#include "common/net/store.h"

#define SCORER_MAX_JOBS 256          // job specs cached
#define SCORER_MAX_ENDPOINTS 256     // service sockets in all: one for every cached job (a job
                                     // names one service at most)
#define SCORER_PER_TENANT 8          // default: service sockets one tenant may hold
#define SCORER_IDLE_S 30.0           // default: a socket no request uses is closed after this

typedef struct scorer scorer_t;

typedef struct {
    const endpoint_rules_t *rules;   // where jobs' services may be (NULL: any tcp host); borrowed
    int per_tenant;                  // 1..SCORER_MAX_ENDPOINTS (0: SCORER_PER_TENANT)
    double idle_s;                   // > 0 (0: SCORER_IDLE_S)
    // Called for every reply that is not applied: one that answers no request sent on its socket
    // (late, or made up) or that cannot be read. NULL: a warning line each.
    void (*reject)(void *ctx, const char *msg);
    void *ctx;
} scorer_cfg_t;

// cfg may be NULL (defaults). NULL + err.
scorer_t *scorer_new(store_t *st, const scorer_cfg_t *cfg, char *err);
void scorer_destroy(scorer_t **s);
// Takes a "done" batch (ownership moves; *b zeroed) and starts scoring it.
void scorer_add(scorer_t *s, proto_batch_t *b);
// Sockets of external reward services to poll (NULL-terminated array owned by the scorer).
zsock_t **scorer_sockets(scorer_t *s, int *n);
// Handles replies on any reward socket, retries and times out requests, closes idle sockets.
// Call often.
void scorer_poll(scorer_t *s);
// A fully scored batch, or NULL. *job_failed is set (and *error filled) when the job's reward
// service failed and its spec says on_failure = "fail". Caller frees with proto_batch_destroy.
proto_batch_t *scorer_take(scorer_t *s, bool *job_failed, bool *cont, char *error);
int scorer_pending(const scorer_t *s);
// The prompt text of a job's example (the task's or dataset record's prompt, before any chat
// template; caller frees), NULL when the job is not cached or the record has no prompt text.
char *scorer_prompt(scorer_t *s, const char *job, proto_kind_t kind, uint64_t index);
double scorer_busy_seconds(const scorer_t *s);
// Service sockets open now; replies not applied so far (see cfg.reject).
int scorer_endpoints(const scorer_t *s);
uint64_t scorer_refused_replies(const scorer_t *s);

#endif

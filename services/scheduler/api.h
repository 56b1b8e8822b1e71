// api.h - the scheduler's client API over a ROUTER socket: tenants, jobs, metrics, adapters.
//
// Requests are "req" messages (proto.h) with an op, a token and arguments; every reply is a
// "rep" with ok / error and results. Tokens: the admin token (--admin-token) may create
// tenants; a tenant token (returned once by tenant_create, stored only as a hash) may submit
// and manage that tenant's jobs. A tenant never sees another tenant's jobs: an unknown job and
// someone else's job get the same "no such job" answer.
//
// Operations (arguments -> results):
//   tenant_create  name, [quota], [weight],          -> tenant, token          (admin)
//                  [max_groups], [max_data_mb]
//   job_submit     spec (JSON), [dataset] (JSONL)   -> job, [notes] (what of the model's
//                                                     generation_config.json was applied or not)
//   job_list                                        -> jobs (JSON array)
//   job_status     job                              -> status (JSON object)
//   job_cancel     job                              -> status
//   job_metrics    job, [count]                     -> metrics (JSON array, oldest first)
//   adapter_get    job, [version]                   -> version, blob (PEFT safetensors), model_config (JSON),
//                                                     base_model (for adapter_config.json)
//   ping                                            -> time                   (any valid token)
#ifndef MARLAAS_API_H
#define MARLAAS_API_H

#include <czmq.h>

#include "common/net/endpoint.h"
#include "common/net/store.h"
#include "services/scheduler/sched.h"

typedef struct api api_t;

api_t *api_new(store_t *st, sched_t *sc, const char *admin_token, const char *model_dir, char *err);
// A simulated cluster (its services run --backend sim:DEVICE, common/sim/sim.h): jobs get modelled
// adapters (lora_modelled_serialize) and may run the simulated tasks, which are refused otherwise.
void api_set_simulated(api_t *a, bool on);
void api_destroy(api_t **a);
// The base model's chat template (borrowed; NULL with the reason when it has none): chat jobs
// are refused without one, and every prompt of a chat job is rendered at submission.
void api_set_chat(api_t *a, const chat_template_t *ct, const char *why_none);
// The rules job_submit checks the reward and environment endpoints of a spec against (the
// verifier's own: svc_endpoint_rules); the API owns them. NULL: none.
void api_set_endpoint_rules(api_t *a, endpoint_rules_t *rules);
// The context and KV cache the rollouts serve, by their settings max_context and kv_mb (0: the
// defaults, rl.h) or kv_blocks (when > 0: a simulated device's, rl_sim_kv_blocks), against which
// job_submit measures prompts. -1 + err for a context the model lacks.
int api_set_serving(api_t *a, int max_context, int kv_mb, int kv_blocks, char *err);
// Reads and answers every request waiting on the ROUTER socket.
void api_serve(api_t *a, zsock_t *router);
// Answers one decoded request (what api_serve does for each request on the socket): the same
// authorization and operations for every caller, the web console (console.c) included.
void api_handle(api_t *a, const proto_req_t *q, proto_rep_t *rep);
// Who a token is: *admin for the admin token (tenant ""), else its tenant id. -1 + err ("invalid
// token", "missing token") when it is neither.
int api_whoami(api_t *a, const char *token, char tenant[PROTO_MAX_ID], bool *admin, char *err);
// Requests answered so far, and how many of them with an error.
void api_counts(const api_t *a, uint64_t *requests, uint64_t *errors);

#endif

// serve.h - the scheduler service: the API socket, the job table (sched.c), its sockets and
// metrics, and the handlers the service loop runs (API requests, reports and continuations,
// the issuing tick).
#ifndef MARLAAS_SCHEDULER_SERVE_H
#define MARLAAS_SCHEDULER_SERVE_H

#include "common/svc/loop.h"
#include "services/scheduler/sched.h"

typedef struct scheduler scheduler_t;

// --policy and the --set extras into cfg, and the admin token (NULL when tenants cannot be
// created: none, too short, or the Kubernetes base's public placeholder; logged). -1 (logged)
// for an invalid setting.
int scheduler_settings(const svc_t *s, sched_cfg_t *cfg, const char **admin);
// Reads the base model's config and chat template, binds --api, --work, --events, --reports,
// restores the jobs from Redis. NULL + err.
scheduler_t *scheduler_open(svc_t *s, store_t *st, const sched_cfg_t *cfg, const char *admin, char *err);
// Registers the handlers with the loop (module: the scheduler_t; svc_loop_serve's reg).
void scheduler_register(void *module, svc_loop_t *l);
void scheduler_close(scheduler_t **pc);

#endif

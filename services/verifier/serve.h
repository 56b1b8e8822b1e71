// serve.h - the verifier service: its sockets, metrics and the handlers the service loop runs
// (batches in from the rollouts, scored groups out to the trainer, reports to the scheduler).
#ifndef MARLAAS_VERIFIER_SERVE_H
#define MARLAAS_VERIFIER_SERVE_H

#include "common/svc/loop.h"

typedef struct verifier verifier_t;

// Binds --verifiers, connects --trainer and --reports, starts the scorer. NULL + err.
verifier_t *verifier_open(svc_t *s, store_t *st, char *err);
// Registers the handlers with the loop (module: the verifier_t; svc_loop_serve's reg).
void verifier_register(void *module, svc_loop_t *l);
// The closing log line and the teardown.
void verifier_close(verifier_t **pv);

#endif

// serve.h - the rollout service: its model runtime, sockets, metrics and the handlers the service
// loop runs (tasks and continuations in, adapter versions announced, batches out to verifiers).
#ifndef MARLAAS_ROLLOUT_SERVE_H
#define MARLAAS_ROLLOUT_SERVE_H

#include "common/svc/loop.h"
#include "kernels/kernels.h"

typedef struct rollout rollout_t;

// Loads --model on backend k (bf16 base matrices when bf16; the --set extras of HELP in main.c),
// connects --work, --trainer-events and --reports, and makes the socket to the verifiers.
// NULL + err.
rollout_t *rollout_open(svc_t *s, store_t *st, const kernels_t *k, bool bf16, char *err);
// Registers the handlers with the loop (module: the rollout_t; svc_loop_serve's reg).
void rollout_register(void *module, svc_loop_t *l);
void rollout_close(rollout_t **pr);

#endif

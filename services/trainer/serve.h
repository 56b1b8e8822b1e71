// serve.h - the trainer service: its model, engine, data-parallel group, sockets, metrics and the
// handlers the service loop runs (scored batches in, steps, adapter versions announced, reports
// to the scheduler); and the compute-only process of data-parallel ranks 1..N-1.
#ifndef MARLAAS_TRAINER_SERVE_H
#define MARLAAS_TRAINER_SERVE_H

#include "common/svc/loop.h"
#include "common/rl/dp.h"
#include "kernels/kernels.h"

typedef struct trainer trainer_t;

// The data-parallel settings (--set dp_world, dp_rank, dp_endpoint, dp_timeout, dp_sum) and
// --set shared_prefix; -1 (logged) when one is invalid.
int trainer_settings(const svc_t *s, dp_cfg_t *dc);
// Ranks 1..: hold replicas of the adapters and train their shares of rank 0's passes; no Redis
// and none of the service's sockets. Returns the exit code.
int trainer_run_rank(svc_t *s, const kernels_t *k, bool bf16, const dp_cfg_t *dc);
// Rank 0, the trainer service: loads --model on k (bf16 matrices when bf16), forms the data-parallel group of dc, binds
// --trainer and --trainer-events, connects --reports. NULL + err.
trainer_t *trainer_open(svc_t *s, store_t *st, const kernels_t *k, bool bf16, const dp_cfg_t *dc, char *err);
// Registers the handlers with the loop (module: the trainer_t; svc_loop_serve's reg).
void trainer_register(void *module, svc_loop_t *l);
void trainer_close(trainer_t **pt);

#endif

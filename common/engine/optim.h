// optim.h - AdamW over one flat parameter arena, global grad-norm clipping, LR schedules.
#ifndef MARLAAS_OPTIM_H
#define MARLAAS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

typedef enum { LR_CONSTANT = 0, LR_WARMUP_COSINE = 1 } lr_schedule_t;

typedef struct {
    float lr;              // peak learning rate
    float beta1, beta2, eps;
    float weight_decay;    // decoupled (AdamW)
    float max_grad_norm;   // <= 0: no clipping
    lr_schedule_t schedule;
    int warmup_steps;      // warmup-cosine: linear warmup
    int total_steps;       // warmup-cosine: cosine decay to min_lr_ratio * lr at total_steps
    float min_lr_ratio;
} optim_cfg_t;

// Sensible defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0, clip 1.0, constant.
optim_cfg_t optim_defaults(void);

typedef struct {
    optim_cfg_t cfg;
    const kernels_t *k;
    size_t n;
    float *m, *v;          // (n) moments, backend memory
    int64_t step;          // optimizer steps taken
} optim_t;

optim_t *optim_new(const optim_cfg_t *cfg, const kernels_t *k, size_t n_params);
void optim_destroy(optim_t **o);
// Learning rate at step s (0-based) under the schedule.
float optim_lr(const optim_cfg_t *cfg, int64_t s);
// Global L2 norm of grads (n floats, backend memory of o->k).
double optim_grad_norm(const optim_t *o, const float *grads);
// One AdamW step: clips by global norm, updates params, returns the pre-clip grad norm. params
// and grads are n floats of backend memory of o->k (e.g. a lora_t's params and its gradient arena).
// A non-finite gradient norm skips the update and returns it (caller decides what to do).
double optim_step(optim_t *o, float *params, const float *grads);

// Serialises the optimizer state (step, cfg, m, v) into a new host buffer (caller frees),
// and restores it (n must match). Used to persist trainer state.
int optim_serialize(const optim_t *o, uint8_t **buf, size_t *len);
int optim_deserialize(optim_t *o, const void *buf, size_t len, char *err);
// The configuration stored in a serialised state (optim_deserialize keeps the caller's instead):
// a replica of the optimiser (data-parallel ranks) takes it from there. 0 or -1 + err.
int optim_serialized_cfg(const void *buf, size_t len, optim_cfg_t *cfg, char *err);

#endif

// optim.c - AdamW, grad-norm clipping, learning-rate schedules, optimizer state (de)serialisation.
#include "common/engine/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/util.h"

optim_cfg_t optim_defaults(void) {
    return (optim_cfg_t){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f,
                         .max_grad_norm = 1.0f, .schedule = LR_CONSTANT, .warmup_steps = 0, .total_steps = 0,
                         .min_lr_ratio = 0.1f};
}

optim_t *optim_new(const optim_cfg_t *cfg, const kernels_t *k, size_t n) {
    optim_t *o = xcalloc(1, sizeof *o);
    o->cfg = *cfg;
    o->k = k;
    o->n = n;
    o->m = k->alloc(n * sizeof(float));
    o->v = k->alloc(n * sizeof(float));
    return o;
}

void optim_destroy(optim_t **po) {
    if (!po || !*po) return;
    (*po)->k->free((*po)->m);
    (*po)->k->free((*po)->v);
    free(*po);
    *po = NULL;
}

float optim_lr(const optim_cfg_t *c, int64_t s) {
    if (c->schedule == LR_CONSTANT) return c->lr;
    if (s < c->warmup_steps) return c->lr * (float)(s + 1) / (float)c->warmup_steps;
    int64_t decay = c->total_steps - c->warmup_steps;
    if (decay <= 0) return c->lr;
    double frac = (double)(s - c->warmup_steps) / (double)decay;
    if (frac > 1.0) frac = 1.0;
    double cosv = 0.5 * (1.0 + cos(M_PI * frac));
    return (float)(c->lr * (c->min_lr_ratio + (1.0 - c->min_lr_ratio) * cosv));
}

double optim_grad_norm(const optim_t *o, const float *g) { return sqrt(o->k->sumsq(o->n, g)); }

double optim_step(optim_t *o, float *params, const float *grads) {
    double norm = optim_grad_norm(o, grads);
    if (!isfinite(norm)) return norm;
    float gscale = 1.0f;
    if (o->cfg.max_grad_norm > 0.0f && norm > o->cfg.max_grad_norm) gscale = (float)(o->cfg.max_grad_norm / norm);
    float lr = optim_lr(&o->cfg, o->step);
    o->step++;
    float bc1 = 1.0f - powf(o->cfg.beta1, (float)o->step), bc2 = 1.0f - powf(o->cfg.beta2, (float)o->step);
    o->k->adamw(params, grads, o->m, o->v, o->n, lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps, o->cfg.weight_decay, bc1,
                bc2, gscale);
    return norm;
}

// Layout: magic "MOPT1\0\0\0", u64 n, i64 step, optim_cfg_t, m[n], v[n] (host byte order:
// the state is read back by the same build on the same architecture).
#define OPTIM_MAGIC "MOPT1\0\0\0"

int optim_serialize(const optim_t *o, uint8_t **buf, size_t *len) {
    size_t n = 8 + 8 + 8 + sizeof(optim_cfg_t) + 2 * o->n * sizeof(float);
    uint8_t *b = xmalloc(n), *p = b;
    uint64_t nn = o->n;
    memcpy(p, OPTIM_MAGIC, 8), p += 8;
    memcpy(p, &nn, 8), p += 8;
    memcpy(p, &o->step, 8), p += 8;
    memcpy(p, &o->cfg, sizeof o->cfg), p += sizeof o->cfg;
    o->k->to_host(p, o->m, o->n * sizeof(float)), p += o->n * sizeof(float);
    o->k->to_host(p, o->v, o->n * sizeof(float));
    *buf = b;
    *len = n;
    return 0;
}

int optim_deserialize(optim_t *o, const void *buf, size_t len, char *err) {
    const uint8_t *p = buf;
    size_t want = 8 + 8 + 8 + sizeof(optim_cfg_t) + 2 * o->n * sizeof(float);
    if (len != want || memcmp(p, OPTIM_MAGIC, 8) != 0)
        return err_set(err, "optimizer state: bad size or magic (%zu bytes, expected %zu)", len, want);
    uint64_t nn;
    memcpy(&nn, p + 8, 8);
    if (nn != o->n) return err_set(err, "optimizer state holds %llu parameters, expected %zu", (unsigned long long)nn, o->n);
    memcpy(&o->step, p + 16, 8);
    // The configuration in force stays the caller's (it may have been changed on purpose).
    p += 24 + sizeof(optim_cfg_t);
    o->k->to_dev(o->m, p, o->n * sizeof(float));
    o->k->to_dev(o->v, p + o->n * sizeof(float), o->n * sizeof(float));
    return 0;
}

int optim_serialized_cfg(const void *buf, size_t len, optim_cfg_t *cfg, char *err) {
    if (len < 24 + sizeof(optim_cfg_t) || memcmp(buf, OPTIM_MAGIC, 8) != 0)
        return err_set(err, "optimizer state: bad size or magic (%zu bytes)", len);
    memcpy(cfg, (const uint8_t *)buf + 24, sizeof *cfg);
    return 0;
}

// dp.c - data-parallel training steps over a dist_t group (see dp.h). Commands are MessagePack
// arrays [version, kind, ...]; arrays of tokens and floats travel as bin (the ranks' native byte
// order: every rank of a group runs on the same architecture).
#include "common/rl/dp.h"

#include <math.h>
#include <stdarg.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/dist.h"
#include "common/rl/dist_nccl.h"
#include "common/util/log.h"
#include "common/util/util.h"

#define DP_VERSION 1
enum { C_PING = 1, C_STOP, C_LOAD, C_CLEAR, C_PASS };
#define N_STAT 9   // loss statistics summed per slot (pack_stats)

struct dp {
    dist_t *g;
#ifdef MARLAAS_CUDA
    dist_nccl_t *nccl;         // gradient sums on device memory (backends other than the CPU's)
#endif
    engine_t *e;
    const kernels_t *k;
    int rank, world;
    double last;               // time of the last group operation
    // worker replicas (ranks > 0), by slot
    optim_t **opt;
    float **grad;
    int n_slots;
    long passes, seqs;
};

// err_set with a chosen return code.
static int failc(int code, char *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failc(int code, char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
    return code;
}

int dp_rank(const dp_t *d) { return d->rank; }
int dp_world(const dp_t *d) { return d->world; }
double dp_idle_s(const dp_t *d) { return util_now() - d->last; }
void dp_counts(const dp_t *d, long *passes, long *seqs) {
    *passes = d->passes;
    *seqs = d->seqs;
}

dp_t *dp_open(const dp_cfg_t *c, engine_t *e, char *err) {
    err[0] = 0;
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world) {
        err_set(err, "data parallelism: rank %d outside 0..%d (world %d)", c->rank, c->world - 1, c->world);
        return NULL;
    }
    if (c->world == 1) return NULL;
    char e2[ERR_LEN];
    dist_t *g = dist_open(c->rank, c->world, c->endpoint, c->timeout_s, e2);
    if (!g) {
        err_set(err, "%s", e2);
        return NULL;
    }
    dp_t *d = xcalloc(1, sizeof *d);
    d->g = g;
    d->e = e;
    d->k = engine_model(e)->k;
    d->rank = c->rank, d->world = c->world;
    d->n_slots = lora_pool_slots(engine_pool(e));
    d->opt = xcalloc((size_t)d->n_slots, sizeof(optim_t *));
    d->grad = xcalloc((size_t)d->n_slots, sizeof(float *));
#ifdef MARLAAS_CUDA
    if (d->k != kernels_cpu() && !c->host_sum) {
        d->nccl = dist_nccl_open(g, c->timeout_s, e2);
        if (!d->nccl) {
            err_set(err, "%s", e2);
            dp_close(&d);
            return NULL;
        }
    }
#endif
    d->last = util_now();
    return d;
}

static void slot_free(dp_t *d, int slot) {
    optim_destroy(&d->opt[slot]);
    if (d->grad[slot]) d->k->free(d->grad[slot]);
    d->grad[slot] = NULL;
    lora_pool_clear(engine_pool(d->e), slot);
}

// --- messages -----------------------------------------------------------------------------------

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} enc_t;

static void enc_begin(enc_t *m, int kind, int n_fields) {
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&m->pk, (size_t)n_fields + 2);
    msgpack_pack_int(&m->pk, DP_VERSION);
    msgpack_pack_int(&m->pk, kind);
}

static void enc_bin(enc_t *m, const void *p, size_t len) {
    if (!p) {
        msgpack_pack_nil(&m->pk);
        return;
    }
    msgpack_pack_bin(&m->pk, len);
    msgpack_pack_bin_body(&m->pk, p, len);
}

// Rank 0: the message to every rank. 0 or DP_BROKEN.
static int bcast(dp_t *d, enc_t *m, char *err) {
    void *data = m->sb.data;
    size_t len = m->sb.size;
    int rc = dist_bcast(d->g, &data, &len, err);
    msgpack_sbuffer_destroy(&m->sb);
    d->last = util_now();
    return rc ? DP_BROKEN : 0;
}

// The outcome of a command on every rank: the number of ranks that failed it. -1 when broken.
static int agree(dp_t *d, bool failed, char *err) {
    float f = failed ? 1.0f : 0.0f;
    if (dist_allreduce_sum(d->g, &f, 1, err)) return -1;
    d->last = util_now();
    return (int)f;
}

static bool is_uint(const msgpack_object *o) { return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER; }
static bool is_num(const msgpack_object *o) {
    return o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32 ||
           o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}
static double num(const msgpack_object *o) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)o->via.u64;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)o->via.i64;
    return o->via.f64;
}
// A bin of exactly n elements of size sz (nil allowed when nullable): its bytes, or NULL.
static const void *bin_of(const msgpack_object *o, size_t n, size_t sz, bool nullable, bool *ok) {
    if (o->type == MSGPACK_OBJECT_NIL && nullable) return NULL;
    if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != n * sz) *ok = false;
    return o->type == MSGPACK_OBJECT_BIN ? o->via.bin.ptr : NULL;
}

// --- rank 0 commands ----------------------------------------------------------------------------

int dp_load(dp_t *d, int slot, const optim_t *o, char *err) {
    lora_t *a = lora_pool_get(engine_pool(d->e), slot);
    uint8_t *blob = NULL, *ob = NULL;
    size_t len = 0, ol = 0;
    if (!a) return failc(DP_REFUSED, err, "data parallelism: slot %d holds no adapter to send", slot);
    if (lora_serialize(a, &blob, &len, err)) return DP_REFUSED;
    optim_serialize(o, &ob, &ol);
    enc_t m;
    enc_begin(&m, C_LOAD, 3);
    msgpack_pack_int(&m.pk, slot);
    enc_bin(&m, blob, len);
    enc_bin(&m, ob, ol);
    free(blob);
    free(ob);
    if (bcast(d, &m, err)) return DP_BROKEN;
    int failed = agree(d, false, err);
    if (failed < 0) return DP_BROKEN;
    if (failed) return err_set(err, "%d rank(s) could not load the adapter of slot %d (see their logs)", failed, slot),
                DP_REFUSED;
    return 0;
}

int dp_clear(dp_t *d, int slot, char *err) {
    enc_t m;
    enc_begin(&m, C_CLEAR, 1);
    msgpack_pack_int(&m.pk, slot);
    return bcast(d, &m, err);
}

int dp_ping(dp_t *d, char *err) {
    enc_t m;
    enc_begin(&m, C_PING, 0);
    if (bcast(d, &m, err)) return DP_BROKEN;
    return dist_barrier(d->g, err) ? DP_BROKEN : (d->last = util_now(), 0);
}

void dp_close(dp_t **pd) {
    dp_t *d = *pd;
    if (!d) return;
    if (d->rank == 0) {
        char err[ERR_LEN];
        enc_t m;
        enc_begin(&m, C_STOP, 0);
        bcast(d, &m, err);
    }
    for (int s = 0; s < d->n_slots; s++)
        if (d->rank != 0 && (d->opt[s] || d->grad[s])) slot_free(d, s);
#ifdef MARLAAS_CUDA
    dist_nccl_close(&d->nccl);
#endif
    dist_close(&d->g);
    free(d->opt);
    free(d->grad);
    free(d);
    *pd = NULL;
}

static void pass_encode(enc_t *m, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, const int *slots,
                        int n_slots) {
    enc_begin(m, C_PASS, 3);
    msgpack_pack_array(&m->pk, 5);
    msgpack_pack_int(&m->pk, lc->kind);
    msgpack_pack_double(&m->pk, lc->temperature);
    msgpack_pack_double(&m->pk, lc->clip_low);
    msgpack_pack_double(&m->pk, lc->clip_high);
    msgpack_pack_double(&m->pk, lc->kl_coef);
    msgpack_pack_array(&m->pk, (size_t)n_slots);
    for (int i = 0; i < n_slots; i++) msgpack_pack_int(&m->pk, slots[i]);
    msgpack_pack_array(&m->pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        const engine_train_seq_t *s = &seqs[i];
        size_t L = (size_t)s->len;
        msgpack_pack_array(&m->pk, 8);
        enc_bin(m, s->tokens, sizeof(int32_t) * L);
        enc_bin(m, s->weight, sizeof(float) * L);
        enc_bin(m, s->old_logp, sizeof(float) * L);
        msgpack_pack_double(&m->pk, s->advantage);
        msgpack_pack_int(&m->pk, s->slot);
        msgpack_pack_int(&m->pk, s->on_policy ? 1 : 0);
        msgpack_pack_int(&m->pk, s->prefix_of);
        msgpack_pack_int(&m->pk, s->prefix_len);
    }
}

// --- the pass -------------------------------------------------------------------------------------

int dp_shard(const engine_train_seq_t *seqs, int n, int world, int *owner, char *err) {
    double *load = xcalloc((size_t)world, sizeof(double)), *rows = xcalloc((size_t)(n ? n : 1), sizeof(double));
    int rc = 0;
    // rows of each unit (a sequence without a prefix and every sequence naming it)
    for (int i = 0; i < n && !rc; i++) {
        int root = seqs[i].prefix_of ? seqs[i].prefix_of - 1 : i;
        if (root < 0 || root > i || (root < i && seqs[root].prefix_of))
            rc = err_set(err, "training sequence %d: prefix_of %d must name an earlier sequence without a prefix", i,
                         seqs[i].prefix_of);
        else rows[root] += seqs[i].len - (root < i ? seqs[i].prefix_len : 0);
    }
    for (int i = 0; i < n && !rc; i++) {
        if (seqs[i].prefix_of) {
            owner[i] = owner[seqs[i].prefix_of - 1];
            continue;
        }
        int best = 0;
        for (int r = 1; r < world; r++)
            if (load[r] < load[best]) best = r;
        owner[i] = best;
        load[best] += rows[i];
    }
    free(load);
    free(rows);
    return rc;
}

// Everything in this process: reference log-probs (KL), then engine_train.
static int compute(engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, float *const *grads,
                   loss_stats_t *st, int nst, char *err) {
    if (n == 0) return 0;
    if (!(lc->kl_coef > 0.0f)) return engine_train(e, seqs, n, lc, NULL, grads, st, nst, err);
    // reference log-probs: the same sequences with the adapter switched off (prefix sequences
    // too: a prefix has its samples' slot)
    engine_train_seq_t *base = xmalloc(sizeof *base * (size_t)n), *own = xmalloc(sizeof *own * (size_t)n);
    float **refp = xmalloc(sizeof(float *) * (size_t)n);
    for (int i = 0; i < n; i++) {
        base[i] = seqs[i], base[i].slot = -1;
        refp[i] = xcalloc((size_t)seqs[i].len, sizeof(float));
        own[i] = seqs[i], own[i].ref_logp = refp[i];
    }
    int rc = engine_logprobs(e, base, n, lc->temperature, refp, NULL, err);
    if (rc == 0) rc = engine_train(e, own, n, lc, NULL, grads, st, nst, err);
    for (int i = 0; i < n; i++) free(refp[i]);
    free(refp), free(base), free(own);
    return rc;
}

static void pack_stats(float *o, const loss_stats_t *s) {
    const double v[N_STAT] = {s->loss,       s->tokens,    s->clip_frac, s->kl, s->entropy, s->ratio_mean,
                              s->logp_mean,  s->mismatch * s->mismatch_tokens, s->mismatch_tokens};
    for (int i = 0; i < N_STAT; i++) o[i] = (float)v[i];
}
static void unpack_stats(loss_stats_t *s, const float *o) {
    *s = (loss_stats_t){.loss = o[0], .tokens = o[1], .clip_frac = o[2], .kl = o[3], .entropy = o[4],
                        .ratio_mean = o[5], .logp_mean = o[6], .mismatch = o[8] > 0 ? o[7] / o[8] : 0.0,
                        .mismatch_tokens = o[8]};
}

// Gradient sum over the group, in place on backend memory.
static int sum_grad(dp_t *d, float *g, size_t n, char *err) {
#ifdef MARLAAS_CUDA
    if (d->nccl) return dist_nccl_allreduce_sum(d->nccl, g, n, err);
#endif
    if (d->k == kernels_cpu()) return dist_allreduce_sum(d->g, g, n, err);
    float *h = xmalloc(sizeof(float) * (n ? n : 1));
    d->k->to_host(h, g, sizeof(float) * n);
    int rc = dist_allreduce_sum(d->g, h, n, err);
    if (!rc) d->k->to_dev(g, h, sizeof(float) * n);
    free(h);
    return rc;
}

static size_t grad_len(engine_t *e, int slot) {
    lora_t *a = lora_pool_get(engine_pool(e), slot);
    return a ? a->n_params : 0;
}

int dp_pass(dp_t *d, engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, float *const *grads,
            const int *slots, int n_slots, loss_stats_t *stats, int n_stats, char *err) {
    const kernels_t *k = engine_model(e)->k;
    int n_groups = lora_pool_slots(engine_pool(e)) + 1;
    char lerr[ERR_LEN] = "";
    int rc = 0;
    for (int i = 0; i < n_slots && !rc; i++) {
        if (slots[i] < 0 || slots[i] + 1 >= n_groups || !grads[slots[i]] || !lora_pool_get(engine_pool(e), slots[i]) ||
            (!grad_len(e, slots[i]) && !lora_pool_get(engine_pool(e), slots[i])->modelled))
            rc = err_set(lerr, "training pass: slot %d has no adapter or gradient", slots[i]);
        else k->zero(grads[slots[i]], sizeof(float) * grad_len(e, slots[i]));
    }
    if (!d) {
        if (!rc) rc = compute(e, seqs, n, lc, grads, stats, n_stats, lerr);
        return rc ? failc(DP_REFUSED, err, "%s", lerr) : 0;
    }
    if (d->rank == 0) {
        enc_t m;
        pass_encode(&m, seqs, n, lc, slots, n_slots);
        if (bcast(d, &m, err)) return DP_BROKEN;
    }
    // every rank has the whole pass: the same split, the same normaliser
    int *owner = xmalloc(sizeof(int) * (size_t)(n ? n : 1)), *idx = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    engine_train_seq_t *mine = xmalloc(sizeof *mine * (size_t)(n ? n : 1));
    double *sw = xcalloc((size_t)n_groups, sizeof(double));
    loss_stats_t *lst = xcalloc((size_t)n_groups, sizeof *lst);
    int n_mine = 0;
    if (!rc) rc = dp_shard(seqs, n, d->world, owner, lerr);
    for (int i = 0; i < n && !rc; i++) {
        int g = seqs[i].slot + 1;
        if (g < 0 || g >= n_groups) {
            rc = err_set(lerr, "training sequence %d: slot %d outside -1..%d", i, seqs[i].slot, n_groups - 2);
            break;
        }
        for (int t = seqs[i].prefix_len + 1; seqs[i].weight && t < seqs[i].len; t++)
            if (seqs[i].weight[t] > 0.0f) sw[g] += seqs[i].weight[t];
        if (owner[i] != d->rank) continue;
        idx[i] = n_mine;
        mine[n_mine] = seqs[i];
        if (seqs[i].prefix_of) mine[n_mine].prefix_of = idx[seqs[i].prefix_of - 1] + 1;
        n_mine++;
    }
    if (!rc) {
        loss_cfg_t lw = *lc;
        lw.slot_weight = sw;
        lw.n_slot_weight = n_groups;
        rc = compute(e, mine, n_mine, &lw, grads, lst, n_groups, lerr);
    }
    d->passes++;
    d->seqs += n_mine;
    // outcome and statistics first: nothing is summed into the gradients of a refused pass
    size_t nr = 1 + (size_t)N_STAT * (size_t)n_slots;
    float *red = xcalloc(nr, sizeof(float));
    red[0] = rc ? 1.0f : 0.0f;
    for (int i = 0; i < n_slots && !rc; i++) pack_stats(red + 1 + (size_t)N_STAT * i, &lst[slots[i] + 1]);
    int out = 0;
    if (dist_allreduce_sum(d->g, red, nr, err)) out = DP_BROKEN;
    else if (red[0] > 0) {
        if (rc) err_set(err, "%s", lerr);
        else err_set(err, "%.0f rank(s) refused the training pass (see their logs)", red[0]);
        for (int i = 0; i < n_slots; i++)
            if (slots[i] >= 0 && slots[i] + 1 < n_groups && grads[slots[i]])
                k->zero(grads[slots[i]], sizeof(float) * grad_len(e, slots[i]));
        out = DP_REFUSED;
    } else {
        for (int i = 0; i < n_slots && !out; i++)
            if (sum_grad(d, grads[slots[i]], grad_len(e, slots[i]), err)) out = DP_BROKEN;
        for (int i = 0; i < n_slots && !out; i++)
            if (slots[i] + 1 < n_stats) unpack_stats(&stats[slots[i] + 1], red + 1 + (size_t)N_STAT * i);
    }
    d->last = util_now();
    free(red), free(owner), free(idx), free(mine), free(sw), free(lst);
    return out;
}

// --- workers --------------------------------------------------------------------------------------

static int w_load(dp_t *d, const msgpack_object *a, char *err) {
    bool ok = a->via.array.size == 5 && is_uint(&a->via.array.ptr[2]) &&
              a->via.array.ptr[3].type == MSGPACK_OBJECT_BIN && a->via.array.ptr[4].type == MSGPACK_OBJECT_BIN;
    int slot = ok ? (int)a->via.array.ptr[2].via.u64 : -1;
    if (!ok || slot >= d->n_slots) return err_set(err, "malformed load command");
    slot_free(d, slot);
    const model_t *m = engine_model(d->e);
    const msgpack_object_bin *ab = &a->via.array.ptr[3].via.bin, *ob = &a->via.array.ptr[4].via.bin;
    lora_t *ad = lora_deserialize(ab->ptr, ab->size, &m->cfg, d->k, err);
    if (!ad || lora_pool_set(engine_pool(d->e), slot, &ad, err)) {
        lora_destroy(&ad);
        return -1;
    }
    size_t np = lora_pool_get(engine_pool(d->e), slot)->n_params;
    optim_cfg_t oc;
    if (optim_serialized_cfg(ob->ptr, ob->size, &oc, err)) {
        lora_pool_clear(engine_pool(d->e), slot);
        return -1;
    }
    d->opt[slot] = optim_new(&oc, d->k, np);
    d->grad[slot] = d->k->alloc(sizeof(float) * np);
    if (optim_deserialize(d->opt[slot], ob->ptr, ob->size, err)) {
        slot_free(d, slot);
        return -1;
    }
    log_info("data parallelism: rank %d holds slot %d (%zu parameters, optimiser step %lld)", d->rank, slot, np,
             (long long)d->opt[slot]->step);
    return 0;
}

// Decodes a pass into owned arrays (freed by pass_free) and runs it; then the AdamW steps.
static int w_pass(dp_t *d, const msgpack_object *a, char *err) {
    const msgpack_object *f = a->via.array.ptr;
    bool ok = a->via.array.size == 5 && f[2].type == MSGPACK_OBJECT_ARRAY && f[2].via.array.size == 5 &&
              f[3].type == MSGPACK_OBJECT_ARRAY && f[4].type == MSGPACK_OBJECT_ARRAY;
    for (uint32_t i = 0; ok && i < 5; i++) ok = is_num(&f[2].via.array.ptr[i]);
    for (uint32_t i = 0; ok && i < f[3].via.array.size; i++)
        ok = is_uint(&f[3].via.array.ptr[i]) && f[3].via.array.ptr[i].via.u64 < (uint64_t)d->n_slots;
    if (!ok) return failc(DP_BROKEN, err, "rank 0 sent a malformed training pass");
    const msgpack_object *l = f[2].via.array.ptr;
    loss_cfg_t lc = {.kind = (loss_kind_t)num(&l[0]), .temperature = (float)num(&l[1]), .clip_low = (float)num(&l[2]),
                     .clip_high = (float)num(&l[3]), .kl_coef = (float)num(&l[4])};
    int n_slots = (int)f[3].via.array.size, n = (int)f[4].via.array.size;
    int *slots = xmalloc(sizeof(int) * (size_t)(n_slots ? n_slots : 1));
    for (int i = 0; i < n_slots; i++) slots[i] = (int)f[3].via.array.ptr[i].via.u64;
    engine_train_seq_t *seqs = xcalloc((size_t)(n ? n : 1), sizeof *seqs);
    for (int i = 0; i < n && ok; i++) {
        const msgpack_object *s = &f[4].via.array.ptr[i];
        ok = s->type == MSGPACK_OBJECT_ARRAY && s->via.array.size == 8 && s->via.array.ptr[0].type == MSGPACK_OBJECT_BIN;
        const msgpack_object *q = ok ? s->via.array.ptr : NULL;
        for (int j = 3; ok && j < 8; j++) ok = is_num(&q[j]);
        if (!ok) break;
        size_t L = q[0].via.bin.size / sizeof(int32_t);
        seqs[i].len = (int)L;
        seqs[i].tokens = bin_of(&q[0], L, sizeof(int32_t), false, &ok);
        seqs[i].weight = bin_of(&q[1], L, sizeof(float), true, &ok);
        seqs[i].old_logp = bin_of(&q[2], L, sizeof(float), true, &ok);
        seqs[i].advantage = (float)num(&q[3]);
        seqs[i].slot = (int)num(&q[4]);
        seqs[i].on_policy = num(&q[5]) != 0;
        seqs[i].prefix_of = (int)num(&q[6]);
        seqs[i].prefix_len = (int)num(&q[7]);
        ok = ok && L <= (size_t)INT32_MAX && seqs[i].prefix_of >= 0 && seqs[i].prefix_of <= i;
    }
    if (!ok) {
        free(slots), free(seqs);
        return failc(DP_BROKEN, err, "rank 0 sent a malformed training sequence");
    }
    // a bin is not aligned for int32/float: the sequences' arrays are copied out of the message
    void **own = xcalloc((size_t)(3 * n + 1), sizeof(void *));
    for (int i = 0; i < n; i++) {
        const void *src[3] = {seqs[i].tokens, seqs[i].weight, seqs[i].old_logp};
        for (int j = 0; j < 3; j++)
            if (src[j]) {
                own[3 * i + j] = xmalloc(sizeof(float) * (size_t)seqs[i].len);
                memcpy(own[3 * i + j], src[j], sizeof(float) * (size_t)seqs[i].len);
            }
        seqs[i].tokens = own[3 * i], seqs[i].weight = own[3 * i + 1], seqs[i].old_logp = own[3 * i + 2];
    }
    int rc = dp_pass(d, d->e, seqs, n, &lc, d->grad, slots, n_slots, NULL, 0, err);
    if (rc == 0)
        for (int i = 0; i < n_slots; i++) {
            lora_t *ad = lora_pool_get(engine_pool(d->e), slots[i]);
            optim_step(d->opt[slots[i]], ad->params, d->grad[slots[i]]);
        }
    for (int i = 0; i < 3 * n; i++) free(own[i]);
    free(own), free(slots), free(seqs);
    return rc;
}

int dp_serve(dp_t *d, bool (*stopping)(void), char *err) {
    while (!stopping()) {
        void *data = NULL;
        size_t len = 0;
        if (dist_bcast(d->g, &data, &len, err)) return DP_BROKEN;
        d->last = util_now();
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        bool ok = msgpack_unpack_next(&u, data, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len &&
                  u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size >= 2 &&
                  is_uint(&u.data.via.array.ptr[0]) && is_uint(&u.data.via.array.ptr[1]);
        int rc = 0;
        if (!ok || u.data.via.array.ptr[0].via.u64 != DP_VERSION) {
            rc = err_set(err, "rank 0 sent a command this rank cannot read (%s): the ranks run different versions",
                         ok ? "another protocol version" : "malformed");
            rc = DP_BROKEN;
        } else {
            const msgpack_object *a = &u.data;
            int slot;
            char e2[ERR_LEN];
            switch (a->via.array.ptr[1].via.u64) {
            case C_PING:
                if (dist_barrier(d->g, err)) rc = DP_BROKEN;
                break;
            case C_STOP:
                log_info("data parallelism: rank 0 stops; rank %d stops too", d->rank);
                msgpack_unpacked_destroy(&u);
                free(data);
                return 0;
            case C_LOAD: {
                bool failed = w_load(d, a, e2) != 0;
                if (failed) log_error("data parallelism: rank %d could not load an adapter: %s", d->rank, e2);
                if (agree(d, failed, err) < 0) rc = DP_BROKEN;
                break;
            }
            case C_CLEAR:
                slot = a->via.array.size == 3 && is_uint(&a->via.array.ptr[2]) ? (int)a->via.array.ptr[2].via.u64 : -1;
                if (slot >= 0 && slot < d->n_slots) slot_free(d, slot);
                else rc = failc(DP_BROKEN, err, "rank 0 sent a malformed clear command");
                break;
            case C_PASS:
                rc = w_pass(d, a, err);
                if (rc == DP_REFUSED) {
                    log_warn("data parallelism: rank %d: training pass refused: %s", d->rank, err);
                    rc = 0;
                }
                break;
            default:
                rc = failc(DP_BROKEN, err, "rank 0 sent an unknown command: the ranks run different versions");
            }
        }
        msgpack_unpacked_destroy(&u);
        free(data);
        if (rc) return DP_BROKEN;
    }
    return 0;
}

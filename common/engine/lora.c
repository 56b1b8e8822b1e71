// lora.c - LoRA adapters (PEFT layout), the resident pool and multi-LoRA segment GEMMs.
#include "common/engine/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/rng.h"
#include "common/formats/safetensors.h"

void lora_target_dims(const hf_config_t *m, lora_target_t t, int *in, int *out) {
    int D = m->hidden_size, F = m->intermediate_size;
    int Q = m->num_attention_heads * m->head_dim, KVd = m->num_key_value_heads * m->head_dim;
    switch (t) {
    case LORA_Q: *in = D, *out = Q; break;
    case LORA_K: *in = D, *out = KVd; break;
    case LORA_V: *in = D, *out = KVd; break;
    case LORA_O: *in = Q, *out = D; break;
    case LORA_GATE: *in = D, *out = F; break;
    case LORA_UP: *in = D, *out = F; break;
    case LORA_DOWN: *in = F, *out = D; break;
    default: *in = *out = 0;
    }
}

size_t lora_param_count(const hf_config_t *m, const peft_config_t *c) {
    size_t n = 0;
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        if (!(c->targets & (1u << t))) continue;
        int in, out;
        lora_target_dims(m, t, &in, &out);
        n += (size_t)m->num_hidden_layers * c->r * (size_t)(in + out);
    }
    return n;
}

void lora_point(float *A[LORA_N_TARGETS], float *B[LORA_N_TARGETS], float *arena, const hf_config_t *m,
                const peft_config_t *c) {
    float *p = arena;
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        A[t] = B[t] = NULL;
        if (!(c->targets & (1u << t))) continue;
        int in, out;
        lora_target_dims(m, t, &in, &out);
        A[t] = p;
        p += (size_t)m->num_hidden_layers * c->r * in;
        B[t] = p;
        p += (size_t)m->num_hidden_layers * c->r * out;
    }
}

static int validate_cfg(const peft_config_t *c, char *err) {
    if (c->r < 1 || c->r > 4096) return err_set(err, "LoRA rank r=%d out of range (1..4096)", c->r);
    if (!(c->alpha > 0.0f) || !isfinite(c->alpha)) return err_set(err, "LoRA alpha must be a positive number");
    if (!(c->targets & LORA_ALL_TARGETS) || (c->targets & ~LORA_ALL_TARGETS))
        return err_set(err, "LoRA target set is empty or invalid");
    return 0;
}

static lora_t *alloc_adapter(const hf_config_t *m, const peft_config_t *c, const kernels_t *k, char *err) {
    if (validate_cfg(c, err)) return NULL;
    lora_t *a = xcalloc(1, sizeof *a);
    a->cfg = *c;
    a->model = *m;
    a->n_layers = m->num_hidden_layers;
    a->scale = c->alpha / (float)c->r;
    a->k = k;
    a->n_params = lora_param_count(m, c);
    a->params = k->alloc(a->n_params * sizeof(float));
    lora_point(a->A, a->B, a->params, m, c);
    return a;
}

// The initial values of an adapter: A uniform in +-1/sqrt(in) from the seed, B = 0 (host arena).
static void initial_values(float *host, const hf_config_t *m, const peft_config_t *c, uint64_t seed) {
    float *A[LORA_N_TARGETS], *B[LORA_N_TARGETS];
    lora_point(A, B, host, m, c);
    rng_t r;
    rng_seed(&r, seed);
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        if (!A[t]) continue;
        int in, out;
        lora_target_dims(m, t, &in, &out);
        float bound = 1.0f / sqrtf((float)in);
        size_t n = (size_t)m->num_hidden_layers * c->r * in;
        for (size_t i = 0; i < n; i++) A[t][i] = (2.0f * rng_uniform(&r) - 1.0f) * bound;
    }
}

lora_t *lora_new(const hf_config_t *m, const peft_config_t *c, const kernels_t *k, uint64_t seed, char *err) {
    lora_t *a = alloc_adapter(m, c, k, err);
    if (!a) return NULL;
    float *host = xcalloc(a->n_params, sizeof(float));
    initial_values(host, m, c, seed);
    k->to_dev(a->params, host, a->n_params * sizeof(float));
    free(host);
    return a;
}

lora_t *lora_clone(const lora_t *src) {
    lora_t *a = xcalloc(1, sizeof *a);
    *a = *src;
    if (src->modelled) return a;
    a->params = src->k->alloc(a->n_params * sizeof(float));
    src->k->copy(a->params, src->params, a->n_params * sizeof(float));
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        a->A[t] = src->A[t] ? a->params + (src->A[t] - src->params) : NULL;
        a->B[t] = src->B[t] ? a->params + (src->B[t] - src->params) : NULL;
    }
    // the copy follows the clone's own parameters, which its owner may change: made again on demand
    a->params16 = NULL;
    memset(a->A16, 0, sizeof a->A16), memset(a->B16, 0, sizeof a->B16);
    return a;
}

// The bf16 copy of a's parameters (lora_pool_bf16_copies).
static void make_bf16_copy(lora_t *a) {
    if (a->modelled || a->params16 || !a->n_params) return;
    a->params16 = a->k->alloc(a->n_params * sizeof(uint16_t));
    a->k->to_bf16(a->params16, a->params, a->n_params);
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        a->A16[t] = a->A[t] ? a->params16 + (a->A[t] - a->params) : NULL;
        a->B16[t] = a->B[t] ? a->params16 + (a->B[t] - a->params) : NULL;
    }
}

void lora_destroy(lora_t **pa) {
    if (!pa || !*pa) return;
    if ((*pa)->params16) (*pa)->k->free((*pa)->params16);
    (*pa)->k->free((*pa)->params);
    free(*pa);
    *pa = NULL;
}

// --- files --------------------------------------------------------------------------------------

// B is stored (r, out) per layer; PEFT files hold lora_B as (out, r).
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
}

// Copies the in-memory arena `mem` into `peft` with every B transposed to PEFT's (out, r).
static void to_peft_layout(float *peft, const float *mem, const lora_t *a) {
    float *A[LORA_N_TARGETS], *B[LORA_N_TARGETS], *PA[LORA_N_TARGETS], *PB[LORA_N_TARGETS];
    lora_point(A, B, (float *)mem, &a->model, &a->cfg);
    lora_point(PA, PB, peft, &a->model, &a->cfg);
    int r = a->cfg.r;
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        if (!A[t]) continue;
        int in, out;
        lora_target_dims(&a->model, t, &in, &out);
        memcpy(PA[t], A[t], sizeof(float) * (size_t)a->n_layers * r * in);
        for (int l = 0; l < a->n_layers; l++)
            transpose(PB[t] + (size_t)l * out * r, B[t] + (size_t)l * r * out, r, out);
    }
}

// Adds every A/B tensor (host arena `peft`, PEFT layout) to w under its PEFT name.
static void add_tensors(st_writer_t *w, const lora_t *a, float *peft) {
    float *A[LORA_N_TARGETS], *B[LORA_N_TARGETS];
    lora_point(A, B, peft, &a->model, &a->cfg);
    int r = a->cfg.r;
    for (int l = 0; l < a->n_layers; l++) {
        for (int t = 0; t < LORA_N_TARGETS; t++) {
            if (!A[t]) continue;
            int in, out;
            lora_target_dims(&a->model, t, &in, &out);
            char name[256];
            int64_t sa[2] = {r, in}, sb[2] = {out, r};
            peft_tensor_name(name, sizeof name, l, t, 'A');
            st_writer_add_f32(w, name, 2, sa, A[t] + (size_t)l * r * in);
            peft_tensor_name(name, sizeof name, l, t, 'B');
            st_writer_add_f32(w, name, 2, sb, B[t] + (size_t)l * out * r);
        }
    }
}

static int read_tensors(lora_t *a, const st_file_t *f, const hf_config_t *m, char *err) {
    float *host = xcalloc(a->n_params, sizeof(float));
    float *A[LORA_N_TARGETS], *B[LORA_N_TARGETS];
    lora_point(A, B, host, m, &a->cfg);
    int r = a->cfg.r;
    char e2[ERR_LEN];
    float *tmp = NULL;
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        if (!A[t]) continue;
        int in, out;
        lora_target_dims(m, t, &in, &out);
        tmp = xrealloc(tmp, sizeof(float) * (size_t)out * r);
        for (int l = 0; l < a->n_layers; l++) {
            char name[256];
            int64_t sa[2] = {r, in}, sb[2] = {out, r};
            peft_tensor_name(name, sizeof name, l, t, 'A');
            if (st_read_f32(f, name, 2, sa, A[t] + (size_t)l * r * in, e2)) goto fail;
            peft_tensor_name(name, sizeof name, l, t, 'B');
            if (st_read_f32(f, name, 2, sb, tmp, e2)) goto fail;
            transpose(B[t] + (size_t)l * r * out, tmp, out, r);
        }
    }
    a->k->to_dev(a->params, host, a->n_params * sizeof(float));
    free(tmp);
    free(host);
    return 0;
fail:
    free(tmp);
    free(host);
    return err_set(err, "%s", e2);
}

// Host copy of the adapter in PEFT layout (caller frees).
static float *peft_host_copy(const lora_t *a) {
    float *mem = xmalloc(a->n_params * sizeof(float)), *peft = xmalloc(a->n_params * sizeof(float));
    a->k->to_host(mem, a->params, a->n_params * sizeof(float));
    to_peft_layout(peft, mem, a);
    free(mem);
    return peft;
}

int lora_save(const lora_t *a, const char *dir, char *err) {
    char path[4096], e2[ERR_LEN];
    if (a->modelled) return err_set(err, "the adapter of a simulated job has no weights to save");
    if (util_mkdirs(dir, err)) return -1;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (peft_config_save(&a->cfg, path, e2)) return err_set(err, "%s", e2);
    float *host = peft_host_copy(a);
    st_writer_t *w = st_writer_new();
    st_writer_metadata(w, "format", "pt");
    add_tensors(w, a, host);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = st_writer_save(w, path, e2);
    if (rc) err_set(err, "%s", e2);
    st_writer_destroy(&w);
    free(host);
    return rc;
}

lora_t *lora_load(const char *dir, const hf_config_t *m, const kernels_t *k, char *err) {
    char path[4096], e2[ERR_LEN];
    peft_config_t c;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (peft_config_load(&c, path, e2)) {
        err_set(err, "%s", e2);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_file_t *f = st_open(path, e2);
    if (!f) {
        err_set(err, "%s", e2);
        return NULL;
    }
    lora_t *a = alloc_adapter(m, &c, k, err);
    if (a && read_tensors(a, f, m, err)) lora_destroy(&a);
    st_close(&f);
    return a;
}

// The blob of an adapter whose values are `peft` (host, PEFT layout); a's device arena is not read.
static int serialize_host(const lora_t *a, float *peft, uint8_t **buf, size_t *len, char *err) {
    st_writer_t *w = st_writer_new();
    char v[64];
    snprintf(v, sizeof v, "%d", a->cfg.r);
    st_writer_metadata(w, "lora_r", v);
    snprintf(v, sizeof v, "%.9g", a->cfg.alpha);
    st_writer_metadata(w, "lora_alpha", v);
    snprintf(v, sizeof v, "%u", a->cfg.targets);
    st_writer_metadata(w, "lora_targets", v);
    add_tensors(w, a, peft);
    int rc = st_writer_serialize(w, buf, len, err);
    st_writer_destroy(&w);
    return rc;
}

static int modelled_blob(const peft_config_t *c, uint8_t **buf, size_t *len, char *err) {
    st_writer_t *w = st_writer_new();
    char v[64];
    snprintf(v, sizeof v, "%d", c->r);
    st_writer_metadata(w, "lora_r", v);
    snprintf(v, sizeof v, "%.9g", c->alpha);
    st_writer_metadata(w, "lora_alpha", v);
    snprintf(v, sizeof v, "%u", c->targets);
    st_writer_metadata(w, "lora_targets", v);
    st_writer_metadata(w, "marlaas_modelled", "1");
    int rc = st_writer_serialize(w, buf, len, err);
    st_writer_destroy(&w);
    return rc;
}

int lora_modelled_serialize(const hf_config_t *m, const peft_config_t *c, uint8_t **buf, size_t *len, char *err) {
    (void)m;
    if (validate_cfg(c, err)) return -1;
    return modelled_blob(c, buf, len, err);
}

int lora_serialize(const lora_t *a, uint8_t **buf, size_t *len, char *err) {
    if (a->modelled) return modelled_blob(&a->cfg, buf, len, err);
    float *host = peft_host_copy(a);
    int rc = serialize_host(a, host, buf, len, err);
    free(host);
    return rc;
}

int lora_initial_serialize(const hf_config_t *m, const peft_config_t *c, uint64_t seed, uint8_t **buf, size_t *len,
                           char *err) {
    if (validate_cfg(c, err)) return -1;
    // a header only: the values live on the host, so no backend is needed
    lora_t a = {.cfg = *c, .model = *m, .n_layers = m->num_hidden_layers, .n_params = lora_param_count(m, c)};
    float *mem = xcalloc(a.n_params, sizeof(float)), *peft = xmalloc(a.n_params * sizeof(float));
    initial_values(mem, m, c, seed);
    to_peft_layout(peft, mem, &a);
    int rc = serialize_host(&a, peft, buf, len, err);
    free(mem);
    free(peft);
    return rc;
}

lora_t *lora_deserialize(const void *buf, size_t len, const hf_config_t *m, const kernels_t *k, char *err) {
    char e2[ERR_LEN];
    st_file_t *f = st_open_buffer(buf, len, e2);
    if (!f) {
        err_set(err, "adapter blob: %s", e2);
        return NULL;
    }
    lora_t *a = NULL;
    peft_config_t c;
    if (peft_blob_config(f, &c, err)) goto done;
    const char *mod = st_metadata(f, "marlaas_modelled");
    if (mod) {
        if (strcmp(mod, "1") || st_count(f) != 0) {
            err_set(err, "adapter blob: marlaas_modelled '%.8s' with %d tensors (a modelled adapter is \"1\" with none)",
                    mod, st_count(f));
        } else if (!k || strcmp(k->name, "sim") != 0) {   // by name: the scheduler links no backend
            err_set(err, "the adapter is a simulated job's (no weights): only a --backend sim:DEVICE service can use it");
        } else if (!validate_cfg(&c, err)) {
            a = xcalloc(1, sizeof *a);
            *a = (lora_t){.cfg = c, .model = *m, .n_layers = m->num_hidden_layers, .scale = c.alpha / (float)c.r,
                          .k = k, .modelled = true};
        }
        goto done;
    }
    a = alloc_adapter(m, &c, k, err);
    if (a && read_tensors(a, f, m, err)) lora_destroy(&a);
done:
    st_close(&f);
    return a;
}

// --- pool -----------------------------------------------------------------------------------------

struct lora_pool {
    int n_slots;
    lora_t **slot;
    bool bf16_copies;
};

lora_pool_t *lora_pool_new(int n_slots) {
    ASSERT(n_slots > 0);
    lora_pool_t *p = xcalloc(1, sizeof *p);
    p->n_slots = n_slots;
    p->slot = xcalloc((size_t)n_slots, sizeof(lora_t *));
    return p;
}

void lora_pool_destroy(lora_pool_t **pp) {
    if (!pp || !*pp) return;
    for (int i = 0; i < (*pp)->n_slots; i++) lora_destroy(&(*pp)->slot[i]);
    free((*pp)->slot);
    free(*pp);
    *pp = NULL;
}

int lora_pool_slots(const lora_pool_t *p) { return p->n_slots; }

int lora_pool_set(lora_pool_t *p, int slot, lora_t **a, char *err) {
    if (slot < 0 || slot >= p->n_slots) return err_set(err, "adapter slot %d out of range (0..%d)", slot, p->n_slots - 1);
    if (!a || !*a) return err_set(err, "no adapter given for slot %d", slot);
    for (int i = 0; i < p->n_slots; i++) {
        const lora_t *o = p->slot[i];
        if (o && i != slot && (o->n_layers != (*a)->n_layers || o->model.hidden_size != (*a)->model.hidden_size))
            return err_set(err, "adapter for slot %d was made for another base model", slot);
    }
    lora_destroy(&p->slot[slot]);
    p->slot[slot] = *a;
    *a = NULL;
    if (p->bf16_copies) make_bf16_copy(p->slot[slot]);
    return 0;
}

void lora_pool_bf16_copies(lora_pool_t *p, bool on) {
    p->bf16_copies = on;
    for (int i = 0; i < p->n_slots; i++) {
        lora_t *a = p->slot[i];
        if (!a) continue;
        if (on) {
            make_bf16_copy(a);
        } else if (a->params16) {
            a->k->free(a->params16);
            a->params16 = NULL;
            memset(a->A16, 0, sizeof a->A16), memset(a->B16, 0, sizeof a->B16);
        }
    }
}

void lora_pool_clear(lora_pool_t *p, int slot) {
    if (slot >= 0 && slot < p->n_slots) lora_destroy(&p->slot[slot]);
}

lora_t *lora_pool_get(const lora_pool_t *p, int slot) {
    return (slot >= 0 && slot < p->n_slots) ? p->slot[slot] : NULL;
}

// --- plan -----------------------------------------------------------------------------------------

int lora_plan_build(lora_plan_t *plan, const int *row_slot, int n_rows, const lora_pool_t *pool, char *err) {
    plan->n_seg = 0;
    plan->max_rank = 0;
    for (int i = 0; i < n_rows;) {
        int s = row_slot[i], j = i;
        while (j < n_rows && row_slot[j] == s) j++;
        if (s >= 0) {
            const lora_t *a = lora_pool_get(pool, s);
            if (!a) return err_set(err, "row %d uses adapter slot %d, which is empty", i, s);
            if (a->cfg.r > plan->max_rank) plan->max_rank = a->cfg.r;
        }
        if (plan->n_seg == plan->cap) {
            plan->cap = plan->cap ? plan->cap * 2 : 16;
            plan->seg = xrealloc(plan->seg, sizeof(lora_segment_t) * (size_t)plan->cap);
        }
        plan->seg[plan->n_seg++] = (lora_segment_t){.slot = s, .row0 = i, .n_rows = j - i};
        i = j;
    }
    return 0;
}

void lora_plan_free(lora_plan_t *plan) {
    free(plan->seg);
    memset(plan, 0, sizeof *plan);
}

void lora_forward(const kernels_t *k, const lora_plan_t *plan, const lora_pool_t *pool, int layer, lora_target_t t,
                  const float *X, int in, float *Y, int out, float *T, float *scratch) {
    kern_lora_seg_t stack[64], *seg = plan->n_seg <= 64 ? stack : xmalloc(sizeof(kern_lora_seg_t) * (size_t)plan->n_seg);
    int n = 0;
    for (int s = 0; s < plan->n_seg; s++) {
        const lora_segment_t *g = &plan->seg[s];
        const lora_t *a = g->slot >= 0 ? lora_pool_get(pool, g->slot) : NULL;
        if (!a || !a->A[t]) continue;
        int r = a->cfg.r;
        seg[n++] = (kern_lora_seg_t){.row0 = g->row0, .n_rows = g->n_rows, .rank = r, .scale = a->scale,
                                     .A = a->A[t] + (size_t)layer * r * in, .B = a->B[t] + (size_t)layer * r * out};
        // the bf16 copy serves inference only: a forward whose outputs are kept is a training one
        if (a->params16 && !T)
            seg[n - 1].A16 = a->A16[t] + (size_t)layer * r * in, seg[n - 1].B16 = a->B16[t] + (size_t)layer * r * out;
    }
    if (n) {
        // T (N, R): shrink outputs, kept for backward when the caller asks for them.
        float *Ts = T ? T : scratch;
        if (k->lora_apply) {
            k->lora_apply(Y, out, Ts, plan->max_rank, X, in, seg, n);
        } else {
            k->lora_shrink(Ts, plan->max_rank, X, in, seg, n);
            k->lora_expand(Y, out, Ts, plan->max_rank, seg, n);
        }
    }
    if (seg != stack) free(seg);
}

void lora_backward(const kernels_t *k, const lora_plan_t *plan, const lora_pool_t *pool, float *const *grads,
                   int layer, lora_target_t t, const float *X, int in, const float *dY, int out, const float *T,
                   float *dX, float *scratch) {
    int R = plan->max_rank;
    for (int s = 0; s < plan->n_seg; s++) {
        const lora_segment_t *g = &plan->seg[s];
        const lora_t *a = g->slot >= 0 ? lora_pool_get(pool, g->slot) : NULL;
        if (!a || !a->A[t]) continue;
        int r = a->cfg.r, n = g->n_rows;
        const float *A = a->A[t] + (size_t)layer * r * in, *B = a->B[t] + (size_t)layer * r * out;
        const float *Xs = X + (size_t)g->row0 * in, *dYs = dY + (size_t)g->row0 * out, *Ts = T + (size_t)g->row0 * R;
        float *dT = scratch + (size_t)g->row0 * R;
        // dT (n, r) = scale * dY_seg B^T   (B stored (r, out))
        k->gemm(false, true, n, r, out, a->scale, dYs, out, B, out, 0.0f, dT, R);
        float *ga = grads ? grads[g->slot] : NULL;
        if (ga) {
            float *gA[LORA_N_TARGETS], *gB[LORA_N_TARGETS];
            lora_point(gA, gB, ga, &a->model, &a->cfg);
            // dB (r, out) += scale * Ts^T dY_seg ; dA (r, in) += dT^T X_seg
            k->gemm(true, false, r, out, n, a->scale, Ts, R, dYs, out, 1.0f, gB[t] + (size_t)layer * r * out, out);
            k->gemm(true, false, r, in, n, 1.0f, dT, R, Xs, in, 1.0f, gA[t] + (size_t)layer * r * in, in);
        }
        // dX_seg += dT A
        if (dX) k->gemm(false, false, n, in, r, 1.0f, dT, R, A, in, 1.0f, dX + (size_t)g->row0 * in, in);
    }
}

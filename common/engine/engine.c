// engine.c - batched multi-LoRA transformer forward (paged inference / packed training),
// backward, and the CE and RL losses.
//
// Memory (see kernels/kernels.h): every float tensor here (weights, adapters, activations, KV
// pools, logits, gradients, loss values) is BACKEND memory, touched only through the table's
// ops; host code never dereferences it. The host builds the small index arrays (tokens,
// positions, row maps, block tables, LoRA segments) and exchanges exactly these values with the
// backend: engine_step's wanted logits rows (to_host, unless the caller samples them on the
// backend: engine_step_logits), and per loss chunk the log-probs and
// entropies (to_host) and the loss gradients d loss / d logp (to_dev). Rows are gathered with the
// embed op (a row gather by host indices; an exact copy) and scattered with copy over runs of
// contiguous rows. On the CPU backend every transfer is a memcpy, so the CPU path computes
// exactly what it computed when it read these buffers directly.
#include "common/engine/engine.h"
#include "common/engine/loss.h"
#include "common/sim/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Per-layer activations. In inference all layers share one set and the residual stream is
// updated in place (x_in == x_mid == x_out); in training each layer has its own set so the
// backward pass can read them.
typedef struct {
    float *x_in;    // (N, D) residual stream entering the layer
    float *xn1;     // (N, D) rmsnorm(x_in)
    float *rstd1;   // (N)
    float *q;       // (N, H*hd) after RoPE
    float *k;       // (N, KV*hd) after RoPE
    float *q_raw;   // (N, H*hd) q projection before the q norm (qwen3, training only; else NULL)
    float *k_raw;   // (N, KV*hd)
    float *rstdq;   // (N*H) q norm's rstd per head row (training only)
    float *rstdk;   // (N*KV)
    float *v;       // (N, KV*hd)
    float *att;     // (N, H*hd) attention output
    float *lse;     // (N, H) training only
    float *x_mid;   // (N, D) x_in + attention block
    float *xn2;     // (N, D)
    float *rstd2;   // (N)
    float *g;       // (N, F) gate pre-activation
    float *u;       // (N, F)
    float *h;       // (N, F) act(g) * u
    float *T[LORA_N_TARGETS];   // (N, R) LoRA shrink outputs, training only
} acts_t;

// A growable backend buffer.
typedef struct {
    float *p;
    size_t cap;   // floats
} buf_t;

struct engine {
    model_t *m;
    lora_pool_t *pool;
    const kernels_t *k;
    lora_plan_t plan;
    // Host-side per-call index arrays.
    int *order, *row_slot, *row_seq, *seq_row0, *tab_seq;
    int32_t *tok, *pos, *lrow, *ltgt;
    const int **tables;
    float *lw, *lbuf;
    size_t *kvoff;         // (rows) K/V row offsets of a step in the cache's pools
    size_t idx_cap;
    buf_t act, scratch, logits, grad, dxf;
    const float *step_logits;    // engine_step's rows kept in backend memory (logits == NULL)
    sim_t *sim;                  // the simulated backend: steps cost modelled time (engine_set_sim)
    sim_seq_t *sseq;             // (sim_cap) its per-sequence descriptions
    bool sim_defer;              // engine_step counts its modelled time without waiting (sim_defer)
    int sim_cap;
};

static float *buf_get(const kernels_t *k, buf_t *b, size_t n) {
    if (n > b->cap) {
        k->free(b->p);
        b->cap = n + n / 4;
        b->p = k->alloc(b->cap * sizeof(float));
    }
    return b->p;
}

engine_t *engine_new(model_t *model, lora_pool_t *pool, char *err) {
    if (!model || !pool) {
        err_set(err, "engine_new: model and adapter pool are required");
        return NULL;
    }
    engine_t *e = xcalloc(1, sizeof *e);
    e->m = model;
    e->pool = pool;
    e->k = model->k;
    return e;
}

void engine_destroy(engine_t **pe) {
    if (!pe || !*pe) return;
    engine_t *e = *pe;
    lora_plan_free(&e->plan);
    free(e->order), free(e->row_slot), free(e->row_seq), free(e->seq_row0), free(e->tab_seq);
    free(e->tok), free(e->pos), free(e->lrow), free(e->ltgt), free(e->tables), free(e->lw), free(e->lbuf);
    free(e->kvoff);
    e->k->free(e->act.p), e->k->free(e->scratch.p), e->k->free(e->logits.p), e->k->free(e->grad.p);
    e->k->free(e->dxf.p);
    free(e->sseq);
    free(e);
    *pe = NULL;
}

model_t *engine_model(engine_t *e) { return e->m; }

void engine_set_sim(engine_t *e, sim_t *sim) { e->sim = sim; }
sim_t *engine_sim(const engine_t *e) { return e->sim; }
void engine_sim_defer(engine_t *e, bool on) { e->sim_defer = on && e->sim; }

// The simulated backend's description of n sequences (grown as needed).
static sim_seq_t *sim_seqs(engine_t *e, int n) {
    if (n > e->sim_cap) {
        e->sim_cap = n + n / 2 + 16;
        e->sseq = xrealloc(e->sseq, sizeof(sim_seq_t) * (size_t)e->sim_cap);
    }
    return e->sseq;
}

static void sim_adapter(const engine_t *e, int slot, sim_seq_t *q) {
    const lora_t *a = slot >= 0 ? lora_pool_get(e->pool, slot) : NULL;
    q->slot = a ? slot : -1;
    q->rank = a ? a->cfg.r : 0;
    q->targets = a ? a->cfg.targets : 0;
}
lora_pool_t *engine_pool(engine_t *e) { return e->pool; }

// Grows the host index arrays to hold n rows / sequences.
static void ensure_idx(engine_t *e, size_t n) {
    if (n <= e->idx_cap) return;
    size_t c = n + n / 2 + 16;
    e->order = xrealloc(e->order, c * sizeof(int));
    e->row_slot = xrealloc(e->row_slot, c * sizeof(int));
    e->row_seq = xrealloc(e->row_seq, c * sizeof(int));
    e->seq_row0 = xrealloc(e->seq_row0, c * sizeof(int));
    e->tab_seq = xrealloc(e->tab_seq, c * sizeof(int));
    e->tok = xrealloc(e->tok, c * sizeof(int32_t));
    e->pos = xrealloc(e->pos, c * sizeof(int32_t));
    e->lrow = xrealloc(e->lrow, c * sizeof(int32_t));
    e->ltgt = xrealloc(e->ltgt, c * sizeof(int32_t));
    e->tables = xrealloc(e->tables, c * sizeof(int *));
    e->lw = xrealloc(e->lw, c * sizeof(float));
    e->lbuf = xrealloc(e->lbuf, c * 4 * sizeof(float));
    e->kvoff = xrealloc(e->kvoff, c * sizeof(size_t));
    e->idx_cap = c;
}

// Stable order of sequences by slot (-1 first), so each slot's rows end up contiguous.
static void order_by_slot(int *order, const int *slot_of, int n) {
    int k = 0;
    // Insertion sort keeps it stable; batches are at most a few thousand sequences and
    // usually arrive nearly grouped.
    for (int i = 0; i < n; i++) {
        int j = k++;
        while (j > 0 && slot_of[order[j - 1]] > slot_of[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

// --- shared layer pieces -------------------------------------------------------------------------

// Products with a base matrix: layer l's slice (rows, cols) of W (fp32 model) or W16 (bf16 model,
// W is NULL then; see model.h). fp32 runs the very gemm calls of an fp32-only engine.
// Y (N, rows) = X W_l^T + beta Y, X (N, cols).
static void base_fwd(const kernels_t *k, const float *W, const uint16_t *W16, int l, int rows, int cols,
                     const float *X, float beta, float *Y, int N) {
    size_t off = (size_t)l * rows * cols;
    if (W16) k->gemm_bf16w(true, N, rows, cols, 1.0f, X, cols, W16 + off, cols, beta, Y, rows);
    else k->gemm(false, true, N, rows, cols, 1.0f, X, cols, W + off, cols, beta, Y, rows);
}

// dX (N, cols) = dY W_l + beta dX, dY (N, rows).
static void base_bwd(const kernels_t *k, const float *W, const uint16_t *W16, int l, int rows, int cols,
                     const float *dY, float beta, float *dX, int N) {
    size_t off = (size_t)l * rows * cols;
    if (W16) k->gemm_bf16w(false, N, cols, rows, 1.0f, dY, rows, W16 + off, cols, beta, dX, cols);
    else k->gemm(false, false, N, cols, rows, 1.0f, dY, rows, W + off, cols, beta, dX, cols);
}

// Y (N, out) += b (layer l's, or NULL) + LoRA(target t) of X: what follows a base product.
static void bias_lora(engine_t *e, int l, lora_target_t t, const float *X, int in, float *Y, int out, const float *b,
                      float *T, float *scratch, int N) {
    if (b) e->k->add_bias(Y, b + (size_t)l * out, N, out);
    lora_forward(e->k, &e->plan, e->pool, l, t, X, in, Y, out, T, scratch);
}

// Y (N, out) = [beta*Y +] X W^T (+ b) + LoRA(target t); W or W16 as in base_fwd.
static void linear(engine_t *e, int l, lora_target_t t, const float *X, int in, float *Y, int out, const float *W,
                   const uint16_t *W16, const float *b, float beta, float *T, float *scratch, int N) {
    base_fwd(e->k, W, W16, l, out, in, X, beta, Y, N);
    bias_lora(e, l, t, X, in, Y, out, b, T, scratch, N);
}

// One of the products linear_many makes: target t's layer-l matrix (W or W16 as in base_fwd, out
// rows), its bias b (or NULL), into Y (N, out).
typedef struct {
    lora_target_t t;
    float *Y;
    int out;
    const float *W;
    const uint16_t *W16;
    const float *b;
} lin_t;

// linear (beta 0) for n <= KERN_PARTS_MAX targets of one input X (q, k, v; gate, up): the base
// products in one gemm_parts call where the backend has it (the same bits as separate calls),
// then each target's bias and LoRA; T[t] as linear's T.
static void linear_many(engine_t *e, int l, const lin_t *p, int n, const float *X, int in, float *const *T,
                        float *scratch, int N) {
    const kernels_t *k = e->k;
    if (k->gemm_parts && n <= KERN_PARTS_MAX) {
        kern_part_t parts[KERN_PARTS_MAX];
        for (int i = 0; i < n; i++) {
            size_t off = (size_t)l * p[i].out * in;
            parts[i] = (kern_part_t){.W = p[i].W16 ? NULL : p[i].W + off, .W16 = p[i].W16 ? p[i].W16 + off : NULL,
                                     .N = p[i].out, .beta = 0.0f, .C = p[i].Y};
        }
        k->gemm_parts(N, in, X, parts, n);
    } else {
        for (int i = 0; i < n; i++) base_fwd(k, p[i].W, p[i].W16, l, p[i].out, in, X, 0.0f, p[i].Y, N);
    }
    for (int i = 0; i < n; i++) bias_lora(e, l, p[i].t, X, in, p[i].Y, p[i].out, p[i].b, T[p[i].t], scratch, N);
}

typedef struct {
    int N;
    const int32_t *pos;
    // inference
    kvcache_t *kc;
    const kern_paged_attn_t *paged;
    const int *row_kvseq;   // (N) kv seq of each row
    // training
    const kern_packed_attn_t *packed;
} fwd_ctx_t;

// The config's hidden_act as the kernels name it.
static kern_act_t kern_act(const hf_config_t *cf) {
    return cf->hidden_act == HF_ACT_GELU ? KERN_ACT_GELU : cf->hidden_act == HF_ACT_GELU_TANH ? KERN_ACT_GELU_TANH
                                                                                          : KERN_ACT_SILU;
}

static void layer_forward(engine_t *e, int l, acts_t *a, const fwd_ctx_t *c, float *scratch) {
    const kernels_t *k = e->k;
    const hf_config_t *cf = &e->m->cfg;
    const model_weights_t *w = &e->m->w;
    const model_weights16_t *w16 = &e->m->w16;
    int N = c->N, D = cf->hidden_size, F = cf->intermediate_size, H = cf->num_attention_heads, hd = cf->head_dim;
    int KV = cf->num_key_value_heads, Qd = H * hd, KVd = KV * hd;

    k->rmsnorm(a->xn1, a->rstd1, a->x_in, w->attn_norm + (size_t)l * D, N, D, cf->rms_norm_eps);
    // With q/k norms (qwen3) the projections go to q_raw / k_raw (training keeps them for the
    // backward; inference normalises in place: rmsnorm is element-wise after its row sum).
    float *qp = a->q_raw ? a->q_raw : a->q, *kp = a->k_raw ? a->k_raw : a->k;
    const lin_t qkv[3] = {{LORA_Q, qp, Qd, w->wq, w16->wq, w->bq},
                          {LORA_K, kp, KVd, w->wk, w16->wk, w->bk},
                          {LORA_V, a->v, KVd, w->wv, w16->wv, w->bv}};
    linear_many(e, l, qkv, 3, a->xn1, D, a->T, scratch, N);
    if (cf->qk_norm) {
        // Every head's vector is one RMSNorm row of head_dim.
        k->rmsnorm(a->q, a->rstdq, qp, w->q_norm + (size_t)l * hd, N * H, hd, cf->rms_norm_eps);
        k->rmsnorm(a->k, a->rstdk, kp, w->k_norm + (size_t)l * hd, N * KV, hd, cf->rms_norm_eps);
    }
    k->rope(a->q, c->pos, N, H, hd, e->m->rope_cos, e->m->rope_sin, false);
    k->rope(a->k, c->pos, N, KV, hd, e->m->rope_cos, e->m->rope_sin, false);
    if (c->kc) {
        // Append the rows' K/V to the cache: one row scatter per pool (the same offsets in both)
        for (int i = 0; i < N; i++) e->kvoff[i] = kvcache_row_offset(c->kc, c->row_kvseq[i], l, c->pos[i]);
        k->scatter_rows(kvcache_pool(c->kc, false), e->kvoff, a->k, N, KVd);
        k->scatter_rows(kvcache_pool(c->kc, true), e->kvoff, a->v, N, KVd);
        kvcache_view_t v = kvcache_layer_view(c->kc, c->row_kvseq[0], l);
        kern_paged_attn_t pa = *c->paged;
        pa.k_base = v.k;
        pa.v_base = v.v;
        pa.block_stride = v.block_stride;
        pa.block_size = v.block_size;
        k->attn_paged(a->att, a->q, &pa);
    } else {
        k->attn_fwd(a->att, a->lse, a->q, a->k, a->v, c->packed);
    }
    if (a->x_mid != a->x_in) k->copy(a->x_mid, a->x_in, sizeof(float) * (size_t)N * D);
    linear(e, l, LORA_O, a->att, Qd, a->x_mid, D, w->wo, w16->wo, w->bo, 1.0f, a->T[LORA_O], scratch, N);

    k->rmsnorm(a->xn2, a->rstd2, a->x_mid, w->mlp_norm + (size_t)l * D, N, D, cf->rms_norm_eps);
    const lin_t gu[2] = {{LORA_GATE, a->g, F, w->wg, w16->wg, w->bg}, {LORA_UP, a->u, F, w->wu, w16->wu, w->bu}};
    linear_many(e, l, gu, 2, a->xn2, D, a->T, scratch, N);
    k->glu(a->h, a->g, a->u, (size_t)N * F, kern_act(cf));
    // x_out is the next layer's x_in; the caller points it (in place for inference).
}

static void layer_forward_down(engine_t *e, int l, acts_t *a, float *x_out, int N, float *scratch) {
    const hf_config_t *cf = &e->m->cfg;
    int D = cf->hidden_size, F = cf->intermediate_size;
    if (x_out != a->x_mid) e->k->copy(x_out, a->x_mid, sizeof(float) * (size_t)N * D);
    linear(e, l, LORA_DOWN, a->h, F, x_out, D, e->m->w.wd, e->m->w16.wd, e->m->w.bd, 1.0f, a->T[LORA_DOWN], scratch,
           N);
}

// --- inference ----------------------------------------------------------------------------------------

int engine_step(engine_t *e, kvcache_t *kc, const engine_seq_t *seqs, int n, float *logits, char *err) {
    const kernels_t *k = e->k;
    const hf_config_t *cf = &e->m->cfg;
    e->step_logits = NULL;
    if (n <= 0) return err_set(err, "engine_step: empty batch");
    if (kvcache_backend(kc) != k)
        return err_set(err, "engine_step: the KV cache lives in %s backend memory but the model runs on %s "
                       "(make the cache with kvcache_new_on(model->k, ...))", kvcache_backend(kc)->name, k->name);
    int N = 0, need = 0;
    for (int i = 0; i < n; i++) {
        const engine_seq_t *s = &seqs[i];
        if (s->n_tokens < 1 || !s->tokens) return err_set(err, "engine_step: sequence %d has no tokens", i);
        if (s->slot >= 0 && !lora_pool_get(e->pool, s->slot))
            return err_set(err, "engine_step: sequence %d uses adapter slot %d, which is empty", i, s->slot);
        if (s->slot < -1) return err_set(err, "engine_step: sequence %d has invalid slot %d", i, s->slot);
        if (s->slot >= 0 && lora_pool_get(e->pool, s->slot)->k != k)
            return err_set(err, "engine_step: the adapter in slot %d lives in %s backend memory but the model "
                           "runs on %s", s->slot, lora_pool_get(e->pool, s->slot)->k->name, k->name);
        int len = kvcache_seq_len(kc, s->kv_seq);
        if (len + s->n_tokens > e->m->n_pos)
            return err_set(err, "engine_step: sequence %d would reach position %d; the model supports %d%s", i,
                           len + s->n_tokens, e->m->n_pos,
                           e->m->n_pos < cf->max_position_embeddings ? " (its sliding window)" : "");
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= cf->vocab_size)
                return err_set(err, "engine_step: sequence %d token %d = %d is outside the vocabulary (%d)", i, t,
                               s->tokens[t], cf->vocab_size);
        need += kvcache_blocks_needed(kc, s->kv_seq, s->n_tokens);
        N += s->n_tokens;
    }
    if (need > kvcache_free_blocks(kc))
        return err_set(err, "KV cache full: this step needs %d blocks, %d free", need, kvcache_free_blocks(kc));
    for (int i = 0; i < n; i++)
        if (kvcache_reserve(kc, seqs[i].kv_seq, seqs[i].n_tokens, err)) return -1;
    if (e->sim) {
        // nothing is computed: the step lasts its modelled time, the cache advances, no logits
        sim_seq_t *q = sim_seqs(e, n);
        for (int i = 0; i < n; i++) {
            q[i] = (sim_seq_t){.n_new = seqs[i].n_tokens, .past = kvcache_seq_len(kc, seqs[i].kv_seq),
                               .n_logits = seqs[i].logits == ENGINE_LOGITS_LAST ? 1
                                           : seqs[i].logits == ENGINE_LOGITS_ALL ? seqs[i].n_tokens : 0};
            sim_adapter(e, seqs[i].slot, &q[i]);
        }
        double d = sim_cost(e->sim, q, n, SIM_INFER, 0, 0);
        if (e->sim_defer) sim_defer(e->sim, d);
        else sim_wait(e->sim, d);
        for (int i = 0; i < n; i++) kvcache_advance(kc, seqs[i].kv_seq, seqs[i].n_tokens);
        return 0;
    }

    ensure_idx(e, (size_t)(N > n ? N : n));
    int *slot_of = e->tab_seq;
    for (int i = 0; i < n; i++) slot_of[i] = seqs[i].slot;
    order_by_slot(e->order, slot_of, n);
    int row = 0, max_ctx = 0;
    for (int j = 0; j < n; j++) {
        int i = e->order[j];
        const engine_seq_t *s = &seqs[i];
        int p0 = kvcache_seq_len(kc, s->kv_seq);
        e->seq_row0[i] = row;
        e->tables[j] = kvcache_layer_view(kc, s->kv_seq, 0).table;
        for (int t = 0; t < s->n_tokens; t++, row++) {
            e->tok[row] = s->tokens[t];
            e->pos[row] = p0 + t;
            e->row_slot[row] = s->slot;
            e->row_seq[row] = j;      // index into tables
            e->lrow[row] = s->kv_seq; // kv seq per row
        }
        if (p0 + s->n_tokens > max_ctx) max_ctx = p0 + s->n_tokens;
    }
    if (lora_plan_build(&e->plan, e->row_slot, N, e->pool, err)) return -1;

    int D = cf->hidden_size, F = cf->intermediate_size, Qd = cf->num_attention_heads * cf->head_dim;
    int KVd = cf->num_key_value_heads * cf->head_dim, R = e->plan.max_rank;
    size_t per = (size_t)N * (2 * D + 2 + 2 * Qd + 2 * KVd + 3 * F);
    float *p = buf_get(k, &e->act, per);
    acts_t a = {0};
    a.x_in = a.x_mid = p, p += (size_t)N * D;
    a.xn1 = a.xn2 = p, p += (size_t)N * D;
    a.rstd1 = a.rstd2 = p, p += N;
    p += N;
    a.q = p, p += (size_t)N * Qd;
    a.att = p, p += (size_t)N * Qd;
    a.k = p, p += (size_t)N * KVd;
    a.v = p, p += (size_t)N * KVd;
    a.g = p, p += (size_t)N * F;
    a.u = p, p += (size_t)N * F;
    a.h = p, p += (size_t)N * F;
    float *scratch = buf_get(k, &e->scratch, (size_t)N * (R > 0 ? R : 1));

    kern_paged_attn_t pa = {.tables = e->tables, .seq_of = e->row_seq, .pos = e->pos, .n_tokens = N,
                            .n_heads = cf->num_attention_heads, .n_kv_heads = cf->num_key_value_heads,
                            .head_dim = cf->head_dim, .max_ctx = max_ctx};
    fwd_ctx_t c = {.N = N, .pos = e->pos, .kc = kc, .paged = &pa, .row_kvseq = e->lrow};
    k->embed(a.x_in, e->m->w.embed, e->tok, N, D);
    for (int l = 0; l < cf->num_hidden_layers; l++) {
        layer_forward(e, l, &a, &c, scratch);
        layer_forward_down(e, l, &a, a.x_in, N, scratch);
    }
    for (int i = 0; i < n; i++) kvcache_advance(kc, seqs[i].kv_seq, seqs[i].n_tokens);

    // Logits for the wanted rows, in the caller's order: gather, final norm, head GEMM.
    int M = 0;
    for (int i = 0; i < n; i++) {
        const engine_seq_t *s = &seqs[i];
        if (s->logits == ENGINE_LOGITS_LAST) e->lrow[M++] = e->seq_row0[i] + s->n_tokens - 1;
        else if (s->logits == ENGINE_LOGITS_ALL)
            for (int t = 0; t < s->n_tokens; t++) e->lrow[M++] = e->seq_row0[i] + t;
    }
    if (M == 0) return 0;
    // Gather the rows (the embed op is a row gather by host indices: out[r] = table[lrow[r]]).
    float *xg = a.xn1;   // free by now, N*D floats; rmsnorm works in place (element-wise)
    k->embed(xg, a.x_in, e->lrow, M, D);
    k->rmsnorm(xg, NULL, xg, e->m->w.final_norm, M, D, cf->rms_norm_eps);
    // The caller's logits are host memory: the head writes backend memory and the M rows are
    // copied with to_host. Host memory is the CPU backend's memory, so there the head writes the
    // caller's buffer directly (no copy of M * vocab floats on the CPU's decode path).
    size_t V = (size_t)cf->vocab_size;
    float *dl = k == kernels_cpu() && logits ? logits : buf_get(k, &e->logits, (size_t)M * V);
    base_fwd(k, e->m->w.lm_head, e->m->w16.lm_head, 0, cf->vocab_size, D, xg, 0.0f, dl, M);
    e->step_logits = logits ? NULL : dl;
    if (logits && dl != logits) k->to_host(logits, dl, sizeof(float) * (size_t)M * V);
    return 0;
}

const float *engine_step_logits(const engine_t *e) { return e->step_logits; }

// --- training -------------------------------------------------------------------------------------------

static size_t layer_floats(const hf_config_t *cf, int N, int R) {
    int D = cf->hidden_size, F = cf->intermediate_size, H = cf->num_attention_heads;
    int Qd = H * cf->head_dim, KVd = cf->num_key_value_heads * cf->head_dim;
    size_t qkn = cf->qk_norm ? (size_t)Qd + KVd + H + cf->num_key_value_heads : 0;
    return (size_t)N * (4 * (size_t)D + 2 + 2 * (size_t)Qd + 2 * (size_t)KVd + H + 3 * (size_t)F +
                        LORA_N_TARGETS * (size_t)R + qkn);
}

static int validate_train(engine_t *e, const engine_train_seq_t *seqs, int n, char *err) {
    const hf_config_t *cf = &e->m->cfg;
    if (n <= 0) return err_set(err, "empty training batch");
    for (int i = 0; i < n; i++) {
        const engine_train_seq_t *s = &seqs[i];
        if (!s->tokens || s->len < 1) return err_set(err, "training sequence %d is empty", i);
        if (s->len > e->m->n_pos)
            return err_set(err, "training sequence %d has %d tokens; the model supports %d%s", i, s->len, e->m->n_pos,
                           e->m->n_pos < cf->max_position_embeddings ? " (its sliding window)" : "");
        if (s->slot < -1 || (s->slot >= 0 && !lora_pool_get(e->pool, s->slot)))
            return err_set(err, "training sequence %d uses adapter slot %d, which is empty", i, s->slot);
        if (s->slot >= 0 && lora_pool_get(e->pool, s->slot)->k != e->k)
            return err_set(err, "training sequence %d: the adapter in slot %d lives in %s backend memory but the model "
                           "runs on %s", i, s->slot, lora_pool_get(e->pool, s->slot)->k->name, e->k->name);
        for (int t = 0; t < s->len; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= cf->vocab_size)
                return err_set(err, "training sequence %d token %d = %d is outside the vocabulary (%d)", i, t,
                               s->tokens[t], cf->vocab_size);
        if (s->weight)
            for (int t = 1; t < s->len; t++)
                if (!(s->weight[t] >= 0.0f) || !isfinite(s->weight[t]))
                    return err_set(err, "training sequence %d: weight[%d] must be finite and >= 0", i, t);
        if (s->prefix_of == 0) {
            if (s->prefix_len != 0)
                return err_set(err, "training sequence %d: prefix_len %d without a prefix sequence (prefix_of = 0)",
                               i, s->prefix_len);
            continue;
        }
        if (s->prefix_of < 1 || s->prefix_of > i)
            return err_set(err, "training sequence %d: prefix_of %d must name an earlier sequence (1..%d) or be 0", i,
                           s->prefix_of, i);
        int k = s->prefix_of - 1;
        const engine_train_seq_t *p = &seqs[k];
        if (p->prefix_of != 0)
            return err_set(err, "training sequence %d: its prefix sequence %d has a prefix itself (one level only)",
                           i, k);
        if (p->slot != s->slot)
            return err_set(err, "training sequence %d: slot %d differs from the slot %d of its prefix sequence %d", i,
                           s->slot, p->slot, k);
        if (s->prefix_len < 1 || s->prefix_len >= s->len)
            return err_set(err, "training sequence %d: prefix_len %d must be in 1..len-1 (len %d)", i, s->prefix_len,
                           s->len);
        if (s->prefix_len > p->len)
            return err_set(err, "training sequence %d: prefix_len %d exceeds the length %d of its prefix sequence %d",
                           i, s->prefix_len, p->len, k);
        for (int t = 0; t < s->prefix_len; t++)
            if (s->tokens[t] != p->tokens[t])
                return err_set(err, "training sequence %d: token %d differs from its prefix sequence %d", i, t, k);
        if (s->weight)
            for (int t = 1; t <= s->prefix_len; t++)
                if (s->weight[t] != 0.0f)
                    return err_set(err, "training sequence %d: weight[%d] must be 0 within the shared prefix "
                                   "(t <= prefix_len %d)", i, t, s->prefix_len);
    }
    return 0;
}

typedef struct {
    int N, L;
    acts_t *layers;       // (L)
    float *x_out;         // (N, D) final residual stream
    float *rstdf;         // (N)
    float *xf;            // (N, D) final norm output
    kern_packed_attn_t pk;
} train_fwd_t;

// Packed forward over full sequences (grouped by slot), keeping every activation.
static int train_forward(engine_t *e, const engine_train_seq_t *seqs, int n, train_fwd_t *f, char *err) {
    const kernels_t *k = e->k;
    const hf_config_t *cf = &e->m->cfg;
    int L = cf->num_hidden_layers, D = cf->hidden_size, F = cf->intermediate_size, H = cf->num_attention_heads;
    int Qd = H * cf->head_dim, KVd = cf->num_key_value_heads * cf->head_dim;
    // A sequence with a shared prefix has rows for its tokens prefix_len .. len-1 only.
    int N = 0, max_len = 0;
    bool shared = false;
    for (int i = 0; i < n; i++) {
        N += seqs[i].len - seqs[i].prefix_len;
        if (seqs[i].len > max_len) max_len = seqs[i].len;
        shared |= seqs[i].prefix_of != 0;
    }
    ensure_idx(e, (size_t)(N > 4 * n ? N : 4 * n));
    int *slot_of = e->tab_seq;
    for (int i = 0; i < n; i++) slot_of[i] = seqs[i].slot;
    order_by_slot(e->order, slot_of, n);
    // row_seq holds start, len, prefix start and prefix length (n each) of the ordered sequences.
    int *start = e->row_seq, *len = e->row_seq + n, *pre_start = e->row_seq + 2 * n, *pre_len = e->row_seq + 3 * n;
    int row = 0;
    for (int j = 0; j < n; j++) {
        int i = e->order[j], t0 = seqs[i].prefix_len;
        start[j] = row;
        len[j] = seqs[i].len - t0;
        e->seq_row0[i] = row;
        for (int t = t0; t < seqs[i].len; t++, row++) {
            e->tok[row] = seqs[i].tokens[t];
            e->pos[row] = t;
            e->row_slot[row] = seqs[i].slot;
        }
    }
    // A prefixed sequence attends to the first prefix_len rows of its prefix sequence.
    for (int j = 0; shared && j < n; j++) {
        int i = e->order[j];
        pre_len[j] = seqs[i].prefix_len;
        pre_start[j] = seqs[i].prefix_of ? e->seq_row0[seqs[i].prefix_of - 1] : 0;
    }
    if (lora_plan_build(&e->plan, e->row_slot, N, e->pool, err)) return -1;
    int R = e->plan.max_rank;

    float *p = buf_get(k, &e->act, layer_floats(cf, N, R) * L + (size_t)N * (2 * (size_t)D + 1));
    f->N = N;
    f->L = L;
    f->layers = xcalloc((size_t)L, sizeof(acts_t));
    for (int l = 0; l < L; l++) {
        acts_t *a = &f->layers[l];
        a->x_in = p, p += (size_t)N * D;
        a->xn1 = p, p += (size_t)N * D;
        a->rstd1 = p, p += N;
        a->q = p, p += (size_t)N * Qd;
        a->k = p, p += (size_t)N * KVd;
        a->v = p, p += (size_t)N * KVd;
        a->att = p, p += (size_t)N * Qd;
        a->lse = p, p += (size_t)N * H;
        a->x_mid = p, p += (size_t)N * D;
        a->xn2 = p, p += (size_t)N * D;
        a->rstd2 = p, p += N;
        a->g = p, p += (size_t)N * F;
        a->u = p, p += (size_t)N * F;
        a->h = p, p += (size_t)N * F;
        for (int t = 0; t < LORA_N_TARGETS; t++) a->T[t] = p, p += (size_t)N * R;
        if (cf->qk_norm) {
            a->q_raw = p, p += (size_t)N * Qd;
            a->k_raw = p, p += (size_t)N * KVd;
            a->rstdq = p, p += (size_t)N * H;
            a->rstdk = p, p += (size_t)N * cf->num_key_value_heads;
        }
    }
    f->x_out = p, p += (size_t)N * D;
    f->xf = p, p += (size_t)N * D;
    f->rstdf = p;
    float *scratch = buf_get(k, &e->scratch, (size_t)N * (R > 0 ? R : 1));

    f->pk = (kern_packed_attn_t){.start = start, .len = len, .pre_start = shared ? pre_start : NULL,
                                 .pre_len = shared ? pre_len : NULL, .n_seqs = n, .n_tokens = N, .n_heads = H,
                                 .n_kv_heads = cf->num_key_value_heads, .head_dim = cf->head_dim, .max_len = max_len};
    fwd_ctx_t c = {.N = N, .pos = e->pos, .packed = &f->pk};
    k->embed(f->layers[0].x_in, e->m->w.embed, e->tok, N, D);
    for (int l = 0; l < L; l++) {
        layer_forward(e, l, &f->layers[l], &c, scratch);
        layer_forward_down(e, l, &f->layers[l], l + 1 < L ? f->layers[l + 1].x_in : f->x_out, N, scratch);
    }
    k->rmsnorm(f->xf, f->rstdf, f->x_out, e->m->w.final_norm, N, D, cf->rms_norm_eps);
    return 0;
}

// Backward through the layers from dx = dLoss/dx_out (overwritten as it goes).
static void train_backward(engine_t *e, train_fwd_t *f, float *dx, float *model_grads, float *const *lora_grads) {
    const kernels_t *k = e->k;
    const hf_config_t *cf = &e->m->cfg;
    const model_weights_t *w = &e->m->w;
    const model_weights16_t *w16 = &e->m->w16;
    int N = f->N, L = f->L, D = cf->hidden_size, F = cf->intermediate_size, H = cf->num_attention_heads;
    int hd = cf->head_dim, KV = cf->num_key_value_heads, Qd = H * hd, KVd = KV * hd, R = e->plan.max_rank;
    kern_act_t act = kern_act(cf);
    model_weights_t gw = {0};
    if (model_grads) model_point(&gw, model_grads, cf);
    size_t qkn = cf->qk_norm ? (size_t)Qd + KVd : 0;
    size_t need = (size_t)N * (D + 2 * (size_t)Qd + 2 * (size_t)KVd + 3 * (size_t)F + (R > 0 ? R : 1) + qkn);
    float *p = buf_get(k, &e->grad, need);
    float *dxn = p, *dq = (p += (size_t)N * D), *datt = (p += (size_t)N * Qd), *dk = (p += (size_t)N * Qd);
    float *dv = (p += (size_t)N * KVd), *dg = (p += (size_t)N * KVd), *du = (p += (size_t)N * F);
    float *dh = (p += (size_t)N * F), *dT = (p += (size_t)N * F);
    // q/k norms: gradients with respect to the projections' outputs, before the norms.
    float *dq_raw = cf->qk_norm ? (p += (size_t)N * (R > 0 ? R : 1)) : NULL;
    float *dk_raw = cf->qk_norm ? dq_raw + (size_t)N * Qd : NULL;
    const lora_plan_t *pl = &e->plan;
    lora_pool_t *pool = e->pool;
#define WL(base, l, rows, cols) ((base) + (size_t)(l) * (rows) * (cols))
    for (int l = L - 1; l >= 0; l--) {
        acts_t *a = &f->layers[l];
        // MLP: x_out = x_mid + h Wd^T + bd + LoRA_down(h)
        base_bwd(k, w->wd, w16->wd, l, D, F, dx, 0.0f, dh, N);
        if (model_grads) {
            k->gemm(true, false, D, F, N, 1.0f, dx, D, a->h, F, 1.0f, WL(gw.wd, l, D, F), F);
            if (cf->mlp_bias) k->bias_bwd(gw.bd + (size_t)l * D, dx, N, D);
        }
        lora_backward(k, pl, pool, lora_grads, l, LORA_DOWN, a->h, F, dx, D, a->T[LORA_DOWN], dh, dT);
        k->glu_bwd(dg, du, dh, a->g, a->u, (size_t)N * F, act);
        base_bwd(k, w->wg, w16->wg, l, F, D, dg, 0.0f, dxn, N);
        base_bwd(k, w->wu, w16->wu, l, F, D, du, 1.0f, dxn, N);
        if (model_grads) {
            k->gemm(true, false, F, D, N, 1.0f, dg, F, a->xn2, D, 1.0f, WL(gw.wg, l, F, D), D);
            k->gemm(true, false, F, D, N, 1.0f, du, F, a->xn2, D, 1.0f, WL(gw.wu, l, F, D), D);
            if (cf->mlp_bias) {
                k->bias_bwd(gw.bg + (size_t)l * F, dg, N, F);
                k->bias_bwd(gw.bu + (size_t)l * F, du, N, F);
            }
        }
        lora_backward(k, pl, pool, lora_grads, l, LORA_GATE, a->xn2, D, dg, F, a->T[LORA_GATE], dxn, dT);
        lora_backward(k, pl, pool, lora_grads, l, LORA_UP, a->xn2, D, du, F, a->T[LORA_UP], dxn, dT);
        k->rmsnorm_bwd(dx, model_grads ? gw.mlp_norm + (size_t)l * D : NULL, dxn, a->x_mid,
                       w->mlp_norm + (size_t)l * D, a->rstd2, N, D);
        // Attention: x_mid = x_in + att Wo^T + bo + LoRA_o(att)
        base_bwd(k, w->wo, w16->wo, l, D, Qd, dx, 0.0f, datt, N);
        if (model_grads) {
            k->gemm(true, false, D, Qd, N, 1.0f, dx, D, a->att, Qd, 1.0f, WL(gw.wo, l, D, Qd), Qd);
            if (cf->o_bias) k->bias_bwd(gw.bo + (size_t)l * D, dx, N, D);
        }
        lora_backward(k, pl, pool, lora_grads, l, LORA_O, a->att, Qd, dx, D, a->T[LORA_O], datt, dT);
        k->attn_bwd(dq, dk, dv, datt, a->att, a->lse, a->q, a->k, a->v, &f->pk);
        k->rope(dq, e->pos, N, H, hd, e->m->rope_cos, e->m->rope_sin, true);
        k->rope(dk, e->pos, N, KV, hd, e->m->rope_cos, e->m->rope_sin, true);
        float *dqp = dq, *dkp = dk;   // d loss / d (q, k projection outputs)
        if (cf->qk_norm) {
            k->zero(dq_raw, sizeof(float) * (size_t)N * (Qd + KVd));
            k->rmsnorm_bwd(dq_raw, model_grads ? gw.q_norm + (size_t)l * hd : NULL, dq, a->q_raw,
                           w->q_norm + (size_t)l * hd, a->rstdq, N * H, hd);
            k->rmsnorm_bwd(dk_raw, model_grads ? gw.k_norm + (size_t)l * hd : NULL, dk, a->k_raw,
                           w->k_norm + (size_t)l * hd, a->rstdk, N * KV, hd);
            dqp = dq_raw, dkp = dk_raw;
        }
        base_bwd(k, w->wq, w16->wq, l, Qd, D, dqp, 0.0f, dxn, N);
        base_bwd(k, w->wk, w16->wk, l, KVd, D, dkp, 1.0f, dxn, N);
        base_bwd(k, w->wv, w16->wv, l, KVd, D, dv, 1.0f, dxn, N);
        if (model_grads) {
            k->gemm(true, false, Qd, D, N, 1.0f, dqp, Qd, a->xn1, D, 1.0f, WL(gw.wq, l, Qd, D), D);
            k->gemm(true, false, KVd, D, N, 1.0f, dkp, KVd, a->xn1, D, 1.0f, WL(gw.wk, l, KVd, D), D);
            k->gemm(true, false, KVd, D, N, 1.0f, dv, KVd, a->xn1, D, 1.0f, WL(gw.wv, l, KVd, D), D);
            if (cf->qkv_bias) {
                k->bias_bwd(gw.bq + (size_t)l * Qd, dqp, N, Qd);
                k->bias_bwd(gw.bk + (size_t)l * KVd, dkp, N, KVd);
                k->bias_bwd(gw.bv + (size_t)l * KVd, dv, N, KVd);
            }
        }
        lora_backward(k, pl, pool, lora_grads, l, LORA_Q, a->xn1, D, dqp, Qd, a->T[LORA_Q], dxn, dT);
        lora_backward(k, pl, pool, lora_grads, l, LORA_K, a->xn1, D, dkp, KVd, a->T[LORA_K], dxn, dT);
        lora_backward(k, pl, pool, lora_grads, l, LORA_V, a->xn1, D, dv, KVd, a->T[LORA_V], dxn, dT);
        k->rmsnorm_bwd(dx, model_grads ? gw.attn_norm + (size_t)l * D : NULL, dxn, a->x_in,
                       w->attn_norm + (size_t)l * D, a->rstd1, N, D);
    }
#undef WL
    if (model_grads) k->embed_bwd(gw.embed, dx, e->tok, N, D);
}

enum { RUN_TRAIN, RUN_LOGPROBS };

// Shared driver of engine_train and engine_logprobs: forward, chunked head + loss, backward.
// What a run writes: gradients and statistics (RUN_TRAIN), or log-probs and entropies
// (RUN_LOGPROBS). NULL members are not written.
typedef struct {
    float *model_grads;            // full-parameter gradients (fp32 models only)
    float *const *lora_grads;      // per adapter slot
    loss_stats_t *stats;           // per group (slot + 1), n_stats of them
    int n_stats;
    float *const *logp, *const *entropy;   // per sequence, indexed by token
} run_out_t;

// A pass on the simulated backend: its modelled duration, and log-probs that reproduce the
// behaviour ones (SIM_LOGP, what the simulated generator gives every token): ratio 1, no clipping,
// no mismatch, no gradient. The statistics are the real loss's on those log-probs.
static int sim_run(engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, int mode,
                   const run_out_t *o) {
    sim_seq_t *q = sim_seqs(e, n);
    int n_groups = lora_pool_slots(e->pool) + 1, n_adapters = 0;
    double params = 0;
    double *gw = xcalloc((size_t)n_groups, sizeof(double));
    for (int i = 0; i < n; i++) {
        int logits = 0;
        for (int t = seqs[i].prefix_len + 1; t < seqs[i].len; t++)
            if (mode == RUN_LOGPROBS || (seqs[i].weight && seqs[i].weight[t] > 0.0f)) {
                logits++;
                if (mode == RUN_TRAIN) gw[seqs[i].slot + 1] += seqs[i].weight[t];
            }
        q[i] = (sim_seq_t){.n_new = seqs[i].len - seqs[i].prefix_len, .past = seqs[i].prefix_len, .n_logits = logits};
        sim_adapter(e, seqs[i].slot, &q[i]);
        bool first = true;
        for (int j = 0; j < i && first; j++) first = seqs[j].slot != seqs[i].slot;
        if (first && q[i].slot >= 0) {
            const lora_t *a = lora_pool_get(e->pool, q[i].slot);
            n_adapters++;
            params += (double)lora_param_count(&a->model, &a->cfg);
        }
    }
    sim_wait(e->sim, sim_cost(e->sim, q, n, mode == RUN_TRAIN ? SIM_TRAIN : SIM_INFER, mode == RUN_TRAIN ? n_adapters : 0,
                              params));
    loss_stats_t *stats = o->stats ? xcalloc((size_t)n_groups, sizeof(loss_stats_t)) : NULL;
    for (int i = 0; i < n; i++) {
        const engine_train_seq_t *s = &seqs[i];
        for (int t = 0; t < s->len; t++) {
            bool pre = t <= s->prefix_len;
            if (mode == RUN_LOGPROBS) {
                o->logp[i][t] = pre ? 0.0f : SIM_LOGP;
                if (o->entropy && o->entropy[i]) o->entropy[i][t] = pre ? 0.0f : SIM_ENTROPY;
                continue;
            }
            if (pre || !s->weight || !(s->weight[t] > 0.0f) || !stats) continue;
            int g = s->slot + 1;
            double wt = s->weight[t], wn = wt / (lc->slot_weight ? lc->slot_weight[g] : gw[g]);
            float lp = s->old_logp ? s->old_logp[t] : SIM_LOGP;
            loss_token_t tl = loss_token(lc, s, t, lp);
            loss_stats_add(&stats[g], s, t, wn, wt, &tl, lp, SIM_ENTROPY);
        }
    }
    if (stats) {
        loss_stats_finish(stats, n_groups);
        memcpy(o->stats, stats, sizeof(loss_stats_t) * (size_t)(o->n_stats < n_groups ? o->n_stats : n_groups));
    }
    free(stats), free(gw);
    return 0;
}

static int run(engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, int mode, const run_out_t *o,
               char *err) {
    float *model_grads = o->model_grads;
    float *const *lora_grads = o->lora_grads;
    float *const *logp_out = o->logp, *const *ent_out = o->entropy;
    const kernels_t *k = e->k;
    const hf_config_t *cf = &e->m->cfg;
    int D = cf->hidden_size, V = cf->vocab_size, n_groups = lora_pool_slots(e->pool) + 1;
    if (validate_train(e, seqs, n, err)) return -1;
    if (model_grads && e->m->bf16)
        return err_set(err, "full-parameter training needs fp32 weights; this model's matrices are bf16 (model_to_bf16, "
                       "--weights bf16): train LoRA adapters, or load the model with --weights fp32");
    if (mode == RUN_TRAIN && loss_check(lc, seqs, n, err)) return -1;
    if (e->sim) return sim_run(e, seqs, n, lc, mode, o);
    train_fwd_t f = {0};
    if (train_forward(e, seqs, n, &f, err)) return -1;
    int N = f.N;

    // Rows whose logits are needed: hidden row (start + t - 1) predicts tokens[t]; a sequence with
    // a shared prefix has rows from token prefix_len on, so its own rows predict t >= prefix_len + 1.
    int M = 0;
    for (int i = 0; i < n; i++)
        for (int t = seqs[i].prefix_len + 1; t < seqs[i].len; t++)
            if (mode == RUN_LOGPROBS || (seqs[i].weight && seqs[i].weight[t] > 0.0f)) M++;
    int *mseq = xmalloc(sizeof(int) * (size_t)(M + 1)), *mt = xmalloc(sizeof(int) * (size_t)(M + 1));
    int32_t *mrow = xmalloc(sizeof(int32_t) * (size_t)(M + 1)), *mtgt = xmalloc(sizeof(int32_t) * (size_t)(M + 1));
    double *gw = xcalloc((size_t)n_groups, sizeof(double));
    M = 0;
    for (int i = 0; i < n; i++)
        for (int t = seqs[i].prefix_len + 1; t < seqs[i].len; t++)
            if (mode == RUN_LOGPROBS || (seqs[i].weight && seqs[i].weight[t] > 0.0f)) {
                mseq[M] = i, mt[M] = t, mrow[M] = e->seq_row0[i] + t - 1 - seqs[i].prefix_len;
                mtgt[M] = seqs[i].tokens[t];
                if (mode == RUN_TRAIN) gw[seqs[i].slot + 1] += seqs[i].weight[t];
                M++;
            }
    if (mode == RUN_LOGPROBS)
        for (int i = 0; i < n; i++)
            for (int t = 0; t <= seqs[i].prefix_len; t++) {
                logp_out[i][t] = 0.0f;
                if (ent_out && ent_out[i]) ent_out[i][t] = 0.0f;
            }
    loss_stats_t *stats = o->stats ? xcalloc((size_t)n_groups, sizeof(loss_stats_t)) : NULL;
    bool backward = mode == RUN_TRAIN && M > 0;
    float *dxf = NULL;
    if (backward) {
        // (N, D) d loss / d final-norm output, rows without loss stay 0; then (N, D) dx, which
        // rmsnorm_bwd accumulates into.
        dxf = buf_get(k, &e->dxf, (size_t)N * D * 2);
        k->zero(dxf, sizeof(float) * (size_t)N * D * 2);
    }
    model_weights_t gmw = {0};
    if (model_grads) model_point(&gmw, model_grads, cf);
    float T = lc ? lc->temperature : 1.0f;
    if (!(T > 0.0f)) T = 1.0f;
    int CH = (int)((size_t)(4u << 20) / (size_t)V);
    if (CH < 1) CH = 1;
    // Host copies of a chunk's log-probs, entropies (lp, en: 2 * CH, one to_host) and loss
    // gradients (dlp: to_dev); their backend twins sit behind the chunk's logits.
    float *lp = xmalloc(sizeof(float) * (size_t)CH * 2), *dlp = xmalloc(sizeof(float) * (size_t)CH);
    float *buf = buf_get(k, &e->logits, (size_t)CH * (V + 2 * (size_t)D + 3));
    float *logits = buf, *xg = buf + (size_t)CH * V, *dxg = xg + (size_t)CH * D;
    float *lp_d = dxg + (size_t)CH * D, *dlp_d = lp_d + (size_t)CH * 2;
    for (int m0 = 0; m0 < M; m0 += CH) {
        int c = M - m0 < CH ? M - m0 : CH;
        float *en = lp + c, *en_d = lp_d + c;   // lp and en adjacent: one transfer
        k->embed(xg, f.xf, mrow + m0, c, D);    // row gather: xg[r] = xf[mrow[m0 + r]]
        base_fwd(k, e->m->w.lm_head, e->m->w16.lm_head, 0, V, D, xg, 0.0f, logits, c);
        k->token_logprobs(lp_d, en_d, logits, mtgt + m0, c, V, T);
        k->to_host(lp, lp_d, sizeof(float) * (size_t)c * 2);
        if (mode == RUN_LOGPROBS) {
            for (int r = 0; r < c; r++) {
                logp_out[mseq[m0 + r]][mt[m0 + r]] = lp[r];
                if (ent_out && ent_out[mseq[m0 + r]]) ent_out[mseq[m0 + r]][mt[m0 + r]] = en[r];
            }
            continue;
        }
        for (int r = 0; r < c; r++) {
            const engine_train_seq_t *s = &seqs[mseq[m0 + r]];
            int t = mt[m0 + r], g = s->slot + 1;
            double wt = s->weight[t], wn = wt / (lc->slot_weight ? lc->slot_weight[g] : gw[g]);
            loss_token_t tl = loss_token(lc, s, t, lp[r]);
            dlp[r] = (float)(wn * tl.dlogp);
            if (stats) loss_stats_add(&stats[g], s, t, wn, wt, &tl, lp[r], en[r]);
        }
        k->to_dev(dlp_d, dlp, sizeof(float) * (size_t)c);
        k->logprob_bwd(logits, dlp_d, mtgt + m0, c, V, T);
        base_bwd(k, e->m->w.lm_head, e->m->w16.lm_head, 0, V, D, logits, 0.0f, dxg, c);
        // Scatter dxg's rows back to their rows of dxf: one copy per run of consecutive rows (the
        // weighted tokens of a sequence usually form one run).
        for (int r = 0, q; r < c; r = q) {
            for (q = r + 1; q < c && mrow[m0 + q] == mrow[m0 + q - 1] + 1; q++) {
            }
            k->copy(dxf + (size_t)mrow[m0 + r] * D, dxg + (size_t)r * D, sizeof(float) * D * (size_t)(q - r));
        }
        if (model_grads) k->gemm(true, false, V, D, c, 1.0f, logits, V, xg, D, 1.0f, gmw.lm_head, D);
    }
    // lora_grads needs entries only for the slots this batch uses
    bool any_grad = model_grads != NULL;
    for (int g = 0; lora_grads && g < e->plan.n_seg; g++)
        if (e->plan.seg[g].slot >= 0) any_grad |= lora_grads[e->plan.seg[g].slot] != NULL;
    if (backward && any_grad) {
        float *dx = dxf + (size_t)N * D;   // zeroed above
        k->rmsnorm_bwd(dx, model_grads ? gmw.final_norm : NULL, dxf, f.x_out, e->m->w.final_norm, f.rstdf, N, D);
        train_backward(e, &f, dx, model_grads, lora_grads);
    }
    if (stats) {
        loss_stats_finish(stats, n_groups);
        memcpy(o->stats, stats, sizeof(loss_stats_t) * (size_t)(o->n_stats < n_groups ? o->n_stats : n_groups));
    }
    free(stats);
    free(lp), free(dlp), free(mseq), free(mt), free(mrow), free(mtgt), free(gw);
    free(f.layers);
    return 0;
}

int engine_train(engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, float *model_grads,
                 float *const *lora_grads, loss_stats_t *stats, int n_stats, char *err) {
    if (!lc) return err_set(err, "engine_train: loss config required");
    run_out_t o = {.model_grads = model_grads, .lora_grads = lora_grads, .stats = stats, .n_stats = n_stats};
    return run(e, seqs, n, lc, RUN_TRAIN, &o, err);
}

int engine_logprobs(engine_t *e, const engine_train_seq_t *seqs, int n, float temperature, float *const *logp,
                    float *const *entropy, char *err) {
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = temperature};
    run_out_t o = {.logp = logp, .entropy = entropy};
    return run(e, seqs, n, &lc, RUN_LOGPROBS, &o, err);
}

double engine_forward_flops(const model_t *m, double n_tokens, double n_logits, double mean_ctx) {
    const hf_config_t *c = &m->cfg;
    double D = c->hidden_size, F = c->intermediate_size, Qd = (double)c->num_attention_heads * c->head_dim;
    double KVd = (double)c->num_key_value_heads * c->head_dim;
    double per_layer = 2.0 * (D * Qd + 2 * D * KVd + Qd * D + 3 * D * F) + 4.0 * Qd * mean_ctx;
    return n_tokens * c->num_hidden_layers * per_layer + n_logits * 2.0 * D * c->vocab_size;
}

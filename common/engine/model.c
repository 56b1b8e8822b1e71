// model.c - weights of a llama/mistral/qwen2/qwen3 decoder: size table, arena, RoPE tables, HF
// safetensors load (one file or shards) and save.
#include "common/engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/engine/sampler.h"
#include "common/formats/safetensors.h"

// --- size table -------------------------------------------------------------------------------
// Arena order; kinds marked per-layer carry a leading L dimension.
// The kinds after T_HEAD exist only for some architectures; a model without them has the arena of
// the first fifteen kinds alone.
enum {
    T_EMBED, T_ATTN_NORM, T_WQ, T_BQ, T_WK, T_BK, T_WV, T_BV, T_WO, T_MLP_NORM, T_WG, T_WU, T_WD, T_FNORM, T_HEAD,
    T_BO, T_QNORM, T_KNORM, T_BG, T_BU, T_BD
};

// Shape of one layer's slice (or the whole tensor for global kinds): rows, cols (cols=0: 1-D).
static void kind_shape(const hf_config_t *c, int kind, int64_t *rows, int64_t *cols, int *per_layer) {
    int64_t D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t Q = (int64_t)c->num_attention_heads * c->head_dim, KVd = (int64_t)c->num_key_value_heads * c->head_dim;
    int64_t bias = c->qkv_bias ? 1 : 0;
    *per_layer = 1;
    *cols = 0;
    switch (kind) {
    case T_EMBED: *rows = V, *cols = D, *per_layer = 0; break;
    case T_ATTN_NORM: *rows = D; break;
    case T_WQ: *rows = Q, *cols = D; break;
    case T_BQ: *rows = bias * Q; break;
    case T_WK: *rows = KVd, *cols = D; break;
    case T_BK: *rows = bias * KVd; break;
    case T_WV: *rows = KVd, *cols = D; break;
    case T_BV: *rows = bias * KVd; break;
    case T_WO: *rows = D, *cols = Q; break;
    case T_MLP_NORM: *rows = D; break;
    case T_WG: *rows = F, *cols = D; break;
    case T_WU: *rows = F, *cols = D; break;
    case T_WD: *rows = D, *cols = F; break;
    case T_FNORM: *rows = D, *per_layer = 0; break;
    case T_HEAD: *rows = c->tie_word_embeddings ? 0 : V, *cols = D, *per_layer = 0; break;
    case T_BO: *rows = c->o_bias ? D : 0; break;
    case T_QNORM: *rows = c->qk_norm ? c->head_dim : 0; break;
    case T_KNORM: *rows = c->qk_norm ? c->head_dim : 0; break;
    case T_BG: *rows = c->mlp_bias ? F : 0; break;
    case T_BU: *rows = c->mlp_bias ? F : 0; break;
    case T_BD: *rows = c->mlp_bias ? D : 0; break;
    default: *rows = 0;
    }
}

size_t model_param_sizes(const hf_config_t *cfg, size_t sizes[MODEL_N_TENSORS]) {
    size_t total = 0;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        int64_t r, c;
        int pl;
        kind_shape(cfg, i, &r, &c, &pl);
        sizes[i] = (size_t)r * (size_t)(c ? c : 1) * (size_t)(pl ? cfg->num_hidden_layers : 1);
        total += sizes[i];
    }
    return total;
}

void model_point(model_weights_t *w, float *arena, const hf_config_t *cfg) {
    size_t sizes[MODEL_N_TENSORS];
    model_param_sizes(cfg, sizes);
    float **ptrs[MODEL_N_TENSORS] = {&w->embed, &w->attn_norm, &w->wq, &w->bq, &w->wk, &w->bk, &w->wv, &w->bv,
                                     &w->wo, &w->mlp_norm, &w->wg, &w->wu, &w->wd,
                                     &w->final_norm, &w->lm_head, &w->bo, &w->q_norm, &w->k_norm,
                                     &w->bg, &w->bu, &w->bd};
    float *p = arena;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        *ptrs[i] = sizes[i] ? p : NULL;
        p += sizes[i];
    }
    if (cfg->tie_word_embeddings) w->lm_head = w->embed;
}

int model_tensor_name(const hf_config_t *cfg, int kind, int layer, char *buf, size_t n) {
    static const char *layer_names[] = {
        [T_ATTN_NORM] = "input_layernorm.weight", [T_WQ] = "self_attn.q_proj.weight", [T_BQ] = "self_attn.q_proj.bias",
        [T_WK] = "self_attn.k_proj.weight",       [T_BK] = "self_attn.k_proj.bias",   [T_WV] = "self_attn.v_proj.weight",
        [T_BV] = "self_attn.v_proj.bias",         [T_WO] = "self_attn.o_proj.weight", [T_MLP_NORM] = "post_attention_layernorm.weight",
        [T_WG] = "mlp.gate_proj.weight",          [T_WU] = "mlp.up_proj.weight",      [T_WD] = "mlp.down_proj.weight",
        [T_BO] = "self_attn.o_proj.bias",         [T_QNORM] = "self_attn.q_norm.weight",
        [T_KNORM] = "self_attn.k_norm.weight",    [T_BG] = "mlp.gate_proj.bias",      [T_BU] = "mlp.up_proj.bias",
        [T_BD] = "mlp.down_proj.bias",
    };
    int64_t r, c;
    int pl;
    kind_shape(cfg, kind, &r, &c, &pl);
    if (r == 0) return -1;
    if (kind == T_EMBED) snprintf(buf, n, "model.embed_tokens.weight");
    else if (kind == T_FNORM) snprintf(buf, n, "model.norm.weight");
    else if (kind == T_HEAD) snprintf(buf, n, "lm_head.weight");
    else snprintf(buf, n, "model.layers.%d.%s", layer, layer_names[kind]);
    return 0;
}

// --- construction -------------------------------------------------------------------------------

static int validate_config(const hf_config_t *c, char *err) {
    char e2[ERR_LEN];
    if (hf_config_validate(c, e2)) return err_set(err, "model config: %s", e2);
    if (c->num_attention_heads % c->num_key_value_heads)
        return err_set(err, "model config: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                       c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2) return err_set(err, "model config: head_dim (%d) must be even for RoPE", c->head_dim);
    if (!(c->rms_norm_eps > 0.0f) || !(c->rope_theta > 0.0f))
        return err_set(err, "model config: rms_norm_eps and rope_theta must be positive");
    return 0;
}

// --- RoPE -----------------------------------------------------------------------------------------
// Written after transformers' modeling_rope_utils.py: the same operations in the same order, in
// fp32 where torch computes on fp32 tensors (Python scalars enter those as fp32) and in double
// where it computes with Python floats.

static double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

static double yarn_correction_dim(double rotations, int dim, double base, int max_pos) {
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

void model_rope_inv_freq(const hf_config_t *cfg, float *inv, float *attention_factor) {
    const hf_rope_scaling_t *rs = &cfg->rope_scaling;
    int dim = cfg->head_dim, half = dim / 2;
    *attention_factor = 1.0f;
    for (int j = 0; j < half; j++) inv[j] = 1.0f / powf(cfg->rope_theta, (float)(2 * j) / (float)dim);
    switch (rs->type) {
    case HF_ROPE_DEFAULT:
    case HF_ROPE_DYNAMIC:
        break;
    case HF_ROPE_LINEAR:
        for (int j = 0; j < half; j++) inv[j] /= (float)rs->factor;
        break;
    case HF_ROPE_LLAMA3: {
        double old_ctx = rs->original_max_position_embeddings;
        float low_wl = (float)(old_ctx / rs->low_freq_factor), high_wl = (float)(old_ctx / rs->high_freq_factor);
        float f = (float)rs->factor, lo = (float)rs->low_freq_factor;
        float span = (float)(rs->high_freq_factor - rs->low_freq_factor);
        // `scalar / tensor` is torch's Tensor.__rtruediv__: reciprocal(tensor) * scalar.
        for (int j = 0; j < half; j++) {
            float wavelen = (1.0f / inv[j]) * (float)(2 * M_PI);
            float il = wavelen > low_wl ? inv[j] / f : inv[j];
            float smooth = ((1.0f / wavelen) * (float)old_ctx - lo) / span;
            float smoothed = (1.0f - smooth) * il / f + smooth * il;
            bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
            inv[j] = medium ? smoothed : il;
        }
        break;
    }
    case HF_ROPE_YARN: {
        double f = rs->factor, base = (double)cfg->rope_theta;
        int orig = rs->original_max_position_embeddings > 0 ? rs->original_max_position_embeddings
                                                            : cfg->max_position_embeddings;
        double af = rs->attention_factor;
        if (!(af > 0)) {
            if (rs->mscale > 0 && rs->mscale_all_dim > 0) af = yarn_mscale(f, rs->mscale) / yarn_mscale(f, rs->mscale_all_dim);
            else af = yarn_mscale(f, 1.0);
        }
        *attention_factor = (float)af;
        double beta_fast = rs->beta_fast > 0 ? rs->beta_fast : 32, beta_slow = rs->beta_slow > 0 ? rs->beta_slow : 1;
        double low = yarn_correction_dim(beta_fast, dim, base, orig), high = yarn_correction_dim(beta_slow, dim, base, orig);
        if (rs->truncate != 2) low = floor(low), high = ceil(high);
        if (!(low > 0)) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;   // as transformers: no zero-width ramp
        float lo = (float)low, width = (float)(high - low);
        for (int j = 0; j < half; j++) {
            float pos_freq = powf(cfg->rope_theta, (float)(2 * j) / (float)dim);
            float ramp = ((float)j - lo) / width;
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float extrap = 1.0f - ramp;
            float inv_ext = 1.0f / pos_freq, inv_int = 1.0f / ((float)f * pos_freq);
            inv[j] = inv_int * (1.0f - extrap) + inv_ext * extrap;
        }
        break;
    }
    }
}

model_t *model_new(const hf_config_t *cfg, const kernels_t *k, char *err) {
    if (validate_config(cfg, err)) return NULL;
    util_threads_init();
    model_t *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->k = k;
    size_t sizes[MODEL_N_TENSORS];
    m->n_params = m->n_f32 = model_param_sizes(cfg, sizes);
    m->params = k->alloc(m->n_params * sizeof(float));
    model_point(&m->w, m->params, cfg);
    // RoPE tables exactly as Hugging Face builds them: inv_freq in fp32, angle = pos * inv_freq
    // in fp32, cos/sin of that (times yarn's attention factor, in fp32).
    int half = cfg->head_dim / 2, P = hf_config_context(cfg);
    m->n_pos = P;
    float *inv = xmalloc(sizeof(float) * (size_t)half), af;
    model_rope_inv_freq(cfg, inv, &af);
    float *c = xmalloc(sizeof(float) * (size_t)P * half), *s = xmalloc(sizeof(float) * (size_t)P * half);
    for (int j = 0; j < half; j++) {
        for (int p = 0; p < P; p++) {
            float a = (float)p * inv[j];
            c[(size_t)p * half + j] = cosf(a) * af;
            s[(size_t)p * half + j] = sinf(a) * af;
        }
    }
    free(inv);
    m->rope_cos = k->alloc(sizeof(float) * (size_t)P * half);
    m->rope_sin = k->alloc(sizeof(float) * (size_t)P * half);
    k->to_dev(m->rope_cos, c, sizeof(float) * (size_t)P * half);
    k->to_dev(m->rope_sin, s, sizeof(float) * (size_t)P * half);
    free(c);
    free(s);
    return m;
}

model_t *model_shell(const char *dir, const kernels_t *k, bool bf16, char *err) {
    char path[4096];
    hf_config_t cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (hf_config_load(&cfg, path, err) || validate_config(&cfg, err)) return NULL;
    model_t *m = xcalloc(1, sizeof *m);
    m->cfg = cfg;
    m->k = k;
    size_t sizes[MODEL_N_TENSORS];
    m->n_params = model_param_sizes(&cfg, sizes);
    m->bf16 = bf16;
    m->n_pos = hf_config_context(&cfg);
    return m;
}

void model_destroy(model_t **pm) {
    if (!pm || !*pm) return;
    model_t *m = *pm;
    m->k->free(m->params);
    m->k->free(m->params16);
    m->k->free(m->rope_cos);
    m->k->free(m->rope_sin);
    free(m);
    *pm = NULL;
}

// Box-Muller normal from the project RNG (deterministic for a seed).
static float randn(rng_t *r) {
    float u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

void model_init_random(model_t *m, uint64_t seed) {
    ASSERT(!m->bf16);   // the layout below is the fp32 arena's
    const hf_config_t *c = &m->cfg;
    size_t sizes[MODEL_N_TENSORS];
    model_param_sizes(c, sizes);
    float *host = xmalloc(sizeof(float) * m->n_params);
    rng_t r;
    rng_seed(&r, seed);
    float out_scale = 1.0f / sqrtf(2.0f * c->num_hidden_layers);
    size_t off = 0;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        for (size_t j = 0; j < sizes[i]; j++) {
            float v;
            if (i == T_ATTN_NORM || i == T_MLP_NORM || i == T_FNORM || i == T_QNORM || i == T_KNORM) v = 1.0f;
            else if (i == T_BQ || i == T_BK || i == T_BV || i == T_BO || i == T_BG || i == T_BU || i == T_BD) v = 0.0f;
            else v = 0.02f * randn(&r) * ((i == T_WO || i == T_WD) ? out_scale : 1.0f);
            host[off + j] = v;
        }
        off += sizes[i];
    }
    m->k->to_dev(m->params, host, sizeof(float) * m->n_params);
    free(host);
}

// --- bf16 -------------------------------------------------------------------------------------------

static bool kind_is_matrix(int kind) {
    return kind == T_WQ || kind == T_WK || kind == T_WV || kind == T_WO || kind == T_WG || kind == T_WU ||
           kind == T_WD || kind == T_HEAD;
}

int model_to_bf16(model_t *m, char *err) {
    if (m->bf16) return 0;
    const kernels_t *k = m->k;
    const hf_config_t *cf = &m->cfg;
    if (!k->gemm_bf16w || !k->to_bf16)
        return err_set(err, "model_to_bf16: the %s backend has no bf16 ops; keep the model in fp32", k->name);
    size_t sizes[MODEL_N_TENSORS];
    model_param_sizes(cf, sizes);
    // The head as multiplied: lm_head, or a copy of embed when tied (sizes[T_HEAD] is 0 then).
    size_t head = (size_t)cf->vocab_size * (size_t)cf->hidden_size;
    size_t n16 = 0, n32 = 0;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        if (i == T_HEAD) n16 += head;
        else if (kind_is_matrix(i)) n16 += sizes[i];
        else n32 += sizes[i];
    }
    uint16_t *p16 = k->alloc(n16 * sizeof(uint16_t));
    float *p32 = k->alloc(n32 * sizeof(float));
    model_weights_t old = m->w, w = {0};
    model_weights16_t w16 = {0};
    const float *src[MODEL_N_TENSORS] = {old.embed, old.attn_norm, old.wq, old.bq, old.wk, old.bk, old.wv, old.bv,
                                         old.wo, old.mlp_norm, old.wg, old.wu, old.wd, old.final_norm, old.lm_head,
                                         old.bo, old.q_norm, old.k_norm, old.bg, old.bu, old.bd};
    float **dst32[MODEL_N_TENSORS] = {&w.embed, &w.attn_norm, NULL, &w.bq, NULL, &w.bk, NULL, &w.bv,
                                      NULL, &w.mlp_norm, NULL, NULL, NULL, &w.final_norm, NULL,
                                      &w.bo, &w.q_norm, &w.k_norm, &w.bg, &w.bu, &w.bd};
    uint16_t **dst16[MODEL_N_TENSORS] = {[T_WQ] = &w16.wq, [T_WK] = &w16.wk, [T_WV] = &w16.wv, [T_WO] = &w16.wo,
                                         [T_WG] = &w16.wg, [T_WU] = &w16.wu, [T_WD] = &w16.wd,
                                         [T_HEAD] = &w16.lm_head};
    uint16_t *q = p16;
    float *f = p32;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        size_t n = i == T_HEAD ? head : sizes[i];
        if (!n) continue;
        if (kind_is_matrix(i)) {
            k->to_bf16(q, i == T_HEAD && cf->tie_word_embeddings ? old.embed : src[i], n);
            *dst16[i] = q;
            q += n;
        } else {
            k->copy(f, src[i], n * sizeof(float));
            *dst32[i] = f;
            f += n;
        }
    }
    k->free(m->params);   // waits for the conversions queued above
    m->params = p32;
    m->n_f32 = n32;
    m->params16 = p16;
    m->n_bf16 = n16;
    m->w = w;
    m->w16 = w16;
    m->bf16 = true;
    return 0;
}

// --- files ------------------------------------------------------------------------------------------

static void tensor_shape(const hf_config_t *c, int kind, int64_t shape[2], int *ndim) {
    int64_t r, cc;
    int pl;
    kind_shape(c, kind, &r, &cc, &pl);
    shape[0] = r;
    shape[1] = cc;
    *ndim = cc ? 2 : 1;
}

// A tensor of the files that the config does not ask for: refused unless it is one that Hugging Face
// also leaves unused (a stale RoPE buffer, or a tied head's copy of the embedding).
static int check_unused(const st_dir_t *d, const hf_config_t *cfg, const float *embed, const char *name, char *err) {
    size_t n = strlen(name), suffix = strlen(".rotary_emb.inv_freq");
    if (n > suffix && !strcmp(name + n - suffix, ".rotary_emb.inv_freq")) return 0;
    if (cfg->tie_word_embeddings && !strcmp(name, "lm_head.weight")) {
        size_t count = (size_t)cfg->vocab_size * cfg->hidden_size;
        int64_t shape[2] = {cfg->vocab_size, cfg->hidden_size};
        float *head = xmalloc(sizeof(float) * count);
        char e2[ERR_LEN];
        int rc = st_dir_read_f32(d, name, 2, shape, head, e2);
        if (rc) err_set(err, "%s", e2);
        else if (memcmp(head, embed, sizeof(float) * count))
            rc = err_set(err, "%s: lm_head.weight differs from model.embed_tokens.weight, but config.json ties them "
                         "(tie_word_embeddings)", st_dir_source(d));
        free(head);
        return rc;
    }
    return err_set(err, "%s holds tensor %.100s, which config.json (model_type %s) does not use; refused rather than "
                   "dropped", st_dir_source(d), name, cfg->model_type);
}

model_t *model_load(const char *dir, const kernels_t *k, char *err) {
    char path[4096], name[256], e2[ERR_LEN];
    hf_config_t cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (hf_config_load(&cfg, path, e2)) {
        err_set(err, "%s", e2);
        return NULL;
    }
    st_dir_t *d = st_dir_open(dir, e2);
    if (!d) {
        err_set(err, "%s", e2);
        return NULL;
    }
    float *host = NULL;
    bool *used = xcalloc((size_t)st_dir_count(d) + 1, sizeof(bool));
    model_t *m = model_new(&cfg, k, err);
    if (!m) goto fail;
    size_t sizes[MODEL_N_TENSORS];
    model_param_sizes(&cfg, sizes);
    host = xmalloc(sizeof(float) * m->n_params);
    size_t off = 0;
    for (int kind = 0; kind < MODEL_N_TENSORS; kind++) {
        if (!sizes[kind]) continue;
        int64_t shape[2];
        int nd;
        tensor_shape(&cfg, kind, shape, &nd);
        int layers = (kind == T_EMBED || kind == T_FNORM || kind == T_HEAD) ? 1 : cfg.num_hidden_layers;
        size_t per = sizes[kind] / layers;
        for (int l = 0; l < layers; l++) {
            model_tensor_name(&cfg, kind, l, name, sizeof name);
            int at = st_dir_find(d, name);
            if (at >= 0) used[at] = true;
            if (st_dir_read_f32(d, name, nd, shape, host + off + per * l, e2)) {
                err_set(err, "%s", e2);
                goto fail;
            }
        }
        off += sizes[kind];
    }
    for (int i = 0; i < st_dir_count(d); i++)
        if (!used[i] && check_unused(d, &cfg, host, st_dir_tensor(d, i)->name, err)) goto fail;
    k->to_dev(m->params, host, sizeof(float) * m->n_params);
    free(host);
    free(used);
    st_dir_close(&d);
    return m;
fail:
    free(host);
    free(used);
    model_destroy(&m);
    st_dir_close(&d);
    return NULL;
}

int model_save(const model_t *m, const char *dir, char *err) {
    char path[4096], e2[ERR_LEN];
    const hf_config_t *cfg = &m->cfg;
    if (m->bf16)
        return err_set(err, "model_save: this model's matrices are bf16 (model_to_bf16) and their fp32 values are "
                       "gone; save the fp32 model instead (load it without converting)");
    if (util_mkdirs(dir, err)) return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (hf_config_save(cfg, path, e2)) return err_set(err, "%s", e2);
    size_t sizes[MODEL_N_TENSORS];
    model_param_sizes(cfg, sizes);
    float *host = xmalloc(sizeof(float) * m->n_params);
    m->k->to_host(host, m->params, sizeof(float) * m->n_params);
    st_writer_t *w = st_writer_new();
    st_writer_metadata(w, "format", "pt");
    // Names must outlive the writer's add calls only for the call itself (the writer copies names).
    size_t off = 0;
    for (int kind = 0; kind < MODEL_N_TENSORS; kind++) {
        if (!sizes[kind]) continue;
        int64_t shape[2];
        int nd;
        tensor_shape(cfg, kind, shape, &nd);
        int layers = (kind == T_EMBED || kind == T_FNORM || kind == T_HEAD) ? 1 : cfg->num_hidden_layers;
        size_t per = sizes[kind] / layers;
        for (int l = 0; l < layers; l++) {
            char name[256];
            model_tensor_name(cfg, kind, l, name, sizeof name);
            st_writer_add_f32(w, name, nd, shape, host + off + per * l);
        }
        off += sizes[kind];
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_writer_save(w, path, e2);
    if (rc) err_set(err, "%s", e2);
    st_writer_destroy(&w);
    free(host);
    return rc;
}

model_t *model_load_as(const char *dir, const kernels_t *k, bool bf16, char *err) {
    model_t *m = model_load(dir, k, err);
    if (m && bf16 && model_to_bf16(m, err)) model_destroy(&m);
    return m;
}

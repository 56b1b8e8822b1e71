// model.h - decoder weights (llama, mistral, qwen2, qwen3): size table, one arena, RoPE tables,
// load/save in the Hugging Face layout (config.json + model.safetensors, or its shards).
//
// An fp32 model (model_new, model_load) keeps all parameters in ONE arena of backend memory;
// model_weights_t points into it. The same layout serves gradients and AdamW moments
// (model_point() on another arena of n_params floats), so the optimizer walks one flat buffer.
//
// A bf16 model (model_to_bf16) keeps the matrices (wq, wk, wv, wo, wg, wu, wd, lm_head) as bf16
// in a second arena of backend memory (model_weights16_t) and only the vectors (embed, norms,
// biases) in fp32: half the bytes, as the base model of LoRA training needs no fp32 master copy.
// The engine then multiplies with the backend's gemm_bf16w; LoRA adapters, their gradients and
// optimizer state stay fp32, and full-parameter training is refused (it needs fp32 weights).
#ifndef MARLAAS_MODEL_H
#define MARLAAS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/formats/hfconfig.h"
#include "kernels/kernels.h"

typedef struct {
    float *embed;        // (V, D)
    float *attn_norm;    // (L, D)
    float *wq;           // (L, H*hd, D)
    float *bq;           // (L, H*hd)    NULL without qkv bias
    float *wk;           // (L, KV*hd, D)
    float *bk;           // (L, KV*hd)
    float *wv;           // (L, KV*hd, D)
    float *bv;           // (L, KV*hd)
    float *wo;           // (L, D, H*hd)
    float *mlp_norm;     // (L, D)
    float *wg;           // (L, F, D)
    float *wu;           // (L, F, D)
    float *wd;           // (L, D, F)
    float *final_norm;   // (D)
    float *lm_head;      // (V, D)   == embed when tie_word_embeddings
    // Kinds of some architectures only (NULL otherwise), after the head so that the arena of a
    // model without them is laid out as before.
    float *bo;           // (L, D)    o_proj bias (llama/qwen3 attention_bias)
    float *q_norm;       // (L, hd)   qwen3: RMSNorm weight of every query head
    float *k_norm;       // (L, hd)   qwen3: RMSNorm weight of every key head
    float *bg;           // (L, F)    gate_proj bias (llama mlp_bias)
    float *bu;           // (L, F)    up_proj bias
    float *bd;           // (L, D)    down_proj bias
} model_weights_t;

#define MODEL_N_TENSORS 21

// The matrices of a bf16 model: bf16 bit patterns (uint16_t, see kernels.h to_bf16), shapes as in
// model_weights_t.
typedef struct {
    uint16_t *wq;        // (L, H*hd, D)
    uint16_t *wk;        // (L, KV*hd, D)
    uint16_t *wv;        // (L, KV*hd, D)
    uint16_t *wo;        // (L, D, H*hd)
    uint16_t *wg;        // (L, F, D)
    uint16_t *wu;        // (L, F, D)
    uint16_t *wd;        // (L, D, F)
    uint16_t *lm_head;   // (V, D)   a bf16 copy of embed when tie_word_embeddings
} model_weights16_t;

typedef struct {
    hf_config_t cfg;
    const kernels_t *k;
    size_t n_params;         // parameters of the model (the layout of model_param_sizes), either precision
    bool bf16;               // matrices in bf16 (model_to_bf16)
    // fp32: params holds all n_params floats and w points into it (lm_head == embed when tied).
    // bf16: params holds only embed, the norms and the biases (n_f32 floats, in arena order); w's
    // matrix pointers and lm_head are NULL, and w16 points into params16 (n_bf16 values: the
    // matrices, plus a V*D head copy of embed when tied).
    float *params;           // fp32 arena of n_f32 floats (backend memory)
    size_t n_f32;
    model_weights_t w;       // pointers into params
    uint16_t *params16;      // bf16 arena of n_bf16 values (backend memory); NULL for an fp32 model
    size_t n_bf16;
    model_weights16_t w16;   // pointers into params16 (all NULL for an fp32 model)
    int n_pos;               // rows of the RoPE tables: hf_config_context(&cfg)
    float *rope_cos;         // (n_pos, hd/2) backend memory: cos(pos * inv_freq) * attention factor
    float *rope_sin;         // (n_pos, hd/2)
} model_t;

// Sizes (in floats) of the MODEL_N_TENSORS tensors in arena order; returns the total.
size_t model_param_sizes(const hf_config_t *cfg, size_t sizes[MODEL_N_TENSORS]);
// Points w into an arena laid out by model_param_sizes (lm_head aliases embed when tied).
void model_point(model_weights_t *w, float *arena, const hf_config_t *cfg);

// RoPE as Hugging Face's modeling_rope_utils.py computes it for cfg->rope_scaling: inv_freq
// (head_dim/2 floats, fp32 arithmetic in torch's order) and the factor that scales cos and sin
// (yarn's attention factor; 1 otherwise). default: 1 / theta^(2j/hd); linear: divided by factor;
// llama3: wavelengths above original_max / low_freq_factor divided by factor, below
// original_max / high_freq_factor kept, smoothly interpolated between; yarn: the ramp between
// interpolated (1/(factor*freq)) and extrapolated frequencies over the correction range of
// beta_fast/beta_slow rotations in original_max_position_embeddings (default max_position_embeddings),
// floor/ceil unless truncate is false, attention factor attention_factor or
// get_mscale(factor, mscale)/get_mscale(factor, mscale_all_dim) or 0.1 ln(factor) + 1; dynamic:
// the default frequencies, which is what Hugging Face uses for every sequence up to
// max_position_embeddings (it recomputes them only beyond, where the engine refuses to go).
void model_rope_inv_freq(const hf_config_t *cfg, float *inv_freq, float *attention_factor);

// A model with the given config and zeroed weights. Validates the config (hf_config_validate).
model_t *model_new(const hf_config_t *cfg, const kernels_t *k, char *err);
// Initialises weights randomly (normal(0, 0.02) for matrices, 1 for norms (q/k norms too), 0 for biases;
// the output projections wo and wd scaled by 1/sqrt(2L)), deterministic for a seed. fp32 models
// only (aborts on a bf16 one: initialise, then convert).
void model_init_random(model_t *m, uint64_t seed);
// Loads DIR/config.json + DIR/model.safetensors or the shards of DIR/model.safetensors.index.json
// (safetensors.h st_dir_open; F32, F16 or BF16, converted to fp32): an fp32 model. Every tensor
// of the files must be one the config asks for, except `*.rotary_emb.inv_freq` (recomputed, as
// Hugging Face does) and, for a tied head, an `lm_head.weight` equal to the embedding; anything
// else is refused with its name (a bias or norm the config does not have would otherwise be
// dropped silently). model_to_bf16 afterwards for a bf16 one.
model_t *model_load(const char *dir, const kernels_t *k, char *err);
// Converts an fp32 model to a bf16 one in place (see the top of this file): the matrices are
// rounded to bf16 (nearest even, the backend's to_bf16) into a new bf16 arena, the vectors move
// to a smaller fp32 arena, and the full fp32 arena is freed. The fp32 matrix values are gone
// afterwards. While converting, the old arena and both new ones are allocated (about 1.5x the
// fp32 model's bytes at the peak). Returns 0 (also for a model already in bf16), or -1 + err
// when the backend has no bf16 ops.
int model_to_bf16(model_t *m, char *err);
// model_load, then model_to_bf16 when bf16 (the services' --weights). NULL + err.
model_t *model_load_as(const char *dir, const kernels_t *k, bool bf16, char *err);
// Writes DIR/config.json + DIR/model.safetensors (F32, Hugging Face tensor names). An fp32 model
// only: a bf16 model is refused (-1 + err), as its fp32 matrices no longer exist.
int model_save(const model_t *m, const char *dir, char *err);
void model_destroy(model_t **m);
// The model of DIR/config.json without weights (params, params16 and the RoPE tables NULL;
// n_params and bf16 as a loaded model's): what the simulated backend's engine needs (engine.h
// engine_set_sim). Nothing may compute with it.
model_t *model_shell(const char *dir, const kernels_t *k, bool bf16, char *err);

// Hugging Face name of tensor kind `kind` (index into the arena order) at layer l.
// Returns 0, or -1 when the kind does not exist for this config (e.g. biases without qkv_bias).
// Kinds in arena order: embed, attn_norm, wq, bq, wk, bk, wv, bv, wo, mlp_norm, wg, wu, wd,
// final_norm, lm_head, bo, q_norm, k_norm, bg, bu, bd (MODEL_N_TENSORS).
int model_tensor_name(const hf_config_t *cfg, int kind, int layer, char *buf, size_t n);

#endif

// model.h - Llama-family decoder weights: size table, one arena, load/save in the Hugging Face
// layout (config.json + model.safetensors).
//
// All parameters live in ONE arena of backend memory; model_weights_t points into it. The same
// layout serves gradients and AdamW moments (model_point() on another arena of n_params
// floats), so the optimizer walks one flat buffer.
#ifndef MARLAAS_MODEL_H
#define MARLAAS_MODEL_H

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
} model_weights_t;

#define MODEL_N_TENSORS 15

typedef struct {
    hf_config_t cfg;
    const kernels_t *k;
    float *params;           // arena of n_params floats (backend memory)
    size_t n_params;
    model_weights_t w;       // pointers into params
    float *rope_cos;         // (max_pos, hd/2) backend memory
    float *rope_sin;         // (max_pos, hd/2)
} model_t;

// Sizes (in floats) of the MODEL_N_TENSORS tensors in arena order; returns the total.
size_t model_param_sizes(const hf_config_t *cfg, size_t sizes[MODEL_N_TENSORS]);
// Points w into an arena laid out by model_param_sizes (lm_head aliases embed when tied).
void model_point(model_weights_t *w, float *arena, const hf_config_t *cfg);

// A model with the given config and zeroed weights. Validates the config.
model_t *model_new(const hf_config_t *cfg, const kernels_t *k, char *err);
// Initialises weights randomly (normal(0, 0.02) for matrices, 1 for norms, 0 for biases;
// the output projections wo and wd scaled by 1/sqrt(2L)), deterministic for a seed.
void model_init_random(model_t *m, uint64_t seed);
// Loads DIR/config.json + DIR/model.safetensors (F32, F16 or BF16; converted to fp32).
model_t *model_load(const char *dir, const kernels_t *k, char *err);
// Writes DIR/config.json + DIR/model.safetensors (F32, Hugging Face tensor names).
int model_save(const model_t *m, const char *dir, char *err);
void model_destroy(model_t **m);

// Hugging Face name of tensor kind `kind` (index into the arena order) at layer l.
// Returns 0, or -1 when the kind does not exist for this config (e.g. biases without qkv_bias).
int model_tensor_name(const hf_config_t *cfg, int kind, int layer, char *buf, size_t n);

#endif

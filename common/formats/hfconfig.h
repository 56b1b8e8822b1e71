// hfconfig.h - the Hugging Face `config.json` of a Llama-family model (Llama, Qwen2, Mistral).
#ifndef MARLAAS_HFCONFIG_H
#define MARLAAS_HFCONFIG_H

#include <stdbool.h>

#include "common/util/util.h"

typedef struct {
    char model_type[32];          // "llama" or "qwen2" (written back as read)
    int hidden_size;              // D
    int intermediate_size;        // F
    int num_hidden_layers;        // L
    int num_attention_heads;      // H
    int num_key_value_heads;      // KV (defaults to H when absent)
    int head_dim;                 // hidden_size / H unless "head_dim" is given
    int vocab_size;               // V
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;             // default 10000
    bool tie_word_embeddings;     // default false
    bool qkv_bias;                // Qwen2 (model_type "qwen2") has q/k/v biases; "attention_bias" for llama
    int bos_token_id;             // -1 when absent
    int eos_token_id;             // -1 when absent (first of a list)
} hf_config_t;

// Parses config.json text. Missing required fields, wrong types, non-positive sizes,
// H not divisible by KV, or hidden_size not divisible by H (without head_dim) are errors
// naming the field. Returns 0 or -1.
int hf_config_parse(hf_config_t *cfg, const char *json, char *err);
int hf_config_load(hf_config_t *cfg, const char *path, char *err);
// Writes config.json (with "architectures", "model_type", "torch_dtype": "float32").
int hf_config_save(const hf_config_t *cfg, const char *path, char *err);

#endif

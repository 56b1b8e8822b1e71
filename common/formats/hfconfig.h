// hfconfig.h - the Hugging Face `config.json` of the decoder families this engine computes
// (model_type llama, mistral, qwen2, qwen3) and the `generation_config.json` beside it.
//
// config.json is read strictly. Every key is one of:
//   - understood for its model_type (the table in hfconfig.c): it sets a field below, and a value
//     the engine does not compute is refused with the key's name (a rope_scaling type other than
//     default/linear/dynamic/llama3/yarn, hidden_act other than silu/gelu/gelu_pytorch_tanh,
//     attention_dropout != 0, pretraining_tp != 1, use_mrope or rope_interleaved true, ...);
//   - informational (metadata that changes no computation: torch_dtype, transformers_version,
//     _name_or_path, use_cache, initializer_range, ...), ignored on purpose;
//   - anything else is refused with its name, because it could change what the model computes
//     (a key the model type's Hugging Face code does not read counts as unknown too).
// Absent keys take the Hugging Face config class's default for the model type (max_position_embeddings
// 2048 for llama, 131072 for mistral, 32768 for qwen2/qwen3; head_dim 128 for qwen3, else
// hidden_size / num_attention_heads; mistral's sliding_window 4096), except the token ids, which
// are absent (-1) rather than the class defaults. JSON null is the same as absent, except for
// sliding_window, where null means "no window".
#ifndef MARLAAS_HFCONFIG_H
#define MARLAAS_HFCONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/util/util.h"

#define HF_MAX_EOS 8

// The MLP's gate activation (hidden_act): silu ("swish" too), gelu (exact, with erf),
// gelu_pytorch_tanh ("gelu_new" too: the same tanh approximation).
typedef enum { HF_ACT_SILU = 0, HF_ACT_GELU = 1, HF_ACT_GELU_TANH = 2 } hf_act_t;

typedef enum { HF_ROPE_DEFAULT = 0, HF_ROPE_LINEAR, HF_ROPE_DYNAMIC, HF_ROPE_LLAMA3, HF_ROPE_YARN } hf_rope_type_t;

// rope_scaling (or transformers 5's rope_parameters) as Hugging Face's modeling_rope_utils.py reads
// it. Optional values are 0 when absent (HF treats 0 like absent for beta_fast, beta_slow, mscale
// and mscale_all_dim: `x or default`); model.h's model_rope_inv_freq computes the frequencies.
typedef struct {
    hf_rope_type_t type;
    double factor;                        // linear, dynamic, llama3, yarn (required, > 0)
    int original_max_position_embeddings; // llama3 (required); yarn (optional); dynamic (read, unused as in HF)
    double low_freq_factor;               // llama3 (required)
    double high_freq_factor;              // llama3 (required, > low_freq_factor)
    double beta_fast, beta_slow;          // yarn: 0 = absent (32, 1)
    double mscale, mscale_all_dim;        // yarn: 0 = absent
    double attention_factor;              // yarn: 0 = absent (derived from factor, mscale, mscale_all_dim)
    int truncate;                         // yarn: 0 absent (true), 1 true, 2 false
} hf_rope_scaling_t;

typedef struct {
    char model_type[32];          // "llama", "mistral", "qwen2" or "qwen3" (written back as read)
    int hidden_size;              // D
    int intermediate_size;        // F
    int num_hidden_layers;        // L
    int num_attention_heads;      // H
    int num_key_value_heads;      // KV (defaults to H when absent)
    int head_dim;                 // hidden_size / H unless "head_dim" is given (qwen3: 128)
    int vocab_size;               // V
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;             // default 10000
    bool tie_word_embeddings;     // default false
    bool qkv_bias;                // q/k/v projection biases: qwen2 always; llama and qwen3 with attention_bias
    bool o_bias;                  // o_proj bias: llama and qwen3 with attention_bias (never qwen2)
    bool mlp_bias;                // gate/up/down biases: llama's mlp_bias
    bool qk_norm;                 // qwen3: RMSNorm (weight of head_dim) on every head of q and k before RoPE
    hf_act_t hidden_act;          // default silu
    hf_rope_scaling_t rope_scaling;   // type HF_ROPE_DEFAULT when absent
    int sliding_window;           // as config.json gives it; 0 = none (null)
    bool use_sliding_window;      // qwen2/qwen3: the window applies only when true
    int max_window_layers;        // qwen2/qwen3: layers >= this one slide (default 28)
    int bos_token_id;             // -1 when absent
    int pad_token_id;             // -1 when absent (read and checked; the engine pads nothing, save omits it)
    int eos_token_id;             // -1 when absent; the first of eos_token_ids
    int n_eos;                    // entries of eos_token_ids (0: only eos_token_id, e.g. set by code)
    int eos_token_ids[HF_MAX_EOS];   // every end-of-sequence id config.json lists (an integer or a list)
} hf_config_t;

// Parses config.json text (strict: see the top of this file). Missing required fields, wrong
// types, non-positive sizes, H not divisible by KV, hidden_size not divisible by H (without
// head_dim), unsupported keys or values are errors naming the key. Returns 0 or -1.
int hf_config_parse(hf_config_t *cfg, const char *json, char *err);
int hf_config_load(hf_config_t *cfg, const char *path, char *err);
// Writes config.json (with "architectures", "model_type", "torch_dtype": "float32", and exactly
// the keys its model type reads, so that hf_config_load reads back the same config; pad_token_id,
// which configs built in code leave at 0, is not written).
int hf_config_save(const hf_config_t *cfg, const char *path, char *err);
// Checks a config built in code as hf_config_parse checks a file: sizes, a known model_type, and
// feature combinations the model type can express (llama/qwen3: q/k/v and o biases together;
// qwen2: q/k/v biases, no o bias; mlp_bias only for llama; q/k norms exactly for qwen3).
int hf_config_validate(const hf_config_t *cfg, char *err);

// Layers whose attention slides (mistral: every layer when sliding_window is set; qwen2/qwen3:
// layers >= max_window_layers when use_sliding_window and sliding_window are set).
int hf_config_sliding_layers(const hf_config_t *cfg);
// The positions the engine computes exactly as Hugging Face does: max_position_embeddings, or the
// sliding window when a layer slides and the window is smaller (within the window a sliding layer
// attends to every earlier token, so its attention equals full causal attention; longer
// sequences are refused, not computed with a window).
int hf_config_context(const hf_config_t *cfg);
// The end-of-sequence ids: eos_token_ids, or eos_token_id alone when n_eos is 0 and it is set.
// Writes at most max ids; returns how many.
int hf_config_eos(const hf_config_t *cfg, int32_t *ids, int max);
const char *hf_act_name(hf_act_t a);
const char *hf_rope_type_name(hf_rope_type_t t);

// --- generation_config.json -------------------------------------------------------------------
// The generation defaults of a model folder, exposed for callers that fill in what a request does
// not say (Hugging Face semantics: do_sample false means greedy whatever the temperature; the
// eos ids all stop generation). Nothing is applied here. Keys that would change sampling but
// have no counterpart in this engine (repetition_penalty, num_beams, min_p, ...) are listed in
// `unsupported` ("repetition_penalty=1.1, num_beams=4"; "" when none): a caller that applies these
// defaults must refuse or report them. Metadata (transformers_version, _from_model_config, ...) is
// ignored on purpose.
typedef struct {
    int n_eos;
    int eos_token_ids[HF_MAX_EOS];
    int bos_token_id, pad_token_id;   // -1 when absent
    bool has_do_sample, do_sample;
    bool has_temperature;
    float temperature;
    bool has_top_p;
    float top_p;
    bool has_top_k;
    int top_k;
    bool has_max_new_tokens;
    int max_new_tokens;
    char unsupported[512];
} hf_generation_config_t;

int hf_generation_config_parse(hf_generation_config_t *g, const char *json, char *err);
// Loads PATH. Returns 0, 1 when the file does not exist (g then holds no settings: every has_ false,
// no ids), or -1 + err (unreadable, malformed).
int hf_generation_config_load(hf_generation_config_t *g, const char *path, char *err);

#endif

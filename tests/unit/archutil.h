// archutil.h - tiny configs of the architecture variants (biases, q/k norms, activations, RoPE
// scalings, sliding windows) and random models of them, shared by the unit tests of these features.
#ifndef MARLAAS_ARCHUTIL_H
#define MARLAAS_ARCHUTIL_H

#include "testutil.h"

enum { AU_LLAMA_BIAS_GELU, AU_QWEN3_YARN, AU_LLAMA3_TANH, AU_MISTRAL_WINDOW, AU_QWEN2_DYNAMIC, AU_N_VARIANTS };

static inline const char *au_name(int v) {
    static const char *const names[] = {"llama+biases+gelu", "qwen3+qk_norm+head_dim+bias+yarn",
                                        "llama+llama3 rope+gelu_tanh+mlp_bias", "mistral+window+linear rope",
                                        "qwen2+dynamic rope"};
    return names[v];
}

// Variant v at the given sizes (D hidden, F intermediate, H heads, KV heads, hd head_dim, V vocab).
static inline hf_config_t au_config(int v, int D, int F, int H, int KV, int hd, int V) {
    hf_config_t c;
    memset(&c, 0, sizeof c);
    c.hidden_size = D, c.intermediate_size = F, c.num_hidden_layers = 2, c.num_attention_heads = H;
    c.num_key_value_heads = KV, c.head_dim = hd, c.vocab_size = V, c.max_position_embeddings = 128;
    c.rms_norm_eps = 1e-6f, c.rope_theta = 10000.0f, c.bos_token_id = -1, c.pad_token_id = -1, c.eos_token_id = 2;
    switch (v) {
    case AU_LLAMA_BIAS_GELU:
        snprintf(c.model_type, sizeof c.model_type, "llama");
        c.qkv_bias = c.o_bias = c.mlp_bias = true;
        c.hidden_act = HF_ACT_GELU;
        break;
    case AU_QWEN3_YARN:
        snprintf(c.model_type, sizeof c.model_type, "qwen3");
        c.head_dim = hd + 4;   // heads * head_dim != hidden_size
        c.qk_norm = true;
        c.qkv_bias = c.o_bias = true;
        c.rope_scaling.type = HF_ROPE_YARN, c.rope_scaling.factor = 4.0;
        c.rope_scaling.original_max_position_embeddings = 32;
        c.tie_word_embeddings = true;
        break;
    case AU_LLAMA3_TANH:
        snprintf(c.model_type, sizeof c.model_type, "llama");
        c.hidden_act = HF_ACT_GELU_TANH;
        c.mlp_bias = true;
        c.rope_scaling.type = HF_ROPE_LLAMA3, c.rope_scaling.factor = 8.0;
        c.rope_scaling.original_max_position_embeddings = 16;
        c.rope_scaling.low_freq_factor = 1.0, c.rope_scaling.high_freq_factor = 4.0;
        break;
    case AU_MISTRAL_WINDOW:
        snprintf(c.model_type, sizeof c.model_type, "mistral");
        c.sliding_window = 40;
        c.rope_scaling.type = HF_ROPE_LINEAR, c.rope_scaling.factor = 2.0;
        break;
    default:
        snprintf(c.model_type, sizeof c.model_type, "qwen2");
        c.qkv_bias = true;
        c.max_window_layers = 28;
        c.rope_scaling.type = HF_ROPE_DYNAMIC, c.rope_scaling.factor = 2.0;
        break;
    }
    return c;
}

#endif

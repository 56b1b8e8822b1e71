// hfconfig.c - parse and write the Hugging Face config.json of the llama, mistral, qwen2 and qwen3
// decoders (strict: a key that is neither understood nor informational is refused), and read
// generation_config.json.
#include "hfconfig.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"

enum { M_LLAMA = 1, M_MISTRAL = 2, M_QWEN2 = 4, M_QWEN3 = 8, M_ALL = 15 };

// Per model type: the class Hugging Face builds (the only "architectures" entry accepted) and the
// config class's defaults that differ between the types.
static const struct {
    const char *model_type;
    const char *architecture;
    unsigned bit;
    int max_position_embeddings;   // default when absent
    int head_dim;                  // default when absent (0: hidden_size / num_attention_heads)
    int sliding_window;            // default when absent (0: the type has no window)
} known_models[] = {
    {"llama", "LlamaForCausalLM", M_LLAMA, 2048, 0, 0},
    {"qwen2", "Qwen2ForCausalLM", M_QWEN2, 32768, 0, 4096},
    {"mistral", "MistralForCausalLM", M_MISTRAL, 131072, 0, 4096},
    {"qwen3", "Qwen3ForCausalLM", M_QWEN3, 32768, 128, 4096},
};
#define N_KNOWN_MODELS ((int)(sizeof known_models / sizeof known_models[0]))

// Keys the modelling code of each type reads (transformers' Llama/Mistral/Qwen2/Qwen3 configs and
// models, and modeling_rope_utils.py). A key read by another type only is not understood here.
static const struct {
    const char *key;
    unsigned types;
} understood_keys[] = {
    {"model_type", M_ALL},
    {"architectures", M_ALL},
    {"hidden_size", M_ALL},
    {"intermediate_size", M_ALL},
    {"num_hidden_layers", M_ALL},
    {"num_attention_heads", M_ALL},
    {"num_key_value_heads", M_ALL},
    {"head_dim", M_ALL},
    {"vocab_size", M_ALL},
    {"max_position_embeddings", M_ALL},
    {"rms_norm_eps", M_ALL},
    {"rope_theta", M_ALL},
    {"rope_scaling", M_ALL},
    {"rope_parameters", M_ALL},
    {"hidden_act", M_ALL},
    {"tie_word_embeddings", M_ALL},
    {"attention_dropout", M_ALL},
    {"bos_token_id", M_ALL},
    {"eos_token_id", M_ALL},
    {"pad_token_id", M_ALL},
    {"attention_bias", M_LLAMA | M_QWEN3},
    {"mlp_bias", M_LLAMA},
    {"pretraining_tp", M_LLAMA},
    {"rope_interleaved", M_LLAMA},
    {"sliding_window", M_MISTRAL | M_QWEN2 | M_QWEN3},
    {"use_sliding_window", M_QWEN2 | M_QWEN3},
    {"max_window_layers", M_QWEN2 | M_QWEN3},
    {"layer_types", M_QWEN2 | M_QWEN3},
    {"use_mrope", M_QWEN2},
};

// Metadata that changes no computation: ignored on purpose. (torch_dtype / dtype name the
// checkpoint's storage type; the reader takes each tensor's dtype from the safetensors header.)
static const char *const info_keys[] = {
    "torch_dtype", "dtype", "transformers_version", "_name_or_path", "use_cache", "initializer_range",
    "is_llama_config", "tokenizer_class", "output_attentions", "output_hidden_states", "return_dict",
    "_attn_implementation_autoset", "id2label", "label2id",
};

// Absent and JSON null are the same thing in HF configs (e.g. "head_dim": null).
static const cJSON *field(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNull(v) ? NULL : v;
}

// Positive integer field; when absent, *out = dflt, or an error if dflt < 0 (required).
static int get_pos_int(const cJSON *root, const char *src, const char *key, int dflt, int *out, char *err) {
    const cJSON *v = field(root, key);
    if (!v) {
        if (dflt < 0) return err_set(err, "%s: %s is missing", src, key);
        *out = dflt;
        return 0;
    }
    if (!json_int(v, out) || *out <= 0) return err_set(err, "%s: %s must be a positive integer", src, key);
    return 0;
}

static int get_pos_float(const cJSON *root, const char *src, const char *key, float dflt, float *out, char *err) {
    const cJSON *v = field(root, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    // Range-check as double first: converting an out-of-range double to float is undefined.
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0.0;
    if (!(d > 0 && d <= FLT_MAX) || !((float)d > 0))
        return err_set(err, "%s: %s must be a positive number", src, key);
    *out = (float)d;
    return 0;
}

static int get_bool(const cJSON *root, const char *src, const char *key, bool dflt, bool *out, char *err) {
    const cJSON *v = field(root, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return err_set(err, "%s: %s must be true or false", src, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

// A single token id: absent -> -1.
static int get_token_id(const cJSON *root, const char *src, const char *key, int *out, char *err) {
    const cJSON *v = field(root, key);
    *out = -1;
    if (!v) return 0;
    if (!json_int(v, out) || *out < 0) {
        *out = -1;
        return err_set(err, "%s: %s must be a non-negative integer", src, key);
    }
    return 0;
}

// eos_token_id: an integer or a list of integers (every one ends a sequence); duplicates dropped.
static int get_token_list(const cJSON *root, const char *src, const char *key, int *ids, int *n, char *err) {
    const cJSON *v = field(root, key);
    *n = 0;
    if (!v) return 0;
    const cJSON *it = cJSON_IsArray(v) ? v->child : v;
    for (; it; it = cJSON_IsArray(v) ? it->next : NULL) {
        int id;
        if (!json_int(it, &id) || id < 0)
            return err_set(err, "%s: %s must be a non-negative integer or a list of them", src, key);
        bool dup = false;
        for (int i = 0; i < *n; i++) dup |= ids[i] == id;
        if (dup) continue;
        if (*n == HF_MAX_EOS) return err_set(err, "%s: %s lists more than %d ids", src, key, HF_MAX_EOS);
        ids[(*n)++] = id;
    }
    return 0;
}

// A number of an object; returns 1 when present, 0 when absent or null, -1 + err when not a finite number.
static int get_num(const cJSON *obj, const char *src, const char *key, double *out, char *err) {
    const cJSON *v = field(obj, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return err_set(err, "%s: %s must be a number", src, key);
    *out = v->valuedouble;
    return 1;
}

static int model_index(const char *type) {
    for (int i = 0; i < N_KNOWN_MODELS; i++)
        if (!strcmp(type, known_models[i].model_type)) return i;
    return -1;
}

const char *hf_act_name(hf_act_t a) {
    return a == HF_ACT_GELU ? "gelu" : a == HF_ACT_GELU_TANH ? "gelu_pytorch_tanh" : "silu";
}

const char *hf_rope_type_name(hf_rope_type_t t) {
    static const char *const names[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    return (unsigned)t < 5 ? names[t] : "?";
}

// --- rope_scaling -------------------------------------------------------------------------------------

// Keys of a rope_scaling object, and the rope types that read each (bit = 1 << hf_rope_type_t).
#define R(t) (1u << (t))
static const struct {
    const char *key;
    unsigned types;
} rope_keys[] = {
    {"factor", R(HF_ROPE_LINEAR) | R(HF_ROPE_DYNAMIC) | R(HF_ROPE_LLAMA3) | R(HF_ROPE_YARN)},
    {"original_max_position_embeddings", R(HF_ROPE_DYNAMIC) | R(HF_ROPE_LLAMA3) | R(HF_ROPE_YARN)},
    {"low_freq_factor", R(HF_ROPE_LLAMA3)},
    {"high_freq_factor", R(HF_ROPE_LLAMA3)},
    {"beta_fast", R(HF_ROPE_YARN)},
    {"beta_slow", R(HF_ROPE_YARN)},
    {"mscale", R(HF_ROPE_YARN)},
    {"mscale_all_dim", R(HF_ROPE_YARN)},
    {"attention_factor", R(HF_ROPE_YARN)},
    {"truncate", R(HF_ROPE_YARN)},
};
#undef R

// rope_scaling (transformers 4) or rope_parameters (transformers 5: the same keys plus rope_theta
// and partial_rotary_factor; a missing rope_type means "default").
static int parse_rope(const cJSON *root, const char *src, hf_config_t *cfg, char *err) {
    hf_rope_scaling_t *rs = &cfg->rope_scaling;
    memset(rs, 0, sizeof *rs);
    const cJSON *sc = field(root, "rope_scaling"), *rp = field(root, "rope_parameters");
    if (sc && rp) return err_set(err, "%s: rope_scaling and rope_parameters are both given; keep one", src);
    const cJSON *o = sc ? sc : rp;
    const char *name = sc ? "rope_scaling" : "rope_parameters";
    if (!o) return 0;
    if (!cJSON_IsObject(o)) return err_set(err, "%s: %s must be an object or null", src, name);

    const cJSON *ty = field(o, "rope_type"), *ty2 = field(o, "type");
    if ((ty && !cJSON_IsString(ty)) || (ty2 && !cJSON_IsString(ty2)))
        return err_set(err, "%s: %s.rope_type must be a string", src, name);
    if (ty && ty2 && strcmp(ty->valuestring, ty2->valuestring))
        return err_set(err, "%s: %s has rope_type '%.32s' and type '%.32s'; keep one", src, name, ty->valuestring,
                       ty2->valuestring);
    const char *tname = ty ? ty->valuestring : ty2 ? ty2->valuestring : rp ? "default" : NULL;
    if (!tname) return err_set(err, "%s: rope_scaling has no rope_type", src);
    static const char *const types[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    int t = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(tname, types[i])) t = i;
    if (t < 0)
        return err_set(err, "%s: %s rope_type '%.40s' is not supported (default, linear, dynamic, llama3, yarn)", src,
                       name, tname);
    rs->type = (hf_rope_type_t)t;

    for (const cJSON *it = o->child; it; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "rope_type") || !strcmp(k, "type")) continue;
        if (rp && (!strcmp(k, "rope_theta") || !strcmp(k, "partial_rotary_factor"))) continue;
        int found = -1;
        for (size_t i = 0; i < sizeof rope_keys / sizeof rope_keys[0]; i++)
            if (!strcmp(k, rope_keys[i].key)) found = (int)i;
        if (found < 0) return err_set(err, "%s: %s.%.40s is not supported", src, name, k);
        if (!(rope_keys[found].types & (1u << t)) && !cJSON_IsNull(it))
            return err_set(err, "%s: %s.%.40s is not read by rope_type '%s'", src, name, k, tname);
    }

    char key[96];
    struct {
        const char *k;
        double *dst;
        bool required;
    } nums[] = {
        {"factor", &rs->factor, t != HF_ROPE_DEFAULT},
        {"low_freq_factor", &rs->low_freq_factor, t == HF_ROPE_LLAMA3},
        {"high_freq_factor", &rs->high_freq_factor, t == HF_ROPE_LLAMA3},
        {"beta_fast", &rs->beta_fast, false},
        {"beta_slow", &rs->beta_slow, false},
        {"mscale", &rs->mscale, false},
        {"mscale_all_dim", &rs->mscale_all_dim, false},
        {"attention_factor", &rs->attention_factor, false},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", name, nums[i].k);
        const cJSON *v = field(o, nums[i].k);
        if (!v) {
            if (nums[i].required) return err_set(err, "%s: %s is missing (rope_type '%s')", src, key, tname);
            continue;
        }
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
            return err_set(err, "%s: %s must be a non-negative number", src, key);
        *nums[i].dst = v->valuedouble;
    }
    if (t != HF_ROPE_DEFAULT && !(rs->factor > 0)) return err_set(err, "%s: %s.factor must be positive", src, name);
    if (field(o, "attention_factor") && !(rs->attention_factor > 0))
        return err_set(err, "%s: %s.attention_factor must be positive", src, name);
    const cJSON *om = field(o, "original_max_position_embeddings");
    if (om && (!json_int(om, &rs->original_max_position_embeddings) || rs->original_max_position_embeddings <= 0))
        return err_set(err, "%s: %s.original_max_position_embeddings must be a positive integer", src, name);
    if (t == HF_ROPE_LLAMA3) {
        if (!om) return err_set(err, "%s: %s.original_max_position_embeddings is missing (rope_type 'llama3')", src, name);
        if (!(rs->low_freq_factor > 0) || !(rs->high_freq_factor > rs->low_freq_factor))
            return err_set(err, "%s: %s needs 0 < low_freq_factor < high_freq_factor", src, name);
    }
    const cJSON *tr = field(o, "truncate");
    if (tr) {
        if (!cJSON_IsBool(tr)) return err_set(err, "%s: %s.truncate must be true or false", src, name);
        rs->truncate = cJSON_IsTrue(tr) ? 1 : 2;
    }
    if (rp) {
        const cJSON *th = field(rp, "rope_theta");
        if (th) {
            if (!cJSON_IsNumber(th) || !(th->valuedouble > 0 && th->valuedouble <= FLT_MAX))
                return err_set(err, "%s: rope_parameters.rope_theta must be a positive number", src);
            const cJSON *top = field(root, "rope_theta");
            if (top && (!cJSON_IsNumber(top) || top->valuedouble != th->valuedouble))
                return err_set(err, "%s: rope_theta and rope_parameters.rope_theta differ", src);
            cfg->rope_theta = (float)th->valuedouble;
        }
        const cJSON *pr = field(rp, "partial_rotary_factor");
        if (pr && (!cJSON_IsNumber(pr) || pr->valuedouble != 1.0))
            return err_set(err, "%s: rope_parameters.partial_rotary_factor must be 1 (partial rotary embeddings are "
                           "not computed)", src);
    }
    return 0;
}

// --- sliding window ----------------------------------------------------------------------------------

// Whether layer i slides under the type's rule (see hf_config_sliding_layers).
static bool layer_slides(const hf_config_t *c, int i) {
    if (c->sliding_window <= 0) return false;
    if (!strcmp(c->model_type, "mistral")) return true;
    if (!strcmp(c->model_type, "qwen2") || !strcmp(c->model_type, "qwen3"))
        return c->use_sliding_window && i >= c->max_window_layers;
    return false;
}

int hf_config_sliding_layers(const hf_config_t *c) {
    int n = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n += layer_slides(c, i);
    return n;
}

int hf_config_context(const hf_config_t *c) {
    int ctx = c->max_position_embeddings;
    if (hf_config_sliding_layers(c) > 0 && c->sliding_window < ctx) ctx = c->sliding_window;
    return ctx;
}

static int parse_sliding(const cJSON *root, const char *src, int mi, hf_config_t *cfg, char *err) {
    unsigned bit = known_models[mi].bit;
    if (!(bit & (M_MISTRAL | M_QWEN2 | M_QWEN3))) return 0;
    // null means "no window"; absent means the config class's default.
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (!sw) cfg->sliding_window = known_models[mi].sliding_window;
    else if (cJSON_IsNull(sw)) cfg->sliding_window = 0;
    else if (!json_int(sw, &cfg->sliding_window) || cfg->sliding_window <= 0)
        return err_set(err, "%s: sliding_window must be a positive integer or null", src);
    if (bit == M_MISTRAL) return 0;
    if (get_bool(root, src, "use_sliding_window", false, &cfg->use_sliding_window, err)) return -1;
    const cJSON *mw = field(root, "max_window_layers");
    cfg->max_window_layers = 28;
    if (mw && (!json_int(mw, &cfg->max_window_layers) || cfg->max_window_layers < 0))
        return err_set(err, "%s: max_window_layers must be a non-negative integer", src);
    const cJSON *lt = field(root, "layer_types");
    if (!lt) return 0;
    // transformers writes the per-layer list it derives from the keys above; any other pattern is
    // refused rather than half-followed.
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->num_hidden_layers)
        return err_set(err, "%s: layer_types must list num_hidden_layers (%d) entries", src, cfg->num_hidden_layers);
    int i = 0;
    for (const cJSON *it = lt->child; it; it = it->next, i++) {
        const char *want = layer_slides(cfg, i) ? "sliding_attention" : "full_attention";
        if (!cJSON_IsString(it) || strcmp(it->valuestring, want))
            return err_set(err, "%s: layer_types[%d] is not '%s', which sliding_window, use_sliding_window and "
                           "max_window_layers give; other layer patterns are not supported", src, i, want);
    }
    return 0;
}

// --- config.json ---------------------------------------------------------------------------------------

// Every key must be understood for the model type or informational (see hfconfig.h).
static int check_keys(const cJSON *root, const char *src, int mi, char *err) {
    unsigned bit = known_models[mi].bit;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string;
        bool ok = false, other = false;
        for (size_t i = 0; i < sizeof understood_keys / sizeof understood_keys[0] && !ok; i++)
            if (!strcmp(k, understood_keys[i].key)) {
                ok = (understood_keys[i].types & bit) != 0;
                other = !ok;
            }
        for (size_t i = 0; i < sizeof info_keys / sizeof info_keys[0] && !ok; i++) ok = !strcmp(k, info_keys[i]);
        if (ok) continue;
        if (other)
            return err_set(err, "%s: %.60s is not read by model_type '%s'; refused, as it may change the computation",
                           src, k, known_models[mi].model_type);
        return err_set(err, "%s: unknown key '%.60s' for model_type '%s'; refused, as it may change the computation",
                       src, k, known_models[mi].model_type);
    }
    return 0;
}

static int parse_values(const cJSON *root, const char *src, int mi, hf_config_t *cfg, char *err) {
    unsigned bit = known_models[mi].bit;
    const cJSON *ar = field(root, "architectures");
    if (ar) {
        if (!cJSON_IsArray(ar)) return err_set(err, "%s: architectures must be a list", src);
        for (const cJSON *it = ar->child; it; it = it->next)
            if (!cJSON_IsString(it) || strcmp(it->valuestring, known_models[mi].architecture))
                return err_set(err, "%s: architectures names %.40s; only %s (the causal LM head) is computed", src,
                               cJSON_IsString(it) ? it->valuestring : "a non-string", known_models[mi].architecture);
    }
    const cJSON *act = field(root, "hidden_act");
    if (act) {
        if (!cJSON_IsString(act)) return err_set(err, "%s: hidden_act must be a string", src);
        const char *a = act->valuestring;
        if (!strcmp(a, "silu") || !strcmp(a, "swish")) cfg->hidden_act = HF_ACT_SILU;
        else if (!strcmp(a, "gelu")) cfg->hidden_act = HF_ACT_GELU;
        else if (!strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_new")) cfg->hidden_act = HF_ACT_GELU_TANH;
        else
            return err_set(err, "%s: hidden_act '%.40s' is not supported (silu, gelu, gelu_pytorch_tanh)", src, a);
    }
    double d = 0.0;
    int rc = get_num(root, src, "attention_dropout", &d, err);
    if (rc < 0) return -1;
    if (rc > 0 && d != 0.0)
        return err_set(err, "%s: attention_dropout %g is not supported (only 0: attention dropout is not computed)",
                       src, d);
    const cJSON *tp = field(root, "pretraining_tp");
    int tpv;
    if (tp && (!json_int(tp, &tpv) || tpv != 1))
        return err_set(err, "%s: pretraining_tp must be 1 (the sliced tensor-parallel products are not computed)", src);
    const cJSON *mr = field(root, "use_mrope");
    if (mr && !cJSON_IsFalse(mr)) return err_set(err, "%s: use_mrope must be false (multimodal RoPE is not computed)", src);
    const cJSON *ri = field(root, "rope_interleaved");
    if (ri && !cJSON_IsFalse(ri))
        return err_set(err, "%s: rope_interleaved must be false (only the rotate_half RoPE is computed)", src);

    bool attn_bias = false;
    if (get_bool(root, src, "attention_bias", false, &attn_bias, err) ||
        get_bool(root, src, "mlp_bias", false, &cfg->mlp_bias, err) ||
        get_bool(root, src, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err))
        return -1;
    if (bit == M_QWEN2) cfg->qkv_bias = true, cfg->o_bias = false;
    else cfg->qkv_bias = cfg->o_bias = attn_bias;
    cfg->qk_norm = bit == M_QWEN3;

    if (get_token_id(root, src, "bos_token_id", &cfg->bos_token_id, err) ||
        get_token_id(root, src, "pad_token_id", &cfg->pad_token_id, err) ||
        get_token_list(root, src, "eos_token_id", cfg->eos_token_ids, &cfg->n_eos, err))
        return -1;
    cfg->eos_token_id = cfg->n_eos ? cfg->eos_token_ids[0] : -1;
    return 0;
}

static int parse(hf_config_t *cfg, const char *json, const char *src, char *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_token_id = cfg->pad_token_id = cfg->eos_token_id = -1;
    cJSON *root = cJSON_Parse(json);
    if (!root) return err_set(err, "%s: not valid JSON", src);
    if (!cJSON_IsObject(root)) {
        err_set(err, "%s: not a JSON object", src);
        goto fail;
    }

    const cJSON *mt = field(root, "model_type");
    if (mt && !cJSON_IsString(mt)) {
        err_set(err, "%s: model_type must be a string", src);
        goto fail;
    }
    const char *type = mt ? mt->valuestring : "llama";
    int mi = model_index(type);
    // Other architectures have layers this engine does not compute (fused qkv, MoE, ...).
    if (mi < 0) {
        err_set(err, "%s: model_type '%.64s' is not supported (llama, mistral, qwen2, qwen3)", src, type);
        goto fail;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);
    if (check_keys(root, src, mi, err)) goto fail;

    if (get_pos_int(root, src, "hidden_size", -1, &cfg->hidden_size, err) != 0 ||
        get_pos_int(root, src, "intermediate_size", -1, &cfg->intermediate_size, err) != 0 ||
        get_pos_int(root, src, "num_hidden_layers", -1, &cfg->num_hidden_layers, err) != 0 ||
        get_pos_int(root, src, "num_attention_heads", -1, &cfg->num_attention_heads, err) != 0 ||
        get_pos_int(root, src, "vocab_size", -1, &cfg->vocab_size, err) != 0 ||
        get_pos_int(root, src, "num_key_value_heads", cfg->num_attention_heads, &cfg->num_key_value_heads, err) != 0 ||
        get_pos_int(root, src, "max_position_embeddings", known_models[mi].max_position_embeddings,
                    &cfg->max_position_embeddings, err) != 0 ||
        get_pos_int(root, src, "head_dim", known_models[mi].head_dim, &cfg->head_dim, err) != 0 ||
        get_pos_float(root, src, "rms_norm_eps", 1e-6f, &cfg->rms_norm_eps, err) != 0 ||
        get_pos_float(root, src, "rope_theta", 10000.0f, &cfg->rope_theta, err) != 0)
        goto fail;
    if (parse_values(root, src, mi, cfg, err) || parse_rope(root, src, cfg, err)) goto fail;

    int h = cfg->num_attention_heads, kv = cfg->num_key_value_heads;
    if (h % kv != 0) {
        err_set(err, "%s: num_attention_heads (%d) must be divisible by num_key_value_heads (%d)", src, h, kv);
        goto fail;
    }
    if (cfg->head_dim == 0) {
        if (cfg->hidden_size % h != 0) {
            err_set(err, "%s: hidden_size (%d) must be divisible by num_attention_heads (%d) when head_dim is absent",
                    src, cfg->hidden_size, h);
            goto fail;
        }
        cfg->head_dim = cfg->hidden_size / h;
    }
    if (parse_sliding(root, src, mi, cfg, err)) goto fail;
    const hf_rope_scaling_t *rs = &cfg->rope_scaling;
    // transformers 4.46-4.54 replace yarn's factor by max_position_embeddings /
    // original_max_position_embeddings when the latter is given, later releases keep the factor:
    // a config on which they disagree has no single meaning.
    if (rs->type == HF_ROPE_YARN && rs->original_max_position_embeddings > 0 &&
        (double)cfg->max_position_embeddings / rs->original_max_position_embeddings != rs->factor) {
        err_set(err, "%s: yarn factor %g differs from max_position_embeddings / original_max_position_embeddings "
                "(%d / %d), on which transformers releases disagree; make them agree", src, rs->factor,
                cfg->max_position_embeddings, rs->original_max_position_embeddings);
        goto fail;
    }
    char e2[ERR_LEN];
    if (hf_config_validate(cfg, e2)) {
        err_set(err, "%s: %s", src, e2);
        goto fail;
    }
    cJSON_Delete(root);
    return 0;
fail:
    cJSON_Delete(root);
    return -1;
}

int hf_config_parse(hf_config_t *cfg, const char *json, char *err) { return parse(cfg, json, "config.json", err); }

int hf_config_load(hf_config_t *cfg, const char *path, char *err) {
    char *text = util_read_file(path, NULL, err);
    if (!text) return -1;
    int rc = parse(cfg, text, path, err);
    free(text);
    return rc;
}

int hf_config_validate(const hf_config_t *c, char *err) {
    int mi = model_index(c->model_type);
    if (mi < 0) return err_set(err, "model_type '%.32s' is not supported (llama, mistral, qwen2, qwen3)", c->model_type);
    unsigned bit = known_models[mi].bit;
    if (c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 || c->num_attention_heads <= 0 ||
        c->num_key_value_heads <= 0 || c->vocab_size <= 0 || c->head_dim <= 0 || c->max_position_embeddings <= 0)
        return err_set(err, "every size must be positive");
    if (bit == M_QWEN2 && (!c->qkv_bias || c->o_bias))
        return err_set(err, "qwen2 has q/k/v biases and no o_proj bias");
    if ((bit & (M_LLAMA | M_QWEN3)) && c->qkv_bias != c->o_bias)
        return err_set(err, "%s's attention_bias gives q, k, v and o_proj biases together", c->model_type);
    if (bit == M_MISTRAL && (c->qkv_bias || c->o_bias)) return err_set(err, "mistral has no attention biases");
    if (c->mlp_bias && bit != M_LLAMA) return err_set(err, "mlp_bias exists for llama only");
    if (c->qk_norm != (bit == M_QWEN3)) return err_set(err, "q/k norms exist exactly for qwen3");
    if ((unsigned)c->hidden_act > HF_ACT_GELU_TANH) return err_set(err, "unknown hidden_act %d", (int)c->hidden_act);
    const hf_rope_scaling_t *rs = &c->rope_scaling;
    if ((unsigned)rs->type > HF_ROPE_YARN) return err_set(err, "unknown rope_scaling type %d", (int)rs->type);
    if (rs->truncate < 0 || rs->truncate > 2) return err_set(err, "rope_scaling.truncate must be 0, 1 or 2");
    if (rs->type != HF_ROPE_DEFAULT && !(rs->factor > 0 && isfinite(rs->factor)))
        return err_set(err, "rope_scaling.factor must be positive");
    if (rs->type == HF_ROPE_LLAMA3 &&
        (rs->original_max_position_embeddings <= 0 || !(rs->low_freq_factor > 0) ||
         !(rs->high_freq_factor > rs->low_freq_factor)))
        return err_set(err, "llama3 rope_scaling needs original_max_position_embeddings and 0 < low_freq_factor < "
                       "high_freq_factor");
    if (c->n_eos < 0 || c->n_eos > HF_MAX_EOS) return err_set(err, "at most %d eos_token_ids", HF_MAX_EOS);
    return 0;
}

int hf_config_eos(const hf_config_t *c, int32_t *ids, int max) {
    int n = 0;
    if (c->n_eos > 0) {
        for (int i = 0; i < c->n_eos && n < max; i++) ids[n++] = c->eos_token_ids[i];
    } else if (c->eos_token_id >= 0 && max > 0) {
        ids[n++] = c->eos_token_id;
    }
    return n;
}

static void add_rope_scaling(cJSON *root, const hf_rope_scaling_t *rs) {
    if (rs->type == HF_ROPE_DEFAULT) {
        json_need(cJSON_AddNullToObject(root, "rope_scaling"));
        return;
    }
    cJSON *o = json_need(cJSON_AddObjectToObject(root, "rope_scaling"));
    json_need(cJSON_AddStringToObject(o, "rope_type", hf_rope_type_name(rs->type)));
    json_need(cJSON_AddNumberToObject(o, "factor", rs->factor));
    if (rs->original_max_position_embeddings > 0)
        json_need(cJSON_AddNumberToObject(o, "original_max_position_embeddings", rs->original_max_position_embeddings));
    if (rs->type == HF_ROPE_LLAMA3) {
        json_need(cJSON_AddNumberToObject(o, "low_freq_factor", rs->low_freq_factor));
        json_need(cJSON_AddNumberToObject(o, "high_freq_factor", rs->high_freq_factor));
    }
    if (rs->type == HF_ROPE_YARN) {
        const struct {
            const char *k;
            double v;
        } opt[] = {{"beta_fast", rs->beta_fast}, {"beta_slow", rs->beta_slow}, {"mscale", rs->mscale},
                   {"mscale_all_dim", rs->mscale_all_dim}, {"attention_factor", rs->attention_factor}};
        for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
            if (opt[i].v > 0) json_need(cJSON_AddNumberToObject(o, opt[i].k, opt[i].v));
        if (rs->truncate) json_need(cJSON_AddBoolToObject(o, "truncate", rs->truncate == 1));
    }
}

int hf_config_save(const hf_config_t *cfg, const char *path, char *err) {
    char e2[ERR_LEN];
    if (hf_config_validate(cfg, e2)) return err_set(err, "%s: %s", path, e2);
    int mi = model_index(cfg->model_type);
    unsigned bit = known_models[mi].bit;

    cJSON *root = json_need(cJSON_CreateObject());
    cJSON *archs = json_need(cJSON_AddArrayToObject(root, "architectures"));
    if (!cJSON_AddItemToArray(archs, json_need(cJSON_CreateString(known_models[mi].architecture)))) json_need(NULL);
    json_need(cJSON_AddStringToObject(root, "model_type", cfg->model_type));
    json_need(cJSON_AddNumberToObject(root, "hidden_size", cfg->hidden_size));
    json_need(cJSON_AddNumberToObject(root, "intermediate_size", cfg->intermediate_size));
    json_need(cJSON_AddNumberToObject(root, "num_hidden_layers", cfg->num_hidden_layers));
    json_need(cJSON_AddNumberToObject(root, "num_attention_heads", cfg->num_attention_heads));
    json_need(cJSON_AddNumberToObject(root, "num_key_value_heads", cfg->num_key_value_heads));
    // Older transformers releases ignore head_dim and derive it, so it is written only when it
    // differs from the derived value (always for qwen3, whose class default is 128).
    if (bit == M_QWEN3 || cfg->head_dim * cfg->num_attention_heads != cfg->hidden_size)
        json_need(cJSON_AddNumberToObject(root, "head_dim", cfg->head_dim));
    json_need(cJSON_AddNumberToObject(root, "vocab_size", cfg->vocab_size));
    json_need(cJSON_AddNumberToObject(root, "max_position_embeddings", cfg->max_position_embeddings));
    json_need(cJSON_AddNumberToObject(root, "rms_norm_eps", json_float_as_written(cfg->rms_norm_eps)));
    json_need(cJSON_AddNumberToObject(root, "rope_theta", json_float_as_written(cfg->rope_theta)));
    add_rope_scaling(root, &cfg->rope_scaling);
    json_need(cJSON_AddBoolToObject(root, "tie_word_embeddings", cfg->tie_word_embeddings));
    if (bit & (M_LLAMA | M_QWEN3)) json_need(cJSON_AddBoolToObject(root, "attention_bias", cfg->qkv_bias));
    if (bit == M_LLAMA) json_need(cJSON_AddBoolToObject(root, "mlp_bias", cfg->mlp_bias));
    json_need(cJSON_AddStringToObject(root, "hidden_act", hf_act_name(cfg->hidden_act)));
    if (bit & (M_MISTRAL | M_QWEN2 | M_QWEN3)) {
        if (cfg->sliding_window > 0) json_need(cJSON_AddNumberToObject(root, "sliding_window", cfg->sliding_window));
        else json_need(cJSON_AddNullToObject(root, "sliding_window"));
    }
    if (bit & (M_QWEN2 | M_QWEN3)) {
        json_need(cJSON_AddBoolToObject(root, "use_sliding_window", cfg->use_sliding_window));
        json_need(cJSON_AddNumberToObject(root, "max_window_layers", cfg->max_window_layers));
    }
    json_need(cJSON_AddNumberToObject(root, "attention_dropout", 0.0));
    if (cfg->bos_token_id >= 0) json_need(cJSON_AddNumberToObject(root, "bos_token_id", cfg->bos_token_id));
    int32_t eos[HF_MAX_EOS];
    int ne = hf_config_eos(cfg, eos, HF_MAX_EOS);
    if (ne == 1) json_need(cJSON_AddNumberToObject(root, "eos_token_id", eos[0]));
    else if (ne > 1) {
        cJSON *a = json_need(cJSON_AddArrayToObject(root, "eos_token_id"));
        for (int i = 0; i < ne; i++)
            if (!cJSON_AddItemToArray(a, json_need(cJSON_CreateNumber(eos[i])))) json_need(NULL);
    }
    json_need(cJSON_AddStringToObject(root, "torch_dtype", "float32"));

    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!json) json_need(NULL);
    size_t n = strlen(json);
    // A trailing newline, as HF's save_pretrained writes.
    char *text = xmalloc(n + 1);
    memcpy(text, json, n);
    text[n] = '\n';
    cJSON_free(json);
    int rc = util_write_file(path, text, n + 1, err);
    free(text);
    return rc;
}

// --- generation_config.json -----------------------------------------------------------------------------

// Keys that change nothing here (metadata, outputs, caches, ids of encoder-decoder models).
static const char *const gen_info_keys[] = {
    "transformers_version", "_from_model_config", "use_cache", "return_dict_in_generate", "output_scores",
    "output_logits", "output_attentions", "output_hidden_states", "decoder_start_token_id", "cache_implementation",
    "_commit_hash",
};

// Sampling keys this engine has no counterpart for, with the value that makes them a no-op.
static const struct {
    const char *key;
    double neutral;
} gen_neutral[] = {
    {"repetition_penalty", 1.0}, {"num_beams", 1.0},  {"num_beam_groups", 1.0},  {"typical_p", 1.0},
    {"min_p", 0.0},              {"epsilon_cutoff", 0.0}, {"eta_cutoff", 0.0},   {"no_repeat_ngram_size", 0.0},
    {"length_penalty", 1.0},     {"diversity_penalty", 0.0}, {"encoder_repetition_penalty", 1.0},
    {"num_return_sequences", 1.0}, {"min_new_tokens", 0.0}, {"min_length", 0.0},
};

static void note_unsupported(hf_generation_config_t *g, const cJSON *it) {
    char val[48];
    if (cJSON_IsNumber(it)) snprintf(val, sizeof val, "%g", it->valuedouble);
    else if (cJSON_IsBool(it)) snprintf(val, sizeof val, "%s", cJSON_IsTrue(it) ? "true" : "false");
    else if (cJSON_IsString(it)) snprintf(val, sizeof val, "\"%.40s\"", it->valuestring);
    else snprintf(val, sizeof val, "...");
    size_t n = strlen(g->unsupported);
    snprintf(g->unsupported + n, sizeof g->unsupported - n, "%s%.60s=%s", n ? ", " : "", it->string, val);
}

static int gen_parse(hf_generation_config_t *g, const char *json, const char *src, char *err) {
    memset(g, 0, sizeof *g);
    g->bos_token_id = g->pad_token_id = -1;
    cJSON *root = cJSON_Parse(json);
    if (!root) return err_set(err, "%s: not valid JSON", src);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        err_set(err, "%s: not a JSON object", src);
        goto out;
    }
    if (get_token_list(root, src, "eos_token_id", g->eos_token_ids, &g->n_eos, err) ||
        get_token_id(root, src, "bos_token_id", &g->bos_token_id, err) ||
        get_token_id(root, src, "pad_token_id", &g->pad_token_id, err))
        goto out;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "eos_token_id") || !strcmp(k, "bos_token_id") || !strcmp(k, "pad_token_id") || cJSON_IsNull(it))
            continue;
        bool info = false;
        for (size_t i = 0; i < sizeof gen_info_keys / sizeof gen_info_keys[0]; i++) info |= !strcmp(k, gen_info_keys[i]);
        if (info) continue;
        if (!strcmp(k, "do_sample")) {
            if (!cJSON_IsBool(it)) {
                err_set(err, "%s: do_sample must be true or false", src);
                goto out;
            }
            g->has_do_sample = true, g->do_sample = cJSON_IsTrue(it);
        } else if (!strcmp(k, "temperature")) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble <= 100)) {
                err_set(err, "%s: temperature must be a number in 0..100", src);
                goto out;
            }
            g->has_temperature = true, g->temperature = (float)it->valuedouble;
        } else if (!strcmp(k, "top_p")) {
            if (!cJSON_IsNumber(it) || !(it->valuedouble > 0 && it->valuedouble <= 1)) {
                err_set(err, "%s: top_p must be a number in (0, 1]", src);
                goto out;
            }
            g->has_top_p = true, g->top_p = (float)it->valuedouble;
        } else if (!strcmp(k, "top_k")) {
            if (!json_int(it, &g->top_k) || g->top_k < 0) {
                err_set(err, "%s: top_k must be a non-negative integer", src);
                goto out;
            }
            g->has_top_k = true;
        } else if (!strcmp(k, "max_new_tokens")) {
            if (!json_int(it, &g->max_new_tokens) || g->max_new_tokens <= 0) {
                err_set(err, "%s: max_new_tokens must be a positive integer", src);
                goto out;
            }
            g->has_max_new_tokens = true;
        } else {
            bool neutral = false;
            for (size_t i = 0; i < sizeof gen_neutral / sizeof gen_neutral[0]; i++)
                if (!strcmp(k, gen_neutral[i].key))
                    neutral = cJSON_IsNumber(it) && it->valuedouble == gen_neutral[i].neutral;
            if (!neutral) note_unsupported(g, it);
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int hf_generation_config_parse(hf_generation_config_t *g, const char *json, char *err) {
    return gen_parse(g, json, "generation_config.json", err);
}

int hf_generation_config_load(hf_generation_config_t *g, const char *path, char *err) {
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {
        memset(g, 0, sizeof *g);
        g->bos_token_id = g->pad_token_id = -1;
        return 1;
    }
    char *text = util_read_file(path, NULL, err);
    if (!text) return -1;
    int rc = gen_parse(g, text, path, err);
    free(text);
    return rc;
}

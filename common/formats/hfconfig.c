// hfconfig.c - parse and write the Hugging Face config.json of Llama-family models.
#include "hfconfig.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *model_type;
    const char *architecture;
} known_models[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"mistral", "MistralForCausalLM"},
};
#define N_KNOWN_MODELS ((int)(sizeof known_models / sizeof known_models[0]))

// Absent and JSON null are the same thing in HF configs (e.g. "head_dim": null).
static const cJSON *field(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNull(v) ? NULL : v;
}

static bool json_int(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= INT_MIN && d <= INT_MAX) || (double)(int)d != d) return false;
    *out = (int)d;
    return true;
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

static int get_bool(const cJSON *root, const char *src, const char *key, bool *out, char *err) {
    const cJSON *v = field(root, key);
    if (!v) {
        *out = false;
        return 0;
    }
    if (!cJSON_IsBool(v)) return err_set(err, "%s: %s must be true or false", src, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

// Token id: absent -> -1; an integer, or a list of integers of which the first is taken
// (generation configs list several end-of-sequence tokens).
static int get_token_id(const cJSON *root, const char *src, const char *key, int *out, char *err) {
    const cJSON *v = field(root, key);
    *out = -1;
    if (!v) return 0;
    if (cJSON_IsArray(v)) {
        if (!v->child) return 0;
        v = v->child;
    }
    if (!json_int(v, out) || *out < 0) {
        *out = -1;
        return err_set(err, "%s: %s must be a non-negative integer or a list of them", src, key);
    }
    return 0;
}

static int parse(hf_config_t *cfg, const char *json, const char *src, char *err) {
    memset(cfg, 0, sizeof *cfg);
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
    int known = -1;
    for (int i = 0; i < N_KNOWN_MODELS; i++)
        if (!strcmp(type, known_models[i].model_type)) known = i;
    // Other architectures have layers this engine does not compute (fused qkv, q/k norms, ...).
    if (known < 0) {
        err_set(err, "%s: model_type '%.64s' is not supported (llama, qwen2, mistral)", src, type);
        goto fail;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);

    if (get_pos_int(root, src, "hidden_size", -1, &cfg->hidden_size, err) != 0 ||
        get_pos_int(root, src, "intermediate_size", -1, &cfg->intermediate_size, err) != 0 ||
        get_pos_int(root, src, "num_hidden_layers", -1, &cfg->num_hidden_layers, err) != 0 ||
        get_pos_int(root, src, "num_attention_heads", -1, &cfg->num_attention_heads, err) != 0 ||
        get_pos_int(root, src, "vocab_size", -1, &cfg->vocab_size, err) != 0 ||
        get_pos_int(root, src, "num_key_value_heads", cfg->num_attention_heads, &cfg->num_key_value_heads, err) != 0 ||
        get_pos_int(root, src, "max_position_embeddings", 2048, &cfg->max_position_embeddings, err) != 0 ||
        get_pos_int(root, src, "head_dim", 0, &cfg->head_dim, err) != 0 ||
        get_pos_float(root, src, "rms_norm_eps", 1e-6f, &cfg->rms_norm_eps, err) != 0 ||
        get_pos_float(root, src, "rope_theta", 10000.0f, &cfg->rope_theta, err) != 0 ||
        get_bool(root, src, "tie_word_embeddings", &cfg->tie_word_embeddings, err) != 0 ||
        get_bool(root, src, "attention_bias", &cfg->qkv_bias, err) != 0 ||
        get_token_id(root, src, "bos_token_id", &cfg->bos_token_id, err) != 0 ||
        get_token_id(root, src, "eos_token_id", &cfg->eos_token_id, err) != 0)
        goto fail;
    if (!strcmp(cfg->model_type, "qwen2")) cfg->qkv_bias = true;

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

// cJSON allocates with plain malloc; out of memory while building a document aborts, as xmalloc does.
static cJSON *json_need(cJSON *x) {
    if (!x) {
        fprintf(stderr, "FATAL out of memory building config.json\n");
        abort();
    }
    return x;
}

// The shortest decimal that reads back as x, so 1e-6f is written "1e-06" rather than the
// double expansion of the float ("9.9999999747524271e-07").
static double float_for_json(float x) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
        // The reader converts the parsed double to float, so check exactly that path.
        if ((float)strtod(buf, NULL) == x) return strtod(buf, NULL);
    }
    return (double)x;
}

int hf_config_save(const hf_config_t *cfg, const char *path, char *err) {
    const char *arch = known_models[0].architecture;
    for (int i = 0; i < N_KNOWN_MODELS; i++)
        if (!strcmp(cfg->model_type, known_models[i].model_type)) arch = known_models[i].architecture;

    cJSON *root = json_need(cJSON_CreateObject());
    cJSON *archs = json_need(cJSON_AddArrayToObject(root, "architectures"));
    if (!cJSON_AddItemToArray(archs, json_need(cJSON_CreateString(arch)))) json_need(NULL);
    json_need(cJSON_AddStringToObject(root, "model_type", cfg->model_type));
    json_need(cJSON_AddNumberToObject(root, "hidden_size", cfg->hidden_size));
    json_need(cJSON_AddNumberToObject(root, "intermediate_size", cfg->intermediate_size));
    json_need(cJSON_AddNumberToObject(root, "num_hidden_layers", cfg->num_hidden_layers));
    json_need(cJSON_AddNumberToObject(root, "num_attention_heads", cfg->num_attention_heads));
    json_need(cJSON_AddNumberToObject(root, "num_key_value_heads", cfg->num_key_value_heads));
    // Older transformers releases ignore head_dim and derive it, so it only matters when different.
    if (cfg->num_attention_heads <= 0 || cfg->head_dim * cfg->num_attention_heads != cfg->hidden_size)
        json_need(cJSON_AddNumberToObject(root, "head_dim", cfg->head_dim));
    json_need(cJSON_AddNumberToObject(root, "vocab_size", cfg->vocab_size));
    json_need(cJSON_AddNumberToObject(root, "max_position_embeddings", cfg->max_position_embeddings));
    json_need(cJSON_AddNumberToObject(root, "rms_norm_eps", float_for_json(cfg->rms_norm_eps)));
    json_need(cJSON_AddNumberToObject(root, "rope_theta", float_for_json(cfg->rope_theta)));
    json_need(cJSON_AddBoolToObject(root, "tie_word_embeddings", cfg->tie_word_embeddings));
    json_need(cJSON_AddBoolToObject(root, "attention_bias", cfg->qkv_bias));
    json_need(cJSON_AddStringToObject(root, "hidden_act", "silu"));
    if (cfg->bos_token_id >= 0) json_need(cJSON_AddNumberToObject(root, "bos_token_id", cfg->bos_token_id));
    if (cfg->eos_token_id >= 0) json_need(cJSON_AddNumberToObject(root, "eos_token_id", cfg->eos_token_id));
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

// peft.c - Hugging Face PEFT LoRA adapters: target names, tensor names, adapter_config.json.
#include "peft.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static const char *const target_names[LORA_N_TARGETS] = {
    [LORA_Q] = "q_proj",       [LORA_K] = "k_proj",   [LORA_V] = "v_proj",       [LORA_O] = "o_proj",
    [LORA_GATE] = "gate_proj", [LORA_UP] = "up_proj", [LORA_DOWN] = "down_proj",
};

const char *peft_target_name(lora_target_t t) {
    return (int)t >= 0 && (int)t < LORA_N_TARGETS ? target_names[t] : NULL;
}

int peft_target_parse(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < LORA_N_TARGETS; i++) {
        const char *full = target_names[i];
        size_t stem = strlen(full) - strlen("_proj");
        if (!strcmp(name, full) || (strlen(name) == stem && !strncmp(name, full, stem))) return i;
    }
    return -1;
}

void peft_tensor_name(char *buf, size_t n, int layer, lora_target_t t, char ab) {
    ASSERT(layer >= 0 && (int)t >= 0 && (int)t < LORA_N_TARGETS && (ab == 'A' || ab == 'B'));
    const char *block = t <= LORA_O ? "self_attn" : "mlp";
    snprintf(buf, n, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", layer, block, target_names[t], ab);
}

// Options that change what the adapter computes; this implementation does plain LoRA only, so
// accepting them would silently give different outputs than PEFT.
static int check_unsupported(const cJSON *root, const char *src, char *err) {
    static const char *const flags[] = {"use_rslora", "use_dora"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, flags[i])))
            return err_set(err, "%s: %s is not supported", src, flags[i]);
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        return err_set(err, "%s: bias must be \"none\" (LoRA bias terms are not supported)", src);
    static const char *const maps[] = {"rank_pattern", "alpha_pattern", "modules_to_save"};
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, maps[i]);
        if (v && !cJSON_IsNull(v) && !((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child))
            return err_set(err, "%s: %s is not supported", src, maps[i]);
    }
    return 0;
}

static int parse_targets(const cJSON *tm, const char *src, unsigned *out, char *err) {
    *out = 0;
    // PEFT's shorthand for every linear layer except the output head.
    if (cJSON_IsString(tm) && !strcmp(tm->valuestring, "all-linear")) {
        *out = LORA_ALL_TARGETS;
        return 0;
    }
    if (!cJSON_IsArray(tm)) return err_set(err, "%s: target_modules must be a list of module names", src);
    for (const cJSON *v = tm->child; v; v = v->next) {
        if (!cJSON_IsString(v)) return err_set(err, "%s: target_modules must be a list of module names", src);
        int t = peft_target_parse(v->valuestring);
        if (t < 0)
            return err_set(err, "%s: unknown target module '%.64s' (expected q_proj, k_proj, v_proj, o_proj, "
                                "gate_proj, up_proj, down_proj)",
                           src, v->valuestring);
        *out |= 1u << t;
    }
    if (!*out) return err_set(err, "%s: target_modules is empty", src);
    return 0;
}

static int parse(peft_config_t *cfg, const char *json, const char *src, char *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(json);
    if (!root) return err_set(err, "%s: not valid JSON", src);
    if (!cJSON_IsObject(root)) {
        err_set(err, "%s: not a JSON object", src);
        goto fail;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0) {
        err_set(err, "%s: peft_type must be \"LORA\"", src);
        goto fail;
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1 && r->valuedouble <= INT_MAX) ||
        r->valuedouble != (double)(int)r->valuedouble) {
        err_set(err, "%s: r must be a positive integer", src);
        goto fail;
    }
    cfg->r = (int)r->valuedouble;
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    if (!cJSON_IsNumber(alpha) || !(fabs(alpha->valuedouble) <= FLT_MAX)) {
        err_set(err, "%s: lora_alpha must be a number", src);
        goto fail;
    }
    cfg->alpha = (float)alpha->valuedouble;
    if (parse_targets(cJSON_GetObjectItemCaseSensitive(root, "target_modules"), src, &cfg->targets, err) != 0 ||
        check_unsupported(root, src, err) != 0)
        goto fail;
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
    if (base && !cJSON_IsNull(base)) {
        if (!cJSON_IsString(base)) {
            err_set(err, "%s: base_model_name_or_path must be a string", src);
            goto fail;
        }
        snprintf(cfg->base_model, sizeof cfg->base_model, "%s", base->valuestring);
    }
    cJSON_Delete(root);
    return 0;
fail:
    cJSON_Delete(root);
    return -1;
}

int peft_config_parse(peft_config_t *cfg, const char *json, char *err) {
    return parse(cfg, json, "adapter_config.json", err);
}

int peft_config_load(peft_config_t *cfg, const char *path, char *err) {
    char *text = util_read_file(path, NULL, err);
    if (!text) return -1;
    int rc = parse(cfg, text, path, err);
    free(text);
    return rc;
}

char *peft_config_json(const peft_config_t *cfg, char *err) {
    if (cfg->r <= 0) {
        err_set(err, "r must be positive, got %d", cfg->r);
        return NULL;
    }
    if (!cfg->targets || (cfg->targets & ~LORA_ALL_TARGETS)) {
        err_set(err, "invalid target mask 0x%x", cfg->targets);
        return NULL;
    }
    if (!isfinite(cfg->alpha)) {
        err_set(err, "lora_alpha is not finite");
        return NULL;
    }

    cJSON *root = json_need(cJSON_CreateObject());
    json_need(cJSON_AddStringToObject(root, "peft_type", "LORA"));
    json_need(cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM"));
    json_need(cJSON_AddNumberToObject(root, "r", cfg->r));
    json_need(cJSON_AddNumberToObject(root, "lora_alpha", json_float_as_written(cfg->alpha)));
    json_need(cJSON_AddNumberToObject(root, "lora_dropout", 0.0));
    json_need(cJSON_AddStringToObject(root, "bias", "none"));
    cJSON *tm = json_need(cJSON_AddArrayToObject(root, "target_modules"));
    for (int t = 0; t < LORA_N_TARGETS; t++)
        if (cfg->targets & (1u << t))
            if (!cJSON_AddItemToArray(tm, json_need(cJSON_CreateString(target_names[t])))) json_need(NULL);
    if (cfg->base_model[0])
        json_need(cJSON_AddStringToObject(root, "base_model_name_or_path", cfg->base_model));
    else
        json_need(cJSON_AddNullToObject(root, "base_model_name_or_path"));

    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!json) json_need(NULL);
    char *out = xstrdup(json);
    cJSON_free(json);
    return out;
}

int peft_config_save(const peft_config_t *cfg, const char *path, char *err) {
    char e2[ERR_LEN];
    char *json = peft_config_json(cfg, e2);
    if (!json) return err_set(err, "%s: %s", path, e2);
    int rc = util_write_file(path, json, strlen(json), err);
    free(json);
    return rc;
}

int peft_blob_config(const st_file_t *f, peft_config_t *cfg, char *err) {
    memset(cfg, 0, sizeof *cfg);
    const char *r = st_metadata(f, "lora_r"), *al = st_metadata(f, "lora_alpha"), *tg = st_metadata(f, "lora_targets");
    if (!r || !al || !tg) return err_set(err, "adapter blob: metadata lora_r / lora_alpha / lora_targets missing");
    char *end;
    errno = 0;
    long rv = strtol(r, &end, 10);
    if (!*r || *end || errno || rv < 1 || rv > INT_MAX) return err_set(err, "adapter blob: lora_r '%.32s' is not a positive integer", r);
    float alpha = strtof(al, &end);
    if (!*al || *end || !isfinite(alpha)) return err_set(err, "adapter blob: lora_alpha '%.32s' is not a finite number", al);
    unsigned long t = strtoul(tg, &end, 10);
    if (!*tg || *end || !t || (t & ~(unsigned long)LORA_ALL_TARGETS))
        return err_set(err, "adapter blob: lora_targets '%.32s' is not a target mask", tg);
    cfg->r = (int)rv;
    cfg->alpha = alpha;
    cfg->targets = (unsigned)t;
    return 0;
}

// source.c - task sources (a built-in task or a dataset: examples, eval sets, verification, chat
// rendering of prompts), GRPO advantages and the Wilson interval of eval accuracy: the parts of
// rl.h that need no model or engine, so the verifier and the scheduler, which run none, link none.
#include "common/rl/rl.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/log.h"
#include "common/util/strset.h"

// --- sources ------------------------------------------------------------------------------------

int rl_source_open(rl_source_t *s, const char *task_name, const char *dataset_path, const char *verifier, char *err) {
    memset(s, 0, sizeof *s);
    if (dataset_path) {
        verify_spec_t v = {.kind = VERIFY_EXACT};
        if (verifier && verify_spec_parse(&v, verifier, err)) return -1;
        s->ds = dataset_load(dataset_path, &v, err);
        if (!s->ds) return -1;
        snprintf(s->name, sizeof s->name, "%s", task_name ? task_name : dataset_path);
        return 0;
    }
    if (!task_name) return err_set(err, "no task given");
    s->task = task_find(task_name);
    if (!s->task) return err_set(err, "unknown task '%s' (see `marlaas tasks`)", task_name);
    snprintf(s->name, sizeof s->name, "%s", task_name);
    return 0;
}

void rl_source_close(rl_source_t *s) {
    dataset_destroy(&s->ds);
    s->task = NULL;
}

int rl_source_example(const rl_source_t *s, task_split_t split, uint64_t index, task_example_t *ex) {
    if (s->ds) return dataset_example(s->ds, split, index, ex);
    task_example(s->task, split, index, ex);
    return 0;
}

int rl_source_eval_indices(const rl_source_t *s, int want, uint64_t **idx) {
    ASSERT(want >= 0 && idx != NULL);
    *idx = want ? xmalloc(sizeof(uint64_t) * (size_t)want) : NULL;
    if (s->ds) {   // the dataset's eval list holds each distinct prompt once
        int n = dataset_split_size(s->ds, TASK_EVAL);
        if (n > want) n = want;
        for (int i = 0; i < n; i++) (*idx)[i] = (uint64_t)i;
        return n;
    }
    // A family's eval prompts may be few (add1 holds out 13, wrap 99) and unevenly likely: draw
    // until `want` distinct ones are found or RL_EVAL_DRAWS draws per example asked (at least
    // 1024) are made. 32 finds every held-out prompt of the built-in families that have fewer
    // than asked (128 finds no more).
    strset_t seen = {0};
    int n = 0;
    uint64_t tries = (uint64_t)want * RL_EVAL_DRAWS;
    if (tries < 1024) tries = 1024;
    for (uint64_t i = 0; n < want && i < tries; i++) {
        task_example_t ex = {0};
        task_example(s->task, TASK_EVAL, i, &ex);
        if (strset_add(&seen, ex.prompt)) (*idx)[n++] = i;
        task_example_free(&ex);
    }
    strset_free(&seen);
    return n;
}

float rl_source_verify(const rl_source_t *s, const task_example_t *ex, int handle, const char *completion) {
    float r = s->ds ? dataset_verify(s->ds, handle, completion) : s->task->verify(ex, completion);
    return isfinite(r) ? (r < 0.0f ? 0.0f : r > 1.0f ? 1.0f : r) : 0.0f;
}

int rl_source_set_chat(rl_source_t *s, const chat_template_t *ct, const char *why_none, const char *system,
                       const char *chat_vars, char *err) {
    if (!ct) return err_set(err, "chat prompts need the model's chat template: %s", why_none && *why_none ? why_none : "none");
    s->chat = ct;
    s->system = system && *system ? system : NULL;
    s->chat_vars = chat_vars && *chat_vars ? chat_vars : NULL;
    return 0;
}

char *rl_source_prompt(const rl_source_t *s, const task_example_t *ex, int handle, char *err) {
    const char *msgs = s->ds ? dataset_messages(s->ds, handle) : NULL;
    if (!s->chat) {
        if (msgs) {
            err_set(err, "%s:%ld: a \"messages\" record needs a chat job (\"chat\": true; --chat on the command line)", s->name,
                    dataset_record_line(s->ds, handle));
            return NULL;
        }
        return xstrdup(ex->prompt);
    }
    // {"messages": [system?, the conversation or the user's prompt], "add_generation_prompt": true, vars...}
    cJSON *req = cJSON_CreateObject(), *arr = NULL;
    if (s->chat_vars) {
        cJSON *vars = cJSON_Parse(s->chat_vars);
        if (!cJSON_IsObject(vars)) {
            cJSON_Delete(vars), cJSON_Delete(req);
            err_set(err, "chat_vars is not a JSON object");
            return NULL;
        }
        cJSON_Delete(req);
        req = vars;
    }
    if (msgs) {
        arr = cJSON_Parse(msgs);
        ASSERT(cJSON_IsArray(arr));   // validated when the dataset was parsed
    } else {
        arr = cJSON_CreateArray();
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", ex->prompt);
        cJSON_AddItemToArray(arr, u);
    }
    if (s->system) {
        cJSON *sy = cJSON_CreateObject();
        cJSON_AddStringToObject(sy, "role", "system");
        cJSON_AddStringToObject(sy, "content", s->system);
        cJSON_InsertItemInArray(arr, 0, sy);
    }
    cJSON_AddItemToObject(req, "messages", arr);
    cJSON_AddBoolToObject(req, "add_generation_prompt", true);
    char *txt = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (!txt) {
        log_fatal("out of memory at %s:%d", __FILE__, __LINE__);
        abort();
    }
    chat_opts_t o = {.add_generation_prompt = true, .force_generation_prompt = true};
    char e2[ERR_LEN] = "";
    char *out = chat_render(s->chat, txt, strlen(txt), &o, NULL, e2);
    cJSON_free(txt);
    if (!out) {
        if (s->ds) err_set(err, "%s:%ld: chat template: %s", s->name, dataset_record_line(s->ds, handle), e2);
        else err_set(err, "chat template: %s", e2);
    }
    return out;
}

// --- GRPO ---------------------------------------------------------------------------------------

void rl_group_advantages(const float *r, int G, bool std_norm, float *adv) {
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < G; i++) mean += r[i];
    mean /= G;
    for (int i = 0; i < G; i++) var += (r[i] - mean) * (r[i] - mean);
    double sd = sqrt(var / G);
    for (int i = 0; i < G; i++) adv[i] = (float)(std_norm ? (r[i] - mean) / (sd + 1e-4) : r[i] - mean);
}

// --- statistics ---------------------------------------------------------------------------------

void rl_wilson(int k, int n, double *lo, double *hi) {
    if (n <= 0) {
        *lo = 0.0, *hi = 1.0;
        return;
    }
    double z = 1.959963984540054, p = (double)k / n, z2 = z * z;
    double den = 1.0 + z2 / n, c = (p + z2 / (2.0 * n)) / den;
    double h = z * sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / den;
    *lo = c - h < 0.0 ? 0.0 : c - h;
    *hi = c + h > 1.0 ? 1.0 : c + h;
}

// In this file, not rl.c: the scheduler sizes a simulated rollout's cache and links no engine.
int rl_sim_kv_blocks(const sim_t *sim, const hf_config_t *mc, int n_slots, char *err) {
    peft_config_t pc = {.r = 16, .alpha = 16, .targets = LORA_ALL_TARGETS};
    int64_t blocks = sim_kv_blocks(sim, 16, n_slots, (double)lora_param_count(mc, &pc), err);
    if (blocks < 0) return -1;
    return blocks > INT_MAX / 16 ? INT_MAX / 16 : (int)blocks;
}

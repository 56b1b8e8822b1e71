// jobspec.c - job specification: defaults, strict JSON parsing with precise errors, JSON output.
#include "common/rl/jobspec.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/peft.h"
#include "common/formats/tok_text.h"
#include "common/tasks/dataset.h"
#include "common/tasks/tasks.h"

void jobspec_defaults(jobspec_t *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->verifier, sizeof s->verifier, "exact");
    s->max_steps = 200;
    s->group = 8;
    s->prompts = 32;
    s->max_new = 24;
    s->temperature = 1.0;
    s->top_p = 1.0;
    s->lr = 1e-3;
    s->rank = 8;
    s->alpha = 16.0;
    s->targets = LORA_ALL_TARGETS;
    s->clip_low = 0.2;
    s->clip_high = 0.28;
    s->std_norm = true;
    s->staleness = 1;
    s->eval_every = 25;
    s->eval_n = 200;
    s->weight = 1.0;
    s->seed = 1;
    s->reward_timeout_ms = 2000;
    s->max_turns = 1;
    s->env_timeout_ms = 5000;
    s->reward_retries = 1;
}

static int get_int(const cJSON *v, const char *k, long lo, long hi, int *out, char *err) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return err_set(err, "spec.%s must be an integer in %ld..%ld", k, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_float(const cJSON *v, const char *k, double lo, double hi, bool lo_open, double *out, char *err) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble > hi ||
        (lo_open ? v->valuedouble <= lo : v->valuedouble < lo))
        return err_set(err, "spec.%s must be a number in %s%g, %g]", k, lo_open ? "(" : "[", lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_str(const cJSON *v, const char *k, char *out, size_t n, char *err) {
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= n)
        return err_set(err, "spec.%s must be a non-empty string of at most %zu bytes", k, n - 1);
    size_t bad = 0;
    if (!tok_utf8_valid(v->valuestring, strlen(v->valuestring), &bad))
        return err_set(err, "spec.%s is not valid UTF-8 (byte %zu)", k, bad);
    snprintf(out, n, "%s", v->valuestring);
    return 0;
}

static int get_targets(const cJSON *v, unsigned *out, char *err) {
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "all")) {
        *out = LORA_ALL_TARGETS;
        return 0;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return err_set(err, "spec.targets must be \"all\" or a non-empty list of q,k,v,o,gate,up,down");
    *out = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        int t = cJSON_IsString(it) ? peft_target_parse(it->valuestring) : -1;
        if (t < 0) return err_set(err, "spec.targets: unknown target %s", cJSON_IsString(it) ? it->valuestring : "(not a string)");
        *out |= 1u << t;
    }
    return 0;
}

// Names a template variable may not take: they are the request's structure (the messages, the
// generation prompt), or features a job does not have (tools, documents, prefilling).
static const char *const reserved_vars[] = {"messages", "add_generation_prompt", "continue_final_message", "tools",
                                            "documents", "chat_template", "tokenize"};

// spec.chat_vars: an object of at most 16 template variables, each named like a Python
// identifier and holding a boolean, a number, a string (at most JOBSPEC_MAX_CHAT_VAR_STR bytes)
// or null. Written as compact JSON into out.
static int get_chat_vars(const cJSON *v, char *out, size_t n, char *err) {
    if (!cJSON_IsObject(v)) return err_set(err, "spec.chat_vars must be an object of template variables");
    int count = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        const char *k = it->string;
        size_t kl = strlen(k);
        bool ident = kl > 0 && kl < 64 && !(k[0] >= '0' && k[0] <= '9');
        for (size_t i = 0; ident && i < kl; i++)
            ident = (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '_';
        if (!ident) return err_set(err, "spec.chat_vars: '%.64s' is not a variable name (letters, digits, _; 1..63 bytes)", k);
        for (size_t i = 0; i < sizeof reserved_vars / sizeof reserved_vars[0]; i++)
            if (!strcmp(k, reserved_vars[i]))
                return err_set(err, "spec.chat_vars.%s is set by the job itself and may not be given", k);
        if (++count > 16) return err_set(err, "spec.chat_vars holds more than 16 variables");
        if (cJSON_IsString(it) && strlen(it->valuestring) >= JOBSPEC_MAX_CHAT_VAR_STR)
            return err_set(err, "spec.chat_vars.%s: a string of at most %d bytes", k, JOBSPEC_MAX_CHAT_VAR_STR - 1);
        if (cJSON_IsNumber(it) && !isfinite(it->valuedouble))
            return err_set(err, "spec.chat_vars.%s must be finite", k);
        if (!cJSON_IsBool(it) && !cJSON_IsNumber(it) && !cJSON_IsString(it) && !cJSON_IsNull(it))
            return err_set(err, "spec.chat_vars.%s must be true, false, a number, a string or null", k);
    }
    if (!count) {
        out[0] = '\0';
        return 0;
    }
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt || strlen(txt) >= n) {
        cJSON_free(txt);
        return err_set(err, "spec.chat_vars is longer than %zu bytes as JSON", n - 1);
    }
    snprintf(out, n, "%s", txt);
    cJSON_free(txt);
    return 0;
}

// A NUL escape (\u0000) anywhere in the text: cJSON would cut the string there, silently.
static bool has_nul_escape(const char *json) {
    for (const char *p = strstr(json, "\\u"); p; p = strstr(p + 1, "\\u")) {
        size_t bs = 1;   // an escape only where the run of backslashes ending at p is odd
        for (const char *q = p; q > json && q[-1] == '\\'; q--) bs++;
        if (bs % 2 == 1 && p[2] == '0' && p[3] == '0' && p[4] == '0' && p[5] == '0') return true;
    }
    return false;
}

int jobspec_parse(jobspec_t *s, const char *json, char *err) {
    jobspec_defaults(s);
    json = json ? json : "";
    if (has_nul_escape(json)) return err_set(err, "spec holds a NUL character (\\u0000) in a string: remove it");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, true);
    if (!root && end && *end && cJSON_GetErrorPtr() == end) {
        // parsed an object, then found more: say so rather than "not JSON"
        cJSON *first = cJSON_ParseWithOpts(json, NULL, false);
        bool obj = first != NULL;
        cJSON_Delete(first);
        if (obj) return err_set(err, "spec has text after its JSON object (at byte %zu): send one object", (size_t)(end - json));
    }
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(err, "spec must be a JSON object");
    }
    int rc = -1;
    bool have_task = false;
    const cJSON *v;
    cJSON_ArrayForEach(v, root) {
        const char *k = v->string;
        int e = 0;
        size_t kbad = 0;
        if (!tok_utf8_valid(k, strlen(k), &kbad)) {
            err_set(err, "spec has a field name that is not valid UTF-8 (byte %zu of the name)", kbad);
            goto done;
        }
        if (!strcmp(k, "name")) e = get_str(v, k, s->name, sizeof s->name, err);
        else if (!strcmp(k, "task")) e = get_str(v, k, s->task, sizeof s->task, err), have_task = true;
        else if (!strcmp(k, "dataset")) {
            if (!cJSON_IsBool(v)) e = err_set(err, "spec.dataset must be true or false");
            s->dataset = cJSON_IsTrue(v);
        } else if (!strcmp(k, "verifier")) {
            verify_spec_t vs;
            e = get_str(v, k, s->verifier, sizeof s->verifier, err);
            if (!e && verify_spec_parse(&vs, s->verifier, err)) {
                char e2[ERR_LEN];
                snprintf(e2, sizeof e2, "%s", err);
                e = err_set(err, "spec.verifier: %s", e2);
            }
        } else if (!strcmp(k, "max_steps")) e = get_int(v, k, 1, 100000, &s->max_steps, err);
        else if (!strcmp(k, "target_accuracy")) e = get_float(v, k, 0, 1, false, &s->target_accuracy, err);
        else if (!strcmp(k, "group")) e = get_int(v, k, 2, 256, &s->group, err);
        else if (!strcmp(k, "prompts")) e = get_int(v, k, 1, 1024, &s->prompts, err);
        else if (!strcmp(k, "max_new")) e = get_int(v, k, 1, 32768, &s->max_new, err);
        else if (!strcmp(k, "temperature")) e = get_float(v, k, 0, 10, true, &s->temperature, err);
        else if (!strcmp(k, "top_p")) e = get_float(v, k, 0, 1, true, &s->top_p, err);
        else if (!strcmp(k, "top_k")) e = get_int(v, k, 0, 1000000, &s->top_k, err);
        else if (!strcmp(k, "lr")) e = get_float(v, k, 0, 1, true, &s->lr, err);
        else if (!strcmp(k, "rank")) e = get_int(v, k, 1, 256, &s->rank, err);
        else if (!strcmp(k, "alpha")) e = get_float(v, k, 0, 1e6, true, &s->alpha, err);
        else if (!strcmp(k, "targets")) e = get_targets(v, &s->targets, err);
        else if (!strcmp(k, "kl")) e = get_float(v, k, 0, 100, false, &s->kl, err);
        else if (!strcmp(k, "clip_low")) e = get_float(v, k, 0, 1, false, &s->clip_low, err);
        else if (!strcmp(k, "clip_high")) e = get_float(v, k, 0, 10, false, &s->clip_high, err);
        else if (!strcmp(k, "std_norm")) {
            if (!cJSON_IsBool(v)) e = err_set(err, "spec.std_norm must be true or false");
            s->std_norm = cJSON_IsTrue(v);
        } else if (!strcmp(k, "staleness")) e = get_int(v, k, 0, 64, &s->staleness, err);
        else if (!strcmp(k, "eval_every")) e = get_int(v, k, 0, 100000, &s->eval_every, err);
        else if (!strcmp(k, "eval_n")) e = get_int(v, k, 1, 100000, &s->eval_n, err);
        else if (!strcmp(k, "weight")) e = get_float(v, k, 0, 100, true, &s->weight, err);
        else if (!strcmp(k, "seed")) {
            int x;
            e = get_int(v, k, 0, 2147483647L, &x, err);
            s->seed = (uint64_t)x;
        } else if (!strcmp(k, "reward")) {
            if (!cJSON_IsObject(v)) {
                e = err_set(err, "spec.reward must be an object {endpoint, timeout_ms, retries, on_failure}");
            } else {
                const cJSON *r;
                cJSON_ArrayForEach(r, v) {
                    const char *rk = r->string;
                    if (!strcmp(rk, "endpoint")) {
                        e = get_str(r, "reward.endpoint", s->reward_endpoint, sizeof s->reward_endpoint, err);
                        if (!e && strncmp(s->reward_endpoint, "tcp://", 6) && strncmp(s->reward_endpoint, "ipc://", 6))
                            e = err_set(err, "spec.reward.endpoint must start with tcp:// or ipc://");
                    } else if (!strcmp(rk, "timeout_ms")) e = get_int(r, "reward.timeout_ms", 10, 600000, &s->reward_timeout_ms, err);
                    else if (!strcmp(rk, "retries")) e = get_int(r, "reward.retries", 0, 10, &s->reward_retries, err);
                    else if (!strcmp(rk, "on_failure")) {
                        if (cJSON_IsString(r) && !strcmp(r->valuestring, "zero")) s->reward_on_failure = REWARD_FAIL_ZERO;
                        else if (cJSON_IsString(r) && !strcmp(r->valuestring, "fail")) s->reward_on_failure = REWARD_FAIL_JOB;
                        else e = err_set(err, "spec.reward.on_failure must be \"zero\" or \"fail\"");
                    } else e = err_set(err, "spec.reward: unknown field '%s'", rk);
                    if (e) break;
                }
            }
        } else if (!strcmp(k, "env")) {
            if (!cJSON_IsObject(v)) {
                e = err_set(err, "spec.env must be an object {max_turns, max_context, endpoint, timeout_ms}");
            } else {
                const cJSON *r;
                cJSON_ArrayForEach(r, v) {
                    const char *rk = r->string;
                    if (!strcmp(rk, "max_turns")) e = get_int(r, "env.max_turns", 1, 64, &s->max_turns, err);
                    else if (!strcmp(rk, "max_context")) e = get_int(r, "env.max_context", 0, 8192, &s->max_context, err);
                    else if (!strcmp(rk, "timeout_ms")) e = get_int(r, "env.timeout_ms", 10, 600000, &s->env_timeout_ms, err);
                    else if (!strcmp(rk, "endpoint")) {
                        e = get_str(r, "env.endpoint", s->env_endpoint, sizeof s->env_endpoint, err);
                        if (!e && strncmp(s->env_endpoint, "tcp://", 6) && strncmp(s->env_endpoint, "ipc://", 6))
                            e = err_set(err, "spec.env.endpoint must be tcp://host:port or ipc://path, got '%s'",
                                        s->env_endpoint);
                    } else e = err_set(err, "spec.env: unknown field '%s'", rk);
                    if (e) break;
                }
            }
        } else if (!strcmp(k, "chat")) {
            if (!cJSON_IsBool(v)) e = err_set(err, "spec.chat must be true or false");
            s->chat = cJSON_IsTrue(v);
        } else if (!strcmp(k, "system")) {
            if (!cJSON_IsString(v) || strlen(v->valuestring) >= sizeof s->system)
                e = err_set(err, "spec.system must be a string of at most %zu bytes", sizeof s->system - 1);
            else if (!tok_utf8_valid(v->valuestring, strlen(v->valuestring), NULL))
                e = err_set(err, "spec.system is not valid UTF-8");
            else snprintf(s->system, sizeof s->system, "%s", v->valuestring);
        } else if (!strcmp(k, "chat_vars")) {
            e = get_chat_vars(v, s->chat_vars, sizeof s->chat_vars, err);
        } else e = err_set(err, "spec: unknown field '%s'", k);
        if (e) goto done;
    }
    if (!have_task) {
        err_set(err, "spec.task is required (a built-in task, see `marlaas tasks`, or a name for an uploaded dataset)");
        goto done;
    }
    if (!s->dataset && !task_find(s->task)) {
        err_set(err, "spec.task: unknown task '%s' (see `marlaas tasks`; set \"dataset\": true to upload one)", s->task);
        goto done;
    }
    if (s->env_endpoint[0] && s->reward_endpoint[0]) {
        err_set(err, "spec.env.endpoint rewards the episodes itself: leave spec.reward out");
        goto done;
    }
    if (s->max_turns > 1 && !s->env_endpoint[0] && (s->dataset || !task_find(s->task)->env)) {
        err_set(err, "spec.env.max_turns %d: task '%s' has no tools; give an environment (spec.env.endpoint) or "
                "use a task with tools (tcalc, tlook; see `marlaas tasks`)", s->max_turns, s->task);
        goto done;
    }
    if (!s->chat && (s->system[0] || s->chat_vars[0])) {
        err_set(err, "spec.%s needs \"chat\": true (it is given to the model's chat template)",
                s->system[0] ? "system" : "chat_vars");
        goto done;
    }
    if (s->chat && s->max_turns > 1) {
        err_set(err, "spec.chat: multi-turn episodes (env.max_turns %d) speak the tool protocol of plain text, not a "
                "chat template; leave one of them out", s->max_turns);
        goto done;
    }
    if (!s->name[0]) snprintf(s->name, sizeof s->name, "%s", s->task);
    // the fields named their own bad bytes above; anything else (a key, an ignored value) here
    size_t bad = 0;
    if (!tok_utf8_valid(json, strlen(json), &bad)) {
        err_set(err, "spec is not valid UTF-8 (byte %zu): send UTF-8 text", bad);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

char *jobspec_to_json(const jobspec_t *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", s->name);
    cJSON_AddStringToObject(o, "task", s->task);
    cJSON_AddBoolToObject(o, "dataset", s->dataset);
    cJSON_AddStringToObject(o, "verifier", s->verifier);
    cJSON_AddNumberToObject(o, "max_steps", s->max_steps);
    cJSON_AddNumberToObject(o, "target_accuracy", s->target_accuracy);
    cJSON_AddNumberToObject(o, "group", s->group);
    cJSON_AddNumberToObject(o, "prompts", s->prompts);
    cJSON_AddNumberToObject(o, "max_new", s->max_new);
    cJSON_AddNumberToObject(o, "temperature", s->temperature);
    cJSON_AddNumberToObject(o, "top_p", s->top_p);
    cJSON_AddNumberToObject(o, "top_k", s->top_k);
    cJSON_AddNumberToObject(o, "lr", s->lr);
    cJSON_AddNumberToObject(o, "rank", s->rank);
    cJSON_AddNumberToObject(o, "alpha", s->alpha);
    cJSON *t = cJSON_AddArrayToObject(o, "targets");
    for (int i = 0; i < LORA_N_TARGETS; i++)
        if (s->targets & (1u << i)) cJSON_AddItemToArray(t, cJSON_CreateString(peft_target_name(i)));
    cJSON_AddNumberToObject(o, "kl", s->kl);
    cJSON_AddNumberToObject(o, "clip_low", s->clip_low);
    cJSON_AddNumberToObject(o, "clip_high", s->clip_high);
    cJSON_AddBoolToObject(o, "std_norm", s->std_norm);
    cJSON_AddNumberToObject(o, "staleness", s->staleness);
    cJSON_AddNumberToObject(o, "eval_every", s->eval_every);
    cJSON_AddNumberToObject(o, "eval_n", s->eval_n);
    cJSON_AddNumberToObject(o, "weight", s->weight);
    cJSON_AddNumberToObject(o, "seed", (double)s->seed);
    if (s->reward_endpoint[0]) {
        cJSON *r = cJSON_AddObjectToObject(o, "reward");
        cJSON_AddStringToObject(r, "endpoint", s->reward_endpoint);
        cJSON_AddNumberToObject(r, "timeout_ms", s->reward_timeout_ms);
        cJSON_AddNumberToObject(r, "retries", s->reward_retries);
        cJSON_AddStringToObject(r, "on_failure", s->reward_on_failure == REWARD_FAIL_JOB ? "fail" : "zero");
    }
    if (s->max_turns > 1 || s->max_context || s->env_endpoint[0]) {
        cJSON *r = cJSON_AddObjectToObject(o, "env");
        cJSON_AddNumberToObject(r, "max_turns", s->max_turns);
        cJSON_AddNumberToObject(r, "max_context", s->max_context);
        if (s->env_endpoint[0]) cJSON_AddStringToObject(r, "endpoint", s->env_endpoint);
        cJSON_AddNumberToObject(r, "timeout_ms", s->env_timeout_ms);
    }
    if (s->chat) {
        cJSON_AddBoolToObject(o, "chat", true);
        if (s->system[0]) cJSON_AddStringToObject(o, "system", s->system);
        if (s->chat_vars[0]) cJSON_AddItemToObject(o, "chat_vars", cJSON_Parse(s->chat_vars));
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *copy = xstrdup(txt ? txt : "{}");
    cJSON_free(txt);
    return copy;
}

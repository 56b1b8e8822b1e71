// api.c - request handling for the scheduler's client API (see api.h).
#include "services/scheduler/api.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/engine/kvcache.h"
#include "common/sim/sim.h"
#include "common/engine/lora.h"
#include "common/formats/json.h"
#include "common/net/endpoint.h"
#include "common/net/bus.h"
#include "common/rl/jobspec.h"
#include "common/rl/rl.h"
#include "common/tasks/dataset.h"
#include "common/sim/sim.h"
#include "common/util/log.h"
#include "common/rl/keys.h"

struct api {
    store_t *st;
    sched_t *sc;
    char admin[256];
    uint64_t n_req, n_err;
    hf_config_t model;
    char *model_json;
    char base_model[256];          // what pulled adapters name as their base (adapter_get)
    hf_generation_config_t gen;    // the model's generation_config.json (has_gen: it exists)
    bool has_gen;
    char gen_notes[640];           // its settings that sampling here cannot apply
    const chat_template_t *chat;   // borrowed; NULL when the model has none
    char chat_error[ERR_LEN];
    tokenizer_t *tok;              // the model's: prompts measured against the context at submission
    rl_runtime_cfg_t serve;        // the context and KV cache the rollouts serve (api_set_serving)
    bool simulated;                // the cluster's services run --backend sim:DEVICE (api_set_simulated)
    endpoint_rules_t *endpoints;   // where tenants' services may be (api_set_endpoint_rules); owned
};

void api_set_simulated(api_t *a, bool on) { a->simulated = on; }

api_t *api_new(store_t *st, sched_t *sc, const char *admin_token, const char *model_dir, char *err) {
    if (sodium_init() < 0) {
        err_set(err, "libsodium failed to initialise");
        return NULL;
    }
    api_t *a = xcalloc(1, sizeof *a);
    a->st = st;
    a->sc = sc;
    snprintf(a->admin, sizeof a->admin, "%s", admin_token ? admin_token : "");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    a->model_json = util_read_file(path, NULL, err);
    if (!a->model_json || hf_config_parse(&a->model, a->model_json, err)) {
        free(a->model_json);
        free(a);
        return NULL;
    }
    // PEFT's base_model_name_or_path: the checkpoint's own name when its config.json keeps one
    // (_name_or_path, e.g. "Qwen/Qwen3-0.6B"), else the folder the scheduler serves.
    cJSON *cj = cJSON_Parse(a->model_json);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cj, "_name_or_path");
    char *abs = realpath(model_dir, NULL);
    const char *base = cJSON_IsString(nm) && nm->valuestring[0] ? nm->valuestring : abs ? abs : model_dir;
    if (strlen(base) < sizeof a->base_model) memcpy(a->base_model, base, strlen(base) + 1);
    free(abs);
    cJSON_Delete(cj);
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    int rc = hf_generation_config_load(&a->gen, path, err);
    if (rc < 0) {
        free(a->model_json);
        free(a);
        return NULL;
    }
    a->has_gen = rc == 0;
    if (a->has_gen && a->gen.unsupported[0])
        snprintf(a->gen_notes, sizeof a->gen_notes, "generation_config.json: %s not applied (no counterpart here)",
                 a->gen.unsupported);
    if (a->gen_notes[0]) log_warn("%s", a->gen_notes);
    snprintf(a->chat_error, sizeof a->chat_error, "the model has no chat template");
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    a->tok = tokenizer_load(path, err);
    if (!a->tok || api_set_serving(a, 0, 0, 0, err)) {
        api_destroy(&a);
        return NULL;
    }
    return a;
}

int api_set_serving(api_t *a, int max_context, int kv_mb, int kv_blocks, char *err) {
    rl_runtime_cfg_t c = {.max_context = max_context, .kv_mb = kv_mb, .kv_blocks = kv_blocks};
    if (rl_serving_cfg(&a->model, &c, &a->serve, err)) return -1;
    return 0;
}

void api_set_endpoint_rules(api_t *a, endpoint_rules_t *rules) {
    endpoint_rules_destroy(&a->endpoints);
    a->endpoints = rules;
}

void api_set_chat(api_t *a, const chat_template_t *ct, const char *why_none) {
    a->chat = ct;
    snprintf(a->chat_error, sizeof a->chat_error, "%s", why_none ? why_none : "");
}

void api_destroy(api_t **pa) {
    if (!pa || !*pa) return;
    free((*pa)->model_json);
    tokenizer_destroy(&(*pa)->tok);
    endpoint_rules_destroy(&(*pa)->endpoints);
    free(*pa);
    *pa = NULL;
}

// hex of the BLAKE2b hash of a token: tokens are never stored in clear
static void token_hash(const char *token, char out[65]) {
    unsigned char h[32];
    crypto_generichash(h, sizeof h, (const unsigned char *)token, strlen(token), NULL, 0);
    sodium_bin2hex(out, 65, h, sizeof h);
}

static bool is_admin(const api_t *a, const char *token) {
    size_t n = strlen(a->admin);
    return n > 0 && strlen(token) == n && sodium_memcmp(token, a->admin, n) == 0;
}

// Tenant id of a token (0), or -1 when the token is unknown.
static int tenant_of(api_t *a, const char *token, char tenant[PROTO_MAX_ID], char *err) {
    char key[256], hash[65], *t = NULL;
    if (!token || !*token) return err_set(err, "missing token");
    token_hash(token, hash);
    key_tokens(a->st, key, sizeof key);
    int rc = store_hget(a->st, key, hash, &t, NULL, err);
    if (rc == 1) return err_set(err, "invalid token");
    if (rc < 0) return -1;
    snprintf(tenant, PROTO_MAX_ID, "%s", t);
    free(t);
    return 0;
}

// The job's hash if the caller may see it (its tenant, or admin). -1 + "no such job".
static int job_get(api_t *a, const char *job, const char *tenant, bool admin, store_kv_t **kv, int *n, char *err) {
    char key[256];
    if (!job || !*job || strlen(job) >= PROTO_MAX_ID) return err_set(err, "no such job");
    key_job(a->st, key, sizeof key, job);
    int rc = store_hgetall(a->st, key, kv, n, err);
    if (rc) return rc == 1 ? err_set(err, "no such job: %s", job) : -1;
    bool mine = admin;
    for (int i = 0; i < *n; i++)
        if (!strcmp((*kv)[i].field, JOB_TENANT) && !strcmp((*kv)[i].value, tenant)) mine = true;
    if (!mine) {
        store_kv_free(kv, *n);
        return err_set(err, "no such job: %s", job);
    }
    return 0;
}

static const char *kv_get(store_kv_t *kv, int n, const char *f) {
    for (int i = 0; i < n; i++)
        if (!strcmp(kv[i].field, f)) return kv[i].value;
    return NULL;
}

static cJSON *job_json(store_kv_t *kv, int n, const char *id, bool with_spec) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    for (int i = 0; i < n; i++) {
        const char *f = kv[i].field, *v = kv[i].value;
        if (!strcmp(f, JOB_SPEC)) {
            cJSON *sp = cJSON_Parse(v);
            if (with_spec && sp) cJSON_AddItemToObject(o, "spec", sp);
            else {
                const cJSON *nm = cJSON_GetObjectItem(sp, "name"), *tk = cJSON_GetObjectItem(sp, "task"),
                            *ms = cJSON_GetObjectItem(sp, "max_steps");
                if (cJSON_IsString(nm)) cJSON_AddStringToObject(o, "name", nm->valuestring);
                if (cJSON_IsString(tk)) cJSON_AddStringToObject(o, "task", tk->valuestring);
                if (cJSON_IsNumber(ms)) cJSON_AddNumberToObject(o, "max_steps", ms->valuedouble);
                cJSON_Delete(sp);
            }
        } else if (!strcmp(f, JOB_STATUS) || !strcmp(f, JOB_TENANT) || !strcmp(f, JOB_ERROR)) {
            cJSON_AddStringToObject(o, f, v);
        } else {
            char *end;
            double d = strtod(v, &end);
            if (*v && !*end) cJSON_AddNumberToObject(o, f, d);
            else cJSON_AddStringToObject(o, f, v);
        }
    }
    return o;
}

// JSON results travel as BIN: a job list or a metrics stream outgrows a string field's cap.
static void result_json(proto_args_t *res, const char *key, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    proto_args_bin(res, key, s ? s : "null", strlen(s ? s : "null"));
    cJSON_free(s);
    cJSON_Delete(o);
}

// --- operations ----------------------------------------------------------------------------------

static int op_tenant_create(api_t *a, const proto_req_t *q, proto_args_t *res, char *err) {
    if (!is_admin(a, q->token)) return err_set(err, "tenant_create needs the admin token");
    const char *name = proto_args_get_str(&q->args, "name");
    if (!name || !*name || strlen(name) > 63) return err_set(err, "tenant_create: name (1..63 bytes) required");
    int64_t quota = 16;
    if (proto_args_get(&q->args, "quota") && (!proto_args_get_int(&q->args, "quota", &quota) || quota < 1 || quota > 10000))
        return err_set(err, "tenant_create: quota must be an integer in 1..10000");
    int64_t max_groups = TENANT_DEFAULT_MAX_GROUPS, max_data_mb = TENANT_DEFAULT_MAX_DATA >> 20;
    if (proto_args_get(&q->args, "max_groups") &&
        (!proto_args_get_int(&q->args, "max_groups", &max_groups) || max_groups < 1 || max_groups > 1000000))
        return err_set(err, "tenant_create: max_groups must be an integer in 1..1000000");
    if (proto_args_get(&q->args, "max_data_mb") &&
        (!proto_args_get_int(&q->args, "max_data_mb", &max_data_mb) || max_data_mb < 0 || max_data_mb > 1 << 20))
        return err_set(err, "tenant_create: max_data_mb must be an integer in 0..1048576");
    double weight = 1;
    const proto_val_t *wv = proto_args_get(&q->args, "weight");
    if (wv) {
        int64_t wi;
        if (wv->kind == PROTO_VAL_FLOAT) weight = wv->f;
        else if (proto_args_get_int(&q->args, "weight", &wi)) weight = (double)wi;
        else weight = -1;
        if (!(weight >= 0.01 && weight <= 100)) return err_set(err, "tenant_create: weight must be a number in [0.01, 100]");
    }
    char key[256], id[PROTO_MAX_ID], token[64], hash[65], qs[32], now[32], ws[32], gs[32], ds[32];
    int64_t seq;
    key_tenant_seq(a->st, key, sizeof key);
    if (store_incr(a->st, key, &seq, err)) return -1;
    snprintf(id, sizeof id, "t-%lld", (long long)seq);
    unsigned char rnd[24];
    randombytes_buf(rnd, sizeof rnd);
    memcpy(token, "mt_", 3);
    sodium_bin2hex(token + 3, sizeof token - 3, rnd, sizeof rnd);
    token_hash(token, hash);
    snprintf(qs, sizeof qs, "%lld", (long long)quota);
    snprintf(now, sizeof now, "%ld", (long)time(NULL));
    key_tenant(a->st, key, sizeof key, id);
    snprintf(ws, sizeof ws, "%.17g", weight);
    snprintf(gs, sizeof gs, "%lld", (long long)max_groups);
    snprintf(ds, sizeof ds, "%lld", (long long)max_data_mb << 20);
    const char *f[7] = {TENANT_NAME, TENANT_TOKEN_HASH, TENANT_QUOTA, TENANT_CREATED, TENANT_WEIGHT, TENANT_MAX_GROUPS,
                        TENANT_MAX_DATA},
               *v[7] = {name, hash, qs, now, ws, gs, ds};
    if (store_hset(a->st, key, 7, f, v, err)) return -1;
    key_tokens(a->st, key, sizeof key);
    const char *tf[1] = {hash}, *tv[1] = {id};
    if (store_hset(a->st, key, 1, tf, tv, err)) return -1;
    key_tenants(a->st, key, sizeof key);
    const char *m[1] = {id};
    if (store_sadd(a->st, key, 1, m, NULL, err)) return -1;
    proto_args_str(res, "tenant", id);
    proto_args_str(res, "token", token);
    logt_info(id, NULL, "tenant %s (%s) created: quota %lld jobs, %lld groups in flight, %lld MiB of datasets, weight %g",
              id, name, (long long)quota, (long long)max_groups, (long long)max_data_mb, weight);
    return 0;
}

// The tenant's queued and running jobs, and the bytes of their uploaded datasets in *data.
static int count_active(api_t *a, const char *tenant, long long *data, char *err) {
    char key[256], **ids = NULL;
    int n = 0, active = 0;
    *data = 0;
    key_tenant_jobs(a->st, key, sizeof key, tenant);
    if (store_smembers(a->st, key, &ids, &n, err)) return -1;
    for (int i = 0; i < n; i++) {
        store_kv_t *kv = NULL;
        int nk = 0;
        key_job(a->st, key, sizeof key, ids[i]);
        if (store_hgetall(a->st, key, &kv, &nk, err) < 0) {
            store_strv_free(&ids, n);
            return -1;
        }
        const char *st = kv_get(kv, nk, JOB_STATUS), *db = kv_get(kv, nk, JOB_DATA_BYTES);
        if (st && (!strcmp(st, "queued") || !strcmp(st, "running"))) {
            active++;
            if (db) *data += atoll(db);
        }
        store_kv_free(&kv, nk);
    }
    store_strv_free(&ids, n);
    return active;
}

// Appends a note (one line of what the submission changed or could not apply) to notes.
static void note(char *notes, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *notes, size_t n, const char *fmt, ...) {
    size_t used = strlen(notes);
    if (used + 3 >= n) return;
    if (used) used += (size_t)snprintf(notes + used, n - used, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + used, n - used, fmt, ap);
    va_end(ap);
}
// The model's generation_config.json fills the sampling fields the spec does not give, before
// the spec is stored, so the canonical spec shows the values used. A value outside the spec's
// range is not applied; do_sample false (greedy, which would give GRPO identical samples) keeps
// this service's defaults. Both are noted, as are the file's settings with no counterpart here.
static void apply_generation_config(const api_t *a, const cJSON *given, jobspec_t *spec, char *notes, size_t n) {
    if (!a->has_gen) return;
    const hf_generation_config_t *g = &a->gen;
    bool any = g->has_temperature || g->has_top_p || g->has_top_k || g->has_max_new_tokens;
    if (g->has_do_sample && !g->do_sample) {
        if (any) note(notes, n, "generation_config.json has do_sample false (greedy): its sampling settings are not applied");
        return;
    }
    if (g->has_temperature && !cJSON_HasObjectItem(given, "temperature")) {
        if (g->temperature > 0 && g->temperature <= 10) spec->temperature = json_float_as_written(g->temperature);
        else note(notes, n, "generation_config.json temperature %g is outside (0, 10]: not applied", g->temperature);
    }
    if (g->has_top_p && !cJSON_HasObjectItem(given, "top_p")) {
        if (g->top_p > 0 && g->top_p <= 1) spec->top_p = json_float_as_written(g->top_p);
        else note(notes, n, "generation_config.json top_p %g is outside (0, 1]: not applied", g->top_p);
    }
    if (g->has_top_k && !cJSON_HasObjectItem(given, "top_k")) {
        if (g->top_k >= 0 && g->top_k <= 1000000) spec->top_k = g->top_k;
        else note(notes, n, "generation_config.json top_k %d is outside 0..1000000: not applied", g->top_k);
    }
    if (g->has_max_new_tokens && !cJSON_HasObjectItem(given, "max_new")) {
        if (g->max_new_tokens >= 1 && g->max_new_tokens <= 1024) spec->max_new = g->max_new_tokens;
        else note(notes, n, "generation_config.json max_new_tokens %d is outside spec.max_new's 1..1024: not applied",
                  g->max_new_tokens);
    }
    if (a->gen_notes[0]) note(notes, n, "%s", a->gen_notes);
}

// Chat jobs: every prompt the job can ever issue is rendered once now (all records of a dataset,
// one example of a built-in task), so a template that refuses a conversation refuses the
// submission with the record's line instead of failing the job later.
static int check_chat(const api_t *a, const jobspec_t *spec, dataset_t *ds, char *err) {
    long line = ds ? dataset_messages_line(ds) : 0;
    if (!spec->chat) {
        if (line)
            return err_set(err, "uploaded dataset:%ld: a record with \"messages\" needs \"chat\": true in the job spec "
                           "(the model's chat template renders them)", line);
        return 0;
    }
    if (!a->chat) return err_set(err, "spec.chat: the base model has no chat template (%s)", a->chat_error);
    if (spec->system[0] && ds && (line = dataset_system_line(ds)))
        return err_set(err, "uploaded dataset:%ld: the conversation has its own system message and spec.system is set: "
                       "give one or the other", line);
    rl_source_t src = {.task = ds ? NULL : task_find(spec->task), .ds = ds};
    snprintf(src.name, sizeof src.name, "uploaded dataset");
    if (rl_source_set_chat(&src, a->chat, a->chat_error, spec->system, spec->chat_vars, err)) return -1;
    int n = ds ? dataset_size(ds) : 1;
    for (int i = 0; i < n; i++) {
        task_example_t ex = {0};
        if (ds) ex.prompt = xstrdup(dataset_record_prompt(ds, i));
        else task_example(src.task, TASK_TRAIN, 0, &ex);
        char *text = rl_source_prompt(&src, &ex, i, err);
        task_example_free(&ex);
        if (!text) return -1;
        size_t len = strlen(text);
        free(text);
        if (len > PROTO_MAX_TEXT) {
            if (ds)
                return err_set(err, "uploaded dataset:%ld: the rendered prompt has %zu bytes, more than a task carries (%u)",
                               dataset_record_line(ds, i), len, PROTO_MAX_TEXT);
            return err_set(err, "the rendered prompt has %zu bytes, more than a task carries (%u)", len, PROTO_MAX_TEXT);
        }
    }
    return 0;
}

// Built-in tasks: the prompts of this many training and held-out examples are measured (their
// prompts are short and alike; a dataset's records are all measured).
#define FIT_TASK_EXAMPLES 64

// A job's prompts against what the rollouts serve (rl.h: the context and KV cache, from this
// scheduler's max_context / kv_mb settings, which are the rollouts'): each prompt's tokens plus
// spec.max_new within the context (spec.max_context when smaller), and a group's worst case in
// KV blocks within the cache (generate.c admits a request only then). A prompt is tokenized only
// when its bytes + 16 would not fit: a token of these tokenizers covers at least one byte of the
// text. A job refused here would otherwise fail every task at run time.
static int check_fit(const api_t *a, const jobspec_t *spec, dataset_t *ds, char *err) {
    int ctx = a->serve.max_context, bs = 16;
    if (spec->max_context > ctx)
        return err_set(err, "spec.env.max_context %d exceeds the %d positions the rollouts serve (the cluster's max_context "
                       "setting)", spec->max_context, ctx);
    if (spec->max_context > 0) ctx = spec->max_context;
    if (spec->group > a->serve.max_seqs)
        return err_set(err, "spec.group %d exceeds the %d sequences the rollouts' KV cache holds", spec->group,
                       a->serve.max_seqs);
    rl_source_t src = {.task = ds ? NULL : task_find(spec->task), .ds = ds};
    snprintf(src.name, sizeof src.name, "uploaded dataset");
    if (!ds && !src.task) return 0;   // an unknown task is refused by the spec's own check
    if (spec->chat && rl_source_set_chat(&src, a->chat, a->chat_error, spec->system, spec->chat_vars, err)) return -1;
    int n = ds ? dataset_size(ds) : 2 * FIT_TASK_EXAMPLES;
    for (int i = 0; i < n; i++) {
        task_example_t ex = {0};
        if (ds) ex.prompt = xstrdup(dataset_record_prompt(ds, i));
        else task_example(src.task, i < FIT_TASK_EXAMPLES ? TASK_TRAIN : TASK_EVAL, (uint64_t)(i % FIT_TASK_EXAMPLES), &ex);
        char *text = rl_source_prompt(&src, &ex, i, err);
        task_example_free(&ex);
        if (!text) return -1;
        size_t len = strlen(text);
        int P = len + 16 < (size_t)INT_MAX / 2 ? (int)len + 16 : INT_MAX / 2;
        if (P + spec->max_new > ctx || kvcache_group_blocks(bs, P, spec->group, spec->max_new) > a->serve.kv_blocks) {
            int32_t *ids = NULL;
            P = tokenizer_encode(a->tok, text, len, &ids, err);
            free(ids);
        }
        free(text);
        if (P < 0) return -1;
        char where[96] = "";
        if (ds) snprintf(where, sizeof where, "uploaded dataset:%ld: ", dataset_record_line(ds, i));
        else snprintf(where, sizeof where, "task %s: ", spec->task);
        if (P + spec->max_new > ctx)
            return err_set(err, "%sthe prompt has %d tokens: with spec.max_new %d it exceeds the context of %d positions%s",
                           where, P, spec->max_new, ctx, spec->max_context > 0 ? " (spec.env.max_context)" : "");
        int need = kvcache_group_blocks(bs, P, spec->group, spec->max_new);
        if (need > a->serve.kv_blocks)
            return err_set(err, "%sa group of %d samples of this %d-token prompt needs up to %d KV blocks; the rollouts' "
                           "cache has %d (lower spec.group or spec.max_new, or raise the cluster's kv_mb)",
                           where, spec->group, P, need, a->serve.kv_blocks);
    }
    return 0;
}

static int op_job_submit(api_t *a, const char *tenant, const proto_req_t *q, proto_args_t *res, char *err) {
    const char *spec_txt = proto_args_get_str(&q->args, "spec");
    if (!spec_txt) return err_set(err, "job_submit: spec (JSON) required");
    jobspec_t spec;
    if (jobspec_parse(&spec, spec_txt, err)) return -1;
    if (!spec.dataset && sim_is_task(spec.task) && !a->simulated)
        return err_set(err, "task %s is a simulated task: it runs on a simulated cluster (every service with --backend "
                       "sim:DEVICE, docs/SIMULATOR.md)", spec.task);
    // the tenant's services, where the verifier would connect: the same rules it applies
    char why[ERR_LEN];
    if (spec.reward_endpoint[0] && !endpoint_allowed(spec.reward_endpoint, a->endpoints, why))
        return err_set(err, "spec.reward.endpoint: %s", why);
    if (spec.env_endpoint[0] && !endpoint_allowed(spec.env_endpoint, a->endpoints, why))
        return err_set(err, "spec.env.endpoint: %s", why);
    const proto_val_t *dv = proto_args_get(&q->args, "dataset");
    const char *data = dv && (dv->kind == PROTO_VAL_STR || dv->kind == PROTO_VAL_BIN) ? dv->s : NULL;
    size_t data_len = data ? dv->len : 0;
    if (spec.dataset && !data) return err_set(err, "job_submit: spec.dataset is true but no dataset was uploaded");
    if (!spec.dataset && data) return err_set(err, "job_submit: a dataset was uploaded but spec.dataset is not true");
    dataset_t *ds = NULL;
    if (data) {
        verify_spec_t vs;
        if (verify_spec_parse(&vs, spec.verifier, err)) return -1;
        ds = dataset_parse("uploaded dataset", data, data_len, &vs, err);
        if (!ds) return -1;
    }
    int crc = check_chat(a, &spec, ds, err);
    char notes[1536] = "";
    if (!crc) {
        cJSON *given = cJSON_Parse(spec_txt);   // parsed above, so an object: which fields the user gave
        apply_generation_config(a, given, &spec, notes, sizeof notes);
        cJSON_Delete(given);
        crc = check_fit(a, &spec, ds, err);
    }
    dataset_destroy(&ds);
    if (crc) return -1;
    char key[256], quota_s[32] = "16", max_data_s[32] = "";
    char *qv = NULL;
    key_tenant(a->st, key, sizeof key, tenant);
    if (store_hget(a->st, key, TENANT_QUOTA, &qv, NULL, err) == 0) snprintf(quota_s, sizeof quota_s, "%s", qv);
    free(qv), qv = NULL;
    if (store_hget(a->st, key, TENANT_MAX_DATA, &qv, NULL, err) == 0) snprintf(max_data_s, sizeof max_data_s, "%s", qv);
    free(qv);
    long long data_held, max_data = max_data_s[0] ? atoll(max_data_s) : TENANT_DEFAULT_MAX_DATA;
    int active = count_active(a, tenant, &data_held, err);
    if (active < 0) return -1;
    if (active >= atoi(quota_s)) return err_set(err, "quota reached: %d jobs queued or running (quota %s)", active, quota_s);
    char *gv = NULL;
    if (store_hget(a->st, key, TENANT_MAX_GROUPS, &gv, NULL, err) == 0 && atoi(gv) < spec.prompts) {
        err_set(err, "spec.prompts %d exceeds the tenant's max_groups %s (groups its jobs may hold in flight): the job "
                "could never take a step", spec.prompts, gv);
        free(gv);
        return -1;
    }
    free(gv);
    if (data && data_held + (long long)data_len > max_data)
        return err_set(err, "dataset quota reached: this dataset's %zu bytes and the %lld of the tenant's queued and "
                       "running jobs exceed its %lld (wait for a job to end, or ask the operator for more)",
                       data_len, data_held, max_data);
    // the job's starting adapter (version 0): B = 0, so it starts as the base model
    peft_config_t pc = {.r = spec.rank, .alpha = spec.alpha, .targets = spec.targets};
    uint8_t *blob = NULL;
    size_t blen = 0;
    // on a simulated cluster the adapters are modelled: their configuration, no weights
    int rc = a->simulated ? lora_modelled_serialize(&a->model, &pc, &blob, &blen, err)
                          : lora_initial_serialize(&a->model, &pc, spec.seed, &blob, &blen, err);
    if (rc) return -1;
    int64_t seq;
    char id[PROTO_MAX_ID], now[32];
    key_job_seq(a->st, key, sizeof key);
    if (store_incr(a->st, key, &seq, err)) goto fail;
    snprintf(id, sizeof id, "j-%lld", (long long)seq);
    key_adapter(a->st, key, sizeof key, id, 0);
    if (store_set(a->st, key, blob, blen, err)) goto fail;
    if (data) {
        // one list entry per non-blank line (validated above)
        key_job_data(a->st, key, sizeof key, id);
        const char *p = data, *end = data + data_len;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = (size_t)((nl ? nl : end) - p);
            size_t t = len;
            while (t && (p[t - 1] == '\r' || p[t - 1] == ' ' || p[t - 1] == '\t')) t--;
            if (t) {
                const void *item[1] = {p};
                size_t il[1] = {t};
                if (store_rpush(a->st, key, 1, item, il, NULL, err)) goto fail;
            }
            p = nl ? nl + 1 : end;
        }
    }
    char *canon = jobspec_to_json(&spec);
    snprintf(now, sizeof now, "%ld", (long)time(NULL));
    key_job(a->st, key, sizeof key, id);
    char dbytes[32];
    snprintf(dbytes, sizeof dbytes, "%zu", data_len);
    const char *f[10] = {JOB_TENANT,  JOB_SPEC,    JOB_STATUS, JOB_STEP,  JOB_VERSION,
                         JOB_CREATED, JOB_UPDATED, JOB_ISSUED, JOB_DATA_BYTES, JOB_NOTES};
    const char *v[10] = {tenant, canon, "queued", "0", "0", now, now, "0", dbytes, notes};
    rc = store_hset(a->st, key, notes[0] ? 10 : 9, f, v, err);
    free(canon);
    if (rc) goto fail;
    const char *m[1] = {id};
    key_jobs(a->st, key, sizeof key);
    if (store_sadd(a->st, key, 1, m, NULL, err)) goto fail;
    key_tenant_jobs(a->st, key, sizeof key, tenant);
    if (store_sadd(a->st, key, 1, m, NULL, err)) goto fail;
    free(blob);
    if (sched_add_job(a->sc, id, err)) return -1;
    proto_args_str(res, "job", id);
    if (notes[0]) proto_args_str(res, "notes", notes);
    logt_info(tenant, id, "submitted by tenant %s: task %s, %d steps", tenant, spec.task, spec.max_steps);
    return 0;
fail:
    free(blob);
    return -1;
}

static int op_job_list(api_t *a, const char *tenant, bool admin, proto_args_t *res, char *err) {
    char key[256], **ids = NULL;
    int n = 0;
    if (admin) key_jobs(a->st, key, sizeof key);
    else key_tenant_jobs(a->st, key, sizeof key, tenant);
    if (store_smembers(a->st, key, &ids, &n, err)) return -1;
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        store_kv_t *kv = NULL;
        int nk = 0;
        if (job_get(a, ids[i], tenant, admin, &kv, &nk, err) == 0) {
            cJSON_AddItemToArray(arr, job_json(kv, nk, ids[i], false));
            store_kv_free(&kv, nk);
        }
    }
    store_strv_free(&ids, n);
    result_json(res, "jobs", arr);
    return 0;
}

static int op_job_status(api_t *a, const char *tenant, bool admin, const proto_req_t *q, proto_args_t *res, char *err) {
    const char *job = proto_args_get_str(&q->args, "job");
    store_kv_t *kv = NULL;
    int n = 0;
    if (job_get(a, job, tenant, admin, &kv, &n, err)) return -1;
    result_json(res, "status", job_json(kv, n, job, true));
    store_kv_free(&kv, n);
    return 0;
}

static int op_job_cancel(api_t *a, const char *tenant, bool admin, const proto_req_t *q, proto_args_t *res, char *err) {
    const char *job = proto_args_get_str(&q->args, "job");
    store_kv_t *kv = NULL;
    int n = 0;
    if (job_get(a, job, tenant, admin, &kv, &n, err)) return -1;
    const char *st = kv_get(kv, n, JOB_STATUS);
    char status[32];
    snprintf(status, sizeof status, "%s", st ? st : "");
    store_kv_free(&kv, n);
    if (!strcmp(status, "queued") || !strcmp(status, "running")) {
        char key[256], now[32];
        snprintf(now, sizeof now, "%ld", (long)time(NULL));
        key_job(a->st, key, sizeof key, job);
        const char *f[2] = {JOB_STATUS, JOB_UPDATED}, *v[2] = {"cancelled", now};
        if (store_hset(a->st, key, 2, f, v, err)) return -1;
        sched_cancel(a->sc, job);
        snprintf(status, sizeof status, "cancelled");
        logt_info(tenant, job, "cancelled by tenant %s", tenant);
    }
    proto_args_str(res, "status", status);
    return 0;
}

static int op_job_metrics(api_t *a, const char *tenant, bool admin, const proto_req_t *q, proto_args_t *res, char *err) {
    const char *job = proto_args_get_str(&q->args, "job");
    store_kv_t *kv = NULL;
    int n = 0;
    if (job_get(a, job, tenant, admin, &kv, &n, err)) return -1;
    store_kv_free(&kv, n);
    int64_t count = 1000;
    proto_args_get_int(&q->args, "count", &count);
    char key[256];
    store_entry_t *e = NULL;
    int ne = 0;
    key_metrics(a->st, key, sizeof key, job);
    // the latest count entries only (XREVRANGE): a reader of a long job's recent steps does not
    // make the scheduler read the whole stream
    if (count < 1) count = 1;
    if (count > 100000) count = 100000;
    if (store_xrange_latest(a->st, key, (int)count, &e, &ne, err)) return -1;
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < ne; i++) {
        cJSON *o = cJSON_CreateObject();
        for (int k = 0; k < e[i].n; k++) cJSON_AddNumberToObject(o, e[i].kv[k].field, strtod(e[i].kv[k].value, NULL));
        cJSON_AddItemToArray(arr, o);
    }
    store_entries_free(&e, ne);
    result_json(res, "metrics", arr);
    return 0;
}

static int op_adapter_get(api_t *a, const char *tenant, bool admin, const proto_req_t *q, proto_args_t *res, char *err) {
    const char *job = proto_args_get_str(&q->args, "job");
    store_kv_t *kv = NULL;
    int n = 0;
    if (job_get(a, job, tenant, admin, &kv, &n, err)) return -1;
    const char *cur = kv_get(kv, n, JOB_VERSION), *best_v = kv_get(kv, n, JOB_BEST_VERSION);
    int64_t ver = cur ? atoll(cur) : 0, best = 0;
    bool has_best_v = best_v != NULL;
    if (best_v) best = atoll(best_v);
    store_kv_free(&kv, n);
    bool want_best = proto_args_get(&q->args, "best") != NULL;
    int64_t flag = 0;
    if (want_best && (!proto_args_get_int(&q->args, "best", &flag) || flag != 1 || proto_args_get(&q->args, "version")))
        return err_set(err, "adapter_get: best must be 1, without a version");
    if (proto_args_get(&q->args, "version") &&
        (!proto_args_get_int(&q->args, "version", &ver) || ver < 0 || ver > UINT32_MAX))
        return err_set(err, "adapter_get: version must be an integer from 0 to %u", UINT32_MAX);
    char key[256];
    uint8_t *blob = NULL;
    size_t len = 0;
    if (want_best) {
        if (!has_best_v) return err_set(err, "%s has no evaluated version kept yet (the first eval keeps one)", job);
        ver = best;
        key_adapter_pin(a->st, key, sizeof key, job, "best");
    } else {
        key_adapter(a->st, key, sizeof key, job, (uint32_t)ver);
    }
    int rc = store_get(a->st, key, &blob, &len, err);
    if (rc == 1 && want_best) return err_set(err, "the best version of %s is missing from the store", job);
    if (rc == 1) return err_set(err, "adapter version %lld of %s is not kept (only the latest few are)", (long long)ver, job);
    if (rc < 0) return -1;
    proto_args_int(res, "version", ver);
    if (want_best) proto_args_int(res, "best", 1);
    proto_args_bin(res, "blob", blob, len);
    proto_args_bin(res, "model_config", a->model_json, strlen(a->model_json));
    proto_args_str(res, "base_model", a->base_model);
    free(blob);
    return 0;
}

void api_handle(api_t *a, const proto_req_t *q, proto_rep_t *rep) {
    char err[ERR_LEN] = "", tenant[PROTO_MAX_ID] = "";
    bool admin = is_admin(a, q->token);
    int rc;
    if (!strcmp(q->op, "tenant_create")) {
        rc = op_tenant_create(a, q, &rep->result, err);
    } else if (!admin && tenant_of(a, q->token, tenant, err)) {
        rc = -1;
    } else if (!strcmp(q->op, "ping")) {
        proto_args_int(&rep->result, "time", (int64_t)time(NULL));
        rc = 0;
    } else if (!strcmp(q->op, "job_submit")) {
        rc = admin ? err_set(err, "job_submit needs a tenant token (the admin token only manages tenants)")
                   : op_job_submit(a, tenant, q, &rep->result, err);
    } else if (!strcmp(q->op, "job_list")) rc = op_job_list(a, tenant, admin, &rep->result, err);
    else if (!strcmp(q->op, "job_status")) rc = op_job_status(a, tenant, admin, q, &rep->result, err);
    else if (!strcmp(q->op, "job_cancel")) rc = op_job_cancel(a, tenant, admin, q, &rep->result, err);
    else if (!strcmp(q->op, "job_metrics")) rc = op_job_metrics(a, tenant, admin, q, &rep->result, err);
    else if (!strcmp(q->op, "adapter_get")) rc = op_adapter_get(a, tenant, admin, q, &rep->result, err);
    else rc = err_set(err, "unknown operation '%s'", q->op);
    rep->ok = rc == 0;
    a->n_req++;
    if (!rep->ok) {
        a->n_err++;
        rep->error = xstrdup(err[0] ? err : "failed");
        proto_args_free(&rep->result);
    }
}

int api_whoami(api_t *a, const char *token, char tenant[PROTO_MAX_ID], bool *admin, char *err) {
    tenant[0] = 0;
    *admin = token && is_admin(a, token);
    if (*admin) return 0;
    return tenant_of(a, token, tenant, err);
}

void api_counts(const api_t *a, uint64_t *requests, uint64_t *errors) {
    *requests = a->n_req;
    *errors = a->n_err;
}

void api_serve(api_t *a, zsock_t *router) {
    for (int k = 0; k < 64; k++) {
        zmsg_t *m = zmsg_recv_nowait(router);
        if (!m) return;
        size_t nf = zmsg_size(m);
        zframe_t *id = zmsg_first(m), *f2 = zmsg_next(m), *payload = f2;
        bool delim = false;
        if (nf == 3 && f2 && zframe_size(f2) == 0) {
            delim = true;
            payload = zmsg_next(m);
        } else if (nf != 2) {
            log_warn("api: dropped a request of %zu frames (expected [identity][payload] or [identity][][payload])", nf);
            zmsg_destroy(&m);
            continue;
        }
        proto_req_t q;
        proto_rep_t rep = {0};
        char err[ERR_LEN];
        if (proto_req_decode(zframe_data(payload), zframe_size(payload), &q, err)) {
            rep.ok = false;
            char msg[ERR_LEN + 32];
            snprintf(msg, sizeof msg, "malformed request: %s", err);
            rep.error = xstrdup(msg);
            log_warn("api: %s", msg);
            a->n_req++, a->n_err++;
        } else {
            rep.id = q.id;
            api_handle(a, &q, &rep);
            proto_req_free(&q);
        }
        proto_buf_t buf = {0};
        if (proto_rep_encode(&rep, &buf) != 0) {
            // a result that breaks a protocol cap still gets an answer, never silence
            proto_rep_t small = {.id = rep.id, .ok = false, .error = "the reply exceeds the protocol's size limits"};
            log_warn("api: reply to '%s' could not be encoded", rep.ok ? "request" : "error");
            proto_rep_encode(&small, &buf);
        }
        if (buf.len) bus_send_routed(router, id, delim, &buf);
        proto_buf_free(&buf);
        proto_rep_free(&rep);
        zmsg_destroy(&m);
    }
}

// sched.c - job table, fair-share issuing with a staleness bound, leases, evals, completion.
//
// Accounting per job, in groups (one prompt with its G samples):
//   issued -> (rollout, verifier) -> at_trainer -> consumed or dropped by the trainer.
// A rollout task holds a lease until the verifier reports its episodes; an expired lease
// issues the same prompts again under a new task id (a late original still trains: data, not
// a step, so no step is ever applied twice). Groups at the trainer count as lost when the
// trainer reports no step for train_lease_s although a batch is waiting (trainer restart).
// The async policy keeps at most (staleness + 1) * B groups of a job in flight, so a group
// sampled with version g reaches the trainer while the job is at most at g + staleness; sync
// runs one job at a time and one step at a time (B groups, train, publish, next). Those rules,
// fair share and lease expiry are common/rl/policy.c's; this file keeps the state and applies them.
#include "services/scheduler/sched.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/net/bus.h"
#include "common/rl/jobdata.h"
#include "common/svc/metrics.h"
#include "common/rl/rl.h"
#include "common/util/log.h"
#include "common/rl/keys.h"

typedef enum { JS_QUEUED, JS_RUNNING, JS_DONE, JS_FAILED, JS_CANCELLED } jstate_t;
static const char *state_name[] = {"queued", "running", "done", "failed", "cancelled"};

typedef struct {
    char id[PROTO_MAX_ID];
    jobspec_t spec;
    jstate_t state;
    uint32_t step, version;
    uint64_t next_index;   // next train example index
    int at_trainer;        // groups verified and not yet consumed / dropped
    int consumed_ahead;    // groups the trainer reported consumed before their verifier's report
                           // came (the two travel on different links): that report adds none
    int in_rollout;        // groups in tasks holding a lease
    double last_step_time;
    double vtime;          // fair-share virtual time: groups issued / weight
    int tenant;            // index in sched_t.tenants
    uint64_t episodes, correct_train;
    double reward_sum;
    uint64_t reward_errors, task_failures;
    // eval round in progress
    int eval_round;        // 0 = none
    uint32_t eval_step, eval_version;
    int eval_pending;      // tasks of the round sent and not yet reported
    int eval_next, eval_total;   // examples of the round sent so far / to send
    uint64_t eval_correct, eval_n;
    uint32_t last_eval_step;
    bool evaluated_final;
    bool eval_pinned;      // the round's version is copied to adapter:{j}:eval (key_adapter_pin)
    bool has_best;         // adapter:{j}:best holds the best evaluated version (of accuracy best_acc)
    double best_acc, last_acc;
    bool sync_waiting;     // sync policy: a step's worth issued, waiting for the trainer
    dataset_t *ds;         // an uploaded dataset, parsed once from Redis on first use
    uint64_t *eval_idx;    // the eval examples (distinct prompts: rl_source_eval_indices), found on
    int eval_idx_n;        // the first eval; eval_idx_n of them
} sjob_t;

typedef struct {
    char id[PROTO_MAX_ID];
    double vtime;              // groups issued to the tenant's jobs / the tenant's weight
    double weight;             // tenant:{t} weight (default 1)
    int max_groups;            // tenant:{t} max_groups: its jobs' groups in flight together
    int in_flight;             // what its jobs hold now (job_views)
} stenant_t;

struct sched {
    store_t *st;
    zsock_t *work;
    zsock_t *events;
    hf_config_t model;
    const chat_template_t *chat;   // the base model's chat template (borrowed), NULL when it has none
    char chat_error[ERR_LEN];      // why there is none
    sched_cfg_t cfg;
    sjob_t **jobs;
    int n_jobs, cap_jobs;
    policy_job_t *view;            // (cap_jobs) what the policy reads of each job (job_views)
    stenant_t *tenants;            // tenants of the jobs held: fair share's first level
    int n_tenants, cap_tenants;
    policy_leases_t leases;        // rollout tasks holding a lease
    bool tagging;                  // a secured cluster: tasks carry a tag (proto_task_tag)
    uint8_t tag_key[32];           // shared with the trainer (bus_link_key)
    int next_round;
    // live counters (sched_set_metrics); handles of the families
    metrics_t *met;
    int m_running, m_queued, m_tasks, m_issued, m_expired, m_lost, m_job_step, m_job_in_rollout, m_job_at_trainer,
        m_job_episodes, m_job_acc, m_job_active, m_job_running;
    uint64_t issued, expired, lost;
    int trainer_slots;             // job slots of the live trainers (sched_set_trainer_slots; 0: unknown)
};

static void job_free(sjob_t *j) {
    dataset_destroy(&j->ds);
    free(j->eval_idx);
    free(j);
}

static sjob_t *find(sched_t *s, const char *id) {
    for (int i = 0; i < s->n_jobs; i++)
        if (!strcmp(s->jobs[i]->id, id)) return s->jobs[i];
    return NULL;
}

static void hset(sched_t *s, const char *job, int n, const char **f, const char **v) {
    char key[256], err[ERR_LEN];
    key_job(s->st, key, sizeof key, job);
    if (store_hset(s->st, key, n, f, v, err)) logj_warn(job, "job state not saved: %s", err);
}

void sched_set_events(sched_t *s, zsock_t *pub) { s->events = pub; }

void sched_set_chat(sched_t *s, const chat_template_t *ct, const char *why_none) {
    s->chat = ct;
    snprintf(s->chat_error, sizeof s->chat_error, "%s", why_none ? why_none : "");
}

// One progress event (best effort: PUB drops for slow subscribers by design).
static void publish(sched_t *s, const sjob_t *j, const char *what, double acc) {
    if (!s->events) return;
    char ev[512];
    int n = snprintf(ev, sizeof ev, "{\"job\":\"%s\",\"event\":\"%s\",\"status\":\"%s\",\"step\":%u,\"version\":%u", j->id,
                     what, state_name[j->state], j->step, j->version);
    if (acc >= 0) n += snprintf(ev + n, sizeof ev - (size_t)n, ",\"eval_acc\":%.4f", acc);
    snprintf(ev + n, sizeof ev - (size_t)n, "}");
    zsock_send(s->events, "ss", "job", ev);
}

// The job's tenant, for log lines (NULL before its record named one).
static const char *tenant_of(const sched_t *s, const sjob_t *j) {
    return j->tenant >= 0 && j->tenant < s->n_tenants ? s->tenants[j->tenant].id : NULL;
}

static void set_state(sched_t *s, sjob_t *j, jstate_t st, const char *error) {
    j->state = st;
    char now[32];
    snprintf(now, sizeof now, "%ld", (long)time(NULL));
    const char *f[3] = {JOB_STATUS, JOB_UPDATED, JOB_ERROR}, *v[3] = {state_name[st], now, error ? error : ""};
    hset(s, j->id, error ? 3 : 2, f, v);
    logt_info(tenant_of(s, j), j->id, "status %s%s%s", state_name[st], error ? ": " : "", error ? error : "");
    publish(s, j, "status", -1);
}

sched_t *sched_new(store_t *st, zsock_t *work, const hf_config_t *model, const sched_cfg_t *cfg, char *err) {
    if (!st || !work || !model) {
        err_set(err, "sched_new: store, work socket and model config required");
        return NULL;
    }
    sched_t *s = xcalloc(1, sizeof *s);
    s->st = st;
    s->work = work;
    s->model = *model;
    s->cfg = *cfg;
    if (s->cfg.chunk < 1) s->cfg.chunk = 8;
    if (s->cfg.lease_s <= 0) s->cfg.lease_s = 60;
    if (s->cfg.train_lease_s <= 0) s->cfg.train_lease_s = 60;
    // task ids are random: a result cannot answer a task by guessing its id, and no id repeats
    // across scheduler restarts; on a secured cluster each task also carries a tag the trainer
    // checks (proto.h: proto_task_tag)
    if (bus_is_secure()) {
        char e2[ERR_LEN];
        if (bus_link_key("trainer", PROTO_TAG_PURPOSE, s->tag_key, e2)) {
            err_set(err, "cannot derive the task tag key: %s", e2);
            sched_destroy(&s);
            return NULL;
        }
        s->tagging = true;
    }
    return s;
}

void sched_destroy(sched_t **ps) {
    if (!ps || !*ps) return;
    sched_t *s = *ps;
    policy_leases_free(&s->leases);
    for (int i = 0; i < s->n_jobs; i++) job_free(s->jobs[i]);
    free(s->jobs);
    free(s->view);
    free(s->tenants);
    free(s);
    *ps = NULL;
}

// The index of a tenant in the table, added on first sight (at most one entry per tenant of a
// job held: the table is as long as the tenants with jobs since the start).
static int tenant_index(sched_t *s, const char *tenant) {
    for (int i = 0; i < s->n_tenants; i++)
        if (!strcmp(s->tenants[i].id, tenant)) return i;
    if (s->n_tenants == s->cap_tenants) {
        s->cap_tenants = s->cap_tenants ? 2 * s->cap_tenants : 16;
        s->tenants = xrealloc(s->tenants, sizeof *s->tenants * (size_t)s->cap_tenants);
    }
    // the tenant's record sets its weight and quota; a record that cannot be read (Redis away)
    // gives the defaults, and a value out of range too (the API stores only valid ones)
    double weight = 1;
    long max_groups = TENANT_DEFAULT_MAX_GROUPS;
    char key[256], err[ERR_LEN];
    store_kv_t *kv = NULL;
    int n = 0;
    key_tenant(s->st, key, sizeof key, tenant);
    if (store_hgetall(s->st, key, &kv, &n, err) == 0) {
        for (int i = 0; i < n; i++) {
            char *end;
            if (!strcmp(kv[i].field, TENANT_WEIGHT)) {
                double w = strtod(kv[i].value, &end);
                if (!*end && w >= 0.01 && w <= 100) weight = w;
            } else if (!strcmp(kv[i].field, TENANT_MAX_GROUPS)) {
                long g = strtol(kv[i].value, &end, 10);
                if (!*end && g >= 1 && g <= 1000000) max_groups = g;
            }
        }
        store_kv_free(&kv, n);
    }
    s->tenants[s->n_tenants] = (stenant_t){.vtime = 0, .weight = weight, .max_groups = (int)max_groups};
    snprintf(s->tenants[s->n_tenants].id, sizeof s->tenants[0].id, "%s", tenant);
    return s->n_tenants++;
}

static sjob_t *load_job(sched_t *s, const char *id, char *err) {
    char key[256];
    store_kv_t *kv = NULL;
    int n = 0;
    key_job(s->st, key, sizeof key, id);
    int rc = store_hgetall(s->st, key, &kv, &n, err);
    if (rc) {
        if (rc == 1) err_set(err, "job %s not found", id);
        return NULL;
    }
    sjob_t *j = xcalloc(1, sizeof *j);
    snprintf(j->id, sizeof j->id, "%s", id);
    bool have_spec = false;
    for (int i = 0; i < n; i++) {
        const char *f = kv[i].field, *v = kv[i].value;
        if (!strcmp(f, JOB_SPEC)) have_spec = jobspec_parse(&j->spec, v, err) == 0;
        else if (!strcmp(f, JOB_STATUS)) {
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, state_name[k])) j->state = (jstate_t)k;
        } else if (!strcmp(f, JOB_STEP)) j->step = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(f, JOB_VERSION)) j->version = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(f, JOB_ISSUED)) j->next_index = strtoull(v, NULL, 10);
        else if (!strcmp(f, JOB_EVAL_STEP)) j->last_eval_step = (uint32_t)strtoul(v, NULL, 10), j->evaluated_final = false;
        else if (!strcmp(f, JOB_TENANT)) j->tenant = tenant_index(s, v);
        else if (!strcmp(f, JOB_BEST_ACC)) j->best_acc = strtod(v, NULL), j->has_best = true;
    }
    store_kv_free(&kv, n);
    if (!have_spec) {
        if (!err[0]) err_set(err, "job %s has no valid spec", id);
        free(j);
        return NULL;
    }
    j->last_step_time = util_now();
    j->last_eval_step = j->step > 0 ? j->last_eval_step : 0;
    return j;
}

// Groups of a job in flight (policy_in_flight).
static int job_in_flight(const sjob_t *j) { return policy_in_flight(j->in_rollout, j->at_trainer, j->consumed_ahead); }

// The policy's view of every job, in table order (s->view, refreshed from the jobs).
static const policy_job_t *job_views(sched_t *s) {
    for (int t = 0; t < s->n_tenants; t++) s->tenants[t].in_flight = 0;
    for (int i = 0; i < s->n_jobs; i++)
        if (s->n_tenants) s->tenants[s->jobs[i]->tenant].in_flight += job_in_flight(s->jobs[i]);
    for (int i = 0; i < s->n_jobs; i++) {
        const sjob_t *j = s->jobs[i];
        s->view[i] = (policy_job_t){.running = j->state == JS_RUNNING, .step = j->step,
                                    .max_steps = (uint32_t)j->spec.max_steps, .prompts = j->spec.prompts,
                                    .staleness = j->spec.staleness, .in_flight = job_in_flight(j),
                                    .sync_waiting = j->sync_waiting, .vtime = j->vtime, .tenant = j->tenant,
                                    .tenant_vtime = s->n_tenants ? s->tenants[j->tenant].vtime : 0,
                                    .tenant_full = s->n_tenants && s->tenants[j->tenant].in_flight >=
                                                                       s->tenants[j->tenant].max_groups};
    }
    return s->view;
}

static void add(sched_t *s, sjob_t *j) {
    if (s->n_jobs == s->cap_jobs) {
        s->cap_jobs = s->cap_jobs ? 2 * s->cap_jobs : 32;
        s->jobs = xrealloc(s->jobs, sizeof(sjob_t *) * (size_t)s->cap_jobs);
        s->view = xrealloc(s->view, sizeof(policy_job_t) * (size_t)s->cap_jobs);
    }
    // a new job starts at the smallest virtual time of its tenant's running ones, and a tenant
    // whose first job this is at the smallest of the running tenants': no burst of catch-up
    const policy_job_t *v = job_views(s);
    bool tenant_runs = false;
    for (int i = 0; i < s->n_jobs; i++) tenant_runs |= v[i].running && v[i].tenant == j->tenant;
    if (!tenant_runs && s->n_tenants)
        s->tenants[j->tenant].vtime = policy_tenant_start_vtime(v, s->n_jobs, s->tenants[j->tenant].vtime);
    j->vtime = policy_start_vtime(v, s->n_jobs, j->tenant);
    s->jobs[s->n_jobs++] = j;
}

int sched_restore(sched_t *s, char *err) {
    char key[256], **ids = NULL;
    int n = 0, loaded = 0;
    key_jobs(s->st, key, sizeof key);
    if (store_smembers(s->st, key, &ids, &n, err)) return -1;
    for (int i = 0; i < n; i++) {
        if (find(s, ids[i])) continue;
        char e2[ERR_LEN] = "";
        sjob_t *j = load_job(s, ids[i], e2);
        if (!j) {
            log_warn("job %s not restored: %s", ids[i], e2);
            continue;
        }
        if (j->state != JS_QUEUED && j->state != JS_RUNNING) {
            job_free(j);
            continue;
        }
        add(s, j);
        loaded++;
        logt_info(tenant_of(s, j), j->id, "restored: status %s, step %u, version %u", state_name[j->state], j->step,
                  j->version);
    }
    store_strv_free(&ids, n);
    return loaded;
}

int sched_add_job(sched_t *s, const char *id, char *err) {
    sjob_t *j = load_job(s, id, err);
    if (!j) return -1;
    add(s, j);
    return 0;
}

static void drop_tasks(sched_t *s, const char *job) { policy_leases_drop_job(&s->leases, job); }

void sched_cancel(sched_t *s, const char *id) {
    sjob_t *j = find(s, id);
    if (!j) return;
    if (j->state == JS_QUEUED || j->state == JS_RUNNING) j->state = JS_CANCELLED;
    drop_tasks(s, id);
}

int sched_active(const sched_t *s) {
    int n = 0;
    for (int i = 0; i < s->n_jobs; i++) n += s->jobs[i]->state == JS_QUEUED || s->jobs[i]->state == JS_RUNNING;
    return n;
}

// --- issuing -----------------------------------------------------------------------------------

// The job's task source: its built-in task, or its dataset (read from Redis once per job). A
// source that cannot be had fails the job; returns 0 or -1.
static int job_source(sched_t *s, sjob_t *j, rl_source_t *src) {
    char err[ERR_LEN] = "";
    *src = (rl_source_t){0};
    if (!j->spec.dataset) src->task = task_find(j->spec.task);
    else if (!j->ds) j->ds = jobdata_dataset(s->st, j->id, &j->spec, err);
    src->ds = j->ds;
    snprintf(src->name, sizeof src->name, "%s", j->spec.task);
    if ((src->task || src->ds) &&
        (!j->spec.chat || !rl_source_set_chat(src, s->chat, s->chat_error, j->spec.system, j->spec.chat_vars, err)))
        return 0;
    set_state(s, j, JS_FAILED, err[0] ? err : "task source unavailable");
    return -1;
}

// Sends one rollout task; returns 0, or -1 when the rollout queue is full (try later).
static int issue(sched_t *s, sjob_t *j, proto_kind_t kind, const uint64_t *index, uint32_t n, int round,
                 uint32_t version) {
    rl_source_t src;
    proto_item_t *items = xcalloc(n, sizeof *items);
    task_example_t ex = {0};
    int rc = -1;
    if (job_source(s, j, &src)) goto done;
    // Prompts are rendered here, for every kind of job: the scheduler already builds each
    // prompt's text from (source, split, index) and holds the model folder, so a chat job's
    // conversation goes through the template in one place, the same one that rendered every
    // record at submission (api.c), and the rollouts keep tokenizing plain text without special
    // tokens, knowing nothing of datasets or templates.
    for (uint32_t i = 0; i < n; i++) {
        char err[ERR_LEN];
        int h = rl_source_example(&src, kind == PROTO_KIND_EVAL ? TASK_EVAL : TASK_TRAIN, index[i], &ex);
        char *text = rl_source_prompt(&src, &ex, h, err);
        task_example_free(&ex);
        if (!text) {
            set_state(s, j, JS_FAILED, err);
            goto done;
        }
        items[i] = (proto_item_t){.index = index[i], .prompt = text};
    }
    uint64_t task_id;
    do randombytes_buf(&task_id, sizeof task_id);
    while (!task_id || policy_lease_find(&s->leases, task_id, NULL) >= 0);
    proto_task_t t = {.task_id = task_id, .job = j->id, .adapter_version = version, .kind = kind,
                      .group = kind == PROTO_KIND_EVAL ? 1 : (uint32_t)j->spec.group, .max_new = (uint32_t)j->spec.max_new,
                      .temperature = j->spec.temperature, .top_p = j->spec.top_p, .top_k = (uint32_t)j->spec.top_k,
                      .seed = j->spec.seed * 1000003ull + index[0], .n_items = n, .items = items,
                      .max_turns = (uint32_t)j->spec.max_turns, .max_ctx = (uint32_t)j->spec.max_context,
                      .end = j->spec.chat ? PROTO_END_EOS : PROTO_END_LINE};
    if (s->tagging) {
        t.has_tag = true;
        proto_task_tag(s->tag_key, t.task_id, t.job, t.adapter_version, t.kind, t.tag);
    }
    proto_buf_t buf = {0};
    if (proto_task_encode(&t, &buf) || bus_send(s->work, &buf)) {
        proto_buf_free(&buf);
        goto done;
    }
    proto_buf_free(&buf);
    policy_lease_add(&s->leases, t.task_id, j->id, kind, index, n, version, round, util_now() + s->cfg.lease_s);
    if (kind == PROTO_KIND_TRAIN) j->in_rollout += (int)n;
    s->issued++;
    rc = 0;
done:
    for (uint32_t i = 0; i < n; i++) free(items[i].prompt);
    free(items);
    return rc;
}

// Starts an eval round on the current version; its tasks are sent by send_evals as the
// rollout queue takes them (a full queue delays an eval, it never shrinks it). A round covers
// spec.eval_n distinct held-out prompts, or all the source has when it has fewer.
static void start_eval(sched_t *s, sjob_t *j) {
    if (!j->eval_idx) {
        rl_source_t src;
        if (job_source(s, j, &src)) return;
        j->eval_idx_n = rl_source_eval_indices(&src, j->spec.eval_n, &j->eval_idx);
        if (j->eval_idx_n < j->spec.eval_n)
            logj_info(j->id, "the held-out set has %d distinct prompts (eval_n asks %d): each eval covers those, once each",
                      j->eval_idx_n, j->spec.eval_n);
        if (j->eval_idx_n == 0) {
            set_state(s, j, JS_FAILED, "the task has no held-out prompts to evaluate");
            return;
        }
    }
    j->eval_round = ++s->next_round;
    j->eval_step = j->step;
    j->eval_version = j->version;
    // the version under evaluation, copied on the server where the trainer's rotation of the
    // numbered versions cannot reach it: it becomes the job's best if the round says so
    char src[256], dst[256], err[ERR_LEN];
    key_adapter(s->st, src, sizeof src, j->id, j->eval_version);
    key_adapter_pin(s->st, dst, sizeof dst, j->id, "eval");
    int rc = store_copy(s->st, src, dst, err);
    j->eval_pinned = rc == 0;
    if (rc)
        logj_warn(j->id, "eval of version %u: its adapter could not be kept aside (%s); this round cannot become the "
                  "best version", j->eval_version, rc > 0 ? "the trainer no longer keeps it" : err);
    j->eval_pending = 0;
    j->eval_correct = j->eval_n = 0;
    j->eval_next = 0;
    j->eval_total = j->eval_idx_n;
    j->last_eval_step = j->step;
}

// Sends the next chunks of a job's eval round; 0, or -1 when the rollout queue is full.
static int send_evals(sched_t *s, sjob_t *j) {
    uint64_t idx[32];
    while (j->eval_round && j->eval_next < j->eval_total) {
        uint32_t n = (uint32_t)(j->eval_total - j->eval_next < 32 ? j->eval_total - j->eval_next : 32);
        for (uint32_t k = 0; k < n; k++) idx[k] = j->eval_idx[j->eval_next + (int)k];
        if (issue(s, j, PROTO_KIND_EVAL, idx, n, j->eval_round, j->eval_version)) return -1;
        j->eval_next += (int)n;
        j->eval_pending++;
    }
    return 0;
}

// The round's version becomes the job's best evaluated one when it is the first kept or its
// accuracy is higher than the best's (ties keep the earlier version, which trained less): its
// copy moves to adapter:{j}:best (COPY, repeatable) and the job hash says which version it is.
static void keep_best(sched_t *s, sjob_t *j, double acc, double lo, double hi) {
    if (!j->eval_pinned || (j->has_best && !(acc > j->best_acc))) return;
    char src[256], dst[256], err[ERR_LEN];
    key_adapter_pin(s->st, src, sizeof src, j->id, "eval");
    key_adapter_pin(s->st, dst, sizeof dst, j->id, "best");
    int rc = store_copy(s->st, src, dst, err);
    if (rc) {
        logj_warn(j->id, "best version %u not kept: %s", j->eval_version, rc > 0 ? "its copy is gone" : err);
        return;
    }
    char v[5][32];
    snprintf(v[0], 32, "%u", j->eval_version);
    snprintf(v[1], 32, "%u", j->eval_step);
    snprintf(v[2], 32, "%.4f", acc);
    snprintf(v[3], 32, "%.4f", lo);
    snprintf(v[4], 32, "%.4f", hi);
    const char *f[5] = {JOB_BEST_VERSION, JOB_BEST_STEP, JOB_BEST_ACC, JOB_BEST_LO, JOB_BEST_HI};
    const char *vv[5] = {v[0], v[1], v[2], v[3], v[4]};
    hset(s, j->id, 5, f, vv);
    j->has_best = true;
    j->best_acc = acc;
    logj_info(j->id, "best evaluated version so far: %u (step %u, accuracy %.3f [%.3f, %.3f])", j->eval_version,
              j->eval_step, acc, lo, hi);
}

static void eval_done(sched_t *s, sjob_t *j) {
    double acc = j->eval_n ? (double)j->eval_correct / (double)j->eval_n : 0.0, lo, hi;
    rl_wilson((int)j->eval_correct, (int)j->eval_n, &lo, &hi);
    char v[6][32], key[256], err[ERR_LEN];
    snprintf(v[0], 32, "%u", j->eval_step);
    snprintf(v[1], 32, "%.4f", acc);
    snprintf(v[2], 32, "%.4f", lo);
    snprintf(v[3], 32, "%.4f", hi);
    snprintf(v[4], 32, "%llu", (unsigned long long)j->eval_n);
    snprintf(v[5], 32, "%.3f", (double)time(NULL));
    const char *f[6] = {JOB_EVAL_STEP, JOB_EVAL_ACC, JOB_EVAL_LO, JOB_EVAL_HI, JOB_EVAL_N, "time"};
    const char *vv[6] = {v[0], v[1], v[2], v[3], v[4], v[5]};
    key_metrics(s->st, key, sizeof key, j->id);
    store_xadd(s->st, key, 10000, 6, f, vv, NULL, err);
    hset(s, j->id, 5, f, vv);
    if (j->eval_step == 0) {
        const char *f0[1] = {JOB_EVAL_ACC0}, *v0[1] = {v[1]};
        hset(s, j->id, 1, f0, v0);
    }
    logt_info(tenant_of(s, j), j->id, "eval step=%u accuracy=%.3f [%.3f, %.3f] n=%llu", j->eval_step, acc, lo, hi,
              (unsigned long long)j->eval_n);
    j->eval_round = 0;
    j->last_acc = acc;
    metrics_set(s->met, s->m_job_acc, j->id, acc);
    publish(s, j, "eval", acc);
    keep_best(s, j, acc, lo, hi);
    if (j->spec.target_accuracy > 0 && acc >= j->spec.target_accuracy && j->state == JS_RUNNING) {
        drop_tasks(s, j->id);
        set_state(s, j, JS_DONE, NULL);
    } else if (j->eval_step >= (uint32_t)j->spec.max_steps && j->state == JS_RUNNING) {
        // the eval of the final version; a round that started earlier (the job reached
        // max_steps while it ran) is followed by that one (sched_tick)
        drop_tasks(s, j->id);
        set_state(s, j, JS_DONE, NULL);
    }
}

static void export_job(sched_t *s, const sjob_t *j) {
    if (!s->met) return;
    metrics_set(s->met, s->m_job_step, j->id, j->step);
    metrics_set(s->met, s->m_job_in_rollout, j->id, j->in_rollout);
    metrics_set(s->met, s->m_job_at_trainer, j->id, j->at_trainer);
    metrics_set(s->met, s->m_job_episodes, j->id, (double)j->episodes);
    metrics_set(s->met, s->m_job_active, j->id, j->state == JS_QUEUED || j->state == JS_RUNNING);
    metrics_set(s->met, s->m_job_running, j->id, j->state == JS_RUNNING);
}

void sched_set_metrics(sched_t *s, metrics_t *m) {
    s->met = m;
    s->m_running = metrics_def(m, "marlaas_scheduler_jobs_running", MET_GAUGE, "Jobs running.");
    s->m_queued = metrics_def(m, "marlaas_scheduler_jobs_queued", MET_GAUGE, "Jobs waiting to be admitted.");
    s->m_tasks = metrics_def(m, "marlaas_scheduler_tasks_in_flight", MET_GAUGE, "Rollout tasks holding a lease.");
    s->m_issued = metrics_def(m, "marlaas_scheduler_tasks_issued_total", MET_COUNTER, "Rollout tasks sent (train and eval).");
    s->m_expired = metrics_def(m, "marlaas_scheduler_leases_expired_total", MET_COUNTER,
                               "Tasks whose lease ran out and whose prompts were issued again.");
    s->m_lost = metrics_def(m, "marlaas_scheduler_groups_lost_total", MET_COUNTER,
                            "Groups counted lost at the trainer (no step within train_lease_s).");
    s->m_job_step = metrics_def_job(m, "marlaas_scheduler_job_step", MET_GAUGE, "The job's optimiser step, per job.");
    s->m_job_in_rollout = metrics_def_job(m, "marlaas_scheduler_job_groups_in_rollout", MET_GAUGE,
                                      "Groups of the job in rollout tasks holding a lease, per job.");
    s->m_job_at_trainer = metrics_def_job(m, "marlaas_scheduler_job_groups_at_trainer", MET_GAUGE,
                                      "Groups of the job verified and waiting at the trainer, per job.");
    s->m_job_episodes = metrics_def_job(m, "marlaas_scheduler_job_episodes_total", MET_COUNTER,
                                    "Training episodes verified, per job.");
    s->m_job_acc = metrics_def_job(m, "marlaas_scheduler_job_eval_accuracy", MET_GAUGE,
                               "Greedy accuracy of the job's last eval, per job.");
    s->m_job_active = metrics_def_job(m, "marlaas_scheduler_job_active", MET_GAUGE, "1 while the job is queued or running.");
    s->m_job_running = metrics_def_job(m, "marlaas_scheduler_job_running", MET_GAUGE,
                                       "1 while the job is running (admitted and not finished).");
}

int sched_export(sched_t *s) {
    int running = 0, queued = 0;
    for (int i = 0; i < s->n_jobs; i++) {
        running += s->jobs[i]->state == JS_RUNNING;
        queued += s->jobs[i]->state == JS_QUEUED;
        export_job(s, s->jobs[i]);
    }
    metrics_set(s->met, s->m_running, NULL, running);
    metrics_set(s->met, s->m_queued, NULL, queued);
    metrics_set(s->met, s->m_tasks, NULL, s->leases.n);
    metrics_set(s->met, s->m_issued, NULL, (double)s->issued);
    metrics_set(s->met, s->m_expired, NULL, (double)s->expired);
    metrics_set(s->met, s->m_lost, NULL, (double)s->lost);
    return queued;
}

static int admit_bound(const sched_t *s) {
    int b = s->cfg.max_running;
    if (s->trainer_slots > 0 && (b == 0 || s->trainer_slots < b)) b = s->trainer_slots;
    return b;
}

int sched_set_trainer_slots(sched_t *s, int slots) {
    if (slots < 0) slots = 0;
    if (slots != s->trainer_slots) {
        int before = admit_bound(s);
        s->trainer_slots = slots;
        int after = admit_bound(s);
        if (after != before && s->cfg.policy == POLICY_ASYNC) {
            if (after) log_info("async admission: at most %d jobs running at once (trainers' job slots %d, max_running %d)",
                                after, slots, s->cfg.max_running);
            else log_info("async admission: no bound (no trainer's job slots known, max_running unset)");
        }
    }
    return admit_bound(s);
}

void sched_tick(sched_t *s) {
    double now = util_now();
    // admit queued jobs: all of them (async; up to max_running and the trainers' job slots), one
    // at a time (sync)
    int running = 0, bound = admit_bound(s);
    for (int i = 0; i < s->n_jobs; i++) running += s->jobs[i]->state == JS_RUNNING;
    for (int i = 0; i < s->n_jobs; i++) {
        sjob_t *j = s->jobs[i];
        if (j->state != JS_QUEUED || !policy_admit(s->cfg.policy, running, bound)) continue;
        set_state(s, j, JS_RUNNING, NULL);
        // the training lease counts from admission: a job that waited in the queue (sync policy)
        // has had no chance to step yet
        j->last_step_time = now;
        running++;
        start_eval(s, j);   // the accuracy before training
    }
    // expired leases: issue the same prompts again (a lease taken out of the table hands its
    // position to the last one, which the scan looks at next; the leases issue() adds run out
    // lease_s from now, after this scan)
    for (int i = 0; (i = policy_lease_next_expired(&s->leases, i, now)) >= 0;) {
        policy_lease_t k;
        policy_lease_take(&s->leases, i, &k);
        sjob_t *j = find(s, k.job);
        if (!j || j->state != JS_RUNNING) {
            free(k.index);
            continue;
        }
        logt_warn(tenant_of(s, j), j->id, "task %llu: no result within %.0f s; issuing its %u prompts again",
                  (unsigned long long)k.id, s->cfg.lease_s, k.n);
        s->expired++;
        if (k.kind == PROTO_KIND_TRAIN) j->in_rollout -= (int)k.n;
        uint32_t ver;
        if (policy_reissue(&k, j->eval_round, j->version, j->eval_version, &ver) &&
            issue(s, j, k.kind, k.index, k.n, k.round, ver) != 0 && k.kind == PROTO_KIND_EVAL &&
            --j->eval_pending == 0 && j->eval_next >= j->eval_total) {
            logj_warn(j->id, "eval examples of an expired task could not be sent again; the eval covers fewer");
            eval_done(s, j);
        }
        free(k.index);
    }
    // groups stuck at the trainer (it restarted and lost its buffer)
    for (int i = 0; i < s->n_jobs; i++) {
        sjob_t *j = s->jobs[i];
        if (j->state == JS_RUNNING &&
            policy_trainer_lost(now, j->last_step_time, s->cfg.train_lease_s, j->at_trainer, j->spec.prompts)) {
            logt_warn(tenant_of(s, j), j->id, "%d groups at the trainer with no step for %.0f s; counting them as lost",
                      j->at_trainer, s->cfg.train_lease_s);
            s->lost += (uint64_t)j->at_trainer;
            j->at_trainer = 0;
            j->consumed_ahead = 0;
            j->sync_waiting = false;
            j->last_step_time = now;
        }
    }
    // evals due; completion after the final eval
    for (int i = 0; i < s->n_jobs; i++) {
        sjob_t *j = s->jobs[i];
        if (j->state != JS_RUNNING || j->eval_round) continue;
        bool final = j->step >= (uint32_t)j->spec.max_steps;
        bool due = j->spec.eval_every > 0 && j->step >= j->last_eval_step + (uint32_t)j->spec.eval_every;
        if ((final && j->last_eval_step != j->step) || (due && !final)) start_eval(s, j);
        else if (final && j->last_eval_step == j->step && !j->eval_round) {
            drop_tasks(s, j->id);
            set_state(s, j, JS_DONE, NULL);
        }
    }
    // eval rounds go first: they are short and their results decide completion
    for (int i = 0; i < s->n_jobs; i++)
        if (s->jobs[i]->state == JS_RUNNING && s->jobs[i]->eval_round && send_evals(s, s->jobs[i])) break;
    // fair share: the job furthest behind (groups issued / weight) gets the next task
    for (int guard = 0; guard < 64; guard++) {
        const policy_job_t *view = job_views(s);
        int ji = policy_next_job(s->cfg.policy, view, s->n_jobs);
        if (ji < 0) break;
        sjob_t *j = s->jobs[ji];
        int room = policy_room(s->cfg.policy, &view[ji]);
        if (s->n_tenants) {   // and within the tenant's quota of groups in flight
            int left = s->tenants[j->tenant].max_groups - s->tenants[j->tenant].in_flight;
            if (left < room) room = left;
        }
        uint32_t n = policy_task_size(room, s->cfg.chunk);
        uint64_t idx[PROTO_MAX_ITEMS];
        for (uint32_t k = 0; k < n; k++) idx[k] = j->next_index + k;
        if (issue(s, j, PROTO_KIND_TRAIN, idx, n, 0, j->version) != 0) break;   // rollout queue full
        j->next_index += n;
        j->vtime = policy_charge(j->vtime, n, j->spec.weight);
        if (s->n_tenants) s->tenants[j->tenant].vtime = policy_charge(s->tenants[j->tenant].vtime, n, s->tenants[j->tenant].weight);
        if (policy_sync_full(s->cfg.policy, job_in_flight(j), j->spec.prompts)) j->sync_waiting = true;
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)j->next_index);
        const char *f[1] = {JOB_ISSUED}, *vv[1] = {v};
        hset(s, j->id, 1, f, vv);
    }
    // forget finished jobs
    for (int i = 0; i < s->n_jobs;) {
        sjob_t *j = s->jobs[i];
        if (j->state == JS_QUEUED || j->state == JS_RUNNING) {
            i++;
            continue;
        }
        drop_tasks(s, j->id);
        export_job(s, j);
        job_free(j);
        // keep the order of submission: the sync policy admits queued jobs first come, first served
        memmove(&s->jobs[i], &s->jobs[i + 1], sizeof(sjob_t *) * (size_t)(s->n_jobs - i - 1));
        s->n_jobs--;
    }
}

// --- reports -----------------------------------------------------------------------------------

// A field of the job's hash in the store; "" when it cannot be read.
static void job_hash_field(sched_t *s, const char *job, const char *field, char *out, size_t n) {
    char key[256], err[ERR_LEN], *v = NULL;
    out[0] = 0;
    key_job(s->st, key, sizeof key, job);
    if (store_hget(s->st, key, field, &v, NULL, err) == 0) snprintf(out, n, "%s", v);
    free(v);
}

int sched_report(sched_t *s, const proto_report_t *r, char *err) {
    sjob_t *j = find(s, r->job);
    if (!j) return 0;   // a job that ended and left the table: late results are surplus
    switch (r->kind) {
    case PROTO_REP_EPISODES: {
        // the lease leaves the table before eval_done, which may drop the job's other leases; no
        // lease: a duplicate, or expired and issued again
        policy_lease_t k;
        policy_result_t what = policy_result(&s->leases, r->task_id, j->eval_round, &k);
        int n = (int)k.n;
        free(k.index);
        if (what == POLICY_RESULT_EVAL) {
            j->eval_correct += r->correct;
            j->eval_n += r->n;
            if (--j->eval_pending == 0 && j->eval_next >= j->eval_total) eval_done(s, j);
        } else if (what == POLICY_RESULT_TRAIN) {
            j->in_rollout -= n;
            policy_trainer_verified(&j->at_trainer, &j->consumed_ahead, n);
            logj_debug(j->id, "task %llu verified: %d groups at the trainer (step %u, version %u)",
                       (unsigned long long)r->task_id, j->at_trainer, j->step, j->version);
            j->episodes += r->n;
            j->reward_sum += r->reward_sum;
            j->correct_train += r->correct;
            j->reward_errors += r->errors;
            if (r->errors) {
                char key[256], e2[ERR_LEN];
                key_job(s->st, key, sizeof key, j->id);
                store_hincrby(s->st, key, "reward_errors", r->errors, NULL, e2);
            }
        }
        break;
    }
    case PROTO_REP_STEP:
        // the trainer publishes a version (adapter, version, step: one transaction) before it
        // reports it: a report of a version the store does not hold is none of the trainer's
        if (r->adapter_version > j->version || r->step > j->step) {
            char v[32], st[32];
            job_hash_field(s, j->id, JOB_VERSION, v, sizeof v);
            job_hash_field(s, j->id, JOB_STEP, st, sizeof st);
            if (!v[0] || strtoull(v, NULL, 10) < r->adapter_version || !st[0] || strtoull(st, NULL, 10) < r->step)
                return err_set(err, "step report: step %u, version %u of job %s are not in the store (step %s, version "
                               "%s)", r->step, r->adapter_version, j->id, st[0] ? st : "?", v[0] ? v : "?");
        }
        policy_step_report(&j->step, &j->version, r->step, r->adapter_version);
        // the verifier's report of some of these groups may still be on its way (bounded: no more
        // than a job may have in flight, so a report that never comes cannot pile up)
        policy_trainer_released(&j->at_trainer, &j->consumed_ahead, (int)(r->n + r->errors),
                                (j->spec.staleness + 1) * j->spec.prompts);
        j->last_step_time = util_now();
        j->sync_waiting = false;
        publish(s, j, "step", -1);
        break;
    case PROTO_REP_JOB_FAILED:
        // from the trainer, which marks the job failed in the store first, or from a verifier
        // for a task of the job holding a lease (a reward service that failed the job)
        if (policy_lease_find(&s->leases, r->task_id, j->id) < 0) {
            char st[32];
            job_hash_field(s, j->id, JOB_STATUS, st, sizeof st);
            if (strcmp(st, "failed"))
                return err_set(err, "job failure report for %s: it names no task of the job's and the store has the "
                               "job %s", j->id, st[0] ? st : "unreadable");
        }
        if (j->state == JS_RUNNING || j->state == JS_QUEUED) {
            drop_tasks(s, j->id);
            set_state(s, j, JS_FAILED, r->error ? r->error : "failed");
        }
        break;
    case PROTO_REP_TASK_FAILED: {
        int i = policy_lease_find(&s->leases, r->task_id, j->id);
        if (i < 0) break;
        // expire it now: the next tick issues its prompts again
        s->leases.v[i].deadline = 0;
        if (++j->task_failures > 20) {
            drop_tasks(s, j->id);
            set_state(s, j, JS_FAILED, r->error ? r->error : "rollout tasks keep failing");
        }
        break;
    }
    }
    return 0;
}

int sched_continue(sched_t *s, const void *frame, size_t len, char *err) {
    proto_batch_t b;
    if (proto_batch_decode("cont", frame, len, &b, err)) return -1;
    int ti = policy_lease_find(&s->leases, b.task_id, b.job);
    if (ti < 0) {
        // expired and issued again, or its job ended: the episodes are dropped
        logj_debug(b.job, "continuation of task %llu ignored (no lease)", (unsigned long long)b.task_id);
    } else {
        // the episodes' next turns go to any rollout: everything they need travels with them
        zframe_t *f = zframe_new(frame, len);
        if (zframe_send(&f, s->work, ZFRAME_DONTWAIT) != 0) {
            zframe_destroy(&f);
            logj_warn(b.job, "task %llu: rollout queue full; its episodes are issued again when the lease ends",
                      (unsigned long long)b.task_id);
        } else {
            s->leases.v[ti].deadline = util_now() + s->cfg.lease_s;
        }
    }
    proto_batch_free(&b);
    return 0;
}

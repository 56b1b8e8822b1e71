// jobs.c - per-job buffers, checks of what a scored batch holds, staleness filter, the tenant-fair
// choice of the jobs of a pass (common/rl/policy.h), mixed-adapter RL steps (common/rl/batch.h)
// with each job contained, publication of adapter versions, optimizer checkpoints and step
// metrics.
#include "services/trainer/jobs.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rl/batch.h"
#include "common/util/log.h"
#include "common/rl/keys.h"
#include "common/rl/policy.h"

#define SEEN_TASKS 4096
// A job whose scored batches are refused this many times in a row (none accepted in between)
// fails: its producer is broken or hostile, and its data will not get better.
#define BAD_RUN 8
// A job that got a training batch this recently is active (policy_tjob_t.active): its tenant's
// share of a pass is kept for it while its next batch is on its way. (Buffered groups alone do
// not make a job active: those of a job cancelled at the scheduler may never fill a batch.)
#define ACTIVE_S 10.0
// A tenant's weight is read again from Redis when it is older than this.
#define TENANT_WEIGHT_S 10.0
// A behaviour log-prob above 0 by more than this is none (rounding leaves about 1e-7).
#define LOGP_TOL 1e-3f

typedef struct {
    uint32_t version;            // adapter version the samples were drawn with
    uint64_t task_id;
    uint32_t n_prompt;
    int32_t *prompt;
    uint32_t n_samples;
    proto_sample_t *samples;
    double gen_seconds;          // share of the rollout compute spent on this group
} tgroup_t;

typedef struct {
    char id[PROTO_MAX_ID];
    jobspec_t spec;
    int slot;
    optim_t *opt;
    float *grad;
    uint32_t step, version;
    tgroup_t *buf;
    int n_buf, cap_buf;
    uint64_t seen[SEEN_TASKS];
    int n_seen;
    uint32_t dropped;            // stale groups dropped since the last step
    double last_used;
    double last_batch;           // when the last training batch was accepted (util_now)
    int tenant;                  // its entry in tjobs_t.ten
    int bad_run;                 // batches refused in a row (check_batch)
    char fail_why[ERR_LEN];      // set when the job must fail (its data kept being invalid): the
                                 // next tjobs_step fails and reports it
} tjob_t;

// One pass of a step: the ready jobs ready[r0 .. r1) with one loss setting; rc and err its outcome.
typedef struct {
    int r0, r1;
    double rows;
    loss_cfg_t lc;
    int rc;
    char err[ERR_LEN];
} tpass_t;

// A lane beside the caller: a thread and the engine it computes passes with.
typedef struct {
    tjobs_t *t;
    engine_t *e;
    store_t *st;                 // its own Redis connection, for the versions it publishes
    pthread_t th;
} tlane_t;

// A tenant with at least one job held (refs); the entry is free again when its last job goes.
typedef struct {
    char name[PROTO_MAX_ID];     // the tenant's id: job hash field `tenant` ("" when absent)
    int refs;                    // jobs held
    double weight_read;          // when its weight was read from Redis (util_now)
} ttenant_t;

struct tjobs {
    engine_t *e;
    const kernels_t *k;          // the engine's backend: adapters, gradients, optimiser state
    store_t *st;
    tjobs_cfg_t cfg;
    tjob_t **jobs;               // (max_jobs) indexed by slot; NULL = free
    tjob_t **ready;              // (max_jobs) the jobs a step trains
    // fair share of the passes (policy_train_pick): per slot, per tenant entry (a held job holds
    // one entry, so max_jobs bound them), the jobs of the next pass
    policy_tjob_t *fs;           // (max_jobs) indexed like jobs
    policy_ttenant_t *ten;       // (max_jobs) virtual times and weights of the tenant entries
    ttenant_t *tinfo;            // (max_jobs) their names and references
    int *picked;                 // (max_jobs)
    double busy;
    char broken[ERR_LEN];        // the data-parallel group failed (tjobs_broken)
    // lanes (cfg.lanes > 1): the passes of the step being computed, taken in order by the caller
    // and the lanes; everything from `passes` on is guarded by mu
    tlane_t *lanes;              // (cfg.lanes - 1)
    int n_lanes;                 // threads started
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;                // a new step's passes are there to take
    bool quit;
    tpass_t *passes;
    int *take;                   // the order the passes are taken in
    int n_passes, next_pass, done_passes;
    // the step's batch and per-job outcomes, which every pass reads and writes (its own jobs' only)
    const rl_batch_t *cur_b;
    rl_step_job_t *cur_sj;
    int *cur_jrc;
    char (*cur_jerr)[ERR_LEN];
    tjobs_result_t *cur_fin;     // the results of the jobs trained and published
};

const char *tjobs_broken(const tjobs_t *t) { return t->broken[0] ? t->broken : NULL; }

static void set_broken(tjobs_t *t, const char *why) {
    if (!t->broken[0]) snprintf(t->broken, sizeof t->broken, "%s", why);
}

static void group_free(tgroup_t *g) {
    free(g->prompt);
    for (uint32_t i = 0; i < g->n_samples; i++) {
        free(g->samples[i].tokens);
        free(g->samples[i].logprobs);
        free(g->samples[i].text);
        free(g->samples[i].env);
        free(g->samples[i].obs);
    }
    free(g->samples);
    memset(g, 0, sizeof *g);
}

// The tenant entry of tenant id `name`, taken for one more job: the one in use, else a free one that starts
// at the smallest virtual time present (policy_train_tenant_start) with its weight read from Redis.
// A held job holds an entry, so one is free for the job being loaded into a free slot.
static double tenant_weight(tjobs_t *t, const char *name, bool loud);

static int tenant_take(tjobs_t *t, const char *name) {
    int free_at = -1;
    for (int i = 0; i < t->cfg.max_jobs; i++) {
        if (t->tinfo[i].refs > 0 && !strcmp(t->tinfo[i].name, name)) {
            t->tinfo[i].refs++;
            return i;
        }
        if (t->tinfo[i].refs == 0 && free_at < 0) free_at = i;
    }
    ASSERT(free_at >= 0);
    ttenant_t *e = &t->tinfo[free_at];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->refs = 1;
    e->weight_read = util_now();
    t->ten[free_at] = (policy_ttenant_t){.weight = tenant_weight(t, name, true),
                                         .vtime = policy_train_tenant_start(t->fs, t->cfg.max_jobs, t->ten,
                                                                            t->cfg.max_jobs)};
    return free_at;
}

static void tenant_drop(tjobs_t *t, int i) {
    if (--t->tinfo[i].refs > 0) return;
    memset(&t->tinfo[i], 0, sizeof t->tinfo[i]);
    t->ten[i] = (policy_ttenant_t){0};
}

static void job_free(tjobs_t *t, tjob_t **pj) {
    tjob_t *j = *pj;
    if (!j) return;
    // its fair-share entry and its tenant's reference go with it
    if (t->fs[j->slot].present) tenant_drop(t, j->tenant);
    t->fs[j->slot] = (policy_tjob_t){0};
    for (int i = 0; i < j->n_buf; i++) group_free(&j->buf[i]);
    free(j->buf);
    optim_destroy(&j->opt);
    t->k->free(j->grad);
    lora_pool_clear(engine_pool(t->e), j->slot);
    char err[ERR_LEN];
    if (t->cfg.dp && !t->broken[0] && dp_clear(t->cfg.dp, j->slot, err)) set_broken(t, err);
    free(j);
    *pj = NULL;
}

static void finish(tjobs_t *t, store_t *st, tjob_t *j, const rl_batch_job_t *bj, const rl_step_job_t *sj,
                   tjobs_result_t *out);

// Computes one pass with engine e, then publishes the new version of each of its jobs that
// trained (through st; cur_fin): its jobs' outcomes in cur_sj, cur_jrc, cur_jerr. A pass of
// several jobs the engine refuses (data of one job it cannot take got past check_batch) is run
// again job by job, so that only the job whose own pass is refused fails. A refused pass changed
// nothing: no optimiser stepped, and every pass zeroes its jobs' gradients first (dp_pass), so
// the others train as if it never ran.
static void run_pass(tjobs_t *t, engine_t *e, store_t *st, tpass_t *p) {
    int *jrc = t->cur_jrc;
    char(*jerr)[ERR_LEN] = t->cur_jerr;
    p->rc = rl_train_step(t->cfg.dp, e, t->cur_b, p->r0, p->r1, &p->lc, t->cur_sj + p->r0, p->err);
    for (int r = p->r0; r < p->r1; r++) jrc[r] = p->rc, snprintf(jerr[r], ERR_LEN, "%s", p->rc ? p->err : "");
    if (p->rc && p->rc != DP_BROKEN && p->r1 - p->r0 > 1) {
        log_warn("a training pass of %d jobs was refused (%s); each of them is trained alone", p->r1 - p->r0, p->err);
        for (int r = p->r0; r < p->r1 && p->rc != DP_BROKEN; r++) {
            jrc[r] = rl_train_step(t->cfg.dp, e, t->cur_b, r, r + 1, &p->lc, t->cur_sj + r, jerr[r]);
            if (jrc[r] == DP_BROKEN) p->rc = DP_BROKEN, snprintf(p->err, ERR_LEN, "%s", jerr[r]);
        }
    }
    // a job's state is its pass's alone until the step ends; failures are the caller's (fail_job
    // changes the tables of jobs and tenants)
    for (int r = p->r0; r < p->r1 && p->rc != DP_BROKEN; r++) {
        if (jrc[r] || t->cur_sj[r].failed) continue;
        tjobs_result_t *out = &t->cur_fin[r];
        memset(out, 0, sizeof *out);
        snprintf(out->job, sizeof out->job, "%s", t->ready[r]->id);
        finish(t, st, t->ready[r], &t->cur_b->jobs[r], &t->cur_sj[r], out);
    }
}

// Takes the step's passes in order until none is left; called and returns with mu held.
static void lane_take(tjobs_t *t, engine_t *e, store_t *st) {
    while (t->next_pass < t->n_passes) {
        tpass_t *p = &t->passes[t->take ? t->take[t->next_pass++] : t->next_pass++];
        pthread_mutex_unlock(&t->mu);
        run_pass(t, e, st, p);
        pthread_mutex_lock(&t->mu);
        if (++t->done_passes == t->n_passes) pthread_cond_signal(&t->done);
    }
}

// A lane's thread: sleeps until a step has passes (no spinning: the cores are shared with the
// other services), computes what it can take, sleeps again.
static void *lane_main(void *arg) {
    tlane_t *l = arg;
    tjobs_t *t = l->t;
    pthread_mutex_lock(&t->mu);
    unsigned seen = t->gen;
    for (;;) {
        while (!t->quit && t->gen == seen) pthread_cond_wait(&t->go, &t->mu);
        if (t->quit) break;
        seen = t->gen;
        lane_take(t, l->e, l->st);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

// Computes the step's passes: one after the other on the caller, stopping after one that broke
// the data-parallel group; or, with lanes, on the caller and the lanes at once. Returns how many
// were computed (the first ones).
static int run_passes(tjobs_t *t, tpass_t *ps, int n) {
    if (t->n_lanes == 0 || n == 1) {
        for (int p = 0; p < n; p++) {
            run_pass(t, t->e, t->st, &ps[p]);
            if (ps[p].rc == DP_BROKEN) return p + 1;
        }
        return n;
    }
    // taken longest first, so that the lanes end close together
    int *take = xmalloc(sizeof(int) * (size_t)n);
    for (int a = 0; a < n; a++) {
        int c = a;
        for (; c > 0 && ps[take[c - 1]].rows < ps[a].rows; c--) take[c] = take[c - 1];
        take[c] = a;
    }
    pthread_mutex_lock(&t->mu);
    t->passes = ps, t->take = take, t->n_passes = n, t->next_pass = 0, t->done_passes = 0;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    lane_take(t, t->e, t->st);
    while (t->done_passes < n) pthread_cond_wait(&t->done, &t->mu);
    t->passes = NULL, t->take = NULL, t->n_passes = t->next_pass = t->done_passes = 0;
    pthread_mutex_unlock(&t->mu);
    free(take);
    return n;
}

tjobs_t *tjobs_new(engine_t *e, store_t *st, const tjobs_cfg_t *cfg, char *err) {
    if (cfg->max_jobs < 1 || cfg->max_jobs > lora_pool_slots(engine_pool(e))) {
        err_set(err, "max_jobs must be in 1..%d (adapter slots)", lora_pool_slots(engine_pool(e)));
        return NULL;
    }
    if (cfg->pass_rows < 1) {
        err_set(err, "pass_rows must be >= 1 (rows of one training pass), got %d", cfg->pass_rows);
        return NULL;
    }
    int lanes = cfg->lanes < 1 ? 1 : cfg->lanes;
    if (lanes > RL_MAX_LANES) {
        err_set(err, "lanes must be in 1..%d (passes computed at once), got %d", RL_MAX_LANES, lanes);
        return NULL;
    }
    if (lanes > 1 && engine_model(e)->k != kernels_cpu()) {
        err_set(err, "lanes=%d needs the cpu backend (the %s backend computes one pass at a time); use lanes=1",
                lanes, engine_model(e)->k->name);
        return NULL;
    }
    if (lanes > 1 && cfg->dp) {
        err_set(err, "lanes=%d with data parallelism: a data-parallel group computes one pass at a time on "
                "every rank; use lanes=1 or dp_world=1", lanes);
        return NULL;
    }
    tjobs_t *t = xcalloc(1, sizeof *t);
    t->e = e;
    t->k = engine_model(e)->k;
    t->st = st;
    t->cfg = *cfg;
    t->cfg.lanes = lanes;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    t->jobs = xcalloc((size_t)cfg->max_jobs, sizeof(tjob_t *));
    t->ready = xcalloc((size_t)cfg->max_jobs, sizeof(tjob_t *));
    t->fs = xcalloc((size_t)cfg->max_jobs, sizeof *t->fs);
    t->ten = xcalloc((size_t)cfg->max_jobs, sizeof *t->ten);
    t->tinfo = xcalloc((size_t)cfg->max_jobs, sizeof *t->tinfo);
    t->picked = xcalloc((size_t)cfg->max_jobs, sizeof *t->picked);
    if (lanes > 1) {
        t->lanes = xcalloc((size_t)lanes - 1, sizeof *t->lanes);
        for (int i = 0; i < lanes - 1; i++) {
            char e2[ERR_LEN];
            tlane_t *l = &t->lanes[i];
            l->t = t;
            l->e = engine_new(engine_model(e), engine_pool(e), e2);
            if (l->e) l->st = store_new_like(st, e2);
            if (!l->e || !l->st) {
                engine_destroy(&l->e);
                err_set(err, "lane %d: %s", i + 1, e2);
                tjobs_destroy(&t);
                return NULL;
            }
            if (pthread_create(&l->th, NULL, lane_main, l)) {
                engine_destroy(&l->e);
                store_destroy(&l->st);
                err_set(err, "lane %d: cannot start a thread", i + 1);
                tjobs_destroy(&t);
                return NULL;
            }
            t->n_lanes++;
        }
    }
    if (t->cfg.keep_versions < 2) t->cfg.keep_versions = 2;
    if (t->cfg.optim_every < 1) t->cfg.optim_every = 1;
    return t;
}

void tjobs_destroy(tjobs_t **pt) {
    if (!pt || !*pt) return;
    tjobs_t *t = *pt;
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n_lanes; i++) {
        pthread_join(t->lanes[i].th, NULL);
        engine_destroy(&t->lanes[i].e);
        store_destroy(&t->lanes[i].st);
    }
    free(t->lanes);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->mu);
    for (int i = 0; i < t->cfg.max_jobs; i++) job_free(t, &t->jobs[i]);
    free(t->jobs);
    free(t->ready);
    free(t->fs);
    free(t->ten);
    free(t->tinfo);
    free(t->picked);
    free(t);
    *pt = NULL;
}

int tjobs_count(const tjobs_t *t) {
    int n = 0;
    for (int i = 0; i < t->cfg.max_jobs; i++) n += t->jobs[i] != NULL;
    return n;
}

int tjobs_capacity(const tjobs_t *t) { return t->cfg.max_jobs; }

double tjobs_busy_seconds(const tjobs_t *t) { return t->busy; }

int tjobs_buffered(const tjobs_t *t) {
    int n = 0;
    for (int i = 0; i < t->cfg.max_jobs; i++) n += t->jobs[i] ? t->jobs[i]->n_buf : 0;
    return n;
}

static tjob_t *find(tjobs_t *t, const char *id) {
    for (int i = 0; i < t->cfg.max_jobs; i++)
        if (t->jobs[i] && !strcmp(t->jobs[i]->id, id)) return t->jobs[i];
    return NULL;
}

// Reads the job's status; returns 1 when it is no longer running (batches are ignored).
static int job_finished(tjobs_t *t, const char *id) {
    char key[256], err[ERR_LEN], *status = NULL;
    key_job(t->st, key, sizeof key, id);
    if (store_hget(t->st, key, JOB_STATUS, &status, NULL, err) != 0) return 1;
    int fin = strcmp(status, "running") != 0 && strcmp(status, "queued") != 0;
    free(status);
    return fin;
}

// The fair-share weight of a tenant: field `weight` of tenant:{id}, a number in (0, 100];
// absent, unreadable or out of range: 1 (said once when loud). Jobs without a tenant: 1.
static double tenant_weight(tjobs_t *t, const char *name, bool loud) {
    if (!name[0]) return 1.0;
    char key[256], err[ERR_LEN], *v = NULL, *end = NULL;
    key_tenant(t->st, key, sizeof key, name);
    if (store_hget(t->st, key, TENANT_WEIGHT, &v, NULL, err) != 0) return 1.0;
    double w = strtod(v, &end);
    bool ok = end != v && !*end && isfinite(w) && w > 0 && w <= 100;
    if (!ok && loud) logt_warn(name, NULL, "tenant %s: weight '%.40s' is not a number in (0, 100]; the trainer uses 1", name, v);
    free(v);
    return ok ? w : 1.0;
}

// Loads a job from Redis: spec, latest adapter version (parameters), optimizer state.
static tjob_t *load(tjobs_t *t, const char *id, char *err) {
    int slot = -1;
    double oldest = 1e300;
    int victim = -1;
    for (int i = 0; i < t->cfg.max_jobs; i++) {
        if (!t->jobs[i]) {
            slot = i;
            break;
        }
        if (t->jobs[i]->n_buf == 0 && t->jobs[i]->last_used < oldest) oldest = t->jobs[i]->last_used, victim = i;
    }
    if (slot < 0 && victim >= 0) {
        logj_info(t->jobs[victim]->id, "evicted from the trainer (idle) to make room");
        job_free(t, &t->jobs[victim]);
        slot = victim;
    }
    if (slot < 0) {
        err_set(err, "trainer holds %d jobs with pending data; raise --set max_jobs, or keep the scheduler's running jobs below it (--set max_running)", t->cfg.max_jobs);
        return NULL;
    }
    char key[256], *spec = NULL, *ver = NULL, *step = NULL, *tenant = NULL;
    key_job(t->st, key, sizeof key, id);
    if (store_hget(t->st, key, JOB_SPEC, &spec, NULL, err) != 0) {
        if (!err[0]) err_set(err, "job %s not found in Redis", id);
        return NULL;
    }
    tjob_t *j = xcalloc(1, sizeof *j);
    snprintf(j->id, sizeof j->id, "%s", id);
    j->slot = slot;
    if (jobspec_parse(&j->spec, spec, err)) goto fail;
    if (store_hget(t->st, key, JOB_VERSION, &ver, NULL, err) < 0) goto fail;
    if (store_hget(t->st, key, JOB_STEP, &step, NULL, err) < 0) goto fail;
    if (store_hget(t->st, key, JOB_TENANT, &tenant, NULL, err) < 0) goto fail;
    j->version = ver ? (uint32_t)strtoul(ver, NULL, 10) : 0;
    j->step = step ? (uint32_t)strtoul(step, NULL, 10) : 0;
    uint8_t *blob = NULL;
    size_t len = 0;
    key_adapter(t->st, key, sizeof key, id, j->version);
    if (store_get(t->st, key, &blob, &len, err) != 0) {
        if (!err[0]) err_set(err, "adapter version %u of job %s is missing from Redis", j->version, id);
        goto fail;
    }
    const model_t *m = engine_model(t->e);
    lora_t *a = lora_deserialize(blob, len, &m->cfg, t->k, err);
    free(blob);
    if (!a || lora_pool_set(engine_pool(t->e), slot, &a, err)) {
        lora_destroy(&a);
        goto fail;
    }
    lora_t *ad = lora_pool_get(engine_pool(t->e), slot);
    optim_cfg_t oc = optim_defaults();
    oc.lr = j->spec.lr;
    j->opt = optim_new(&oc, t->k, ad->n_params);
    j->grad = t->k->alloc(sizeof(float) * ad->n_params);
    key_optim(t->st, key, sizeof key, id);
    if (store_get(t->st, key, &blob, &len, err) == 0) {
        char e2[ERR_LEN];
        if (optim_deserialize(j->opt, blob, len, e2))
            logj_warn(id, "optimizer state not restored (%s); moments start from zero", e2);
        else
            logj_info(id, "resumed: adapter version %u, step %u, optimizer state of step %lld", j->version, j->step,
                      (long long)j->opt->step);
        free(blob);
    }
    // every data-parallel rank gets the adapter and its optimiser state
    int drc = t->cfg.dp ? (t->broken[0] ? DP_BROKEN : dp_load(t->cfg.dp, slot, j->opt, err)) : 0;
    if (drc == DP_BROKEN) set_broken(t, t->broken[0] ? t->broken : err);
    if (drc) goto fail;
    // its tenant, then its place in its tenant's fair share: from the smallest time there
    j->tenant = tenant_take(t, tenant ? tenant : "");
    t->fs[slot] = (policy_tjob_t){.present = true, .tenant = j->tenant, .weight = j->spec.weight,
                                  .vtime = policy_train_job_start(t->fs, t->cfg.max_jobs, j->tenant)};
    free(spec), free(ver), free(step), free(tenant);
    t->jobs[slot] = j;
    return j;
fail:
    free(spec), free(ver), free(step), free(tenant);
    lora_pool_clear(engine_pool(t->e), slot);
    optim_destroy(&j->opt);
    t->k->free(j->grad);
    free(j);
    return NULL;
}

// --- what a scored batch may hold ----------------------------------------------------------------

// Refuses a batch naming where: "invalid data: job J task T group G sample S: what" (g, s < 0:
// not about one group / sample).
static int refuse(char *err, const proto_batch_t *m, int g, int s, const char *fmt, ...) {
    char what[ERR_LEN], at[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int n = snprintf(at, sizeof at, "job %s task %llu", m->job, (unsigned long long)m->task_id);
    if (g >= 0 && n < (int)sizeof at) n += snprintf(at + n, sizeof at - (size_t)n, " group %d", g);
    if (s >= 0 && n < (int)sizeof at) snprintf(at + n, sizeof at - (size_t)n, " sample %d", s);
    return err_set(err, "invalid data: %s: %s", at, what);
}

// The checks a training batch passes before it joins the job's buffer, so that whatever reaches
// a shared pass is data the engine takes: only a broken or hostile producer (a rollout or
// verifier that is not ours) sends anything else. Groups at most as many as the job may have in
// flight, each of the job's group size; prompt and completion tokens in the vocabulary, both
// non-empty (the generator refuses an empty prompt and always yields one token), together within
// the model's context; behaviour log-probs finite and <= 0; rewards in [0, 1] (the verifier
// clips them); environment marks 0 or 1, none in a single-turn job, an episode's first token the
// model's, turns within the job's max_turns.
static int check_batch(const tjobs_t *t, const tjob_t *j, const proto_batch_t *m, char *err) {
    const model_t *md = engine_model(t->e);
    int V = md->cfg.vocab_size, ctx = md->n_pos;
    int max_groups = (j->spec.staleness + 1) * j->spec.prompts, max_turns = j->spec.max_turns > 1 ? j->spec.max_turns : 1;
    if (m->n_groups > (uint32_t)max_groups)
        return refuse(err, m, -1, -1, "%u groups, more than the job may have in flight ((staleness + 1) x prompts = %d)",
                      m->n_groups, max_groups);
    for (uint32_t g = 0; g < m->n_groups; g++) {
        const proto_group_t *pg = &m->groups[g];
        if (pg->n_samples != (uint32_t)j->spec.group)
            return refuse(err, m, (int)g, -1, "%u samples, the job's group size is %d", pg->n_samples, j->spec.group);
        if (pg->n_prompt < 1) return refuse(err, m, (int)g, -1, "the prompt (p) is empty");
        for (uint32_t q = 0; q < pg->n_prompt; q++)
            if (pg->prompt[q] < 0 || pg->prompt[q] >= V)
                return refuse(err, m, (int)g, -1, "prompt token p[%u] = %d is outside the vocabulary (0..%d)", q,
                              pg->prompt[q], V - 1);
        for (uint32_t k = 0; k < pg->n_samples; k++) {
            const proto_sample_t *ps = &pg->samples[k];
            int gi = (int)g, si = (int)k;
            if (ps->n < 1) return refuse(err, m, gi, si, "the completion (tok) is empty");
            if ((uint64_t)pg->n_prompt + ps->n > (uint64_t)ctx)
                return refuse(err, m, gi, si, "prompt (%u) and completion (%u) tokens exceed the model's context (%d)",
                              pg->n_prompt, ps->n, ctx);
            if (!ps->logprobs) return refuse(err, m, gi, si, "the log-probs (lp) are missing");
            for (uint32_t q = 0; q < ps->n; q++) {
                if (ps->tokens[q] < 0 || ps->tokens[q] >= V)
                    return refuse(err, m, gi, si, "completion token tok[%u] = %d is outside the vocabulary (0..%d)", q,
                                  ps->tokens[q], V - 1);
                if (!isfinite(ps->logprobs[q]) || ps->logprobs[q] > LOGP_TOL)
                    return refuse(err, m, gi, si, "log-prob lp[%u] = %g is no log-probability (finite, <= 0)", q,
                                  (double)ps->logprobs[q]);
            }
            if (!isfinite(ps->reward) || ps->reward < 0.0f || ps->reward > 1.0f)
                return refuse(err, m, gi, si, "reward r = %g is outside [0, 1]", (double)ps->reward);
            if (ps->turns > (uint32_t)max_turns)
                return refuse(err, m, gi, si, "%u turns, the job allows %d (max_turns)", ps->turns, max_turns);
            for (uint32_t q = 0; ps->env && q < ps->n; q++) {
                if (ps->env[q] > 1) return refuse(err, m, gi, si, "env[%u] = %u, not 0 or 1", q, ps->env[q]);
                if (ps->env[q] && max_turns == 1)
                    return refuse(err, m, gi, si, "env[%u] marks an environment token in a single-turn job", q);
            }
        }
    }
    return 0;
}

int tjobs_add(tjobs_t *t, proto_batch_t *m, char *err) {
    tjob_t *j = find(t, m->job);
    if (!j) {
        if (job_finished(t, m->job)) {
            proto_batch_free(m);
            return 1;
        }
        j = load(t, m->job, err);
        if (!j) return -1;
    }
    if (j->fail_why[0]) {   // fails at the next step: nothing more is taken
        proto_batch_free(m);
        return 1;
    }
    for (int i = 0; i < j->n_seen && i < SEEN_TASKS; i++)
        if (j->seen[i] == m->task_id) {
            logj_debug(j->id, "task %llu delivered twice; ignored", (unsigned long long)m->task_id);
            proto_batch_free(m);
            return 1;
        }
    if (m->adapter_version > j->version) {
        err_set(err, "adapter version %u is newer than the job's %u: never published, so never sampled", m->adapter_version,
                j->version);
        return -1;
    }
    if (m->kind != PROTO_KIND_TRAIN) {
        j->seen[j->n_seen++ % SEEN_TASKS] = m->task_id;
        proto_batch_free(m);
        return 1;
    }
    // refused data is not recorded as seen: the same task's correct delivery still trains
    if (check_batch(t, j, m, err)) {
        if (++j->bad_run >= BAD_RUN) {
            snprintf(j->fail_why, sizeof j->fail_why, "%d scored batches in a row held invalid data, the last: %.180s",
                     j->bad_run, err);
            char e2[ERR_LEN];
            snprintf(e2, sizeof e2, "%s", err);
            err_set(err, "%.200s; the job fails (%d in a row)", e2, j->bad_run);
        }
        return TJOBS_INVALID;
    }
    j->bad_run = 0;
    j->last_batch = util_now();
    j->seen[j->n_seen++ % SEEN_TASKS] = m->task_id;
    for (uint32_t g = 0; g < m->n_groups; g++) {
        if (j->n_buf == j->cap_buf) {
            j->cap_buf = j->cap_buf ? 2 * j->cap_buf : 64;
            j->buf = xrealloc(j->buf, sizeof(tgroup_t) * (size_t)j->cap_buf);
        }
        proto_group_t *pg = &m->groups[g];
        j->buf[j->n_buf++] = (tgroup_t){.version = m->adapter_version, .task_id = m->task_id, .n_prompt = pg->n_prompt,
                                        .prompt = pg->prompt, .n_samples = pg->n_samples, .samples = pg->samples,
                                        .gen_seconds = m->gen_seconds / (m->n_groups ? m->n_groups : 1)};
        pg->prompt = NULL, pg->samples = NULL, pg->n_samples = 0;
    }
    logj_debug(j->id, "task %llu: %u groups of version %u buffered (%d of %d for step %u)", (unsigned long long)m->task_id,
               m->n_groups, m->adapter_version, j->n_buf, j->spec.prompts, j->step + 1);
    proto_batch_free(m);
    return 0;
}

// Drops groups sampled more than `staleness` versions ago (they may not train this version).
static void drop_stale(tjob_t *j) {
    int k = 0;
    for (int i = 0; i < j->n_buf; i++) {
        if (policy_stale(j->version, j->buf[i].version, j->spec.staleness)) {
            group_free(&j->buf[i]);
            j->dropped++;
        } else {
            j->buf[k++] = j->buf[i];
        }
    }
    j->n_buf = k;
}

// Publishes version+1 in ONE atomic Redis transaction: the adapter blob, the version pointer and
// step, the removal of the version that falls out of the kept window, the optimizer state (every
// optim_every steps) and the step's metrics. A crash leaves either all of it or none, so a
// restarted trainer never finds metrics or moments that disagree with the adapter. The script
// applies only while the job's stored step is below the new one: the store client sends a
// command again when the connection drops before its reply (store.h), and a publish that had
// already landed must not add the step's metrics a second time.
// The blobs do not pass through the script: a script's arguments are copied into Lua strings and
// again into the keys it sets (290 us per publish of a models/micro adapter with its moments,
// 225 KB, against 1 us for the same bytes SET directly: most of Redis' CPU time in a run of 32
// jobs). The transaction SETs them under staging keys of the job (adapter:{job}:staged,
// adapter:{job}:staged-optim) and the script RENAMEs them into place (or DELs them when it stands
// back), all in one MULTI ... EXEC: no staging key outlives the transaction.
// A step's metrics: at most STEP_METRICS fields.
#define STEP_METRICS 20

// KEYS: adapter, job, old adapter, optimizer, metrics, staged adapter, staged optimizer state.
// ARGV: version, step, drop old (0/1), optimizer state staged (0/1), the step's tokens,
// compute-seconds, mean reward and staleness (the job hash's totals and latest values), then
// metric field/value pairs. Returns -1 when applied, else the stored step that made it stand back.
static const char PUBLISH_LUA[] =
    "local cur = tonumber(redis.call('HGET', KEYS[2], '" JOB_STEP "') or '0') or 0\n"
    "if cur >= tonumber(ARGV[2]) then redis.call('DEL', KEYS[6], KEYS[7]) return cur end\n"
    "redis.call('RENAME', KEYS[6], KEYS[1])\n"
    "redis.call('HSET', KEYS[2], '" JOB_VERSION "', ARGV[1], '" JOB_STEP "', ARGV[2], '" JOB_REWARD "', ARGV[7], '"
    JOB_STALENESS "', ARGV[8])\n"
    "redis.call('HINCRBYFLOAT', KEYS[2], '" JOB_TOKENS "', ARGV[5])\n"
    "redis.call('HINCRBYFLOAT', KEYS[2], '" JOB_COMPUTE_S "', ARGV[6])\n"
    "if ARGV[3] == '1' then redis.call('DEL', KEYS[3]) end\n"
    "if ARGV[4] == '1' then redis.call('RENAME', KEYS[7], KEYS[4]) end\n"
    "redis.call('XADD', KEYS[5], 'MAXLEN', '~', '10000', '*', unpack(ARGV, 9))\n"
    "return -1\n";

// hv: the step's tokens, compute-seconds, mean reward and staleness for the job hash.
static int publish(tjobs_t *t, store_t *st, tjob_t *j, const char **mf, const char **mv, int nm, const char *const hv[4],
                   char *err) {
    ASSERT(nm >= 1 && nm <= STEP_METRICS);
    lora_t *a = lora_pool_get(engine_pool(t->e), j->slot);
    uint8_t *blob = NULL, *ob = NULL;
    size_t len = 0, ol = 0;
    if (lora_serialize(a, &blob, &len, err)) return -1;
    uint32_t v = j->version + 1;
    char kad[256], kjob[256], kold[256], kopt[256], kmet[256], ksad[256], ksopt[256], vs[16], ss[16];
    key_adapter(t->st, kad, sizeof kad, j->id, v);
    key_job(t->st, kjob, sizeof kjob, j->id);
    key_optim(t->st, kopt, sizeof kopt, j->id);
    key_metrics(t->st, kmet, sizeof kmet, j->id);
    key_adapter_pin(t->st, ksad, sizeof ksad, j->id, "staged");
    key_adapter_pin(t->st, ksopt, sizeof ksopt, j->id, "staged-optim");
    snprintf(vs, sizeof vs, "%u", v);
    snprintf(ss, sizeof ss, "%u", j->step + 1);
    bool drop_old = v >= (uint32_t)t->cfg.keep_versions;
    if (drop_old) key_adapter(t->st, kold, sizeof kold, j->id, v - (uint32_t)t->cfg.keep_versions);
    else snprintf(kold, sizeof kold, "%s", kad);   // a key of this job, not touched (ARGV[3] = 0)
    if ((j->step + 1) % (uint32_t)t->cfg.optim_every == 0) optim_serialize(j->opt, &ob, &ol);
    enum { NFIX = 18 };
    const char *argv[NFIX + 2 * STEP_METRICS] = {"EVAL", PUBLISH_LUA, "7", kad, kjob, kold, kopt, kmet, ksad, ksopt,
                                                 vs, ss, drop_old ? "1" : "0", ob ? "1" : "0",
                                                 hv[0], hv[1], hv[2], hv[3]};
    size_t lens[NFIX + 2 * STEP_METRICS];
    for (int i = 0; i < NFIX; i++) lens[i] = strlen(argv[i]);
    for (int i = 0; i < nm; i++) {
        argv[NFIX + 2 * i] = mf[i], argv[NFIX + 1 + 2 * i] = mv[i];
        lens[NFIX + 2 * i] = strlen(mf[i]), lens[NFIX + 1 + 2 * i] = strlen(mv[i]);
    }
    // the staged blobs, then the script (its reply is the transaction's last)
    const char *set_ad[3] = {"SET", ksad, (const char *)blob}, *set_opt[3] = {"SET", ksopt, (const char *)ob};
    size_t set_ad_len[3] = {3, strlen(ksad), len}, set_opt_len[3] = {3, strlen(ksopt), ol};
    store_argv_t cmds[3];
    int n = 0;
    cmds[n++] = (store_argv_t){3, set_ad, set_ad_len};
    if (ob) cmds[n++] = (store_argv_t){3, set_opt, set_opt_len};
    cmds[n++] = (store_argv_t){NFIX + 2 * nm, argv, lens};
    redisReply *r = store_atomic(st, n, cmds, err);
    free(blob);
    free(ob);
    if (!r) return -1;
    redisReply *e = r->type == REDIS_REPLY_ARRAY && r->elements == (size_t)n ? r->element[n - 1] : NULL;
    if (!e || e->type != REDIS_REPLY_INTEGER) {
        int type = e ? e->type : r->type;
        freeReplyObject(r);
        return err_set(err, "redis EVAL (publish): the script answered a reply of type %d, not an integer", type);
    }
    long long got = e->integer;
    freeReplyObject(r);
    if (got == (long long)j->step + 1) {
        logj_info(j->id, "step %u was already in the store (a publish sent again after a lost connection had landed)",
                  j->step + 1);
    } else if (got != -1) {
        return err_set(err, "the store holds step %lld for this job while this trainer publishes step %u: is another "
                       "trainer running the job? (check the trainers' logs for it)", got, j->step + 1);
    }
    j->version = v;
    j->step++;
    return 0;
}

// Fails the job (status and error in Redis) and frees it; r is its result.
static void fail_job(tjobs_t *t, tjob_t *j, const char *why, tjobs_result_t *r) {
    char key[256], err[ERR_LEN];
    memset(r, 0, sizeof *r);
    snprintf(r->job, sizeof r->job, "%s", j->id);
    r->failed = true;
    snprintf(r->error, sizeof r->error, "%s", why);
    key_job(t->st, key, sizeof key, j->id);
    const char *f[2] = {JOB_STATUS, JOB_ERROR}, *v[2] = {"failed", r->error};
    store_hset(t->st, key, 2, f, v, err);
    logj_error(j->id, "job failed: %s", r->error);
    job_free(t, &t->jobs[j->slot]);
}

// Rows the job's step computes: its `prompts` oldest groups as rl_batch_add_job packs them (a
// shared prompt once, then each sample's own rows).
static double step_rows(const tjobs_t *t, const tjob_t *j) {
    double rows = 0;
    for (int g = 0; g < j->spec.prompts; g++) {
        const tgroup_t *gr = &j->buf[g];
        int P = (int)gr->n_prompt, prefix = t->cfg.shared_prefix && P >= 2 && gr->n_samples > 0 ? P - 1 : 0;
        rows += prefix;
        for (uint32_t k = 0; k < gr->n_samples; k++) rows += P + (int)gr->samples[k].n - prefix;
    }
    return rows;
}

// Re-reads the weights of the tenants in use once they are TENANT_WEIGHT_S old.
static void refresh_weights(tjobs_t *t, double now) {
    for (int i = 0; i < t->cfg.max_jobs; i++) {
        ttenant_t *e = &t->tinfo[i];
        if (e->refs == 0 || now - e->weight_read < TENANT_WEIGHT_S) continue;
        double w = tenant_weight(t, e->name, false);
        if (w != t->ten[i].weight)
            logt_info(e->name, NULL, "tenant %s: fair-share weight %g (was %g)", e->name, w, t->ten[i].weight);
        t->ten[i].weight = w;
        e->weight_read = now;
    }
}

// Packs the `prompts` oldest groups of a ready job into the batch as one job.
static int pack(const tjobs_t *t, const tjob_t *j, rl_batch_t *b, char *err) {
    int n_groups = j->spec.prompts, n_samples = 0;
    for (int g = 0; g < n_groups; g++) n_samples += (int)j->buf[g].n_samples;
    rl_group_t *groups = xcalloc((size_t)n_groups, sizeof *groups);
    rl_sample_t *samples = xcalloc((size_t)(n_samples ? n_samples : 1), sizeof *samples), *sm = samples;
    for (int g = 0; g < n_groups; g++) {
        const tgroup_t *gr = &j->buf[g];
        groups[g] = (rl_group_t){.prompt = gr->prompt, .n_prompt = (int)gr->n_prompt, .samples = sm,
                                 .n_samples = (int)gr->n_samples, .version = gr->version,
                                 .gen_seconds = gr->gen_seconds};
        for (uint32_t s = 0; s < gr->n_samples; s++, sm++) {
            const proto_sample_t *ps = &gr->samples[s];
            *sm = (rl_sample_t){.tokens = ps->tokens, .logprobs = ps->logprobs, .env = ps->env, .n = (int)ps->n,
                                .reward = ps->reward, .turns = (int)ps->turns};
        }
    }
    rl_job_cfg_t c = {.slot = j->slot, .version = j->version, .std_norm = j->spec.std_norm,
                      .share_prompt = t->cfg.shared_prefix};
    int rc = rl_batch_add_job(b, &c, groups, n_groups, err) < 0 ? -1 : 0;
    free(groups), free(samples);
    return rc;
}

// Publishes a trained job's step: metrics, the new version, the log line; the consumed groups
// leave the buffer.
static void finish(tjobs_t *t, store_t *st, tjob_t *j, const rl_batch_job_t *bj, const rl_step_job_t *sj,
                   tjobs_result_t *out) {
    const loss_stats_t *ls = &sj->loss;
    char err[ERR_LEN];
    // mismatch is measured on on-policy groups only; absent when the step had none
    char v[20][40];
    const char *mf[STEP_METRICS] = {"step", "reward", "kl", "clip_frac", "entropy", "ratio", "staleness", "tokens",
                                    "train_s", "gen_s", "groups", "dropped", "grad_norm", "time", "turns", "env_tokens",
                                    "reward_std", "mismatch"};
    snprintf(v[0], 40, "%u", j->step + 1);
    snprintf(v[1], 40, "%.5f", bj->reward_sum / bj->samples);
    snprintf(v[2], 40, "%.6f", ls->kl);
    snprintf(v[3], 40, "%.5f", ls->clip_frac);
    snprintf(v[4], 40, "%.5f", ls->entropy);
    snprintf(v[5], 40, "%.6f", ls->ratio_mean);
    snprintf(v[6], 40, "%.3f", bj->staleness_sum / j->spec.prompts);
    snprintf(v[7], 40, "%.0f", bj->tokens);
    snprintf(v[8], 40, "%.4f", sj->seconds);
    snprintf(v[9], 40, "%.4f", bj->gen_seconds);
    snprintf(v[10], 40, "%d", j->spec.prompts);
    snprintf(v[11], 40, "%u", j->dropped);
    snprintf(v[12], 40, "%.4f", sj->grad_norm);
    snprintf(v[13], 40, "%.3f", (double)time(NULL));
    snprintf(v[14], 40, "%.3f", bj->turns / bj->samples);
    snprintf(v[15], 40, "%.0f", bj->env_tokens);
    // the spread of the step's rewards over its samples (population standard deviation)
    double rmean = bj->reward_sum / bj->samples, rvar = bj->reward_sq / bj->samples - rmean * rmean;
    snprintf(v[16], 40, "%.5f", rvar > 0 ? sqrt(rvar) : 0.0);
    snprintf(v[17], 40, "%.3g", ls->mismatch);
    int nm = ls->mismatch_tokens > 0 ? 18 : 17;
    const char *mv[20];
    for (int q = 0; q < 18; q++) mv[q] = v[q];
    char compute[40];
    snprintf(compute, sizeof compute, "%.4f", sj->seconds + bj->gen_seconds);
    const char *hv[4] = {v[7], compute, v[1], v[6]};
    if (publish(t, st, j, mf, mv, nm, hv, err)) {
        logj_error(j->id, "step %u not published (%s); the step is retried with the next data", j->step + 1, err);
        return;
    }
    out->step = j->step;
    out->version = j->version;
    out->consumed = (uint32_t)j->spec.prompts;
    out->dropped = j->dropped;
    j->dropped = 0;
    j->last_used = util_now();
    const char *tenant = t->tinfo[j->tenant].name;
    logt_info(tenant[0] ? tenant : NULL, j->id,
              "step=%u version=%u reward=%.3f kl=%.4f clip=%.3f mismatch=%s staleness=%.2f tokens=%.0f "
              "train_s=%.3f turns=%s env_tokens=%s gen_tokens=%.0f",
              j->step, j->version, bj->reward_sum / bj->samples, ls->kl, ls->clip_frac, nm == 18 ? v[17] : "-",
              bj->staleness_sum / j->spec.prompts, bj->tokens, sj->seconds, v[14], v[15], bj->gen_tokens);
    for (int g = 0; g < j->spec.prompts; g++) group_free(&j->buf[g]);
    memmove(j->buf, j->buf + j->spec.prompts, sizeof(tgroup_t) * (size_t)(j->n_buf - j->spec.prompts));
    j->n_buf -= j->spec.prompts;
}

int tjobs_step(tjobs_t *t, tjobs_result_t *res, int max) {
    int n_out = 0, M = t->cfg.max_jobs;
    tjob_t **ready = t->ready;
    double now = util_now();
    // a job whose own batches kept being invalid fails first (tjobs_add decided it)
    for (int i = 0; i < M && n_out < max; i++)
        if (t->jobs[i] && t->jobs[i]->fail_why[0]) {
            char why[ERR_LEN];
            snprintf(why, sizeof why, "%s", t->jobs[i]->fail_why);
            fail_job(t, t->jobs[i], why, &res[n_out++]);
        }
    bool any = false;
    for (int i = 0; i < M; i++) {
        tjob_t *j = t->jobs[i];
        policy_tjob_t *f = &t->fs[i];
        f->ready = f->active = false;
        if (!j) continue;
        drop_stale(j);
        if (j->step >= (uint32_t)j->spec.max_steps) {
            // finished: what is still buffered or arriving is surplus of the pipeline
            for (int g = 0; g < j->n_buf; g++) group_free(&j->buf[g]);
            j->n_buf = 0;
            continue;
        }
        f->ready = !j->fail_why[0] && j->n_buf >= j->spec.prompts;
        f->active = f->ready || now - j->last_batch < ACTIVE_S;
        if (f->ready) f->rows = step_rows(t, j), any = true;
        if (!f->ready && j->dropped && !j->fail_why[0] && n_out < max) {
            // the dropped groups would otherwise be reported with the next step, which cannot
            // come while the scheduler counts them as in flight (it issues no more for the job)
            tjobs_result_t *o = &res[n_out++];
            memset(o, 0, sizeof *o);
            snprintf(o->job, sizeof o->job, "%s", j->id);
            o->step = j->step, o->version = j->version, o->dropped = j->dropped, o->drop_only = true;
            j->dropped = 0;
        }
    }
    if (!any || t->broken[0] || n_out >= max) return n_out;
    // The jobs of this step: fair per tenant, then per job (policy_train_pick), within pass_rows
    // rows and the results left (a step reports every job it trains; the others wait for the
    // next); charged now, so a job that fails below has still used its share. With lanes, as many
    // jobs as fill two passes per lane (the lanes' passes then end closer together: 32 jobs on
    // models/micro, 2 lanes, bench/e2e.sh: 88.7 s with one pass per lane, 84.0 s with two, 83.0 s
    // with four). Trained in table order.
    refresh_weights(t, now);
    int n_ready = policy_train_pick(t->fs, M, t->ten, M, t->cfg.pass_rows, t->cfg.lanes > 1 ? 2 * t->cfg.lanes : 1,
                                    max - n_out, t->picked);
    policy_train_charge(t->fs, M, t->ten, M, t->picked, n_ready);
    for (int a = 1; a < n_ready; a++)
        for (int c = a; c > 0 && t->picked[c - 1] > t->picked[c]; c--) {
            int x = t->picked[c];
            t->picked[c] = t->picked[c - 1], t->picked[c - 1] = x;
        }
    for (int r = 0; r < n_ready; r++) ready[r] = t->jobs[t->picked[r]];
    double t0 = util_now();
    // One mixed batch: for each ready job its B oldest groups (common/rl/batch.h); a job whose
    // groups cannot be packed fails alone.
    rl_batch_t b = {0};
    char err[ERR_LEN] = "";
    int k = 0;
    for (int r = 0; r < n_ready; r++) {
        if (pack(t, ready[r], &b, err)) fail_job(t, ready[r], err, &res[n_out++]);
        else ready[k++] = ready[r];
    }
    n_ready = k;
    rl_step_job_t *sj = xcalloc((size_t)(n_ready ? n_ready : 1), sizeof *sj);
    int *jrc = xcalloc((size_t)(n_ready ? n_ready : 1), sizeof *jrc);
    char(*jerr)[ERR_LEN] = xcalloc((size_t)(n_ready ? n_ready : 1), sizeof *jerr);
    tpass_t *ps = xcalloc((size_t)(n_ready ? n_ready : 1), sizeof *ps);
    tjobs_result_t *fin = xcalloc((size_t)(n_ready ? n_ready : 1), sizeof *fin);
    for (int r = 0; r < n_ready; r++) sj[r].opt = ready[r]->opt, sj[r].grad = ready[r]->grad;
    // Jobs may differ in temperature / clipping: one pass per distinct loss setting would be
    // exact; the loss settings of the first ready job apply to a shared pass only when all
    // agree, otherwise each job gets its own pass.
    int n_ps = 0;
    for (int r0 = 0; r0 < n_ready;) {
        int r1 = r0 + 1;
        const jobspec_t *s0 = &ready[r0]->spec;
        double in_pass = b.jobs[r0].rows;
        while (r1 < n_ready && ready[r1]->spec.temperature == s0->temperature &&
               ready[r1]->spec.clip_low == s0->clip_low && ready[r1]->spec.clip_high == s0->clip_high &&
               ready[r1]->spec.kl == 0 && s0->kl == 0 && in_pass + b.jobs[r1].rows <= t->cfg.pass_rows)
            in_pass += b.jobs[r1++].rows;
        ps[n_ps++] = (tpass_t){.r0 = r0, .r1 = r1, .rows = in_pass,
                               .lc = {.kind = LOSS_RL, .temperature = s0->temperature, .clip_low = s0->clip_low,
                                      .clip_high = s0->clip_high, .kl_coef = s0->kl}};
        r0 = r1;
    }
    t->cur_b = &b, t->cur_sj = sj, t->cur_jrc = jrc, t->cur_jerr = jerr, t->cur_fin = fin;
    int n_run = run_passes(t, ps, n_ps);
    t->cur_b = NULL, t->cur_sj = NULL, t->cur_jrc = NULL, t->cur_jerr = NULL, t->cur_fin = NULL;
    for (int p = 0; p < n_run; p++) {
        if (ps[p].rc == DP_BROKEN) {
            set_broken(t, ps[p].err);
            break;
        }
        for (int r = ps[p].r0; r < ps[p].r1; r++) {
            tjob_t *j = ready[r];
            tjobs_result_t *out = &res[n_out++];
            char why[ERR_LEN];
            if (jrc[r]) {
                snprintf(why, sizeof why, "step %u: the training pass refused the job's data: %s", j->step + 1, jerr[r]);
                fail_job(t, j, why, out);
            } else if (sj[r].failed) {
                snprintf(why, sizeof why, "step %u: %s; lower the learning rate (spec.lr)", j->step + 1, sj[r].error);
                fail_job(t, j, why, out);
            } else {
                *out = fin[r];   // trained and published by its pass (run_pass)
            }
        }
    }
    free(ps), free(fin);
    free(sj), free(jrc), free(jerr);
    rl_batch_free(&b);
    t->busy += util_now() - t0;
    return n_out;
}

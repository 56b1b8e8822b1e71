// score.c - built-in and external reward scoring of rollout batches.
#include "services/verifier/score.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/rl/jobdata.h"
#include "common/rl/jobspec.h"
#include "common/rl/rl.h"
#include "common/tasks/env.h"
#include "common/sim/sim.h"
#include "common/util/log.h"
#include "common/rl/keys.h"

#define MAX_JOBS SCORER_MAX_JOBS
#define MAX_ENDPOINTS SCORER_MAX_ENDPOINTS
#define WARN_EVERY_S 5.0      // a job's reward failures: one line, then one per this many seconds

typedef struct {
    char id[PROTO_MAX_ID];
    char tenant[PROTO_MAX_ID];   // from the job hash; "" when it has none
    jobspec_t spec;
    rl_source_t src;
    bool ok;
    char error[ERR_LEN];
    double last_used;
    bool private_copy;        // not in the cache: belongs to the one batch that uses it
    double warned;            // time of the last failure line (job_warn)
    unsigned quiet;           // failures since that line, not logged
} vjob_t;

// A socket to a tenant's reward or environment service. Replies are read per socket, so a
// service can only ever answer requests that went out on its own socket.
typedef struct {
    char tenant[PROTO_MAX_ID];
    char name[ENDPOINT_MAX];
    zsock_t *sock;
    int refs;                 // requests outstanding on it
    double idle_since;        // when refs last fell to 0
} vep_t;

typedef struct {
    proto_batch_t b;
    vjob_t *job;
    int outstanding;          // external requests not yet answered
    bool job_failed;
    bool cont;                // multi-turn: some episodes await their next turn (not scored yet)
    bool external_env;        // an external environment steps (and rewards) the episodes
    char error[ERR_LEN];
} vbatch_t;

typedef struct {
    uint64_t id;              // random (req_id): a service cannot guess the ids of others' requests
    vbatch_t *vb;
    uint32_t group;
    int sample;               // env_req: the episode's sample; -1 = a reward_req of the group
    int tries;
    double deadline;
    vep_t *ep;                // the socket it went out on (holds a reference)
    proto_buf_t payload;
} vreq_t;

struct scorer {
    store_t *st;
    scorer_cfg_t cfg;
    vjob_t *jobs[MAX_JOBS];
    vep_t *ep[MAX_ENDPOINTS];
    zsock_t *ep_sock[MAX_ENDPOINTS + 1];   // ep[i]->sock, NULL-terminated, for the loop's poll
    int n_ep;
    vbatch_t **batches;
    int n_batches, cap_batches;
    vreq_t *reqs;
    int n_reqs, cap_reqs;
    uint64_t refused;         // replies not applied
    double busy;
};

scorer_t *scorer_new(store_t *st, const scorer_cfg_t *cfg, char *err) {
    if (!st) {
        err_set(err, "scorer needs a store");
        return NULL;
    }
    if (sodium_init() < 0) {
        err_set(err, "libsodium did not initialise (no random source for request ids)");
        return NULL;
    }
    scorer_t *s = xcalloc(1, sizeof *s);
    s->st = st;
    if (cfg) s->cfg = *cfg;
    if (s->cfg.per_tenant <= 0) s->cfg.per_tenant = SCORER_PER_TENANT;
    if (s->cfg.per_tenant > MAX_ENDPOINTS) s->cfg.per_tenant = MAX_ENDPOINTS;
    if (s->cfg.idle_s <= 0) s->cfg.idle_s = SCORER_IDLE_S;
    return s;
}

static void vjob_free(vjob_t *j) {
    rl_source_close(&j->src);
    free(j);
}

static void vbatch_free(vbatch_t *vb) {
    if (vb->job && vb->job->private_copy) vjob_free(vb->job);
    proto_batch_free(&vb->b);
    free(vb);
}

void scorer_destroy(scorer_t **ps) {
    if (!ps || !*ps) return;
    scorer_t *s = *ps;
    // batches first: they may point at cached jobs
    for (int i = 0; i < s->n_batches; i++) vbatch_free(s->batches[i]);
    for (int i = 0; i < MAX_JOBS; i++)
        if (s->jobs[i]) vjob_free(s->jobs[i]);
    for (int i = 0; i < s->n_ep; i++) {
        zsock_destroy(&s->ep[i]->sock);
        free(s->ep[i]);
    }
    for (int i = 0; i < s->n_reqs; i++) proto_buf_free(&s->reqs[i].payload);
    free(s->batches);
    free(s->reqs);
    free(s);
    *ps = NULL;
}

static bool in_use(const scorer_t *s, const vjob_t *j) {
    for (int i = 0; i < s->n_batches; i++)
        if (s->batches[i]->job == j) return true;
    return false;
}

// The job's spec and task source, loaded from Redis once (specs never change). The cache keeps
// MAX_JOBS jobs and evicts the least recently used one that no waiting batch points at; when
// every cached job is in use, the new one is a private copy owned by its batch.
static vjob_t *job_get(scorer_t *s, const char *id) {
    int free_i = -1, old_i = -1;
    for (int i = 0; i < MAX_JOBS; i++) {
        if (s->jobs[i] && !strcmp(s->jobs[i]->id, id)) {
            s->jobs[i]->last_used = util_now();
            return s->jobs[i];
        }
        if (!s->jobs[i] && free_i < 0) free_i = i;
    }
    if (free_i < 0) {
        for (int i = 0; i < MAX_JOBS; i++)
            if (!in_use(s, s->jobs[i]) && (old_i < 0 || s->jobs[i]->last_used < s->jobs[old_i]->last_used)) old_i = i;
        if (old_i >= 0) {
            vjob_free(s->jobs[old_i]);
            s->jobs[old_i] = NULL;
            free_i = old_i;
        }
    }
    vjob_t *j = xcalloc(1, sizeof *j);
    snprintf(j->id, sizeof j->id, "%s", id);
    j->last_used = util_now();
    char key[256], *spec = NULL;
    key_job(s->st, key, sizeof key, id);
    int rc = store_hget(s->st, key, JOB_SPEC, &spec, NULL, j->error);
    if (rc == 1) snprintf(j->error, sizeof j->error, "job %s not found in Redis", id);
    if (rc == 0 && jobspec_parse(&j->spec, spec, j->error) == 0) {
        if (!j->spec.dataset) {
            j->ok = rl_source_open(&j->src, j->spec.task, NULL, NULL, j->error) == 0;
        } else {
            j->src.ds = jobdata_dataset(s->st, id, &j->spec, j->error);
            snprintf(j->src.name, sizeof j->src.name, "%s", j->spec.task);
            j->ok = j->src.ds != NULL;
        }
    }
    free(spec);
    char *tenant = NULL, why[ERR_LEN];
    if (rc == 0 && store_hget(s->st, key, JOB_TENANT, &tenant, NULL, why) < 0)
        logj_warn(id, "tenant unknown (%s): its service sockets count with other jobs of unknown tenant", why);
    snprintf(j->tenant, sizeof j->tenant, "%s", tenant ? tenant : "");
    free(tenant);
    // a job's service must be where the operator allows: the job fails with the rule otherwise
    bool env = j->spec.env_endpoint[0] != 0;
    const char *ep = env ? j->spec.env_endpoint : j->spec.reward_endpoint;
    if (j->ok && ep[0] && !endpoint_allowed(ep, s->cfg.rules, why)) {
        j->ok = false;
        snprintf(j->error, sizeof j->error, "%s endpoint %.60s refused: %.150s", env ? "env" : "reward", ep, why);
    }
    if (!j->ok) logt_error(j->tenant[0] ? j->tenant : NULL, id, "cannot score this job: %s", j->error);
    if (free_i >= 0) s->jobs[free_i] = j;
    else j->private_copy = true;
    return j;
}

char *scorer_prompt(scorer_t *s, const char *job, proto_kind_t kind, uint64_t index) {
    for (int i = 0; i < MAX_JOBS; i++) {
        vjob_t *j = s->jobs[i];
        if (!j || strcmp(j->id, job) != 0 || !j->ok) continue;
        task_example_t ex = {0};
        char *out = NULL;
        if (rl_source_example(&j->src, kind == PROTO_KIND_EVAL ? TASK_EVAL : TASK_TRAIN, index, &ex) >= 0 && ex.prompt)
            out = xstrdup(ex.prompt);
        task_example_free(&ex);
        return out;
    }
    return NULL;
}

// A job's reward or environment failure, logged rate-limited per job: the first at once, then
// one line per WARN_EVERY_S with the number of the others (a dead service costs a line every few
// seconds, not one per group, and is never silent).
static void job_warn(vjob_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_warn(vjob_t *j, const char *fmt, ...) {
    double now = util_now();
    if (j->warned > 0 && now - j->warned < WARN_EVERY_S) {
        j->quiet++;
        return;
    }
    char msg[2 * ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *tenant = j->tenant[0] ? j->tenant : NULL;
    if (j->quiet) logt_warn(tenant, j->id, "%s (%u more failures in the last %.0f s)", msg, j->quiet, now - j->warned);
    else logt_warn(tenant, j->id, "%s", msg);
    j->warned = now;
    j->quiet = 0;
}

static void ep_close(scorer_t *s, int i) {
    zsock_destroy(&s->ep[i]->sock);
    free(s->ep[i]);
    s->n_ep--;
    s->ep[i] = s->ep[s->n_ep];
    s->ep_sock[i] = s->ep_sock[s->n_ep];
    s->ep[s->n_ep] = NULL;
    s->ep_sock[s->n_ep] = NULL;
}

// The socket to the job's service: the tenant's open one for that endpoint, else a new one.
// A tenant holds at most cfg.per_tenant sockets and all tenants MAX_ENDPOINTS; at a limit the
// longest idle socket (no request outstanding) of that tenant, or of anyone at the global one,
// is closed to make room, and when none is idle the job gets why (never another tenant's job).
static vep_t *endpoint_get(scorer_t *s, const vjob_t *j, const char *name, char *why) {
    int mine = 0, idle_mine = -1, idle_any = -1;
    for (int i = 0; i < s->n_ep; i++) {
        vep_t *e = s->ep[i];
        bool same = !strcmp(e->tenant, j->tenant);
        if (same && !strcmp(e->name, name)) return e;
        mine += same;
        if (e->refs) continue;
        if (same && (idle_mine < 0 || e->idle_since < s->ep[idle_mine]->idle_since)) idle_mine = i;
        if (idle_any < 0 || e->idle_since < s->ep[idle_any]->idle_since) idle_any = i;
    }
    char rule[ERR_LEN];
    if (!endpoint_allowed(name, s->cfg.rules, rule)) {
        err_set(why, "refused: %.200s", rule);
        return NULL;
    }
    if (mine >= s->cfg.per_tenant) {
        if (idle_mine < 0) {
            err_set(why, "not connected: tenant %.40s has %d services busy at this verifier (max_tenant_endpoints %d); "
                    "use fewer distinct endpoints across its jobs", j->tenant[0] ? j->tenant : "?", mine,
                    s->cfg.per_tenant);
            return NULL;
        }
        ep_close(s, idle_mine);
    } else if (s->n_ep == MAX_ENDPOINTS) {
        if (idle_any < 0) {
            err_set(why, "not connected: all %d service sockets of this verifier are busy; try again later", MAX_ENDPOINTS);
            return NULL;
        }
        ep_close(s, idle_any);
    }
    char err[ERR_LEN];
    zsock_t *d = bus_connect(ZMQ_DEALER, name, NULL, 1000, PROTO_MAX_FRAME, err);
    if (!d) {
        err_set(why, "cannot connect: %.200s", err);
        return NULL;
    }
    vep_t *e = xcalloc(1, sizeof *e);
    snprintf(e->tenant, sizeof e->tenant, "%s", j->tenant);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->sock = d;
    e->idle_since = util_now();
    s->ep[s->n_ep] = e;
    s->ep_sock[s->n_ep++] = d;
    s->ep_sock[s->n_ep] = NULL;
    return e;
}

// A request id: 64 random bits, never 0. Ids are not sequential, so a service cannot name a
// request it was not sent; a reply is also only looked for among its socket's requests.
static uint64_t req_id(void) {
    uint64_t id = 0;
    while (!id) randombytes_buf(&id, sizeof id);
    return id;
}

static void send_req(vreq_t *r) {
    void *h = zsock_resolve(r->ep->sock);
    // empty delimiter first, so a plain REP socket answers
    if (zmq_send(h, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) zmq_send(h, r->payload.data, r->payload.len, ZMQ_DONTWAIT);
}

static void scorer_push(scorer_t *s, vbatch_t *vb) {
    if (s->n_batches == s->cap_batches) {
        s->cap_batches = s->cap_batches ? 2 * s->cap_batches : 32;
        s->batches = xrealloc(s->batches, sizeof(vbatch_t *) * (size_t)s->cap_batches);
    }
    s->batches[s->n_batches++] = vb;
}

static vreq_t *req_new(scorer_t *s) {
    if (s->n_reqs == s->cap_reqs) {
        s->cap_reqs = s->cap_reqs ? 2 * s->cap_reqs : 64;
        s->reqs = xrealloc(s->reqs, sizeof(vreq_t) * (size_t)s->cap_reqs);
    }
    return &s->reqs[s->n_reqs];
}

// Sends the request built in s->reqs[s->n_reqs] (req_new) and keeps it; it holds a reference
// to its socket until req_done.
static void req_keep(scorer_t *s) {
    vreq_t *r = &s->reqs[s->n_reqs++];
    r->ep->refs++;
    r->vb->outstanding++;
    send_req(r);
}

// Forgets request i (answered or failed) and releases its socket.
static void req_done(scorer_t *s, int i) {
    vreq_t *r = &s->reqs[i];
    if (--r->ep->refs == 0) r->ep->idle_since = util_now();
    proto_buf_free(&r->payload);
    s->reqs[i] = s->reqs[--s->n_reqs];
}

// An episode the environment could not step (service down, error, timeout): it ends with
// reward 0, counted as a reward error.
static void episode_fail(proto_sample_t *sm) {
    sm->reward = 0, sm->failed = 1, sm->rewarded = 1, sm->pending = 0;
    free(sm->obs), sm->obs = NULL;
}

// External environment (spec.env.endpoint): every episode that is not over yet had a new model
// turn; each is sent as an env_req and waits for its env_rep (observation, or the end with its
// reward). The batch is taken once every reply is in.
static void step_external(scorer_t *s, vbatch_t *vb, task_split_t split) {
    vjob_t *j = vb->job;
    char why[ERR_LEN];
    vep_t *ep = endpoint_get(s, j, j->spec.env_endpoint, why);
    if (!ep) job_warn(j, "environment %.100s: %s; the batch's episodes end with reward 0", j->spec.env_endpoint, why);
    for (uint32_t g = 0; g < vb->b.n_groups; g++) {
        proto_group_t *gr = &vb->b.groups[g];
        task_example_t ex = {0};
        rl_source_example(&j->src, split, gr->index, &ex);
        for (uint32_t i = 0; i < gr->n_samples; i++) {
            proto_sample_t *sm = &gr->samples[i];
            if (sm->rewarded) continue;
            sm->pending = 0;
            proto_env_req_t rq = {.id = req_id(), .job = vb->b.job, .prompt = ex.prompt ? ex.prompt : "",
                                  .transcript = sm->text ? sm->text : "", .turn = sm->turns ? sm->turns : 1};
            vreq_t *r = req_new(s);
            *r = (vreq_t){.id = rq.id, .vb = vb, .group = g, .sample = (int)i, .ep = ep,
                          .deadline = util_now() + j->spec.env_timeout_ms / 1000.0};
            if (ep && proto_env_req_encode(&rq, &r->payload) == 0) {
                req_keep(s);
            } else {
                proto_buf_free(&r->payload);
                episode_fail(sm);
            }
        }
        task_example_free(&ex);
    }
}

// An env_rep for request i: the observation goes into the transcript (the episode continues if
// turns remain), or the episode ends with the environment's reward.
static void env_reply(scorer_t *s, int i, const proto_env_rep_t *rep) {
    vreq_t *r = &s->reqs[i];
    vbatch_t *vb = r->vb;
    proto_sample_t *sm = &vb->b.groups[r->group].samples[r->sample];
    if (rep->error) {
        job_warn(vb->job, "environment %.100s: %.200s; the episode ends with reward 0", vb->job->spec.env_endpoint,
                 rep->error);
        episode_fail(sm);
    } else if (rep->done) {
        sm->reward = (float)(rep->reward < 0 ? 0 : rep->reward > 1 ? 1 : rep->reward);
        sm->rewarded = 1, sm->pending = 0;
    } else if ((sm->turns ? (int)sm->turns : 1) >= vb->job->spec.max_turns) {
        // the environment wants more but the episode is out of turns: it ends unrewarded
        sm->reward = 0, sm->rewarded = 1, sm->pending = 0;
    } else {
        free(sm->obs);
        sm->obs = xstrdup(rep->obs ? rep->obs : "");
        size_t a = sm->text ? strlen(sm->text) : 0, b = strlen(sm->obs);
        sm->text = xrealloc(sm->text, a + b + 1);
        memcpy(sm->text + a, sm->obs, b + 1);
        sm->pending = 1;
    }
    vb->outstanding--;
    req_done(s, i);
}

// Steps the built-in environment of every pending episode (its last turn ended at a tool call):
// the observation is appended to the transcript and kept for the rollout to tokenize; an
// episode at its turn limit, or whose call the environment does not take, ends. Returns true
// when some episode goes on.
static bool step_episodes(vbatch_t *vb, task_split_t split) {
    vjob_t *j = vb->job;
    bool more = false;
    for (uint32_t g = 0; g < vb->b.n_groups; g++) {
        proto_group_t *gr = &vb->b.groups[g];
        bool any = false;
        for (uint32_t i = 0; i < gr->n_samples; i++) any |= gr->samples[i].pending != 0;
        if (!any) continue;
        task_example_t ex = {0};
        const task_t *t = j->src.task;
        if (t) rl_source_example(&j->src, split, gr->index, &ex);
        for (uint32_t i = 0; i < gr->n_samples; i++) {
            proto_sample_t *sm = &gr->samples[i];
            if (!sm->pending) continue;
            char obs[ENV_OBS_MAX];
            int turns = sm->turns ? (int)sm->turns : 1;
            if (!t || turns >= j->spec.max_turns ||
                env_step(t, &ex, sm->text ? sm->text : "", obs, sizeof obs) != 1) {
                sm->pending = 0;
                continue;
            }
            free(sm->obs);
            sm->obs = xstrdup(obs);
            size_t a = sm->text ? strlen(sm->text) : 0, b = strlen(obs);
            sm->text = xrealloc(sm->text, a + b + 1);
            memcpy(sm->text + a, obs, b + 1);
            more = true;
        }
        task_example_free(&ex);
    }
    return more;
}

// A group whose rewards could not be had (service unreachable, refused, error, timeout): reward 0,
// the samples marked failed (counted in the job's reward_errors), or with on_failure "fail" the
// job fails with why.
static void group_fail(vbatch_t *vb, uint32_t g, const char *why) {
    proto_group_t *gr = &vb->b.groups[g];
    for (uint32_t k = 0; k < gr->n_samples; k++) gr->samples[k].reward = 0, gr->samples[k].failed = 1;
    job_warn(vb->job, "reward service %.100s: %.200s; rewards of this group set to 0", vb->job->spec.reward_endpoint, why);
    if (vb->job->spec.reward_on_failure == REWARD_FAIL_JOB) {
        vb->job_failed = true;
        snprintf(vb->error, sizeof vb->error, "reward service %.60s failed: %.160s", vb->job->spec.reward_endpoint, why);
    }
}

// One debug line per batch: how its samples ended (an end-of-sequence token, a stop string such
// as a plain prompt's newline, the token limit) and how many texts hold a newline.
static void log_endings(const proto_batch_t *b) {
    if (LOGL_DEBUG < log_level) return;
    unsigned fin[4] = {0}, nl = 0, n = 0;
    for (uint32_t g = 0; g < b->n_groups; g++)
        for (uint32_t i = 0; i < b->groups[g].n_samples; i++) {
            const proto_sample_t *sm = &b->groups[g].samples[i];
            fin[sm->finish <= PROTO_FIN_LENGTH ? sm->finish : 0]++;
            nl += sm->text && strchr(sm->text, '\n');
            n++;
        }
    logj_debug(b->job, "task %llu: %u samples ended: eos %u, stop %u, length %u; %u with a newline",
               (unsigned long long)b->task_id, n, fin[PROTO_FIN_EOS], fin[PROTO_FIN_STOP], fin[PROTO_FIN_LENGTH], nl);
}

void scorer_add(scorer_t *s, proto_batch_t *b) {
    double t0 = util_now();
    log_endings(b);
    vbatch_t *vb = xcalloc(1, sizeof *vb);
    vb->b = *b;
    memset(b, 0, sizeof *b);
    vb->job = job_get(s, vb->b.job);
    vjob_t *j = vb->job;
    task_split_t split = vb->b.kind == PROTO_KIND_EVAL ? TASK_EVAL : TASK_TRAIN;
    // Multi-turn: the environment answers every episode whose turn ended at a tool call; while
    // any episode of the batch goes on, the batch returns to the rollouts (through the
    // scheduler) and nothing is scored.
    if (j->ok && j->spec.env_endpoint[0]) {
        step_external(s, vb, split);
        vb->external_env = true;
        scorer_push(s, vb);
        s->busy += util_now() - t0;
        return;
    }
    if (j->ok && step_episodes(vb, split)) {
        vb->cont = true;
        scorer_push(s, vb);
        s->busy += util_now() - t0;
        return;
    }
    sim_curve_t curve;
    for (uint32_t g = 0; g < vb->b.n_groups; g++) {
        proto_group_t *gr = &vb->b.groups[g];
        if (!j->ok) {
            for (uint32_t i = 0; i < gr->n_samples; i++) gr->samples[i].reward = 0, gr->samples[i].failed = 1;
            continue;
        }
        task_example_t ex;
        int h = rl_source_example(&j->src, split, gr->index, &ex);
        if (j->spec.reward_endpoint[0]) {
            char why[ERR_LEN];
            vep_t *ep = endpoint_get(s, j, j->spec.reward_endpoint, why);
            proto_reward_req_t rq = {.id = req_id(), .job = vb->b.job, .prompt = ex.prompt, .n = gr->n_samples};
            char **texts = xcalloc(gr->n_samples ? gr->n_samples : 1, sizeof(char *));
            for (uint32_t i = 0; i < gr->n_samples; i++) texts[i] = gr->samples[i].text;
            rq.completions = texts;
            vreq_t *r = req_new(s);
            *r = (vreq_t){.id = rq.id, .vb = vb, .group = g, .sample = -1, .tries = 0, .ep = ep,
                          .deadline = util_now() + j->spec.reward_timeout_ms / 1000.0};
            if (ep && proto_reward_req_encode(&rq, &r->payload) == 0) {
                req_keep(s);
            } else {
                proto_buf_free(&r->payload);
                if (ep) snprintf(why, sizeof why, "request not encodable");
                group_fail(vb, g, why);
            }
            free(texts);
        } else if (sim_task_curve(j->spec.task, &curve) == 0) {
            // a simulated task (common/sim/sim.h): the reward follows its learning curve at the
            // adapter's trained steps, whatever the (simulated) text; an eval round is
            // deterministic per (job, version, example)
            bool eval = vb->b.kind == PROTO_KIND_EVAL;
            uint64_t key = sim_key(vb->b.job) ^ (eval ? 0x5EED0000ull + vb->b.adapter_version : vb->b.task_id);
            for (uint32_t i = 0; i < gr->n_samples; i++)
                gr->samples[i].reward = sim_reward(&curve, vb->b.adapter_version, key, gr->index, i, eval);
        } else {
            for (uint32_t i = 0; i < gr->n_samples; i++)
                gr->samples[i].reward = rl_source_verify(&j->src, &ex, h, gr->samples[i].text ? gr->samples[i].text : "");
        }
        task_example_free(&ex);
    }
    scorer_push(s, vb);
    s->busy += util_now() - t0;
}

zsock_t **scorer_sockets(scorer_t *s, int *n) {
    *n = s->n_ep;
    return s->ep_sock;
}

static void req_fail(scorer_t *s, int i, const char *why) {
    vreq_t *r = &s->reqs[i];
    vbatch_t *vb = r->vb;
    if (r->sample >= 0) {
        job_warn(vb->job, "environment %.100s: %.200s; the episode ends with reward 0", vb->job->spec.env_endpoint, why);
        episode_fail(&vb->b.groups[r->group].samples[r->sample]);
    } else {
        group_fail(vb, r->group, why);
    }
    vb->outstanding--;
    req_done(s, i);
}

// A reply the scorer does not apply: counted, and handed to the reject path (rate-limited lines).
static void reply_refused(scorer_t *s, const vep_t *e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void reply_refused(scorer_t *s, const vep_t *e, const char *fmt, ...) {
    char what[ERR_LEN], msg[2 * ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "%s (from %.100s of tenant %.40s; not applied)", what, e->name, e->tenant[0] ? e->tenant : "?");
    s->refused++;
    if (s->cfg.reject) s->cfg.reject(s->cfg.ctx, msg);
    else log_warn("%s", msg);
}

// The request a reply on socket e answers: one sent on that very socket with that id, of the
// reply's kind. -1 when there is none (a reply after the request timed out, or a made-up one).
static int req_find(const scorer_t *s, const vep_t *e, uint64_t id, bool env) {
    for (int i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].ep == e && s->reqs[i].id == id && (s->reqs[i].sample >= 0) == env) return i;
    return -1;
}

void scorer_poll(scorer_t *s) {
    char err[ERR_LEN];
    for (int e = 0; e < s->n_ep; e++) {
        vep_t *ep = s->ep[e];
        for (;;) {
            zmsg_t *m = zmsg_recv_nowait(ep->sock);
            if (!m) break;
            zframe_t *f = zmsg_last(m);
            proto_reward_rep_t rep;
            proto_env_rep_t erep;
            char type[32];
            if (f && proto_peek_type(zframe_data(f), zframe_size(f), type, err) == 0 && !strcmp(type, "env_rep")) {
                if (proto_env_rep_decode(zframe_data(f), zframe_size(f), &erep, err) == 0) {
                    int i = req_find(s, ep, erep.id, true);
                    if (i >= 0) env_reply(s, i, &erep);
                    else reply_refused(s, ep, "unmatched environment reply (id %llu answers no request sent to it)",
                                       (unsigned long long)erep.id);
                    proto_env_rep_free(&erep);
                } else {
                    reply_refused(s, ep, "malformed environment reply (%.150s)", err);
                }
            } else if (f && proto_reward_rep_decode(zframe_data(f), zframe_size(f), &rep, err) == 0) {
                int i = req_find(s, ep, rep.id, false);
                if (i < 0) {
                    reply_refused(s, ep, "unmatched reward reply (id %llu answers no request sent to it)",
                                  (unsigned long long)rep.id);
                } else {
                    vreq_t *r = &s->reqs[i];
                    proto_group_t *gr = &r->vb->b.groups[r->group];
                    if (rep.error || rep.n != gr->n_samples) {
                        char why[ERR_LEN];
                        if (rep.error) snprintf(why, sizeof why, "%.200s", rep.error);
                        else snprintf(why, sizeof why, "%u rewards for %u completions", rep.n, gr->n_samples);
                        req_fail(s, i, why);
                    } else {
                        for (uint32_t k = 0; k < gr->n_samples; k++) {
                            double x = rep.rewards[k];
                            gr->samples[k].reward = (float)(x < 0 ? 0 : x > 1 ? 1 : x);
                        }
                        r->vb->outstanding--;
                        req_done(s, i);
                    }
                }
                proto_reward_rep_free(&rep);
            } else {
                reply_refused(s, ep, "malformed reward reply (%.150s)", err);
            }
            zmsg_destroy(&m);
        }
    }
    double now = util_now();
    for (int i = 0; i < s->n_reqs;) {
        vreq_t *r = &s->reqs[i];
        if (now < r->deadline) {
            i++;
            continue;
        }
        const jobspec_t *sp = &r->vb->job->spec;
        if (r->sample >= 0) {
            char why[128];
            snprintf(why, sizeof why, "no reply within %d ms", sp->env_timeout_ms);
            req_fail(s, i, why);
            continue;
        }
        if (r->tries < sp->reward_retries) {
            r->tries++;
            r->deadline = now + sp->reward_timeout_ms / 1000.0;
            send_req(r);
            i++;
            continue;
        }
        char why[128];
        snprintf(why, sizeof why, "no reply within %d ms after %d tries", sp->reward_timeout_ms, r->tries + 1);
        req_fail(s, i, why);
    }
    // sockets no request has used for idle_s: their jobs have ended or gone quiet (the next
    // request connects again)
    for (int e = 0; e < s->n_ep;) {
        if (!s->ep[e]->refs && now - s->ep[e]->idle_since >= s->cfg.idle_s) ep_close(s, e);
        else e++;
    }
}

proto_batch_t *scorer_take(scorer_t *s, bool *job_failed, bool *cont, char *error) {
    for (int i = 0; i < s->n_batches; i++) {
        vbatch_t *vb = s->batches[i];
        if (vb->outstanding > 0) continue;
        proto_batch_t *b = xmalloc(sizeof *b);
        *b = vb->b;
        memset(&vb->b, 0, sizeof vb->b);
        if (vb->external_env) {
            // every reply is in: episodes with an observation go on, the rest are rewarded
            vb->cont = false;
            for (uint32_t g = 0; g < b->n_groups; g++)
                for (uint32_t k = 0; k < b->groups[g].n_samples; k++) vb->cont |= b->groups[g].samples[k].pending != 0;
        }
        *cont = vb->cont;
        *job_failed = vb->job_failed || !vb->job->ok;
        snprintf(error, ERR_LEN, "%s", vb->job_failed ? vb->error : vb->job->ok ? "" : vb->job->error);
        vbatch_free(vb);
        s->batches[i] = s->batches[--s->n_batches];
        return b;
    }
    return NULL;
}

int scorer_pending(const scorer_t *s) { return s->n_batches; }
double scorer_busy_seconds(const scorer_t *s) { return s->busy; }
int scorer_endpoints(const scorer_t *s) { return s->n_ep; }
uint64_t scorer_refused_replies(const scorer_t *s) { return s->refused; }

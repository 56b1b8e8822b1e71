// score.c - built-in and external reward scoring of rollout batches.
#include "services/verifier/score.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/rl/jobdata.h"
#include "common/rl/jobspec.h"
#include "common/rl/rl.h"
#include "common/tasks/env.h"
#include "common/util/log.h"
#include "common/rl/keys.h"

#define MAX_JOBS 256
#define MAX_ENDPOINTS 32

typedef struct {
    char id[PROTO_MAX_ID];
    jobspec_t spec;
    rl_source_t src;
    bool ok;
    char error[ERR_LEN];
    double last_used;
    bool private_copy;        // not in the cache: belongs to the one batch that uses it
} vjob_t;

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
    uint64_t id;
    vbatch_t *vb;
    uint32_t group;
    int sample;               // env_req: the episode's sample; -1 = a reward_req of the group
    int tries;
    double deadline;
    zsock_t *sock;
    proto_buf_t payload;
} vreq_t;

struct scorer {
    store_t *st;
    vjob_t *jobs[MAX_JOBS];
    char ep_name[MAX_ENDPOINTS][256];
    zsock_t *ep_sock[MAX_ENDPOINTS + 1];
    int n_ep;
    vbatch_t **batches;
    int n_batches, cap_batches;
    vreq_t *reqs;
    int n_reqs, cap_reqs;
    uint64_t next_id;
    double busy;
};

scorer_t *scorer_new(store_t *st, char *err) {
    if (!st) {
        err_set(err, "scorer needs a store");
        return NULL;
    }
    scorer_t *s = xcalloc(1, sizeof *s);
    s->st = st;
    s->next_id = 1;
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
    for (int i = 0; i < s->n_ep; i++) zsock_destroy(&s->ep_sock[i]);
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
    if (!j->ok) logj_error(id, "cannot score this job: %s", j->error);
    if (free_i >= 0) s->jobs[free_i] = j;
    else j->private_copy = true;
    return j;
}

static zsock_t *endpoint(scorer_t *s, const char *ep) {
    for (int i = 0; i < s->n_ep; i++)
        if (!strcmp(s->ep_name[i], ep)) return s->ep_sock[i];
    if (s->n_ep == MAX_ENDPOINTS) return NULL;
    char err[ERR_LEN];
    zsock_t *d = bus_connect(ZMQ_DEALER, ep, NULL, 1000, PROTO_MAX_FRAME, err);
    if (!d) {
        log_warn("reward service %s: %s", ep, err);
        return NULL;
    }
    snprintf(s->ep_name[s->n_ep], 256, "%s", ep);
    s->ep_sock[s->n_ep++] = d;
    s->ep_sock[s->n_ep] = NULL;
    return d;
}

static void send_req(vreq_t *r) {
    void *h = zsock_resolve(r->sock);
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
    zsock_t *sock = endpoint(s, j->spec.env_endpoint);
    for (uint32_t g = 0; g < vb->b.n_groups; g++) {
        proto_group_t *gr = &vb->b.groups[g];
        task_example_t ex = {0};
        rl_source_example(&j->src, split, gr->index, &ex);
        for (uint32_t i = 0; i < gr->n_samples; i++) {
            proto_sample_t *sm = &gr->samples[i];
            if (sm->rewarded) continue;
            sm->pending = 0;
            proto_env_req_t rq = {.id = s->next_id++, .job = vb->b.job, .prompt = ex.prompt ? ex.prompt : "",
                                  .transcript = sm->text ? sm->text : "", .turn = sm->turns ? sm->turns : 1};
            vreq_t *r = req_new(s);
            *r = (vreq_t){.id = rq.id, .vb = vb, .group = g, .sample = (int)i, .sock = sock,
                          .deadline = util_now() + j->spec.env_timeout_ms / 1000.0};
            if (sock && proto_env_req_encode(&rq, &r->payload) == 0) {
                send_req(r);
                s->n_reqs++;
                vb->outstanding++;
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
        logj_warn(vb->b.job, "environment %s: %s; the episode ends with reward 0", vb->job->spec.env_endpoint, rep->error);
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
    proto_buf_free(&s->reqs[i].payload);
    s->reqs[i] = s->reqs[--s->n_reqs];
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
    for (uint32_t g = 0; g < vb->b.n_groups; g++) {
        proto_group_t *gr = &vb->b.groups[g];
        if (!j->ok) {
            for (uint32_t i = 0; i < gr->n_samples; i++) gr->samples[i].reward = 0, gr->samples[i].failed = 1;
            continue;
        }
        task_example_t ex;
        int h = rl_source_example(&j->src, split, gr->index, &ex);
        if (j->spec.reward_endpoint[0]) {
            zsock_t *sock = endpoint(s, j->spec.reward_endpoint);
            proto_reward_req_t rq = {.id = s->next_id++, .job = vb->b.job, .prompt = ex.prompt, .n = gr->n_samples};
            char **texts = xcalloc(gr->n_samples ? gr->n_samples : 1, sizeof(char *));
            for (uint32_t i = 0; i < gr->n_samples; i++) texts[i] = gr->samples[i].text;
            rq.completions = texts;
            vreq_t *r = req_new(s);
            *r = (vreq_t){.id = rq.id, .vb = vb, .group = g, .sample = -1, .tries = 0, .sock = sock,
                          .deadline = util_now() + j->spec.reward_timeout_ms / 1000.0};
            if (sock && proto_reward_req_encode(&rq, &r->payload) == 0) {
                send_req(r);
                s->n_reqs++;
                vb->outstanding++;
            } else {
                proto_buf_free(&r->payload);
                for (uint32_t i = 0; i < gr->n_samples; i++) gr->samples[i].reward = 0, gr->samples[i].failed = 1;
            }
            free(texts);
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

static void req_done(scorer_t *s, int i) {
    proto_buf_free(&s->reqs[i].payload);
    s->reqs[i] = s->reqs[--s->n_reqs];
}

static void req_fail(scorer_t *s, int i, const char *why) {
    vreq_t *r = &s->reqs[i];
    vbatch_t *vb = r->vb;
    if (r->sample >= 0) {
        logj_warn(vb->b.job, "environment %s: %s; the episode ends with reward 0", vb->job->spec.env_endpoint, why);
        episode_fail(&vb->b.groups[r->group].samples[r->sample]);
        vb->outstanding--;
        req_done(s, i);
        return;
    }
    proto_group_t *gr = &vb->b.groups[r->group];
    for (uint32_t k = 0; k < gr->n_samples; k++) gr->samples[k].reward = 0, gr->samples[k].failed = 1;
    logj_warn(vb->b.job, "reward service %s: %s; rewards of this group set to 0", vb->job->spec.reward_endpoint, why);
    if (vb->job->spec.reward_on_failure == REWARD_FAIL_JOB) {
        vb->job_failed = true;
        snprintf(vb->error, sizeof vb->error, "reward service %.100s failed: %.120s", vb->job->spec.reward_endpoint, why);
    }
    vb->outstanding--;
    req_done(s, i);
}

void scorer_poll(scorer_t *s) {
    char err[ERR_LEN];
    for (int e = 0; e < s->n_ep; e++) {
        for (;;) {
            zmsg_t *m = zmsg_recv_nowait(s->ep_sock[e]);
            if (!m) break;
            zframe_t *f = zmsg_last(m);
            proto_reward_rep_t rep;
            proto_env_rep_t erep;
            char type[32];
            if (f && proto_peek_type(zframe_data(f), zframe_size(f), type, err) == 0 && !strcmp(type, "env_rep")) {
                if (proto_env_rep_decode(zframe_data(f), zframe_size(f), &erep, err) == 0) {
                    for (int i = 0; i < s->n_reqs; i++)
                        if (s->reqs[i].id == erep.id && s->reqs[i].sample >= 0) {
                            env_reply(s, i, &erep);
                            break;
                        }
                    proto_env_rep_free(&erep);
                } else {
                    log_warn("environment %s sent a malformed reply (%s)", s->ep_name[e], err);
                }
            } else if (f && proto_reward_rep_decode(zframe_data(f), zframe_size(f), &rep, err) == 0) {
                for (int i = 0; i < s->n_reqs; i++) {
                    if (s->reqs[i].id != rep.id || s->reqs[i].sample >= 0) continue;
                    vreq_t *r = &s->reqs[i];
                    proto_group_t *gr = &r->vb->b.groups[r->group];
                    if (rep.error || rep.n != gr->n_samples) {
                        char why[ERR_LEN];
                        snprintf(why, sizeof why, "%s", rep.error ? rep.error : "wrong number of rewards");
                        req_fail(s, i, why);
                    } else {
                        for (uint32_t k = 0; k < gr->n_samples; k++) {
                            double x = rep.rewards[k];
                            gr->samples[k].reward = (float)(x < 0 ? 0 : x > 1 ? 1 : x);
                        }
                        r->vb->outstanding--;
                        req_done(s, i);
                    }
                    break;
                }
                proto_reward_rep_free(&rep);
            } else {
                log_warn("reward service %s sent a malformed reply (%s)", s->ep_name[e], err);
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

// serve.c - the verifier service's handlers (serve.h); the scoring lives in score.c.
#include "services/verifier/serve.h"

#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/net/bus.h"
#include "common/rl/keys.h"
#include "common/util/log.h"
#include "services/verifier/score.h"

struct verifier {
    svc_t *s;
    store_t *st;              // for the kept samples (job:{id}:samples)
    scorer_t *sc;
    endpoint_rules_t *rules;  // where tenants' services may be (svc_endpoint_rules)
    zsock_t *in, *train, *rep;
    uint64_t scored;
    int m_batches, m_samples, m_cont, m_job_samples, m_job_correct, m_job_reward, m_job_errors, m_refused, m_sockets;
};

// A reply of a tenant's service that the scorer did not apply: the reject path (counted in the
// rejected and errors families, logged one line per reason and 5 s).
static void on_refused_reply(void *ctx, const char *msg) {
    verifier_t *v = ctx;
    metrics_add(v->s->met, v->m_refused, NULL, 1);
    svc_reject(v->s, NULL, "%s", msg);
}

verifier_t *verifier_open(svc_t *s, store_t *st, char *err) {
    verifier_t *v = xcalloc(1, sizeof *v);
    v->s = s;
    v->st = st;
    metrics_t *met = s->met;
    v->m_batches = metrics_def(met, "marlaas_verifier_batches_total", MET_COUNTER, "Batches fully scored.");
    v->m_samples = metrics_def(met, "marlaas_verifier_samples_total", MET_COUNTER, "Samples scored.");
    v->m_cont = metrics_def(met, "marlaas_verifier_continuations_total", MET_COUNTER,
                            "Batches sent back for another turn of their episodes.");
    v->m_job_samples = metrics_def_job(met, "marlaas_verifier_job_samples_total", MET_COUNTER, "Samples scored, per job.");
    v->m_job_correct = metrics_def_job(met, "marlaas_verifier_job_correct_total", MET_COUNTER,
                                       "Samples with reward >= 0.5, per job.");
    v->m_job_reward = metrics_def_job(met, "marlaas_verifier_job_reward_sum_total", MET_COUNTER,
                                      "Sum of rewards, per job (mean reward = rate of this / rate of samples).");
    v->m_job_errors = metrics_def_job(met, "marlaas_verifier_job_errors_total", MET_COUNTER,
                                      "Samples whose scoring failed (reward service error or timeout), per job.");
    v->m_refused = metrics_def(met, "marlaas_verifier_replies_refused_total", MET_COUNTER,
                               "Replies of reward/environment services not applied: answering no request sent on "
                               "their socket (late or made up), or malformed.");
    v->m_sockets = metrics_def(met, "marlaas_verifier_service_sockets", MET_GAUGE,
                               "Sockets open to tenants' reward/environment services.");
    char ep[256], rules[1024];
    v->rules = svc_endpoint_rules(s, err);
    int per_tenant = atoi(svc_extra(s, "max_tenant_endpoints", "8"));
    if (v->rules && (per_tenant < 1 || per_tenant > SCORER_MAX_ENDPOINTS)) {
        err_set(err, "max_tenant_endpoints must be 1..%d, got '%s'", SCORER_MAX_ENDPOINTS,
                svc_extra(s, "max_tenant_endpoints", "8"));
        verifier_close(&v);
        return NULL;
    }
    if (v->rules) {
        endpoint_rules_describe(v->rules, rules, sizeof rules);
        log_info("reward/environment endpoints: %s; %d sockets per tenant", rules, per_tenant);
        scorer_cfg_t cfg = {.rules = v->rules, .per_tenant = per_tenant, .reject = on_refused_reply, .ctx = v};
        v->sc = scorer_new(st, &cfg, err);
    }
    svc_bind_endpoint(s, SVC_VERIFIERS, ep, sizeof ep);
    if (v->sc) v->in = bus_bind(ZMQ_PULL, ep, BUS_DEFAULT_HWM, PROTO_MAX_FRAME, err);
    if (v->in) v->train = bus_connect(ZMQ_PUSH, svc_get(s, SVC_TRAINER), "trainer", BUS_DEFAULT_HWM, 0, err);
    if (v->train) v->rep = bus_connect(ZMQ_PUSH, svc_get(s, SVC_REPORTS), "scheduler", BUS_DEFAULT_HWM, 0, err);
    if (!v->rep) {
        verifier_close(&v);
        return NULL;
    }
    log_info("ready: listening on %s, id %s", ep, s->id);
    return v;
}

// A "done" batch from a rollout: scoring starts.
static int on_batch(void *ctx, zframe_t *f, char *err) {
    verifier_t *v = ctx;
    proto_batch_t b;
    if (proto_batch_decode("done", zframe_data(f), zframe_size(f), &b, err)) return -1;
    scorer_add(v->sc, &b);
    return 0;
}

static zsock_t **reward_sockets(void *ctx, int *n) { return scorer_sockets(((verifier_t *)ctx)->sc, n); }

// Episodes awaiting their next turn go back to the rollouts through the scheduler, which holds
// the task's lease.
static void send_continuation(verifier_t *v, const proto_batch_t *b) {
    proto_buf_t buf = {0};
    if (proto_batch_encode("cont", b, &buf) == 0 && bus_send(v->rep, &buf)) {
        logj_warn(b->job, "task %llu: scheduler unreachable or queue full; episodes dropped (re-issued when the lease "
                  "ends)", (unsigned long long)b->task_id);
        metrics_add(v->s->met, v->s->m_errors, NULL, 1);
    } else {
        metrics_add(v->s->met, v->m_cont, NULL, 1);
    }
    proto_buf_free(&buf);
}

// text cut at JOB_SAMPLE_MAX_BYTES on a character boundary (caller frees)
static char *cut_text(const char *t) {
    size_t n = strlen(t);
    if (n > JOB_SAMPLE_MAX_BYTES) {
        n = JOB_SAMPLE_MAX_BYTES;
        while (n > 0 && ((unsigned char)t[n] & 0xC0) == 0x80) n--;
    }
    char *cut = xmalloc(n + 1);
    memcpy(cut, t, n);
    cut[n] = 0;
    return cut;
}

// One sample of a scored training batch (the first group's best) kept in job:{id}:samples, the
// latest JOB_SAMPLES_KEPT, its prompt and completion each cut at JOB_SAMPLE_MAX_BYTES on a
// character boundary: what the web console shows as the job's recent completions. A failed write
// costs only that sample.
static void keep_sample(verifier_t *v, const proto_batch_t *b) {
    if (!v->st || b->kind != PROTO_KIND_TRAIN || !b->n_groups || !b->groups[0].n_samples) return;
    const proto_group_t *g = &b->groups[0];
    const proto_sample_t *best = &g->samples[0];
    for (uint32_t k = 1; k < g->n_samples; k++)
        if (g->samples[k].reward > best->reward) best = &g->samples[k];
    char *cut = cut_text(best->text ? best->text : "");
    char *prompt = scorer_prompt(v->sc, b->job, b->kind, g->index);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", b->adapter_version);
    cJSON_AddNumberToObject(o, "reward", best->reward);
    cJSON_AddNumberToObject(o, "group_size", g->n_samples);
    if (prompt) {
        char *pc = cut_text(prompt);
        cJSON_AddStringToObject(o, "prompt", pc);
        free(pc);
        free(prompt);
    }
    cJSON_AddStringToObject(o, "completion", cut);
    cJSON_AddNumberToObject(o, "time", (double)time(NULL));
    free(cut);
    char *js = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char key[KEY_LEN], err[ERR_LEN];
    if (js && key_job_samples(v->st, key, sizeof key, b->job)) {
        const void *item[1] = {js};
        size_t len[1] = {strlen(js)};
        // trimmed first: a reader between the two commands never sees more than JOB_SAMPLES_KEPT
        if (store_ltrim(v->st, key, -(JOB_SAMPLES_KEPT - 1), -1, err) || store_rpush(v->st, key, 1, item, len, NULL, err))
            logj_warn(b->job, "sample not kept: %s", err);
    }
    cJSON_free(js);
}

// A scored batch: training groups to the trainer, the task's results to the scheduler.
static void send_scored(verifier_t *v, const proto_batch_t *b) {
    metrics_t *met = v->s->met;
    proto_report_t r = {.kind = PROTO_REP_EPISODES, .job = b->job, .source = v->s->id, .task_id = b->task_id,
                        .task_kind = b->kind, .adapter_version = b->adapter_version};
    for (uint32_t g = 0; g < b->n_groups; g++)
        for (uint32_t k = 0; k < b->groups[g].n_samples; k++) {
            const proto_sample_t *ps = &b->groups[g].samples[k];
            r.n++;
            r.reward_sum += ps->reward;
            r.correct += ps->reward >= 0.5f;
            r.errors += ps->failed;
        }
    proto_buf_t buf = {0};
    if (b->kind == PROTO_KIND_TRAIN && proto_batch_encode("scored", b, &buf) == 0 && bus_send(v->train, &buf)) {
        logj_warn(b->job, "task %llu: trainer unreachable or queue full; dropped (re-issued by the scheduler)",
                  (unsigned long long)b->task_id);
        metrics_add(met, v->s->m_errors, NULL, 1);
    }
    metrics_add(met, v->m_batches, NULL, 1);
    metrics_add(met, v->m_samples, NULL, r.n);
    metrics_add(met, v->m_job_samples, b->job, r.n);
    metrics_add(met, v->m_job_correct, b->job, r.correct);
    metrics_add(met, v->m_job_reward, b->job, r.reward_sum);
    if (r.errors) metrics_add(met, v->m_job_errors, b->job, r.errors);
    proto_buf_free(&buf);
    if (!proto_report_encode(&r, &buf)) bus_send(v->rep, &buf);
    proto_buf_free(&buf);
    keep_sample(v, b);
    v->scored++;
}

static void send_job_failed(verifier_t *v, const proto_batch_t *b, const char *why) {
    proto_buf_t buf = {0};
    proto_report_t f = {.kind = PROTO_REP_JOB_FAILED, .job = b->job, .source = v->s->id, .task_id = b->task_id,
                        .error = (char *)why};
    if (!proto_report_encode(&f, &buf)) bus_send(v->rep, &buf);
    proto_buf_free(&buf);
    metrics_add(v->s->met, v->s->m_errors, NULL, 1);
}

// Reward-service replies, retries and timeouts, then every batch that is done. While requests are
// out the loop turns at least every 10 ms to serve their timeouts.
static int work(void *ctx) {
    verifier_t *v = ctx;
    scorer_poll(v->sc);
    proto_batch_t *b;
    bool job_failed, cont;
    char why[ERR_LEN];
    while ((b = scorer_take(v->sc, &job_failed, &cont, why))) {
        if (job_failed) send_job_failed(v, b, why);
        else if (cont) send_continuation(v, b);
        else send_scored(v, b);
        proto_batch_destroy(&b);
    }
    return scorer_pending(v->sc) ? 10 : -1;
}

static void beat(void *ctx, svc_beat_t *b) {
    verifier_t *v = ctx;
    b->busy_s = scorer_busy_seconds(v->sc);
    b->queue = scorer_pending(v->sc);
    svc_beat_add(b, "batches", "%llu", (unsigned long long)v->scored);
    svc_beat_add(b, "pending", "%d", scorer_pending(v->sc));
    svc_beat_add(b, "service_sockets", "%d", scorer_endpoints(v->sc));
    metrics_set(v->s->met, v->m_sockets, NULL, scorer_endpoints(v->sc));
}

void verifier_register(void *module, svc_loop_t *l) {
    verifier_t *v = module;
    svc_loop_frames(l, v->in, "rollout batch", 256, on_batch, NULL, v);
    svc_loop_sockets(l, reward_sockets, v);
    svc_loop_work(l, work, v);
    svc_loop_heartbeat(l, beat, v);
}

void verifier_close(verifier_t **pv) {
    if (!pv || !*pv) return;
    verifier_t *v = *pv;
    if (v->rep)
        log_info("stopping: %llu batches received, %llu scored, %llu rejected", (unsigned long long)v->s->received,
                 (unsigned long long)v->scored, (unsigned long long)v->s->rejected);
    zsock_destroy(&v->rep);
    zsock_destroy(&v->train);
    zsock_destroy(&v->in);
    scorer_destroy(&v->sc);
    endpoint_rules_destroy(&v->rules);
    free(v);
    *pv = NULL;
}

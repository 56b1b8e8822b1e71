// serve.c - the trainer service's handlers (serve.h); the jobs and their steps live in jobs.c.
#include "services/trainer/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/util/log.h"
#include "services/trainer/jobs.h"

#define MAX_RESULTS 64   // jobs reported per step (the others are trained in the next)

struct trainer {
    svc_t *s;
    sim_t *sim;              // --backend sim:DEVICE, else NULL
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
    dp_t *dp;
    tjobs_t *jobs;
    zsock_t *in, *pub, *rep;
    svc_loop_t *loop;
    uint64_t steps;
    met_window_t step_win;
    int m_steps, m_sps, m_jobs, m_groups, m_dropped, m_job_step, m_job_version, m_job_groups, m_job_failed, m_job_invalid;
    bool tagged;             // a secured cluster: batches must carry their task's tag
    uint8_t tag_key[32];     // shared with the scheduler (bus_link_key)
};

// --model on k in the precision of --weights, and what was loaded logged. NULL + err.
static model_t *load_model(const svc_t *s, const kernels_t *k, bool bf16, char *err) {
    char e2[ERR_LEN];
    model_t *m = model_load_as(svc_get(s, SVC_MODEL), k, bf16, e2);
    if (!m) {
        err_set(err, "%s (set --model or MARLAAS_MODEL%s)", e2, bf16 ? ", or --weights fp32" : "");
        return NULL;
    }
    log_info("base model %s: %zu parameters, %s matrices (--weights %s), %.1f MiB of weights on %s",
             svc_get(s, SVC_MODEL), m->n_params, m->bf16 ? "bf16" : "fp32", svc_get(s, SVC_WEIGHTS),
             (m->n_f32 * 4.0 + m->n_bf16 * 2.0) / (1 << 20), k->name);
    return m;
}

int trainer_settings(const svc_t *s, dp_cfg_t *dc) {
    const char *shared_prefix = svc_extra(s, "shared_prefix", "1");
    if (strcmp(shared_prefix, "0") != 0 && strcmp(shared_prefix, "1") != 0) {
        log_error("--set shared_prefix must be 0 or 1, got '%s'", shared_prefix);
        return -1;
    }
    const char *w = svc_extra(s, "dp_world", "1"), *r = svc_extra(s, "dp_rank", "0"),
               *t = svc_extra(s, "dp_timeout", "120");
    char *end;
    long lw = strtol(w, &end, 10);
    if (*end || lw < 1 || lw > 1024) {
        log_error("--set dp_world must be 1..1024, got '%s'", w);
        return -1;
    }
    long lr = strtol(r, &end, 10);
    if (*end || lr < 0 || lr >= lw) {
        log_error("--set dp_rank must be 0..%ld (dp_world - 1), got '%s'", lw - 1, r);
        return -1;
    }
    double to = strtod(t, &end);
    if (*end || !(to >= 1)) {
        log_error("--set dp_timeout must be a number of seconds >= 1, got '%s'", t);
        return -1;
    }
    dc->world = (int)lw, dc->rank = (int)lr, dc->timeout_s = to;
    dc->endpoint = svc_extra(s, "dp_endpoint", "");
    const char *sum = svc_extra(s, "dp_sum", "nccl");
    if (strcmp(sum, "nccl") != 0 && strcmp(sum, "host") != 0) {
        log_error("--set dp_sum must be nccl or host, got '%s'", sum);
        return -1;
    }
    dc->host_sum = sum[0] == 'h';
    if (lw > 1 && strncmp(dc->endpoint, "tcp://", 6) != 0) {
        log_error("--set dp_endpoint=tcp://HOST:PORT (rank 0's address) is required with dp_world %ld", lw);
        return -1;
    }
    return 0;
}

// Ranks 1..: an HTTP endpoint for probes only when --http names one.
int trainer_run_rank(svc_t *s, const kernels_t *k, bool bf16, const dp_cfg_t *dc) {
    char err[ERR_LEN];
    svc_http_default(s, "0");
    if (svc_serve(s, err)) {
        log_error("%s", err);
        return 2;
    }
    // the same base model as rank 0, in the same precision (--weights)
    model_t *m = load_model(s, k, bf16, err);
    if (!m) {
        log_error("cannot load the base model: %s", err);
        svc_close(s);
        return 1;
    }
    int max_jobs = atoi(svc_extra(s, "max_jobs", "64"));
    lora_pool_t *pool = lora_pool_new(max_jobs > 0 ? max_jobs : 64);
    engine_t *e = engine_new(m, pool, err);
    dp_t *dp = e ? dp_open(dc, e, err) : NULL;
    int rc = 0;
    if (!dp) {
        log_error("data parallelism: rank %d could not join the group at %s: %s", dc->rank, dc->endpoint, err);
        rc = 1;
    } else {
        log_info("ready: data-parallel rank %d of %d (rank 0 at %s)", dc->rank, dc->world, dc->endpoint);
        svc_ready(s, true, NULL);
        if (dp_serve(dp, svc_stopping, err)) {
            log_error("data parallelism: rank %d: %s; restart the trainer group (every rank)", dc->rank, err);
            rc = 1;
        }
        long passes, seqs;
        dp_counts(dp, &passes, &seqs);
        log_info("stopping: rank %d trained its share of %ld passes (%ld sequences)", dc->rank, passes, seqs);
    }
    dp_close(&dp);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
    svc_close(s);
    return rc;
}

static void def_metrics(trainer_t *t) {
    metrics_t *met = t->s->met;
    t->m_steps = metrics_def(met, "marlaas_trainer_steps_total", MET_COUNTER, "Optimiser steps applied (all jobs).");
    t->m_sps = metrics_def(met, "marlaas_trainer_steps_per_second", MET_GAUGE,
                           "Optimiser steps per second over the last 10 seconds (all jobs).");
    t->m_jobs = metrics_def(met, "marlaas_trainer_jobs", MET_GAUGE, "Jobs held (adapter slots in use).");
    t->m_groups = metrics_def(met, "marlaas_trainer_groups_consumed_total", MET_COUNTER, "Scored groups trained on.");
    t->m_dropped = metrics_def(met, "marlaas_trainer_groups_dropped_total", MET_COUNTER,
                               "Scored groups dropped as too stale.");
    t->m_job_step = metrics_def_job(met, "marlaas_trainer_job_step", MET_GAUGE, "The job's last step, per job.");
    t->m_job_version = metrics_def_job(met, "marlaas_trainer_job_adapter_version", MET_GAUGE,
                                       "The job's last published adapter version, per job.");
    t->m_job_groups = metrics_def_job(met, "marlaas_trainer_job_groups_total", MET_COUNTER, "Groups trained on, per job.");
    t->m_job_failed = metrics_def_job(met, "marlaas_trainer_job_failures_total", MET_COUNTER,
                                      "Steps that failed the job, per job.");
    t->m_job_invalid = metrics_def_job(met, "marlaas_trainer_job_invalid_batches_total", MET_COUNTER,
                                       "Scored batches refused for invalid data (tokens outside the vocabulary, "
                                       "non-finite log-probs or rewards, wrong sizes), per job.");
}

trainer_t *trainer_open(svc_t *s, store_t *st, const kernels_t *k, bool bf16, const dp_cfg_t *dc, char *err) {
    trainer_t *t = xcalloc(1, sizeof *t);
    t->s = s;
    def_metrics(t);
    if (k == kernels_sim()) {
        if (dc->world > 1) {
            err_set(err, "a simulated trainer models its data-parallel devices (--set sim_devices=N), not --set dp_world");
            trainer_close(&t);
            return NULL;
        }
        t->sim = svc_sim_open(s, err);
        if (!t->sim) {
            trainer_close(&t);
            return NULL;
        }
        (void)bf16;
        char e2[ERR_LEN];
        t->m = model_shell(svc_get(s, SVC_MODEL), k, sim_device(t->sim)->weight_bytes == 2, e2);
        if (!t->m) err_set(err, "%s", e2);
    } else {
        t->m = load_model(s, k, bf16, err);
    }
    if (!t->m) {
        char e2[ERR_LEN];
        snprintf(e2, sizeof e2, "%s", err);
        err_set(err, "cannot load the base model: %s", e2);
        trainer_close(&t);
        return NULL;
    }
    int max_jobs = atoi(svc_extra(s, "max_jobs", "64"));
    if (max_jobs <= 0) max_jobs = 64;
    int pass_rows = atoi(svc_extra(s, "pass_rows", "2048"));
    const char *ls = svc_extra(s, "lanes", "1");
    char *lend;
    long lanes = strtol(ls, &lend, 10);
    if (!*ls || *lend || lanes < 1 || lanes > RL_MAX_LANES) {
        err_set(err, "--set lanes=%.40s: an integer in 1..%d (training passes computed at once)", ls, RL_MAX_LANES);
        trainer_close(&t);
        return NULL;
    }
    if (t->sim && sim_trainer_fit(t->sim, pass_rows, &max_jobs, err)) {
        trainer_close(&t);
        return NULL;
    }
    t->pool = lora_pool_new(max_jobs);
    t->e = engine_new(t->m, t->pool, err);
    if (t->e && t->sim) engine_set_sim(t->e, t->sim);
    if (t->e && dc->world > 1) {
        log_info("data parallelism: rank 0 waits for %d ranks at %s", dc->world - 1, dc->endpoint);
        char e2[ERR_LEN];
        t->dp = dp_open(dc, t->e, e2);
        if (!t->dp)
            err_set(err, "data parallelism: rank 0 could not form the group of %d at %s: %s", dc->world, dc->endpoint, e2);
    }
    tjobs_cfg_t cfg = {.dp = t->dp, .max_jobs = lora_pool_slots(t->pool), .lanes = lanes,
                       .keep_versions = atoi(svc_extra(s, "keep_versions", "4")),
                       .optim_every = atoi(svc_extra(s, "optim_every", "1")),
                       .shared_prefix = svc_extra(s, "shared_prefix", "1")[0] == '1',
                       .pass_rows = pass_rows};
    if (t->e && (t->dp || dc->world == 1)) t->jobs = tjobs_new(t->e, st, &cfg, err);
    char ep[256];
    svc_bind_endpoint(s, SVC_TRAINER, ep, sizeof ep);
    if (t->jobs && bus_is_secure()) {
        char e2[ERR_LEN];
        if (bus_link_key("scheduler", PROTO_TAG_PURPOSE, t->tag_key, e2)) {
            err_set(err, "cannot derive the task tag key: %s", e2);
            trainer_close(&t);
            return NULL;
        }
        t->tagged = true;
    }
    if (t->jobs) t->in = bus_bind(ZMQ_PULL, ep, BUS_DEFAULT_HWM, PROTO_MAX_FRAME, err);
    svc_bind_endpoint(s, SVC_TRAINER_EVENTS, ep, sizeof ep);
    if (t->in) t->pub = bus_bind(ZMQ_PUB, ep, BUS_DEFAULT_HWM, 0, err);
    if (t->pub) t->rep = bus_connect(ZMQ_PUSH, svc_get(s, SVC_REPORTS), "scheduler", BUS_DEFAULT_HWM, 0, err);
    if (!t->rep) {
        trainer_close(&t);
        return NULL;
    }
    log_info("ready: %zu-parameter base model, up to %d jobs, shared prompt prefixes %s, data-parallel ranks %d, "
             "passes at once (lanes) %d, id %s", t->m->n_params, cfg.max_jobs, cfg.shared_prefix ? "on" : "off",
             dc->world, cfg.lanes, s->id);
    return t;
}

// A scored batch from a verifier. One the jobs cannot use (an unknown or finished job's, a
// version from the future, ...) is refused with its job named: the scheduler's lease on those
// groups runs out and it issues them again. On a secured cluster a batch must carry the tag the
// scheduler gave its task (proto_task_tag): a holder of a rollout's or a verifier's key cannot
// make up a task, a version or a job. One with invalid data (tjobs_add: only a broken or hostile
// producer sends it) is also counted per job; it never reaches a pass, so it fails no other job,
// and its own job only when its batches keep being invalid.
static int on_batch(void *ctx, zframe_t *f, char *err) {
    trainer_t *t = ctx;
    proto_batch_t b;
    if (proto_batch_decode("scored", zframe_data(f), zframe_size(f), &b, err)) return -1;
    char why[ERR_LEN];
    if (t->tagged && !proto_batch_tag_ok(t->tag_key, &b)) {
        svc_reject(t->s, b.job, "batch not used: task %llu %s the scheduler's tag for this job, version and kind",
                   (unsigned long long)b.task_id, b.has_tag ? "does not carry" : "carries no tag, not");
        proto_batch_free(&b);
        return 0;
    }
    int rc = tjobs_add(t->jobs, &b, why);
    if (rc < 0) {
        if (rc == TJOBS_INVALID) metrics_add(t->s->met, t->m_job_invalid, b.job, 1);
        svc_reject(t->s, b.job, "batch not used: %s", why);
        proto_batch_free(&b);
    }
    return 0;
}

// A job's step to the scheduler (its report) and to the rollouts (the new adapter version).
static void announce(trainer_t *t, const tjobs_result_t *res) {
    metrics_t *met = t->s->met;
    proto_buf_t buf = {0};
    proto_report_t r = {.kind = res->failed ? PROTO_REP_JOB_FAILED : PROTO_REP_STEP, .job = (char *)res->job,
                        .source = t->s->id, .step = res->step, .adapter_version = res->version, .n = res->consumed,
                        .errors = res->dropped, .error = res->failed ? (char *)res->error : NULL};
    if (!proto_report_encode(&r, &buf) && bus_send(t->rep, &buf)) log_warn("report to the scheduler not sent (queue full)");
    proto_buf_free(&buf);
    metrics_add(met, t->m_dropped, NULL, res->dropped);
    if (res->drop_only) return;
    if (res->failed) {
        metrics_add(met, t->m_job_failed, res->job, 1);
        metrics_add(met, t->s->m_errors, NULL, 1);
        return;
    }
    metrics_add(met, t->m_steps, NULL, 1);
    metrics_add(met, t->m_groups, NULL, res->consumed);
    metrics_set(met, t->m_job_step, res->job, res->step);
    metrics_set(met, t->m_job_version, res->job, res->version);
    metrics_add(met, t->m_job_groups, res->job, res->consumed);
    proto_adapter_event_t ev = {.job = (char *)res->job, .version = res->version, .step = res->step};
    if (!proto_adapter_event_encode(&ev, &buf)) zsock_send(t->pub, "sb", "adapter", buf.data, buf.len);
    proto_buf_free(&buf);
    t->steps++;
}

// Every job with a full batch trained (after the turn drained what was queued, so a step sees
// every ready job). A broken data-parallel group ends the service: its supervisor restarts the
// group.
static int work(void *ctx) {
    trainer_t *t = ctx;
    tjobs_result_t res[MAX_RESULTS];
    int n = tjobs_step(t->jobs, res, MAX_RESULTS);
    char err[ERR_LEN];
    if (!n && t->dp && !tjobs_broken(t->jobs) && dp_idle_s(t->dp) > 1.0 && dp_ping(t->dp, err)) {
        log_error("data parallelism: %s; restart the trainer group (every rank)", err);
        svc_loop_stop(t->loop, 1);
        return -1;
    }
    for (int i = 0; i < n; i++) announce(t, &res[i]);
    if (tjobs_broken(t->jobs)) {
        log_error("data parallelism: %s; restart the trainer group (every rank)", tjobs_broken(t->jobs));
        svc_loop_stop(t->loop, 1);
    }
    return -1;
}

static void beat(void *ctx, svc_beat_t *b) {
    trainer_t *t = ctx;
    b->busy_s = tjobs_busy_seconds(t->jobs);
    b->queue = tjobs_buffered(t->jobs);
    svc_beat_add(b, "steps", "%llu", (unsigned long long)t->steps);
    svc_beat_add(b, "jobs", "%d", tjobs_count(t->jobs));
    // the scheduler admits no more async jobs than the trainers hold (sched_set_trainer_slots)
    svc_beat_add(b, "max_jobs", "%d", tjobs_capacity(t->jobs));
    metrics_set(t->s->met, t->m_jobs, NULL, tjobs_count(t->jobs));
    metrics_set(t->s->met, t->m_sps, NULL, met_window_rate(&t->step_win, b->up_s, (double)t->steps, 10.0));
}

void trainer_register(void *module, svc_loop_t *l) {
    trainer_t *t = module;
    t->loop = l;
    svc_loop_frames(l, t->in, "scored batch", 256, on_batch, NULL, t);
    svc_loop_work(l, work, t);
    svc_loop_heartbeat(l, beat, t);
}

void trainer_close(trainer_t **pt) {
    if (!pt || !*pt) return;
    trainer_t *t = *pt;
    if (t->rep)
        log_info("stopping: %llu messages received, %llu rejected, %llu steps", (unsigned long long)t->s->received,
                 (unsigned long long)t->s->rejected, (unsigned long long)t->steps);
    zsock_destroy(&t->rep);
    zsock_destroy(&t->pub);
    zsock_destroy(&t->in);
    tjobs_destroy(&t->jobs);
    dp_close(&t->dp);
    engine_destroy(&t->e);
    lora_pool_destroy(&t->pool);
    model_destroy(&t->m);
    sim_close(&t->sim);
    free(t);
    *pt = NULL;
}

// main.c - marlaas-trainer: receives scored groups from the verifiers, trains each job's LoRA
// adapter when its batch is ready (several jobs in one pass), publishes adapter versions to
// Redis and announces them. Wiring only; the logic lives in jobs.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/net/svc.h"
#include "common/util/log.h"
#include "services/trainer/jobs.h"

static const char *HELP =
    "Trains the jobs' LoRA adapters. Binds --trainer (PULL, scored groups from verifiers) and\n"
    "--trainer-events (PUB, adapter versions); connects --reports (the scheduler).\n"
    "extras: --set max_jobs=64 --set keep_versions=4 --set optim_every=1\n"
    "        --set shared_prefix=1 (a group's prompt is computed once for its samples; 0 = per sample)\n"
    "        --set pass_rows=2048 (rows of one mixed-adapter training pass; whole jobs, at least one)\n"
    "Data parallelism (one process per GPU): --set dp_world=N --set dp_rank=R --set dp_endpoint=tcp://HOST:PORT\n"
    "        (rank 0's address; rank 0 is the trainer service, ranks 1..N-1 only compute)\n"
    "        --set dp_timeout=120 (seconds: a dead or hung rank stops the group after this long)\n"
    "        --set dp_sum=nccl (GPU gradients summed with NCCL; host: over the group's sockets, for\n"
    "        ranks sharing a GPU)";

// Ranks 1..: hold replicas of the adapters, train their shares of rank 0's passes; no Redis and
// none of the service's sockets (an HTTP endpoint for probes only when --http names one).
static int run_worker(svc_t *s, const kernels_t *k, const dp_cfg_t *dc) {
    char err[ERR_LEN];
    svc_http_default(s, "0");
    if (svc_serve(s, err)) {
        log_error("%s", err);
        return 2;
    }
    // the same base model as rank 0, in the same precision (--weights)
    model_t *m = svc_load_model(s, k, err);
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

// The data-parallel settings; -1 (logged) when invalid.
static int dp_settings(const svc_t *s, dp_cfg_t *dc) {
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

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "trainer", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    char err[ERR_LEN], ep[256];
    const char *shared_prefix = svc_extra(&s, "shared_prefix", "1");
    if (strcmp(shared_prefix, "0") != 0 && strcmp(shared_prefix, "1") != 0) {
        log_error("--set shared_prefix must be 0 or 1, got '%s'", shared_prefix);
        return 2;
    }
    // settings first: a wrong backend fails before anything is started
    const kernels_t *k = svc_kernels(&s, err);
    if (!k || svc_weights_bf16(&s, k, err) < 0) {
        log_error("%s", err);
        return 2;
    }
    dp_cfg_t dc;
    if (dp_settings(&s, &dc)) return 2;
    if (dc.rank > 0) return run_worker(&s, k, &dc);
    store_t *st = svc_open(&s);
    if (!st) return 1;
    metrics_t *met = s.met;
    const int m_steps = metrics_def(met, "marlaas_trainer_steps_total", MET_COUNTER, "Optimiser steps applied (all jobs)."),
              m_sps = metrics_def(met, "marlaas_trainer_steps_per_second", MET_GAUGE,
                                  "Optimiser steps per second over the last 10 seconds (all jobs)."),
              m_jobs = metrics_def(met, "marlaas_trainer_jobs", MET_GAUGE, "Jobs held (adapter slots in use)."),
              m_groups = metrics_def(met, "marlaas_trainer_groups_consumed_total", MET_COUNTER, "Scored groups trained on."),
              m_dropped = metrics_def(met, "marlaas_trainer_groups_dropped_total", MET_COUNTER,
                                      "Scored groups dropped as too stale."),
              m_job_step = metrics_def_job(met, "marlaas_trainer_job_step", MET_GAUGE, "The job's last step, per job."),
              m_job_version = metrics_def_job(met, "marlaas_trainer_job_adapter_version", MET_GAUGE,
                                          "The job's last published adapter version, per job."),
              m_job_groups = metrics_def_job(met, "marlaas_trainer_job_groups_total", MET_COUNTER, "Groups trained on, per job."),
              m_job_failed = metrics_def_job(met, "marlaas_trainer_job_failures_total", MET_COUNTER,
                                         "Steps that failed the job, per job.");
    met_window_t step_win = {0};
    model_t *m = svc_load_model(&s, k, err);
    if (!m) {
        log_error("cannot load the base model: %s", err);
        store_destroy(&st);
        svc_close(&s);
        return 1;
    }
    int max_jobs = atoi(svc_extra(&s, "max_jobs", "64"));
    lora_pool_t *pool = lora_pool_new(max_jobs > 0 ? max_jobs : 64);
    engine_t *e = engine_new(m, pool, err);
    dp_t *dp = NULL;
    if (e && dc.world > 1) {
        log_info("data parallelism: rank 0 waits for %d ranks at %s", dc.world - 1, dc.endpoint);
        char e2[ERR_LEN];
        dp = dp_open(&dc, e, e2);
        if (!dp) err_set(err, "data parallelism: rank 0 could not form the group of %d at %s: %s", dc.world, dc.endpoint, e2);
    }
    tjobs_cfg_t cfg = {.dp = dp, .max_jobs = lora_pool_slots(pool), .keep_versions = atoi(svc_extra(&s, "keep_versions", "4")),
                       .optim_every = atoi(svc_extra(&s, "optim_every", "1")),
                       .shared_prefix = shared_prefix[0] == '1',
                       .pass_rows = atoi(svc_extra(&s, "pass_rows", "2048"))};
    tjobs_t *jobs = e && (dp || dc.world == 1) ? tjobs_new(e, st, &cfg, err) : NULL;
    svc_bind_endpoint(&s, SVC_TRAINER, ep, sizeof ep);
    zsock_t *in = jobs ? bus_bind(ZMQ_PULL, ep, BUS_DEFAULT_HWM, PROTO_MAX_FRAME, err) : NULL;
    svc_bind_endpoint(&s, SVC_TRAINER_EVENTS, ep, sizeof ep);
    zsock_t *pub = in ? bus_bind(ZMQ_PUB, ep, BUS_DEFAULT_HWM, 0, err) : NULL;
    zsock_t *rep = pub ? bus_connect(ZMQ_PUSH, svc_get(&s, SVC_REPORTS), BUS_DEFAULT_HWM, 0, err) : NULL;
    if (!rep) {
        log_error("%s", err);
        rc = 1;
        goto done;
    }
    log_info("ready: %zu-parameter base model, up to %d jobs, shared prompt prefixes %s, data-parallel ranks %d, "
             "id %s", m->n_params, cfg.max_jobs, cfg.shared_prefix ? "on" : "off", dc.world, s.id);
    svc_ready(&s, true, NULL);
    zpoller_t *poller = zpoller_new(in, NULL);
    double t_start = util_now(), last_beat = 0;
    uint64_t received = 0, rejected = 0, steps = 0;
    tjobs_result_t res[64];
    while (!svc_stopping()) {
        void *which = zpoller_wait(poller, 50);
        svc_tick(&s);
        if (which == in) {
            // drain what is queued before stepping: a step then sees every ready job
            for (int i = 0; i < 256; i++) {
                zframe_t *f = zframe_recv_nowait(in);
                if (!f) break;
                proto_batch_t b;
                received++;
                metrics_add(met, s.m_received, NULL, 1);
                if (proto_batch_decode("scored", zframe_data(f), zframe_size(f), &b, err)) {
                    rejected++;
                    metrics_add(met, s.m_rejected, NULL, 1);
                    metrics_add(met, s.m_errors, NULL, 1);
                    log_warn("dropped a malformed message (%s)", err);
                } else if (tjobs_add(jobs, &b, err) < 0) {
                    // the scheduler's lease on these groups runs out and it issues them again
                    rejected++;
                    metrics_add(met, s.m_rejected, NULL, 1);
                    metrics_add(met, s.m_errors, NULL, 1);
                    logj_warn(b.job, "batch not used: %s", err);
                    proto_batch_free(&b);
                }
                zframe_destroy(&f);
            }
        }
        int n = tjobs_step(jobs, res, 64);
        if (!n && dp && !tjobs_broken(jobs) && dp_idle_s(dp) > 1.0 && dp_ping(dp, err)) {
            log_error("data parallelism: %s; restart the trainer group (every rank)", err);
            rc = 1;
            break;
        }
        for (int i = 0; i < n; i++) {
            proto_buf_t buf = {0};
            proto_report_t r = {.kind = res[i].failed ? PROTO_REP_JOB_FAILED : PROTO_REP_STEP, .job = res[i].job,
                                .source = s.id, .step = res[i].step, .adapter_version = res[i].version,
                                .n = res[i].consumed, .errors = res[i].dropped,
                                .error = res[i].failed ? res[i].error : NULL};
            if (!proto_report_encode(&r, &buf) && bus_send(rep, &buf)) log_warn("report to the scheduler not sent (queue full)");
            proto_buf_free(&buf);
            metrics_add(met, m_dropped, NULL, res[i].dropped);
            if (res[i].failed) {
                metrics_add(met, m_job_failed, res[i].job, 1);
                metrics_add(met, s.m_errors, NULL, 1);
            } else {
                metrics_add(met, m_steps, NULL, 1);
                metrics_add(met, m_groups, NULL, res[i].consumed);
                metrics_set(met, m_job_step, res[i].job, res[i].step);
                metrics_set(met, m_job_version, res[i].job, res[i].version);
                metrics_add(met, m_job_groups, res[i].job, res[i].consumed);
            }
            if (!res[i].failed) {
                proto_adapter_event_t ev = {.job = res[i].job, .version = res[i].version, .step = res[i].step};
                if (!proto_adapter_event_encode(&ev, &buf)) {
                    zsock_send(pub, "sb", "adapter", buf.data, buf.len);
                }
                proto_buf_free(&buf);
                steps++;
            }
        }
        if (tjobs_broken(jobs)) {
            log_error("data parallelism: %s; restart the trainer group (every rank)", tjobs_broken(jobs));
            rc = 1;
            break;
        }
        if (util_now() - last_beat > 1.0) {
            last_beat = util_now();
            char v[6][32];
            double up = util_now() - t_start;
            snprintf(v[0], 32, "%.4f", tjobs_busy_seconds(jobs) / (up > 0 ? up : 1));
            snprintf(v[1], 32, "%.3f", tjobs_busy_seconds(jobs));
            snprintf(v[2], 32, "%llu", (unsigned long long)steps);
            snprintf(v[3], 32, "%llu", (unsigned long long)rejected);
            snprintf(v[4], 32, "%d", tjobs_count(jobs));
            snprintf(v[5], 32, "%.3f", up);
            const char *f[6] = {"busy_fraction", "busy_s", "steps", "rejected", "jobs", "up_s"};
            const char *vv[6] = {v[0], v[1], v[2], v[3], v[4], v[5]};
            svc_heartbeat(&s, st, 10, 6, f, vv);
            svc_busy(&s, tjobs_busy_seconds(jobs), up);
            metrics_set(met, s.m_queue, NULL, tjobs_buffered(jobs));
            metrics_set(met, m_jobs, NULL, tjobs_count(jobs));
            metrics_set(met, m_sps, NULL, met_window_rate(&step_win, up, (double)steps, 10.0));
        }
    }
    log_info("stopping: %llu messages received, %llu rejected, %llu steps", (unsigned long long)received,
             (unsigned long long)rejected, (unsigned long long)steps);
    zpoller_destroy(&poller);
done:
    zsock_destroy(&rep);
    zsock_destroy(&pub);
    zsock_destroy(&in);
    tjobs_destroy(&jobs);
    dp_close(&dp);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

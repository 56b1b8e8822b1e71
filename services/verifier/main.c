// main.c - marlaas-verifier: scores rollout batches (built-in verifiers, user datasets,
// external reward services), forwards scored training groups to the trainer and reports every
// task's results to the scheduler. Wiring only; the scoring lives in score.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/net/svc.h"
#include "common/util/log.h"
#include "services/verifier/score.h"

static const char *HELP =
    "Scores completions. Binds the port of --verifiers (PULL); connects --trainer and --reports.";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "verifier", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    char err[ERR_LEN], ep[256];
    store_t *st = svc_open(&s);
    if (!st) return 1;
    metrics_t *met = s.met;
    const int m_batches = metrics_def(met, "marlaas_verifier_batches_total", MET_COUNTER, "Batches fully scored."),
              m_samples = metrics_def(met, "marlaas_verifier_samples_total", MET_COUNTER, "Samples scored."),
              m_cont = metrics_def(met, "marlaas_verifier_continuations_total", MET_COUNTER,
                                   "Batches sent back for another turn of their episodes."),
              m_job_samples = metrics_def_job(met, "marlaas_verifier_job_samples_total", MET_COUNTER, "Samples scored, per job."),
              m_job_correct = metrics_def_job(met, "marlaas_verifier_job_correct_total", MET_COUNTER,
                                          "Samples with reward >= 0.5, per job."),
              m_job_reward = metrics_def_job(met, "marlaas_verifier_job_reward_sum_total", MET_COUNTER,
                                         "Sum of rewards, per job (mean reward = rate of this / rate of samples)."),
              m_job_errors = metrics_def_job(met, "marlaas_verifier_job_errors_total", MET_COUNTER,
                                         "Samples whose scoring failed (reward service error or timeout), per job.");
    scorer_t *sc = scorer_new(st, err);
    svc_bind_endpoint(&s, SVC_VERIFIERS, ep, sizeof ep);
    zsock_t *in = bus_bind(ZMQ_PULL, ep, BUS_DEFAULT_HWM, PROTO_MAX_FRAME, err);
    zsock_t *train = in ? bus_connect(ZMQ_PUSH, svc_get(&s, SVC_TRAINER), BUS_DEFAULT_HWM, 0, err) : NULL;
    zsock_t *rep = train ? bus_connect(ZMQ_PUSH, svc_get(&s, SVC_REPORTS), BUS_DEFAULT_HWM, 0, err) : NULL;
    if (!rep || !sc) {
        log_error("%s", err);
        rc = 1;
        goto done;
    }
    log_info("ready: listening on %s, id %s", ep, s.id);
    svc_ready(&s, true, NULL);
    uint64_t received = 0, rejected = 0, scored = 0;
    double last_beat = 0, t_start = util_now();
    while (!svc_stopping()) {
        int n_rs;
        zsock_t **rs = scorer_sockets(sc, &n_rs);
        zmq_pollitem_t items[33];
        int n_items = 0;
        items[n_items++] = (zmq_pollitem_t){.socket = zsock_resolve(in), .events = ZMQ_POLLIN};
        for (int i = 0; i < n_rs && n_items < 33; i++)
            items[n_items++] = (zmq_pollitem_t){.socket = zsock_resolve(rs[i]), .events = ZMQ_POLLIN};
        zmq_poll(items, n_items, scorer_pending(sc) ? 10 : 50);
        svc_tick(&s);
        for (int i = 0; i < 256; i++) {
            zframe_t *f = zframe_recv_nowait(in);
            if (!f) break;
            received++;
            metrics_add(met, s.m_received, NULL, 1);
            proto_batch_t b;
            if (proto_batch_decode("done", zframe_data(f), zframe_size(f), &b, err)) {
                rejected++;
                metrics_add(met, s.m_rejected, NULL, 1);
                metrics_add(met, s.m_errors, NULL, 1);
                log_warn("dropped a malformed message (%s)", err);
            } else {
                scorer_add(sc, &b);
            }
            zframe_destroy(&f);
        }
        scorer_poll(sc);
        proto_batch_t *b;
        bool job_failed, cont;
        char why[ERR_LEN];
        while ((b = scorer_take(sc, &job_failed, &cont, why))) {
            if (cont && !job_failed) {
                // episodes awaiting their next turn: back to the rollouts through the scheduler,
                // which holds the task's lease
                proto_buf_t buf = {0};
                if (proto_batch_encode("cont", b, &buf) == 0 && bus_send(rep, &buf)) {
                    logj_warn(b->job, "task %llu: scheduler unreachable or queue full; episodes dropped (re-issued "
                              "when the lease ends)", (unsigned long long)b->task_id);
                    metrics_add(met, s.m_errors, NULL, 1);
                } else {
                    metrics_add(met, m_cont, NULL, 1);
                }
                proto_buf_free(&buf);
                proto_batch_free(b);
                free(b);
                continue;
            }
            proto_report_t r = {.kind = PROTO_REP_EPISODES, .job = b->job, .source = s.id, .task_id = b->task_id,
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
            if (job_failed) {
                proto_report_t f = {.kind = PROTO_REP_JOB_FAILED, .job = b->job, .source = s.id, .error = why};
                if (!proto_report_encode(&f, &buf)) bus_send(rep, &buf);
                proto_buf_free(&buf);
                metrics_add(met, s.m_errors, NULL, 1);
            } else {
                if (b->kind == PROTO_KIND_TRAIN && proto_batch_encode("scored", b, &buf) == 0 && bus_send(train, &buf)) {
                    logj_warn(b->job, "task %llu: trainer unreachable or queue full; dropped (re-issued by the scheduler)",
                              (unsigned long long)b->task_id);
                    metrics_add(met, s.m_errors, NULL, 1);
                }
                metrics_add(met, m_batches, NULL, 1);
                metrics_add(met, m_samples, NULL, r.n);
                metrics_add(met, m_job_samples, b->job, r.n);
                metrics_add(met, m_job_correct, b->job, r.correct);
                metrics_add(met, m_job_reward, b->job, r.reward_sum);
                if (r.errors) metrics_add(met, m_job_errors, b->job, r.errors);
                proto_buf_free(&buf);
                if (!proto_report_encode(&r, &buf)) bus_send(rep, &buf);
                proto_buf_free(&buf);
                scored++;
            }
            proto_batch_free(b);
            free(b);
        }
        if (util_now() - last_beat > 2.0) {
            last_beat = util_now();
            double up = util_now() - t_start;
            char v[4][32];
            snprintf(v[0], 32, "%.4f", scorer_busy_seconds(sc) / (up > 0 ? up : 1));
            snprintf(v[1], 32, "%llu", (unsigned long long)scored);
            snprintf(v[2], 32, "%llu", (unsigned long long)rejected);
            snprintf(v[3], 32, "%d", scorer_pending(sc));
            const char *f[4] = {"busy_fraction", "batches", "rejected", "pending"}, *vv[4] = {v[0], v[1], v[2], v[3]};
            svc_heartbeat(&s, st, 10, 4, f, vv);
            svc_busy(&s, scorer_busy_seconds(sc), up);
            metrics_set(met, s.m_queue, NULL, scorer_pending(sc));
        }
    }
    log_info("stopping: %llu batches received, %llu scored, %llu rejected", (unsigned long long)received,
             (unsigned long long)scored, (unsigned long long)rejected);
done:
    zsock_destroy(&rep);
    zsock_destroy(&train);
    zsock_destroy(&in);
    scorer_destroy(&sc);
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

// main.c - marlaas-rollout: pulls rollout tasks from the scheduler, generates completions for
// many jobs at once (continuous batching, multi-LoRA), pushes them to every verifier replica.
// Wiring only; the logic lives in worker.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/net/svc.h"
#include "common/util/log.h"
#include "services/rollout/worker.h"

static const char *HELP =
    "Generates completions. Connects --work (tasks), --verifiers (a list, or a DNS name that\n"
    "resolves to every verifier; re-resolved every 10 s), --trainer-events and --reports.\n"
    "extras: --set max_adapters=32 --set max_batch_tokens=512 --set max_queue=64\n"
    "        --set max_context=N (positions of prompt + completion served; default min(the model's, 4096))\n"
    "        --set kv_mb=1024 (KV cache budget in MiB; README \"Bring your own model\")";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "rollout", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    char err[ERR_LEN];
    // settings first: a wrong backend fails before anything is started
    const kernels_t *k = svc_kernels(&s, err);
    int bf16 = k ? svc_weights_bf16(&s, k, err) : -1;
    if (bf16 < 0) {
        log_error("%s", err);
        return 2;
    }
    store_t *st = svc_open(&s);
    if (!st) return 1;
    metrics_t *met = s.met;
    const int m_tokens = metrics_def(met, "marlaas_rollout_tokens_total", MET_COUNTER, "Tokens generated."),
              m_tps = metrics_def(met, "marlaas_rollout_tokens_per_second", MET_GAUGE,
                                  "Tokens generated per second over the last 10 seconds."),
              m_tasks = metrics_def(met, "marlaas_rollout_tasks_completed_total", MET_COUNTER,
                                    "Rollout tasks whose completions went to a verifier."),
              m_failed = metrics_def(met, "marlaas_rollout_tasks_failed_total", MET_COUNTER,
                                     "Rollout tasks that failed (adapter missing, prompt too long) or found no verifier."),
              m_verifiers = metrics_def(met, "marlaas_rollout_verifiers", MET_GAUGE, "Verifier endpoints connected."),
              m_job_tasks = metrics_def_job(met, "marlaas_rollout_job_tasks_total", MET_COUNTER, "Tasks completed, per job."),
              m_job_samples = metrics_def_job(met, "marlaas_rollout_job_samples_total", MET_COUNTER,
                                          "Samples (episodes) generated, per job."),
              m_job_tokens = metrics_def_job(met, "marlaas_rollout_job_tokens_total", MET_COUNTER,
                                         "Tokens generated, per job (all turns).");
    met_window_t tok_win = {0};
    rl_runtime_cfg_t rc_cfg = {.n_slots = atoi(svc_extra(&s, "max_adapters", "32")),
                               .max_batch_tokens = atoi(svc_extra(&s, "max_batch_tokens", "512")), .k = k,
                               .bf16 = bf16 == 1, .max_context = atoi(svc_extra(&s, "max_context", "0")),
                               .kv_mb = atoi(svc_extra(&s, "kv_mb", "0"))};
    rl_runtime_t *rt = rl_runtime_open(svc_get(&s, SVC_MODEL), &rc_cfg, err);
    if (!rt) {
        log_error("cannot load the base model: %s (set --model or MARLAAS_MODEL%s)", err,
                  bf16 ? ", or --weights fp32" : "");
        store_destroy(&st);
        svc_close(&s);
        return 1;
    }
    worker_t *w = worker_new(rt, st, s.id, err);
    int max_queue = atoi(svc_extra(&s, "max_queue", "64"));
    // A small receive queue keeps tasks at the scheduler, where fair share decides.
    zsock_t *work = bus_connect(ZMQ_PULL, svc_get(&s, SVC_WORK), 4, PROTO_MAX_FRAME, err);
    zsock_t *out = work ? zsock_new(ZMQ_PUSH) : NULL;
    zsock_t *events = out ? bus_connect(ZMQ_SUB, svc_get(&s, SVC_TRAINER_EVENTS), BUS_DEFAULT_HWM, 1 << 20, err) : NULL;
    zsock_t *rep = events ? bus_connect(ZMQ_PUSH, svc_get(&s, SVC_REPORTS), BUS_DEFAULT_HWM, 0, err) : NULL;
    if (!rep || !w) {
        log_error("%s", err);
        rc = 1;
        goto done;
    }
    bus_tune(out);
    zsock_set_sndhwm(out, BUS_DEFAULT_HWM);
    zsock_set_linger(out, 0);
    // messages go only to verifiers with a live connection: without this a verifier that is
    // down keeps its round-robin share queued (and lost) until it comes back
    zsock_set_immediate(out, 1);
    zsock_set_subscribe(events, "adapter");
    bus_peers_t peers = {0};
    char eps[BUS_MAX_ENDPOINTS][256];
    double last_resolve = -1e9, last_beat = 0, t_start = util_now();
    uint64_t tasks_in = 0, tasks_out = 0, rejected = 0;
    zpoller_t *poller = zpoller_new(work, events, NULL);
    log_info("ready: model %s (%s weights), %d adapter slots, context %d, KV cache %d tokens, chat template %s, id %s",
             svc_get(&s, SVC_MODEL), rt->model->bf16 ? "bf16" : "fp32", lora_pool_slots(rt->pool), rt->max_context,
             kvcache_total_blocks(rt->kc) * kvcache_block_size(rt->kc), rt->chat ? "yes" : "no", s.id);
    while (!svc_stopping()) {
        if (util_now() - last_resolve > 10.0) {
            last_resolve = util_now();
            int n = bus_resolve(svc_get(&s, SVC_VERIFIERS), eps, BUS_MAX_ENDPOINTS, err);
            if (n < 0) log_warn("verifiers: %s (keeping %d connections)", err, peers.n);
            else if (bus_reconcile(out, &peers, eps, n)) log_info("connected to %d verifier(s)", peers.n);
            metrics_set(met, m_verifiers, NULL, peers.n);
            svc_ready(&s, peers.n > 0, "no verifier endpoint resolved yet (check --verifiers / MARLAAS_VERIFIERS)");
        }
        svc_tick(&s);
        bool busy = worker_pending(w) > 0;
        void *which = zpoller_wait(poller, busy ? 0 : 50);
        (void)which;
        // tasks: read while our queue has room (the rest wait in ZeroMQ and at the scheduler)
        while (worker_pending(w) < max_queue) {
            zframe_t *f = zframe_recv_nowait(work);
            if (!f) break;
            char type[32];
            proto_task_t t;
            proto_batch_t b;
            if (proto_peek_type(zframe_data(f), zframe_size(f), type, err) == 0 && !strcmp(type, "cont")) {
                // the next turn of multi-turn episodes
                if (proto_batch_decode("cont", zframe_data(f), zframe_size(f), &b, err)) {
                    rejected++;
                    metrics_add(met, s.m_rejected, NULL, 1);
                    metrics_add(met, s.m_errors, NULL, 1);
                    log_warn("dropped a malformed continuation (%s)", err);
                } else {
                    tasks_in++;
                    worker_add_cont(w, &b);
                }
            } else if (proto_task_decode(zframe_data(f), zframe_size(f), &t, err)) {
                rejected++;
                metrics_add(met, s.m_rejected, NULL, 1);
                metrics_add(met, s.m_errors, NULL, 1);
                log_warn("dropped a malformed task (%s)", err);
            } else {
                tasks_in++;
                worker_add(w, &t);
            }
            metrics_add(met, s.m_received, NULL, 1);
            zframe_destroy(&f);
        }
        for (;;) {
            zmsg_t *msg = zmsg_recv_nowait(events);
            if (!msg) break;
            zframe_t *topic = zmsg_first(msg), *body = zmsg_next(msg);
            proto_adapter_event_t ev;
            if (topic && body && !proto_adapter_event_decode(zframe_data(body), zframe_size(body), &ev, err)) {
                worker_adapter_event(w, ev.job, ev.version);
                proto_adapter_event_free(&ev);
            }
            zmsg_destroy(&msg);
        }
        worker_step(w);
        metrics_set(met, m_tokens, NULL, (double)worker_tokens(w));
        metrics_set(met, s.m_queue, NULL, worker_pending(w));
        proto_batch_t *b;
        const char *terr;
        while ((b = worker_take(w, &terr))) {
            proto_buf_t buf = {0};
            if (terr[0]) {
                logj_warn(b->job, "task %llu failed: %s", (unsigned long long)b->task_id, terr);
                proto_report_t r = {.kind = PROTO_REP_TASK_FAILED, .job = b->job, .source = s.id, .task_id = b->task_id,
                                    .error = (char *)terr};
                if (!proto_report_encode(&r, &buf)) bus_send(rep, &buf);
                metrics_add(met, m_failed, NULL, 1);
                metrics_add(met, s.m_errors, NULL, 1);
            } else if (proto_batch_encode("done", b, &buf) == 0) {
                if (bus_send(out, &buf)) {
                    logj_warn(b->job, "task %llu: no verifier reachable or queue full; dropped (the scheduler re-issues it)",
                              (unsigned long long)b->task_id);
                    metrics_add(met, m_failed, NULL, 1);
                    metrics_add(met, s.m_errors, NULL, 1);
                } else {
                    tasks_out++;
                    uint64_t samples = 0, toks = 0;
                    for (uint32_t g = 0; g < b->n_groups; g++) {
                        samples += b->groups[g].n_samples;
                        for (uint32_t q = 0; q < b->groups[g].n_samples; q++) toks += b->groups[g].samples[q].n;
                    }
                    metrics_add(met, m_tasks, NULL, 1);
                    metrics_add(met, m_job_tasks, b->job, 1);
                    metrics_add(met, m_job_samples, b->job, (double)samples);
                    metrics_add(met, m_job_tokens, b->job, (double)toks);
                }
            }
            proto_buf_free(&buf);
            proto_batch_free(b);
            free(b);
        }
        if (util_now() - last_beat > 1.0) {
            last_beat = util_now();
            double up = util_now() - t_start;
            char v[7][32];
            snprintf(v[0], 32, "%.4f", worker_busy_seconds(w) / (up > 0 ? up : 1));
            snprintf(v[1], 32, "%.3f", worker_busy_seconds(w));
            snprintf(v[2], 32, "%llu", (unsigned long long)worker_tokens(w));
            snprintf(v[3], 32, "%llu", (unsigned long long)tasks_out);
            snprintf(v[4], 32, "%d", worker_pending(w));
            snprintf(v[5], 32, "%llu", (unsigned long long)rejected);
            snprintf(v[6], 32, "%.3f", up);
            const char *f[7] = {"busy_fraction", "busy_s", "tokens", "tasks", "pending", "rejected", "up_s"};
            const char *vv[7] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
            svc_heartbeat(&s, st, 10, 7, f, vv);
            svc_busy(&s, worker_busy_seconds(w), up);
            metrics_set(met, m_tps, NULL, met_window_rate(&tok_win, up, (double)worker_tokens(w), 10.0));
        }
    }
    log_info("stopping: %llu tasks received, %llu completed, %llu rejected", (unsigned long long)tasks_in,
             (unsigned long long)tasks_out, (unsigned long long)rejected);
    zpoller_destroy(&poller);
done:
    zsock_destroy(&rep);
    zsock_destroy(&events);
    zsock_destroy(&out);
    zsock_destroy(&work);
    worker_destroy(&w);
    rl_runtime_close(&rt);
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

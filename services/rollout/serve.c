// serve.c - the rollout service's handlers (serve.h); generation lives in worker.c.
#include "services/rollout/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/rl/rl.h"
#include "common/util/log.h"
#include "services/rollout/worker.h"

struct rollout {
    svc_t *s;
    sim_t *sim;            // --backend sim:DEVICE, else NULL
    rl_runtime_t *rt;
    worker_t *w;
    int max_queue;
    zsock_t *work, *out, *events, *rep;
    bus_peers_t peers;
    uint64_t tasks_in, tasks_out;
    met_window_t tok_win;
    int m_tokens, m_tps, m_tasks, m_failed, m_verifiers, m_job_tasks, m_job_samples, m_job_tokens;
};

static void def_metrics(rollout_t *r) {
    metrics_t *met = r->s->met;
    r->m_tokens = metrics_def(met, "marlaas_rollout_tokens_total", MET_COUNTER, "Tokens generated.");
    r->m_tps = metrics_def(met, "marlaas_rollout_tokens_per_second", MET_GAUGE,
                           "Tokens generated per second over the last 10 seconds.");
    r->m_tasks = metrics_def(met, "marlaas_rollout_tasks_completed_total", MET_COUNTER,
                             "Rollout tasks whose completions went to a verifier.");
    r->m_failed = metrics_def(met, "marlaas_rollout_tasks_failed_total", MET_COUNTER,
                              "Rollout tasks that failed (adapter missing, prompt too long) or found no verifier.");
    r->m_verifiers = metrics_def(met, "marlaas_rollout_verifiers", MET_GAUGE, "Verifier endpoints connected.");
    r->m_job_tasks = metrics_def_job(met, "marlaas_rollout_job_tasks_total", MET_COUNTER, "Tasks completed, per job.");
    r->m_job_samples = metrics_def_job(met, "marlaas_rollout_job_samples_total", MET_COUNTER,
                                       "Samples (episodes) generated, per job.");
    r->m_job_tokens = metrics_def_job(met, "marlaas_rollout_job_tokens_total", MET_COUNTER,
                                      "Tokens generated, per job (all turns).");
}

rollout_t *rollout_open(svc_t *s, store_t *st, const kernels_t *k, bool bf16, char *err) {
    rollout_t *r = xcalloc(1, sizeof *r);
    r->s = s;
    def_metrics(r);
    rl_runtime_cfg_t cfg = {.n_slots = atoi(svc_extra(s, "max_adapters", "32")),
                            .max_batch_tokens = atoi(svc_extra(s, "max_batch_tokens", "512")), .k = k, .bf16 = bf16,
                            .max_context = atoi(svc_extra(s, "max_context", "0")),
                            .kv_mb = atoi(svc_extra(s, "kv_mb", "0"))};
    char e2[ERR_LEN];
    if (k == kernels_sim()) {
        r->sim = svc_sim_open(s, err);
        if (!r->sim) {
            rollout_close(&r);
            return NULL;
        }
        cfg.sim = r->sim;
        cfg.bf16 = sim_device(r->sim)->weight_bytes == 2;   // the modelled precision
        cfg.kv_blocks = atoi(svc_extra(s, "kv_blocks", "0"));
    }
    r->rt = rl_runtime_open(svc_get(s, SVC_MODEL), &cfg, e2);
    if (!r->rt) {
        err_set(err, "cannot load the base model: %s (set --model or MARLAAS_MODEL%s)", e2, bf16 ? ", or --weights fp32" : "");
        rollout_close(&r);
        return NULL;
    }
    // the adapters here are read, never trained: on bf16 weights (CPU) decode reads bf16 copies
    if (r->rt->model->bf16 && k == kernels_cpu()) lora_pool_bf16_copies(r->rt->pool, true);
    r->w = worker_new(r->rt, st, s->id, err);
    r->max_queue = atoi(svc_extra(s, "max_queue", "64"));
    // A small receive queue keeps tasks at the scheduler, where fair share decides.
    if (r->w) r->work = bus_connect(ZMQ_PULL, svc_get(s, SVC_WORK), "scheduler", 4, PROTO_MAX_FRAME, err);
    if (r->work) r->out = bus_socket(ZMQ_PUSH, "verifier", BUS_DEFAULT_HWM, 0, err);
    if (r->out)
        r->events = bus_connect(ZMQ_SUB, svc_get(s, SVC_TRAINER_EVENTS), "trainer", BUS_DEFAULT_HWM, 1 << 20, err);
    if (r->events) r->rep = bus_connect(ZMQ_PUSH, svc_get(s, SVC_REPORTS), "scheduler", BUS_DEFAULT_HWM, 0, err);
    if (!r->rep) {
        rollout_close(&r);
        return NULL;
    }
    // messages go only to verifiers with a live connection: without this a verifier that is
    // down keeps its round-robin share queued (and lost) until it comes back
    zsock_set_immediate(r->out, 1);
    zsock_set_subscribe(r->events, "adapter");
    log_info("ready: model %s (%s weights), %d adapter slots, context %d, KV cache %d tokens, chat template %s, id %s",
             svc_get(s, SVC_MODEL), r->rt->model->bf16 ? "bf16" : "fp32", lora_pool_slots(r->rt->pool),
             r->rt->max_context, kvcache_total_blocks(r->rt->kc) * kvcache_block_size(r->rt->kc),
             r->rt->chat ? "yes" : "no", s->id);
    if (r->sim) {
        const sim_device_t *d = sim_device(r->sim);
        log_info("simulated device %s: %.0f TFLOP/s, %.2f TB/s, %.0f GB (%s weights %.1f GB, KV cache %d tokens); "
                 "time scale %g (modelled seconds per wall second)", d->name, d->flops / 1e12, d->bandwidth / 1e12,
                 d->memory / 1e9, d->weight_bytes == 2 ? "bf16" : "fp32", sim_weight_bytes(r->sim) / 1e9,
                 kvcache_total_blocks(r->rt->kc) * kvcache_block_size(r->rt->kc), sim_scale(r->sim));
    }
    return r;
}

// Tasks are read while the worker's queue has room (the rest wait in ZeroMQ and at the scheduler).
static bool has_room(void *ctx) {
    rollout_t *r = ctx;
    return worker_pending(r->w) < r->max_queue;
}

// A rollout task, or the next turn of multi-turn episodes ("cont").
static int on_task(void *ctx, zframe_t *f, char *err) {
    rollout_t *r = ctx;
    char type[32];
    if (proto_peek_type(zframe_data(f), zframe_size(f), type, err) == 0 && !strcmp(type, "cont")) {
        proto_batch_t b;
        if (proto_batch_decode("cont", zframe_data(f), zframe_size(f), &b, err)) return -1;
        worker_add_cont(r->w, &b);
    } else {
        proto_task_t t;
        if (proto_task_decode(zframe_data(f), zframe_size(f), &t, err)) return -1;
        worker_add(r->w, &t);
    }
    r->tasks_in++;
    return 0;
}

// New adapter versions (topic "adapter", one event per message).
static void on_events(void *ctx, zsock_t *sock) {
    rollout_t *r = ctx;
    char err[ERR_LEN];
    for (;;) {
        zmsg_t *msg = zmsg_recv_nowait(sock);
        if (!msg) break;
        zframe_t *topic = zmsg_first(msg), *body = zmsg_next(msg);
        proto_adapter_event_t ev;
        if (topic && body && !proto_adapter_event_decode(zframe_data(body), zframe_size(body), &ev, err)) {
            worker_adapter_event(r->w, ev.job, ev.version);
            proto_adapter_event_free(&ev);
        }
        zmsg_destroy(&msg);
    }
}

// Every 10 s: the verifier endpoints (a DNS name resolves to every replica).
static void resolve_verifiers(void *ctx) {
    rollout_t *r = ctx;
    char err[ERR_LEN], eps[BUS_MAX_ENDPOINTS][256];
    int n = bus_resolve(svc_get(r->s, SVC_VERIFIERS), eps, BUS_MAX_ENDPOINTS, err);
    if (n < 0) log_warn("verifiers: %s (keeping %d connections)", err, r->peers.n);
    else if (bus_reconcile(r->out, &r->peers, eps, n)) log_info("connected to %d verifier(s)", r->peers.n);
    metrics_set(r->s->met, r->m_verifiers, NULL, r->peers.n);
    svc_ready(r->s, r->peers.n > 0, "no verifier endpoint resolved yet (check --verifiers / MARLAAS_VERIFIERS)");
}

static void send_failed(rollout_t *r, const proto_batch_t *b, const char *why) {
    metrics_t *met = r->s->met;
    logj_warn(b->job, "task %llu failed: %s", (unsigned long long)b->task_id, why);
    proto_report_t rp = {.kind = PROTO_REP_TASK_FAILED, .job = b->job, .source = r->s->id, .task_id = b->task_id,
                         .error = (char *)why};
    proto_buf_t buf = {0};
    if (!proto_report_encode(&rp, &buf)) bus_send(r->rep, &buf);
    proto_buf_free(&buf);
    metrics_add(met, r->m_failed, NULL, 1);
    metrics_add(met, r->s->m_errors, NULL, 1);
}

static void send_done(rollout_t *r, const proto_batch_t *b) {
    metrics_t *met = r->s->met;
    proto_buf_t buf = {0};
    if (proto_batch_encode("done", b, &buf) == 0) {
        if (bus_send(r->out, &buf)) {
            logj_warn(b->job, "task %llu: no verifier reachable or queue full; dropped (the scheduler re-issues it)",
                      (unsigned long long)b->task_id);
            metrics_add(met, r->m_failed, NULL, 1);
            metrics_add(met, r->s->m_errors, NULL, 1);
        } else {
            r->tasks_out++;
            uint64_t samples = 0, toks = 0;
            for (uint32_t g = 0; g < b->n_groups; g++) {
                samples += b->groups[g].n_samples;
                for (uint32_t q = 0; q < b->groups[g].n_samples; q++) toks += b->groups[g].samples[q].n;
            }
            metrics_add(met, r->m_tasks, NULL, 1);
            metrics_add(met, r->m_job_tasks, b->job, 1);
            metrics_add(met, r->m_job_samples, b->job, (double)samples);
            metrics_add(met, r->m_job_tokens, b->job, (double)toks);
        }
    }
    proto_buf_free(&buf);
}

// One engine step over every live sequence, then the finished tasks out. While work is queued
// the loop does not wait.
static int work(void *ctx) {
    rollout_t *r = ctx;
    worker_step(r->w);
    metrics_set(r->s->met, r->m_tokens, NULL, (double)worker_tokens(r->w));
    metrics_set(r->s->met, r->s->m_queue, NULL, worker_pending(r->w));
    proto_batch_t *b;
    const char *terr;
    while ((b = worker_take(r->w, &terr))) {
        if (terr[0]) send_failed(r, b, terr);
        else send_done(r, b);
        proto_batch_destroy(&b);
    }
    return worker_pending(r->w) > 0 ? 0 : -1;
}

static void beat(void *ctx, svc_beat_t *b) {
    rollout_t *r = ctx;
    b->busy_s = worker_busy_seconds(r->w);
    b->queue = worker_pending(r->w);
    svc_beat_add(b, "tokens", "%llu", (unsigned long long)worker_tokens(r->w));
    svc_beat_add(b, "tasks", "%llu", (unsigned long long)r->tasks_out);
    svc_beat_add(b, "pending", "%d", worker_pending(r->w));
    metrics_set(r->s->met, r->m_tps, NULL, met_window_rate(&r->tok_win, b->up_s, (double)worker_tokens(r->w), 10.0));
}

void rollout_register(void *module, svc_loop_t *l) {
    rollout_t *r = module;
    svc_loop_every(l, 10.0, resolve_verifiers, r);
    svc_loop_frames(l, r->work, "task", 1024, on_task, has_room, r);
    svc_loop_reader(l, r->events, on_events, r);
    svc_loop_work(l, work, r);
    svc_loop_heartbeat(l, beat, r);
}

void rollout_close(rollout_t **pr) {
    if (!pr || !*pr) return;
    rollout_t *r = *pr;
    if (r->rep)
        log_info("stopping: %llu tasks received, %llu completed, %llu rejected", (unsigned long long)r->tasks_in,
                 (unsigned long long)r->tasks_out, (unsigned long long)r->s->rejected);
    zsock_destroy(&r->rep);
    zsock_destroy(&r->events);
    zsock_destroy(&r->out);
    zsock_destroy(&r->work);
    worker_destroy(&r->w);
    rl_runtime_close(&r->rt);
    sim_close(&r->sim);
    free(r);
    *pr = NULL;
}

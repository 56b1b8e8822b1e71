// serve.c - the scheduler service's handlers (serve.h); the API lives in api.c, the job table
// and the issuing of work in sched.c.
#include "services/scheduler/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/rl/rl.h"
#include "common/util/log.h"
#include "services/scheduler/api.h"
#include "services/scheduler/console.h"

struct scheduler {
    svc_t *s;
    zsock_t *api_sock, *work, *events, *reports;
    sched_t *sc;
    api_t *api;
    console_t *console;            // the web console (NULL: off)
    chat_template_t *chat;
    store_t *st;
    uint64_t reports_in;
    int m_api, m_api_err;
};

int scheduler_settings(const svc_t *s, sched_cfg_t *cfg, const char **admin) {
    const char *pol = svc_get(s, SVC_POLICY);
    if (strcmp(pol, "async") && strcmp(pol, "sync")) {
        log_error("--policy must be async or sync, got '%s'", pol);
        return -1;
    }
    *cfg = (sched_cfg_t){.policy = strcmp(pol, "sync") ? POLICY_ASYNC : POLICY_SYNC,
                         .lease_s = atof(svc_extra(s, "lease_s", "60")),
                         .train_lease_s = atof(svc_extra(s, "train_lease_s", "60")),
                         .chunk = atoi(svc_extra(s, "chunk", "8")),
                         .max_running = 0};
    const char *mr = svc_extra(s, "max_running", "0");
    char *end;
    long mrv = strtol(mr, &end, 10);
    if (!*mr || *end || mrv < 0 || mrv > 1000000) {
        log_error("--set max_running must be an integer in 0..1000000 (0: no bound), got '%s'", mr);
        return -1;
    }
    cfg->max_running = (int)mrv;
    *admin = svc_get(s, SVC_ADMIN_TOKEN);
    if (*admin && !strcmp(*admin, "replace-with-a-random-token")) {
        // the placeholder of the Kubernetes base (deploy/k8s/base/config.yaml) is public
        log_error("the admin token is the placeholder of deploy/k8s/base/config.yaml: replace the secret "
                  "marlaas-admin with a random token; tenants cannot be created until then");
        *admin = NULL;
    } else if (!*admin || strlen(*admin) < 8) {
        log_warn("no admin token of 8+ characters (--admin-token / MARLAAS_ADMIN_TOKEN): tenants cannot be created");
    }
    return 0;
}

scheduler_t *scheduler_open(svc_t *s, store_t *st, const sched_cfg_t *cfg, const char *admin, char *err) {
    scheduler_t *c = xcalloc(1, sizeof *c);
    c->s = s;
    c->st = st;
    c->m_api = metrics_def(s->met, "marlaas_api_requests_total", MET_COUNTER, "API requests answered.");
    c->m_api_err = metrics_def(s->met, "marlaas_api_errors_total", MET_COUNTER,
                               "API requests answered with an error (bad token, invalid spec, unknown job, ...).");
    hf_config_t mc;
    char path[4096], ep[256], e2[ERR_LEN];
    snprintf(path, sizeof path, "%s/config.json", svc_get(s, SVC_MODEL));
    if (hf_config_load(&mc, path, e2)) {
        err_set(err, "cannot read the base model's config: %s (set --model or MARLAAS_MODEL)", e2);
        scheduler_close(&c);
        return NULL;
    }
    // like every endpoint a service owns, the API binds its port on all interfaces, so one setting
    // (tcp://scheduler:7000) serves the scheduler and its clients alike
    svc_bind_endpoint(s, SVC_API, ep, sizeof ep);
    c->api_sock = bus_bind_public(ZMQ_ROUTER, ep, BUS_DEFAULT_HWM, 64u << 20, err);
    svc_bind_endpoint(s, SVC_WORK, ep, sizeof ep);
    if (c->api_sock) c->work = bus_bind(ZMQ_PUSH, ep, 8, 0, err);
    svc_bind_endpoint(s, SVC_EVENTS, ep, sizeof ep);
    if (c->work) c->events = bus_bind(ZMQ_PUB, ep, BUS_DEFAULT_HWM, 0, err);
    svc_bind_endpoint(s, SVC_REPORTS, ep, sizeof ep);
    // reports are small, but multi-turn continuations carry whole episodes: a frame as large as
    // a rollout task's results
    if (c->events) c->reports = bus_bind(ZMQ_PULL, ep, 10000, PROTO_MAX_FRAME, err);
    if (c->reports) c->sc = sched_new(st, c->work, &mc, cfg, err);
    if (c->sc) {
        sched_set_events(c->sc, c->events);
        sched_set_metrics(c->sc, s->met);
        c->api = api_new(st, c->sc, admin, svc_get(s, SVC_MODEL), err);
        // the rollouts' settings of the same names: job specs are measured against what they serve
        // (a simulated rollout's cache is what its device's memory holds: the same rule here)
        int kv_blocks = atoi(svc_extra(s, "kv_blocks", "0"));
        if (c->api && !strncmp(svc_get(s, SVC_BACKEND), "sim:", 4)) {
            api_set_simulated(c->api, true);
            sim_t *sim = kv_blocks ? NULL : svc_sim_open(s, err);
            if (!kv_blocks && sim)
                kv_blocks = rl_sim_kv_blocks(sim, &mc, atoi(svc_extra(s, "max_adapters", "32")), err);
            sim_close(&sim);
            if (kv_blocks <= 0) api_destroy(&c->api);
        }
        if (c->api && api_set_serving(c->api, atoi(svc_extra(s, "max_context", "0")), atoi(svc_extra(s, "kv_mb", "0")),
                                      kv_blocks, err))
            api_destroy(&c->api);
        endpoint_rules_t *rules = c->api ? svc_endpoint_rules(s, err) : NULL;
        if (rules) api_set_endpoint_rules(c->api, rules);
        else api_destroy(&c->api);
    }
    if (!c->api) {
        scheduler_close(&c);
        return NULL;
    }
    // The chat template (optional: only chat jobs need one), shared by the API (submission
    // checks) and the issuing of tasks (rendering).
    char chat_err[ERR_LEN] = "";
    c->chat = chat_template_load(svc_get(s, SVC_MODEL), chat_err);
    if (!c->chat) log_info("no chat template: chat jobs are refused (%s)", chat_err);
    sched_set_chat(c->sc, c->chat, chat_err);
    api_set_chat(c->api, c->chat, chat_err);
    // The web console: off unless --set console=HOST:PORT or MARLAAS_CONSOLE names a port.
    const char *con = svc_extra(s, "console", NULL);
    if (!con) con = getenv("MARLAAS_CONSOLE");
    c->console = console_start(con, c->api, st, err);
    if (!c->console && err[0]) {
        scheduler_close(&c);
        return NULL;
    }
    int restored = sched_restore(c->sc, e2);
    if (restored < 0) log_warn("jobs not restored: %s", e2);
    log_info("ready: policy %s, %d jobs restored, id %s", svc_get(s, SVC_POLICY), restored < 0 ? 0 : restored, s->id);
    return c;
}

static void on_api(void *ctx, zsock_t *sock) { api_serve(((scheduler_t *)ctx)->api, sock); }

// A report (a task's results, a step, a failure) or a continuation of multi-turn episodes from a
// verifier.
static int on_report(void *ctx, zframe_t *f, char *err) {
    scheduler_t *c = ctx;
    char type[32];
    if (proto_peek_type(zframe_data(f), zframe_size(f), type, err) == 0 && !strcmp(type, "cont")) {
        char e2[ERR_LEN];
        if (sched_continue(c->sc, zframe_data(f), zframe_size(f), e2)) return err_set(err, "continuation: %s", e2);
    } else {
        proto_report_t r;
        if (proto_report_decode(zframe_data(f), zframe_size(f), &r, err)) return -1;
        int rc = sched_report(c->sc, &r, err);
        proto_report_free(&r);
        if (rc) return -1;
    }
    c->reports_in++;
    return 0;
}

// Issuing, lease expiry and completion, every turn: the loop turns at least every 5 ms.
static int tick(void *ctx) {
    sched_tick(((scheduler_t *)ctx)->sc);
    console_run(((scheduler_t *)ctx)->console);
    return -1;
}

// The live trainers' job slots, from their heartbeats (svc:trainer:{id}, 10 s TTL): what the
// async policy may run at once. A heartbeat that cannot be read leaves the last figure.
static void trainer_slots(void *ctx) {
    scheduler_t *c = ctx;
    char pat[256], err[ERR_LEN], **keys = NULL;
    int n = 0;
    if (!store_key(c->st, pat, sizeof pat, "svc:trainer:*") || store_scan(c->st, pat, 256, &keys, &n, err)) return;
    long slots = 0;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        char *v = NULL, *end = NULL;
        int rc = store_hget(c->st, keys[i], "max_jobs", &v, NULL, err);
        long x = v ? strtol(v, &end, 10) : 0;
        if (rc < 0) ok = false;
        else if (v && *v && !*end && x > 0 && x <= 1000000) slots += x;   // a trainer without the field: none
        free(v);
    }
    store_strv_free(&keys, n);
    if (ok) sched_set_trainer_slots(c->sc, (int)(slots < 1000000 ? slots : 1000000));
}

static void beat(void *ctx, svc_beat_t *b) {
    scheduler_t *c = ctx;
    svc_beat_add(b, "active_jobs", "%d", sched_active(c->sc));
    svc_beat_add(b, "reports", "%llu", (unsigned long long)c->reports_in);
    b->queue = sched_export(c->sc);
    uint64_t nreq, nerr;
    api_counts(c->api, &nreq, &nerr);
    metrics_set(c->s->met, c->m_api, NULL, (double)nreq);
    metrics_set(c->s->met, c->m_api_err, NULL, (double)nerr);
}

void scheduler_register(void *module, svc_loop_t *l) {
    scheduler_t *c = module;
    svc_loop_idle(l, 5);
    svc_loop_reader(l, c->api_sock, on_api, c);
    svc_loop_frames(l, c->reports, "report", 1024, on_report, NULL, c);
    svc_loop_work(l, tick, c);
    svc_loop_every(l, 1.0, trainer_slots, c);
    svc_loop_heartbeat(l, beat, c);
}

void scheduler_close(scheduler_t **pc) {
    if (!pc || !*pc) return;
    scheduler_t *c = *pc;
    if (c->api)
        log_info("stopping: %llu reports, %llu rejected", (unsigned long long)c->reports_in,
                 (unsigned long long)c->s->rejected);
    console_stop(&c->console);
    api_destroy(&c->api);
    sched_destroy(&c->sc);
    chat_template_destroy(&c->chat);
    zsock_destroy(&c->reports);
    zsock_destroy(&c->events);
    zsock_destroy(&c->work);
    bus_close(&c->api_sock);
    free(c);
    *pc = NULL;
}

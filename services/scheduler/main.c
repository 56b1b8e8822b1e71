// main.c - marlaas-scheduler: the API, the job table and the issuing of rollout work.
// Wiring only; the logic lives in api.c and sched.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/net/svc.h"
#include "common/util/log.h"
#include "services/scheduler/api.h"
#include "services/scheduler/sched.h"

static const char *HELP =
    "Schedules jobs. Binds --api (ROUTER), the port of --work (PUSH, rollout tasks), --events (PUB)\n"
    "and --reports (PULL). --policy async (all jobs at once) or sync (one job, one stage at a time).\n"
    "extras: --set lease_s=60 --set train_lease_s=60 --set chunk=8";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "scheduler", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    const char *pol = svc_get(&s, SVC_POLICY);
    if (strcmp(pol, "async") && strcmp(pol, "sync")) {
        log_error("--policy must be async or sync, got '%s'", pol);
        return 2;
    }
    const char *admin = svc_get(&s, SVC_ADMIN_TOKEN);
    if (admin && !strcmp(admin, "replace-with-a-random-token")) {
        // the placeholder of the Kubernetes base (deploy/k8s/base/config.yaml) is public
        log_error("the admin token is the placeholder of deploy/k8s/base/config.yaml: replace the secret "
                  "marlaas-admin with a random token; tenants cannot be created until then");
        admin = NULL;
    } else if (!admin || strlen(admin) < 8) {
        log_warn("no admin token of 8+ characters (--admin-token / MARLAAS_ADMIN_TOKEN): tenants cannot be created");
    }
    char err[ERR_LEN], ep[256], path[4096];
    store_t *st = svc_open(&s);
    if (!st) return 1;
    metrics_t *met = s.met;
    const int m_api = metrics_def(met, "marlaas_api_requests_total", MET_COUNTER, "API requests answered."),
              m_api_err = metrics_def(met, "marlaas_api_errors_total", MET_COUNTER,
                                      "API requests answered with an error (bad token, invalid spec, unknown job, ...).");
    hf_config_t mc;
    snprintf(path, sizeof path, "%s/config.json", svc_get(&s, SVC_MODEL));
    if (hf_config_load(&mc, path, err)) {
        log_error("cannot read the base model's config: %s (set --model or MARLAAS_MODEL)", err);
        store_destroy(&st);
        svc_close(&s);
        return 1;
    }
    zsock_t *api_sock = NULL, *work = NULL, *events = NULL, *reports = NULL;
    sched_t *sc = NULL;
    api_t *api = NULL;
    chat_template_t *chat = NULL;
    // like every endpoint a service owns, the API binds its port on all interfaces, so one setting
    // (tcp://scheduler:7000) serves the scheduler and its clients alike
    svc_bind_endpoint(&s, SVC_API, ep, sizeof ep);
    api_sock = bus_bind(ZMQ_ROUTER, ep, BUS_DEFAULT_HWM, 64u << 20, err);
    svc_bind_endpoint(&s, SVC_WORK, ep, sizeof ep);
    if (api_sock) work = bus_bind(ZMQ_PUSH, ep, 8, 0, err);
    svc_bind_endpoint(&s, SVC_EVENTS, ep, sizeof ep);
    if (work) events = bus_bind(ZMQ_PUB, ep, BUS_DEFAULT_HWM, 0, err);
    svc_bind_endpoint(&s, SVC_REPORTS, ep, sizeof ep);
    // reports are small, but multi-turn continuations carry whole episodes: a frame as large as
    // a rollout task's results
    if (events) reports = bus_bind(ZMQ_PULL, ep, 10000, PROTO_MAX_FRAME, err);
    sched_cfg_t cfg = {.policy = strcmp(pol, "sync") ? POLICY_ASYNC : POLICY_SYNC,
                       .lease_s = atof(svc_extra(&s, "lease_s", "60")),
                       .train_lease_s = atof(svc_extra(&s, "train_lease_s", "60")),
                       .chunk = atoi(svc_extra(&s, "chunk", "8"))};
    if (reports) sc = sched_new(st, work, &mc, &cfg, err);
    if (sc) sched_set_events(sc, events);
    if (sc) sched_set_metrics(sc, met);
    if (sc) api = api_new(st, sc, admin, svc_get(&s, SVC_MODEL), err);
    if (!api) {
        log_error("%s", err);
        rc = 1;
        goto done;
    }
    // The chat template (optional: only chat jobs need one), shared by the API (submission
    // checks) and the issuing of tasks (rendering).
    char chat_err[ERR_LEN] = "";
    chat = chat_template_load(svc_get(&s, SVC_MODEL), chat_err);
    if (!chat) log_info("no chat template: chat jobs are refused (%s)", chat_err);
    sched_set_chat(sc, chat, chat_err);
    api_set_chat(api, chat, chat_err);
    int restored = sched_restore(sc, err);
    if (restored < 0) log_warn("jobs not restored: %s", err);
    log_info("ready: policy %s, %d jobs restored, id %s", pol, restored < 0 ? 0 : restored, s.id);
    svc_ready(&s, true, NULL);
    zpoller_t *poller = zpoller_new(api_sock, reports, NULL);
    double last_beat = 0, busy = 0, t_start = util_now();
    uint64_t reports_in = 0, rejected = 0;
    while (!svc_stopping()) {
        zpoller_wait(poller, 5);
        svc_tick(&s);
        double t0 = util_now();
        api_serve(api, api_sock);
        for (int i = 0; i < 1024; i++) {
            zframe_t *f = zframe_recv_nowait(reports);
            if (!f) break;
            proto_report_t r;
            char type[32];
            if (proto_peek_type(zframe_data(f), zframe_size(f), type, err) == 0 && !strcmp(type, "cont")) {
                if (sched_continue(sc, zframe_data(f), zframe_size(f), err)) {
                    rejected++;
                    metrics_add(met, s.m_rejected, NULL, 1);
                    metrics_add(met, s.m_errors, NULL, 1);
                    log_warn("dropped a malformed continuation (%s)", err);
                } else {
                    reports_in++;
                }
            } else if (proto_report_decode(zframe_data(f), zframe_size(f), &r, err)) {
                rejected++;
                metrics_add(met, s.m_rejected, NULL, 1);
                metrics_add(met, s.m_errors, NULL, 1);
                log_warn("dropped a malformed report (%s)", err);
            } else {
                reports_in++;
                sched_report(sc, &r);
                proto_report_free(&r);
            }
            metrics_add(met, s.m_received, NULL, 1);
            zframe_destroy(&f);
        }
        sched_tick(sc);
        busy += util_now() - t0;
        if (util_now() - last_beat > 2.0) {
            last_beat = util_now();
            char v[3][32];
            snprintf(v[0], 32, "%d", sched_active(sc));
            snprintf(v[1], 32, "%llu", (unsigned long long)reports_in);
            snprintf(v[2], 32, "%llu", (unsigned long long)rejected);
            const char *f[3] = {"active_jobs", "reports", "rejected"}, *vv[3] = {v[0], v[1], v[2]};
            svc_heartbeat(&s, st, 10, 3, f, vv);
            metrics_set(met, s.m_queue, NULL, sched_export(sc));
            svc_busy(&s, busy, util_now() - t_start);
            uint64_t nreq, nerr;
            api_counts(api, &nreq, &nerr);
            metrics_set(met, m_api, NULL, (double)nreq);
            metrics_set(met, m_api_err, NULL, (double)nerr);
        }
    }
    log_info("stopping: %llu reports, %llu rejected", (unsigned long long)reports_in, (unsigned long long)rejected);
    zpoller_destroy(&poller);
done:
    api_destroy(&api);
    sched_destroy(&sc);
    chat_template_destroy(&chat);
    zsock_destroy(&reports);
    zsock_destroy(&events);
    zsock_destroy(&work);
    zsock_destroy(&api_sock);
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

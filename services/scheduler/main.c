// main.c - marlaas-scheduler: the API, the job table and the issuing of rollout work.
// Wiring only: the handlers live in serve.c, the API in api.c, the job table in sched.c, the
// loop in common/svc/loop.c.
#include "common/svc/loop.h"
#include "common/util/log.h"
#include "services/scheduler/serve.h"

static const char *HELP =
    "Schedules jobs. Binds --api (ROUTER), the port of --work (PUSH, rollout tasks), --events (PUB)\n"
    "and --reports (PULL). --policy async (all jobs at once) or sync (one job, one stage at a time).\n"
    "extras: --set lease_s=60 --set train_lease_s=60 --set chunk=8\n"
    "        --set max_context=N --set kv_mb=N (those of the rollouts: job specs are checked against them)\n"
    "        --set max_running=N (async: jobs running at once, the rest queued; at or below the trainer's max_jobs)";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "scheduler", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    sched_cfg_t cfg;
    const char *admin;
    if (scheduler_settings(&s, &cfg, &admin)) return 2;
    store_t *st = svc_open(&s);
    if (!st) return 1;
    char err[ERR_LEN];
    scheduler_t *c = scheduler_open(&s, st, &cfg, admin, err);
    if (!c) {
        log_error("%s", err);
        rc = 1;
    } else {
        rc = svc_loop_serve(&s, st, c, scheduler_register, true);
        scheduler_close(&c);
    }
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

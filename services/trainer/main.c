// main.c - marlaas-trainer: receives scored groups from the verifiers, trains each job's LoRA
// adapter when its batch is ready (several jobs in one pass), publishes adapter versions to
// Redis and announces them. Wiring only: the handlers live in serve.c, the jobs and their steps
// in jobs.c, the loop in common/svc/loop.c.
#include "common/svc/loop.h"
#include "common/util/log.h"
#include "services/trainer/serve.h"

static const char *HELP =
    "Trains the jobs' LoRA adapters. Binds --trainer (PULL, scored groups from verifiers) and\n"
    "--trainer-events (PUB, adapter versions); connects --reports (the scheduler).\n"
    "extras: --set max_jobs=64 --set keep_versions=4 --set optim_every=1\n"
    "        --set shared_prefix=1 (a group's prompt is computed once for its samples; 0 = per sample)\n"
    "        --set pass_rows=2048 (rows of one mixed-adapter training pass; whole jobs, at least one)\n"
    "        --set lanes=1 (passes computed at once, each on a thread of its own, on different jobs; cpu\n"
    "        backend; give it the cores the other services leave idle, with MARLAAS_THREADS=1)\n"
    "Data parallelism (one process per GPU): --set dp_world=N --set dp_rank=R --set dp_endpoint=tcp://HOST:PORT\n"
    "        (rank 0's address; rank 0 is the trainer service, ranks 1..N-1 only compute)\n"
    "        --set dp_timeout=120 (seconds: a dead or hung rank stops the group after this long)\n"
    "        --set dp_sum=nccl (GPU gradients summed with NCCL; host: over the group's sockets, for\n"
    "        ranks sharing a GPU)";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "trainer", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    char err[ERR_LEN];
    // settings first: a wrong backend fails before anything is started
    const kernels_t *k = kernels_by_name(svc_get(&s, SVC_BACKEND), err, sizeof err);
    if (!k) {
        log_error("--backend %s: %s; use --backend cpu", svc_get(&s, SVC_BACKEND), err);
        return 2;
    }
    int bf16 = kernels_weights_bf16(k, svc_get(&s, SVC_WEIGHTS), err, sizeof err);
    if (bf16 < 0) {
        log_error("--weights / MARLAAS_WEIGHTS: %s", err);
        return 2;
    }
    dp_cfg_t dc;
    if (trainer_settings(&s, &dc)) return 2;
    if (dc.rank > 0) return trainer_run_rank(&s, k, bf16 == 1, &dc);
    store_t *st = svc_open(&s);
    if (!st) return 1;
    trainer_t *t = trainer_open(&s, st, k, bf16 == 1, &dc, err);
    if (!t) {
        log_error("%s", err);
        rc = 1;
    } else {
        rc = svc_loop_serve(&s, st, t, trainer_register, true);
        trainer_close(&t);
    }
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

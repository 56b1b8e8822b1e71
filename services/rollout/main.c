// main.c - marlaas-rollout: pulls rollout tasks from the scheduler, generates completions for
// many jobs at once (continuous batching, multi-LoRA), pushes them to every verifier replica.
// Wiring only: the handlers live in serve.c, generation in worker.c, the loop in
// common/svc/loop.c.
#include "common/svc/loop.h"
#include "common/util/log.h"
#include "services/rollout/serve.h"

static const char *HELP =
    "Generates completions. Connects --work (tasks), --verifiers (a list, or a DNS name that\n"
    "resolves to every verifier; re-resolved every 10 s), --trainer-events and --reports.\n"
    "extras: --set max_adapters=32 --set max_batch_tokens=512 --set max_queue=64\n"
    "        --set max_context=N (positions of prompt + completion served; default min(the model's, 4096))\n"
    "        --set kv_mb=1024 (KV cache budget in MiB; README \"Bring your own model\")\n"
    "simulated device (--backend sim:h100|h200|a100|cpu; docs/SIMULATOR.md): --set sim_scale=60\n"
    "        --set sim_lengths=lognormal:200,0.8 (or fixed:N, uniform:A,B) --set kv_blocks=N\n"
    "        --set sim_coalesce_s=0.001 (wall seconds of decode steps run back to back; 0: one per call)";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "rollout", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    char err[ERR_LEN];
    // settings first: a wrong backend fails before anything is started
    const kernels_t *k = kernels_by_name(svc_get(&s, SVC_BACKEND), err, sizeof err);
    if (!k) {
        log_error("--backend %s: %s; use --backend cpu (or sim:DEVICE)", svc_get(&s, SVC_BACKEND), err);
        return 2;
    }
    int bf16 = kernels_weights_bf16(k, svc_get(&s, SVC_WEIGHTS), err, sizeof err);
    if (bf16 < 0) {
        log_error("--weights / MARLAAS_WEIGHTS: %s", err);
        return 2;
    }
    store_t *st = svc_open(&s);
    if (!st) return 1;
    rollout_t *r = rollout_open(&s, st, k, bf16 == 1, err);
    if (!r) {
        log_error("%s", err);
        rc = 1;
    } else {
        // ready once a verifier endpoint resolves (serve.c)
        rc = svc_loop_serve(&s, st, r, rollout_register, false);
        rollout_close(&r);
    }
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

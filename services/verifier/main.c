// main.c - marlaas-verifier: scores rollout batches (built-in verifiers, user datasets,
// external reward services), forwards scored training groups to the trainer and reports every
// task's results to the scheduler. Wiring only: the handlers live in serve.c, the scoring in
// score.c, the loop in common/svc/loop.c.
#include "common/svc/loop.h"
#include "common/util/log.h"
#include "services/verifier/serve.h"

static const char *HELP =
    "Scores completions. Binds the port of --verifiers (PULL); connects --trainer and --reports.";

int main(int argc, char **argv) {
    svc_t s;
    int rc = svc_init(&s, "verifier", argc, argv, HELP);
    if (rc) return rc > 0 ? 0 : 2;
    store_t *st = svc_open(&s);
    if (!st) return 1;
    char err[ERR_LEN];
    verifier_t *v = verifier_open(&s, st, err);
    if (!v) {
        log_error("%s", err);
        rc = 1;
    } else {
        rc = svc_loop_serve(&s, st, v, verifier_register, true);
        verifier_close(&v);
    }
    store_destroy(&st);
    svc_close(&s);
    return rc;
}

// cmd_keys.c - `marlaas keys generate DIR`: the CURVE keypairs of a cluster's four services.
#include <czmq.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/net/bus.h"

int cmd_keys(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) argc = 0;
    if (argc != 3 || strcmp(argv[1], "generate")) {
        FILE *f = argc == 0 ? stdout : stderr;
        fprintf(f, "usage: marlaas keys generate DIR\n"
                   "Writes DIR/NAME.key (public) and DIR/NAME.key_secret (secret, mode 0600) for the scheduler,\n"
                   "rollout, verifier and trainer. Each service reads its own secret and every public key\n"
                   "(--keys DIR / MARLAAS_KEYS); a client of the API needs only scheduler.key\n"
                   "(MARLAAS_API_KEY). Existing keys are never overwritten.\n");
        return argc == 0 ? 0 : 2;
    }
    zsys_init();
    zsys_set_logstream(NULL);
    char err[ERR_LEN];
    if (bus_keys_generate(argv[2], err)) {
        fprintf(stderr, "marlaas keys: %s\n", err);
        return 1;
    }
    char key[41];
    if (bus_public_key(argv[2], "scheduler", key, err)) {
        fprintf(stderr, "marlaas keys: %s\n", err);
        return 1;
    }
    printf("keys of scheduler, rollout, verifier, trainer written to %s\napi_key %s\n", argv[2], key);
    return 0;
}

// svc.c - settings, instance ids, Redis connection and heartbeats for the service processes.
#include "common/net/svc.h"

#include <czmq.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util/log.h"

static const struct {
    const char *flag, *env, *def;
} opts[SVC_N_OPTS] = {
    [SVC_REDIS] = {"redis", "MARLAAS_REDIS", "127.0.0.1:6379"},
    [SVC_PREFIX] = {"prefix", "MARLAAS_PREFIX", "marlaas:"},
    [SVC_MODEL] = {"model", "MARLAAS_MODEL", "models/tiny"},
    [SVC_API] = {"api", "MARLAAS_API", "tcp://*:7000"},
    [SVC_WORK] = {"work", "MARLAAS_WORK", "tcp://127.0.0.1:7001"},
    [SVC_EVENTS] = {"events", "MARLAAS_EVENTS", "tcp://127.0.0.1:7002"},
    [SVC_REPORTS] = {"reports", "MARLAAS_REPORTS", "tcp://127.0.0.1:7003"},
    [SVC_VERIFIERS] = {"verifiers", "MARLAAS_VERIFIERS", "tcp://127.0.0.1:7010"},
    [SVC_TRAINER] = {"trainer", "MARLAAS_TRAINER", "tcp://127.0.0.1:7020"},
    [SVC_TRAINER_EVENTS] = {"trainer-events", "MARLAAS_TRAINER_EVENTS", "tcp://127.0.0.1:7021"},
    [SVC_THREADS] = {"threads", "MARLAAS_THREADS", NULL},
    [SVC_ADMIN_TOKEN] = {"admin-token", "MARLAAS_ADMIN_TOKEN", NULL},
    [SVC_POLICY] = {"policy", "MARLAAS_POLICY", "async"},
    [SVC_ID] = {"id", "MARLAAS_ID", NULL},
};

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

bool svc_stopping(void) { return stop_flag || zsys_interrupted; }

int svc_init(svc_t *s, const char *name, int argc, char **argv, const char *help) {
    memset(s, 0, sizeof *s);
    s->name = name;
    struct option lo[SVC_N_OPTS + 3];
    for (int i = 0; i < SVC_N_OPTS; i++) lo[i] = (struct option){opts[i].flag, required_argument, NULL, 1000 + i};
    lo[SVC_N_OPTS] = (struct option){"set", required_argument, NULL, 's'};
    lo[SVC_N_OPTS + 1] = (struct option){"help", no_argument, NULL, 'h'};
    lo[SVC_N_OPTS + 2] = (struct option){0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c >= 1000 && c < 1000 + SVC_N_OPTS) {
            s->opt[c - 1000] = optarg;
        } else if (c == 's') {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || s->n_extra == 16) {
                fprintf(stderr, "marlaas-%s: --set takes KEY=VALUE\n", name);
                return -1;
            }
            snprintf(s->extra[s->n_extra][0], 256, "%.*s", (int)(eq - optarg), optarg);
            snprintf(s->extra[s->n_extra][1], 256, "%s", eq + 1);
            s->n_extra++;
        } else {
            FILE *f = c == 'h' ? stdout : stderr;
            fprintf(f, "usage: marlaas-%s [options]\n%s\ncommon options (flag / environment / default):\n", name, help);
            for (int i = 0; i < SVC_N_OPTS; i++)
                fprintf(f, "  --%-15s %-24s %s\n", opts[i].flag, opts[i].env, opts[i].def ? opts[i].def : "-");
            return c == 'h' ? 1 : -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "marlaas-%s: unexpected argument '%s'\n", name, argv[optind]);
        return -1;
    }
    for (int i = 0; i < SVC_N_OPTS; i++) {
        if (s->opt[i]) continue;
        const char *e = getenv(opts[i].env);
        s->opt[i] = (e && *e) ? e : opts[i].def;
    }
    if (s->opt[SVC_ID]) snprintf(s->id, sizeof s->id, "%s", s->opt[SVC_ID]);
    else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(s->id, sizeof s->id, "%s-%s-%d", name, host, (int)getpid());
    }
    if (s->opt[SVC_THREADS]) setenv("MARLAAS_THREADS", s->opt[SVC_THREADS], 1);
    char svcname[64];
    snprintf(svcname, sizeof svcname, "%s", name);
    log_init(svcname);
    zsys_init();
    zsys_set_logstream(NULL);
    // czmq installs its own handler that sets zsys_interrupted; ours also catches SIGTERM.
    zsys_handler_set(NULL);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

const char *svc_get(const svc_t *s, svc_opt_t o) { return s->opt[o]; }

void svc_bind_endpoint(const svc_t *s, svc_opt_t o, char *out, size_t n) {
    const char *v = s->opt[o];
    const char *colon = v ? strrchr(v, ':') : NULL;
    if (v && !strncmp(v, "tcp://", 6) && colon && colon > v + 5) snprintf(out, n, "tcp://*:%s", colon + 1);
    else snprintf(out, n, "%s", v ? v : "");
}

const char *svc_extra(const svc_t *s, const char *key, const char *def) {
    for (int i = 0; i < s->n_extra; i++)
        if (!strcmp(s->extra[i][0], key)) return s->extra[i][1];
    return def;
}

store_t *svc_store(const svc_t *s, char *err) {
    char host[256];
    int port = 6379;
    const char *r = s->opt[SVC_REDIS];
    const char *colon = strrchr(r, ':');
    if (colon) {
        snprintf(host, sizeof host, "%.*s", (int)(colon - r), r);
        port = atoi(colon + 1);
    } else {
        snprintf(host, sizeof host, "%s", r);
    }
    return store_new(host, port, s->opt[SVC_PREFIX], err);
}

void svc_heartbeat(const svc_t *s, store_t *st, int ttl, int n, const char **fields, const char **values) {
    char key[256], err[ERR_LEN], now[32];
    const char *f[34], *v[34];
    snprintf(now, sizeof now, "%ld", (long)time(NULL));
    f[0] = "time", v[0] = now;
    f[1] = "service", v[1] = s->name;
    for (int i = 0; i < n && i < 32; i++) f[i + 2] = fields[i], v[i + 2] = values[i];
    if (!store_key(st, key, sizeof key, "svc:%s:%s", s->name, s->id)) return;
    if (store_hset(st, key, (n < 32 ? n : 32) + 2, f, v, err) == 0) store_expire(st, key, ttl, err);
}

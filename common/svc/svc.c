// svc.c - settings, instance ids, Redis connection and heartbeats for the service processes.
#include "common/svc/svc.h"

#include <ctype.h>
#include <czmq.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/net/bus.h"
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
    [SVC_HTTP] = {"http", "MARLAAS_HTTP", NULL},   // per service: see http_default
    [SVC_BACKEND] = {"backend", "MARLAAS_BACKEND", "cpu"},
    [SVC_WEIGHTS] = {"weights", "MARLAAS_WEIGHTS", "auto"},
    [SVC_KEYS] = {"keys", "MARLAAS_KEYS", NULL},
    [SVC_INSECURE] = {"insecure", "MARLAAS_INSECURE", NULL},   // a flag: plain links (see bus.h)
    [SVC_LOG_FORMAT] = {"log-format", "MARLAAS_LOG_FORMAT", "text"},
};

// Default HTTP ports: one per service, so a single host can run all four with no flags.
static const char *http_default(const char *name) {
    if (!strcmp(name, "scheduler")) return "9500";
    if (!strcmp(name, "rollout")) return "9501";
    if (!strcmp(name, "verifier")) return "9502";
    if (!strcmp(name, "trainer")) return "9503";
    return "0";
}

static volatile sig_atomic_t stop_flag;
static char svc_label[64] = "service";

// A service told to stop finishes its loop turn and exits; one blocked in a call that cannot be
// interrupted (a Redis read on a connection whose host vanished waits out its 30 s I/O
// timeout) exits SVC_STOP_DEADLINE_S seconds after the signal anyway. Nothing is lost: the
// state lives in Redis and unfinished work is issued again when its lease ends.
#define SVC_STOP_DEADLINE_S 10
#define STR_(x) #x
#define STR(x) STR_(x)
static const char deadline_msg[] =
    "still busy " STR(SVC_STOP_DEADLINE_S) " s after the stop signal (blocked on a peer or Redis); exiting now";
static void on_deadline(int sig) {
    (void)sig;
    char msg[160];
    int n;
    if (log_get_format() == LOG_JSON) {
        static char line[512];   // log_render allocates and locks nothing
        n = (int)log_render_now(line, sizeof line, LOGL_WARN, NULL, deadline_msg);
        (void)!write(2, line, (size_t)n);
        _exit(3);
    }
    n = snprintf(msg, sizeof msg, "WARN  %s %s\n", svc_label, deadline_msg);
    if (n > 0) (void)!write(2, msg, (size_t)n);
    _exit(3);
}

static void on_signal(int sig) {
    (void)sig;
    if (!stop_flag) alarm(SVC_STOP_DEADLINE_S);
    stop_flag = 1;
}

bool svc_stopping(void) { return stop_flag || zsys_interrupted; }

void svc_http_default(svc_t *s, const char *value) {
    // s->opt[SVC_HTTP] points at http_def exactly when neither flag nor environment set it
    snprintf(s->http_def, sizeof s->http_def, "%s", value);
}

int svc_init(svc_t *s, const char *name, int argc, char **argv, const char *help) {
    memset(s, 0, sizeof *s);
    // A service allocates and frees buffers of the same large sizes every step (a training
    // batch, an adapter's serialisation and its Redis command, a rollout's results): kept in the
    // heap they are reused, while glibc's defaults hand blocks of a few hundred KiB back to the
    // kernel and fault them in again on every step (measured: a fifth of the trainer's CPU on
    // models/micro). Blocks of 32 MiB and more still come from mmap and go back at once.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    s->name = name;
    snprintf(s->http_def, sizeof s->http_def, "%s", http_default(name));
    struct option lo[SVC_N_OPTS + 3];
    for (int i = 0; i < SVC_N_OPTS; i++)
        lo[i] = (struct option){opts[i].flag, i == SVC_INSECURE ? no_argument : required_argument, NULL, 1000 + i};
    lo[SVC_N_OPTS] = (struct option){"set", required_argument, NULL, 's'};
    lo[SVC_N_OPTS + 1] = (struct option){"help", no_argument, NULL, 'h'};
    lo[SVC_N_OPTS + 2] = (struct option){0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c >= 1000 && c < 1000 + SVC_N_OPTS) {
            s->opt[c - 1000] = c == 1000 + SVC_INSECURE ? "1" : optarg;
        } else if (c == 's') {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || s->n_extra == 16) {
                fprintf(stderr, "marlaas-%s: --set takes KEY=VALUE\n", name);
                return -1;
            }
            // a value cut to fit would change its meaning (an allow-list losing entries)
            if (eq - optarg >= 256 || strlen(eq + 1) >= 256) {
                fprintf(stderr, "marlaas-%s: --set %.*s: longer than 255 bytes%s\n", name, (int)(eq - optarg < 64 ? eq - optarg : 64),
                        optarg, !strncmp(optarg, "reward_allow=", 13) ? " (give a long list in MARLAAS_REWARD_ALLOW)" : "");
                return -1;
            }
            snprintf(s->extra[s->n_extra][0], 256, "%.*s", (int)(eq - optarg), optarg);
            snprintf(s->extra[s->n_extra][1], 256, "%s", eq + 1);
            s->n_extra++;
        } else {
            FILE *f = c == 'h' ? stdout : stderr;
            fprintf(f, "usage: marlaas-%s [options]\n%s\ncommon options (flag / environment / default):\n", name, help);
            for (int i = 0; i < SVC_N_OPTS; i++)
                fprintf(f, "  --%-15s %-24s %s\n", opts[i].flag, opts[i].env,
                        i == SVC_HTTP ? s->http_def : opts[i].def ? opts[i].def : "-");
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
        s->opt[i] = (e && *e) ? e : i == SVC_HTTP ? s->http_def : opts[i].def;
    }
    if (s->opt[SVC_ID]) snprintf(s->id, sizeof s->id, "%s", s->opt[SVC_ID]);
    else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(s->id, sizeof s->id, "%s-%s-%d", name, host, (int)getpid());
    }
    if (s->opt[SVC_THREADS]) setenv("MARLAAS_THREADS", s->opt[SVC_THREADS], 1);
    int log_format = log_parse_format(s->opt[SVC_LOG_FORMAT]);
    if (log_format < 0) {
        fprintf(stderr, "marlaas-%s: --log-format / MARLAAS_LOG_FORMAT must be text or json, not '%.40s'\n", name,
                s->opt[SVC_LOG_FORMAT]);
        return -1;
    }
    char svcname[64];
    snprintf(svcname, sizeof svcname, "%s", name);
    log_init(svcname);
    log_set_format(log_format);
    log_set_id(s->id);
    zsys_init();
    zsys_set_logstream(NULL);
    // czmq installs its own handler that sets zsys_interrupted; ours also catches SIGTERM.
    zsys_handler_set(NULL);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    snprintf(svc_label, sizeof svc_label, "%s", name);
    struct sigaction sd = {.sa_handler = on_deadline};
    sigemptyset(&sd.sa_mask);
    sigaction(SIGALRM, &sd, NULL);
    signal(SIGPIPE, SIG_IGN);
    // the links: CURVE with the cluster's keys unless --insecure says plain
    const char *ins = s->opt[SVC_INSECURE];
    if (ins && strcmp(ins, "0") != 0) {
        bus_insecure();
    } else {
        char err[ERR_LEN];
        if (bus_secure(s->opt[SVC_KEYS], name, err)) {
            log_error("%s", err);
            return -1;
        }
        log_info("links secured with CURVE: keys of %s", s->opt[SVC_KEYS]);
    }
    return 0;
}

const char *svc_get(const svc_t *s, svc_opt_t o) { return s->opt[o]; }

void svc_bind_endpoint(const svc_t *s, svc_opt_t o, char *out, size_t n) {
    const char *v = s->opt[o];
    const char *colon = v ? strrchr(v, ':') : NULL;
    // a loopback address stays loopback (a local cluster is not reachable from the network);
    // any other host is this pod's name or address as its peers see it, so bind every interface
    bool loop = v && (!strncmp(v, "tcp://127.", 10) || !strncmp(v, "tcp://localhost:", 16));
    if (v && !strncmp(v, "tcp://", 6) && colon && colon > v + 5)
        snprintf(out, n, "tcp://%s:%s", loop ? "127.0.0.1" : "*", colon + 1);
    else snprintf(out, n, "%s", v ? v : "");
}

const char *svc_extra(const svc_t *s, const char *key, const char *def) {
    for (int i = 0; i < s->n_extra; i++)
        if (!strcmp(s->extra[i][0], key)) return s->extra[i][1];
    // MARLAAS_KEY (the key in capitals) where no --set gives it
    char name[96] = "MARLAAS_";
    size_t n = strlen(name);
    for (const char *k = key; *k && n + 1 < sizeof name; k++) name[n++] = (char)toupper((unsigned char)*k);
    name[n] = 0;
    const char *v = getenv(name);
    return v && *v ? v : def;
}

sim_t *svc_sim_open(const svc_t *s, char *err) {
    const char *b = s->opt[SVC_BACKEND];
    if (!b || strncmp(b, "sim:", 4) != 0 || !b[4]) {
        err_set(err, "--backend %s is not a simulated device (sim:DEVICE)", b ? b : "");
        return NULL;
    }
    char path[4096], e2[ERR_LEN];
    hf_config_t mc;
    snprintf(path, sizeof path, "%s/config.json", s->opt[SVC_MODEL]);
    if (hf_config_load(&mc, path, e2)) {
        err_set(err, "%.200s", e2);
        return NULL;
    }
    char *end;
    const char *sc = svc_extra(s, "sim_scale", "60"), *dv = svc_extra(s, "sim_devices", "1");
    sim_opts_t o = {.scale = strtod(sc, &end), .lengths = svc_extra(s, "sim_lengths", NULL)};
    if (!*sc || *end || !(o.scale > 0)) {
        err_set(err, "--set sim_scale=%.40s: a number > 0 (modelled seconds per wall second)", sc);
        return NULL;
    }
    long d = strtol(dv, &end, 10);
    if (!*dv || *end || d < 1 || d > 4096) {
        err_set(err, "--set sim_devices=%.40s: an integer in 1..4096", dv);
        return NULL;
    }
    o.devices = (int)d;
    const char *co = svc_extra(s, "sim_coalesce_s", "0.001");
    double c = strtod(co, &end);
    if (!*co || *end || !(c >= 0 && c <= 1)) {
        err_set(err, "--set sim_coalesce_s=%.40s: wall seconds in 0..1 (0: one decode step per generator call)", co);
        return NULL;
    }
    o.coalesce_s = c > 0 ? c : -1;
    // --weights: the modelled precision of weights and KV cache (auto: the device's)
    const char *w = s->opt[SVC_WEIGHTS] ? s->opt[SVC_WEIGHTS] : "auto";
    o.weight_bytes = !strcmp(w, "fp32") ? 4 : !strcmp(w, "bf16") ? 2 : 0;
    return sim_open(b + 4, &mc, &o, err);
}

static void redis_addr(const svc_t *s, char *host, size_t n, int *port) {
    const char *r = s->opt[SVC_REDIS];
    const char *colon = strrchr(r, ':');
    *port = 6379;
    if (colon) {
        snprintf(host, n, "%.*s", (int)(colon - r), r);
        *port = atoi(colon + 1);
    } else {
        snprintf(host, n, "%s", r);
    }
}

endpoint_rules_t *svc_endpoint_rules(const svc_t *s, char *err) {
    const char *allow = svc_extra(s, "reward_allow", NULL);
    if (!allow) allow = getenv("MARLAAS_REWARD_ALLOW");
    char why[ERR_LEN];
    endpoint_rules_t *r = endpoint_rules_new(allow, why);
    if (!r) {
        err_set(err, "reward_allow: %s", why);
        return NULL;
    }
    static const struct {
        svc_opt_t o;
        const char *label;
    } own[] = {
        {SVC_API, "the scheduler's API (--api)"},
        {SVC_WORK, "the scheduler's work port (--work)"},
        {SVC_EVENTS, "the scheduler's event port (--events)"},
        {SVC_REPORTS, "the scheduler's report port (--reports)"},
        {SVC_VERIFIERS, "a verifier's port (--verifiers)"},
        {SVC_TRAINER, "the trainer's port (--trainer)"},
        {SVC_TRAINER_EVENTS, "the trainer's event port (--trainer-events)"},
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (endpoint_rules_deny(r, s->opt[own[i].o], own[i].label, err)) goto fail;
    char host[256], port[16];
    int p;
    redis_addr(s, host, sizeof host, &p);
    snprintf(port, sizeof port, "%d", p);
    if (endpoint_rules_deny(r, port, "the cluster's Redis (--redis)", err)) goto fail;
    const char *dp = svc_extra(s, "dp_endpoint", "");
    if (*dp && endpoint_rules_deny(r, dp, "the trainer's data-parallel port (dp_endpoint)", err)) goto fail;
    return r;
fail:
    endpoint_rules_destroy(&r);
    return NULL;
}

store_t *svc_store(const svc_t *s, char *err) {
    char host[256];
    int port;
    redis_addr(s, host, sizeof host, &port);
    // the password from the environment only (a flag would show in `ps`)
    const char *pw = getenv("MARLAAS_REDIS_PASSWORD");
    if (pw && !strcmp(pw, "replace-with-a-random-password")) {
        err_set(err, "MARLAAS_REDIS_PASSWORD is the placeholder of deploy/k8s/base/config.yaml: set the Secret "
                     "marlaas-redis to a random password");
        return NULL;
    }
    store_t *st = store_new_auth(host, port, s->opt[SVC_PREFIX], getenv("MARLAAS_REDIS_USER"), pw, err);
    store_set_abort(st, svc_stopping);
    return st;
}

// /readyz pings Redis on a connection of its own with a 1 s timeout: the main loop would notice
// a stopped Redis only when its own call times out (STORE_IO_TIMEOUT_MS).
typedef struct {
    pthread_mutex_t mu;
    char host[256];
    int port;
    redisContext *c;
} probe_t;
static probe_t probe = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool redis_check(void *ctx, char *why, size_t n) {
    (void)ctx;
    pthread_mutex_lock(&probe.mu);
    struct timeval tv = {1, 0};
    if (!probe.c) {
        probe.c = redisConnectWithTimeout(probe.host, probe.port, tv);
        if (probe.c && !probe.c->err) redisSetTimeout(probe.c, tv);
        char e2[ERR_LEN];
        if (probe.c && !probe.c->err &&
            store_redis_auth(probe.c, getenv("MARLAAS_REDIS_USER"), getenv("MARLAAS_REDIS_PASSWORD"), e2)) {
            snprintf(why, n, "Redis at %s:%d: %s (check --redis / MARLAAS_REDIS and the Redis server)", probe.host,
                     probe.port, e2);
            redisFree(probe.c);
            probe.c = NULL;
            pthread_mutex_unlock(&probe.mu);
            return false;
        }
    }
    bool ok = false;
    if (probe.c && !probe.c->err) {
        redisReply *r = redisCommand(probe.c, "PING");
        ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
        if (r) freeReplyObject(r);
    }
    if (!ok) {
        snprintf(why, n, "Redis at %s:%d does not answer (%s; check --redis / MARLAAS_REDIS and the Redis server)",
                 probe.host, probe.port, probe.c && probe.c->errstr[0] ? probe.c->errstr : "no reply");
        if (probe.c) redisFree(probe.c);
        probe.c = NULL;
    }
    pthread_mutex_unlock(&probe.mu);
    return ok;
}

static void update_ready(svc_t *s) {
    char why[400];
    if (!s->redis_ok) snprintf(why, sizeof why, "Redis at %s is unreachable (check --redis / MARLAAS_REDIS)", s->opt[SVC_REDIS]);
    else snprintf(why, sizeof why, "%s", s->not_ready);
    metrics_ready(s->met, s->ready_self && s->redis_ok, why);
}

int svc_heartbeat(svc_t *s, store_t *st, int ttl, int n, const char **fields, const char **values) {
    char key[256], err[ERR_LEN], now[32];
    const char *f[34], *v[34];
    snprintf(now, sizeof now, "%ld", (long)time(NULL));
    f[0] = "time", v[0] = now;
    f[1] = "service", v[1] = s->name;
    for (int i = 0; i < n && i < 32; i++) f[i + 2] = fields[i], v[i + 2] = values[i];
    if (!store_key(st, key, sizeof key, "svc:%s:%s", s->name, s->id)) return -1;
    bool ok = store_hset(st, key, (n < 32 ? n : 32) + 2, f, v, err) == 0 && store_expire(st, key, ttl, err) == 0;
    if (ok != s->redis_ok) {
        if (ok) log_info("Redis reachable again");
        else log_warn("heartbeat not written: %s (not ready until Redis answers)", err);
    }
    s->redis_ok = ok;
    metrics_set(s->met, s->m_redis_up, NULL, ok);
    if (!ok) metrics_add(s->met, s->m_errors, NULL, 1);
    update_ready(s);
    return ok ? 0 : -1;
}

int svc_serve(svc_t *s, char *err) {
    s->met = metrics_new(s->name, s->id);
    s->redis_ok = true;
    snprintf(s->not_ready, sizeof s->not_ready, "starting (loading the model, connecting)");
    s->m_redis_up = metrics_def(s->met, "marlaas_redis_up", MET_GAUGE, "1 when the last write to Redis succeeded.");
    s->m_busy_s = metrics_def(s->met, "marlaas_busy_seconds_total", MET_COUNTER, "Seconds spent computing.");
    s->m_busy_frac = metrics_def(s->met, "marlaas_busy_fraction", MET_GAUGE,
                                 "Busy seconds divided by uptime, over the last 10 seconds.");
    s->m_received = metrics_def(s->met, "marlaas_messages_received_total", MET_COUNTER,
                                "Messages taken from the service's input socket(s).");
    s->m_rejected = metrics_def(s->met, "marlaas_messages_rejected_total", MET_COUNTER,
                                "Input messages dropped as malformed or unusable.");
    s->m_errors = metrics_def(s->met, "marlaas_errors_total", MET_COUNTER,
                              "Errors of any kind: rejected input, failed tasks, sends that found no peer, Redis failures.");
    s->m_queue = metrics_def(s->met, "marlaas_queue_depth", MET_GAUGE, "Work items waiting in this service.");
    metrics_set(s->met, s->m_redis_up, NULL, 1);
    const char *stall = getenv("MARLAAS_STALL_S");
    if (stall && *stall) metrics_set_stall(s->met, atof(stall));
    update_ready(s);
    redis_addr(s, probe.host, sizeof probe.host, &probe.port);
    metrics_set_check(s->met, redis_check, NULL);
    s->http = http_start(s->opt[SVC_HTTP], s->met, err);
    if (!s->http && err[0]) return -1;
    if (s->http) log_info("serving /healthz /readyz /metrics on port %d", http_port(s->http));
    return 0;
}

store_t *svc_open(svc_t *s) {
    char err[ERR_LEN];
    store_t *st = NULL;
    if (svc_serve(s, err) == 0) st = svc_store(s, err);
    if (!st) {
        log_error("%s", err);
        svc_close(s);
    }
    return st;
}

void svc_ready(svc_t *s, bool ready, const char *why_not) {
    if (s->ready_self == ready && (ready || !strcmp(s->not_ready, why_not ? why_not : ""))) return;
    s->ready_self = ready;
    snprintf(s->not_ready, sizeof s->not_ready, "%s", ready ? "" : why_not ? why_not : "not ready");
    update_ready(s);
}

// Rejections are logged one line per reason and period: the first at once, the rest counted and
// summed up in one line when the period ends (a flood of bad frames costs a line every
// SVC_REJECT_LOG_S seconds, not one per frame). The reason is the message up to its detail
// (" (" or ": "), with the job.
#define SVC_REJECT_LOG_S 5.0
#define SVC_REJECT_REASONS 32
static struct {
    char reason[96], job[64];
    double first;        // start of the period
    uint64_t more;       // rejections since the line that opened the period
    bool used;
} rej[SVC_REJECT_REASONS];
static int rej_open;     // reasons with a period running (svc_tick looks only when there are)

static void rej_flush(int i, double now) {
    if (rej[i].more)
        LOG_AT(LOGL_WARN, rej[i].job[0] ? rej[i].job : NULL, "%s: %llu more in the last %.0f s (one line per %.0f s)",
               rej[i].reason, (unsigned long long)rej[i].more, now - rej[i].first, SVC_REJECT_LOG_S);
    rej[i].more = 0;
    if (rej[i].used) rej_open--;
    rej[i].used = false;
}

void svc_tick(svc_t *s) {
    metrics_alive(s->met);
    if (!rej_open) return;
    double now = util_now();
    for (int i = 0; i < SVC_REJECT_REASONS; i++)
        if (rej[i].used && now - rej[i].first >= SVC_REJECT_LOG_S) rej_flush(i, now);
}

void svc_busy(svc_t *s, double busy_s, double up_s) {
    metrics_set(s->met, s->m_busy_s, NULL, busy_s);
    metrics_set(s->met, s->m_busy_frac, NULL, met_window_rate(&s->busy_win, up_s, busy_s, 10.0));
}

void svc_received(svc_t *s) {
    s->received++;
    metrics_add(s->met, s->m_received, NULL, 1);
}

void svc_reject(svc_t *s, const char *job, const char *fmt, ...) {
    char msg[ERR_LEN + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->rejected++;
    metrics_add(s->met, s->m_rejected, NULL, 1);
    metrics_add(s->met, s->m_errors, NULL, 1);
    char reason[96];
    size_t cut = strcspn(msg, "(:");
    snprintf(reason, sizeof reason, "%.*s", (int)(cut > 0 && msg[cut - 1] == ' ' ? cut - 1 : cut), msg);
    double now = util_now();
    int slot = -1, oldest = 0;
    for (int i = 0; i < SVC_REJECT_REASONS; i++) {
        if (rej[i].used && !strcmp(rej[i].reason, reason) && !strcmp(rej[i].job, job ? job : "")) {
            slot = i;
            break;
        }
        if (!rej[i].used || (rej[oldest].used && rej[i].first < rej[oldest].first)) oldest = i;
    }
    if (slot >= 0 && now - rej[slot].first < SVC_REJECT_LOG_S) {
        rej[slot].more++;
        return;
    }
    if (slot >= 0) rej_flush(slot, now);
    else if (rej[oldest].used) rej_flush(oldest, now);
    slot = slot >= 0 ? slot : oldest;
    snprintf(rej[slot].reason, sizeof rej[slot].reason, "%s", reason);
    snprintf(rej[slot].job, sizeof rej[slot].job, "%s", job ? job : "");
    rej[slot].first = now;
    rej[slot].more = 0;
    rej[slot].used = true;
    rej_open++;
    LOG_AT(LOGL_WARN, job, "%s", msg);
}

void svc_close(svc_t *s) {
    http_stop(&s->http);
    metrics_destroy(&s->met);
    pthread_mutex_lock(&probe.mu);
    if (probe.c) redisFree(probe.c);
    probe.c = NULL;
    pthread_mutex_unlock(&probe.mu);
    bus_secure_end();
}

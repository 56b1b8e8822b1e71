// cmd_cluster.c - `marlaas up` / `down` / `demo`: a local cluster of a private redis-server and
// the four services, with logs, pid files and the connection settings in a run directory.
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "cli/cli.h"
#include "cli/client.h"
#include "common/net/bus.h"
#include "common/net/store.h"
#include "common/rl/batch.h"   // RL_MAX_LANES
#include <czmq.h>

typedef struct {
    const char *run, *model, *policy;
    long port_base, redis_port, steps, threads, lanes, rollouts, verifiers;
    bool insecure;
    const char *backend;   // --backend for every service (NULL: the environment's MARLAAS_BACKEND, else cpu)
} cluster_opts_t;

static const char *services[4] = {"scheduler", "verifier", "trainer", "rollout"};

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

// Starts argv[0] detached (own session) with output to log; returns its pid.
static pid_t spawn(char *const argv[], const char *log, char *const extra_env[]) {
    pid_t p = fork();
    if (p != 0) return p;
    setsid();
    FILE *f = fopen(log, "a");
    if (f) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
    }
    for (int i = 0; extra_env && extra_env[i]; i++) putenv(extra_env[i]);
    execvp(argv[0], argv);
    fprintf(stderr, "cannot start %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

#define MAX_PROCS 160   // redis, the four services and up to 128 more rollouts and 16 more verifiers

// Replica k of a service (its log NAMEk.log), recorded in the pid file.
static void spawn_replica(const char *name, long k, const char *bdir, const char *logs, char *const extra[], FILE *pf) {
    char exe[4200], log[4200];
    snprintf(exe, sizeof exe, "%s/marlaas-%s", bdir, name);
    snprintf(log, sizeof log, "%s/%s%ld.log", logs, name, k);
    char *argv[] = {exe, NULL};
    pid_t p = spawn(argv, log, extra);
    fprintf(pf, "%s %d\n", name, (int)p);
    fflush(pf);
}

static int read_pids(const char *run, char names[MAX_PROCS][32], pid_t pids[MAX_PROCS]) {
    char path[4096];
    snprintf(path, sizeof path, "%s/pids", run);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < MAX_PROCS && fscanf(f, "%31s %d", names[n], &pids[n]) == 2) n++;
    if (f) fclose(f);
    return n;
}

// Whether process pid still runs: it exists and has not exited. A service of a cluster started by
// an earlier `marlaas up` is not this process's child, so once it exits it stays a zombie until
// the system's init reaps it (once a second in some containers): a zombie has stopped.
static bool running(pid_t pid) {
    if (kill(pid, 0) != 0) return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;   // no /proc: trust kill
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *e = strrchr(buf, ')');   // "pid (comm) state ...": comm may hold spaces or ')'
    return !(e && e[1] == ' ' && (e[2] == 'Z' || e[2] == 'X'));
}

static int cluster_down(const char *run, bool quiet) {
    static char names[MAX_PROCS][32];
    static pid_t pids[MAX_PROCS];
    int n = read_pids(run, names, pids);
    if (n == 0) {
        if (!quiet) fprintf(stderr, "marlaas down: no cluster recorded in %s/pids\n", run);
        return quiet ? 0 : 1;
    }
    // services first (they flush state to Redis), Redis last
    for (int i = n - 1; i >= 0; i--) kill(pids[i], SIGTERM);
    for (int w = 0; w < 50; w++) {
        int alive = 0;
        for (int i = 0; i < n; i++) alive += running(pids[i]);
        if (!alive) break;
        usleep(100000);
    }
    for (int i = 0; i < n; i++)
        if (running(pids[i])) kill(pids[i], SIGKILL);
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    char path[4096];
    snprintf(path, sizeof path, "%s/pids", run);
    unlink(path);
    if (!quiet) fprintf(stderr, "down: stopped %d processes\n", n);
    return 0;
}

static int cluster_up(const cluster_opts_t *o, char admin[65]) {
    char err[ERR_LEN], path[4096], bdir[4096], logs[4096];
    if (util_mkdirs(o->run, err)) {
        fprintf(stderr, "marlaas up: %s\n", err);
        return -1;
    }
    static char names[MAX_PROCS][32];
    static pid_t pids[MAX_PROCS];
    int n_old = read_pids(o->run, names, pids);
    for (int i = 0; i < n_old; i++)
        if (kill(pids[i], 0) == 0) {
            fprintf(stderr, "marlaas up: a cluster is already running in %s (marlaas down first)\n", o->run);
            return -1;
        }
    snprintf(logs, sizeof logs, "%s/logs", o->run);
    snprintf(path, sizeof path, "%s/redis", o->run);
    if (util_mkdirs(logs, err) || util_mkdirs(path, err)) {
        fprintf(stderr, "marlaas up: %s\n", err);
        return -1;
    }
    cli_bin_dir(bdir, sizeof bdir);
    int rport = o->redis_port > 0 ? (int)o->redis_port : free_port();
    char rlog[4200], rconf[4200];
    snprintf(rlog, sizeof rlog, "%s/redis.log", logs);
    // Redis on loopback with a password and an append-only file that every write reaches (the
    // kernel's page cache) before Redis answers it: `down` and `up` again, or a crash of
    // redis-server or of a service, lose no tenant, job, adapter or id counter
    // (test_failures.sh, scenario d). The kernel writes the file to disk on its own schedule
    // (appendfsync no), so only a crash of the machine itself can lose the last seconds. Every
    // training step writes the job's adapter and optimiser state (about 225 KB on models/micro):
    // 32 jobs on 2 cores (bench/e2e.sh async 32) took 78.0 s with an fsync at every write and
    // 68.2 s without. appendfsync everysec, as the Kubernetes and Compose deployments have it, is
    // as fast but may hold a write back for up to 2 s while a background fsync runs, after the
    // answer: a SIGKILLed redis-server then lost a step that had been acknowledged. The file is
    // rewritten once it doubles and passes 256 MB (Redis's 64 MB default: every 2 s here, a fork
    // and a copy each time; 80.2-83.3 against 72.3 s with fsync once a second).
    // The password sits in a 0600 config file (not on the command line, where `ps` shows it).
    unsigned char pw_rnd[24];
    char rpass[49];
    if (sodium_init() < 0) return -1;
    randombytes_buf(pw_rnd, sizeof pw_rnd);
    sodium_bin2hex(rpass, sizeof rpass, pw_rnd, sizeof pw_rnd);
    snprintf(rconf, sizeof rconf, "%s/redis.conf", path);
    int rfd = open(rconf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FILE *rf = rfd >= 0 && fchmod(rfd, 0600) == 0 ? fdopen(rfd, "w") : NULL;
    if (!rf) {
        fprintf(stderr, "marlaas up: cannot write %s\n", rconf);
        if (rfd >= 0) close(rfd);
        return -1;
    }
    fprintf(rf, "port %d\nbind 127.0.0.1\nprotected-mode yes\ndir \"%s\"\nsave \"\"\nappendonly yes\n"
                "appendfsync no\nauto-aof-rewrite-min-size 256mb\nrequirepass %s\n", rport, path, rpass);
    fclose(rf);
    char *rargv[] = {"redis-server", rconf, NULL};
    pid_t all[5];
    all[0] = spawn(rargv, rlog, NULL);
    // the run directory's pid file is written as processes start, so `down` always finds them
    snprintf(path, sizeof path, "%s/pids", o->run);
    FILE *pf = fopen(path, "w");
    if (!pf) {
        fprintf(stderr, "marlaas up: cannot write %s\n", path);
        kill(all[0], SIGKILL);
        return -1;
    }
    fprintf(pf, "redis %d\n", (int)all[0]);
    fflush(pf);
    store_t *st = NULL;
    for (int i = 0; i < 50 && !st; i++) {
        usleep(100000);
        st = store_new_auth("127.0.0.1", rport, NULL, NULL, rpass, err);
    }
    if (!st) {
        fprintf(stderr, "marlaas up: redis-server did not start (%s; see %s)\n", err, rlog);
        fclose(pf);
        cluster_down(o->run, true);
        return -1;
    }
    store_destroy(&st);
    unsigned char rnd[24];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(admin, 49, rnd, sizeof rnd);
    // a fresh CURVE keypair per service for this run (or plain links with --insecure)
    char keys[4200], sec_env[4300];
    snprintf(keys, sizeof keys, "%s/keys", o->run);
    if (o->insecure) {
        snprintf(sec_env, sizeof sec_env, "MARLAAS_INSECURE=1");
        fprintf(stderr, "up: --insecure: the services' links are plain ZeroMQ, open to anyone who reaches the ports\n");
    } else {
        for (int i = 0; i < 4; i++) {   // the last run's keys
            char f[4400];
            snprintf(f, sizeof f, "%s/%s.key", keys, services[i]);
            unlink(f);
            snprintf(f, sizeof f, "%s/%s.key_secret", keys, services[i]);
            unlink(f);
        }
        if (bus_keys_generate(keys, err)) {
            fprintf(stderr, "marlaas up: cannot make the CURVE keys in %s: %s\n", keys, err);
            fclose(pf);
            cluster_down(o->run, true);
            return -1;
        }
        snprintf(sec_env, sizeof sec_env, "MARLAAS_KEYS=%s", keys);
    }
    // this process's API client too
    if (o->insecure) setenv("MARLAAS_INSECURE", "1", 1), unsetenv("MARLAAS_KEYS");
    else setenv("MARLAAS_KEYS", keys, 1), unsetenv("MARLAAS_INSECURE");
    long b = o->port_base;
    char env[10][300];
    snprintf(env[9], 300, "MARLAAS_REDIS_PASSWORD=%s", rpass);
    snprintf(env[0], 300, "MARLAAS_REDIS=127.0.0.1:%d", rport);
    snprintf(env[1], 300, "MARLAAS_API=tcp://127.0.0.1:%ld", b);
    snprintf(env[2], 300, "MARLAAS_WORK=tcp://127.0.0.1:%ld", b + 1);
    snprintf(env[3], 300, "MARLAAS_EVENTS=tcp://127.0.0.1:%ld", b + 2);
    snprintf(env[4], 300, "MARLAAS_REPORTS=tcp://127.0.0.1:%ld", b + 3);
    // verifier i listens on port base + 10 (the first) or base + 50 + i; the others get the list
    char vlist[1200], vown[64];
    int vl = snprintf(vlist, sizeof vlist, "MARLAAS_VERIFIERS=tcp://127.0.0.1:%ld", b + 10);
    for (long i = 1; i < o->verifiers; i++) vl += snprintf(vlist + vl, sizeof vlist - (size_t)vl, ",tcp://127.0.0.1:%ld", b + 50 + i);
    snprintf(env[5], 300, "MARLAAS_VERIFIERS=tcp://127.0.0.1:%ld", b + 10);
    snprintf(env[6], 300, "MARLAAS_TRAINER=tcp://127.0.0.1:%ld", b + 20);
    snprintf(env[7], 300, "MARLAAS_TRAINER_EVENTS=tcp://127.0.0.1:%ld", b + 21);
    snprintf(env[8], 300, "MARLAAS_ADMIN_TOKEN=%s", admin);
    char envf[4200];
    snprintf(envf, sizeof envf, "%s/env", o->run);
    // private from its creation: it holds the admin token and the Redis password
    int efd = open(envf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FILE *ef = efd >= 0 && fchmod(efd, 0600) == 0 ? fdopen(efd, "w") : NULL;
    if (!ef && efd >= 0) close(efd);
    for (int i = 0; ef && i < 10; i++) fprintf(ef, "%s\n", env[i]);
    if (ef && o->backend) fprintf(ef, "MARLAAS_BACKEND=%s\n", o->backend);
    if (ef) fprintf(ef, "MARLAAS_MODEL=%s\n%s\n", o->model, sec_env), fclose(ef);
    chmod(envf, 0600);
    char model_env[4200], policy_env[64], threads_env[64];
    snprintf(model_env, sizeof model_env, "MARLAAS_MODEL=%s", o->model);
    snprintf(policy_env, sizeof policy_env, "MARLAAS_POLICY=%s", o->policy);
    // One compute thread per service by default (--threads 1). --threads 0 lets every service use
    // every core (the cores this process may run on, or MARLAAS_THREADS). Measured on a 2-core
    // Xeon, the benchmark's 32 jobs on models/micro (bench/e2e.sh): async 167.1 s with every core
    // against 165.6 s with one thread, at 266 against 208 CPU-seconds; the one-by-one baseline
    // 258.6 s against 219.5 s: micro's 64-wide products gain less from a second thread than the
    // pool's hand-offs cost, and a pool thread the OS preempts in the middle of a chunk holds up
    // its loop for a time slice.
    snprintf(threads_env, sizeof threads_env, "MARLAAS_THREADS=%d", o->threads > 0 ? (int)o->threads : util_threads());
    // The trainer's lanes (--lanes; 0: every core when each service computes on one thread and the
    // backend is the CPU's): with many jobs it computes that many passes at once, one thread each,
    // so the cores the rollout leaves idle train other jobs; with one job (the one-by-one policy)
    // only one lane has work.
    const char *be = o->backend ? o->backend : getenv("MARLAAS_BACKEND");
    long lanes = o->lanes > 0 ? o->lanes : (o->threads == 1 && (!be || !*be || !strcmp(be, "cpu")) ? util_threads() : 1);
    if (lanes > RL_MAX_LANES) lanes = RL_MAX_LANES;
    char lanes_env[64];
    snprintf(lanes_env, sizeof lanes_env, "MARLAAS_LANES=%ld", lanes);
    char http_env[64], console_env[64] = "MARLAAS_CONSOLE=off";
    // --backend: every service's (a simulated cluster needs it in all four: sim:DEVICE)
    char backend_env[160];
    snprintf(backend_env, sizeof backend_env, "MARLAAS_BACKEND=%s", o->backend ? o->backend : "");
    char *extra[19] = {env[0], env[1], env[2], env[3], env[4], vlist, env[6], env[7], env[8], env[9],
                       model_env, policy_env, threads_env, http_env, sec_env, console_env, lanes_env,
                       o->backend ? backend_env : NULL, NULL};
    // the web console: the scheduler's, on loopback, port base + 40 (written to RUN/console)
    char consolef[4200];
    snprintf(consolef, sizeof consolef, "%s/console", o->run);
    FILE *cf = fopen(consolef, "w");
    if (cf) fprintf(cf, "http://127.0.0.1:%ld/\n", b + 40), fclose(cf);
    // each service's /healthz /readyz /metrics on loopback, port base + 30 + i; listed in RUN/http
    char httpf[4200];
    snprintf(httpf, sizeof httpf, "%s/http", o->run);
    FILE *hf = fopen(httpf, "w");
    for (int i = 0; i < 4; i++) {
        char exe[4200], log[4200];
        snprintf(http_env, sizeof http_env, "MARLAAS_HTTP=127.0.0.1:%ld", b + 30 + i);
        if (i == 0) snprintf(console_env, sizeof console_env, "MARLAAS_CONSOLE=127.0.0.1:%ld", b + 40);
        else snprintf(console_env, sizeof console_env, "MARLAAS_CONSOLE=off");
        if (hf) fprintf(hf, "%s 127.0.0.1:%ld\n", services[i], b + 30 + i);
        snprintf(exe, sizeof exe, "%s/marlaas-%s", bdir, services[i]);
        snprintf(log, sizeof log, "%s/%s.log", logs, services[i]);
        char *argv[] = {exe, NULL};
        extra[5] = !strcmp(services[i], "verifier") ? env[5] : vlist;   // a verifier binds its own
        all[i + 1] = spawn(argv, log, extra);
        fprintf(pf, "%s %d\n", services[i], (int)all[i + 1]);
        fflush(pf);
    }
    // more replicas (--verifiers N, --rollouts N): the same settings, no HTTP endpoint of their own;
    // a verifier listens on its own port
    snprintf(http_env, sizeof http_env, "MARLAAS_HTTP=0");
    snprintf(console_env, sizeof console_env, "MARLAAS_CONSOLE=off");
    for (long i = 1; i < o->verifiers; i++) {
        snprintf(vown, sizeof vown, "MARLAAS_VERIFIERS=tcp://127.0.0.1:%ld", b + 50 + i);
        extra[5] = vown;
        spawn_replica("verifier", i + 1, bdir, logs, extra, pf);
    }
    extra[5] = vlist;
    for (long i = 1; i < o->rollouts; i++) spawn_replica("rollout", i + 1, bdir, logs, extra, pf);
    fclose(pf);
    if (hf) fclose(hf);
    // ready when the scheduler answers
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%ld", b);
    client_t *c = client_new(ep, admin, 500, err);
    bool ok = false;
    for (int i = 0; i < 40 && c && !ok; i++) {
        proto_rep_t rep;
        char e2[ERR_LEN] = "";
        int rc = client_call(c, "ping", NULL, &rep, e2);
        if (rc == 0) proto_rep_free(&rep);
        ok = rc == 0 || strstr(e2, "token");
        for (int k = 1; k < 5 && !ok; k++)
            if (waitpid(all[k], NULL, WNOHANG) == all[k]) {
                fprintf(stderr, "marlaas up: %s exited at start; see %s/%s.log\n", services[k - 1], logs, services[k - 1]);
                client_destroy(&c);
                cluster_down(o->run, true);
                return -1;
            }
    }
    client_destroy(&c);
    if (!ok) {
        fprintf(stderr, "marlaas up: the scheduler does not answer; see %s/scheduler.log\n", logs);
        cluster_down(o->run, true);
        return -1;
    }
    fprintf(stderr, "up: redis-server on 127.0.0.1:%d, API on %s, model %s, policy %s; logs in %s, settings in %s; "
            "metrics at http://127.0.0.1:%ld..%ld/metrics (%s)\n"
            "up: web console at http://127.0.0.1:%ld/ (log in with a tenant token, or the admin token in %s: read-only)\n",
            rport, ep, o->model, o->policy, logs, envf, b + 30, b + 33, httpf, b + 40, envf);
    return 0;
}

static int parse(int argc, char **argv, cluster_opts_t *o, const char *usage) {
    *o = (cluster_opts_t){.run = "run", .model = cli_default_model(), .policy = "async", .port_base = 7000, .steps = 100,
                           .threads = 1, .rollouts = 1, .verifiers = 1};
    static struct option lo[] = {{"run-dir", required_argument, 0, 'r'}, {"model", required_argument, 0, 'm'},
                                 {"policy", required_argument, 0, 'p'}, {"port-base", required_argument, 0, 'b'},
                                 {"redis-port", required_argument, 0, 'R'}, {"steps", required_argument, 0, 's'},
                                 {"threads", required_argument, 0, 't'}, {"insecure", no_argument, 0, 'I'},
                                 {"rollouts", required_argument, 0, 'n'}, {"backend", required_argument, 0, 'B'},
                                 {"verifiers", required_argument, 0, 'V'}, {"lanes", required_argument, 0, 'L'},
                                 {"help", no_argument, 0, 'h'}, {0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'r') o->run = optarg;
        else if (c == 'm') o->model = optarg;
        else if (c == 'p') o->policy = optarg;
        else if (c == 'I') o->insecure = true;
        else if (c == 'B') o->backend = optarg;
        else if (c == 'n') {
            if (cli_int("--rollouts", optarg, 1, 128, &o->rollouts)) return -1;
        } else if (c == 'V') {
            if (cli_int("--verifiers", optarg, 1, 16, &o->verifiers)) return -1;
        }
        else if (c == 'b') {
            if (cli_int("--port-base", optarg, 1024, 65000, &o->port_base)) return -1;
        } else if (c == 'R') {
            if (cli_int("--redis-port", optarg, 1024, 65535, &o->redis_port)) return -1;
        } else if (c == 's') {
            if (cli_int("--steps", optarg, 1, 100000, &o->steps)) return -1;
        } else if (c == 't') {
            if (cli_int("--threads", optarg, 0, 256, &o->threads)) return -1;
        } else if (c == 'L') {
            if (cli_int("--lanes", optarg, 0, RL_MAX_LANES, &o->lanes)) return -1;
        } else {
            printf("usage: %s\n", usage);
            return c == 'h' ? 1 : -1;
        }
    }
    if (strcmp(o->policy, "async") && strcmp(o->policy, "sync")) {
        fprintf(stderr, "marlaas: --policy must be async or sync\n");
        return -1;
    }
    return optind < argc ? -1 : 0;
}

int cmd_up(int argc, char **argv) {
    cluster_opts_t o;
    int rc = parse(argc, argv, &o, "marlaas up [--run-dir run] [--model models/tiny] [--policy async|sync] [--port-base 7000]\n"
                   "           [--insecure]   (plain links between the services: no CURVE keys)\n"
                   "           [--threads 1]  (compute threads of each service; 0: every core it may run on, shared\n"
                   "                          with the others: suits one busy service per node, not small models)\n"
                   "           [--lanes 0]    (training passes the trainer computes at once, one thread each, on\n"
                   "                          different jobs; 0: every core with --threads 1 on the cpu backend, else 1)\n"
                   "           [--rollouts 1] [--verifiers 1] (replicas)\n"
                   "           [--backend cpu|sim:DEVICE] (every service's; sim:h100 with a models/sim/ folder:\n"
                   "                          a simulated cluster, docs/SIMULATOR.md)");
    if (rc) return rc > 0 ? 0 : 2;
    char admin[65];
    return cluster_up(&o, admin) ? 1 : 0;
}

int cmd_down(int argc, char **argv) {
    cluster_opts_t o;
    int rc = parse(argc, argv, &o, "marlaas down [--run-dir run]");
    if (rc) return rc > 0 ? 0 : 2;
    return cluster_down(o.run, false);
}

// --- demo ------------------------------------------------------------------------------------------

static volatile sig_atomic_t interrupted;
static void on_int(int s) {
    (void)s;
    interrupted = 1;
}

static int run_cmd(char *const argv[]) {
    pid_t p = fork();
    if (p == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int cmd_demo(int argc, char **argv) {
    cluster_opts_t o;
    int rc = parse(argc, argv, &o, "marlaas demo [--run-dir run] [--model models/tiny] [--policy async|sync] [--steps 100]");
    if (rc) return rc > 0 ? 0 : 2;
    // czmq installs its own SIGINT handler on first use; ours must be the one in force
    zsys_init();
    zsys_handler_set(NULL);
    struct sigaction sa = {.sa_handler = on_int};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    char admin[65], err[ERR_LEN], data[4200];
    // the demo starts from an empty store, so the jobs of an earlier, interrupted demo do not run
    // again beside its own (its Redis files are removed; `marlaas up` keeps them)
    snprintf(data, sizeof data, "%s/redis", o.run);
    if (nftw(data, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) {
        fprintf(stderr, "marlaas demo: cannot clear %s: %s\n", data, strerror(errno));
        return 1;
    }
    if (cluster_up(&o, admin)) return 1;
    setenv("MARLAAS_RUN_DIR", o.run, 1);
    rc = 1;
    static const char *tasks[4] = {"vowels", "len", "wrap", "rep"};
    static const char *tenants[2] = {"alice", "bob"};
    char tokens[2][128], jobs[4][64];
    long demo_steps = o.steps;
    client_t *c = client_new(client_endpoint(NULL), admin, 10000, err);
    for (int t = 0; t < 2 && c; t++) {
        proto_args_t a = {0};
        proto_args_str(&a, "name", tenants[t]);
        proto_rep_t rep;
        if (client_call(c, "tenant_create", &a, &rep, err)) goto done;
        snprintf(tokens[t], sizeof tokens[t], "%s", proto_args_get_str(&rep.result, "token"));
        proto_rep_free(&rep);
    }
    client_destroy(&c);
    for (int i = 0; i < 4; i++) {
        c = client_new(client_endpoint(NULL), tokens[i % 2], 10000, err);
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"task\": \"%s\", \"max_steps\": %ld, \"prompts\": 64, \"group\": 8, \"temperature\": 1.3,"
                 " \"lr\": 0.003, \"eval_every\": 25, \"eval_n\": 400}", tasks[i], demo_steps);
        proto_args_t a = {0};
        proto_args_str(&a, "spec", spec);
        proto_rep_t rep;
        if (!c || client_call(c, "job_submit", &a, &rep, err)) goto done;
        snprintf(jobs[i], sizeof jobs[i], "%s", proto_args_get_str(&rep.result, "job"));
        proto_rep_free(&rep);
        client_destroy(&c);
        fprintf(stderr, "demo: tenant %s submitted %s on task %s\n", tenants[i % 2], jobs[i], tasks[i]);
    }
    // the web console: the tenants' tokens in a file of the run directory (owner only)
    {
        char tf[4200];
        snprintf(tf, sizeof tf, "%s/demo-tokens", o.run);
        int fd = open(tf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        for (int t = 0; f && t < 2; t++) fprintf(f, "%s %s\n", tenants[t], tokens[t]);
        if (f) fclose(f);
        fprintf(stderr, "demo: web console at http://127.0.0.1:%ld/ : log in with a tenant's token from %s\n",
                o.port_base + 40, tf);
    }
    // watch both tenants' jobs until all finish
    char bdir[4096], exe[4200];
    cli_bin_dir(bdir, sizeof bdir);
    snprintf(exe, sizeof exe, "%s/marlaas", bdir);
    double t0 = util_now();
    for (bool all_done = false; !all_done && !interrupted;) {
        all_done = true;
        printf("\n--- %.0f s ---\n", util_now() - t0);
        fflush(stdout);   // before the watch children write to the same stream
        for (int t = 0; t < 2 && !interrupted; t++) {
            char tok[160];
            snprintf(tok, sizeof tok, "--token=%.120s", tokens[t]);
            char *argv2[] = {exe, "watch", "--once", tok, NULL};
            run_cmd(argv2);
            c = client_new(client_endpoint(NULL), tokens[t], 10000, err);
            proto_rep_t rep;
            if (c && client_call(c, "job_list", NULL, &rep, err) == 0) {
                cJSON *arr = cJSON_Parse(proto_args_get_text(&rep.result, "jobs")), *j;
                cJSON_ArrayForEach(j, arr) {
                    const cJSON *s = cJSON_GetObjectItem(j, "status");
                    if (cJSON_IsString(s) && (!strcmp(s->valuestring, "running") || !strcmp(s->valuestring, "queued")))
                        all_done = false;
                }
                cJSON_Delete(arr);
                proto_rep_free(&rep);
            }
            client_destroy(&c);
        }
        for (int k = 0; k < 20 && !all_done && !interrupted; k++) usleep(100000);
    }
    if (interrupted) {
        fprintf(stderr, "demo: interrupted; stopping the cluster\n");
        goto done;
    }
    printf("\n%-8s %-8s %-10s %12s %12s %8s\n", "tenant", "job", "task", "acc before", "acc after", "steps");
    for (int i = 0; i < 4; i++) {
        c = client_new(client_endpoint(NULL), tokens[i % 2], 10000, err);
        proto_args_t a = {0};
        proto_args_str(&a, "job", jobs[i]);
        proto_rep_t rep;
        if (c && client_call(c, "job_status", &a, &rep, err) == 0) {
            cJSON *s = cJSON_Parse(proto_args_get_text(&rep.result, "status"));
            double a0 = cJSON_GetNumberValue(cJSON_GetObjectItem(s, "eval_acc0"));
            double a1 = cJSON_GetNumberValue(cJSON_GetObjectItem(s, "eval_acc"));
            double st = cJSON_GetNumberValue(cJSON_GetObjectItem(s, "step"));
            printf("%-8s %-8s %-10s %11.1f%% %11.1f%% %8.0f\n", tenants[i % 2], jobs[i], tasks[i], 100 * a0, 100 * a1, st);
            cJSON_Delete(s);
            proto_rep_free(&rep);
        }
        client_destroy(&c);
    }
    printf("demo: %.0f s\n", util_now() - t0);
    rc = 0;
done:
    if (rc && !interrupted) fprintf(stderr, "demo: %s\n", err);
    client_destroy(&c);
    cluster_down(o.run, false);
    return rc;
}

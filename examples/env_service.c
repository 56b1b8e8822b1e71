// env_service.c - an example external environment for multi-turn MARLaaS jobs.
//
// A job whose spec names an environment endpoint ("env": {"endpoint": "tcp://host:9200",
// "max_turns": 4}) has its episodes stepped here: after every model turn the verifier sends one
// "env_req" per episode (the prompt and the transcript so far: every model turn and every
// observation after the prompt) and waits for one "env_rep": either an observation (done =
// false; it is appended to the transcript and the model continues) or the end of the episode
// with its reward in [0, 1] (done = true), or an error. Past the job's env.timeout_ms the episode
// ends with reward 0 and counts as a reward error. Only the environment rewards such a job.
//
// Transport: ZeroMQ, as for reward services: the verifier connects a DEALER socket with an
// empty delimiter frame before each request, so a REP socket is all a service needs. Encoding:
// one MessagePack map per frame (proto_env_req_decode / proto_env_rep_encode in
// common/net/proto.h).
//
// The environment here is the calculator of the built-in "tcalc" task: prompts "tcalc EXPR="
// ask for the value of EXPR. A model turn that ends with a call "<c:EXPR>" gets "=VALUE " (or
// "=ERR "); a turn that ends otherwise ends the episode, rewarded 1 when the final answer (the
// text after the last observation, first line, trimmed) is the value of the prompt's
// expression. Replace step() with your own environment.
//
//   build/bin/env_service [ENDPOINT | --bind ENDPOINT] [--sleep-ms N] [--min-turns K] [--fail]
//
//   ENDPOINT       where to listen (default tcp://*:9200)
//   --sleep-ms N   wait N ms before every reply (a slow environment)
//   --min-turns K  keep every episode going until the model has had K turns: a turn that ends
//                  without a call before then gets the observation "=? " (an environment that
//                  prompts the model again; it exercises multi-turn episodes with any model)
//   --fail         answer every request with an error
//
// One line per request goes to stderr. SIGINT / SIGTERM stop it after the request in hand.
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/net/proto.h"
#include "common/tasks/env.h"

#define MAX_REQUEST (64 << 20)

static volatile sig_atomic_t stopping;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (!stopping && nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

// The value the prompt "tcalc EXPR=" asks for; -1 when the prompt is not one.
static int expected(const char *prompt, int64_t *want) {
    const char *p = strstr(prompt, "tcalc ");
    if (!p) return -1;
    p += strlen("tcalc ");
    const char *eq = strchr(p, '=');
    if (!eq) return -1;
    return env_calc(p, (size_t)(eq - p), want);
}

static uint32_t min_turns = 1;

// One environment step. Returns 0 with *done and either obs or *reward set, -1 + err.
static int step(const proto_env_req_t *rq, bool *done, char *obs, size_t cap, double *reward, char *err) {
    int64_t want;
    if (expected(rq->prompt, &want)) {
        snprintf(err, ERR_LEN, "cannot step this prompt: expected 'tcalc EXPR='");
        return -1;
    }
    const char *t = rq->transcript;
    size_t n = strlen(t);
    // a call at the end of the transcript: "<c:EXPR>"
    const char *open = n ? strrchr(t, '<') : NULL;
    if (n && t[n - 1] == '>' && open && !strncmp(open, "<c:", 3)) {
        int64_t v;
        if (env_calc(open + 3, (size_t)(t + n - 1 - (open + 3)), &v) == 0) snprintf(obs, cap, "=%" PRId64 " ", v);
        else snprintf(obs, cap, "=ERR ");
        *done = false;
        return 0;
    }
    if (rq->turn < min_turns) {
        snprintf(obs, cap, "=? ");
        *done = false;
        return 0;
    }
    // the episode is over: the final answer against the expected value
    const char *a = env_final_answer(t);
    size_t k = strcspn(a, "\n");
    while (k && (*a == ' ' || *a == '\t' || *a == '\r')) a++, k--;
    while (k && (a[k - 1] == ' ' || a[k - 1] == '\t' || a[k - 1] == '\r')) k--;
    char buf[32], exp[32];
    snprintf(exp, sizeof exp, "%" PRId64, want);
    snprintf(buf, sizeof buf, "%.*s", (int)(k < sizeof buf - 1 ? k : sizeof buf - 1), a);
    *reward = k == strlen(exp) && !strcmp(buf, exp) ? 1.0 : 0.0;
    *done = true;
    return 0;
}

static const char *printable(char *dst, size_t n, const char *src) {
    size_t k = 0;
    for (; src[k] && k + 1 < n; k++) dst[k] = src[k] >= 0x20 && src[k] < 0x7f ? src[k] : '?';
    dst[k] = '\0';
    return dst;
}

// Answers one request; a REP socket must answer every request, even one it cannot read.
static void handle(void *sock, const void *data, size_t len, bool multipart, bool fail, long sleep_for) {
    char err[ERR_LEN] = "", obs[64] = "";
    proto_env_req_t req;
    proto_env_rep_t rep = {0};
    bool ok = !multipart && proto_env_req_decode(data, len, &req, err) == 0;
    if (multipart) snprintf(err, sizeof err, "a request must be one frame");
    if (sleep_for > 0) sleep_ms(sleep_for);
    if (!ok) {
        rep.error = err;
        fprintf(stderr, "env_service: malformed request of %zu bytes: %s\n", len, err);
    } else {
        rep.id = req.id;
        if (fail) rep.error = "env_service runs with --fail";
        else if (step(&req, &rep.done, obs, sizeof obs, &rep.reward, err)) rep.error = err;
        else if (!rep.done) rep.obs = obs;
        char job[PROTO_MAX_ID], tr[96];
        fprintf(stderr, "env_service: id %llu job %s turn %u '%s': ", (unsigned long long)req.id,
                printable(job, sizeof job, req.job), req.turn, printable(tr, sizeof tr, req.transcript));
        if (rep.error) fprintf(stderr, "error: %s\n", rep.error);
        else if (rep.done) fprintf(stderr, "done, reward %.0f\n", rep.reward);
        else fprintf(stderr, "observation '%s'\n", obs);
    }
    proto_buf_t buf = {0};
    if (proto_env_rep_encode(&rep, &buf) || zmq_send(sock, buf.data, buf.len, 0) < 0)
        fprintf(stderr, "env_service: reply not sent: %s\n", zmq_strerror(zmq_errno()));
    proto_buf_free(&buf);
    if (ok) proto_env_req_free(&req);
}

static void usage(FILE *f) {
    fprintf(f, "usage: env_service [ENDPOINT | --bind ENDPOINT] [--sleep-ms N] [--min-turns K] [--fail]\n"
               "A calculator environment for multi-turn MARLaaS jobs on 'tcalc EXPR=' prompts.\n"
               "ENDPOINT defaults to tcp://*:9200.\n");
}

int main(int argc, char **argv) {
    const char *endpoint = "tcp://*:9200";
    long sleep_for = 0;
    bool fail = false;
    static struct option lo[] = {{"bind", required_argument, 0, 'b'}, {"sleep-ms", required_argument, 0, 's'},
                                 {"fail", no_argument, 0, 'f'},       {"help", no_argument, 0, 'h'},
                                 {"min-turns", required_argument, 0, 't'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        char *end;
        switch (o) {
        case 'b': endpoint = optarg; break;
        case 'f': fail = true; break;
        case 's':
            errno = 0;
            sleep_for = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || sleep_for < 0 || sleep_for > 3600000) {
                fprintf(stderr, "env_service: --sleep-ms takes 0..3600000, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 't':
            errno = 0;
            min_turns = (uint32_t)strtoul(optarg, &end, 10);
            if (errno || *end || end == optarg || min_turns < 1 || min_turns > PROTO_MAX_TURNS) {
                fprintf(stderr, "env_service: --min-turns takes 1..%d, got '%s'\n", PROTO_MAX_TURNS, optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) endpoint = argv[optind++];
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zmq_socket(ctx, ZMQ_REP) : NULL;
    if (!sock) {
        fprintf(stderr, "env_service: cannot create a ZeroMQ socket: %s\n", zmq_strerror(zmq_errno()));
        if (ctx) zmq_ctx_term(ctx);
        return 1;
    }
    int64_t max_msg = MAX_REQUEST;
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "env_service: cannot bind %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        zmq_ctx_term(ctx);
        return 1;
    }
    fprintf(stderr, "env_service: listening on %s%s%s\n", endpoint, fail ? " (--fail: every reply is an error)" : "",
            sleep_for ? " (replies delayed)" : "");
    uint64_t served = 0;
    while (!stopping) {
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&it, 1, 500);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "env_service: poll failed: %s\n", zmq_strerror(zmq_errno()));
            break;
        }
        if (n == 0) continue;
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        bool multipart = false;
        for (int more = zmq_msg_more(&msg); more;) {
            multipart = true;
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            more = zmq_msg_recv(&extra, sock, 0) >= 0 && zmq_msg_more(&extra);
            zmq_msg_close(&extra);
        }
        handle(sock, zmq_msg_data(&msg), zmq_msg_size(&msg), multipart, fail, sleep_for);
        zmq_msg_close(&msg);
        served++;
    }
    fprintf(stderr, "env_service: stopping after %llu requests\n", (unsigned long long)served);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}

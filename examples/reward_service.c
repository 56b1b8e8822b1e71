// reward_service.c - an example external reward service for MARLaaS jobs.
//
// A job whose spec names a reward endpoint ("reward": {"endpoint": "tcp://host:9100"}) has its
// completions scored here instead of by the built-in verifier, for training and for evals.
// The verifier sends one "reward_req" per prompt (the prompt and the G completions sampled for
// it) and waits for one "reward_rep" with G rewards in [0, 1], or with an error. Past the job's
// reward.timeout_ms (and reward.retries) it gives up: the group scores 0 and counts as a
// reward error, or the job fails when reward.on_failure is "fail".
//
// Transport: ZeroMQ. The verifier connects a DEALER socket and puts an empty delimiter frame
// before each request, so a plain REP socket is all a service needs: receive one request,
// send one reply, in that order. Encoding: one MessagePack map per frame, built and checked by
// proto_reward_req_decode / proto_reward_rep_encode (common/net/proto.h).
//
// The scoring rule here is the "vowels" task: a prompt "vowels WORD:" asks for the number of
// vowels (a, e, i, o, u) in WORD. The completion is cut at its first newline and trimmed; it
// scores 1 when it is exactly that number, 0 otherwise. Replace score_one() with your own rule.
//
//   build/bin/reward_service [ENDPOINT | --bind ENDPOINT] [--sleep-ms N] [--fail]
//
//   ENDPOINT       where to listen (default tcp://*:9100)
//   --sleep-ms N   wait N ms before every reply (a slow service, to try reward.timeout_ms)
//   --fail         answer every request with an error (to try reward.on_failure)
//
// One line per request goes to stderr. SIGINT / SIGTERM stop it after the request in hand.
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/net/proto.h"

// Requests larger than this are refused by libzmq before they reach us (the connection is
// dropped), so garbage cannot make the service allocate without bound. A real request is at
// most 256 completions of 128 KiB.
#define MAX_REQUEST (64 << 20)

static volatile sig_atomic_t stopping;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

// Counts a, e, i, o, u (either case) in the word between "vowels " and ':'. -1 when the prompt
// is not a vowels prompt: the service then answers with an error rather than a guess, so a job
// pointed at the wrong service shows reward errors instead of silently learning nothing.
static int expected_vowels(const char *prompt) {
    const char *w = strstr(prompt, "vowels ");
    if (!w) return -1;
    w += strlen("vowels ");
    const char *end = strchr(w, ':');
    if (!end || end == w) return -1;
    int k = 0;
    for (const char *p = w; p < end; p++) k += strchr("aeiouAEIOU", *p) != NULL;
    return k;
}

// 1 when the completion's answer (first line, trimmed of blanks) is exactly the decimal number
// want: no sign, no leading zeros, nothing after it.
static double score_one(int want, const char *completion) {
    size_t n = strcspn(completion, "\n");
    const char *s = completion;
    while (n > 0 && (*s == ' ' || *s == '\t' || *s == '\r')) s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    if (n == 0 || n > 9 || (s[0] == '0' && n > 1)) return 0.0;
    long got = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0.0;
        got = got * 10 + (s[i] - '0');
    }
    return got == want ? 1.0 : 0.0;
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    // a signal cuts the sleep short: stopping must not wait for a long --sleep-ms
    while (!stopping && nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

// Request fields are untrusted bytes: the log shows them with anything unprintable as '?'.
static const char *printable(char *dst, size_t n, const char *src) {
    size_t k = 0;
    for (; src[k] && k + 1 < n; k++) dst[k] = src[k] >= 0x20 && src[k] < 0x7f ? src[k] : '?';
    dst[k] = '\0';
    return dst;
}

static int send_reply(void *sock, const proto_reward_rep_t *rep) {
    proto_buf_t buf = {0};
    int rc = proto_reward_rep_encode(rep, &buf);
    if (rc == 0 && zmq_send(sock, buf.data, buf.len, 0) < 0) rc = -1;
    proto_buf_free(&buf);
    return rc;
}

// Answers one request: the scores, or an error reply. A REP socket must answer every request,
// even one it cannot read, or it will not receive the next one.
static void handle(void *sock, const void *data, size_t len, bool multipart, bool fail, long sleep_for) {
    char err[ERR_LEN] = "";
    proto_reward_req_t req;
    proto_reward_rep_t rep = {0};
    bool ok = !multipart && proto_reward_req_decode(data, len, &req, err) == 0;
    if (multipart) snprintf(err, sizeof err, "a request must be one frame");
    if (sleep_for > 0) sleep_ms(sleep_for);
    if (!ok) {
        rep.error = err;
        fprintf(stderr, "reward_service: malformed request of %zu bytes: %s\n", len, err);
    } else {
        rep.id = req.id;
        int want = expected_vowels(req.prompt);
        if (fail) {
            rep.error = "reward_service runs with --fail";
        } else if (want < 0) {
            snprintf(err, sizeof err, "cannot score this prompt: expected 'vowels WORD:'");
            rep.error = err;
        } else {
            rep.n = req.n;
            rep.rewards = calloc(req.n ? req.n : 1, sizeof *rep.rewards);
            if (!rep.rewards) {
                rep.n = 0;
                rep.error = "out of memory";
            }
        }
        double sum = 0;
        for (uint32_t i = 0; rep.rewards && i < req.n; i++) sum += rep.rewards[i] = score_one(want, req.completions[i]);
        char job[PROTO_MAX_ID];
        fprintf(stderr, "reward_service: id %llu job %s: %u completion%s, %s", (unsigned long long)req.id,
                printable(job, sizeof job, req.job), req.n, req.n == 1 ? "" : "s", rep.error ? "error: " : "");
        if (rep.error) fprintf(stderr, "%s\n", rep.error);
        else fprintf(stderr, "mean reward %.3f\n", req.n ? sum / req.n : 0.0);
    }
    if (send_reply(sock, &rep)) fprintf(stderr, "reward_service: reply not sent: %s\n", zmq_strerror(zmq_errno()));
    free(rep.rewards);
    if (ok) proto_reward_req_free(&req);
}

static void usage(FILE *f) {
    fprintf(f, "usage: reward_service [ENDPOINT | --bind ENDPOINT] [--sleep-ms N] [--fail]\n"
               "Scores 'vowels WORD:' prompts for MARLaaS jobs (reward 1 for the right count, else 0).\n"
               "ENDPOINT defaults to tcp://*:9100.\n");
}

int main(int argc, char **argv) {
    const char *endpoint = "tcp://*:9100";
    long sleep_for = 0;
    bool fail = false;
    static struct option lo[] = {{"bind", required_argument, 0, 'b'}, {"sleep-ms", required_argument, 0, 's'},
                                 {"fail", no_argument, 0, 'f'},       {"help", no_argument, 0, 'h'},
                                 {0, 0, 0, 0}};
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
                fprintf(stderr, "reward_service: --sleep-ms takes 0..3600000, got '%s'\n", optarg);
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

    // No SA_RESTART: a signal must interrupt the blocking poll so the loop sees `stopping`.
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zmq_socket(ctx, ZMQ_REP) : NULL;
    if (!sock) {
        fprintf(stderr, "reward_service: cannot create a ZeroMQ socket: %s\n", zmq_strerror(zmq_errno()));
        if (ctx) zmq_ctx_term(ctx);
        return 1;
    }
    int64_t max_msg = MAX_REQUEST;
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "reward_service: cannot bind %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        zmq_ctx_term(ctx);
        return 1;
    }
    fprintf(stderr, "reward_service: listening on %s%s%s\n", endpoint, fail ? " (--fail: every reply is an error)" : "",
            sleep_for ? " (replies delayed)" : "");

    uint64_t served = 0;
    while (!stopping) {
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&it, 1, 500);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "reward_service: poll failed: %s\n", zmq_strerror(zmq_errno()));
            break;
        }
        if (n == 0) continue;
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        // Extra frames are read and dropped: REP delivers a request whole, and the reply may
        // only be sent once all of it has been received.
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
    fprintf(stderr, "reward_service: stopping after %llu requests\n", (unsigned long long)served);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}

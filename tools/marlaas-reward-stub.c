// marlaas-reward-stub.c - a test tool: a tenant's reward (and environment) service that gives
// every completion the same reward and, on request, also answers requests it was never sent.
//
//   marlaas-reward-stub [--bind ENDPOINT] [--reward R] [--spray K] [--random K]
//
//   --bind ENDPOINT  where to listen (default tcp://127.0.0.1:9100)
//   --reward R       the reward of every completion, and of every episode (ended at once), 0..1
//                    (default 1)
//   --spray K        after each reply, K more with the ids next to the request's (id+1, id-1,
//                    id+2, ...): an attacker guessing the ids of other tenants' requests when
//                    ids are sequential
//   --random K       after each reply, K more with random ids
//
// It binds a ROUTER (a REP could send only one reply per request) and answers each reward_req
// with a reward_rep of as many rewards as completions, each env_req with an env_rep that ends
// the episode; the sprayed replies are of the same kind and size, so only the id tells them
// apart. Requests that do not decode are ignored. SIGINT / SIGTERM stop it; the last line on
// stderr sums up: "reward-stub: N requests, M replies, S sprayed".
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/net/proto.h"

static volatile sig_atomic_t stopping;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static uint64_t rand64(void) {
    return ((uint64_t)(uint32_t)rand() << 33) ^ ((uint64_t)(uint32_t)rand() << 11) ^ (uint64_t)(uint32_t)rand();
}

// Sends [identity][""][reply] for request id; returns 1 when it went out.
static int reply(void *sock, const zmq_msg_t *identity, bool env, uint64_t id, uint32_t n, double r) {
    proto_buf_t buf = {0};
    int rc;
    if (env) {
        proto_env_rep_t rep = {.id = id, .done = true, .reward = r};
        rc = proto_env_rep_encode(&rep, &buf);
    } else {
        double rw[1024];
        for (uint32_t i = 0; i < n && i < 1024; i++) rw[i] = r;
        proto_reward_rep_t rep = {.id = id, .n = n < 1024 ? n : 1024, .rewards = rw};
        rc = proto_reward_rep_encode(&rep, &buf);
    }
    int sent = rc == 0 && zmq_send(sock, zmq_msg_data((zmq_msg_t *)identity), zmq_msg_size(identity),
                                   ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
               zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
               zmq_send(sock, buf.data, buf.len, ZMQ_DONTWAIT) >= 0;
    proto_buf_free(&buf);
    return sent;
}

static void usage(FILE *f) {
    fprintf(f, "usage: marlaas-reward-stub [--bind ENDPOINT] [--reward R] [--spray K] [--random K]\n");
}

int main(int argc, char **argv) {
    const char *endpoint = "tcp://127.0.0.1:9100";
    double reward = 1.0;
    long spray = 0, random_k = 0;
    static struct option lo[] = {{"bind", required_argument, 0, 'b'},   {"reward", required_argument, 0, 'r'},
                                 {"spray", required_argument, 0, 's'},  {"random", required_argument, 0, 'R'},
                                 {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (o) {
        case 'b': endpoint = optarg; break;
        case 'r': reward = strtod(optarg, &end); break;
        case 's': spray = strtol(optarg, &end, 10); break;
        case 'R': random_k = strtol(optarg, &end, 10); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (end && (errno || *end || end == optarg || reward < 0 || reward > 1 || spray < 0 || spray > 10000 ||
                    random_k < 0 || random_k > 10000)) {
            fprintf(stderr, "marlaas-reward-stub: bad value '%s' (--reward 0..1, --spray and --random 0..10000)\n", optarg);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
    int linger = 0, hwm = 100000;
    int64_t max_msg = 64 << 20;
    if (sock) {
        zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    }
    if (!sock || zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "marlaas-reward-stub: cannot bind %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        if (sock) zmq_close(sock);
        if (ctx) zmq_ctx_term(ctx);
        return 1;
    }
    fprintf(stderr, "reward-stub: listening on %s (reward %g, spray %ld, random %ld)\n", endpoint, reward, spray, random_k);

    unsigned long long requests = 0, replies = 0, sprayed = 0;
    while (!stopping) {
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&it, 1, 500);
        if (n <= 0) continue;
        // [identity][""][request]: the last frame is the request
        zmq_msg_t identity, part;
        zmq_msg_init(&identity);
        zmq_msg_init(&part);
        if (zmq_msg_recv(&identity, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&identity);
            zmq_msg_close(&part);
            continue;
        }
        bool more = zmq_msg_more(&identity);
        while (more && zmq_msg_recv(&part, sock, 0) >= 0) more = zmq_msg_more(&part);
        char type[32], err[ERR_LEN];
        const void *d = zmq_msg_data(&part);
        size_t len = zmq_msg_size(&part);
        uint64_t id = 0;
        uint32_t k = 0;
        bool env = false, ok = false;
        if (proto_peek_type(d, len, type, err) == 0 && !strcmp(type, "env_req")) {
            proto_env_req_t rq;
            if ((ok = proto_env_req_decode(d, len, &rq, err) == 0)) id = rq.id, env = true, proto_env_req_free(&rq);
        } else {
            proto_reward_req_t rq;
            if ((ok = proto_reward_req_decode(d, len, &rq, err) == 0)) id = rq.id, k = rq.n, proto_reward_req_free(&rq);
        }
        if (ok) {
            requests++;
            replies += (unsigned long long)reply(sock, &identity, env, id, k, reward);
            for (long i = 1; i <= spray; i++)
                sprayed += (unsigned long long)reply(sock, &identity, env, i % 2 ? id + (uint64_t)(i + 1) / 2 : id - (uint64_t)i / 2,
                                                     k, reward);
            for (long i = 0; i < random_k; i++) sprayed += (unsigned long long)reply(sock, &identity, env, rand64(), k, reward);
        }
        zmq_msg_close(&identity);
        zmq_msg_close(&part);
    }
    fprintf(stderr, "reward-stub: %llu requests, %llu replies, %llu sprayed\n", requests, replies, sprayed);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}

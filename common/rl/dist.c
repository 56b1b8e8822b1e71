// dist.c - the data-parallel process group over ZeroMQ: rank 0's ROUTER, the others' DEALERs.
//
// Every message is two frames, [header][payload] (rank 0 sees the sender's identity first):
// the header names the kind, the sender's rank and world, the operation's sequence number
// (operations are numbered alike on every rank, so a late or stray message is recognised) and
// the payload's length. Rank 0 collects the contributions of an operation, sums them in rank
// order and sends the result; any failure it sees goes to every rank as ABORT with the reason.
#include "common/rl/dist.h"

#include <czmq.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"
#include "common/util/log.h"
#include "common/util/util.h"

enum { D_HELLO = 1, D_WELCOME, D_REJECT, D_REDUCE, D_RESULT, D_BCAST, D_ABORT };
static const char *kind_name[] = {"?", "hello", "welcome", "reject", "reduce", "result", "bcast", "abort"};
#define DIST_MAGIC 0x4d445354u   // "MDST"
#define DIST_LINGER_MS 3000

typedef struct {
    uint32_t magic, kind, rank, world;
    uint64_t seq, len;
} hdr_t;

struct dist {
    int rank, world;
    double timeout_s;
    zsock_t *s;
    zframe_t **ids;        // rank 0: identity of each rank (NULL for itself)
    uint64_t seq;
    bool broken;
    char why[ERR_LEN];     // the first error, repeated by later calls
};

static int fail(dist_t *d, char *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(dist_t *d, char *err, const char *fmt, ...) {
    if (!d->broken) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->why, sizeof d->why, fmt, ap);
        va_end(ap);
        d->broken = true;
    }
    return err_set(err, "%s", d->why);
}

static int send_msg(dist_t *d, zframe_t *to, uint32_t kind, const void *payload, size_t len) {
    hdr_t h = {DIST_MAGIC, kind, (uint32_t)d->rank, (uint32_t)d->world, d->seq, len};
    void *sock = zsock_resolve(d->s);
    if (to && zmq_send(sock, zframe_data(to), zframe_size(to), ZMQ_SNDMORE) < 0) return -1;
    if (zmq_send(sock, &h, sizeof h, ZMQ_SNDMORE) < 0) return -1;
    return zmq_send(sock, payload ? payload : "", len, 0) < 0 ? -1 : 0;
}

// Rank 0 tells every other rank why the group stops (best effort).
static void abort_all(dist_t *d) {
    if (d->rank != 0 || !d->ids) return;
    for (int r = 1; r < d->world; r++)
        if (d->ids[r]) send_msg(d, d->ids[r], D_ABORT, d->why, strlen(d->why));
}

// Receives one message before the deadline. *from: the sender's identity (rank 0 only; caller
// destroys). Returns 1 with the message, 0 on timeout, -1 on a malformed message (skipped).
static int recv_msg(dist_t *d, double deadline, zframe_t **from, hdr_t *h, zframe_t **payload) {
    for (;;) {
        double left = deadline - util_now();
        if (left <= 0) return 0;
        zmq_pollitem_t it = {.socket = zsock_resolve(d->s), .events = ZMQ_POLLIN};
        int rc = zmq_poll(&it, 1, (long)(left * 1000) + 1);
        if (rc < 0 && zmq_errno() == EINTR) continue;
        if (rc <= 0 || !(it.revents & ZMQ_POLLIN)) continue;
        zmsg_t *m = zmsg_recv(d->s);
        if (!m) continue;
        zframe_t *id = d->rank == 0 ? zmsg_pop(m) : NULL, *hf = zmsg_pop(m), *pf = zmsg_pop(m);
        bool ok = zmsg_size(m) == 0 && hf && pf && zframe_size(hf) == sizeof(hdr_t) && (d->rank != 0 || id);
        zmsg_destroy(&m);
        if (ok) {
            memcpy(h, zframe_data(hf), sizeof *h);
            ok = h->magic == DIST_MAGIC && h->kind >= D_HELLO && h->kind <= D_ABORT && h->len == zframe_size(pf);
        }
        zframe_destroy(&hf);
        if (!ok) {
            zframe_destroy(&id);
            zframe_destroy(&pf);
            log_warn("dist: dropped a malformed message (not from a rank of this group?)");
            continue;
        }
        if (from) *from = id;
        else zframe_destroy(&id);
        *payload = pf;
        return 1;
    }
}

static void close_ids(dist_t *d) {
    if (!d->ids) return;
    for (int r = 0; r < d->world; r++) zframe_destroy(&d->ids[r]);
    free(d->ids);
    d->ids = NULL;
}

void dist_close(dist_t **pd) {
    dist_t *d = *pd;
    if (!d) return;
    close_ids(d);
    zsock_destroy(&d->s);
    free(d);
    *pd = NULL;
}

int dist_rank(const dist_t *d) { return d->rank; }
int dist_world(const dist_t *d) { return d->world; }

// Extra waiting time of ranks other than 0, so that rank 0's diagnosis (which rank is missing)
// reaches them before their own deadline passes.
static double member_grace(const dist_t *d) { return d->timeout_s / 2 > 2 ? d->timeout_s / 2 : 2; }

static int join_root(dist_t *d, const char *endpoint, char *err) {
    char ep[256];
    const char *colon = strrchr(endpoint, ':');
    snprintf(ep, sizeof ep, "tcp://*:%s", colon ? colon + 1 : "");
    d->s = bus_bind(ZMQ_ROUTER, ep, 1000, 0, err);
    if (!d->s) return fail(d, err, "dist: rank 0: %s", err);
    // what rank 0 sends last (a result, the reason to stop) must still leave when it closes
    zsock_set_linger(d->s, DIST_LINGER_MS);
    d->ids = xcalloc((size_t)d->world, sizeof(zframe_t *));
    int joined = 1;
    double deadline = util_now() + d->timeout_s;
    while (joined < d->world) {
        zframe_t *from = NULL, *pf = NULL;
        hdr_t h;
        int rc = recv_msg(d, deadline, &from, &h, &pf);
        if (rc == 0) {
            char missing[200] = "";
            for (int r = 1; r < d->world; r++)
                if (!d->ids[r]) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %d", r);
            fail(d, err, "dist: rank 0: ranks%s of %d did not join within %.0f s (started? right endpoint %s?)", missing,
                 d->world, d->timeout_s, endpoint);
            abort_all(d);
            return -1;
        }
        char why[160] = "";
        if (h.kind != D_HELLO) snprintf(why, sizeof why, "expected hello, got %s", kind_name[h.kind]);
        else if ((int)h.world != d->world) snprintf(why, sizeof why, "world %u differs from rank 0's %d", h.world, d->world);
        else if (h.rank < 1 || (int)h.rank >= d->world) snprintf(why, sizeof why, "rank %u outside 1..%d", h.rank, d->world - 1);
        else if (d->ids[h.rank]) snprintf(why, sizeof why, "rank %u has already joined", h.rank);
        zframe_destroy(&pf);
        if (why[0]) {
            log_warn("dist: refused a process joining the group: %s", why);
            send_msg(d, from, D_REJECT, why, strlen(why));
            zframe_destroy(&from);
            continue;
        }
        d->ids[h.rank] = from;
        joined++;
    }
    for (int r = 1; r < d->world; r++) send_msg(d, d->ids[r], D_WELCOME, NULL, 0);
    return 0;
}

static int join_member(dist_t *d, const char *endpoint, char *err) {
    d->s = bus_connect(ZMQ_DEALER, endpoint, "trainer", 1000, 0, err);
    if (!d->s) return fail(d, err, "dist: rank %d: %s", d->rank, err);
    zsock_set_linger(d->s, DIST_LINGER_MS);
    if (send_msg(d, NULL, D_HELLO, NULL, 0)) return fail(d, err, "dist: rank %d: cannot send to %s", d->rank, endpoint);
    zframe_t *pf = NULL;
    hdr_t h;
    double wait = d->timeout_s + member_grace(d);
    int rc = recv_msg(d, util_now() + wait, NULL, &h, &pf);
    if (rc == 0) return fail(d, err, "dist: rank %d: rank 0 at %s did not admit us within %.0f s", d->rank, endpoint, wait);
    int out = 0;
    if (h.kind == D_REJECT || h.kind == D_ABORT)
        out = fail(d, err, "dist: rank %d: rank 0 refused: %.*s", d->rank, (int)zframe_size(pf), (char *)zframe_data(pf));
    else if (h.kind != D_WELCOME)
        out = fail(d, err, "dist: rank %d: expected welcome, got %s", d->rank, kind_name[h.kind]);
    zframe_destroy(&pf);
    return out;
}

dist_t *dist_open(int rank, int world, const char *endpoint, double timeout_s, char *err) {
    if (world < 1 || rank < 0 || rank >= world) {
        err_set(err, "dist: rank %d outside 0..%d (world %d)", rank, world - 1, world);
        return NULL;
    }
    if (world > 1 && (!endpoint || strncmp(endpoint, "tcp://", 6) != 0 || !strrchr(endpoint + 6, ':'))) {
        err_set(err, "dist: endpoint '%s' must be tcp://HOST:PORT (rank 0's address)", endpoint ? endpoint : "");
        return NULL;
    }
    dist_t *d = xcalloc(1, sizeof *d);
    d->rank = rank, d->world = world, d->timeout_s = timeout_s > 0 ? timeout_s : 60;
    int rc = world == 1 ? 0 : rank == 0 ? join_root(d, endpoint, err) : join_member(d, endpoint, err);
    if (rc) {
        dist_close(&d);
        return NULL;
    }
    return d;
}

// One collective: every rank sends its contribution (kind, payload) to rank 0, which combines
// them and sends `back` (kind_back) to each. Rank 0's combine gets the payloads by rank.
typedef int (*combine_fn)(void *ctx, zframe_t **by_rank, int world, char *why, size_t n);

static int collective(dist_t *d, uint32_t kind, const void *mine, size_t len, combine_fn combine, void *ctx,
                      void **back, size_t *back_len, char *err) {
    if (d->broken) return err_set(err, "%s", d->why);
    d->seq++;
    double deadline = util_now() + d->timeout_s;
    if (d->world == 1) return 0;
    if (d->rank != 0) {
        // rank 0 diagnoses what went wrong and tells everyone: the others wait a little longer
        deadline += member_grace(d);
        if (kind != D_BCAST && send_msg(d, NULL, kind, mine, len))
            return fail(d, err, "dist: rank %d: cannot send to rank 0", d->rank);
        for (;;) {
            zframe_t *pf = NULL;
            hdr_t h;
            if (!recv_msg(d, deadline, NULL, &h, &pf))
                return fail(d, err, "dist: rank %d: no answer from rank 0 within %.0f s (operation %llu, %s): rank 0 or "
                            "another rank died or hangs", d->rank, d->timeout_s + member_grace(d),
                            (unsigned long long)d->seq, kind_name[kind]);
            if (h.kind == D_ABORT) {
                int r = fail(d, err, "dist: rank %d: the group stopped: %.*s", d->rank, (int)zframe_size(pf),
                             (char *)zframe_data(pf));
                zframe_destroy(&pf);
                return r;
            }
            if (h.seq != d->seq) {   // a stray message of an operation that already failed
                zframe_destroy(&pf);
                continue;
            }
            uint32_t want = kind == D_BCAST ? D_BCAST : D_RESULT;
            if (h.kind != want) {
                zframe_destroy(&pf);
                return fail(d, err, "dist: rank %d: rank 0 sent %s during %s (operation %llu): the ranks run different "
                            "programs", d->rank, kind_name[h.kind], kind_name[kind], (unsigned long long)d->seq);
            }
            *back_len = zframe_size(pf);
            *back = xmalloc(*back_len ? *back_len : 1);
            memcpy(*back, zframe_data(pf), *back_len);
            zframe_destroy(&pf);
            return 0;
        }
    }
    // rank 0
    zframe_t **got = xcalloc((size_t)d->world, sizeof(zframe_t *));
    int n_got = 1, rc = 0;
    if (kind != D_BCAST) {
        got[0] = zframe_new(mine, len);
        while (n_got < d->world) {
            zframe_t *from = NULL, *pf = NULL;
            hdr_t h;
            if (!recv_msg(d, deadline, &from, &h, &pf)) {
                char missing[200] = "";
                for (int r = 1; r < d->world; r++)
                    if (!got[r]) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %d", r);
                rc = fail(d, err, "dist: rank 0: ranks%s did not take part in operation %llu (%s) within %.0f s: dead "
                          "or hung; the group stops", missing, (unsigned long long)d->seq, kind_name[kind], d->timeout_s);
                break;
            }
            int r = (int)h.rank;
            bool known = r >= 1 && r < d->world && d->ids[r] && zframe_eq(from, d->ids[r]);
            if (!known && h.kind == D_HELLO) {   // a process that wants in after the group formed
                char why[160];
                if ((int)h.world != d->world) snprintf(why, sizeof why, "world %u differs from rank 0's %d", h.world, d->world);
                else snprintf(why, sizeof why, "the group of %d has formed; a rank that restarts needs the whole group "
                              "restarted", d->world);
                send_msg(d, from, D_REJECT, why, strlen(why));
            }
            zframe_destroy(&from);
            if (!known || h.seq != d->seq || h.kind != kind || got[r]) {
                zframe_destroy(&pf);
                if (known && h.seq == d->seq) {
                    rc = fail(d, err, "dist: rank 0: rank %d sent %s during %s (operation %llu): the ranks run "
                              "different programs", r, kind_name[h.kind], kind_name[kind], (unsigned long long)d->seq);
                    break;
                }
                continue;
            }
            got[r] = pf;
            n_got++;
        }
        char why[ERR_LEN];
        if (!rc && combine && combine(ctx, got, d->world, why, sizeof why)) rc = fail(d, err, "%s", why);
    }
    if (!rc) {
        uint32_t k = kind == D_BCAST ? D_BCAST : D_RESULT;
        for (int r = 1; r < d->world && !rc; r++)
            if (send_msg(d, d->ids[r], k, *back, *back_len)) rc = fail(d, err, "dist: rank 0: cannot send to rank %d", r);
    }
    if (rc) abort_all(d);
    for (int r = 0; r < d->world; r++) zframe_destroy(&got[r]);
    free(got);
    return rc;
}

typedef struct {
    float *buf;
    size_t n;
} sum_ctx_t;

static int sum_combine(void *ctx, zframe_t **by_rank, int world, char *why, size_t nw) {
    sum_ctx_t *c = ctx;
    if (!by_rank) return 0;
    for (int r = 1; r < world; r++)
        if (zframe_size(by_rank[r]) != c->n * sizeof(float)) {
            snprintf(why, nw, "dist: rank 0: rank %d contributed %zu floats to a sum of %zu: the ranks disagree on "
                     "the model or the batch", r, zframe_size(by_rank[r]) / sizeof(float), c->n);
            return -1;
        }
    // rank order, so every run and every rank sees the same rounding
    // (a frame's bytes need not be aligned for floats: read them with memcpy)
    for (int r = 1; r < world; r++) {
        const unsigned char *x = zframe_data(by_rank[r]);
        for (size_t i = 0; i < c->n; i++) {
            float v;
            memcpy(&v, x + i * sizeof(float), sizeof v);
            c->buf[i] += v;
        }
    }
    return 0;
}

int dist_allreduce_sum(dist_t *d, float *buf, size_t n, char *err) {
    sum_ctx_t c = {buf, n};
    void *back = buf;
    size_t back_len = n * sizeof(float);
    if (d->rank != 0) back = NULL;
    int rc = collective(d, D_REDUCE, buf, n * sizeof(float), sum_combine, &c, &back, &back_len, err);
    if (rc || d->rank == 0) return rc;
    if (back_len != n * sizeof(float)) {
        free(back);
        return fail(d, err, "dist: rank %d: the sum has %zu floats, not %zu", d->rank, back_len / sizeof(float), n);
    }
    memcpy(buf, back, back_len);
    free(back);
    return 0;
}

int dist_bcast(dist_t *d, void **data, size_t *len, char *err) {
    if (d->rank == 0) return collective(d, D_BCAST, NULL, 0, NULL, NULL, data, len, err);
    *data = NULL, *len = 0;
    return collective(d, D_BCAST, NULL, 0, NULL, NULL, data, len, err);
}

int dist_barrier(dist_t *d, char *err) {
    float none = 0;
    return dist_allreduce_sum(d, &none, 0, err);
}

// loop.c - the services' event loop (loop.h).
#include "common/svc/loop.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util/log.h"
#include "common/util/util.h"

typedef enum { H_FRAMES, H_READER } hkind_t;

typedef struct {
    hkind_t kind;
    zsock_t *sock;
    const char *what;
    int per_turn;
    svc_frame_fn frame;
    svc_room_fn room;
    svc_reader_fn reader;
    void *ctx;
} handler_t;

typedef struct {
    svc_work_fn fn;
    void *ctx;
} work_t;

typedef struct {
    double period, next;
    svc_timer_fn fn;
    void *ctx;
} timer_t_;

typedef struct {
    svc_sockets_fn fn;
    void *ctx;
} extra_t;

struct svc_loop {
    svc_t *s;
    store_t *st;
    handler_t *h;
    int n_h;
    work_t *w;
    int n_w;
    timer_t_ *t;
    int n_t;
    extra_t *x;
    int n_x;
    svc_beat_fn beat;
    void *beat_ctx;
    int idle_ms;
    zmq_pollitem_t *items;   // grown to the turn's socket count
    int cap_items;
    bool stop;
    int rc;
    double busy_s, t_start, last_beat;
};

// Grows an array of n elements of size sz by one (zeroed) and returns the new element.
static void *push(void **arr, int *n, size_t sz) {
    *arr = xrealloc(*arr, sz * (size_t)(*n + 1));
    void *e = (char *)*arr + sz * (size_t)*n;
    memset(e, 0, sz);
    (*n)++;
    return e;
}

svc_loop_t *svc_loop_new(svc_t *s, store_t *st) {
    svc_loop_t *l = xcalloc(1, sizeof *l);
    l->s = s;
    l->st = st;
    l->idle_ms = 50;
    return l;
}

void svc_loop_destroy(svc_loop_t **pl) {
    if (!pl || !*pl) return;
    svc_loop_t *l = *pl;
    free(l->h), free(l->w), free(l->t), free(l->x), free(l->items);
    free(l);
    *pl = NULL;
}

void svc_loop_frames(svc_loop_t *l, zsock_t *sock, const char *what, int per_turn, svc_frame_fn fn, svc_room_fn room,
                     void *ctx) {
    handler_t *h = push((void **)&l->h, &l->n_h, sizeof *h);
    *h = (handler_t){.kind = H_FRAMES, .sock = sock, .what = what, .per_turn = per_turn > 0 ? per_turn : 1,
                     .frame = fn, .room = room, .ctx = ctx};
}

void svc_loop_reader(svc_loop_t *l, zsock_t *sock, svc_reader_fn fn, void *ctx) {
    handler_t *h = push((void **)&l->h, &l->n_h, sizeof *h);
    *h = (handler_t){.kind = H_READER, .sock = sock, .reader = fn, .ctx = ctx};
}

void svc_loop_sockets(svc_loop_t *l, svc_sockets_fn fn, void *ctx) {
    extra_t *x = push((void **)&l->x, &l->n_x, sizeof *x);
    *x = (extra_t){fn, ctx};
}

void svc_loop_work(svc_loop_t *l, svc_work_fn fn, void *ctx) {
    work_t *w = push((void **)&l->w, &l->n_w, sizeof *w);
    *w = (work_t){fn, ctx};
}

void svc_loop_every(svc_loop_t *l, double period_s, svc_timer_fn fn, void *ctx) {
    timer_t_ *t = push((void **)&l->t, &l->n_t, sizeof *t);
    *t = (timer_t_){.period = period_s, .next = 0, .fn = fn, .ctx = ctx};
}

void svc_loop_heartbeat(svc_loop_t *l, svc_beat_fn fn, void *ctx) {
    l->beat = fn;
    l->beat_ctx = ctx;
}

void svc_loop_idle(svc_loop_t *l, int ms) { l->idle_ms = ms >= 0 ? ms : 0; }

void svc_loop_stop(svc_loop_t *l, int rc) {
    l->stop = true;
    l->rc = rc;
}

uint64_t svc_loop_received(const svc_loop_t *l) { return l->s->received; }
uint64_t svc_loop_rejected(const svc_loop_t *l) { return l->s->rejected; }

void svc_beat_add(svc_beat_t *b, const char *field, const char *fmt, ...) {
    if (b->n >= SVC_BEAT_MAX) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->value[b->n], sizeof b->value[b->n], fmt, ap);
    va_end(ap);
    b->field[b->n++] = field;
}

static void heartbeat(svc_loop_t *l, double now) {
    svc_beat_t b = {.busy_s = l->busy_s, .up_s = now - l->t_start};
    if (l->beat) l->beat(l->beat_ctx, &b);
    double up = b.up_s > 0 ? b.up_s : 1e-9;
    // the fields every service writes, after the module's own
    svc_beat_add(&b, "busy_fraction", "%.4f", b.busy_s / up);
    svc_beat_add(&b, "busy_s", "%.3f", b.busy_s);
    svc_beat_add(&b, "up_s", "%.3f", b.up_s);
    svc_beat_add(&b, "received", "%llu", (unsigned long long)l->s->received);
    svc_beat_add(&b, "rejected", "%llu", (unsigned long long)l->s->rejected);
    svc_beat_add(&b, "queue", "%.0f", b.queue);
    const char *v[SVC_BEAT_MAX];
    for (int i = 0; i < b.n; i++) v[i] = b.value[i];
    if (l->st) svc_heartbeat(l->s, l->st, SVC_HEARTBEAT_TTL_S, b.n, b.field, v);
    svc_busy(l->s, b.busy_s, b.up_s);
    metrics_set(l->s->met, l->s->m_queue, NULL, b.queue);
}

// Fills the poll set: the handlers' sockets, then the modules' extra sockets. Returns its size.
static int poll_set(svc_loop_t *l) {
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        int want = l->n_h;
        for (int i = 0; i < l->n_x; i++) {
            int nx = 0;
            zsock_t **xs = l->x[i].fn(l->x[i].ctx, &nx);
            for (int j = 0; j < nx; j++)
                if (xs[j]) {
                    if (pass) l->items[n++] = (zmq_pollitem_t){.socket = zsock_resolve(xs[j]), .events = ZMQ_POLLIN};
                    else want++;
                }
        }
        if (!pass) {
            if (want > l->cap_items) {
                l->items = xrealloc(l->items, sizeof *l->items * (size_t)want);
                l->cap_items = want;
            }
            for (int i = 0; i < l->n_h; i++)
                l->items[n++] = (zmq_pollitem_t){.socket = zsock_resolve(l->h[i].sock), .events = ZMQ_POLLIN};
        }
    }
    return n;
}

static void read_frames(svc_loop_t *l, handler_t *h) {
    char err[ERR_LEN];
    for (int i = 0; i < h->per_turn; i++) {
        if (h->room && !h->room(h->ctx)) break;
        zframe_t *f = zframe_recv_nowait(h->sock);
        if (!f) break;
        svc_received(l->s);
        err[0] = 0;
        if (h->frame(h->ctx, f, err)) svc_reject(l->s, NULL, "dropped a malformed %s (%s)", h->what, err);
        zframe_destroy(&f);
    }
}

int svc_loop_run(svc_loop_t *l) {
    l->t_start = util_now();
    int wait_ms = 0;   // the first turn does not wait
    while (!l->stop && !svc_stopping()) {
        double now = util_now();
        int ms = wait_ms;
        for (int i = 0; i < l->n_t; i++) {
            int due = (int)((l->t[i].next - now) * 1000.0);
            if (due < ms) ms = due > 0 ? due : 0;
        }
        int n = poll_set(l);
        zmq_poll(l->items, n, ms);
        svc_tick(l->s);
        double t0 = util_now();
        for (int i = 0; i < l->n_h; i++) {
            if (l->h[i].kind == H_FRAMES) read_frames(l, &l->h[i]);
            else l->h[i].reader(l->h[i].ctx, l->h[i].sock);
        }
        wait_ms = l->idle_ms;
        for (int i = 0; i < l->n_w; i++) {
            int w = l->w[i].fn(l->w[i].ctx);
            if (w >= 0 && w < wait_ms) wait_ms = w;
        }
        now = util_now();
        for (int i = 0; i < l->n_t; i++)
            if (now >= l->t[i].next) {
                l->t[i].next = now + l->t[i].period;
                l->t[i].fn(l->t[i].ctx);
            }
        now = util_now();
        l->busy_s += now - t0;
        if (now - l->last_beat >= SVC_HEARTBEAT_S) {
            l->last_beat = now;
            heartbeat(l, now);
        }
    }
    return l->rc;
}

int svc_loop_serve(svc_t *s, store_t *st, void *module, void (*reg)(void *module, svc_loop_t *l), bool ready_now) {
    svc_loop_t *l = svc_loop_new(s, st);
    reg(module, l);
    if (ready_now) svc_ready(s, true, NULL);
    int rc = svc_loop_run(l);
    svc_loop_destroy(&l);
    return rc;
}

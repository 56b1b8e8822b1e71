// test_loop.c - the services' event loop (common/svc/loop.c) over real ZeroMQ sockets: frames go
// to their handler, counted, with the reject path for refused ones; the room function and the
// per-turn cap hold frames back; readers, extra sockets past any fixed count, work that asks for
// an early turn, timers, the heartbeat's metrics, and the stop.
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <czmq.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/svc/loop.h"
#include "common/util/util.h"

typedef struct {
    svc_loop_t *l;
    int taken, refused, turns, timer, reads, room_left, beats;
    int stop_after_turns;
    int max_per_turn_seen, this_turn;
    double t_first_timer, t_last_timer;
    zsock_t **extra;
    int n_extra;
} ctx_t;

static svc_t svc_for_test(void) {
    svc_t s;
    char *argv[] = {"marlaas-test", "--http", "0", "--insecure", NULL};   // inproc sockets only
    cr_assert_eq(svc_init(&s, "test", 4, argv, ""), 0);
    char err[ERR_LEN];
    cr_assert_eq(svc_serve(&s, err), 0, "%s", err);
    return s;
}

// Frames "ok..." are taken, anything else refused.
static int on_frame(void *p, zframe_t *f, char *err) {
    ctx_t *c = p;
    c->this_turn++;
    if (c->this_turn > c->max_per_turn_seen) c->max_per_turn_seen = c->this_turn;
    if (zframe_size(f) >= 2 && !memcmp(zframe_data(f), "ok", 2)) {
        c->taken++;
        if (c->room_left > 0) c->room_left--;
        return 0;
    }
    c->refused++;
    snprintf(err, ERR_LEN, "not ok");
    return -1;
}

static bool room(void *p) { return ((ctx_t *)p)->room_left != 0; }

static int work_stop(void *p) {
    ctx_t *c = p;
    c->turns++;
    c->this_turn = 0;
    if (c->turns >= c->stop_after_turns) svc_loop_stop(c->l, 7);
    return 0;   // never wait: the test runs its turns back to back
}

static void send_n(zsock_t *push, const char *what, int n) {
    for (int i = 0; i < n; i++) zstr_send(push, what);
}

static void pair(const char *ep, zsock_t **push, zsock_t **pull) {
    *pull = zsock_new_pull(ep);
    *push = zsock_new_push(ep + 1);   // ">inproc://..." connects, "@..." binds
    cr_assert(*pull && *push);
}

Test(loop, frames_counted_rejected_capped_and_stopped) {
    svc_t s = svc_for_test();
    zsock_t *push, *pull;
    pair("@inproc://loop-frames", &push, &pull);
    zsock_set_sndhwm(push, 0);
    send_n(push, "ok-1", 10);
    send_n(push, "bad", 3);
    zclock_sleep(20);
    ctx_t c = {.room_left = -1, .stop_after_turns = 6};
    c.l = svc_loop_new(&s, NULL);
    svc_loop_frames(c.l, pull, "test frame", 4, on_frame, NULL, &c);
    svc_loop_work(c.l, work_stop, &c);
    int rc = svc_loop_run(c.l);
    cr_assert_eq(rc, 7, "the code given to svc_loop_stop is returned");
    cr_assert_eq(c.taken, 10);
    cr_assert_eq(c.refused, 3);
    cr_assert_eq(svc_loop_received(c.l), 13);
    cr_assert_eq(svc_loop_rejected(c.l), 3, "refused frames take the reject path");
    cr_assert_eq(c.max_per_turn_seen, 4, "at most per_turn frames a turn");
    // the families the reject path feeds
    size_t len;
    char *text = metrics_render(s.met, &len);
    cr_assert_not_null(strstr(text, "\nmarlaas_messages_received_total 13\n"), "%s", text);
    cr_assert_not_null(strstr(text, "\nmarlaas_messages_rejected_total 3\n"), "%s", text);
    cr_assert_not_null(strstr(text, "\nmarlaas_errors_total 3\n"), "%s", text);
    free(text);
    svc_loop_destroy(&c.l);
    zsock_destroy(&push);
    zsock_destroy(&pull);
    svc_close(&s);
}

Test(loop, room_holds_frames_back) {
    svc_t s = svc_for_test();
    zsock_t *push, *pull;
    pair("@inproc://loop-room", &push, &pull);
    send_n(push, "ok", 8);
    zclock_sleep(20);
    ctx_t c = {.room_left = 5, .stop_after_turns = 4};
    c.l = svc_loop_new(&s, NULL);
    svc_loop_frames(c.l, pull, "test frame", 100, on_frame, room, &c);
    svc_loop_work(c.l, work_stop, &c);
    svc_loop_run(c.l);
    cr_assert_eq(c.taken, 5, "no frame is taken while the module has no room");
    zframe_t *f = zframe_recv(pull);
    cr_assert_not_null(f, "the rest wait in the socket");
    zframe_destroy(&f);
    svc_loop_destroy(&c.l);
    zsock_destroy(&push);
    zsock_destroy(&pull);
    svc_close(&s);
}

static zsock_t **extra_socks(void *p, int *n) {
    ctx_t *c = p;
    *n = c->n_extra;
    return c->extra;
}

// Reads every extra socket that has a frame; stops at the first.
static int work_extra(void *p) {
    ctx_t *c = p;
    for (int i = 0; i < c->n_extra; i++) {
        zframe_t *f = zframe_recv_nowait(c->extra[i]);
        if (f) c->reads++, zframe_destroy(&f);
    }
    if (c->reads) svc_loop_stop(c->l, 0);
    return -1;   // idle: the loop sleeps until a socket wakes it
}

static void *send_later(void *p) {
    zclock_sleep(200);   // the loop is asleep in its 10 s idle wait by now
    zstr_send(p, "x");
    return NULL;
}

Test(loop, extra_sockets_beyond_any_fixed_count_wake_the_loop) {
    svc_t s = svc_for_test();
    enum { N = 40 };
    zsock_t *push[N], *pull[N];
    ctx_t c = {.n_extra = N};
    c.extra = pull;
    for (int i = 0; i < N; i++) {
        char ep[64];
        snprintf(ep, sizeof ep, "@inproc://loop-extra-%d", i);
        pair(ep, &push[i], &pull[i]);
    }
    c.l = svc_loop_new(&s, NULL);
    svc_loop_idle(c.l, 10000);   // only a socket can end the wait in time
    svc_loop_sockets(c.l, extra_socks, &c);
    svc_loop_work(c.l, work_extra, &c);
    pthread_t th;
    pthread_create(&th, NULL, send_later, push[N - 1]);   // the last socket only
    double t0 = util_now();
    svc_loop_run(c.l);
    double took = util_now() - t0;
    pthread_join(th, NULL);
    cr_assert_eq(c.reads, 1);
    cr_assert_lt(took, 5.0, "the 40th socket woke the loop (took %.1f s)", took);
    svc_loop_destroy(&c.l);
    for (int i = 0; i < N; i++) zsock_destroy(&push[i]), zsock_destroy(&pull[i]);
    svc_close(&s);
}

static void tick(void *p) {
    ctx_t *c = p;
    double now = util_now();
    if (!c->timer) c->t_first_timer = now;
    c->t_last_timer = now;
    if (++c->timer == 5) svc_loop_stop(c->l, 0);
}

static void beat(void *p, svc_beat_t *b) {
    ctx_t *c = p;
    c->beats++;
    b->queue = 42;
    svc_beat_add(b, "things", "%d", 3);
}

Test(loop, timers_keep_their_period_and_the_heartbeat_exports) {
    svc_t s = svc_for_test();
    ctx_t c = {0};
    c.l = svc_loop_new(&s, NULL);
    svc_loop_idle(c.l, 1000);   // the timer, not the idle time, decides when the loop turns
    svc_loop_every(c.l, 0.05, tick, &c);
    svc_loop_heartbeat(c.l, beat, &c);
    double t0 = util_now();
    svc_loop_run(c.l);
    double took = util_now() - t0;
    cr_assert_eq(c.timer, 5);
    cr_assert_lt(c.t_first_timer - t0, 0.04, "the first call comes in the first turn");
    cr_assert_geq(c.t_last_timer - c.t_first_timer, 4 * 0.05 - 0.005, "calls 50 ms apart");
    cr_assert_lt(took, 1.0, "the loop woke for the timer instead of idling 1 s");
    cr_assert_eq(c.beats, 1, "one heartbeat in the first turn, the next after SVC_HEARTBEAT_S");
    size_t len;
    char *text = metrics_render(s.met, &len);
    cr_assert_not_null(strstr(text, "\nmarlaas_queue_depth 42\n"), "the module's queue is exported: %s", text);
    free(text);
    svc_loop_destroy(&c.l);
    svc_close(&s);
}

// A service refuses to start with plain links unless told --insecure: no keys, no service.
Test(loop, service_without_keys_refuses_to_start) {
    unsetenv("MARLAAS_KEYS");
    unsetenv("MARLAAS_INSECURE");
    svc_t s;
    char *argv[] = {"marlaas-test", "--http", "0", NULL};
    cr_assert_eq(svc_init(&s, "test", 3, argv, ""), -1);
    char *argv2[] = {"marlaas-test", "--http", "0", "--keys", "/nonexistent/keys", NULL};
    cr_assert_eq(svc_init(&s, "test", 5, argv2, ""), -1);
    setenv("MARLAAS_INSECURE", "1", 1);
    cr_assert_eq(svc_init(&s, "test", 3, argv, ""), 0);
    unsetenv("MARLAAS_INSECURE");
}

// A flood of refused frames costs one log line per reason (and job), not one per frame; every
// frame is still counted.
Test(loop, rejections_are_logged_once_per_reason_and_all_counted, .init = cr_redirect_stderr) {
    svc_t s = svc_for_test();
    for (int i = 0; i < 1000; i++) svc_reject(&s, NULL, "dropped a malformed report (field %d bad)", i);
    for (int i = 0; i < 3; i++) svc_reject(&s, "j-7", "batch not used: job %d unknown", i);
    svc_reject(&s, "j-8", "batch not used: job 8 unknown");
    svc_tick(&s);   // within the period: nothing summed up yet
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    char line[1024];
    int malformed = 0, unused = 0, other = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "dropped a malformed report")) malformed++;
        else if (strstr(line, "batch not used")) unused++;
        else if (strstr(line, "WARN") || strstr(line, "ERROR")) other++;
    }
    cr_assert_eq(malformed, 1, "%d lines for 1000 malformed frames", malformed);
    cr_assert_eq(unused, 2, "%d lines for one reason of two jobs", unused);
    cr_assert_eq(s.rejected, 1004);
    svc_close(&s);
    (void)other;
}

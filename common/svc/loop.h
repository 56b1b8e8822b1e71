// loop.h - the event loop every service process runs, in the spirit of Redis's `ae`: sockets
// registered with handlers, work that runs every turn, timers, the heartbeat and metrics export,
// the reject path, and the stop on SIGINT/SIGTERM (svc_stopping, with svc.c's deadline).
//
// One turn: wait on every registered socket (and the extra sockets a module names) for at most
// the idle time, or less when a timer is due or a work function asked to be called sooner; mark
// the service alive (/healthz); hand each socket's queued frames to its handler, up to a cap per
// turn and while the module has room; run the readers; run the work functions; run the due
// timers; every SVC_HEARTBEAT_S write the heartbeat and export the common metrics.
//
// Counting: every frame taken from a frame socket counts as received (the marlaas_received_total
// family and the heartbeat's "received"); a handler that refuses a frame returns -1 with the
// reason and the loop takes the reject path (svc_reject): the marlaas_rejected_total and
// marlaas_errors_total families, the heartbeat's "rejected", and one warning line. A module that
// refuses a frame for a reason of its own (a batch of an unknown job) calls svc_reject itself,
// with the job id for the log line, and returns 0.
#ifndef MARLAAS_LOOP_H
#define MARLAAS_LOOP_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/net/store.h"
#include "common/svc/svc.h"

// Heartbeats: every service writes svc:{name}:{id} once a second with a TTL of 10 s (a replica
// missing for 10 s has stopped; `marlaas status` and the benchmark read these hashes).
#define SVC_HEARTBEAT_S 1.0
#define SVC_HEARTBEAT_TTL_S 10
#define SVC_BEAT_MAX 16

typedef struct svc_loop svc_loop_t;

// A heartbeat under construction: the loop fills busy_s with the seconds its handlers and work
// ran, queue with 0; the module's heartbeat function may replace both (busy_s with its own
// compute time, queue with its queued work) and adds its own fields.
typedef struct {
    int n;
    const char *field[SVC_BEAT_MAX];
    char value[SVC_BEAT_MAX][40];
    double busy_s;   // seconds of work so far: busy_fraction = busy_s / up_s
    double queue;    // work queued now (the marlaas_queue gauge)
    double up_s;     // seconds since the loop started (read only)
} svc_beat_t;
// Adds a field (a static string) with a printf-formatted value; ignored past SVC_BEAT_MAX.
void svc_beat_add(svc_beat_t *b, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// One frame from a frame socket. 0: taken (the module owns what it decoded); -1 + err: refused as
// malformed. The loop destroys the frame after the call either way.
typedef int (*svc_frame_fn)(void *ctx, zframe_t *frame, char *err);
// Whether the module has room for more frames this turn (NULL: always).
typedef bool (*svc_room_fn)(void *ctx);
// Reads what it wants from a socket (multi-frame messages, ROUTER requests).
typedef void (*svc_reader_fn)(void *ctx, zsock_t *sock);
// Work of a turn. Returns the longest the loop may wait before the next turn in milliseconds
// (0: more work is queued now), or -1 for no preference (the idle time).
typedef int (*svc_work_fn)(void *ctx);
// Extra sockets to wake on this turn (a module's changing set, e.g. the verifier's reward
// services): an array the module owns and its length.
typedef zsock_t **(*svc_sockets_fn)(void *ctx, int *n);
typedef void (*svc_timer_fn)(void *ctx);
typedef void (*svc_beat_fn)(void *ctx, svc_beat_t *b);

// A loop for service s (after svc_serve), writing heartbeats through st (NULL: none are written;
// the metrics are still exported). Handlers run in registration order.
svc_loop_t *svc_loop_new(svc_t *s, store_t *st);
void svc_loop_destroy(svc_loop_t **pl);

// Frames of sock go to fn, at most per_turn a turn, while room(ctx); `what` names them in the
// reject line ("dropped a malformed WHAT (reason)").
void svc_loop_frames(svc_loop_t *l, zsock_t *sock, const char *what, int per_turn, svc_frame_fn fn, svc_room_fn room,
                     void *ctx);
// sock wakes the loop and fn reads it, every turn.
void svc_loop_reader(svc_loop_t *l, zsock_t *sock, svc_reader_fn fn, void *ctx);
// More sockets to wake on, asked for every turn (their data is read by the module's work).
void svc_loop_sockets(svc_loop_t *l, svc_sockets_fn fn, void *ctx);
void svc_loop_work(svc_loop_t *l, svc_work_fn fn, void *ctx);
// fn every period_s seconds, the first time in the first turn.
void svc_loop_every(svc_loop_t *l, double period_s, svc_timer_fn fn, void *ctx);
// The module's part of the heartbeat (one function per loop).
void svc_loop_heartbeat(svc_loop_t *l, svc_beat_fn fn, void *ctx);
// The longest wait of an idle turn in milliseconds (default 50).
void svc_loop_idle(svc_loop_t *l, int ms);

// Runs turns until the process is told to stop (svc_stopping) or a handler calls
// svc_loop_stop. Returns the code given to svc_loop_stop, else 0.
int svc_loop_run(svc_loop_t *l);
// Ends the loop after the current turn with exit code rc (a module that cannot go on).
void svc_loop_stop(svc_loop_t *l, int rc);

// A service's whole run: a loop on s and st, reg(module, loop) registers the module's handlers,
// the service is marked ready when ready_now (otherwise the module says when, with svc_ready),
// then turns until stopped. Returns svc_loop_run's code.
int svc_loop_serve(svc_t *s, store_t *st, void *module, void (*reg)(void *module, svc_loop_t *l), bool ready_now);

// Counters of the loop's frame sockets.
uint64_t svc_loop_received(const svc_loop_t *l);
uint64_t svc_loop_rejected(const svc_loop_t *l);

#endif

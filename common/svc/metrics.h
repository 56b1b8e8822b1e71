// metrics.h - a service's live counters and health, shared between its main loop (which
// updates them) and its HTTP thread (which serves them): Prometheus text exposition format
// 0.0.4 for GET /metrics, liveness for /healthz, readiness for /readyz.
//
// A family is declared once (name, counter or gauge, help text) and holds one unlabelled series
// and/or one series per job (label job_id: Prometheus itself attaches the label `job` to every
// scraped series, so ours may not be called that). Per-job series are bounded: past
// METRICS_MAX_JOBS jobs in a family the series updated longest ago is dropped. Every call is
// thread-safe (one mutex, held for microseconds).
#ifndef MARLAAS_METRICS_H
#define MARLAAS_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#define METRICS_MAX_FAMILIES 64
#define METRICS_MAX_JOBS 512

typedef enum { MET_COUNTER, MET_GAUGE } met_type_t;

typedef struct metrics metrics_t;

// service and id become the labels of the family marlaas_info (value 1).
metrics_t *metrics_new(const char *service, const char *id);
void metrics_destroy(metrics_t **m);
// Declares a family; returns its handle (>= 0), or -1 when the name is invalid or the table full.
// Declaring a name twice returns the first handle. metrics_def's family shows its unlabelled
// series (at 0) from the start; metrics_def_job's has per-job series only.
int metrics_def(metrics_t *m, const char *name, met_type_t type, const char *help);
int metrics_def_job(metrics_t *m, const char *name, met_type_t type, const char *help);
// Sets / adds to the series of a family; job NULL or "" = the unlabelled series. Invalid
// handles are ignored.
void metrics_set(metrics_t *m, int fam, const char *job, double v);
void metrics_add(metrics_t *m, int fam, const char *job, double dv);
// The current value (0 when the series does not exist).
double metrics_get(metrics_t *m, int fam, const char *job);
// Drops every series of a job (the job ended and its state is gone).
void metrics_forget_job(metrics_t *m, const char *job);

// Liveness: the main loop calls metrics_alive on every turn; /healthz fails once the last call
// is older than stall_s seconds (a loop stuck in one step or a deadlock).
void metrics_alive(metrics_t *m);
void metrics_set_stall(metrics_t *m, double stall_s);
// Readiness: ready, or not with a reason (shown by /readyz).
void metrics_ready(metrics_t *m, bool ready, const char *why_not);
// A check run by /readyz itself (on the HTTP thread, outside the lock) when the service says it
// is ready: returns true, or false with a reason in why (n bytes). For dependencies whose loss
// the main loop would notice only after a long timeout (a stopped Redis).
typedef bool (*metrics_check_fn)(void *ctx, char *why, size_t n);
void metrics_set_check(metrics_t *m, metrics_check_fn fn, void *ctx);

// Body of an endpoint. status: HTTP status code (200, or 503 when unhealthy / not ready).
// Returns a malloc'd NUL-terminated text (caller frees) and its length in *len.
char *metrics_render(metrics_t *m, size_t *len);
char *metrics_health(metrics_t *m, int *status, size_t *len);
char *metrics_readiness(metrics_t *m, int *status, size_t *len);

// Rate of a cumulative value over a sliding window (tokens/s, steps/s, busy fraction): feed it
// (time, cumulative value) samples, about one a second; it returns the increase per second
// since the oldest sample within window_s seconds (over the whole history at the start).
#define MET_WINDOW 32
typedef struct {
    double t[MET_WINDOW], v[MET_WINDOW];
    int n;
} met_window_t;
double met_window_rate(met_window_t *w, double t, double v, double window_s);

#endif

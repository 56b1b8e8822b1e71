// svc.h - what every service process shares: its settings (flags, then environment, then
// defaults), instance id, Redis connection, heartbeat, and a clean stop on SIGINT/SIGTERM.
//
// Settings (flag / environment variable / default):
//   --redis        MARLAAS_REDIS           127.0.0.1:6379
//   --prefix       MARLAAS_PREFIX          marlaas:
//   --model        MARLAAS_MODEL           models/tiny
//   --api          MARLAAS_API             tcp://*:7000            scheduler ROUTER (bind)
//   --work         MARLAAS_WORK            tcp://127.0.0.1:7001    scheduler PUSH (bind tcp://*:7001)
//   --events       MARLAAS_EVENTS          tcp://127.0.0.1:7002    scheduler PUB (job progress)
//   --reports      MARLAAS_REPORTS         tcp://127.0.0.1:7003    scheduler PULL (reports)
//   --verifiers    MARLAAS_VERIFIERS       tcp://127.0.0.1:7010    verifier PULL; rollouts connect to every one
//   --trainer      MARLAAS_TRAINER         tcp://127.0.0.1:7020    trainer PULL
//   --trainer-events MARLAAS_TRAINER_EVENTS tcp://127.0.0.1:7021   trainer PUB (adapter versions)
//   --threads      MARLAAS_THREADS         online cores
//   --admin-token  MARLAAS_ADMIN_TOKEN     (scheduler; required to create tenants)
//   --policy       MARLAAS_POLICY          async                   (scheduler: async | sync)
//   --id           MARLAAS_ID              NAME-HOST-PID
//   --backend      MARLAAS_BACKEND         cpu                     (rollout, trainer: cpu | cuda)
//   --weights      MARLAAS_WEIGHTS         auto                    (rollout, trainer: fp32 | bf16 | auto =
//                                                                   bf16 on cuda, fp32 on cpu)
//   --http         MARLAAS_HTTP            scheduler 9500, rollout 9501, verifier 9502, trainer 9503
//                                          (GET /healthz /readyz /metrics; PORT, HOST:PORT, 0 = off)
//   --log-format   MARLAAS_LOG_FORMAT      text                    (text | json: one JSON object per line, log.h)
// A service binds the endpoints it owns on all interfaces (tcp://*:PORT, port taken from the
// setting) and connects to the others as given.
#ifndef MARLAAS_SVC_H
#define MARLAAS_SVC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/svc/http.h"
#include "common/svc/metrics.h"
#include "common/net/endpoint.h"
#include "common/net/store.h"
#include "common/sim/sim.h"

typedef enum {
    SVC_REDIS, SVC_PREFIX, SVC_MODEL, SVC_API, SVC_WORK, SVC_EVENTS, SVC_REPORTS, SVC_VERIFIERS, SVC_TRAINER,
    SVC_TRAINER_EVENTS, SVC_THREADS, SVC_ADMIN_TOKEN, SVC_POLICY, SVC_ID, SVC_HTTP, SVC_BACKEND, SVC_WEIGHTS,
    SVC_KEYS, SVC_INSECURE, SVC_LOG_FORMAT, SVC_N_OPTS
} svc_opt_t;

typedef struct {
    const char *name;              // service name
    const char *opt[SVC_N_OPTS];
    char id[128];
    char extra[16][2][256];        // service-specific --key=value flags (see svc_extra)
    int n_extra;
    char http_def[16];             // this service's default HTTP port
    metrics_t *met;                // live counters and health (svc_serve); NULL before
    http_srv_t *http;
    bool ready_self;               // the service's own readiness (svc_ready) ...
    bool redis_ok;                 // ... and the last Redis write's outcome
    char not_ready[256];
    // families every service fills (metrics_def handles)
    met_window_t busy_win;
    int m_redis_up, m_busy_s, m_busy_frac, m_received, m_rejected, m_errors, m_queue;
    uint64_t received, rejected;   // input messages taken and refused (svc_received, svc_reject)
} svc_t;

// Parses argv (the common flags above plus --set KEY=VALUE service extras). Prints usage and
// returns 1 for --help, -1 (message on stderr) for a bad flag, 0 otherwise.
int svc_init(svc_t *s, const char *name, int argc, char **argv, const char *help);
const char *svc_get(const svc_t *s, svc_opt_t o);
// The endpoint to bind for a setting: its port on loopback when the setting names a loopback
// address (tcp://127.0.0.1:PORT), else on all interfaces (tcp://*:PORT).
void svc_bind_endpoint(const svc_t *s, svc_opt_t o, char *out, size_t n);
// A service extra (--set key=value), else the environment's MARLAAS_KEY (the key in capitals:
// --set chunk=1 or MARLAAS_CHUNK=1), else def.
const char *svc_extra(const svc_t *s, const char *key, const char *def);
// The simulated backend of --backend sim:DEVICE (common/sim/sim.h) for the model of --model
// (its config.json), with the extras sim_scale (modelled seconds per wall second, default 60),
// sim_lengths (completion lengths, default lognormal:200,0.8), sim_devices (data-parallel
// devices of a trainer, default 1) and sim_coalesce_s (wall seconds of decode steps one generator
// call runs back to back, default 0.001; 0: one step per call), each also from the environment (MARLAAS_SIM_SCALE, ...). NULL + err when the backend is not sim:DEVICE or a setting is
// wrong; the caller owns the result (sim_close).
sim_t *svc_sim_open(const svc_t *s, char *err);
// Where tenants' reward and environment services may be (endpoint.h): the allow-list
// reward_allow (--set reward_allow=LIST, else MARLAAS_REWARD_ALLOW; none: any tcp host), and the
// cluster's own ports refused on every host: the endpoint settings (--api, --work, --events,
// --reports, --verifiers, --trainer, --trainer-events), Redis (--redis) and the trainer's
// dp_endpoint when set. The verifier checks every endpoint it connects to; the scheduler can
// check a job's at submission. NULL + err (naming the setting) for a bad list or setting.
endpoint_rules_t *svc_endpoint_rules(const svc_t *s, char *err);
// Connects to Redis per --redis / --prefix. NULL + err.
store_t *svc_store(const svc_t *s, char *err);
// Writes svc:{name}:{id} (hash of the given fields plus time) with a TTL of ttl seconds.
// Returns 0, or -1 when Redis did not take it (readiness then fails until a write succeeds).
int svc_heartbeat(svc_t *s, store_t *st, int ttl, int n, const char **fields, const char **values);

// Starts the metrics registry and the HTTP endpoint (--http). Call right after svc_init, before
// loading models, so probes answer while the service starts. -1 + err when the port cannot be
// served. With --http 0 the registry still exists and nothing listens.
int svc_serve(svc_t *s, char *err);
// Changes this process's default HTTP setting (PORT, HOST:PORT or 0) before svc_serve; a value
// given by --http or MARLAAS_HTTP stays. A data-parallel trainer worker serves none by default, so
// that it does not take its rank 0's port on the same host.
void svc_http_default(svc_t *s, const char *value);
// svc_serve, then svc_store: the Redis connection of a service that serves its HTTP endpoint.
// NULL (the error logged, everything closed) on failure.
store_t *svc_open(svc_t *s);
// The service's own readiness (combined with Redis reachability for /readyz).
void svc_ready(svc_t *s, bool ready, const char *why_not);
// The main loop turned (liveness for /healthz; ends the periods of rate-limited reject lines).
// Call once per loop iteration.
void svc_tick(svc_t *s);
// Busy accounting for the common families: busy seconds so far and uptime.
void svc_busy(svc_t *s, double busy_s, double up_s);
// An input message taken (the received family and count).
void svc_received(svc_t *s);
// The one reject path: an input message refused (malformed, or unusable: a batch for a job this
// replica does not hold, ...). Counts it (rejected and errors families, s->rejected) and logs a
// warning, of the job when job is not NULL, rate-limited per reason (the message up to " (" or
// ": ") and job: the first at once, then one line with the count of the others every 5 s.
void svc_reject(svc_t *s, const char *job, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Stops the HTTP endpoint and frees the registry.
void svc_close(svc_t *s);
// True once SIGINT or SIGTERM has been received.
bool svc_stopping(void);

#endif

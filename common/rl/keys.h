// keys.h - every Redis key the services use, spelled in one place. Each builds the key (with the
// store's prefix, as store_key does) into buf and returns it, or NULL when it does not fit (the
// store's calls then fail with an error instead of touching another key).
//
//   job:{id}            hash: the job's record (fields below)
//   job:{id}:data       list: its uploaded dataset, one record per entry
//   job:{id}:samples    list: the latest scored samples (JSON: version, reward, completion cut at
//                       JOB_SAMPLE_MAX_BYTES), JOB_SAMPLES_KEPT of them (verifier; the console shows them)
//   jobs                set: every job id
//   jobs:{tenant}       set: the tenant's job ids
//   jobs:seq            counter: the last job number (ids are j-N)
//   adapter:{id}:{ver}  string: version ver of the job's adapter (the trainer keeps the latest few)
//   optim:{id}          string: the job's optimiser state
//   metrics:{id}        stream: the job's steps and evals (field-value entries), bounded
//   tenant:{name}       hash: the tenant's record (quota; optional: the trainer's fair-share weight)
//   tenants             set: every tenant name
//   tenants:seq         counter: tenants created
//   tokens              hash: token hash -> tenant name
//   svc:{name}:{id}     hash with a TTL: a service replica's heartbeat (common/svc/svc.c, below
//                       this layer)
#ifndef MARLAAS_KEYS_H
#define MARLAAS_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "common/net/store.h"

#define KEY_LEN 256   // room for any key below with the longest ids and prefix

// Fields of a job:{id} hash. Written at submission: tenant, spec (canonical JSON), status, step,
// adapter_version, created, updated, issued (prompts issued so far), notes (what the submission
// changed or could not apply, when anything); later: error (why it failed), and of the last eval
// round its step, accuracy, 95 % interval and prompts (eval_acc0: the first round's accuracy).
#define JOB_TENANT "tenant"
#define JOB_SPEC "spec"
#define JOB_STATUS "status"
#define JOB_STEP "step"
#define JOB_VERSION "adapter_version"
#define JOB_CREATED "created"
#define JOB_UPDATED "updated"
#define JOB_ISSUED "issued"
#define JOB_NOTES "notes"
#define JOB_ERROR "error"
#define JOB_EVAL_STEP "eval_step"
#define JOB_EVAL_ACC "eval_acc"
#define JOB_EVAL_LO "eval_lo"
#define JOB_EVAL_HI "eval_hi"
#define JOB_EVAL_N "eval_n"
#define JOB_EVAL_ACC0 "eval_acc0"
// The best evaluated adapter version (its copy: key_adapter_pin "best"): version, the step it was
// evaluated at, accuracy and its 95 % interval. Absent until an eval's version could be kept.
#define JOB_BEST_VERSION "best_version"
#define JOB_BEST_STEP "best_step"
#define JOB_BEST_ACC "best_acc"
#define JOB_BEST_LO "best_lo"
#define JOB_BEST_HI "best_hi"
#define JOB_SAMPLES_KEPT 8            // job:{id}:samples: the latest scored samples kept
#define JOB_SAMPLE_MAX_BYTES 1024     // a kept sample's completion text, cut at a character boundary
#define JOB_DATA_BYTES "data_bytes"   // bytes of the uploaded dataset (absent: none)
// Kept by the trainer with every published step (in the same atomic script): the job's totals of
// trained tokens and compute-seconds (train_s + gen_s) over all its steps, and the latest step's
// mean reward and staleness, so readers need not scan the metrics stream (capped at ~10,000).
#define JOB_TOKENS "tokens"
#define JOB_COMPUTE_S "compute_s"
#define JOB_REWARD "reward"
#define JOB_STALENESS "staleness"
// Fields of a tenant:{name} hash.
#define TENANT_NAME "name"
#define TENANT_TOKEN_HASH "token_hash"
#define TENANT_QUOTA "quota"
#define TENANT_CREATED "created"
#define TENANT_WEIGHT "weight"              // fair-share weight against other tenants, (0, 100] (default 1): scheduler and trainer
#define TENANT_MAX_GROUPS "max_groups"      // groups its jobs may hold in flight together (default below)
#define TENANT_MAX_DATA "max_data_bytes"    // dataset bytes of its queued and running jobs together
#define TENANT_DEFAULT_MAX_GROUPS 1024
#define TENANT_DEFAULT_MAX_DATA (256ll << 20)

const char *key_job(const store_t *st, char *buf, size_t n, const char *job);
const char *key_job_data(const store_t *st, char *buf, size_t n, const char *job);
const char *key_job_samples(const store_t *st, char *buf, size_t n, const char *job);
const char *key_jobs(const store_t *st, char *buf, size_t n);
const char *key_tenant_jobs(const store_t *st, char *buf, size_t n, const char *tenant);
const char *key_job_seq(const store_t *st, char *buf, size_t n);
const char *key_adapter(const store_t *st, char *buf, size_t n, const char *job, uint32_t version);
const char *key_adapter_pin(const store_t *st, char *buf, size_t n, const char *job, const char *which);
const char *key_optim(const store_t *st, char *buf, size_t n, const char *job);
const char *key_metrics(const store_t *st, char *buf, size_t n, const char *job);
const char *key_tenant(const store_t *st, char *buf, size_t n, const char *tenant);
const char *key_tenants(const store_t *st, char *buf, size_t n);
const char *key_tenant_seq(const store_t *st, char *buf, size_t n);
const char *key_tokens(const store_t *st, char *buf, size_t n);

#endif

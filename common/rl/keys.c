// keys.c - the services' Redis keys (keys.h).
#include "common/rl/keys.h"

const char *key_job(const store_t *st, char *buf, size_t n, const char *job) {
    return store_key(st, buf, n, "job:%s", job);
}
const char *key_job_data(const store_t *st, char *buf, size_t n, const char *job) {
    return store_key(st, buf, n, "job:%s:data", job);
}
const char *key_job_samples(const store_t *st, char *buf, size_t n, const char *job) {
    return store_key(st, buf, n, "job:%s:samples", job);
}
const char *key_jobs(const store_t *st, char *buf, size_t n) { return store_key(st, buf, n, "jobs"); }
const char *key_tenant_jobs(const store_t *st, char *buf, size_t n, const char *tenant) {
    return store_key(st, buf, n, "jobs:%s", tenant);
}
const char *key_job_seq(const store_t *st, char *buf, size_t n) { return store_key(st, buf, n, "jobs:seq"); }
const char *key_adapter(const store_t *st, char *buf, size_t n, const char *job, uint32_t version) {
    return store_key(st, buf, n, "adapter:%s:%u", job, version);
}
// A copy of one version kept apart from the numbered ones the trainer rotates: "eval" (the version
// an eval round runs on, copied when it starts) and "best" (the best evaluated one).
const char *key_adapter_pin(const store_t *st, char *buf, size_t n, const char *job, const char *which) {
    return store_key(st, buf, n, "adapter:%s:%s", job, which);
}
const char *key_optim(const store_t *st, char *buf, size_t n, const char *job) {
    return store_key(st, buf, n, "optim:%s", job);
}
const char *key_metrics(const store_t *st, char *buf, size_t n, const char *job) {
    return store_key(st, buf, n, "metrics:%s", job);
}
const char *key_tenant(const store_t *st, char *buf, size_t n, const char *tenant) {
    return store_key(st, buf, n, "tenant:%s", tenant);
}
const char *key_tenants(const store_t *st, char *buf, size_t n) { return store_key(st, buf, n, "tenants"); }
const char *key_tenant_seq(const store_t *st, char *buf, size_t n) { return store_key(st, buf, n, "tenants:seq"); }
const char *key_tokens(const store_t *st, char *buf, size_t n) { return store_key(st, buf, n, "tokens"); }

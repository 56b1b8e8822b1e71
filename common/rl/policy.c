// policy.c - the scheduler's decisions (see policy.h for the semantics they keep).
#include "common/rl/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/util.h"

// --- fair share and the in-flight cap --------------------------------------------------------

int policy_cap(sched_policy_t p, int prompts, int staleness) {
    return p == POLICY_SYNC ? prompts : (staleness + 1) * prompts;
}

int policy_room(sched_policy_t p, const policy_job_t *j) {
    if (!j->running || j->step >= j->max_steps || j->tenant_full) return 0;
    if (p == POLICY_SYNC && j->sync_waiting) return 0;
    int room = policy_cap(p, j->prompts, j->staleness) - j->in_flight;
    return room > 0 ? room : 0;
}

int policy_next_job(sched_policy_t p, const policy_job_t *jobs, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (policy_room(p, &jobs[i]) <= 0) continue;
        // (tenant time, job time) strictly smaller: a tie goes to the job earlier in the table
        if (best < 0 || jobs[i].tenant_vtime < jobs[best].tenant_vtime ||
            (jobs[i].tenant_vtime == jobs[best].tenant_vtime && jobs[i].vtime < jobs[best].vtime))
            best = i;
    }
    return best;
}

uint32_t policy_task_size(int room, int chunk) { return (uint32_t)(room < chunk ? room : chunk); }

double policy_charge(double vtime, uint32_t n, double weight) { return vtime + n / weight; }

double policy_start_vtime(const policy_job_t *jobs, int n, int tenant) {
    double vmin = 0;
    bool any = false;
    for (int i = 0; i < n; i++)
        if (jobs[i].running && jobs[i].tenant == tenant && (!any || jobs[i].vtime < vmin)) vmin = jobs[i].vtime, any = true;
    return vmin;
}

double policy_tenant_start_vtime(const policy_job_t *jobs, int n, double own) {
    double vmin = 0;
    bool any = false;
    for (int i = 0; i < n; i++)
        if (jobs[i].running && (!any || jobs[i].tenant_vtime < vmin)) vmin = jobs[i].tenant_vtime, any = true;
    return any && vmin > own ? vmin : own;
}

bool policy_sync_full(sched_policy_t p, int in_flight, int prompts) { return p == POLICY_SYNC && in_flight >= prompts; }

bool policy_admit(sched_policy_t p, int running) { return p != POLICY_SYNC || running == 0; }

bool policy_stale(uint32_t current, uint32_t sampled, int staleness) {
    // a version the trainer has not published yet is no version of this job (a forged or
    // corrupted batch): never trained, and no wrap-around makes it look fresh
    return sampled > current || (int64_t)current - (int64_t)sampled > staleness;
}

// --- leases -----------------------------------------------------------------------------------

void policy_leases_free(policy_leases_t *t) {
    for (int i = 0; i < t->n; i++) free(t->v[i].index);
    free(t->v);
    *t = (policy_leases_t){0};
}

void policy_lease_add(policy_leases_t *t, uint64_t id, const char *job, proto_kind_t kind, const uint64_t *index,
                      uint32_t n, uint32_t version, int round, double deadline) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->v = xrealloc(t->v, sizeof(policy_lease_t) * (size_t)t->cap);
    }
    policy_lease_t *k = &t->v[t->n++];
    *k = (policy_lease_t){.id = id, .kind = kind, .n = n, .version = version, .round = round, .deadline = deadline};
    snprintf(k->job, sizeof k->job, "%s", job);
    k->index = xmalloc(sizeof(uint64_t) * (n ? n : 1));
    if (n) memcpy(k->index, index, sizeof(uint64_t) * n);
}

int policy_lease_find(const policy_leases_t *t, uint64_t id, const char *job) {
    for (int i = 0; i < t->n; i++)
        if (t->v[i].id == id && (!job || !strcmp(t->v[i].job, job))) return i;
    return -1;
}

void policy_lease_take(policy_leases_t *t, int i, policy_lease_t *out) {
    if (out) *out = t->v[i];
    else free(t->v[i].index);
    t->v[i] = t->v[--t->n];
}

void policy_leases_drop_job(policy_leases_t *t, const char *job) {
    for (int i = 0; i < t->n;)
        if (!strcmp(t->v[i].job, job)) policy_lease_take(t, i, NULL);
        else i++;
}

bool policy_lease_expired(double deadline, double now) { return now >= deadline; }

int policy_lease_next_expired(const policy_leases_t *t, int from, double now) {
    for (int i = from < 0 ? 0 : from; i < t->n; i++)
        if (policy_lease_expired(t->v[i].deadline, now)) return i;
    return -1;
}

bool policy_reissue(const policy_lease_t *k, int eval_round, uint32_t version, uint32_t eval_version,
                    uint32_t *reissue_version) {
    if (k->kind == PROTO_KIND_EVAL) {
        // an eval measures one version: its lost examples go out again on that version, and only
        // while their round still runs
        if (k->round != eval_round) return false;
        *reissue_version = eval_version;
        return true;
    }
    // training prompts are fresh data: they go out on the version current now
    *reissue_version = version;
    return true;
}

bool policy_trainer_lost(double now, double last_step_time, double lease_s, int at_trainer, int prompts) {
    return at_trainer >= prompts && now - last_step_time > lease_s;
}

// --- reports ----------------------------------------------------------------------------------

policy_result_t policy_result(policy_leases_t *t, uint64_t id, int eval_round, policy_lease_t *out) {
    int i = policy_lease_find(t, id, NULL);
    if (i < 0) {
        *out = (policy_lease_t){0};
        return POLICY_RESULT_IGNORE;
    }
    policy_lease_take(t, i, out);
    if (out->kind != PROTO_KIND_EVAL) return POLICY_RESULT_TRAIN;
    return out->round == eval_round ? POLICY_RESULT_EVAL : POLICY_RESULT_IGNORE;
}

void policy_step_report(uint32_t *step, uint32_t *version, uint32_t rep_step, uint32_t rep_version) {
    if (rep_step > *step || rep_version > *version) {
        *step = rep_step;
        *version = rep_version;
    }
}

// --- adapter slots -----------------------------------------------------------------------------

int policy_adapter_slot(const policy_slot_t *slots, int n, const char *job, uint32_t version, bool *hit) {
    int pick = -1;
    double oldest = 1e300;
    *hit = false;
    for (int i = 0; i < n; i++) {
        const policy_slot_t *s = &slots[i];
        if (s->loaded && s->version == version && !strcmp(s->job, job)) {
            *hit = true;
            return i;
        }
        // an empty slot beats any loaded one (oldest -1); among loaded ones the oldest use
        if (s->refs == 0 && (!s->loaded || s->last_used < oldest)) {
            oldest = s->loaded ? s->last_used : -1.0;
            pick = i;
        }
    }
    return pick;
}

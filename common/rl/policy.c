// policy.c - the scheduler's decisions (see policy.h for the semantics they keep).
#include "common/rl/policy.h"

#include <math.h>
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

int policy_in_flight(int in_rollout, int at_trainer, int ahead) {
    int n = in_rollout + at_trainer - ahead;
    return n > 0 ? n : 0;
}

bool policy_sync_full(sched_policy_t p, int in_flight, int prompts) { return p == POLICY_SYNC && in_flight >= prompts; }

bool policy_admit(sched_policy_t p, int running, int max_running) {
    if (p == POLICY_SYNC) return running == 0;
    return max_running <= 0 || running < max_running;
}

bool policy_stale(uint32_t current, uint32_t sampled, int staleness) {
    // a version the trainer has not published yet is no version of this job (a forged or
    // corrupted batch): never trained, and no wrap-around makes it look fresh
    return sampled > current || (int64_t)current - (int64_t)sampled > staleness;
}

// --- training passes ---------------------------------------------------------------------------

static double weight_of(double w) { return w > 0 ? w : 1.0; }

int policy_train_pick(const policy_tjob_t *jobs, int n, const policy_ttenant_t *tenants, int n_tenants,
                      double budget, int passes, int max, int *picked) {
    if (n < 1 || n_tenants < 1 || max < 1) return 0;
    if (passes < 1) passes = 1;
    // per tenant: tentative time, ready jobs not yet taken, whether it has an active job
    double *tv = xmalloc(sizeof(double) * (size_t)n_tenants);
    int *left = xcalloc((size_t)n_tenants, sizeof(int));
    bool *taken = xcalloc((size_t)n, sizeof(bool)), *active = xcalloc((size_t)n_tenants, sizeof(bool));
    for (int t = 0; t < n_tenants; t++) tv[t] = tenants[t].vtime;
    for (int i = 0; i < n; i++) {
        if (!jobs[i].present) continue;
        ASSERT(jobs[i].tenant >= 0 && jobs[i].tenant < n_tenants);
        left[jobs[i].tenant] += jobs[i].ready;
        // in play: a tenant with a ready job; one whose data is still arriving does not hold the
        // pass back (the pass is work-conserving: it cannot use the capacity now)
        active[jobs[i].tenant] |= jobs[i].ready;
    }
    int np = 0, pass = 1;
    double rows = 0;   // of the pass being filled
    while (np < max) {
        int best = -1;
        double emin = 0;
        bool exhausted = false;
        for (int t = 0; t < n_tenants; t++) {
            if (left[t] > 0 && (best < 0 || tv[t] < tv[best])) best = t;
            if (active[t] && left[t] == 0 && (!exhausted || tv[t] < emin)) emin = tv[t], exhausted = true;
        }
        if (best < 0) break;
        // more of this tenant would go beyond a tenant in play that has nothing more to add
        // (reached within rounding: three charges of rows / 3 reach rows)
        if (np > 0 && exhausted && tv[best] >= emin - 1e-9 * fabs(emin)) break;
        int k = -1;
        for (int i = 0; i < n; i++)
            if (jobs[i].present && jobs[i].ready && !taken[i] && jobs[i].tenant == best &&
                (k < 0 || jobs[i].vtime < jobs[k].vtime))
                k = i;
        ASSERT(k >= 0);
        if (rows > 0 && rows + jobs[k].rows > budget) {
            if (pass == passes) break;
            pass++, rows = 0;   // the next pass; a job over the budget fills one alone
        }
        taken[k] = true;
        picked[np++] = k;
        rows += jobs[k].rows;
        left[best]--;
        tv[best] += jobs[k].rows / weight_of(tenants[best].weight);
    }
    free(tv), free(left), free(taken), free(active);
    return np;
}

void policy_train_charge(policy_tjob_t *jobs, int n, policy_ttenant_t *tenants, int n_tenants, const int *picked,
                         int n_picked) {
    bool *taken = xcalloc((size_t)(n > 0 ? n : 1), sizeof(bool));
    for (int p = 0; p < n_picked; p++) {
        policy_tjob_t *j = &jobs[picked[p]];
        ASSERT(picked[p] >= 0 && picked[p] < n && j->tenant >= 0 && j->tenant < n_tenants);
        taken[picked[p]] = true;
        j->vtime += j->rows / weight_of(j->weight);
        tenants[j->tenant].vtime += j->rows / weight_of(tenants[j->tenant].weight);
    }
    // tenants: with ready jobs (in play), with ready jobs left out (waiting), with jobs at all
    uint8_t *st = xcalloc((size_t)n_tenants, 1);
    enum { PRESENT = 1, IN_PLAY = 2, WAITING = 4 };
    for (int i = 0; i < n; i++) {
        if (!jobs[i].present) continue;
        uint8_t *s = &st[jobs[i].tenant];
        *s |= PRESENT;
        if (jobs[i].ready) *s |= IN_PLAY | (taken[i] ? 0 : WAITING);
    }
    double ref = 0;
    bool waiting = false, in_play = false;
    for (int t = 0; t < n_tenants; t++) {
        if ((st[t] & WAITING) && (!waiting || tenants[t].vtime < ref)) ref = tenants[t].vtime, waiting = true;
        in_play |= (st[t] & IN_PLAY) != 0;
    }
    if (!waiting && in_play)
        for (int t = 0; t < n_tenants; t++)
            if ((st[t] & IN_PLAY) && tenants[t].vtime > ref) ref = tenants[t].vtime;
    for (int t = 0; t < n_tenants && in_play; t++)
        // while some wait, only tenants without a ready job are lifted; when none waits, all
        if ((st[t] & PRESENT) && (waiting ? !(st[t] & IN_PLAY) : true) && tenants[t].vtime < ref) tenants[t].vtime = ref;
    // the jobs of each tenant, the same way
    for (int t = 0; t < n_tenants; t++) {
        if (!(st[t] & PRESENT)) continue;
        double jref = 0;
        bool jwait = false, jplay = false;
        for (int i = 0; i < n; i++) {
            if (!jobs[i].present || jobs[i].tenant != t || !jobs[i].ready) continue;
            jplay = true;
            if (!taken[i] && (!jwait || jobs[i].vtime < jref)) jref = jobs[i].vtime, jwait = true;
        }
        if (!jplay) continue;
        if (!jwait)
            for (int i = 0; i < n; i++)
                if (jobs[i].present && jobs[i].tenant == t && jobs[i].ready && jobs[i].vtime > jref) jref = jobs[i].vtime;
        for (int i = 0; i < n; i++)
            if (jobs[i].present && jobs[i].tenant == t && (jwait ? !jobs[i].ready : true) && jobs[i].vtime < jref)
                jobs[i].vtime = jref;
    }
    free(st), free(taken);
}

double policy_train_tenant_start(const policy_tjob_t *jobs, int n, const policy_ttenant_t *tenants, int n_tenants) {
    double vmin = 0;
    bool any = false;
    for (int i = 0; i < n; i++)
        if (jobs[i].present && jobs[i].tenant >= 0 && jobs[i].tenant < n_tenants &&
            (!any || tenants[jobs[i].tenant].vtime < vmin))
            vmin = tenants[jobs[i].tenant].vtime, any = true;
    return vmin;
}

double policy_train_job_start(const policy_tjob_t *jobs, int n, int tenant) {
    double vmin = 0;
    bool any = false;
    for (int i = 0; i < n; i++)
        if (jobs[i].present && jobs[i].tenant == tenant && (!any || jobs[i].vtime < vmin)) vmin = jobs[i].vtime, any = true;
    return vmin;
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

void policy_trainer_verified(int *at_trainer, int *ahead, int n) {
    int early = n < *ahead ? n : *ahead;
    *ahead -= early;
    *at_trainer += n - early;
}

void policy_trainer_released(int *at_trainer, int *ahead, int n, int cap) {
    *at_trainer -= n;
    if (*at_trainer < 0) {
        *ahead -= *at_trainer;
        if (*ahead > cap) *ahead = cap;
        *at_trainer = 0;
    }
}

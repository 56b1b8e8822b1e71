// worker.c - rollout tasks -> generation requests across jobs, adapter LRU, task assembly.
#include "services/rollout/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/log.h"

typedef struct {
    char job[PROTO_MAX_ID];
    uint32_t version;
    int refs;              // tasks using it
    bool loaded;
    double last_used;
} aslot_t;

typedef struct {
    proto_task_t t;
    uint32_t wid;          // worker-local id, carried in generation requests
    int slot;              // adapter slot, -1 until admitted
    uint32_t remaining;
    proto_group_t *groups; // (n_items)
    uint64_t tokens;
    bool failed;
    char error[ERR_LEN];
} wtask_t;

struct worker {
    rl_runtime_t *rt;
    store_t *st;
    char id[128];
    aslot_t *slots;
    int n_slots;
    wtask_t **tasks;
    int n_tasks, cap_tasks;
    uint32_t next_wid;
    proto_batch_t **done;
    char (*done_err)[ERR_LEN];
    int n_done, cap_done;
    char last_error[ERR_LEN];
    double busy;
    uint64_t tokens;
};

worker_t *worker_new(rl_runtime_t *rt, store_t *st, const char *id, char *err) {
    if (!rt || !st) {
        err_set(err, "worker_new: runtime and store required");
        return NULL;
    }
    worker_t *w = xcalloc(1, sizeof *w);
    w->rt = rt;
    w->st = st;
    snprintf(w->id, sizeof w->id, "%s", id);
    w->n_slots = lora_pool_slots(rt->pool);
    w->slots = xcalloc((size_t)w->n_slots, sizeof(aslot_t));
    return w;
}

static void task_free(wtask_t *k) {
    if (!k) return;
    for (uint32_t i = 0; k->groups && i < k->t.n_items; i++) {
        proto_group_t *g = &k->groups[i];
        free(g->prompt);
        for (uint32_t s = 0; s < g->n_samples; s++) {
            free(g->samples[s].tokens);
            free(g->samples[s].logprobs);
            free(g->samples[s].text);
        }
        free(g->samples);
    }
    free(k->groups);
    proto_task_free(&k->t);
    free(k);
}

void worker_destroy(worker_t **pw) {
    if (!pw || !*pw) return;
    worker_t *w = *pw;
    for (int i = 0; i < w->n_tasks; i++) task_free(w->tasks[i]);
    for (int i = 0; i < w->n_done; i++) {
        proto_batch_free(w->done[i]);
        free(w->done[i]);
    }
    free(w->tasks), free(w->done), free(w->done_err), free(w->slots);
    free(w);
    *pw = NULL;
}

void worker_add(worker_t *w, proto_task_t *m) {
    wtask_t *k = xcalloc(1, sizeof *k);
    k->t = *m;
    memset(m, 0, sizeof *m);
    k->wid = w->next_wid++;
    k->slot = -1;
    k->remaining = k->t.n_items;
    k->groups = xcalloc(k->t.n_items ? k->t.n_items : 1, sizeof(proto_group_t));
    for (uint32_t i = 0; i < k->t.n_items; i++) k->groups[i].index = k->t.items[i].index;
    if (w->n_tasks == w->cap_tasks) {
        w->cap_tasks = w->cap_tasks ? 2 * w->cap_tasks : 16;
        w->tasks = xrealloc(w->tasks, sizeof(wtask_t *) * (size_t)w->cap_tasks);
    }
    w->tasks[w->n_tasks++] = k;
}

// Loads (job, version) into slot s from Redis.
static int load_adapter(worker_t *w, int s, const char *job, uint32_t version, char *err) {
    char key[256];
    uint8_t *blob = NULL;
    size_t len = 0;
    store_key(w->st, key, sizeof key, "adapter:%s:%u", job, version);
    int rc = store_get(w->st, key, &blob, &len, err);
    if (rc != 0) {
        if (rc == 1) err_set(err, "adapter version %u of job %s is not in Redis (evicted or never published)", version, job);
        return -1;
    }
    lora_t *a = lora_deserialize(blob, len, &w->rt->model->cfg, kernels_cpu(), err);
    free(blob);
    if (!a || lora_pool_set(w->rt->pool, s, &a, err)) {
        lora_destroy(&a);
        return -1;
    }
    aslot_t *sl = &w->slots[s];
    snprintf(sl->job, sizeof sl->job, "%s", job);
    sl->version = version;
    sl->loaded = true;
    return 0;
}

// Finds or loads the adapter a task needs; -1 when no slot is free (task waits), -2 on error.
static int acquire(worker_t *w, wtask_t *k) {
    int free_slot = -1;
    double oldest = 1e300;
    for (int i = 0; i < w->n_slots; i++) {
        aslot_t *s = &w->slots[i];
        if (s->loaded && s->version == k->t.adapter_version && !strcmp(s->job, k->t.job)) {
            s->refs++;
            s->last_used = util_now();
            return i;
        }
        if (s->refs == 0 && (!s->loaded || s->last_used < oldest)) {
            oldest = s->loaded ? s->last_used : -1.0;
            free_slot = i;
        }
    }
    if (free_slot < 0) return -1;
    if (w->slots[free_slot].loaded)
        logj_debug(w->slots[free_slot].job, "adapter version %u evicted (LRU)", w->slots[free_slot].version);
    w->slots[free_slot].loaded = false;
    if (load_adapter(w, free_slot, k->t.job, k->t.adapter_version, k->error)) return -2;
    w->slots[free_slot].refs = 1;
    w->slots[free_slot].last_used = util_now();
    return free_slot;
}

static void finish(worker_t *w, int idx) {
    wtask_t *k = w->tasks[idx];
    proto_batch_t *b = xcalloc(1, sizeof *b);
    b->task_id = k->t.task_id;
    b->job = k->t.job, k->t.job = NULL;
    b->adapter_version = k->t.adapter_version;
    b->kind = k->t.kind;
    b->temperature = k->t.kind == PROTO_KIND_EVAL ? 0.0f : k->t.temperature;
    b->worker = xstrdup(w->id);
    b->gen_seconds = w->tokens ? w->busy * (double)k->tokens / (double)w->tokens : 0.0;
    if (!k->failed) {
        b->n_groups = k->t.n_items;
        b->groups = k->groups, k->groups = NULL;
    }
    if (k->slot >= 0) w->slots[k->slot].refs--;
    if (w->n_done == w->cap_done) {
        w->cap_done = w->cap_done ? 2 * w->cap_done : 16;
        w->done = xrealloc(w->done, sizeof(proto_batch_t *) * (size_t)w->cap_done);
        w->done_err = xrealloc(w->done_err, sizeof(w->done_err[0]) * (size_t)w->cap_done);
    }
    snprintf(w->done_err[w->n_done], ERR_LEN, "%s", k->failed ? k->error : "");
    w->done[w->n_done++] = b;
    task_free(k);
    memmove(&w->tasks[idx], &w->tasks[idx + 1], sizeof(wtask_t *) * (size_t)(w->n_tasks - idx - 1));
    w->n_tasks--;
}

// Submits the items of an admitted task to the generator.
static void submit(worker_t *w, wtask_t *k) {
    const char *nl = "\n";
    int ctx = w->rt->model->cfg.max_position_embeddings;
    for (uint32_t i = 0; i < k->t.n_items; i++) {
        int32_t *ids = NULL;
        char err[ERR_LEN];
        int n = tokenizer_encode(w->rt->tok, k->t.items[i].prompt, strlen(k->t.items[i].prompt), &ids, err);
        int room = ctx - n;
        bool eval = k->t.kind == PROTO_KIND_EVAL;
        gen_request_t rq = {.prompt = ids, .prompt_len = n, .slot = k->slot, .n_samples = eval ? 1 : (int)k->t.group,
                            .max_new_tokens = (int)k->t.max_new < room ? (int)k->t.max_new : room,
                            .sp = {.temperature = eval ? 0.0f : k->t.temperature, .top_k = (int)k->t.top_k,
                                   .top_p = k->t.top_p > 0 ? k->t.top_p : 1.0f},
                            .seed = k->t.seed + k->t.items[i].index * 1000003ull, .stop_ids = &w->rt->eos,
                            .n_stop_ids = 1, .stop_strings = &nl, .n_stop_strings = 1,
                            .user = ((uint64_t)k->wid << 20) | i};
        if (n < 0) snprintf(k->error, sizeof k->error, "item %u: %.200s", i, err);
        else if (rq.max_new_tokens < 1) snprintf(k->error, sizeof k->error, "item %u: prompt of %d tokens fills the context", i, n);
        else if (gen_submit(w->rt->gen, &rq, err) < 0) snprintf(k->error, sizeof k->error, "item %u: %.200s", i, err);
        else {
            k->groups[i].n_prompt = (uint32_t)n;
            k->groups[i].prompt = ids;
            continue;
        }
        free(ids);
        // the items already submitted still complete; the task is reported failed at the end
        k->failed = true;
        k->remaining--;
    }
}

int worker_step(worker_t *w) {
    for (int i = 0; i < w->n_tasks; i++) {
        wtask_t *k = w->tasks[i];
        if (k->slot >= 0 || k->failed) continue;
        int s = acquire(w, k);
        if (s == -1) break;   // FIFO: later tasks wait behind this one
        if (s == -2) {
            k->failed = true;
            k->remaining = 0;
            continue;
        }
        k->slot = s;
        submit(w, k);
    }
    double t0 = util_now();
    char err[ERR_LEN];
    int rows = gen_pending(w->rt->gen) ? gen_step(w->rt->gen, err) : 0;
    if (rows < 0) log_error("generation step failed: %s", err);
    if (rows > 0) {
        w->busy += util_now() - t0;
        w->tokens += (uint64_t)rows;
    }
    gen_result_t *r;
    while ((r = gen_take(w->rt->gen))) {
        uint32_t wid = (uint32_t)(r->user >> 20), item = (uint32_t)(r->user & 0xFFFFF);
        wtask_t *k = NULL;
        for (int i = 0; i < w->n_tasks && !k; i++)
            if (w->tasks[i]->wid == wid) k = w->tasks[i];
        if (k && item < k->t.n_items) {
            proto_group_t *g = &k->groups[item];
            g->n_samples = (uint32_t)r->n_samples;
            g->samples = xcalloc((size_t)r->n_samples, sizeof(proto_sample_t));
            for (int s = 0; s < r->n_samples; s++) {
                gen_sample_t *gs = &r->samples[s];
                g->samples[s] = (proto_sample_t){.n = (uint32_t)gs->n, .tokens = gs->tokens, .logprobs = gs->logprobs,
                                                 .text = gs->text ? gs->text : xstrdup(""), .finish = (uint8_t)gs->finish};
                k->tokens += (uint64_t)gs->n;
                gs->tokens = NULL, gs->logprobs = NULL, gs->text = NULL;
            }
            k->tokens += g->n_prompt;
            k->remaining--;
        }
        gen_result_free(&r);
    }
    for (int i = 0; i < w->n_tasks;) {
        if (w->tasks[i]->remaining == 0 && (w->tasks[i]->slot >= 0 || w->tasks[i]->failed)) finish(w, i);
        else i++;
    }
    return rows > 0 ? rows : 0;
}

proto_batch_t *worker_take(worker_t *w, const char **error) {
    if (w->n_done == 0) return NULL;
    proto_batch_t *b = w->done[0];
    snprintf(w->last_error, sizeof w->last_error, "%s", w->done_err[0]);
    memmove(&w->done[0], &w->done[1], sizeof(proto_batch_t *) * (size_t)(w->n_done - 1));
    memmove(&w->done_err[0], &w->done_err[1], sizeof(w->done_err[0]) * (size_t)(w->n_done - 1));
    w->n_done--;
    if (error) *error = w->last_error;
    return b;
}

void worker_adapter_event(worker_t *w, const char *job, uint32_t version) {
    for (int i = 0; i < w->n_slots; i++) {
        aslot_t *s = &w->slots[i];
        if (s->loaded && s->refs == 0 && !strcmp(s->job, job) && s->version < version) {
            char err[ERR_LEN];
            s->loaded = false;
            if (load_adapter(w, i, job, version, err)) logj_debug(job, "prefetch of version %u failed: %s", version, err);
            return;
        }
    }
}

int worker_pending(const worker_t *w) { return w->n_tasks + w->n_done; }
double worker_busy_seconds(const worker_t *w) { return w->busy; }
uint64_t worker_tokens(const worker_t *w) { return w->tokens; }

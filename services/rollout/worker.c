// worker.c - rollout tasks -> generation requests across jobs, adapter LRU, task assembly.
#include "services/rollout/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tasks/env.h"
#include "common/util/log.h"
#include "common/rl/keys.h"
#include "common/rl/policy.h"

typedef policy_slot_t aslot_t;   // an adapter slot: what it holds, who uses it (policy.h)

// A tool call ends a model turn of a multi-turn episode (the environment answers it).
#define CALL_END ENV_CALL_END

typedef struct {
    proto_task_t t;
    uint32_t wid;          // worker-local id, carried in generation requests
    int slot;              // adapter slot, -1 until admitted
    uint32_t remaining;    // generation requests not yet returned
    proto_group_t *groups; // (n_items)
    bool cont;             // the next turn of episodes (groups came with the task)
    uint64_t tokens;
    bool failed;
    char error[ERR_LEN];
} wtask_t;

// A generation request's tag: the task, its item and (continued episodes) the sample + 1.
static uint64_t tag(uint32_t wid, uint32_t item, uint32_t sample1) {
    return (uint64_t)wid << 32 | (uint64_t)item << 12 | sample1;
}

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

static void task_push(worker_t *w, wtask_t *k) {
    if (w->n_tasks == w->cap_tasks) {
        w->cap_tasks = w->cap_tasks ? 2 * w->cap_tasks : 16;
        w->tasks = xrealloc(w->tasks, sizeof(wtask_t *) * (size_t)w->cap_tasks);
    }
    w->tasks[w->n_tasks++] = k;
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
    task_push(w, k);
}

void worker_add_cont(worker_t *w, proto_batch_t *b) {
    wtask_t *k = xcalloc(1, sizeof *k);
    proto_task_t *t = &k->t;
    t->task_id = b->task_id;
    t->job = b->job, b->job = NULL;
    t->adapter_version = b->adapter_version;
    t->kind = b->kind;
    t->temperature = b->temperature;
    t->top_p = b->top_p, t->top_k = b->top_k, t->max_new = b->max_new, t->seed = b->seed;
    t->max_turns = b->max_turns, t->max_ctx = b->max_ctx;
    t->has_tag = b->has_tag;
    memcpy(t->tag, b->tag, sizeof t->tag);
    t->n_items = b->n_groups;
    t->items = xcalloc(b->n_groups ? b->n_groups : 1, sizeof *t->items);
    for (uint32_t i = 0; i < b->n_groups; i++) t->items[i] = (proto_item_t){.index = b->groups[i].index, .prompt = xstrdup("")};
    k->groups = b->groups, b->groups = NULL, b->n_groups = 0;
    k->cont = true;
    k->wid = w->next_wid++;
    k->slot = -1;
    for (uint32_t i = 0; i < t->n_items; i++)
        for (uint32_t j = 0; j < k->groups[i].n_samples; j++) k->remaining += k->groups[i].samples[j].pending;
    proto_batch_free(b);
    task_push(w, k);
}

// Loads (job, version) into slot s from Redis.
static int load_adapter(worker_t *w, int s, const char *job, uint32_t version, char *err) {
    char key[256];
    uint8_t *blob = NULL;
    size_t len = 0;
    key_adapter(w->st, key, sizeof key, job, version);
    int rc = store_get(w->st, key, &blob, &len, err);
    if (rc != 0) {
        if (rc == 1) err_set(err, "adapter version %u of job %s is not in Redis (evicted or never published)", version, job);
        return -1;
    }
    lora_t *a = lora_deserialize(blob, len, &w->rt->model->cfg, w->rt->model->k, err);
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
    bool hit;
    int free_slot = policy_adapter_slot(w->slots, w->n_slots, k->t.job, k->t.adapter_version, &hit);
    if (hit) {
        w->slots[free_slot].refs++;
        w->slots[free_slot].last_used = util_now();
        return free_slot;
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
    b->max_new = k->t.max_new, b->top_k = k->t.top_k, b->top_p = k->t.top_p, b->seed = k->t.seed;
    b->max_turns = k->t.max_turns ? k->t.max_turns : 1, b->max_ctx = k->t.max_ctx;
    b->has_tag = k->t.has_tag;   // the scheduler's proof of issue travels with the results
    memcpy(b->tag, k->t.tag, sizeof b->tag);
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

// The positions a task's episodes may fill: the runtime's context (rl.h: max_context), or the
// job's env.max_context when smaller.
static int room_of(const worker_t *w, const wtask_t *k) {
    int ctx = w->rt->max_context;
    return k->t.max_ctx > 0 && (int)k->t.max_ctx < ctx ? (int)k->t.max_ctx : ctx;
}

// Appends n tokens (environment's or the model's) to an episode.
static void episode_append(proto_sample_t *s, const int32_t *tok, const float *lp, int n, uint8_t env) {
    if (n <= 0) return;
    s->tokens = xrealloc(s->tokens, sizeof(int32_t) * (s->n + (size_t)n));
    s->logprobs = xrealloc(s->logprobs, sizeof(float) * (s->n + (size_t)n));
    if (env || s->env) {
        s->env = xrealloc(s->env, s->n + (size_t)n);
        memset(s->env + s->n, env, (size_t)n);
    }
    memcpy(s->tokens + s->n, tok, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) s->logprobs[s->n + i] = lp ? lp[i] : 0.0f;
    s->n += (uint32_t)n;
}

// Submits the next turn of every pending episode of a continued task: its observation becomes
// environment tokens, then one sample continues from prompt + episode so far.
static void submit_cont(worker_t *w, wtask_t *k) {
    static const char *stops[2] = {"\n", CALL_END};
    for (uint32_t i = 0; i < k->t.n_items; i++) {
        proto_group_t *g = &k->groups[i];
        for (uint32_t j = 0; j < g->n_samples; j++) {
            proto_sample_t *s = &g->samples[j];
            if (!s->pending) continue;
            char err[ERR_LEN];
            int32_t *ids = NULL;
            int n = s->obs ? tokenizer_encode(w->rt->tok, s->obs, strlen(s->obs), &ids, err) : 0;
            if (n < 0) {
                snprintf(k->error, sizeof k->error, "item %u sample %u: observation: %.200s", i, j, err);
                k->failed = true;
                k->remaining--;
                continue;
            }
            episode_append(s, ids, NULL, n, 1);
            free(ids);
            free(s->obs), s->obs = NULL;
            int len = (int)(g->n_prompt + s->n), room = room_of(w, k) - len;
            if (room < 1) {   // the context is full: the episode ends here
                s->pending = 0;
                s->finish = PROTO_FIN_LENGTH;
                k->remaining--;
                continue;
            }
            int32_t *ctx = xmalloc(sizeof(int32_t) * (size_t)len);
            memcpy(ctx, g->prompt, sizeof(int32_t) * g->n_prompt);
            memcpy(ctx + g->n_prompt, s->tokens, sizeof(int32_t) * s->n);
            bool eval = k->t.kind == PROTO_KIND_EVAL;
            gen_request_t rq = {.prompt = ctx, .prompt_len = len, .slot = k->slot, .n_samples = 1,
                                .max_new_tokens = (int)k->t.max_new < room ? (int)k->t.max_new : room,
                                .sp = {.temperature = eval ? 0.0f : k->t.temperature, .top_k = (int)k->t.top_k,
                                       .top_p = k->t.top_p > 0 ? k->t.top_p : 1.0f},
                                .seed = k->t.seed + g->index * 1000003ull + j * 7919ull + s->turns * 104729ull,
                                .stop_ids = w->rt->eos_ids, .n_stop_ids = w->rt->n_eos, .stop_strings = stops,
                                .n_stop_strings = k->t.max_turns > 1 ? 2 : 1, .user = tag(k->wid, i, j + 1)};
            if (gen_submit(w->rt->gen, &rq, err) < 0) {
                snprintf(k->error, sizeof k->error, "item %u sample %u: %.200s", i, j, err);
                k->failed = true;
                k->remaining--;
            }
            free(ctx);
        }
    }
}

// Submits the items of an admitted task to the generator.
static void submit(worker_t *w, wtask_t *k) {
    static const char *stops[2] = {"\n", CALL_END};
    if (k->cont) {
        submit_cont(w, k);
        return;
    }
    int ctx = room_of(w, k);
    // A plain prompt's completion also ends at its first newline (and, multi-turn, at a tool
    // call); a chat job's only at an end-of-sequence / end-of-turn token of the model.
    int n_stops = k->t.end == PROTO_END_EOS ? 0 : k->t.max_turns > 1 ? 2 : 1;
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
                            .seed = k->t.seed + k->t.items[i].index * 1000003ull, .stop_ids = w->rt->eos_ids,
                            .n_stop_ids = w->rt->n_eos, .stop_strings = stops, .n_stop_strings = n_stops,
                            .user = tag(k->wid, i, 0)};
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

// A model turn of a multi-turn task that stopped at a tool call: the generator cut the text
// before the call's end marker, which the environment needs to see.
static bool ended_at_call(const worker_t *w, const gen_sample_t *gs) {
    if (gs->finish != GEN_FINISH_STOP || gs->n < 1) return false;
    char err[ERR_LEN];
    char *full = tokenizer_decode(w->rt->tok, gs->tokens, gs->n, true, err);
    size_t cut = gs->text ? strlen(gs->text) : 0;
    bool call = full && strlen(full) > cut && !strncmp(full + cut, CALL_END, strlen(CALL_END));
    free(full);
    return call;
}

// The text of a turn, with the call's end marker put back when the turn ended at a call.
static char *turn_text(gen_sample_t *gs, bool call) {
    const char *t = gs->text ? gs->text : "";
    size_t n = strlen(t);
    char *out = xmalloc(n + strlen(CALL_END) + 1);
    memcpy(out, t, n);
    strcpy(out + n, call ? CALL_END : "");
    return out;
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
        uint32_t wid = (uint32_t)(r->user >> 32), item = (uint32_t)(r->user >> 12 & 0xFFFFF),
                 sample1 = (uint32_t)(r->user & 0xFFF);
        wtask_t *k = NULL;
        for (int i = 0; i < w->n_tasks && !k; i++)
            if (w->tasks[i]->wid == wid) k = w->tasks[i];
        bool multi = k && k->t.max_turns > 1;
        if (k && item < k->t.n_items && k->cont && sample1 >= 1 && sample1 <= k->groups[item].n_samples &&
            r->n_samples == 1) {
            // the next turn of one episode
            proto_sample_t *s = &k->groups[item].samples[sample1 - 1];
            gen_sample_t *gs = &r->samples[0];
            bool call = ended_at_call(w, gs);
            episode_append(s, gs->tokens, gs->logprobs, gs->n, 0);
            char *tt = turn_text(gs, call);
            size_t a = s->text ? strlen(s->text) : 0, b = strlen(tt);
            s->text = xrealloc(s->text, a + b + 1);
            memcpy(s->text + a, tt, b + 1);
            free(tt);
            s->turns = (s->turns ? s->turns : 1) + 1;
            s->finish = (uint8_t)gs->finish;
            s->pending = call && s->turns < k->t.max_turns;
            k->tokens += (uint64_t)gs->n;
            k->remaining--;
        } else if (k && item < k->t.n_items && !k->cont && sample1 == 0) {
            proto_group_t *g = &k->groups[item];
            g->n_samples = (uint32_t)r->n_samples;
            g->samples = xcalloc((size_t)r->n_samples, sizeof(proto_sample_t));
            for (int s = 0; s < r->n_samples; s++) {
                gen_sample_t *gs = &r->samples[s];
                bool call = multi && ended_at_call(w, gs);
                g->samples[s] = (proto_sample_t){.n = (uint32_t)gs->n, .tokens = gs->tokens, .logprobs = gs->logprobs,
                                                 .text = multi ? turn_text(gs, call) : gs->text ? gs->text : xstrdup(""),
                                                 .finish = (uint8_t)gs->finish, .turns = 1,
                                                 .pending = call && k->t.max_turns > 1};
                if (multi) free(gs->text);
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

// rl.c - runtime construction and greedy evaluation (single-turn, and tool episodes for tasks with
// an environment). Task sources and GRPO advantages are in source.c, which needs no model, so the
// verifier links no engine.
#include "common/rl/rl.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tasks/env.h"
#include "common/util/strset.h"

// --- runtime ------------------------------------------------------------------------------------

static int cfg_defaults(const rl_runtime_cfg_t *c, const model_t *m, rl_runtime_cfg_t *d, char *err) {
    return rl_serving_cfg(&m->cfg, c, d, err);
}

rl_runtime_t *rl_runtime_wrap(model_t **model, tokenizer_t **tok, const rl_runtime_cfg_t *cfg, char *err) {
    rl_runtime_t *rt = xcalloc(1, sizeof *rt);
    rt->model = *model, *model = NULL;
    rt->tok = *tok, *tok = NULL;
    snprintf(rt->chat_error, sizeof rt->chat_error, "the model has no chat template");
    rl_runtime_cfg_t c;
    if (cfg_defaults(cfg, rt->model, &c, err)) goto fail;
    rt->max_context = c.max_context;
    const hf_config_t *mc = &rt->model->cfg;
    rt->n_eos = hf_config_eos(mc, rt->eos_ids, GEN_MAX_STOP);
    if (rt->n_eos == 0) {
        int32_t id = tokenizer_token_id(rt->tok, "<|endoftext|>");
        if (id >= 0) rt->eos_ids[rt->n_eos++] = id;
    }
    if (rt->n_eos == 0) {
        err_set(err, "model has no eos_token_id in config.json and its tokenizer no <|endoftext|> token");
        goto fail;
    }
    rt->eos = rt->eos_ids[0];
    for (int i = 0; i < rt->n_eos; i++)
        if (rt->eos_ids[i] >= mc->vocab_size) {
            err_set(err, "end-of-sequence id %d is outside the vocabulary (%d)", rt->eos_ids[i], mc->vocab_size);
            goto fail;
        }
    if (tokenizer_vocab_size(rt->tok) > mc->vocab_size) {
        err_set(err, "tokenizer has %d tokens but the model's vocab_size is %d", tokenizer_vocab_size(rt->tok),
                mc->vocab_size);
        goto fail;
    }
    rt->pool = lora_pool_new(c.n_slots);
    rt->engine = engine_new(rt->model, rt->pool, err);
    if (!rt->engine) goto fail;
    if (cfg && cfg->sim) {
        engine_set_sim(rt->engine, cfg->sim);
        int blocks = cfg->kv_blocks ? cfg->kv_blocks : rl_sim_kv_blocks(cfg->sim, mc, c.n_slots, err);
        if (blocks < 0) goto fail;
        rt->kc = kvcache_new_virtual(rt->model->k, mc->num_hidden_layers, mc->num_key_value_heads * mc->head_dim, 16,
                                     (int)blocks, c.max_seqs, err);
    } else {
        // The cache lives where the model computes (host memory for the CPU backend).
        rt->kc = kvcache_new_on(rt->model->k, mc->num_hidden_layers, mc->num_key_value_heads * mc->head_dim, 16,
                                c.kv_blocks, c.max_seqs, err);
    }
    if (!rt->kc) goto fail;
    rt->gen = gen_new(rt->engine, rt->kc, rt->tok, c.max_batch_tokens, err);
    if (!rt->gen) goto fail;
    return rt;
fail:
    rl_runtime_close(&rt);
    return NULL;
}

rl_runtime_t *rl_runtime_open(const char *dir, const rl_runtime_cfg_t *cfg, char *err) {
    char path[4096];
    bool sim = cfg && cfg->sim;
    model_t *m = sim ? model_shell(dir, kernels_sim(), cfg->bf16, err)
                     : model_load(dir, cfg && cfg->k ? cfg->k : kernels_cpu(), err);
    if (!m) return NULL;
    if (!sim && cfg && cfg->bf16 && model_to_bf16(m, err)) {
        model_destroy(&m);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tokenizer_t *t = tokenizer_load(path, err);
    if (!t) {
        model_destroy(&m);
        return NULL;
    }
    rl_runtime_t *rt = rl_runtime_wrap(&m, &t, cfg, err);
    model_destroy(&m);
    tokenizer_destroy(&t);
    if (!rt) return NULL;
    // Hugging Face's generate() stops at generation_config.json's eos ids (often a longer list
    // than config.json's, e.g. an instruct model's end-of-turn token).
    hf_generation_config_t gc;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    int rc = hf_generation_config_load(&gc, path, err);
    if (rc < 0) {
        rl_runtime_close(&rt);
        return NULL;
    }
    for (int i = 0; i < gc.n_eos; i++) {
        bool dup = false;
        for (int j = 0; j < rt->n_eos; j++) dup |= rt->eos_ids[j] == gc.eos_token_ids[i];
        if (dup) continue;
        if (rt->n_eos == GEN_MAX_STOP) {
            err_set(err, "%s: more than %d end-of-sequence ids with config.json's", path, GEN_MAX_STOP);
            rl_runtime_close(&rt);
            return NULL;
        }
        if (gc.eos_token_ids[i] >= rt->model->cfg.vocab_size) {
            err_set(err, "%s: eos id %d is outside the vocabulary (%d)", path, gc.eos_token_ids[i],
                    rt->model->cfg.vocab_size);
            rl_runtime_close(&rt);
            return NULL;
        }
        rt->eos_ids[rt->n_eos++] = gc.eos_token_ids[i];
    }
    // The chat template is optional: a base model has none, and only chat jobs need one. Why
    // there is none is kept for the error a chat request gets.
    rt->chat = chat_template_load(dir, rt->chat_error);
    return rt;
}

void rl_runtime_close(rl_runtime_t **prt) {
    if (!prt || !*prt) return;
    rl_runtime_t *rt = *prt;
    gen_destroy(&rt->gen);
    chat_template_destroy(&rt->chat);
    kvcache_destroy(&rt->kc);
    engine_destroy(&rt->engine);
    lora_pool_destroy(&rt->pool);
    tokenizer_destroy(&rt->tok);
    model_destroy(&rt->model);
    free(rt);
    *prt = NULL;
}

// --- evaluation ---------------------------------------------------------------------------------

// Whether a turn stopped at a tool call: the generator cut the text before the stop string
// that ended it, so the call's end shows only in the decoded tokens.
static bool ended_at_call(const rl_runtime_t *rt, const gen_sample_t *s) {
    if (s->finish != GEN_FINISH_STOP || s->n < 1) return false;
    char err[ERR_LEN];
    char *full = tokenizer_decode(rt->tok, s->tokens, s->n, true, err);
    size_t cut = s->text ? strlen(s->text) : 0;
    bool call = full && strlen(full) > cut && !strncmp(full + cut, ENV_CALL_END, strlen(ENV_CALL_END));
    free(full);
    return call;
}

// Appends s to the heap string *dst.
static void str_append(char **dst, const char *s) {
    size_t a = strlen(*dst), b = strlen(s);
    *dst = xrealloc(*dst, a + b + 1);
    memcpy(*dst + a, s, b + 1);
}

// After a failure mid-way: runs and drops whatever the generator still holds, so no request of
// a failed evaluation is left behind.
static void gen_drain(gen_t *g) {
    while (gen_pending(g)) {
        char e2[ERR_LEN];
        if (gen_run(g, e2)) break;
        gen_result_t *left;
        while ((left = gen_take(g))) gen_result_free(&left);
    }
}

// Greedy tool episodes of an environment task, turn by turn: every live episode's next turn is
// generated from its whole context (prompt + transcript, prefilled again), the turns of all
// episodes of a round in one batch.
static int evaluate_episodes(rl_runtime_t *rt, int slot, const rl_source_t *src, const uint64_t *index, int n,
                             int max_new, int max_turns, rl_eval_t *out, char *err) {
    static const char *const stops[2] = {"\n", ENV_CALL_END};
    const task_t *t = src->task;
    int ctx = rt->max_context, rc = -1;
    task_example_t *ex = xcalloc((size_t)n + 1, sizeof *ex);
    char **text = xcalloc((size_t)n + 1, sizeof *text);
    bool *live = xcalloc((size_t)n + 1, sizeof *live);
    for (int i = 0; i < n; i++) {
        task_example(t, TASK_EVAL, index[i], &ex[i]);
        text[i] = xstrdup("");
        live[i] = true;
    }
    for (int turn = 0; turn < max_turns; turn++) {
        int submitted = 0;
        for (int i = 0; i < n; i++) {
            if (!live[i]) continue;
            char *context = xstrdup(ex[i].prompt);
            str_append(&context, text[i]);
            int32_t *ids = NULL;
            int np = tokenizer_encode(rt->tok, context, strlen(context), &ids, err);
            free(context);
            if (np < 0) goto done;
            int room = ctx - np;
            if (room < 1) {   // the context is full: the episode ends here
                free(ids);
                live[i] = false;
                if (turn == 0) {
                    err_set(err, "eval prompt %d does not fit the model's context", i);
                    goto done;
                }
                continue;
            }
            gen_request_t rq = {.prompt = ids, .prompt_len = np, .slot = slot, .n_samples = 1,
                                .max_new_tokens = max_new < room ? max_new : room,
                                .sp = {.temperature = 0.0f, .top_p = 1.0f}, .seed = (uint64_t)i, .stop_ids = rt->eos_ids,
                                .n_stop_ids = rt->n_eos, .stop_strings = stops, .n_stop_strings = 2, .user = (uint64_t)i};
            int id = gen_submit(rt->gen, &rq, err);
            free(ids);
            if (id < 0) goto done;
            submitted++;
        }
        if (!submitted) break;
        if (gen_run(rt->gen, err)) goto done;
        gen_result_t *r;
        while ((r = gen_take(rt->gen))) {
            int i = (int)r->user;
            gen_sample_t *s = &r->samples[0];
            bool call = ended_at_call(rt, s);
            str_append(&text[i], s->text ? s->text : "");
            if (call) str_append(&text[i], ENV_CALL_END);
            char obs[ENV_OBS_MAX];
            live[i] = call && turn + 1 < max_turns && env_step(t, &ex[i], text[i], obs, sizeof obs) == 1;
            if (live[i]) str_append(&text[i], obs);
            gen_result_free(&r);
        }
    }
    for (int i = 0; i < n; i++) {
        out->correct += rl_source_verify(src, &ex[i], 0, text[i]) >= 0.5f;
        out->n++;
    }
    rc = 0;
done:
    if (rc) gen_drain(rt->gen);
    for (int i = 0; i < n; i++) {
        task_example_free(&ex[i]);
        free(text[i]);
    }
    free(ex);
    free(text);
    free(live);
    return rc;
}

int rl_evaluate(rl_runtime_t *rt, int slot, const rl_source_t *src, int asked, int max_new, int max_turns,
                rl_eval_t *out, char *err) {
    double t0 = util_now();
    memset(out, 0, sizeof *out);
    out->asked = asked;
    uint64_t *index = NULL;
    int n = rl_source_eval_indices(src, asked, &index);
    if (max_turns > 0 && !src->ds && !src->chat && src->task && src->task->env) {
        int rc = evaluate_episodes(rt, slot, src, index, n, max_new, max_turns, out, err);
        free(index);
        if (rc == 0) {
            out->acc = out->n ? (double)out->correct / out->n : 0.0;
            rl_wilson(out->correct, out->n, &out->lo, &out->hi);
            out->seconds = util_now() - t0;
        }
        return rc;
    }
    task_example_t *ex = xcalloc((size_t)n + 1, sizeof *ex);
    int *handle = xcalloc((size_t)n + 1, sizeof(int));
    int rc = -1;
    // A plain completion ends at its first newline (the built-in tasks' one-line answers); a
    // chat completion at an end-of-sequence / end-of-turn token only.
    const char *nl = "\n";
    for (int i = 0; i < n; i++) {
        handle[i] = rl_source_example(src, TASK_EVAL, index[i], &ex[i]);
        char *text = rl_source_prompt(src, &ex[i], handle[i], err);
        if (!text) goto done;
        int32_t *ids = NULL;
        int np = tokenizer_encode(rt->tok, text, strlen(text), &ids, err);
        free(text);
        if (np < 0) goto done;
        int room = rt->max_context - np;
        gen_request_t rq = {.prompt = ids, .prompt_len = np, .slot = slot, .n_samples = 1,
                            .max_new_tokens = max_new < room ? max_new : room, .sp = {.temperature = 0.0f, .top_p = 1.0f},
                            .seed = (uint64_t)i, .stop_ids = rt->eos_ids, .n_stop_ids = rt->n_eos, .stop_strings = &nl,
                            .n_stop_strings = src->chat ? 0 : 1, .user = (uint64_t)i};
        int id = rq.max_new_tokens >= 1 ? gen_submit(rt->gen, &rq, err) : -1;
        free(ids);
        if (id < 0) {
            if (rq.max_new_tokens < 1) err_set(err, "eval prompt %d does not fit the context (%d tokens)", i, rt->max_context);
            goto done;
        }
    }
    if (gen_run(rt->gen, err)) goto done;
    gen_result_t *r;
    while ((r = gen_take(rt->gen))) {
        int i = (int)r->user;
        float rew = rl_source_verify(src, &ex[i], handle[i], r->samples[0].text ? r->samples[0].text : "");
        out->correct += rew >= 0.5f;
        out->n++;
        gen_result_free(&r);
    }
    rc = 0;
done:
    if (rc) gen_drain(rt->gen);
    for (int i = 0; i < n; i++) task_example_free(&ex[i]);
    free(ex);
    free(handle);
    free(index);
    if (rc == 0) {
        out->acc = out->n ? (double)out->correct / out->n : 0.0;
        rl_wilson(out->correct, out->n, &out->lo, &out->hi);
        out->seconds = util_now() - t0;
    }
    return rc;
}

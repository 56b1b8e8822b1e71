// generate.c - continuous batching: admission by worst-case KV blocks, one engine step per call
// mixing decode rows and prefill chunks, forked samples, stop conditions.
#include "common/engine/generate.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int seq;               // KV sequence, -1 once finished
    rng_t rng;
    int32_t *tok;
    float *lp;
    int n;
    int done;
    gen_finish_t finish;
    int stop_hit;          // index of the stop string that ended it
    int sim_len;           // simulated backend: the length drawn for it (0 until its first token)
    char *text;            // incremental text (only with stop strings)
    size_t tlen, tcap;
} sample_t;

enum { RQ_QUEUED, RQ_PREFILL, RQ_DECODE };

typedef struct {
    int id, state, prefilled, root, worst_blocks, live;
    gen_request_t r;       // arrays below are owned copies
    int32_t *prompt;
    int32_t stop_ids[GEN_MAX_STOP];
    char *stops[GEN_MAX_STOP];
    sample_t *s;
} req_t;

typedef struct {
    req_t *rq;
    int sample;            // -1 = prefill chunk
    int n_tokens;
} rowref_t;

// One token to draw from a logits row of the step: the arrays the sample op takes, and whose it is.
typedef struct {
    req_t *rq;
    int sample;
    bool first;            // a completed prompt's row: its other samples draw from it after
} draw_t;

struct gen {
    engine_t *e;
    kvcache_t *kc;
    const tokenizer_t *tok;
    int max_batch, next_id, reserved_blocks, reserved_seqs;
    req_t **rq;            // queued and running, in arrival order
    int n_rq, cap_rq;
    gen_result_t **done;
    int n_done, cap_done;
    engine_seq_t *rows;
    rowref_t *refs;
    int cap_rows;
    draw_t *draws;         // the step's draws: one per logits row, then a completed prompt's other samples
    int cap_draws;
    float *dparams;        // (4 * cap_draws) the sample op's temperature, top_p, u and log-prob arrays
    int *dtop_k;           // (cap_draws)
    int32_t *dtok;         // (cap_draws)
    const kernels_t *k;    // the engine's backend (xrows is its memory)
    float *xrows;          // backend memory: copies of completed prompts' rows for their other samples
    size_t cap_xrows;      // floats
    gen_stats_t st;
    sim_t *sim;            // the engine's simulated backend, or NULL
    int32_t filler[2];     // simulated tokens: ordinary ids whose text holds no newline
};

gen_t *gen_new(engine_t *e, kvcache_t *kc, const tokenizer_t *tok, int max_batch_tokens, char *err) {
    if (!e || !kc || max_batch_tokens < 1) {
        err_set(err, "gen_new: engine, KV cache and max_batch_tokens >= 1 are required");
        return NULL;
    }
    gen_t *g = xcalloc(1, sizeof *g);
    g->e = e;
    g->kc = kc;
    g->tok = tok;
    g->max_batch = max_batch_tokens;
    g->k = engine_model(e)->k;
    g->sim = engine_sim(e);
    // Simulated tokens: the first two ids that are not special and print as text without a
    // newline (stop strings never end a simulated sample early); any ids without a tokenizer.
    int V = engine_model(e)->cfg.vocab_size, nf = 0;
    for (int32_t t = 0; g->sim && t < V && nf < 2; t++) {
        size_t pl = 0;
        const char *piece = tok ? tokenizer_token_bytes(tok, t, &pl) : "x";
        if (tok && (tokenizer_is_special(tok, t) || !piece || pl == 0 || memchr(piece, '\n', pl))) continue;
        if (tok && (memchr(piece, '<', pl) || memchr(piece, '[', pl))) continue;   // no piece of a call marker
        g->filler[nf++] = t;
        if (!tok && nf == 1) g->filler[nf++] = t + 1 < V ? t + 1 : 0;
    }
    if (g->sim && nf < 2) {
        err_set(err, "gen_new: the tokenizer has no two ordinary tokens for simulated text");
        free(g);
        return NULL;
    }
    return g;
}

static void req_free(req_t *q) {
    if (!q) return;
    for (int i = 0; i < q->r.n_samples; i++) {
        free(q->s[i].tok);
        free(q->s[i].lp);
        free(q->s[i].text);
    }
    for (int i = 0; i < q->r.n_stop_strings; i++) free(q->stops[i]);
    free(q->s);
    free(q->prompt);
    free(q);
}

void gen_result_free(gen_result_t **pr) {
    if (!pr || !*pr) return;
    gen_result_t *r = *pr;
    for (int i = 0; i < r->n_samples; i++) {
        free(r->samples[i].tokens);
        free(r->samples[i].logprobs);
        free(r->samples[i].text);
    }
    free(r->samples);
    free(r);
    *pr = NULL;
}

void gen_destroy(gen_t **pg) {
    if (!pg || !*pg) return;
    gen_t *g = *pg;
    for (int i = 0; i < g->n_rq; i++) {
        req_t *q = g->rq[i];
        for (int j = 0; j < q->r.n_samples; j++)
            if (q->s[j].seq >= 0) kvcache_seq_free(g->kc, q->s[j].seq);
        if (q->state == RQ_PREFILL) kvcache_seq_free(g->kc, q->root);
        req_free(q);
    }
    for (int i = 0; i < g->n_done; i++) gen_result_free(&g->done[i]);
    free(g->rq);
    free(g->done);
    free(g->rows);
    free(g->refs);
    free(g->draws);
    free(g->dparams);
    free(g->dtop_k);
    free(g->dtok);
    if (g->xrows) g->k->free(g->xrows);
    free(g);
    *pg = NULL;
}

static int worst_blocks(const gen_t *g, int P, int G, int max_new) {
    return kvcache_group_blocks(kvcache_block_size(g->kc), P, G, max_new);
}

int gen_submit(gen_t *g, const gen_request_t *r, char *err) {
    const hf_config_t *cf = &engine_model(g->e)->cfg;
    if (!r->prompt || r->prompt_len < 1) return err_set(err, "empty prompt");
    for (int i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= cf->vocab_size)
            return err_set(err, "prompt token %d = %d is outside the vocabulary (%d)", i, r->prompt[i], cf->vocab_size);
    if (r->n_samples < 1 || r->n_samples > 4096) return err_set(err, "n_samples must be in 1..4096");
    if (r->max_new_tokens < 1) return err_set(err, "max_new_tokens must be >= 1");
    int ctx = hf_config_context(cf);
    if (r->prompt_len + r->max_new_tokens > ctx)
        return err_set(err, "prompt (%d) + max_new_tokens (%d) exceeds the model's %d positions", r->prompt_len,
                       r->max_new_tokens, ctx);
    if (!(r->sp.temperature >= 0.0f) || r->sp.top_k < 0 || !(r->sp.top_p > 0.0f && r->sp.top_p <= 1.0f))
        return err_set(err, "sampling: temperature >= 0, top_k >= 0 and top_p in (0, 1] required");
    if (r->n_stop_ids < 0 || r->n_stop_ids > GEN_MAX_STOP || r->n_stop_strings < 0 ||
        r->n_stop_strings > GEN_MAX_STOP)
        return err_set(err, "at most %d stop ids and %d stop strings", GEN_MAX_STOP, GEN_MAX_STOP);
    if (r->n_stop_strings && !g->tok) return err_set(err, "stop strings need a tokenizer");
    for (int i = 0; i < r->n_stop_strings; i++)
        if (!r->stop_strings[i] || !r->stop_strings[i][0]) return err_set(err, "stop string %d is empty", i);
    if (r->slot < -1 || (r->slot >= 0 && !lora_pool_get(engine_pool(g->e), r->slot)))
        return err_set(err, "adapter slot %d is not loaded", r->slot);
    int wb = worst_blocks(g, r->prompt_len, r->n_samples, r->max_new_tokens);
    if (wb > kvcache_total_blocks(g->kc))
        return err_set(err, "request needs up to %d KV blocks; the cache has %d", wb, kvcache_total_blocks(g->kc));
    if (r->n_samples > kvcache_max_seqs(g->kc))
        return err_set(err, "request has %d samples; the cache holds %d sequences", r->n_samples,
                       kvcache_max_seqs(g->kc));
    req_t *q = xcalloc(1, sizeof *q);
    q->r = *r;
    q->id = g->next_id++;
    q->state = RQ_QUEUED;
    q->root = -1;
    q->worst_blocks = wb;
    q->prompt = xmalloc(sizeof(int32_t) * (size_t)r->prompt_len);
    memcpy(q->prompt, r->prompt, sizeof(int32_t) * (size_t)r->prompt_len);
    q->r.prompt = q->prompt;
    if (r->n_stop_ids) memcpy(q->stop_ids, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop_ids);
    q->r.stop_ids = q->stop_ids;
    for (int i = 0; i < r->n_stop_strings; i++) q->stops[i] = xstrdup(r->stop_strings[i]);
    q->r.stop_strings = (const char *const *)q->stops;
    q->s = xcalloc((size_t)r->n_samples, sizeof(sample_t));
    for (int i = 0; i < r->n_samples; i++) {
        q->s[i].seq = -1;
        rng_seed(&q->s[i].rng, r->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)));
        q->s[i].tok = xmalloc(sizeof(int32_t) * (size_t)r->max_new_tokens);
        q->s[i].lp = xmalloc(sizeof(float) * (size_t)r->max_new_tokens);
    }
    if (g->n_rq == g->cap_rq) {
        g->cap_rq = g->cap_rq ? 2 * g->cap_rq : 16;
        g->rq = xrealloc(g->rq, sizeof(req_t *) * (size_t)g->cap_rq);
    }
    g->rq[g->n_rq++] = q;
    return q->id;
}

static void add_row(gen_t *g, int *n, engine_seq_t row, rowref_t ref) {
    if (*n == g->cap_rows) {
        g->cap_rows = g->cap_rows ? 2 * g->cap_rows : 64;
        g->rows = xrealloc(g->rows, sizeof(engine_seq_t) * (size_t)g->cap_rows);
        g->refs = xrealloc(g->refs, sizeof(rowref_t) * (size_t)g->cap_rows);
    }
    g->rows[*n] = row;
    g->refs[*n] = ref;
    (*n)++;
}

static void finish_sample(gen_t *g, req_t *q, sample_t *s, gen_finish_t f) {
    s->done = 1;
    s->finish = f;
    if (s->seq >= 0) kvcache_seq_free(g->kc, s->seq);
    s->seq = -1;
    q->live--;
}

// Appends a sampled token and applies the stop rules.
static void push_token(gen_t *g, req_t *q, sample_t *s, int32_t t, float lp) {
    s->tok[s->n] = t;
    s->lp[s->n] = lp;
    s->n++;
    g->st.gen_tokens++;
    for (int i = 0; i < q->r.n_stop_ids; i++)
        if (t == q->stop_ids[i]) {
            finish_sample(g, q, s, GEN_FINISH_EOS);
            return;
        }
    if (q->r.n_stop_strings) {
        // the token's bytes (a byte-level token may hold part of a character: the text is
        // matched as bytes, so a stop string is found once all of its bytes are out); special
        // tokens are left out, as in the decoded text
        size_t pl = 0;
        const char *piece = tokenizer_is_special(g->tok, t) ? NULL : tokenizer_token_bytes(g->tok, t, &pl);
        if (!piece) pl = 0;
        if (s->tlen + pl + 1 > s->tcap) {
            s->tcap = 2 * (s->tlen + pl + 1);
            s->text = xrealloc(s->text, s->tcap);
        }
        if (pl) memcpy(s->text + s->tlen, piece, pl);
        s->tlen += pl;
        s->text[s->tlen] = 0;
        for (int i = 0; i < q->r.n_stop_strings; i++) {
            size_t sl = strlen(q->stops[i]);
            size_t from = s->tlen > sl + pl ? s->tlen - sl - pl : 0;
            if (memmem(s->text + from, s->tlen - from, q->stops[i], sl)) {
                s->stop_hit = i;
                finish_sample(g, q, s, GEN_FINISH_STOP);
                return;
            }
        }
    }
    if (s->n >= q->r.max_new_tokens) finish_sample(g, q, s, GEN_FINISH_LENGTH);
}

// Draws a token for every draw from its logits row (backend memory, rows (n, V)) with the
// backend's sample op: on the CPU exactly sampler_sample, on a GPU without copying the logits to
// the host. Each sample's RNG draws its uniform here, as sampler_sample would (one per non-greedy
// draw), so results do not depend on the backend's batching.
// Simulated backend: a sample's length is drawn at its first token (sim_length, from its own RNG);
// until then it writes a filler token, then the request's first stop id (or runs to
// max_new_tokens without one). Every token has log-prob SIM_LOGP.
static void draw_sim(gen_t *g, const draw_t *d, int n) {
    for (int i = 0; i < n; i++) {
        req_t *q = d[i].rq;
        sample_t *s = &q->s[d[i].sample];
        if (s->sim_len == 0) s->sim_len = sim_length(g->sim, &s->rng, q->r.max_new_tokens + 1);   // beyond: ends by length
        int32_t t = g->filler[0];
        for (int j = 0; j < q->r.n_stop_ids; j++)
            if (t == q->stop_ids[j]) t = g->filler[1];
        if (s->n + 1 >= s->sim_len && q->r.n_stop_ids > 0) t = q->stop_ids[0];
        push_token(g, q, s, t, SIM_LOGP);
    }
}

static void draw_tokens(gen_t *g, const draw_t *d, const float *logits, int n) {
    if (n <= 0) return;
    if (g->sim) {
        draw_sim(g, d, n);
        return;
    }
    const kernels_t *k = g->k;
    int V = engine_model(g->e)->cfg.vocab_size;
    float *temp = g->dparams, *top_p = temp + n, *u = temp + 2 * n, *lp = temp + 3 * n;
    for (int i = 0; i < n; i++) {
        const sampler_params_t *sp = &d[i].rq->r.sp;
        temp[i] = sp->temperature, g->dtop_k[i] = sp->top_k, top_p[i] = sp->top_p;
        u[i] = sp->temperature > 0.0f ? rng_uniform(&d[i].rq->s[d[i].sample].rng) : 0.0f;
    }
    k->sample(g->dtok, lp, logits, n, V, temp, g->dtop_k, top_p, u);
    for (int i = 0; i < n; i++) push_token(g, d[i].rq, &d[i].rq->s[d[i].sample], g->dtok[i], lp[i]);
}

static void complete(gen_t *g, int idx) {
    req_t *q = g->rq[idx];
    gen_result_t *r = xcalloc(1, sizeof *r);
    r->id = q->id;
    r->user = q->r.user;
    r->slot = q->r.slot;
    r->prompt_len = q->r.prompt_len;
    r->n_samples = q->r.n_samples;
    r->samples = xcalloc((size_t)r->n_samples, sizeof(gen_sample_t));
    for (int i = 0; i < r->n_samples; i++) {
        sample_t *s = &q->s[i];
        gen_sample_t *o = &r->samples[i];
        o->tokens = s->tok, s->tok = NULL;
        o->logprobs = s->lp, s->lp = NULL;
        o->n = s->n;
        o->finish = s->finish;
        if (g->tok) {
            char err[ERR_LEN];
            // the text leaves out the stop token that ended the sample (a special token is left
            // out anyway; an end-of-sequence token that is not marked special would show)
            o->text = tokenizer_decode(g->tok, o->tokens, o->finish == GEN_FINISH_EOS ? o->n - 1 : o->n, true, err);
            if (!o->text) o->text = xstrdup("");
            if (o->finish == GEN_FINISH_STOP) {
                char *cut = strstr(o->text, q->stops[s->stop_hit]);
                if (cut) *cut = 0;
            }
        }
    }
    g->reserved_blocks -= q->worst_blocks;
    g->reserved_seqs -= q->r.n_samples;
    req_free(q);
    memmove(&g->rq[idx], &g->rq[idx + 1], sizeof(req_t *) * (size_t)(g->n_rq - idx - 1));
    g->n_rq--;
    if (g->n_done == g->cap_done) {
        g->cap_done = g->cap_done ? 2 * g->cap_done : 16;
        g->done = xrealloc(g->done, sizeof(gen_result_t *) * (size_t)g->cap_done);
    }
    g->done[g->n_done++] = r;
}

// One engine step of the batch: decode rows, admissions, prefill chunks, draws, completions.
static int step_once(gen_t *g, char *err) {
    int n = 0, budget = g->max_batch;
    // 1. decode rows of every running sample
    for (int i = 0; i < g->n_rq; i++) {
        req_t *q = g->rq[i];
        if (q->state != RQ_DECODE) continue;
        for (int j = 0; j < q->r.n_samples; j++) {
            sample_t *s = &q->s[j];
            if (s->done) continue;
            add_row(g, &n, (engine_seq_t){.tokens = &s->tok[s->n - 1], .n_tokens = 1, .kv_seq = s->seq,
                                          .slot = q->r.slot, .logits = ENGINE_LOGITS_LAST},
                    (rowref_t){q, j, 1});
            budget--;
        }
    }
    // 2. admit queued requests whose worst case fits, 3. prefill chunks within the budget
    int total = kvcache_total_blocks(g->kc), max_seqs = kvcache_max_seqs(g->kc);
    for (int i = 0; i < g->n_rq && budget > 0; i++) {
        req_t *q = g->rq[i];
        if (q->state == RQ_QUEUED) {
            if (g->reserved_blocks + q->worst_blocks > total || g->reserved_seqs + q->r.n_samples > max_seqs) break;
            q->root = kvcache_seq_new(g->kc, err);
            if (q->root < 0) break;
            g->reserved_blocks += q->worst_blocks;
            g->reserved_seqs += q->r.n_samples;
            q->state = RQ_PREFILL;
        }
        if (q->state != RQ_PREFILL) continue;
        int left = q->r.prompt_len - q->prefilled, c = left < budget ? left : budget;
        add_row(g, &n, (engine_seq_t){.tokens = q->prompt + q->prefilled, .n_tokens = c, .kv_seq = q->root,
                                      .slot = q->r.slot, .logits = c == left ? ENGINE_LOGITS_LAST : ENGINE_LOGITS_NONE},
                (rowref_t){q, -1, c});
        budget -= c;
    }
    if (n == 0) return 0;
    // the logits rows stay in backend memory: the sample op draws from them there
    if (engine_step(g->e, g->kc, g->rows, n, NULL, err)) return -1;
    const float *logits = engine_step_logits(g->e);
    size_t V = (size_t)engine_model(g->e)->cfg.vocab_size;
    // draws: at most one per row, plus the other samples of every prompt completed in this step
    int want = n;
    for (int i = 0; i < n; i++)
        if (g->refs[i].sample < 0) want += g->refs[i].rq->r.n_samples - 1;
    if (g->cap_draws < want) {
        g->cap_draws = want;
        g->draws = xrealloc(g->draws, sizeof(draw_t) * (size_t)want);
        g->dparams = xrealloc(g->dparams, sizeof(float) * 4 * (size_t)want);
        g->dtop_k = xrealloc(g->dtop_k, sizeof(int) * (size_t)want);
        g->dtok = xrealloc(g->dtok, sizeof(int32_t) * (size_t)want);
    }
    // 4. sample: one draw per logits row in one call (a completed prompt's row: its sample 0),
    // then a completed prompt's other samples from the same row
    int rows = 0, nd = 0;
    for (int i = 0; i < n; i++) {
        rowref_t *ref = &g->refs[i];
        req_t *q = ref->rq;
        rows += ref->n_tokens;
        if (ref->sample >= 0) {
            g->draws[nd++] = (draw_t){q, ref->sample, false};
            continue;
        }
        q->prefilled += ref->n_tokens;
        g->st.prefill_tokens += (uint64_t)ref->n_tokens;
        if (q->prefilled < q->r.prompt_len) continue;
        // prompt complete: G samples fork the prompt's blocks and draw from the same logits
        q->state = RQ_DECODE;
        q->live = q->r.n_samples;
        q->s[0].seq = q->root;
        for (int j = 1; j < q->r.n_samples; j++) {
            q->s[j].seq = kvcache_seq_fork(g->kc, q->root, err);
            ASSERT(q->s[j].seq >= 0);   // admission reserved the sequences
        }
        g->draws[nd++] = (draw_t){q, 0, true};
    }
    draw_tokens(g, g->draws, logits, nd);
    // a completed prompt's other samples: its row copied once per sample (on the backend), then
    // one more call for all of them
    int nx = 0;
    for (int r = 0; r < nd; r++)
        if (g->draws[r].first) nx += g->draws[r].rq->r.n_samples - 1;
    if (nx > 0 && g->sim) {
        draw_t *x = g->draws + nd;
        int m = 0;
        for (int r = 0; r < nd; r++)
            for (int j = 1; g->draws[r].first && j < g->draws[r].rq->r.n_samples; j++) x[m++] = (draw_t){g->draws[r].rq, j, false};
        draw_sim(g, x, m);
    } else if (nx > 0) {
        const kernels_t *k = g->k;
        if (g->cap_xrows < (size_t)nx * V) {
            if (g->xrows) k->free(g->xrows);
            g->cap_xrows = (size_t)nx * V;
            g->xrows = k->alloc(sizeof(float) * g->cap_xrows);
        }
        draw_t *x = g->draws + nd;
        int m = 0;
        for (int r = 0; r < nd; r++) {
            req_t *q = g->draws[r].rq;
            for (int j = 1; g->draws[r].first && j < q->r.n_samples; j++, m++) {
                k->copy(g->xrows + (size_t)m * V, logits + (size_t)r * V, sizeof(float) * V);
                x[m] = (draw_t){q, j, false};
            }
        }
        draw_tokens(g, x, g->xrows, nx);
    }
    for (int i = 0; i < g->n_rq;) {
        if (g->rq[i]->state == RQ_DECODE && g->rq[i]->live == 0) complete(g, i);
        else i++;
    }
    g->st.steps++;
    return rows;
}

// Whether the next step is decode rows only and admits nothing: no prompt is being prefilled and
// the first queued request does not fit (step 2 stops there), which only a completion changes.
static bool decode_only(const gen_t *g) {
    int total = kvcache_total_blocks(g->kc), max_seqs = kvcache_max_seqs(g->kc);
    for (int i = 0; i < g->n_rq; i++) {
        const req_t *q = g->rq[i];
        if (q->state == RQ_PREFILL) return false;
        if (q->state == RQ_QUEUED)
            return g->reserved_blocks + q->worst_blocks > total || g->reserved_seqs + q->r.n_samples > max_seqs;
    }
    return true;
}

// On a simulated accelerator a decode step lasts less than the host's own work per call at a
// large time scale (a 5 ms step is 83 us of wall time at scale 60; a service's turn, with its
// socket polls, takes tens of microseconds on a cloud VM), so the steps that change nothing but
// the samples' lengths run back to back in one call: their modelled times add up and are waited
// for once, until sim_coalesce_s of wall time is due, a request completes or the next step would
// admit or prefill. Requests that arrive meanwhile wait for the end of the call, as they wait for
// any step; results leave in the step they complete. The tokens, steps and modelled time are those
// of one step per call.
int gen_step(gen_t *g, char *err) {
    double t0 = util_now();
    if (!g->sim || sim_coalesce_s(g->sim) <= 0) {
        int rows = step_once(g, err);
        g->st.busy_s += util_now() - t0;
        return rows;
    }
    engine_sim_defer(g->e, true);
    int rows = 0, done = g->n_done, r;
    do {
        r = step_once(g, err);
        if (r > 0) rows += r;
    } while (r > 0 && g->n_done == done && decode_only(g) &&
             sim_deferred(g->sim) < sim_coalesce_s(g->sim) * sim_scale(g->sim));
    engine_sim_defer(g->e, false);
    sim_wait(g->sim, 0);
    g->st.busy_s += util_now() - t0;
    return r < 0 ? -1 : rows;
}

gen_result_t *gen_take(gen_t *g) {
    if (g->n_done == 0) return NULL;
    gen_result_t *r = g->done[0];
    memmove(&g->done[0], &g->done[1], sizeof(gen_result_t *) * (size_t)(g->n_done - 1));
    g->n_done--;
    return r;
}

int gen_pending(const gen_t *g) { return g->n_rq + g->n_done; }

int gen_running(const gen_t *g) {
    int n = 0;
    for (int i = 0; i < g->n_rq; i++) n += g->rq[i]->state != RQ_QUEUED;
    return n;
}

int gen_run(gen_t *g, char *err) {
    while (g->n_rq > 0) {
        int r = gen_step(g, err);
        if (r < 0) return -1;
        if (r == 0) return err_set(err, "generation stalled with %d requests queued", g->n_rq);
    }
    return 0;
}

gen_stats_t gen_stats(const gen_t *g) { return g->st; }

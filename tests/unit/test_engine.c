// test_engine.c - the engine against independent references: incremental decode vs full
// forward, batched multi-LoRA vs one sequence at a time, forked groups vs independent
// sequences, rollout log-probs vs trainer log-probs, bad input, and a cache or an adapter of
// another backend refused. (The engine on the CUDA backend: tests/gpu/test_engine.c.)
#include <criterion/criterion.h>
#include <stdlib.h>

#include "testutil.h"

typedef struct {
    hf_config_t c;
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
} fx_t;

static fx_t fx_new(int n_slots) {
    fx_t f;
    char err[ERR_LEN];
    f.c = tu_config();
    f.m = tu_model(&f.c, 11);
    cr_assert_not_null(f.m);
    f.pool = lora_pool_new(n_slots);
    f.e = engine_new(f.m, f.pool, err);
    cr_assert_not_null(f.e, "%s", err);
    return f;
}

static void fx_free(fx_t *f) {
    engine_destroy(&f->e);
    lora_pool_destroy(&f->pool);
    model_destroy(&f->m);
}

static void put_adapter(fx_t *f, int slot, int r, unsigned targets, uint64_t seed) {
    char err[ERR_LEN];
    lora_t *a = tu_adapter(&f->c, r, targets, seed);
    cr_assert_not_null(a);
    cr_assert_eq(lora_pool_set(f->pool, slot, &a, err), 0, "%s", err);
    cr_assert_null(a);
}

static void rand_tokens(int32_t *t, int n, int V, uint64_t seed) {
    rng_t r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rng_next(&r) % (uint64_t)V);
}

// Full-sequence logits of tokens[0..n) in one prefill step on a fresh cache.
static void full_logits(fx_t *f, const int32_t *tok, int n, int slot, float *out) {
    char err[ERR_LEN];
    kvcache_t *kc = kvcache_new(f->c.num_hidden_layers, f->c.num_key_value_heads * f->c.head_dim, 4, 64, 8, err);
    int s = kvcache_seq_new(kc, err);
    engine_seq_t q = {.tokens = tok, .n_tokens = n, .kv_seq = s, .slot = slot, .logits = ENGINE_LOGITS_ALL};
    cr_assert_eq(engine_step(f->e, kc, &q, 1, out, err), 0, "%s", err);
    kvcache_destroy(&kc);
}

Test(engine, incremental_decode_equals_full_forward) {
    fx_t f = fx_new(2);
    put_adapter(&f, 1, 4, LORA_ALL_TARGETS, 5);
    int n = 23, V = f.c.vocab_size;
    int32_t tok[23];
    rand_tokens(tok, n, V, 3);
    for (int slot = -1; slot <= 1; slot += 2) {
        float *full = malloc(sizeof(float) * n * V), *inc = malloc(sizeof(float) * n * V);
        full_logits(&f, tok, n, slot, full);
        char err[ERR_LEN];
        kvcache_t *kc = kvcache_new(f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 64, 8, err);
        int s = kvcache_seq_new(kc, err);
        // prefill 6 tokens in two chunks (5 + 1), then decode one token per step
        engine_seq_t q = {.tokens = tok, .n_tokens = 5, .kv_seq = s, .slot = slot, .logits = ENGINE_LOGITS_ALL};
        cr_assert_eq(engine_step(f.e, kc, &q, 1, inc, err), 0, "%s", err);
        for (int t = 5; t < n; t++) {
            q = (engine_seq_t){.tokens = tok + t, .n_tokens = 1, .kv_seq = s, .slot = slot, .logits = ENGINE_LOGITS_LAST};
            cr_assert_eq(engine_step(f.e, kc, &q, 1, inc + (size_t)t * V, err), 0, "%s", err);
        }
        cr_assert_eq(kvcache_seq_len(kc, s), n);
        size_t w = 0;
        float d = tu_max_abs_diff(full, inc, (size_t)n * V, &w);
        cr_assert_lt(d, 1e-4f, "slot %d: max abs diff %g at row %zu", slot, d, w / V);
        kvcache_destroy(&kc);
        free(full);
        free(inc);
    }
    fx_free(&f);
}

Test(engine, adapter_changes_output) {
    // Guards the other tests: a batch that ignored adapters would pass them trivially.
    fx_t f = fx_new(1);
    put_adapter(&f, 0, 4, LORA_ALL_TARGETS, 9);
    int n = 8, V = f.c.vocab_size;
    int32_t tok[8];
    rand_tokens(tok, n, V, 4);
    float a[8 * 41], b[8 * 41];
    full_logits(&f, tok, n, -1, a);
    full_logits(&f, tok, n, 0, b);
    cr_assert_gt(tu_max_abs_diff(a, b, (size_t)n * V, NULL), 1e-2f);
    fx_free(&f);
}

Test(engine, mixed_adapter_batch_equals_each_alone) {
    enum { S = 8 };
    fx_t f = fx_new(S);
    int ranks[S] = {1, 2, 4, 8, 3, 5, 16, 6};
    unsigned tg[S] = {LORA_ALL_TARGETS, 1u << LORA_Q | 1u << LORA_V, LORA_ALL_TARGETS, 1u << LORA_DOWN,
                      1u << LORA_O | 1u << LORA_GATE | 1u << LORA_UP, LORA_ALL_TARGETS, 1u << LORA_K, LORA_ALL_TARGETS};
    for (int i = 0; i < S; i++) put_adapter(&f, i, ranks[i], tg[i], 100 + i);
    int V = f.c.vocab_size, lens[S] = {7, 3, 12, 1, 9, 5, 15, 4};
    int32_t tok[S][16];
    for (int i = 0; i < S; i++) rand_tokens(tok[i], 16, V, 50 + i);
    char err[ERR_LEN];
    // Reference: each sequence alone, prefill lens[i] tokens then one decode token.
    float ref[S][2][41];
    for (int i = 0; i < S; i++) {
        kvcache_t *kc = kvcache_new(f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 64, 8, err);
        int s = kvcache_seq_new(kc, err);
        engine_seq_t q = {.tokens = tok[i], .n_tokens = lens[i], .kv_seq = s, .slot = i, .logits = ENGINE_LOGITS_LAST};
        cr_assert_eq(engine_step(f.e, kc, &q, 1, ref[i][0], err), 0, "%s", err);
        q = (engine_seq_t){.tokens = tok[i] + lens[i], .n_tokens = 1, .kv_seq = s, .slot = i, .logits = ENGINE_LOGITS_LAST};
        cr_assert_eq(engine_step(f.e, kc, &q, 1, ref[i][1], err), 0, "%s", err);
        kvcache_destroy(&kc);
    }
    // Batched, in a scrambled slot order; step 2 mixes decode rows with a late prefill.
    kvcache_t *kc = kvcache_new(f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 256, 16, err);
    int order[S] = {5, 2, 7, 0, 3, 6, 1, 4}, seq[S];
    engine_seq_t q[S];
    for (int j = 0; j < S; j++) seq[order[j]] = kvcache_seq_new(kc, err);
    // step 1: all but sequence 4 prefill
    int n = 0;
    for (int j = 0; j < S; j++) {
        int i = order[j];
        if (i == 4) continue;
        q[n++] = (engine_seq_t){.tokens = tok[i], .n_tokens = lens[i], .kv_seq = seq[i], .slot = i, .logits = ENGINE_LOGITS_LAST};
    }
    float out1[S][41], out2[S][41];
    cr_assert_eq(engine_step(f.e, kc, q, n, out1[0], err), 0, "%s", err);
    n = 0;
    for (int j = 0; j < S; j++)
        if (order[j] != 4) {
            int i = order[j];
            size_t w = 0;
            float d = tu_max_abs_diff(out1[n++], ref[i][0], (size_t)V, &w);
            cr_assert_lt(d, 1e-4f, "prefill seq %d (rank %d): diff %g", i, ranks[i], d);
        }
    // step 2: decode for the seven, prefill for sequence 4
    n = 0;
    for (int j = 0; j < S; j++) {
        int i = order[j];
        if (i == 4)
            q[n++] = (engine_seq_t){.tokens = tok[i], .n_tokens = lens[i], .kv_seq = seq[i], .slot = i, .logits = ENGINE_LOGITS_LAST};
        else
            q[n++] = (engine_seq_t){.tokens = tok[i] + lens[i], .n_tokens = 1, .kv_seq = seq[i], .slot = i, .logits = ENGINE_LOGITS_LAST};
    }
    cr_assert_eq(engine_step(f.e, kc, q, n, out2[0], err), 0, "%s", err);
    for (int j = 0; j < S; j++) {
        int i = order[j];
        float d = tu_max_abs_diff(out2[j], ref[i][i == 4 ? 0 : 1], (size_t)V, NULL);
        cr_assert_lt(d, 1e-4f, "step 2 seq %d (rank %d): diff %g", i, ranks[i], d);
    }
    kvcache_destroy(&kc);
    fx_free(&f);
}

Test(engine, forked_group_equals_independent_sequences) {
    enum { G = 4, P = 9, T = 6 };
    fx_t f = fx_new(1);
    put_adapter(&f, 0, 3, LORA_ALL_TARGETS, 77);
    int V = f.c.vocab_size;
    int32_t prompt[P], gen[G][T];
    rand_tokens(prompt, P, V, 1);
    for (int g = 0; g < G; g++) rand_tokens(gen[g], T, V, 200 + g);
    char err[ERR_LEN];
    // block size 4 and a 9-token prompt: the shared last block is partial, so the first
    // decode of every fork must copy it.
    kvcache_t *kc = kvcache_new(f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 64, 8, err);
    int root = kvcache_seq_new(kc, err);
    engine_seq_t q[G];
    float first[41];
    q[0] = (engine_seq_t){.tokens = prompt, .n_tokens = P, .kv_seq = root, .slot = 0, .logits = ENGINE_LOGITS_LAST};
    cr_assert_eq(engine_step(f.e, kc, q, 1, first, err), 0, "%s", err);
    int free_after_prompt = kvcache_free_blocks(kc);
    int s[G];
    s[0] = root;
    for (int g = 1; g < G; g++) s[g] = kvcache_seq_fork(kc, root, err);
    cr_assert_eq(kvcache_free_blocks(kc), free_after_prompt, "fork must not allocate blocks");
    cr_assert_eq(kvcache_block_refs(kc, s[1], 0), G);
    float out[T][G][41];
    for (int t = 0; t < T; t++) {
        for (int g = 0; g < G; g++)
            q[g] = (engine_seq_t){.tokens = &gen[g][t], .n_tokens = 1, .kv_seq = s[g], .slot = 0, .logits = ENGINE_LOGITS_LAST};
        cr_assert_eq(engine_step(f.e, kc, q, G, out[t][0], err), 0, "%s", err);
    }
    cr_assert_eq(kvcache_block_refs(kc, s[1], 0), G, "full prompt blocks stay shared");
    for (int g = 0; g < G; g++) {
        int32_t full[P + T];
        memcpy(full, prompt, sizeof prompt);
        memcpy(full + P, gen[g], sizeof gen[g]);
        float ref[(P + T) * 41];
        full_logits(&f, full, P + T, 0, ref);
        for (int t = 0; t < T; t++) {
            float d = tu_max_abs_diff(out[t][g], ref + (size_t)(P + t) * V, (size_t)V, NULL);
            cr_assert_lt(d, 1e-4f, "fork %d step %d diff %g", g, t, d);
        }
    }
    kvcache_destroy(&kc);
    fx_free(&f);
}

Test(engine, rollout_logprobs_equal_trainer_logprobs) {
    fx_t f = fx_new(2);
    put_adapter(&f, 1, 8, LORA_ALL_TARGETS, 31);
    int n = 30, V = f.c.vocab_size;
    int32_t tok[30];
    rand_tokens(tok, n, V, 8);
    float *logits = malloc(sizeof(float) * n * V), lp_train[30], worst = 0.0f;
    full_logits(&f, tok, n, 1, logits);
    char err[ERR_LEN];
    engine_train_seq_t s = {.tokens = tok, .len = n, .slot = 1};
    float *lp[1] = {lp_train};
    for (float T = 0.5f; T <= 1.5f; T += 0.5f) {
        cr_assert_eq(engine_logprobs(f.e, &s, 1, T, lp, NULL, err), 0, "%s", err);
        for (int t = 1; t < n; t++) {
            float ref = sampler_logprob(logits + (size_t)(t - 1) * V, V, T, tok[t]);
            float d = fabsf(ref - lp_train[t]);
            if (d > worst) worst = d;
        }
    }
    cr_assert_lt(worst, 1e-5f, "rollout/trainer log-prob mismatch %g", worst);
    free(logits);
    fx_free(&f);
}

Test(engine, bad_input_is_refused_not_crashed) {
    fx_t f = fx_new(2);
    char err[ERR_LEN];
    kvcache_t *kc = kvcache_new(f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 3, 4, err);
    int s = kvcache_seq_new(kc, err);
    int32_t tok[20] = {0};
    float out[41];
    engine_seq_t q = {.tokens = tok, .n_tokens = 2, .kv_seq = s, .slot = 1, .logits = ENGINE_LOGITS_LAST};
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), -1);
    cr_assert(strstr(err, "empty"), "%s", err);
    tok[1] = 41;
    q.slot = -1;
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), -1);
    cr_assert(strstr(err, "vocabulary"), "%s", err);
    tok[1] = 0;
    q.n_tokens = 20;   // needs 5 blocks, 3 exist
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), -1);
    cr_assert(strstr(err, "KV cache full"), "%s", err);
    cr_assert_eq(kvcache_seq_len(kc, s), 0);
    cr_assert_eq(kvcache_free_blocks(kc), 3, "a refused step changes nothing");
    q.n_tokens = 2;
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), 0, "%s", err);
    engine_train_seq_t ts = {.tokens = tok, .len = 200, .slot = -1};
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
    cr_assert_eq(engine_train(f.e, &ts, 1, &lc, NULL, NULL, NULL, 0, err), -1);
    cr_assert(strstr(err, "supports"), "%s", err);
    kvcache_destroy(&kc);
    fx_free(&f);
}

Test(engine, cache_or_adapter_of_another_backend_refused) {
    // The CPU backend under another name: memory the engine must not mix with its model's.
    kernels_t other = *kernels_cpu();
    other.name = "other";
    fx_t f = fx_new(2);
    char err[ERR_LEN];
    int32_t tok[4] = {1, 2, 3, 4};
    float out[41];
    kvcache_t *kc = kvcache_new_on(&other, f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 8, 2, err);
    int s = kvcache_seq_new(kc, err);
    engine_seq_t q = {.tokens = tok, .n_tokens = 4, .kv_seq = s, .slot = -1, .logits = ENGINE_LOGITS_LAST};
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), -1);
    cr_assert(strstr(err, "KV cache") && strstr(err, "other"), "%s", err);
    cr_assert_eq(kvcache_seq_len(kc, s), 0);
    kvcache_destroy(&kc);
    // kvcache_new_on with the model's own table is kvcache_new
    kc = kvcache_new_on(f.m->k, f.c.num_hidden_layers, f.c.num_key_value_heads * f.c.head_dim, 4, 8, 2, err);
    s = kvcache_seq_new(kc, err);
    q.kv_seq = s;
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), 0, "%s", err);
    peft_config_t pc = {.r = 2, .alpha = 4.0f, .targets = LORA_ALL_TARGETS};
    lora_t *a = lora_new(&f.c, &pc, &other, 3, err);
    cr_assert_eq(lora_pool_set(f.pool, 1, &a, err), 0, "%s", err);
    q = (engine_seq_t){.tokens = tok, .n_tokens = 1, .kv_seq = s, .slot = 1, .logits = ENGINE_LOGITS_LAST};
    cr_assert_eq(engine_step(f.e, kc, &q, 1, out, err), -1);
    cr_assert(strstr(err, "adapter in slot 1") && strstr(err, "other"), "%s", err);
    engine_train_seq_t ts = {.tokens = tok, .len = 4, .slot = 1};
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
    cr_assert_eq(engine_train(f.e, &ts, 1, &lc, NULL, NULL, NULL, 0, err), -1);
    cr_assert(strstr(err, "adapter in slot 1") && strstr(err, "other"), "%s", err);
    kvcache_destroy(&kc);
    fx_free(&f);
}

// test_train.c - learning works end to end: a small model overfits a text with cross-entropy
// and AdamW (full parameters); GRPO steps (common/rl/batch.h, the trainer's step) with the RL
// loss on a LoRA adapter raise a toy reward;
// generation is reproducible and honours its stop rules.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/engine/generate.h"
#include "common/engine/optim.h"
#include "common/rl/batch.h"
#include "testutil.h"

Test(train, overfits_fixed_text_with_cross_entropy) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    model_t *m = model_new(&c, kernels_cpu(), err);
    model_init_random(m, 1);
    lora_pool_t *pool = lora_pool_new(1);
    engine_t *e = engine_new(m, pool, err);
    enum { N = 48 };
    int32_t tok[N];
    float w[N];
    rng_t r;
    rng_seed(&r, 2);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_next(&r) % 41), w[i] = 1.0f;
    engine_train_seq_t s = {.tokens = tok, .len = N, .slot = -1, .weight = w};
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
    optim_cfg_t oc = optim_defaults();
    oc.lr = 1e-2f;
    optim_t *o = optim_new(&oc, kernels_cpu(), m->n_params);
    float *g = calloc(m->n_params, sizeof(float));
    loss_stats_t st[2];
    double first = 0, last = 0;
    for (int step = 0; step < 300; step++) {
        memset(g, 0, sizeof(float) * m->n_params);
        cr_assert_eq(engine_train(e, &s, 1, &lc, g, NULL, st, (int)(sizeof st / sizeof st[0]), err), 0, "%s", err);
        if (step == 0) first = st[0].loss;
        last = st[0].loss;
        if (last < 0.02) break;
        optim_step(o, m->params, g);
    }
    cr_assert_gt(first, 3.0, "random init should be near log(41) = 3.7, got %g", first);
    cr_assert_lt(last, 0.05, "loss after training %g", last);
    free(g);
    optim_destroy(&o);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

// Toy RL task: reward = fraction of the 6 generated tokens whose id is below 8.
static double reward_of(const gen_sample_t *s) {
    int good = 0;
    for (int i = 0; i < s->n; i++) good += s->tokens[i] < 8;
    return (double)good / 6.0;
}

Test(train, grpo_raises_toy_reward) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    model_t *m = tu_model(&c, 3);
    lora_pool_t *pool = lora_pool_new(1);
    peft_config_t pc = {.r = 4, .alpha = 8.0f, .targets = LORA_ALL_TARGETS};
    lora_t *a = lora_new(&c, &pc, kernels_cpu(), 9, err);
    size_t np = a->n_params;
    cr_assert_eq(lora_pool_set(pool, 0, &a, err), 0, "%s", err);
    engine_t *e = engine_new(m, pool, err);
    kvcache_t *kc = kvcache_new(c.num_hidden_layers, c.num_key_value_heads * c.head_dim, 8, 256, 64, err);
    gen_t *gn = gen_new(e, kc, NULL, 256, err);
    optim_cfg_t oc = optim_defaults();
    oc.lr = 2e-2f;
    optim_t *o = optim_new(&oc, kernels_cpu(), np);
    float *grad = calloc(np, sizeof(float));
    rl_batch_t b = {0};
    enum { G = 8, P = 4, STEPS = 40 };
    double early = 0, late = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t prompt[P] = {1, (int32_t)(step % 5) + 10, 3, 4};
        gen_request_t rq = {.prompt = prompt, .prompt_len = P, .slot = 0, .n_samples = G, .max_new_tokens = 6,
                            .sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f}, .seed = 1000 + step};
        cr_assert_geq(gen_submit(gn, &rq, err), 0, "%s", err);
        cr_assert_eq(gen_run(gn, err), 0, "%s", err);
        gen_result_t *res = gen_take(gn);
        cr_assert_not_null(res);
        double mean = 0;
        rl_sample_t sm[G];
        for (int i = 0; i < G; i++) {
            const gen_sample_t *s = &res->samples[i];
            sm[i] = (rl_sample_t){.tokens = s->tokens, .logprobs = s->logprobs, .n = s->n,
                                  .reward = (float)reward_of(s)};
            mean += sm[i].reward / G;
        }
        if (step < 5) early += mean / 5;
        if (step >= STEPS - 5) late += mean / 5;
        // the trainer's step: the group packed with its advantages, one pass, one AdamW step
        rl_group_t gr = {.prompt = prompt, .n_prompt = P, .samples = sm, .n_samples = G, .version = (uint32_t)step};
        rl_job_cfg_t jc = {.slot = 0, .version = (uint32_t)step, .std_norm = true, .skip_flat = true};
        rl_batch_reset(&b);
        cr_assert_eq(rl_batch_add_job(&b, &jc, &gr, 1, err), 0, "%s", err);
        gen_result_free(&res);
        if (b.n == 0) continue;   // equal rewards: no signal
        loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f};
        rl_step_job_t sj = {.opt = o, .grad = grad};
        cr_assert_eq(rl_train_step(NULL, e, &b, 0, 1, &lc, &sj, err), 0, "%s", err);
        cr_assert(!sj.failed, "%s", sj.error);
        // on-policy: ratio is 1 up to float noise between the rollout and trainer forward
        cr_assert_float_eq(sj.loss.ratio_mean, 1.0, 1e-4);
        cr_assert_gt(sj.loss.mismatch_tokens, 0);
        cr_assert_lt(sj.loss.mismatch, 1e-5, "rollout/trainer log-prob mismatch %g", sj.loss.mismatch);
    }
    cr_assert_gt(late, early + 0.25, "mean reward %.3f -> %.3f", early, late);
    rl_batch_free(&b);
    free(grad);
    optim_destroy(&o);
    gen_destroy(&gn);
    kvcache_destroy(&kc);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

Test(generate, reproducible_regardless_of_batch_and_honours_stops) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    model_t *m = tu_model(&c, 4);
    lora_pool_t *pool = lora_pool_new(2);
    lora_t *a = tu_adapter(&c, 4, LORA_ALL_TARGETS, 8);
    lora_pool_set(pool, 1, &a, err);
    engine_t *e = engine_new(m, pool, err);
    kvcache_t *kc = kvcache_new(c.num_hidden_layers, c.num_key_value_heads * c.head_dim, 4, 512, 64, err);
    int32_t p1[5] = {1, 2, 3, 4, 5}, p2[3] = {7, 8, 9}, stop = 2;
    gen_request_t r1 = {.prompt = p1, .prompt_len = 5, .slot = 1, .n_samples = 4, .max_new_tokens = 12,
                        .sp = {.temperature = 0.8f, .top_k = 20, .top_p = 0.95f}, .seed = 42, .stop_ids = &stop,
                        .n_stop_ids = 1};
    gen_request_t r2 = {.prompt = p2, .prompt_len = 3, .slot = -1, .n_samples = 3, .max_new_tokens = 7,
                        .sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f}, .seed = 43};
    // alone
    gen_t *g = gen_new(e, kc, NULL, 64, err);
    gen_submit(g, &r1, err);
    cr_assert_eq(gen_run(g, err), 0, "%s", err);
    gen_result_t *alone = gen_take(g);
    // together with another request, with a tiny batch budget that splits prefill into chunks
    gen_destroy(&g);
    g = gen_new(e, kc, NULL, 3, err);
    gen_submit(g, &r2, err);
    gen_submit(g, &r1, err);
    cr_assert_eq(gen_run(g, err), 0, "%s", err);
    gen_result_t *x = gen_take(g), *y = gen_take(g);
    gen_result_t *mixed = x->id == 1 ? x : y, *other = x->id == 1 ? y : x;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(alone->samples[i].n, mixed->samples[i].n, "sample %d length", i);
        cr_assert_eq(memcmp(alone->samples[i].tokens, mixed->samples[i].tokens, sizeof(int32_t) * alone->samples[i].n), 0);
        for (int t = 0; t < alone->samples[i].n; t++)
            cr_assert_float_eq(alone->samples[i].logprobs[t], mixed->samples[i].logprobs[t], 1e-4);
        const gen_sample_t *s = &alone->samples[i];
        if (s->finish == GEN_FINISH_EOS) cr_assert_eq(s->tokens[s->n - 1], stop);
        else cr_assert_eq(s->n, 12);
        for (int t = 0; t + 1 < s->n; t++) cr_assert_neq(s->tokens[t], stop);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(other->samples[i].n, 7);
        cr_assert_eq(other->samples[i].finish, GEN_FINISH_LENGTH);
    }
    // samples of one group differ (independent streams)
    cr_assert(memcmp(other->samples[0].tokens, other->samples[1].tokens, 7 * sizeof(int32_t)) != 0 ||
              memcmp(other->samples[0].tokens, other->samples[2].tokens, 7 * sizeof(int32_t)) != 0);
    cr_assert_eq(kvcache_free_blocks(kc), kvcache_total_blocks(kc), "every block returned");
    gen_result_free(&alone);
    gen_result_free(&x);
    gen_result_free(&y);
    gen_destroy(&g);
    kvcache_destroy(&kc);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

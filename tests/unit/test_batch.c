// test_batch.c - the training step (common/rl/batch.h): groups packed into the sequences written
// out by hand (tokens, weights, behaviour log-probs, advantages, shared prompts, on-policy flags,
// statistics); refused groups leave the batch as it was; rl_train_step equals the engine pass and
// AdamW step done by hand, bit for bit, with and without the KL term and for jobs later in a
// batch; adapter slots beyond 256 train; bad slots are refused; a job that is not finite fails
// alone.
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/batch.h"
#include "common/rl/rl.h"
#include "tests/unit/testutil.h"

static void expect_seq(const engine_train_seq_t *s, const int32_t *tok, int len, const float *w, const float *old,
                       int slot, float adv, bool on_policy, int prefix_of, int prefix_len, const char *what) {
    cr_assert_eq(s->len, len, "%s: len %d", what, s->len);
    cr_assert_eq(memcmp(s->tokens, tok, sizeof(int32_t) * (size_t)len), 0, "%s: tokens", what);
    if (w) {
        cr_assert_not_null(s->weight, "%s: weights", what);
        cr_assert_eq(memcmp(s->weight, w, sizeof(float) * (size_t)len), 0, "%s: weights", what);
        cr_assert_eq(memcmp(s->old_logp, old, sizeof(float) * (size_t)len), 0, "%s: behaviour log-probs", what);
    } else {
        cr_assert(!s->weight && !s->old_logp, "%s: a shared prompt carries no loss", what);
    }
    cr_assert_eq(s->slot, slot, "%s: slot", what);
    cr_assert(s->advantage == adv, "%s: advantage %.9g, want %.9g", what, s->advantage, adv);
    cr_assert_eq(s->on_policy, on_policy, "%s: on_policy", what);
    cr_assert_eq(s->prefix_of, prefix_of, "%s: prefix_of", what);
    cr_assert_eq(s->prefix_len, prefix_len, "%s: prefix_len", what);
    cr_assert_null(s->ref_logp, "%s: reference log-probs", what);
}

Test(batch, packs_groups_into_sequences) {
    char err[ERR_LEN];
    const int32_t p0[3] = {7, 8, 9}, p1[1] = {4}, a[2] = {10, 11}, bb[3] = {12, 13, 14}, c[1] = {20}, d[2] = {21, 22};
    const float la[2] = {-1, -2}, lb[3] = {-0.5f, -0.25f, -0.125f}, lc1[1] = {-3}, ld[2] = {-4, -5};
    const uint8_t eb[3] = {0, 1, 0};
    rl_sample_t s0[2] = {{.tokens = a, .logprobs = la, .n = 2, .reward = 1.0f},
                         {.tokens = bb, .logprobs = lb, .env = eb, .n = 3, .reward = 0.0f, .turns = 2}};
    rl_sample_t s1[2] = {{.tokens = c, .logprobs = lc1, .n = 1, .reward = 0.5f},
                         {.tokens = d, .logprobs = ld, .n = 2, .reward = 0.5f}};
    rl_group_t ga[2] = {{.prompt = p0, .n_prompt = 3, .samples = s0, .n_samples = 2, .version = 5, .gen_seconds = 0.25},
                        {.prompt = p1, .n_prompt = 1, .samples = s1, .n_samples = 2, .version = 3, .gen_seconds = 0.5}};
    rl_batch_t b = {0};
    rl_job_cfg_t ca = {.slot = 1, .version = 5, .std_norm = true, .share_prompt = true};
    cr_assert_eq(rl_batch_add_job(&b, &ca, ga, 2, err), 0, "%s", err);
    // advantages of rewards {1, 0}: (r - 0.5) / (0.5 + 1e-4); of {0.5, 0.5}: 0
    float hi = (float)(0.5 / (0.5 + 1e-4)), lo = (float)(-0.5 / (0.5 + 1e-4));
    const int32_t t0[2] = {7, 8}, t1[5] = {7, 8, 9, 10, 11}, t2[6] = {7, 8, 9, 12, 13, 14}, t3[2] = {4, 20},
                  t4[3] = {4, 21, 22};
    const float w1[5] = {0, 0, 0, 1, 1}, o1[5] = {0, 0, 0, -1, -2}, w2[6] = {0, 0, 0, 1, 0, 1},
                o2[6] = {0, 0, 0, -0.5f, -0.25f, -0.125f}, w3[2] = {0, 1}, o3[2] = {0, -3}, w4[3] = {0, 1, 1},
                o4[3] = {0, -4, -5};
    cr_assert_eq(b.n, 5);
    expect_seq(&b.seqs[0], t0, 2, NULL, NULL, 1, 0.0f, false, 0, 0, "shared prompt");
    expect_seq(&b.seqs[1], t1, 5, w1, o1, 1, hi, true, 1, 2, "sample 0");
    expect_seq(&b.seqs[2], t2, 6, w2, o2, 1, lo, true, 1, 2, "sample 1 (an environment token)");
    expect_seq(&b.seqs[3], t3, 2, w3, o3, 1, 0.0f, false, 0, 0, "one-token prompt, stale");
    expect_seq(&b.seqs[4], t4, 3, w4, o4, 1, 0.0f, false, 0, 0, "one-token prompt, stale, 2");
    const rl_batch_job_t *ja = &b.jobs[0];
    cr_assert_eq(ja->first, 0);
    cr_assert_eq(ja->n_seqs, 5);
    cr_assert_eq(ja->groups, 2);
    cr_assert_eq(ja->skipped, 0);
    cr_assert_eq(ja->samples, 4);
    cr_assert(ja->reward_sum == 2.0 && ja->staleness_sum == 2.0 && ja->gen_seconds == 0.75 && ja->turns == 5.0 &&
                  ja->env_tokens == 1.0 && ja->tokens == 16.0 && ja->rows == 2 + 3 + 4 + 2 + 3,
              "reward %g staleness %g gen %g turns %g env %g tokens %g rows %g", ja->reward_sum, ja->staleness_sum,
              ja->gen_seconds, ja->turns, ja->env_tokens, ja->tokens, ja->rows);
    // a second job: a flat group is skipped, the other keeps its prefix link counted from seqs[0]
    rl_sample_t s2[2] = {{.tokens = a, .logprobs = la, .n = 2, .reward = 0.0f},
                         {.tokens = c, .logprobs = lc1, .n = 1, .reward = 1.0f}};
    rl_group_t gb[2] = {{.prompt = p1, .n_prompt = 1, .samples = s1, .n_samples = 2, .version = 9},
                        {.prompt = p0, .n_prompt = 3, .samples = s2, .n_samples = 2, .version = 9}};
    rl_job_cfg_t cb = {.slot = 0, .version = 9, .share_prompt = true, .skip_flat = true};
    cr_assert_eq(rl_batch_add_job(&b, &cb, gb, 2, err), 1, "%s", err);
    const rl_batch_job_t *jb = &b.jobs[1];
    cr_assert(jb->first == 5 && jb->n_seqs == 3 && jb->groups == 2 && jb->skipped == 1 && jb->samples == 4,
              "first %d seqs %d groups %d skipped %d samples %d", jb->first, jb->n_seqs, jb->groups, jb->skipped,
              jb->samples);
    cr_assert(jb->reward_sum == 2.0 && jb->tokens == 5 + 4 && jb->rows == 2 + 3 + 2, "reward %g tokens %g rows %g",
              jb->reward_sum, jb->tokens, jb->rows);
    const int32_t t6[5] = {7, 8, 9, 10, 11}, t7[4] = {7, 8, 9, 20};
    const float w7[4] = {0, 0, 0, 1}, o7[4] = {0, 0, 0, -3};
    expect_seq(&b.seqs[5], t0, 2, NULL, NULL, 0, 0.0f, false, 0, 0, "job 2: shared prompt");
    expect_seq(&b.seqs[6], t6, 5, w1, o1, 0, -0.5f, true, 6, 2, "job 2: sample 0 (no std normalisation)");
    expect_seq(&b.seqs[7], t7, 4, w7, o7, 0, 0.5f, true, 6, 2, "job 2: sample 1");
    // writable behaviour log-probs of a sample; none for a shared prompt
    cr_assert_null(rl_batch_old_logp(&b, 5));
    cr_assert_eq((const float *)rl_batch_old_logp(&b, 7), b.seqs[7].old_logp);
    rl_batch_reset(&b);
    cr_assert(b.n == 0 && b.n_jobs == 0);
    rl_batch_free(&b);
}

Test(batch, refused_groups_add_nothing) {
    char err[ERR_LEN];
    const int32_t p[2] = {3, 4}, a[1] = {5};
    rl_sample_t ok = {.tokens = a, .n = 1, .reward = 1}, empty = {.n = 0}, neg = {.tokens = a, .n = -1};
    rl_group_t good = {.prompt = p, .n_prompt = 2, .samples = &ok, .n_samples = 1};
    rl_batch_t b = {0};
    rl_job_cfg_t c = {.slot = 0, .share_prompt = true};
    cr_assert_eq(rl_batch_add_job(&b, &c, &good, 1, err), 0, "%s", err);
    int n = b.n;
    rl_group_t bad[2] = {good, {.prompt = NULL, .n_prompt = 0, .samples = &empty, .n_samples = 1}};
    cr_assert_eq(rl_batch_add_job(&b, &c, bad, 2, err), -1);
    cr_assert(strstr(err, "group 1 sample 0"), "%s", err);
    bad[1] = (rl_group_t){.prompt = p, .n_prompt = 2, .samples = &neg, .n_samples = 1};
    cr_assert_eq(rl_batch_add_job(&b, &c, bad, 2, err), -1);
    cr_assert(strstr(err, "-1 tokens"), "%s", err);
    cr_assert(b.n == n && b.n_jobs == 1, "a refused job added %d sequences", b.n - n);
    // a prompt alone is a sequence: the sample wrote nothing
    rl_group_t prompt_only = {.prompt = p, .n_prompt = 2, .samples = &empty, .n_samples = 1};
    cr_assert_eq(rl_batch_add_job(&b, &c, &prompt_only, 1, err), 1, "%s", err);
    rl_batch_free(&b);
}

// --- the step against the engine pass and AdamW by hand ------------------------------------------

typedef struct {
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
    optim_t *opt[2];
    float *grad[2];
} rig_t;

// Two identical rigs: the model and adapters (slots `slots`) drawn from the same seeds.
static void rig_open(rig_t *r, int n_slots, const int slots[2]) {
    char err[ERR_LEN];
    hf_config_t c = tu_config();
    r->m = tu_model(&c, 5);
    r->pool = lora_pool_new(n_slots);
    optim_cfg_t oc = optim_defaults();
    oc.lr = 0.02f;
    for (int i = 0; i < 2; i++) {
        lora_t *a = tu_adapter(&c, 2 + i, LORA_ALL_TARGETS, 40 + i);
        cr_assert_eq(lora_pool_set(r->pool, slots[i], &a, err), 0, "%s", err);
        size_t np = lora_pool_get(r->pool, slots[i])->n_params;
        r->opt[i] = optim_new(&oc, kernels_cpu(), np);
        r->grad[i] = kernels_cpu()->alloc(sizeof(float) * np);
    }
    r->e = engine_new(r->m, r->pool, err);
    cr_assert_not_null(r->e, "%s", err);
}

static void rig_close(rig_t *r) {
    for (int i = 0; i < 2; i++) optim_destroy(&r->opt[i]), kernels_cpu()->free(r->grad[i]);
    engine_destroy(&r->e);
    lora_pool_destroy(&r->pool);
    model_destroy(&r->m);
}

// Two jobs (slots[0], slots[1]) of random groups, prompts shared.
static void two_jobs(rl_batch_t *b, const int slots[2], uint64_t seed) {
    rng_t r;
    rng_seed(&r, seed);
    char err[ERR_LEN];
    int32_t prompt[2][6], tok[2][4][7];
    float lp[2][4][7];
    rl_sample_t sm[2][4];
    rl_group_t gr[2];
    for (int j = 0; j < 2; j++) {
        for (int g = 0; g < 2; g++) {
            int plen = 2 + (int)(rng_uniform(&r) * 4);
            for (int t = 0; t < plen; t++) prompt[g][t] = 3 + (int)(rng_uniform(&r) * 37);
            for (int k = 0; k < 4; k++) {
                int n = 1 + (int)(rng_uniform(&r) * 7);
                for (int t = 0; t < n; t++)
                    tok[g][k][t] = 3 + (int)(rng_uniform(&r) * 37), lp[g][k][t] = -3.0f + rng_uniform(&r);
                sm[g][k] = (rl_sample_t){.tokens = tok[g][k], .logprobs = lp[g][k], .n = n, .reward = rng_uniform(&r)};
            }
            gr[g] = (rl_group_t){.prompt = prompt[g], .n_prompt = plen, .samples = sm[g], .n_samples = 4, .version = 1};
        }
        rl_job_cfg_t c = {.slot = slots[j], .version = 1, .std_norm = true, .share_prompt = true};
        cr_assert_eq(rl_batch_add_job(b, &c, gr, 2, err), j, "%s", err);
    }
}

// By hand on rig h: jobs j0..j1-1 of b in one engine_train (the reference pass first with KL),
// then AdamW on each. The statistics of slot s go to st[s + 1].
static void by_hand(rig_t *h, const rl_batch_t *b, int j0, int j1, const int slots[2], const loss_cfg_t *lc,
                    loss_stats_t *st, int nst) {
    char err[ERR_LEN];
    int first = b->jobs[j0].first, n = b->jobs[j1 - 1].first + b->jobs[j1 - 1].n_seqs - first;
    engine_train_seq_t *seqs = calloc((size_t)n, sizeof *seqs), *base = calloc((size_t)n, sizeof *base);
    float **ref = calloc((size_t)n, sizeof *ref);
    for (int i = 0; i < n; i++) {
        seqs[i] = b->seqs[first + i];
        if (seqs[i].prefix_of) seqs[i].prefix_of -= first;
        base[i] = seqs[i], base[i].slot = -1;
        ref[i] = calloc((size_t)seqs[i].len, sizeof(float));
    }
    if (lc->kl_coef > 0) {
        cr_assert_eq(engine_logprobs(h->e, base, n, lc->temperature, ref, NULL, err), 0, "%s", err);
        for (int i = 0; i < n; i++) seqs[i].ref_logp = ref[i];
    }
    float **grads = calloc((size_t)nst - 1, sizeof *grads);
    for (int j = j0; j < j1; j++) {
        grads[slots[j]] = h->grad[j];
        memset(h->grad[j], 0, sizeof(float) * lora_pool_get(h->pool, slots[j])->n_params);
    }
    cr_assert_eq(engine_train(h->e, seqs, n, lc, NULL, grads, st, nst, err), 0, "%s", err);
    for (int j = j0; j < j1; j++) optim_step(h->opt[j], lora_pool_get(h->pool, slots[j])->params, h->grad[j]);
    for (int i = 0; i < n; i++) free(ref[i]);
    free(ref), free(seqs), free(base), free(grads);
}

static void expect_same(rig_t *a, rig_t *h, const rl_step_job_t *sj, const loss_stats_t *st, int j0, int j1,
                        const int slots[2], const char *what) {
    for (int j = j0; j < j1; j++) {
        const lora_t *x = lora_pool_get(a->pool, slots[j]), *y = lora_pool_get(h->pool, slots[j]);
        cr_assert_eq(memcmp(x->params, y->params, sizeof(float) * x->n_params), 0, "%s: slot %d's parameters differ",
                     what, slots[j]);
        const loss_stats_t *p = &sj[j - j0].loss, *q = &st[slots[j] + 1];
        cr_assert(q->tokens > 0 && memcmp(p, q, sizeof *p) == 0, "%s: slot %d: loss %.9g vs %.9g, tokens %g vs %g",
                  what, slots[j], p->loss, q->loss, p->tokens, q->tokens);
        cr_assert(!sj[j - j0].failed && isfinite(sj[j - j0].grad_norm) && sj[j - j0].grad_norm > 0, "%s: %s", what,
                  sj[j - j0].error);
    }
}

static void step_equals_by_hand(int n_slots, const int slots[2], float kl) {
    char err[ERR_LEN];
    rig_t a, h;
    rig_open(&a, n_slots, slots);
    rig_open(&h, n_slots, slots);
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 0.9f, .clip_low = 0.2f, .clip_high = 0.28f, .kl_coef = kl};
    loss_stats_t *st = calloc((size_t)n_slots + 1, sizeof *st);
    for (int round = 0; round < 2; round++) {
        rl_batch_t b = {0};
        two_jobs(&b, slots, 70 + (uint64_t)round);
        // both jobs in one pass, then the second alone (its prefix links counted from its start)
        rl_step_job_t sj[2] = {{.opt = a.opt[0], .grad = a.grad[0]}, {.opt = a.opt[1], .grad = a.grad[1]}};
        cr_assert_eq(rl_train_step(NULL, a.e, &b, 0, 2, &lc, sj, err), 0, "%s", err);
        memset(st, 0, sizeof *st * ((size_t)n_slots + 1));
        by_hand(&h, &b, 0, 2, slots, &lc, st, n_slots + 1);
        expect_same(&a, &h, sj, st, 0, 2, slots, "two jobs");
        cr_assert_eq(rl_train_step(NULL, a.e, &b, 1, 2, &lc, sj + 1, err), 0, "%s", err);
        memset(st, 0, sizeof *st * ((size_t)n_slots + 1));
        by_hand(&h, &b, 1, 2, slots, &lc, st, n_slots + 1);
        expect_same(&a, &h, sj + 1, st, 1, 2, slots, "the second job alone");
        if (kl > 0) cr_assert_gt(sj[1].loss.kl, 0.0, "the adapter moved: the KL term is positive");
        rl_batch_free(&b);
    }
    free(st);
    rig_close(&a);
    rig_close(&h);
}

Test(batch, step_equals_engine_pass_and_adamw) {
    const int slots[2] = {0, 2};
    step_equals_by_hand(3, slots, 0.0f);
}

Test(batch, step_with_kl_equals_reference_pass_by_hand) {
    const int slots[2] = {2, 0};
    step_equals_by_hand(3, slots, 0.05f);
}

// Per-slot arrays come from the pool's size: slots beyond 256 (the trainer's --set max_jobs may be
// larger) train like any other.
Test(batch, slots_beyond_256) {
    const int slots[2] = {299, 257};
    step_equals_by_hand(300, slots, 0.0f);
}

Test(batch, bad_slots_are_refused) {
    char err[ERR_LEN];
    const int slots[2] = {0, 1};
    rig_t a;
    rig_open(&a, 2, slots);
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.2f};
    rl_step_job_t sj[2] = {{.opt = a.opt[0], .grad = a.grad[0]}, {.opt = a.opt[1], .grad = a.grad[1]}};
    const lora_t *ad = lora_pool_get(a.pool, 0);
    float *before = malloc(sizeof(float) * ad->n_params);
    memcpy(before, ad->params, sizeof(float) * ad->n_params);
    const int outside[2] = {0, 2}, twice[2] = {1, 1};
    rl_batch_t b = {0};
    two_jobs(&b, outside, 3);
    cr_assert_eq(rl_train_step(NULL, a.e, &b, 0, 2, &lc, sj, err), DP_REFUSED);
    cr_assert(strstr(err, "slot 2, outside the pool's 0..1"), "%s", err);
    rl_batch_free(&b);
    two_jobs(&b, twice, 3);
    cr_assert_eq(rl_train_step(NULL, a.e, &b, 0, 2, &lc, sj, err), DP_REFUSED);
    cr_assert(strstr(err, "two jobs of one pass have adapter slot 1"), "%s", err);
    cr_assert_eq(rl_train_step(NULL, a.e, &b, 1, 3, &lc, sj, err), DP_REFUSED);
    cr_assert(strstr(err, "jobs 1..2 of a batch of 2"), "%s", err);
    rl_batch_free(&b);
    // a slot without an adapter: the pass refuses it
    lora_pool_clear(a.pool, 1);
    two_jobs(&b, slots, 3);
    cr_assert_eq(rl_train_step(NULL, a.e, &b, 0, 2, &lc, sj, err), DP_REFUSED);
    cr_assert(strstr(err, "slot 1"), "%s", err);
    cr_assert_eq(memcmp(before, ad->params, sizeof(float) * ad->n_params), 0, "a refused step stepped slot 0");
    rl_batch_free(&b);
    free(before);
    rig_close(&a);
}

Test(batch, job_that_is_not_finite_fails_alone) {
    char err[ERR_LEN];
    const int slots[2] = {0, 1};
    rig_t a;
    rig_open(&a, 2, slots);
    lora_pool_get(a.pool, 1)->params[0] = NAN;
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.2f};
    rl_step_job_t sj[2] = {{.opt = a.opt[0], .grad = a.grad[0]}, {.opt = a.opt[1], .grad = a.grad[1]}};
    rl_batch_t b = {0};
    two_jobs(&b, slots, 8);
    cr_assert_eq(rl_train_step(NULL, a.e, &b, 0, 2, &lc, sj, err), 0, "%s", err);
    cr_assert(!sj[0].failed && isfinite(sj[0].loss.loss), "slot 0: %s", sj[0].error);
    cr_assert(sj[1].failed, "slot 1 holds NaN and did not fail");
    cr_assert(strstr(sj[1].error, "not finite"), "%s", sj[1].error);
    rl_batch_free(&b);
    rig_close(&a);
}

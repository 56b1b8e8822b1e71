// batch.c - GRPO groups packed into training sequences, and the training step (see batch.h).
#include "common/rl/batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/rl.h"
#include "common/util/util.h"

// Sizes the engine takes with room to spare: a sequence longer than this is a caller's bug.
#define SEQ_MAX (1 << 28)

static int check_groups(const rl_group_t *groups, int n_groups, char *err) {
    if (n_groups < 0 || (n_groups > 0 && !groups)) return err_set(err, "training batch: %d groups", n_groups);
    for (int g = 0; g < n_groups; g++) {
        const rl_group_t *gr = &groups[g];
        if (gr->n_prompt < 0 || gr->n_prompt > SEQ_MAX || (gr->n_prompt > 0 && !gr->prompt) || gr->n_samples < 0 ||
            (gr->n_samples > 0 && !gr->samples))
            return err_set(err, "training batch: group %d has %d prompt tokens and %d samples", g, gr->n_prompt,
                           gr->n_samples);
        for (int s = 0; s < gr->n_samples; s++) {
            const rl_sample_t *sm = &gr->samples[s];
            if (sm->n < 0 || sm->n > SEQ_MAX - gr->n_prompt || (sm->n > 0 && !sm->tokens))
                return err_set(err, "training batch: group %d sample %d has %d tokens", g, s, sm->n);
            if (gr->n_prompt + sm->n < 1)
                return err_set(err, "training batch: group %d sample %d has neither prompt nor completion tokens", g,
                               s);
        }
    }
    return 0;
}

// A new sequence of len tokens: one allocation of its tokens, then (with_loss) its weights and
// behaviour log-probs, all 0.
static engine_train_seq_t *push(rl_batch_t *b, int len, bool with_loss) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->seqs = xrealloc(b->seqs, sizeof *b->seqs * (size_t)b->cap);
    }
    engine_train_seq_t *s = &b->seqs[b->n++];
    int32_t *mem = xcalloc((size_t)len * (with_loss ? 3 : 1), sizeof(int32_t));
    *s = (engine_train_seq_t){.tokens = mem, .len = len};
    if (with_loss) s->weight = (float *)(mem + len), s->old_logp = (float *)(mem + 2 * (size_t)len);
    return s;
}

int rl_batch_add_job(rl_batch_t *b, const rl_job_cfg_t *cfg, const rl_group_t *groups, int n_groups, char *err) {
    if (check_groups(groups, n_groups, err)) return -1;
    if (b->n_jobs == b->cap_jobs) {
        b->cap_jobs = b->cap_jobs ? 2 * b->cap_jobs : 16;
        b->jobs = xrealloc(b->jobs, sizeof *b->jobs * (size_t)b->cap_jobs);
    }
    rl_batch_job_t *j = &b->jobs[b->n_jobs];
    *j = (rl_batch_job_t){.cfg = *cfg, .first = b->n};
    int max_g = 1;
    for (int g = 0; g < n_groups; g++) max_g = groups[g].n_samples > max_g ? groups[g].n_samples : max_g;
    float *rw = xmalloc(sizeof(float) * (size_t)max_g), *adv = xmalloc(sizeof(float) * (size_t)max_g);
    for (int g = 0; g < n_groups; g++) {
        const rl_group_t *gr = &groups[g];
        int G = gr->n_samples, P = gr->n_prompt;
        j->groups++;
        j->samples += G;
        for (int s = 0; s < G; s++)
            rw[s] = gr->samples[s].reward, j->reward_sum += rw[s], j->reward_sq += (double)rw[s] * rw[s];
        if (G > 0) rl_group_advantages(rw, G, cfg->std_norm, adv);
        // the difference of the versions as the trainer has always reported it (unsigned)
        j->staleness_sum += cfg->version - gr->version;
        j->gen_seconds += gr->gen_seconds;
        for (int s = 0; s < G; s++) {
            const rl_sample_t *sm = &gr->samples[s];
            j->turns += sm->turns ? sm->turns : 1;
            for (int q = 0; sm->env && q < sm->n; q++) j->env_tokens += sm->env[q] != 0;
            for (int q = 0; q < sm->n; q++) j->gen_tokens += !(sm->env && sm->env[q]);
        }
        bool signal = false;
        for (int s = 0; s < G; s++) signal |= adv[s] != 0.0f;
        if (cfg->skip_flat && !signal) {
            j->skipped++;
            continue;
        }
        // the prompt less its last token, once: the last prompt token's row predicts the first
        // completion token, so it is a row of each sample
        int prefix_of = 0, prefix_len = 0;
        if (cfg->share_prompt && P >= 2 && G > 0) {
            prefix_len = P - 1;
            engine_train_seq_t *ps = push(b, prefix_len, false);
            memcpy((int32_t *)ps->tokens, gr->prompt, sizeof(int32_t) * (size_t)prefix_len);
            ps->slot = cfg->slot;
            prefix_of = b->n;   // its index + 1
            j->rows += prefix_len;
        }
        for (int s = 0; s < G; s++) {
            const rl_sample_t *sm = &gr->samples[s];
            int len = P + sm->n;
            engine_train_seq_t *q = push(b, len, true);
            int32_t *tok = (int32_t *)q->tokens;
            float *w = (float *)q->weight, *old = (float *)q->old_logp;
            if (P) memcpy(tok, gr->prompt, sizeof(int32_t) * (size_t)P);
            if (sm->n) memcpy(tok + P, sm->tokens, sizeof(int32_t) * (size_t)sm->n);
            // only the model's tokens carry loss: the environment's (observations of an episode) do not
            for (int t = 0; t < sm->n; t++) {
                w[P + t] = sm->env && sm->env[t] ? 0.0f : 1.0f;
                old[P + t] = sm->logprobs ? sm->logprobs[t] : 0.0f;
            }
            q->slot = cfg->slot;
            q->advantage = adv[s];
            q->on_policy = gr->version == cfg->version;
            q->prefix_of = prefix_of;
            q->prefix_len = prefix_len;
            j->tokens += len;
            j->rows += len - prefix_len;
        }
    }
    free(rw), free(adv);
    j->n_seqs = b->n - j->first;
    return b->n_jobs++;
}

float *rl_batch_old_logp(rl_batch_t *b, int i) {
    ASSERT(i >= 0 && i < b->n);
    return (float *)b->seqs[i].old_logp;
}

void rl_batch_reset(rl_batch_t *b) {
    for (int i = 0; i < b->n; i++) free((void *)b->seqs[i].tokens);
    b->n = 0;
    b->n_jobs = 0;
}

void rl_batch_free(rl_batch_t *b) {
    rl_batch_reset(b);
    free(b->seqs);
    free(b->jobs);
    memset(b, 0, sizeof *b);
}

int rl_train_step(dp_t *dp, engine_t *e, const rl_batch_t *b, int j0, int j1, const loss_cfg_t *lc,
                  rl_step_job_t *jobs, char *err) {
    lora_pool_t *pool = engine_pool(e);
    const kernels_t *k = engine_model(e)->k;
    int n_slots = lora_pool_slots(pool), nj = j1 - j0;
    if (j0 < 0 || j1 > b->n_jobs || nj < 1)
        return err_set(err, "training step: jobs %d..%d of a batch of %d", j0, j1 - 1, b->n_jobs), DP_REFUSED;
    for (int i = 0; i < nj; i++) {
        jobs[i].loss = (loss_stats_t){0};
        jobs[i].grad_norm = jobs[i].seconds = 0.0;
        jobs[i].failed = false;
        jobs[i].error[0] = 0;
    }
    // per adapter slot, as the engine indexes gradients and statistics: sized from the pool
    float **grads = xcalloc((size_t)n_slots, sizeof *grads);
    loss_stats_t *st = xcalloc((size_t)n_slots + 1, sizeof *st);
    int *slots = xmalloc(sizeof(int) * (size_t)nj), rc = 0;
    for (int i = 0; i < nj && !rc; i++) {
        int s = b->jobs[j0 + i].cfg.slot;
        if (s < 0 || s >= n_slots)
            rc = err_set(err, "training step: job %d has adapter slot %d, outside the pool's 0..%d", j0 + i, s,
                         n_slots - 1);
        else if (grads[s])
            rc = err_set(err, "training step: two jobs of one pass have adapter slot %d", s);
        else if (!jobs[i].opt || !jobs[i].grad)
            rc = err_set(err, "training step: job %d (slot %d) has no optimiser or gradient", j0 + i, s);
        else
            grads[s] = jobs[i].grad, slots[i] = s;
    }
    if (rc) {
        free(grads), free(st), free(slots);
        return DP_REFUSED;
    }
    // the pass's sequences, their prefix links counted from the pass's first sequence
    int first = b->jobs[j0].first, n = b->jobs[j1 - 1].first + b->jobs[j1 - 1].n_seqs - first;
    engine_train_seq_t *seqs = xmalloc(sizeof *seqs * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        seqs[i] = b->seqs[first + i];
        if (seqs[i].prefix_of) seqs[i].prefix_of -= first;
    }
    double t0 = util_now();
    // the whole pass here, or each data-parallel rank its share and the gradients summed
    rc = dp_pass(dp, e, seqs, n, lc, grads, slots, nj, st, n_slots + 1, err);
    double pass_s = util_now() - t0, pass_tokens = 0;
    for (int i = 0; i < nj; i++) pass_tokens += b->jobs[j0 + i].tokens;
    for (int i = 0; i < nj && !rc; i++) {
        rl_step_job_t *o = &jobs[i];
        lora_t *ad = lora_pool_get(pool, slots[i]);
        o->loss = st[slots[i] + 1];
        o->grad_norm = optim_step(o->opt, ad->params, o->grad);
        o->seconds = pass_s * b->jobs[j0 + i].tokens / (pass_tokens > 0 ? pass_tokens : 1);
        if (!isfinite(o->grad_norm) || !isfinite(o->loss.loss) || !k->all_finite(ad->n_params, ad->params)) {
            o->failed = true;
            snprintf(o->error, sizeof o->error, "loss or gradient is not finite (loss %g, gradient norm %g)",
                     o->loss.loss, o->grad_norm);
        }
    }
    free(seqs), free(grads), free(st), free(slots);
    return rc;
}

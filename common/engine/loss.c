// loss.c - the per-token losses of engine_train (loss.h).
#include "common/engine/loss.h"

#include <math.h>

#include "common/util/util.h"

int loss_check(const loss_cfg_t *lc, const engine_train_seq_t *seqs, int n, char *err) {
    if (lc->kind != LOSS_CE && lc->kind != LOSS_RL) return err_set(err, "unknown loss kind %d", lc->kind);
    if (lc->kind == LOSS_RL)
        for (int i = 0; i < n; i++)
            if (seqs[i].weight && !seqs[i].old_logp)
                return err_set(err, "RL loss: sequence %d has no behaviour log-probs", i);
    if (lc->kind == LOSS_RL && lc->kl_coef > 0.0f)
        for (int i = 0; i < n; i++)
            if (seqs[i].weight && !seqs[i].ref_logp)
                return err_set(err, "RL loss with KL: sequence %d has no reference log-probs", i);
    for (int i = 0; lc->slot_weight && i < n; i++) {
        bool weighted = false;
        for (int t = seqs[i].prefix_len + 1; seqs[i].weight && t < seqs[i].len && !weighted; t++)
            weighted = seqs[i].weight[t] > 0.0f;
        int g = seqs[i].slot + 1;
        if (weighted && (g >= lc->n_slot_weight || !(lc->slot_weight[g] > 0.0)))
            return err_set(err, "loss normaliser: no positive slot_weight for slot %d (sequence %d; %d entries)",
                           seqs[i].slot, i, lc->n_slot_weight);
    }
    return 0;
}

loss_token_t loss_token(const loss_cfg_t *lc, const engine_train_seq_t *s, int t, float logp) {
    loss_token_t r = {.ratio = 1.0};
    if (lc->kind == LOSS_CE) {
        r.loss = -logp;
        r.dlogp = -1.0;
        return r;
    }
    // PPO/GRPO: min of the ratio and the clipped ratio times the advantage, as a loss the larger
    // of the two negated terms; the clipped branch passes no gradient.
    double A = s->advantage;
    r.ratio = exp((double)logp - s->old_logp[t]);
    double rc = r.ratio < 1.0 - lc->clip_low    ? 1.0 - lc->clip_low
                : r.ratio > 1.0 + lc->clip_high ? 1.0 + lc->clip_high
                                                : r.ratio;
    double pg1 = -A * r.ratio, pg2 = -A * rc;
    if (pg2 > pg1) {
        r.loss = pg2, r.dlogp = 0.0, r.clipped = 1.0;
    } else {
        r.loss = pg1, r.dlogp = -A * r.ratio;
    }
    if (s->ref_logp) {
        double dl = (double)s->ref_logp[t] - logp;
        r.kl = exp(dl) - dl - 1.0;
        if (lc->kl_coef > 0.0f) {
            r.loss += lc->kl_coef * r.kl;
            r.dlogp += lc->kl_coef * (1.0 - exp(dl));
        }
    }
    return r;
}

void loss_stats_add(loss_stats_t *st, const engine_train_seq_t *s, int t, double wn, double wt, const loss_token_t *tl,
                    float logp, float entropy) {
    st->loss += wn * tl->loss;
    st->tokens += wt;
    st->clip_frac += wn * tl->clipped;
    st->kl += wn * tl->kl;
    st->entropy += wn * entropy;
    st->ratio_mean += wn * tl->ratio;
    st->logp_mean += wn * logp;
    if (s->on_policy && s->old_logp) {
        st->mismatch += fabs((double)logp - s->old_logp[t]);
        st->mismatch_tokens += 1;
    }
}

void loss_stats_finish(loss_stats_t *st, int n) {
    for (int g = 0; g < n; g++)
        if (st[g].mismatch_tokens > 0) st[g].mismatch /= st[g].mismatch_tokens;
}

// test_loss.c - the per-token losses (common/engine/loss.c): derivatives against central finite
// differences, clipping on the side the advantage makes binding, the KL term, statistics.
#include <criterion/criterion.h>
#include <math.h>

#include "common/engine/loss.h"

static double fd(const loss_cfg_t *lc, const engine_train_seq_t *s, int t, float lp) {
    const float h = 1e-3f;
    return (loss_token(lc, s, t, lp + h).loss - loss_token(lc, s, t, lp - h).loss) / (2.0 * h);
}

Test(loss, cross_entropy) {
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1};
    engine_train_seq_t s = {0};
    loss_token_t tl = loss_token(&lc, &s, 1, -2.5f);
    cr_assert_eq(tl.loss, 2.5);
    cr_assert_eq(tl.dlogp, -1.0);
    cr_assert_eq(tl.ratio, 1.0);
}

Test(loss, surrogate_derivative_clip_and_kl) {
    float old[3] = {0, -1.0f, -1.0f}, ref[3] = {0, -1.3f, -1.3f};
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1, .clip_low = 0.2f, .clip_high = 0.2f, .kl_coef = 0.1f};
    for (int sign = -1; sign <= 1; sign += 2) {
        engine_train_seq_t s = {.old_logp = old, .ref_logp = ref, .advantage = 0.7f * sign};
        // inside the trust region: the derivative is the finite difference
        for (float lp = -1.15f; lp <= -0.85f; lp += 0.05f) {
            loss_token_t tl = loss_token(&lc, &s, 1, lp);
            cr_assert_eq(tl.clipped, 0.0);
            cr_assert(fabs(tl.dlogp - fd(&lc, &s, 1, lp)) < 1e-4, "A %+.1f lp %.2f: %g vs %g", s.advantage, lp, tl.dlogp,
                      fd(&lc, &s, 1, lp));
        }
        // beyond it on the side the advantage binds, the surrogate is flat: only the KL term moves
        float far = sign > 0 ? -1.0f + 0.5f : -1.0f - 0.5f;
        loss_token_t tl = loss_token(&lc, &s, 1, far);
        cr_assert_eq(tl.clipped, 1.0, "A %+.1f: ratio %g is clipped", s.advantage, tl.ratio);
        double dl = (double)ref[1] - far;
        cr_assert(fabs(tl.dlogp - lc.kl_coef * (1.0 - exp(dl))) < 1e-12);
        cr_assert(fabs(tl.kl - (exp(dl) - dl - 1.0)) < 1e-12);
        cr_assert(fabs(tl.dlogp - fd(&lc, &s, 1, far)) < 1e-4);
    }
}

Test(loss, statistics_and_checks) {
    float old[2] = {0, -1.0f}, w[2] = {0, 1};
    int32_t tok[2] = {1, 2};
    engine_train_seq_t s = {.tokens = tok, .len = 2, .weight = w, .old_logp = old, .advantage = 1, .on_policy = true};
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1, .clip_low = 0.2f, .clip_high = 0.2f};
    loss_stats_t st[1] = {0};
    loss_token_t tl = loss_token(&lc, &s, 1, -1.25f);
    loss_stats_add(&st[0], &s, 1, 0.5, 1.0, &tl, -1.25f, 2.0f);
    loss_stats_add(&st[0], &s, 1, 0.5, 1.0, &tl, -1.25f, 2.0f);
    loss_stats_finish(st, 1);
    cr_assert_eq(st[0].tokens, 2.0);
    cr_assert(fabs(st[0].entropy - 2.0) < 1e-12);
    cr_assert(fabs(st[0].mismatch - 0.25) < 1e-6, "mean |logp - old|: %g", st[0].mismatch);
    char err[256];
    cr_assert_eq(loss_check(&lc, &s, 1, err), 0, "%s", err);
    s.old_logp = NULL;
    cr_assert_eq(loss_check(&lc, &s, 1, err), -1);
    cr_assert(strstr(err, "no behaviour log-probs"), "%s", err);
    lc.kind = (loss_kind_t)7;
    cr_assert_eq(loss_check(&lc, &s, 1, err), -1);
    cr_assert(strstr(err, "unknown loss kind 7"), "%s", err);
}

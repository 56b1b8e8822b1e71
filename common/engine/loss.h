// loss.h - the per-token losses of engine_train (engine.h: loss_cfg_t, loss_stats_t): token
// cross-entropy, and GRPO's clipped surrogate with the k3 KL estimate to a reference policy. The
// engine computes log-probs and carries d loss / d logp back through the model; what the loss of
// one token is, and what it adds to its group's statistics, is here.
#ifndef MARLAAS_LOSS_H
#define MARLAAS_LOSS_H

#include "common/engine/engine.h"

// One token's loss and its derivative with respect to the token's log-prob.
typedef struct {
    double loss;
    double dlogp;      // d loss / d logp, before the token's weight
    double clipped;    // 1 when the ratio was clipped (the clipped term was the larger loss)
    double kl;         // k3 estimate exp(d) - d - 1, d = ref_logp - logp (0 without a reference)
    double ratio;      // exp(logp - old_logp) (1 for cross-entropy)
} loss_token_t;

// The settings and sequences a training call may take: a known kind, behaviour log-probs for RL,
// reference log-probs when the KL weight is on, and a positive normaliser for every slot with
// weighted tokens when slot_weight is given. 0, or -1 + err naming the sequence.
int loss_check(const loss_cfg_t *lc, const engine_train_seq_t *seqs, int n, char *err);
// Token t of sequence s, whose log-prob under the current parameters is logp.
loss_token_t loss_token(const loss_cfg_t *lc, const engine_train_seq_t *s, int t, float logp);
// Adds token t (normalised weight wn = weight / the group's normaliser, raw weight wt) to its
// group's statistics.
void loss_stats_add(loss_stats_t *st, const engine_train_seq_t *s, int t, double wn, double wt, const loss_token_t *tl,
                    float logp, float entropy);
// Turns the accumulated mismatch sums of n groups into means.
void loss_stats_finish(loss_stats_t *st, int n);

#endif

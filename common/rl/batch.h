// batch.h - one GRPO training step, the same code wherever a step is trained: the trainer service
// (services/trainer/jobs.c), `marlaas train-local`, the tenancy benchmark and the tests.
//
//   rl_batch_t      scored groups (a prompt and G samples: tokens, behaviour log-probs, the
//                   environment's tokens, rewards) packed into the engine's training sequences
//                   (engine_train_seq_t): group-relative advantages, loss weights (the model's
//                   tokens only), shared-prompt prefixes; jobs one after the other, each on its
//                   adapter slot, with the statistics the callers report;
//   rl_train_step   one pass over some consecutive jobs of a batch (dp_pass: the reference pass
//                   for the KL term when the loss has one, the engine's forward and backward, on
//                   this process or split over a data-parallel group), then every job's AdamW
//                   step and the check that loss, gradient and parameters are finite.
//
// Layering: batch uses engine and dp; it knows nothing of Redis, sockets or tasks.
#ifndef MARLAAS_RL_BATCH_H
#define MARLAAS_RL_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/engine/engine.h"
#include "common/engine/optim.h"
#include "common/rl/dp.h"

// A sample of a group as the rollout drew it (borrowed: the batch copies what it keeps).
typedef struct {
    const int32_t *tokens;     // (n) completion tokens
    const float *logprobs;     // (n) behaviour log-probs; NULL = 0 (see rl_batch_old_logp)
    const uint8_t *env;        // (n) 1 = written by the environment: no loss; NULL = none
    int n;                     // >= 0; the prompt and the completion hold at least one token
    float reward;
    int turns;                 // model turns of the episode (0 counts as 1)
} rl_sample_t;

// A prompt and its samples (borrowed).
typedef struct {
    const int32_t *prompt;
    int n_prompt;              // >= 0
    const rl_sample_t *samples;
    int n_samples;             // >= 0
    uint32_t version;          // adapter version the samples were drawn with
    double gen_seconds;        // rollout compute spent on the group (statistics only)
} rl_group_t;

// How a job's groups become sequences.
typedef struct {
    int slot;                  // the job's adapter slot
    uint32_t version;          // the adapter version the step trains: groups drawn with it are
                               // on-policy (their tokens measure loss_stats_t.mismatch)
    bool std_norm;             // advantages divided by the group's standard deviation
                               // (rl_group_advantages)
    bool share_prompt;         // a group's prompt less its last token is a sequence of its own,
                               // computed once, that its samples attend to (engine_train_seq_t
                               // prefix_of); a prompt of one token has nothing to share
    bool skip_flat;            // a group whose advantages are all 0 adds no sequence (it carries no
                               // signal and would only weigh in the job's token mean)
} rl_job_cfg_t;

// A job of a batch: its sequences and the statistics of its groups. Sums over every group added
// (skipped ones too) unless said otherwise.
typedef struct {
    rl_job_cfg_t cfg;
    int first, n_seqs;         // its sequences: seqs[first .. first + n_seqs)
    int groups, skipped;       // groups added; of them, skipped (skip_flat)
    int samples;               // samples
    double reward_sum;         // rewards, summed in order
    double reward_sq;          // their squares, summed in order (the spread of the step's rewards)
    double staleness_sum;      // cfg.version - group version
    double gen_seconds;
    double turns;              // model turns (0 counted as 1)
    double env_tokens;         // tokens written by the environment
    double gen_tokens;         // tokens the model generated (completions, without the environment's)
    double tokens;             // tokens of the trained samples, prompt and completion each
    double rows;               // rows a pass computes for the job (a shared prompt once)
} rl_batch_job_t;

// Zero-initialised = empty. The batch owns everything it points to: each sequence's tokens,
// weights and behaviour log-probs are one allocation, which seqs[i].tokens starts.
typedef struct {
    engine_train_seq_t *seqs;  // (n) as engine_train and dp_pass take them; prefix_of counts from
    int n, cap;                // seqs[0]
    rl_batch_job_t *jobs;      // (n_jobs) in the order added; their sequences follow one another
    int n_jobs, cap_jobs;
} rl_batch_t;

// Adds a job and its groups. For each group (n_samples of them) with the advantages of its
// rewards: with cfg.share_prompt and a prompt of 2 or more tokens, one sequence of the prompt's
// first n_prompt - 1 tokens; then one sequence per sample, prompt + completion, that weighs 1 on
// each completion token the model wrote (0 on the prompt and the environment's tokens), with
// the sample's behaviour log-probs and its advantage. Returns the job's index, or -1 + err (a
// sample without any token, negative sizes) with nothing added.
int rl_batch_add_job(rl_batch_t *b, const rl_job_cfg_t *cfg, const rl_group_t *groups, int n_groups, char *err);
// The behaviour log-probs of seqs[i], writable (callers that compute them after packing, as the
// benchmark does); NULL for a shared-prompt sequence, which has none.
float *rl_batch_old_logp(rl_batch_t *b, int i);
// Empties the batch (the sequences' memory is released; the arrays are kept for the next use).
void rl_batch_reset(rl_batch_t *b);
void rl_batch_free(rl_batch_t *b);

// A job of a step: what it trains with (in) and what its step gave (out).
typedef struct {
    optim_t *opt;              // in: the job's optimiser (borrowed)
    float *grad;               // in: its gradient buffer: backend memory, the adapter's n_params
    loss_stats_t loss;         // out: the job's loss statistics of the pass
    double grad_norm;          // out: the gradient norm of its AdamW step
    double seconds;            // out: the pass's time, the job's share by tokens
    bool failed;               // out: loss, gradient or parameters not finite after the step (the
    char error[ERR_LEN];       //      adapter holds them: the job cannot go on); error says which
} rl_step_job_t;

// Trains jobs j0 .. j1-1 of b in one pass with the loss settings lc, then steps each job's
// adapter (the engine pool's slot cfg.slot; the slots of a pass distinct) with its optimiser:
// jobs[i] is batch job j0 + i. With dp (rank 0 of a data-parallel group) the pass is split over
// the group (dp_pass). Every job steps, also one without sequences (its gradient is 0).
// Returns 0 (each job stepped; jobs[i].failed for one that is not finite), DP_REFUSED + err (the
// pass was refused: a slot without an adapter, bad input; nothing stepped), DP_BROKEN + err.
int rl_train_step(dp_t *dp, engine_t *e, const rl_batch_t *b, int j0, int j1, const loss_cfg_t *lc,
                  rl_step_job_t *jobs, char *err);

// The most passes a trainer computes at once (its lanes: services/trainer/jobs.h, marlaas up --lanes).
#define RL_MAX_LANES 64

#endif

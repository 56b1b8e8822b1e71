// engine.h - the transformer engine: batched multi-LoRA forward for inference (continuous
// batching over a paged KV cache), and forward/backward over packed full sequences for training
// (LoRA gradients per adapter slot, optional full-parameter gradients), with the losses.
//
// One engine serves rollout and trainer, so both compute the same numbers: the log-prob that
// rollout reports for a sampled token and the one the trainer recomputes differ only by the
// order of a few floating-point sums (~1e-6).
//
// Row order: within a call the engine groups sequences by adapter slot (stable), so that each
// slot's rows are contiguous and every LoRA product is one GEMM on a block of rows; results
// are returned in the caller's order.
//
// Backends and memory: the engine runs on the model's kernels table (model->k: the CPU backend
// or e.g. kernels_cuda()). Weights, adapters (every adapter in the pool must be made for the
// same table), the KV cache's pools (kvcache_new_on(model->k, ...)), activations and gradient
// arenas are BACKEND memory of that table; the engine touches them only through its ops. What
// the caller passes and receives through this API is HOST memory, except where a comment says
// "backend memory": tokens, weights, behaviour/reference log-probs, logits out, log-probs out,
// statistics. On the CPU backend both are the same memory.
#ifndef MARLAAS_ENGINE_H
#define MARLAAS_ENGINE_H

#include <stdint.h>

#include "common/engine/kvcache.h"
#include "common/engine/lora.h"
#include "common/engine/model.h"
#include "common/sim/sim.h"

typedef struct engine engine_t;

// The engine borrows model and pool (both must outlive it).
engine_t *engine_new(model_t *model, lora_pool_t *pool, char *err);
void engine_destroy(engine_t **e);
model_t *engine_model(engine_t *e);
lora_pool_t *engine_pool(engine_t *e);
// The simulated backend (common/sim/sim.h; the engine borrows sim, which outlives it): from now on
// engine_step and the training passes compute nothing. A step validates its batch and takes its
// KV blocks as always, lasts the modelled time (sim_wait) and leaves no logits
// (engine_step_logits NULL: the generator draws simulated tokens); engine_train and
// engine_logprobs last theirs and give log-probs SIM_LOGP and entropies SIM_ENTROPY, the loss's
// statistics on them (the behaviour log-probs reproduced: ratio 1) and no gradient. The model may
// be a shell without weights (model_shell).
void engine_set_sim(engine_t *e, sim_t *sim);
sim_t *engine_sim(const engine_t *e);
// Simulated backend: while on, engine_step counts each step's modelled time (sim_defer) instead of
// waiting for it; the next sim_wait waits for them all.
void engine_sim_defer(engine_t *e, bool on);

// --- inference ------------------------------------------------------------------------------------
enum { ENGINE_LOGITS_NONE = 0, ENGINE_LOGITS_LAST = 1, ENGINE_LOGITS_ALL = 2 };

typedef struct {
    const int32_t *tokens;   // this step's new tokens: a prefill chunk or one decode token
    int n_tokens;            // >= 1
    int kv_seq;              // KV cache sequence; tokens[0] sits at position kvcache_seq_len()
    int slot;                // adapter slot, -1 = base model
    int logits;              // ENGINE_LOGITS_*
} engine_seq_t;

// One continuous-batching step over n sequences (a mix of prefill chunks and decode tokens).
// Reserves KV space for every sequence first (all or nothing: when the cache lacks blocks,
// -1 + err and nothing changes), runs the forward, appends K/V and advances each sequence.
// logits is a HOST buffer of the caller: it receives, in the caller's order, 0 / 1 / n_tokens
// rows of vocab floats per sequence, copied from the backend with its to_host (only the rows
// asked for; they are complete when engine_step returns). A sequence must not appear twice in
// one step. Positions beyond the model's context (hf_config_context: max_position_embeddings, or a
// smaller sliding window) are refused, and so are a cache or an
// adapter made for another backend than the model's.
int engine_step(engine_t *e, kvcache_t *kc, const engine_seq_t *seqs, int n, float *logits, char *err);
// logits == NULL: the rows stay in BACKEND memory, where engine_step_logits() finds them (valid
// until the next engine call): a sampler on the device (the backend's sample op) then needs no
// copy of vocab floats per row to the host.
const float *engine_step_logits(const engine_t *e);

// --- training -------------------------------------------------------------------------------------
typedef enum { LOSS_CE = 0, LOSS_RL = 1 } loss_kind_t;

typedef struct {
    loss_kind_t kind;
    float temperature;     // log-probs are taken under softmax(logits / T); CE uses it too (1 usually)
    float clip_low;        // ratio clipped to [1 - clip_low, 1 + clip_high]
    float clip_high;
    float kl_coef;         // weight of the k3 KL estimator to ref_logp (0 = off)
    // Loss normaliser per group (index slot + 1, 0 = base rows; NULL = this call's own sums):
    // token t of a slot-s sequence weighs weight[t] / slot_weight[s + 1] instead of weight[t] over
    // the sum of this call's weights of slot s. Data-parallel ranks that each train a share of a
    // step pass the whole step's sums, so that the sum of their gradients is the step's token
    // mean. Must be > 0 for every group the call has weighted tokens of. The statistics are then
    // that share's contributions (sums of weight / slot_weight terms), which add up over ranks.
    const double *slot_weight;
    int n_slot_weight;     // entries of slot_weight (lora_pool_slots() + 1 covers every slot)
} loss_cfg_t;

// A full sequence starting at position 0. Token t (t >= 1) is predicted from tokens < t;
// arrays indexed by t, entry 0 unused.
//
// Shared prefix (GRPO: G samples of one prompt): a sequence with prefix_of = k + 1 shares its first
// prefix_len tokens with the earlier sequence seqs[k] of the same call, whose rows for them are
// computed once and serve every sequence that names it. Such a sequence adds rows only for its
// tokens prefix_len .. len-1 (positions prefix_len .. len-1), attending to seqs[k]'s first
// prefix_len rows and then to its own; gradients through the shared rows are summed over the
// sequences sharing them, so loss, statistics and gradients equal those of the same sequences
// without sharing (up to float rounding). tokens still holds the whole sequence. Rules (checked,
// -1 + err otherwise): k < own index; seqs[k] has no prefix itself and the same slot;
// 1 <= prefix_len < len and prefix_len <= seqs[k].len; tokens[0 .. prefix_len-1] equal seqs[k]'s;
// weight[t] = 0 for t <= prefix_len (token prefix_len is predicted by a row of seqs[k], which is not
// used for this sequence's loss: callers share prompt_len - 1 tokens so that the prompt's last
// token, which predicts the first completion token, is a row of each sample). prefix_of = 0 (what
// a zero-initialised struct holds) means no prefix, and then prefix_len must be 0.
typedef struct {
    const int32_t *tokens;
    int len;               // >= 1
    int slot;              // adapter slot, -1 = base
    const float *weight;   // (len) loss weight of token t (0 = no loss: prompt, observation); NULL = none
    const float *old_logp; // (len) behaviour log-probs (RL); read only where weight > 0
    const float *ref_logp; // (len) reference log-probs for KL (RL with kl_coef > 0); read only where weight > 0
    float advantage;       // sequence advantage (RL)
    bool on_policy;        // sampled with the current parameters: |logp - old_logp| measures
                           // the rollout/trainer log-prob mismatch (loss_stats_t.mismatch)
    int prefix_of;         // 0 = none; k + 1 = shares the first prefix_len tokens of seqs[k] (above)
    int prefix_len;
} engine_train_seq_t;

// Token means over the weighted tokens of one group (an adapter slot).
typedef struct {
    double loss;
    double tokens;        // sum of weights
    double clip_frac;     // fraction of tokens whose ratio was clipped
    double kl;            // k3 estimate (when ref_logp given)
    double entropy;       // of softmax(logits / T)
    double ratio_mean;
    double logp_mean;
    double mismatch;      // mean |logp - old_logp| over weighted tokens of on_policy sequences
    double mismatch_tokens;
} loss_stats_t;

// Forward + backward. Losses are token means within each slot (so jobs sharing a pass do not
// change each other's scale). Gradients ACCUMULATE into model_grads (model arena layout; NULL =
// base frozen) and lora_grads[slot] (adapter arena layout; NULL entry or array = frozen); the
// array needs an entry for every slot the batch uses (index = slot). model_grads and the
// lora_grads arenas are BACKEND memory (the model's table's alloc; the array itself is host).
// stats (host, may be NULL) receives per-group statistics at index slot + 1 (0 = base rows) for
// the first n_stats groups (lora_pool_slots() + 1 covers every slot).
// A bf16 model (model_to_bf16) trains LoRA adapters only: model_grads must be NULL (it needs fp32
// weights; -1 + err otherwise).
// Returns 0 or -1 + err (bad input); nothing is accumulated on error.
int engine_train(engine_t *e, const engine_train_seq_t *seqs, int n, const loss_cfg_t *lc, float *model_grads,
                 float *const *lora_grads, loss_stats_t *stats, int n_stats, char *err);

// Forward only: logp[s][t] = log softmax(logits_{t-1} / T)[tokens[t]] for t >= 1 (logp[s][0] = 0),
// entropy likewise when not NULL (both host arrays). Uses the same code path as engine_train. For a sequence with a
// shared prefix, logp and entropy are defined for t >= prefix_len + 1 (the tokens its own rows
// predict) and 0 for t <= prefix_len.
int engine_logprobs(engine_t *e, const engine_train_seq_t *seqs, int n, float temperature, float *const *logp,
                    float *const *entropy, char *err);

// FLOPs of a forward over n_tokens rows at the given mean attention context, with the LM head
// applied to n_logits rows: 2 per multiply-add of every GEMM (base weights; LoRA excluded) plus
// attention (4 * context * H * head_dim per token and layer). Used to report GFLOP/s.
double engine_forward_flops(const model_t *m, double n_tokens, double n_logits, double mean_ctx);

#endif

// rl.h - pieces of the RL loop shared by the services and the local tools: a runtime (model
// folder + tokenizer + engine + KV cache + generator), task sources (built-in task or user
// dataset), GRPO advantages, and greedy evaluation with a confidence interval.
//
// Layering: rl uses engine, formats and tasks; the engine knows nothing of tasks.
#ifndef MARLAAS_RL_H
#define MARLAAS_RL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/formats/chat.h"
#include "common/formats/tokenizer.h"
#include "common/tasks/dataset.h"
#include "common/tasks/tasks.h"

// --- runtime --------------------------------------------------------------------------------
// The context a runtime serves: real models claim 32k-131k positions, and a KV cache sized for
// many such contexts would not fit any machine, so the runtime bounds it (rl_runtime_cfg_t
// max_context) and sizes its cache from that bound and a memory budget:
//   max_context C = the setting, or min(the model's context, RL_DEFAULT_CONTEXT); a setting
//                   beyond the model's context (hf_config_context) is refused;
//   KV blocks (16 tokens each) = the setting kv_blocks, or
//                   min(256 x ceil(C / 16), max(ceil(C / 16) + 2, budget / bytes per block))
//                   with budget = kv_mb MiB (default RL_DEFAULT_KV_MB) and bytes per block
//                   2 (K, V) x layers x 16 x kv_heads x head_dim x 4: room for 256 full
//                   contexts when they fit the budget, never less than one full context.
// Every prompt + completion the runtime's callers generate stays within C.
#define RL_DEFAULT_CONTEXT 4096
#define RL_DEFAULT_KV_MB 1024

typedef struct {
    model_t *model;
    tokenizer_t *tok;
    chat_template_t *chat;   // the model's chat template (tokenizer_config.json), NULL when it has none
    char chat_error[ERR_LEN];   // why chat is NULL (no tokenizer_config.json, no template in it, ...)
    int max_context;         // positions of prompt + completion the runtime serves (see above)
    lora_pool_t *pool;
    engine_t *engine;
    kvcache_t *kc;
    gen_t *gen;
    int32_t eos;          // end-of-text token id: the first of eos_ids (the one appended to training text)
    int32_t eos_ids[GEN_MAX_STOP];   // every id that ends generation: config.json's eos_token_id (an
    int n_eos;                       // integer or a list), generation_config.json's (rl_runtime_open),
                                     // or the tokenizer's <|endoftext|> when neither names one
} rl_runtime_t;

typedef struct {
    int n_slots;          // adapter slots (default 8)
    int max_context;      // 0: min(model's context, RL_DEFAULT_CONTEXT); refused beyond the model's
    int kv_mb;            // KV cache budget in MiB (0: RL_DEFAULT_KV_MB), when kv_blocks is 0
    int kv_blocks;        // KV cache blocks of 16 tokens (0: from max_context and kv_mb, see above)
    int max_seqs;         // live sequences (default 512)
    int max_batch_tokens; // rows per engine step (default 512)
    const kernels_t *k;   // compute backend for rl_runtime_open (NULL = the CPU backend)
    bool bf16;            // rl_runtime_open: base matrices in bf16 (model_to_bf16; see model.h)
    sim_t *sim;           // the simulated backend (borrowed; outlives the runtime), or NULL:
                          // rl_runtime_open builds a model without weights (model_shell) on
                          // kernels_sim(), the engine models its steps (engine_set_sim), and the KV
                          // cache is bookkeeping only (kvcache_new_virtual) of kv_blocks blocks, by
                          // default what the device's memory holds (sim_kv_blocks) beside the weights
                          // and n_slots adapters of rank 16 on every target
} rl_runtime_cfg_t;

// The KV blocks (16 positions) a simulated device holds for model mc beside its weights and n_slots
// adapters of rank 16 on every target (sim_kv_blocks): the simulated rollout's cache. -1 + err
// when the model leaves no room.
int rl_sim_kv_blocks(const sim_t *sim, const hf_config_t *mc, int n_slots, char *err);

// The settings with their defaults filled in, by the rule above, for a model of config mc: what
// rl_runtime_open serves. -1 + err for a max_context the model does not have.
int rl_serving_cfg(const hf_config_t *mc, const rl_runtime_cfg_t *c, rl_runtime_cfg_t *d, char *err);

// Loads DIR (config.json, model.safetensors or its shards, tokenizer.json, and
// generation_config.json when present: its eos ids join eos_ids; tokenizer_config.json's chat
// template when there is one) and builds the runtime.
rl_runtime_t *rl_runtime_open(const char *model_dir, const rl_runtime_cfg_t *cfg, char *err);
// Builds a runtime around a model and tokenizer the caller hands over (ownership moves).
rl_runtime_t *rl_runtime_wrap(model_t **model, tokenizer_t **tok, const rl_runtime_cfg_t *cfg, char *err);
void rl_runtime_close(rl_runtime_t **rt);

// --- task sources ---------------------------------------------------------------------------
typedef struct {
    const task_t *task;   // a built-in task, or
    dataset_t *ds;        // a user dataset (owned)
    char name[128];
    // Chat (rl_source_set_chat; borrowed, they must outlive the source): prompts render through
    // the template as a user message after an optional system message, "messages" records as
    // their conversation, always with the generation prompt; chat_vars is a JSON object of extra
    // template variables ({"enable_thinking": false}) or NULL.
    const chat_template_t *chat;
    const char *system, *chat_vars;
} rl_source_t;

// Opens a built-in task by name, or (dataset_path != NULL) a JSONL dataset with a verifier
// spec ("exact", "numeric:0.01", "regex", "choice"; NULL = exact).
int rl_source_open(rl_source_t *s, const char *task_name, const char *dataset_path, const char *verifier, char *err);
void rl_source_close(rl_source_t *s);
// Example `index` of a split; returns the handle rl_source_verify needs (dataset record).
int rl_source_example(const rl_source_t *s, task_split_t split, uint64_t index, task_example_t *ex);
float rl_source_verify(const rl_source_t *s, const task_example_t *ex, int handle, const char *completion);
// Makes the source a chat source (see rl_source_t); ct NULL with chat wanted is refused with the
// reason the runtime recorded (why_none). system and chat_vars may be NULL or "".
int rl_source_set_chat(rl_source_t *s, const chat_template_t *ct, const char *why_none, const char *system,
                       const char *chat_vars, char *err);
// The text to tokenize (without special tokens) for an example (handle from rl_source_example):
// the prompt as it is, or, for a chat source, the conversation rendered by the template with
// the generation prompt. A "messages" record needs a chat source. Caller frees; NULL + err when
// the template refuses (its raise_exception, a limit) or the record cannot be rendered.
char *rl_source_prompt(const rl_source_t *s, const task_example_t *ex, int handle, char *err);
// The eval examples to score when `want` are asked: the indices (into *idx, caller frees) of at
// most `want` eval examples whose prompts are pairwise distinct; returns how many. Evals decode
// greedily, so a repeated prompt only repeats its answer and would overstate the precision. A
// dataset gives its distinct eval prompts in file order; a built-in task draws eval indices 0,
// 1, 2, ... and keeps each new prompt until `want` are found or RL_EVAL_DRAWS x want draws (at
// least 1024) have been made: a family with few prompts (add1 holds out 13, wrap 99) gives what
// it has.
#define RL_EVAL_DRAWS 32
int rl_source_eval_indices(const rl_source_t *s, int want, uint64_t **idx);

// --- GRPO -----------------------------------------------------------------------------------
// Group-relative advantages: reward minus the group mean, divided by the group's standard
// deviation (+1e-4) when std_norm. A group with equal rewards gets zero advantages.
void rl_group_advantages(const float *rewards, int G, bool std_norm, float *adv);

// --- evaluation -----------------------------------------------------------------------------
typedef struct {
    int n, correct;       // distinct prompts evaluated (rl_source_eval_indices), correct ones
    int asked;            // the n the caller asked for (more than n when the held-out set is smaller)
    double acc, lo, hi;   // accuracy and its 95% Wilson interval over n
    double seconds;
} rl_eval_t;

// Model turns of a tool episode in a greedy eval unless the caller says otherwise.
#define RL_EVAL_MAX_TURNS 4

// Wilson score interval (95%) for k successes out of n.
void rl_wilson(int k, int n, double *lo, double *hi);
// Greedy accuracy of the model with adapter `slot` (-1 = base) on `asked` eval examples of src
// (a chat source's prompts rendered by rl_source_prompt, completions ending at an end-of-sequence
// token only),
// each distinct prompt once (rl_source_eval_indices: fewer when the held-out set is smaller; a
// completion counts as correct when its reward is >= 0.5), max_new tokens per model turn.
// A task with an environment (env.h) runs episodes of up to max_turns turns: a turn ends at a
// newline, the end-of-text token, ENV_CALL_END or max_new tokens; after a call the
// environment's observation is appended and the model continues from prompt + transcript,
// while the context has room; the whole transcript is verified. max_turns == 0 runs every task
// single-turn without tools (ENV_CALL_END is no stop: the model writes everything itself).
// Tasks without an environment always run single-turn.
int rl_evaluate(rl_runtime_t *rt, int slot, const rl_source_t *src, int asked, int max_new, int max_turns,
                rl_eval_t *out, char *err);

#endif

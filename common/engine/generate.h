// generate.h - continuous-batching text generation over the engine.
//
// Requests (a prompt, an adapter slot, G samples, sampling settings) are admitted while the KV
// cache can hold their worst case, so a running request never hits a full cache. Every
// gen_step() is ONE engine step mixing the decode tokens of all running samples with prefill
// chunks of newly admitted prompts, across any number of adapters. A prompt is prefilled once;
// its G samples are forks that share the prompt's KV blocks.
//
// Each sample stops at a stop token (EOS; kept as the last token), a stop string (the token
// that completes it is kept; the text is cut before it), or max_new_tokens. Every token comes
// with its log-prob under softmax(logits / T) (see sampler.h). Tokens are drawn by the backend's
// sample op from the logits where the engine left them (on a GPU: no copy of the logits to the
// host; one batched call per step), with each sample's own RNG on the host: the same tokens as
// sampler_sample on the CPU.
#ifndef MARLAAS_GENERATE_H
#define MARLAAS_GENERATE_H

#include <stdint.h>

#include "common/engine/engine.h"
#include "common/engine/kvcache.h"
#include "common/engine/sampler.h"
#include "common/formats/tokenizer.h"

#define GEN_MAX_STOP 8

typedef struct {
    const int32_t *prompt;
    int prompt_len;
    int slot;                   // adapter slot or -1
    int n_samples;              // G >= 1
    int max_new_tokens;         // >= 1
    sampler_params_t sp;
    uint64_t seed;              // sample g draws from its own stream derived from (seed, g)
    const int32_t *stop_ids;    // up to GEN_MAX_STOP token ids, each ending the sample: every end-of-sequence
                                // id of the model (hf_config_eos, rl_runtime_t.eos_ids), not only the first
    int n_stop_ids;
    const char *const *stop_strings;   // up to GEN_MAX_STOP strings (need a tokenizer)
    int n_stop_strings;
    uint64_t user;              // caller's tag, returned with the result
} gen_request_t;

typedef enum { GEN_FINISH_EOS = 1, GEN_FINISH_STOP = 2, GEN_FINISH_LENGTH = 3 } gen_finish_t;

typedef struct {
    int32_t *tokens;    // (n) generated tokens
    float *logprobs;    // (n)
    int n;
    gen_finish_t finish;
    char *text;         // decoded text without the stop token or stop string that ended it; NULL
                        // without a tokenizer
} gen_sample_t;

typedef struct {
    int id;
    uint64_t user;
    int slot;
    int n_samples;
    gen_sample_t *samples;  // (n_samples)
    int prompt_len;
} gen_result_t;

typedef struct gen gen_t;

// The generator borrows engine, cache and tokenizer (tokenizer may be NULL: no stop strings,
// no text). max_batch_tokens bounds the rows of one step (decode rows + prefill chunk rows).
gen_t *gen_new(engine_t *e, kvcache_t *kc, const tokenizer_t *tok, int max_batch_tokens, char *err);
void gen_destroy(gen_t **g);

// Queues a request (everything is copied). Returns its id (>= 0) or -1 + err for a request that
// is invalid or could never fit (prompt + max_new_tokens beyond the model or the cache).
int gen_submit(gen_t *g, const gen_request_t *r, char *err);
// Runs one engine step. Returns the number of rows computed (0 when there is nothing to do)
// or -1 + err (the engine refused the batch; requests stay queued).
int gen_step(gen_t *g, char *err);
// A finished request, or NULL. The caller owns it: gen_result_free().
gen_result_t *gen_take(gen_t *g);
void gen_result_free(gen_result_t **r);
// Requests submitted and not yet taken.
int gen_pending(const gen_t *g);
// Requests admitted and computing.
int gen_running(const gen_t *g);
// Runs steps until every queued request has finished (results stay for gen_take).
int gen_run(gen_t *g, char *err);
// Counters since creation: tokens generated, prompt tokens prefilled, steps, seconds in steps.
typedef struct {
    uint64_t gen_tokens, prefill_tokens, steps;
    double busy_s;
} gen_stats_t;
gen_stats_t gen_stats(const gen_t *g);

#endif

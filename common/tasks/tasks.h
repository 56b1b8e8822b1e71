// tasks.h - built-in verifiable task families: seeded prompt generators and reward verifiers.
//
// A task family turns an index into one example (prompt text + canonical answer)
// deterministically. Train and eval examples come from disjoint index spaces (TASK_TRAIN uses
// indices as given, TASK_EVAL maps them into a separate seed range), so an eval prompt is never
// a train prompt's seed. On top of that, prompts themselves are split by a hash of their text
// (task_prompt_split): task_example draws again until the prompt falls in the requested split,
// so an eval prompt never appears in training even for families with few distinct prompts
// (add1 has only 100). A verifier scores a completion in [0, 1]; every built-in verifier gives
// exactly 1 or 0 (no partial credit).
//
// Text conventions shared by every family (the models are small and character-level):
// a prompt is one line ending with the text the answer follows, e.g. "add 12+34=";
// the completion is the answer followed by the end-of-text token; verifiers first cut the
// completion at the first newline, then compare after trimming surrounding spaces.
#ifndef MARLAAS_TASKS_H
#define MARLAAS_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/util.h"

typedef enum { TASK_TRAIN = 0, TASK_EVAL = 1 } task_split_t;

typedef struct {
    char *prompt;    // owned
    char *answer;    // owned: the canonical answer (what a perfect model writes)
} task_example_t;

typedef struct task {
    const char *name;          // unique, e.g. "add2"
    const char *family;        // "arithmetic", "string", "list", "logic", "format", "tools"
    const char *description;   // one line for `marlaas tasks`
    // Fills ex for a 64-bit seed (deterministic).
    void (*generate)(uint64_t seed, task_example_t *ex);
    // Reward in [0, 1] of completion for the example; must accept any bytes (NUL-terminated).
    // For a task with tools the completion is the whole episode transcript (env.h).
    float (*verify)(const task_example_t *ex, const char *completion);
    // Multi-turn tasks only (NULL for single-turn ones). The task's environment: see env_step
    // in env.h, which calls it.
    int (*env)(const task_example_t *ex, const char *transcript, char *obs, size_t cap);
    // The canonical episode a perfect tool user writes after the prompt (its calls, the
    // environment's observations and the final answer), NUL-terminated into text; is_obs[i] = 1
    // for the characters the environment writes, 0 for the model's. Returns the length, or -1
    // when it does not fit cap (cap - 1 characters at most).
    int (*trace)(const task_example_t *ex, char *text, size_t cap, uint8_t *is_obs);
} task_t;

int task_count(void);
const task_t *task_at(int i);
// NULL if unknown. Finds the simulated tasks too (sim-easy, sim-medium, sim-hard: family "sim",
// common/sim/sim.h), which task_count and task_at leave out.
const task_t *task_find(const char *name);
// Example `index` of a split (the split decides the seed range).
void task_example(const task_t *t, task_split_t split, uint64_t index, task_example_t *ex);
void task_example_free(task_example_t *ex);

// The generator seed task_example starts from: the index with bit 63 cleared for TASK_TRAIN and
// set for TASK_EVAL (so the two seed ranges never meet; train indices >= 2^63 wrap around).
// Redraws for the prompt split stay within the same half.
uint64_t task_seed(task_split_t split, uint64_t index);
// The split a prompt belongs to: TASK_EVAL for about one prompt in ten (a 64-bit hash of the
// text, mod 10, is 0), TASK_TRAIN otherwise. User datasets split their records the same way.
task_split_t task_prompt_split(const char *prompt);

// --- helpers every verifier shares (built-in tasks and user datasets) ------------------------

// The part of a completion that verifiers compare: up to the first '\n', without leading or
// trailing spaces, tabs or '\r'. Returns its start and writes its length to *len; a NULL
// completion gives "" with length 0.
const char *task_answer_span(const char *completion, size_t *len);
// Strict decimal integer: optional '-', then "0" or a digit 1-9 followed by at most 17 more
// digits; nothing else (no '+', no leading zeros, no "-0", no spaces). Returns 0 and writes
// *out, or -1. Numbers beyond 18 digits are refused rather than overflowing.
int task_parse_int(const char *s, size_t len, int64_t *out);

#endif

// tasks_internal.h - what the built-in task family files share: their tables (concatenated
// into the registry by tasks.c), random helpers, example construction and the two verifiers.
// Not a public API; other modules use tasks.h.
#ifndef MARLAAS_TASKS_INTERNAL_H
#define MARLAAS_TASKS_INTERNAL_H

#include <stdint.h>

#include "common/util/rng.h"
#include "common/tasks/tasks.h"

// Each family file exports one table; the registry order is the order of these groups.
extern const task_t task_arith_table[];
extern const int task_arith_count;
extern const task_t task_text_table[];
extern const int task_text_count;
extern const task_t task_list_table[];
extern const int task_list_count;
extern const task_t task_logic_table[];
extern const int task_logic_count;
extern const task_t task_format_table[];
extern const int task_format_count;
extern const task_t task_tools_table[];
extern const int task_tools_count;
// The simulated tasks (tasks_sim.c): found by name, not listed.
const task_t *task_sim_find(const char *name);

// Longest prompt + answer any built-in example may have (the models see 128 tokens, and the
// trainer packs prompt, answer and end-of-text into that).
#define TASK_MAX_TEXT 48

// Uniform integer in [lo, hi] (inclusive; hi >= lo). The modulo bias is below 2^-40 for the
// small ranges used here.
int64_t task_rand_range(rng_t *r, int64_t lo, int64_t hi);
// A number with exactly `digits` digits (1..18); digits == 1 includes 0.
int64_t task_rand_digits(rng_t *r, int digits);
// n random letters from alphabet (NUL-terminated string) into out (n + 1 bytes).
void task_rand_word(rng_t *r, const char *alphabet, int n, char *out);
// k distinct random lowercase letters (1 <= k <= 26) into out (k + 1 bytes).
void task_rand_alphabet(rng_t *r, int k, char *out);

// Sets ex->answer to a copy of answer and ex->prompt to the formatted text. Aborts if the
// prompt would not fit (a generator bug, caught by the tests long before).
void task_set(task_example_t *ex, const char *answer, const char *prompt_fmt, ...)
    __attribute__((format(printf, 3, 4)));
// Writes v[0..n) as "a,b,c" into out (room for n * 21 bytes); returns out.
char *task_join_ints(const int64_t *v, int n, char *out);

// Reward 1 when the answer span equals ex->answer byte for byte, else 0.
float task_verify_exact(const task_example_t *ex, const char *completion);
// Reward 1 when the answer span is a strict integer (task_parse_int) equal to ex->answer's.
float task_verify_int(const task_example_t *ex, const char *completion);

// The environment of the built-in tool tasks (env.c): the calculator "<c:EXPR>" and the
// lookup table "<k:KEY>". Called through env_step (env.h), which documents the contract.
int task_env_tools(const task_example_t *ex, const char *transcript, char *obs, size_t cap);

#endif

// env.h - tool environments of multi-turn tasks: the model calls a tool in its text, the
// environment answers, the model goes on; only the episode's end is rewarded.
//
// Conventions (character-level models): a tool call is "<c:EXPR>" (integer calculator) or
// "<k:KEY>" (key-value lookup). A model turn ends when the model writes ENV_CALL_END, a newline,
// the end-of-text token, or runs out of tokens. The environment's answer (the observation) is
// "=VALUE " (or "=ERR " for a call it cannot execute), appended to the transcript; the model
// then continues. The final answer of an episode is what follows the last observation (the
// whole text when there is none), cut at the first newline and trimmed.
#ifndef MARLAAS_ENV_H
#define MARLAAS_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "common/tasks/tasks.h"

#define ENV_CALL_END ">"     // the stop string that ends a model turn at a tool call
#define ENV_OBS_MAX 48       // longest observation text, NUL included

// Steps the built-in environment of task t on an episode transcript (everything after the
// prompt: the model's turns and the observations so far, concatenated). Returns 1 and writes
// the observation (NUL-terminated) when the transcript ends with a complete tool call; 0 when
// it does not (the episode is over: score it with t->verify on the whole transcript; obs is
// set to ""); -1 when t has no tools. A transcript that ends with ENV_CALL_END always ends at a
// call: the call is the text from the last '<' of that turn, and one that is not a valid
// "<c:EXPR>" or "<k:KEY>" with an argument of at most 40 characters (including a turn with no
// '<' at all, an unknown tool letter, a bad expression or key) is answered "=ERR ". Writes at
// most cap bytes (cap = ENV_OBS_MAX always suffices; obs may be NULL with cap 0). Safe on
// arbitrary bytes; ex may be NULL for the built-in tools.
int env_step(const task_t *t, const task_example_t *ex, const char *transcript, char *obs, size_t cap);
// The final-answer part of a transcript: what follows the last observation (a ">=VALUE "
// after a call) in its first line, or the transcript itself when that line holds none; a
// pointer into transcript ("" for NULL). Callers cut and trim it with task_answer_span. Only
// the first line counts because a newline ends a model turn and with it the episode.
const char *env_final_answer(const char *transcript);
// Integer calculator of the 'c' tool: + - * / % (C semantics on int64; error on division by
// zero and overflow, INT64_MIN / -1 and INT64_MIN % -1 included), parentheses, unary minus
// (binding tighter than * / %), spaces. A literal must fit int64_t by itself. At most 256
// bytes and 32 levels of nesting. 0 + *out (out may be NULL), or -1.
int env_calc(const char *expr, size_t len, int64_t *out);
// The lookup tool's fixed table: keys of 1-8 characters [a-z0-9] map to values 100..999
// (FNV-1a 64 of the key, the splitmix64 finaliser, mod 900, plus 100; models are trained on
// it, so it never changes). 0 + *out (out may be NULL), or -1 for a malformed key.
int env_lookup(const char *key, size_t len, int64_t *out);

#endif

// jobspec.h - a job's specification: what to train, how, and when to stop. Submitted as JSON
// (marlaas submit --spec FILE or flags), stored in Redis as JSON text (readable with
// redis-cli): jobspec_to_json's canonical form, every field with its value. Numbers are kept as
// doubles, so the stored text shows them as the user wrote them (0.003, not
// 0.0030000000260770321). Every field is optional except the task (which `marlaas submit
// --dataset FILE` names after the file when it is not given); the parser names the field and
// the rule for anything invalid.
#ifndef MARLAAS_JOBSPEC_H
#define MARLAAS_JOBSPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/util/util.h"

#define JOBSPEC_MAX_SYSTEM 4096       // bytes of spec.system, with its NUL
#define JOBSPEC_MAX_CHAT_VARS 2048    // bytes of spec.chat_vars as compact JSON, with its NUL
#define JOBSPEC_MAX_CHAT_VAR_STR 1024 // bytes of one string value in spec.chat_vars

typedef enum { REWARD_FAIL_ZERO = 0, REWARD_FAIL_JOB = 1 } reward_failure_t;

typedef struct {
    char name[64];               // display name
    char task[64];               // built-in task, or the dataset's name when dataset is true
    bool dataset;                // the job brings a JSONL dataset (uploaded with the spec)
    char verifier[32];           // dataset verifier: exact | numeric[:tol] | regex | choice
    int max_steps;               // optimiser steps, 1..100000 (default 200)
    double target_accuracy;       // stop when greedy eval accuracy reaches it (0 = off), 0..1
    int group;                   // samples per prompt G, 2..256 (default 8)
    int prompts;                 // prompts per optimiser step B, 1..1024 (default 32)
    int max_new;                 // tokens per completion, 1..1024 (default 24)
    double temperature;           // (0, 10] (default 1)
    double top_p;                 // (0, 1] (default 1)
    int top_k;                   // >= 0 (default 0 = off)
    double lr;                    // (0, 1] (default 1e-3: bench/defaults.sh, docs/benchmark/defaults.md)
    int rank;                    // LoRA rank 1..256 (default 8)
    double alpha;                 // LoRA alpha > 0 (default 16)
    unsigned targets;            // LoRA targets bit mask (default all seven)
    double kl;                    // k3 KL coefficient >= 0 (default 0)
    double clip_low, clip_high;   // ratio clip (default 0.2 / 0.28)
    bool std_norm;               // divide advantages by the group std (default true)
    int staleness;               // eta: a group sampled with version g may train version c when c - g <= eta (default 1)
    int eval_every;              // greedy eval every K steps, 0 = only at the end (default 25)
    int eval_n;                  // eval examples (default 200)
    double weight;                // fair-share weight, (0, 100] (default 1)
    uint64_t seed;               // default 1
    char reward_endpoint[256];   // external reward service (tcp://host:port), empty = built-in verifier
    int reward_timeout_ms;       // per request (default 2000)
    int reward_retries;          // extra tries after a timeout (default 1)
    reward_failure_t reward_on_failure;   // "zero" (default: reward 0, counted) or "fail" (fail the job)
    // multi-turn episodes ("env": {...}): the model may call a tool, the environment answers,
    // the model goes on; only the episode's end is rewarded
    int max_turns;               // model turns per episode, 1..64 (default 1 = single turn)
    int max_context;             // tokens an episode may hold, prompt and observations included (0 = the model's)
    char env_endpoint[256];      // external environment service (tcp://host:port), empty = the task's own tools
    int env_timeout_ms;          // per environment step (default 5000)
    // chat models: every prompt goes through the base model's chat template (rl.h, rl_source_prompt)
    bool chat;                   // prompts render as user messages, with the generation prompt; a
                                 // completion ends at an end-of-sequence / end-of-turn token only
    char system[JOBSPEC_MAX_SYSTEM];   // system message before each prompt ("" = none); needs chat
    char chat_vars[JOBSPEC_MAX_CHAT_VARS];   // extra template variables as compact JSON ("" = none),
                                 // e.g. {"enable_thinking":false}; needs chat
} jobspec_t;

void jobspec_defaults(jobspec_t *s);
// Parses and validates a JSON object (unknown keys are errors: a typo must not be ignored).
// Built-in tasks are checked against the task registry. Returns 0 or -1 + err.
int jobspec_parse(jobspec_t *s, const char *json, char *err);
// JSON text of a spec (caller frees); jobspec_parse(jobspec_to_json(s)) gives s back.
char *jobspec_to_json(const jobspec_t *s);

#endif

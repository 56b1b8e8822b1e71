// dataset.h - user datasets: JSONL files of prompt / answer records with a verifier spec, used
// like a built-in task (examples by split and index, rewards in [0, 1]).
//
// Format: one JSON object per line, {"prompt": "...", "answer": "..."} or, for chat models,
// {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...], "answer": "..."}
// (OpenAI style). A conversation holds 1..DATASET_MAX_MESSAGES messages of exactly "role" and
// "content" (a string; a user's not empty), a system message only first, and ends with a user
// message: the model writes the reply. Prompts and contents must be well-formed UTF-8. A record
// may also carry metadata keys, ignored on purpose: id, uid, idx, index, source, meta, metadata,
// category, subject, topic, type, level, difficulty, tags, split, dataset, url, license,
// unique_id; any other key is refused (it might be meant to change the computation). Messages
// are rendered by the model's chat template, which is the job's business (the rl module): a
// dataset with "messages" needs a job with "chat": true. Blank lines (spaces, tabs, '\r' only) are skipped; CRLF line endings and a missing
// final newline are fine. Limits: a line is at most DATASET_MAX_LINE bytes (without its line
// ending), a file holds at most DATASET_MAX_RECORDS records.
//
// Verifiers (all but math cut the completion at its first '\n' and trim spaces, as
// task_answer_span):
//   exact        the completion equals the answer;
//   numeric[:t]  both parse as decimal numbers (-?digits[.digits][e[+-]digits], no hex, inf or
//                nan) and differ by at most t (absolute, inclusive up to a few ulps of
//                rounding; default 0);
//   regex        the answer is a POSIX extended regex that must match the whole completion;
//                every regex is compiled at load time;
//   choice       the answer is a string or a non-empty array of strings; any of them counts;
//   math[:t]     worked solutions: the final answer of the whole completion and of the answer
//                field (math_answer.h: the last \boxed{...}, else after the last "####", else
//                the last number; fractions and thousands separators understood) differ by at
//                most t (default 0, inclusive as above). The answer may span lines (GSM8K's
//                solutions ending "#### 72" work as they are) and must hold a number.
// Rewards are 1 or 0. Answers must have more than spaces and, except for regexes and math,
// contain no '\n' (a cut completion could never match); plain answers are trimmed at load time, regexes
// are kept verbatim. The canonical answer of an example (what dataset_example returns) is the
// answer, or the first choice.
//
// Loading is all or nothing: any invalid record refuses the whole file with
// "NAME:LINE: what is wrong" (LINE 1-based; NAME is the path for dataset_load).
//
// The prompt of a "messages" record, for splits, duplicates and what dataset_example returns, is
// the content of its message when it is a lone user message (so it is the same prompt as a
// "prompt" record with that text, which a chat job renders as that user message), otherwise
// the conversation as compact JSON ([{"role":...,"content":...},...], keys in that order).
//
// Splits: a record goes to eval when task_prompt_split(prompt) says so (about one prompt in
// ten, by a hash of its text, so duplicate prompts stay on one side), else to train. A dataset
// with fewer than 10 records, or whose hash puts every record on one side, uses all records
// for both splits. Example `index` of a split is record list[index mod size]: the train list is
// shuffled once with a fixed seed (so consecutive indices do not walk the file in order), the
// eval list keeps file order and holds each distinct prompt once (its first record): evals
// decode greedily, so a repeated prompt would only repeat an answer and inflate n.
#ifndef MARLAAS_DATASET_H
#define MARLAAS_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "common/tasks/tasks.h"

#define DATASET_MAX_LINE (64 * 1024)
#define DATASET_MAX_RECORDS 1000000
#define DATASET_MAX_MESSAGES 256

typedef enum { VERIFY_EXACT = 0, VERIFY_NUMERIC, VERIFY_REGEX, VERIFY_CHOICE, VERIFY_MATH } verify_kind_t;

typedef struct {
    verify_kind_t kind;
    double tolerance;   // VERIFY_NUMERIC, VERIFY_MATH: largest accepted |completion - answer|, >= 0
} verify_spec_t;

// Parses "exact", "numeric", "numeric:0.01", "math", "math:0.01", "regex" or "choice". Returns
// 0, or -1 with err.
int verify_spec_parse(verify_spec_t *v, const char *text, char *err);
// "exact", "numeric", "regex", "choice", "math".
const char *verify_kind_name(verify_kind_t kind);

typedef struct dataset dataset_t;

// Parses len bytes of JSONL (need not be NUL-terminated; NUL bytes are refused as bad JSON).
// name prefixes error messages. v NULL means exact. Returns NULL with err on any problem.
dataset_t *dataset_parse(const char *name, const char *buf, size_t len, const verify_spec_t *v, char *err);
dataset_t *dataset_load(const char *path, const verify_spec_t *v, char *err);
void dataset_destroy(dataset_t **d);

const char *dataset_name(const dataset_t *d);
const verify_spec_t *dataset_spec(const dataset_t *d);
int dataset_size(const dataset_t *d);                              // all records
int dataset_split_size(const dataset_t *d, task_split_t split);   // records in the split (eval: distinct prompts)
// Fills ex with copies of example `index` of split (free with task_example_free) and returns
// its record number, the handle dataset_verify takes.
int dataset_example(const dataset_t *d, task_split_t split, uint64_t index, task_example_t *ex);
// The conversation of a "messages" record (compact JSON array), or NULL for a "prompt" record
// or a record out of range.
const char *dataset_messages(const dataset_t *d, int record);
// The prompt of a record (for a "messages" record its canonical text, above), or NULL when
// out of range. Owned by the dataset.
const char *dataset_record_prompt(const dataset_t *d, int record);
// The line of the file a record came from (1-based; 0 when out of range).
long dataset_record_line(const dataset_t *d, int record);
// The line of the first record with "messages" / whose conversation starts with a system
// message; 0 when there is none.
long dataset_messages_line(const dataset_t *d);
long dataset_system_line(const dataset_t *d);
// Reward in [0, 1] of a completion (any bytes) for record; 0 for a record out of range.
float dataset_verify(const dataset_t *d, int record, const char *completion);

#endif

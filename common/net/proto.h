// proto.h - the wire protocol: every message between MARLaaS processes, encoded as one
// MessagePack map per ZeroMQ frame.
//
// Every message is a map with "t" (type, string) and "v" (protocol version, PROTO_VERSION).
// Decoders are safe on arbitrary bytes: a frame larger than its cap, bytes that are not one
// complete MessagePack map, an unknown "t" or "v", a missing field, a field of the wrong type,
// a string / array longer than its cap or a number out of range is rejected with a message
// (-1 + err) and nothing allocated survives. Unknown extra keys are ignored (forward
// compatibility within a version).
//
// Ownership: decoded messages own their strings and arrays (allocated with malloc); free them
// with the matching *_free(), which accepts partially filled structs and zeroes them.
// Encoders append to a proto_buf_t (free with proto_buf_free).
#ifndef MARLAAS_PROTO_H
#define MARLAAS_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util/util.h"

#define PROTO_VERSION 1

// Caps (a message breaking one is rejected).
#define PROTO_MAX_FRAME (64u << 20)      // bytes of one frame (adapter blobs are the largest)
#define PROTO_MAX_STR 4096               // bytes of a name, token, error message or string argument
#define PROTO_MAX_TEXT (128u << 10)      // bytes of a prompt or completion text (PROTO_MAX_TOKENS
                                         // tokens of up to 16 bytes each)
#define PROTO_MAX_ID 64                  // bytes of an id (job, tenant, service instance) with
                                         // its NUL: an id fits char[PROTO_MAX_ID]
#define PROTO_TAG_LEN 32                 // bytes of a task's tag (HMAC-SHA-256)
#define PROTO_TAG_PURPOSE "marlaas task tag"   // bus_link_key's purpose for the tag key
#define PROTO_MAX_ITEMS 1024             // prompts in one rollout task
#define PROTO_MAX_SAMPLES 256            // samples per prompt (group size)
#define PROTO_MAX_TOKENS 8192            // tokens in one prompt or completion
#define PROTO_MAX_ARGS 64                // entries in an API request's argument map
#define PROTO_MAX_TURNS 64               // model turns in one episode

typedef struct {
    uint8_t *data;
    size_t len, cap;
} proto_buf_t;

void proto_buf_free(proto_buf_t *b);

// Returns the "t" of a frame (copied into type, NUL-terminated, at most 31 bytes) after
// checking the frame is a map with a valid "v". -1 + err otherwise.
int proto_peek_type(const void *frame, size_t len, char type[32], char *err);

// --- work: scheduler -> rollout ("task") -----------------------------------------------------
typedef enum { PROTO_KIND_TRAIN = 0, PROTO_KIND_EVAL = 1 } proto_kind_t;

typedef struct {
    uint64_t index;        // example index within the split (the verifier rebuilds the example)
    char *prompt;          // prompt text (a chat job's: rendered by the chat template)
} proto_item_t;

// Where a completion ends besides the model's end-of-sequence tokens and the token limit.
typedef enum {
    PROTO_END_LINE = 0,    // also at its first newline: the one-line answers of plain prompts
                           // (and, multi-turn, at a tool call); the default of frames without "end"
    PROTO_END_EOS = 1,     // only at an end-of-sequence / end-of-turn token: chat jobs
} proto_end_t;

typedef struct {
    uint64_t task_id;      // unique per issue (a re-issue gets a new id, same items)
    char *job;
    uint32_t adapter_version;   // version of the job's adapter to sample with
    proto_kind_t kind;          // train: G samples at temperature; eval: greedy, 1 sample
    uint32_t group;             // samples per prompt (G)
    uint32_t max_new;           // tokens per completion
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    uint32_t n_items;
    proto_item_t *items;
    // Multi-turn episodes (optional on the wire; absent = 1 and 0): model turns per episode (a
    // turn also ends at a tool call when > 1) and the most tokens an episode may hold, prompt,
    // turns and observations together (0 = the model's context).
    uint32_t max_turns;
    uint32_t max_ctx;
    proto_end_t end;            // optional on the wire ("end"; absent = PROTO_END_LINE)
    // The scheduler's proof that it issued the task (proto_task_tag; a secured cluster only):
    // the rollout copies it into the task's batches and the trainer checks it. nil on the wire
    // when has_tag is false.
    bool has_tag;
    uint8_t tag[PROTO_TAG_LEN];
} proto_task_t;

// The tag of a task: HMAC-SHA-256 (libsodium crypto_auth_hmacsha256) under a key the scheduler
// shares with the trainer (bus_link_key) of the task id, job, adapter version and kind, so that a
// holder of another service's key cannot make up a task or a version for a batch, nor move a
// task's results to another job. Task ids are random, so a tag is never issued twice.
void proto_task_tag(const uint8_t key[32], uint64_t task_id, const char *job, uint32_t version, proto_kind_t kind,
                    uint8_t out[PROTO_TAG_LEN]);

int proto_task_encode(const proto_task_t *m, proto_buf_t *out);
int proto_task_decode(const void *frame, size_t len, proto_task_t *m, char *err);
void proto_task_free(proto_task_t *m);

// --- rollout -> verifier ("done"); verifier -> trainer ("scored") -----------------------------
typedef enum { PROTO_FIN_EOS = 1, PROTO_FIN_STOP = 2, PROTO_FIN_LENGTH = 3 } proto_finish_t;

// A sample is one episode. Single-turn: the completion. Multi-turn: every model turn and every
// observation of the environment so far, in order, as tokens (env marks the observation
// tokens, which carry log-prob 0 and no loss) and as text (the transcript).
typedef struct {
    uint32_t n;            // tokens
    int32_t *tokens;       // (n)
    float *logprobs;       // (n) behaviour log-probs under softmax(logits / temperature)
    char *text;            // decoded completion (stop string removed); multi-turn: the transcript
    uint8_t finish;        // proto_finish_t
    float reward;          // set by the verifier ("scored"); 0 in "done"
    uint8_t failed;        // the reward could not be computed (external service down): reward 0
    // multi-turn (optional on the wire; absent = single-turn values)
    uint8_t *env;          // (n) 1 = token written by the environment; NULL = none
    uint32_t turns;        // model turns so far (0 is read as 1)
    uint8_t pending;       // "done": the turn ended at a tool call; "cont": the episode goes on,
                           // obs is appended, then the model's next turn
    char *obs;             // the observation to append ("cont"; required there), already in text
    uint8_t rewarded;      // an external environment ended the episode: reward is final
} proto_sample_t;

typedef struct {
    uint64_t index;
    uint32_t n_prompt;
    int32_t *prompt;       // (n_prompt) prompt tokens as the rollout encoded them
    uint32_t n_samples;
    proto_sample_t *samples;
} proto_group_t;

typedef struct {
    uint64_t task_id;
    char *job;
    uint32_t adapter_version;
    proto_kind_t kind;
    float temperature;     // the sampling temperature (the trainer's log-probs use the same)
    char *worker;          // rollout instance id
    double gen_seconds;    // compute time the rollout spent on this task (cost accounting)
    uint32_t n_groups;
    proto_group_t *groups;
    // the task's sampling settings, so an episode's next turn samples like its first (optional
    // on the wire; a "cont" batch needs them)
    uint32_t max_new, top_k, max_turns, max_ctx;
    float top_p;
    uint64_t seed;
    bool has_tag;                // the task's tag (proto_task_t), carried unchanged
    uint8_t tag[PROTO_TAG_LEN];
} proto_batch_t;

// type is "done" (rollout -> verifier), "scored" (verifier -> trainer; rewards set) or "cont"
// (verifier -> scheduler -> rollout: episodes of which some await their next turn).
int proto_batch_encode(const char *type, const proto_batch_t *m, proto_buf_t *out);
int proto_batch_decode(const char *type, const void *frame, size_t len, proto_batch_t *m, char *err);
void proto_batch_free(proto_batch_t *m);
// True when the batch carries the tag of its task id, job, version and kind.
bool proto_batch_tag_ok(const uint8_t key[32], const proto_batch_t *b);
// A batch on the heap (what the rollout's worker and the verifier's scorer hand out): frees its
// contents and itself and sets *pb to NULL.
void proto_batch_destroy(proto_batch_t **pb);

// --- reports -> scheduler ("report") -----------------------------------------------------------
typedef enum {
    PROTO_REP_EPISODES = 1,    // verifier: a task's results (rewards / eval correctness)
    PROTO_REP_STEP = 2,        // trainer: a step was applied, new adapter version published
    PROTO_REP_JOB_FAILED = 3,  // trainer: the job cannot continue (NaN, bad data, ...)
    PROTO_REP_TASK_FAILED = 4, // rollout/verifier: a task could not be processed (will be re-issued)
} proto_report_kind_t;

typedef struct {
    proto_report_kind_t kind;
    char *job;
    char *source;              // reporting instance id
    uint64_t task_id;          // EPISODES, TASK_FAILED
    proto_kind_t task_kind;    // EPISODES
    uint32_t n;                // EPISODES: samples scored
    double reward_sum;         // EPISODES
    uint32_t correct;          // EPISODES: samples with reward >= 0.5
    uint32_t errors;           // EPISODES: samples whose reward failed
    uint32_t step;             // STEP: optimiser steps applied so far
    uint32_t adapter_version;  // STEP: the version now published; EPISODES: version sampled
    char *error;               // JOB_FAILED / TASK_FAILED: message
} proto_report_t;

int proto_report_encode(const proto_report_t *m, proto_buf_t *out);
int proto_report_decode(const void *frame, size_t len, proto_report_t *m, char *err);
void proto_report_free(proto_report_t *m);

// --- trainer events (PUB, topic = the type) -------------------------------------------------------
// "adapter": a new adapter version of a job is in Redis.
typedef struct {
    char *job;
    uint32_t version;
    uint32_t step;
} proto_adapter_event_t;

int proto_adapter_event_encode(const proto_adapter_event_t *m, proto_buf_t *out);
int proto_adapter_event_decode(const void *frame, size_t len, proto_adapter_event_t *m, char *err);
void proto_adapter_event_free(proto_adapter_event_t *m);

// --- external reward service ("reward_req" / "reward_rep") ----------------------------------------
typedef struct {
    uint64_t id;
    char *job;
    char *prompt;
    uint32_t n;
    char **completions;    // (n)
    char *meta;            // JSON text chosen by the job spec (may be NULL)
} proto_reward_req_t;

typedef struct {
    uint64_t id;
    uint32_t n;
    double *rewards;       // (n), or NULL with error set
    char *error;
} proto_reward_rep_t;

int proto_reward_req_encode(const proto_reward_req_t *m, proto_buf_t *out);
int proto_reward_req_decode(const void *frame, size_t len, proto_reward_req_t *m, char *err);
void proto_reward_req_free(proto_reward_req_t *m);
int proto_reward_rep_encode(const proto_reward_rep_t *m, proto_buf_t *out);
int proto_reward_rep_decode(const void *frame, size_t len, proto_reward_rep_t *m, char *err);
void proto_reward_rep_free(proto_reward_rep_t *m);

// --- external environment service ("env_req" / "env_rep") --------------------------------------
// One request per episode step: the episode's transcript so far (every model turn and
// observation after the prompt) after a model turn. The service answers with an observation
// (done = false: it is appended and the model continues) or ends the episode with its reward
// (done = true), or with an error.
typedef struct {
    uint64_t id;
    char *job;
    char *prompt;
    char *transcript;
    uint32_t turn;         // model turns so far (1 after the first)
} proto_env_req_t;

typedef struct {
    uint64_t id;
    bool done;
    char *obs;             // done = false
    double reward;         // done = true, clipped to [0, 1] by the verifier
    char *error;           // NULL or a message (then done, obs and reward are ignored)
} proto_env_rep_t;

int proto_env_req_encode(const proto_env_req_t *m, proto_buf_t *out);
int proto_env_req_decode(const void *frame, size_t len, proto_env_req_t *m, char *err);
void proto_env_req_free(proto_env_req_t *m);
int proto_env_rep_encode(const proto_env_rep_t *m, proto_buf_t *out);
int proto_env_rep_decode(const void *frame, size_t len, proto_env_rep_t *m, char *err);
void proto_env_rep_free(proto_env_rep_t *m);

// --- API: client <-> scheduler ("req" / "rep") ----------------------------------------------------
// A request names an operation and carries a token and string/int/binary arguments; a reply
// says ok or error and carries result fields. Arguments and results are a small flat map of
// values; the scheduler validates each operation's arguments itself.
typedef enum { PROTO_VAL_NIL = 0, PROTO_VAL_INT, PROTO_VAL_FLOAT, PROTO_VAL_STR, PROTO_VAL_BIN, PROTO_VAL_BOOL } proto_val_kind_t;

typedef struct {
    char *key;
    proto_val_kind_t kind;
    int64_t i;             // INT, BOOL
    double f;              // FLOAT
    char *s;               // STR (NUL-terminated) / BIN (len bytes)
    size_t len;
} proto_val_t;

typedef struct {
    uint32_t n;
    proto_val_t *v;
} proto_args_t;

// Builders (copy key and value).
void proto_args_str(proto_args_t *a, const char *key, const char *s);
void proto_args_int(proto_args_t *a, const char *key, int64_t i);
void proto_args_float(proto_args_t *a, const char *key, double f);
void proto_args_bool(proto_args_t *a, const char *key, bool b);
void proto_args_bin(proto_args_t *a, const char *key, const void *data, size_t len);
// Lookups (NULL / default when absent or of another kind).
const proto_val_t *proto_args_get(const proto_args_t *a, const char *key);
const char *proto_args_get_str(const proto_args_t *a, const char *key);
// A STR or BIN value as NUL-terminated text (BIN carries texts longer than PROTO_MAX_STR,
// e.g. JSON results); NULL when absent or of another kind.
const char *proto_args_get_text(const proto_args_t *a, const char *key);
bool proto_args_get_int(const proto_args_t *a, const char *key, int64_t *out);
void proto_args_free(proto_args_t *a);

typedef struct {
    uint64_t id;           // echoed in the reply
    char *op;              // "tenant_create", "job_submit", ...
    char *token;           // tenant or admin token
    proto_args_t args;
} proto_req_t;

typedef struct {
    uint64_t id;
    bool ok;
    char *error;           // when !ok
    proto_args_t result;
} proto_rep_t;

int proto_req_encode(const proto_req_t *m, proto_buf_t *out);
int proto_req_decode(const void *frame, size_t len, proto_req_t *m, char *err);
void proto_req_free(proto_req_t *m);
int proto_rep_encode(const proto_rep_t *m, proto_buf_t *out);
int proto_rep_decode(const void *frame, size_t len, proto_rep_t *m, char *err);
void proto_rep_free(proto_rep_t *m);

#endif

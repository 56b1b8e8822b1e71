// proto.c - every MARLaaS message (proto.h): its encoder, validating decoder and free, on the codec
// of proto_codec.c.
//
// Schema. A frame is exactly one MessagePack map with string keys. Encoders write the keys in
// the order listed; decoders accept any order and ignore unknown keys, but reject a listed key
// that appears twice in the same map, so a duplicate can never make two readers (a decoder and
// proto_peek_type, or two versions) see different values. Caps are in brackets: STR, TEXT,
// ITEMS, SAMPLES, TOKENS, ARGS are the PROTO_MAX_* caps; ID is PROTO_MAX_ID - 1 bytes.
//
//   every map      t: str (message type)   v: uint (== PROTO_VERSION)
//   "task"         task: u64   job: str[ID]   ver: u32   kind: 0|1   g: uint [SAMPLES]
//                  max_new: uint [TOKENS]   temp: f32   top_p: f32   top_k: u32   seed: u64
//                  items: [ITEMS] array of {i: u64, p: str[TEXT]}
//                  optional (absent = 1 / 0 / 0): turns: 1..TURNS  ctx: uint [TOKENS]  end: 0|1
//   "done" and     task: u64   job: str[ID]   ver: u32   kind: 0|1   temp: f32   worker: str[ID]
//   "scored"       gen_s: f64
//                  groups: [ITEMS] array of
//                    {i: u64, p: [TOKENS] array of token,
//                     s: [SAMPLES] array of
//                       {tok: [TOKENS] array of token,
//                        lp: bin of 4 * len(tok) bytes, each log-prob a little-endian float32,
//                        text: str[TEXT], fin: 1..3, r: f32, fail: bool,
//                        multi-turn only: env: bin of len(tok) bytes (1 = environment's token),
//                        turns: 1..TURNS, pend: bool, obs: str?[TEXT], rw: bool}}
//                  optional (absent = 0 / 1): max_new: u32  top_k: u32  turns: 1..TURNS
//                  ctx: u32  top_p: f32  seed: u64
//   "cont"         as "done": episodes of which some await their next turn (pend, obs)
//                  token = uint 0..INT32_MAX
//   "report"       kind: 1..4   job: str[ID]   src: str[ID]   task: u64   tk: 0|1   n: u32
//                  rsum: f64   correct: u32   errors: u32   step: u32   ver: u32   error: str?[STR]
//   "adapter"      job: str[ID]   ver: u32   step: u32
//   "reward_req"   id: u64   job: str[ID]   prompt: str[TEXT]
//                  completions: [SAMPLES] array of str[TEXT]   meta: str?[STR]
//   "reward_rep"   id: u64   rewards: [SAMPLES] array of f64, nil when error is set
//                  error: str?[STR]
//   "env_req"      id: u64   job: str[ID]   prompt: str[TEXT]   transcript: str[TEXT]   turn: u32
//   "env_rep"      id: u64   done: bool   obs: str?[TEXT] (a string when done is false)
//                  reward: f64? (a number when done is true)   error: str?[STR]
//   "req"          id: u64   op: str[ID]   token: str[STR]   args: argmap
//   "rep"          id: u64   ok: bool   error: str?[STR] (a string when ok is false)
//                  result: argmap
//   argmap         [ARGS] entries, key str[ID] -> nil | bool | int64 | f64 | str[STR] | bin
//
// str? is a string or nil; the key may also be absent (= nil), and "rewards" may be absent when
// "error" is set. u32 / u64 / uint take a non-negative integer within the C field's range;
// enums take only their listed values. f32 / f64 take an integer or a float of either width and
// must be finite (f32 also within float range); f32 fields are written as float32, so they
// survive a round trip bit for bit. lp is raw float32 bits rather than an array of floats: 4
// bytes a token and every bit pattern kept (-0, denormals, -inf), so it is not range-checked.
// Strings are copied NUL-terminated and rejected if they contain a NUL byte; they are not
// checked to be UTF-8. Bin argument values are bounded only by the frame.
//
// Encoders apply the same rules to the message they are given and return -1 (leaving the
// buffer as it was) for one the decoder would reject, so an invalid message is caught at the
// sender instead of being dropped by the receiver.
#include "common/net/proto_codec.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <msgpack.h>
#include <sodium.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// "task"

enum { TK_T, TK_V, TK_TASK, TK_JOB, TK_VER, TK_KIND, TK_G, TK_MAX_NEW, TK_TEMP, TK_TOP_P, TK_TOP_K, TK_SEED,
       TK_ITEMS, TK_TURNS, TK_CTX, TK_END, TK_TAG, TK_N };
static const char *const proto_task_keys[TK_N] = {"t", "v", "task", "job", "ver", "kind", "g", "max_new", "temp",
                                                  "top_p", "top_k", "seed", "items", "turns", "ctx", "end", "tag"};

// "tag": PROTO_TAG_LEN bytes, or nil (no tag).
static void enc_tag(proto_enc_t *e, bool has, const uint8_t *tag) {
    proto_enc_key(e, "tag");
    if (e->bad) return;
    if (!has) {
        proto_enc_rc(e, msgpack_pack_nil(&e->pk));
    } else {
        proto_enc_rc(e, msgpack_pack_bin(&e->pk, PROTO_TAG_LEN));
        if (!e->bad) proto_enc_rc(e, msgpack_pack_bin_body(&e->pk, tag, PROTO_TAG_LEN));
    }
}

// An optional tag: absent or nil = none.
static int dec_tag(const proto_dec_t *d, const msgpack_object *o, bool *has, uint8_t *tag) {
    *has = false;
    if (!o || o->type == MSGPACK_OBJECT_NIL) return 0;
    if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != PROTO_TAG_LEN)
        return proto_fail(d, "field 'tag' must be nil or %d bytes of binary", PROTO_TAG_LEN);
    memcpy(tag, o->via.bin.ptr, PROTO_TAG_LEN);
    *has = true;
    return 0;
}

// HMAC input: fixed-width little-endian fields, the job with its length.
static void tag_u64(crypto_auth_hmacsha256_state *h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    crypto_auth_hmacsha256_update(h, b, 8);
}

void proto_task_tag(const uint8_t key[32], uint64_t task_id, const char *job, uint32_t version, proto_kind_t kind,
                    uint8_t out[PROTO_TAG_LEN]) {
    crypto_auth_hmacsha256_state h;
    crypto_auth_hmacsha256_init(&h, key, 32);
    size_t jl = job ? strlen(job) : 0;
    tag_u64(&h, task_id);
    tag_u64(&h, jl);
    if (jl) crypto_auth_hmacsha256_update(&h, (const uint8_t *)job, jl);
    tag_u64(&h, version);
    tag_u64(&h, (uint64_t)kind);
    crypto_auth_hmacsha256_final(&h, out);
}

bool proto_batch_tag_ok(const uint8_t key[32], const proto_batch_t *b) {
    if (!b->has_tag) return false;
    uint8_t want[PROTO_TAG_LEN];
    proto_task_tag(key, b->task_id, b->job, b->adapter_version, b->kind, want);
    return sodium_memcmp(want, b->tag, PROTO_TAG_LEN) == 0;
}
enum { IT_I, IT_P, IT_N };
static const char *const proto_item_keys[IT_N] = {"i", "p"};

int proto_task_encode(const proto_task_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "task", TK_N - 2);
    proto_enc_key(&e, "task");
    proto_enc_uint(&e, m->task_id, UINT64_MAX);
    proto_enc_key(&e, "job");
    proto_enc_str(&e, m->job, PROTO_ID_LEN, false);
    proto_enc_key(&e, "ver");
    proto_enc_uint(&e, m->adapter_version, UINT32_MAX);
    proto_enc_key(&e, "kind");
    proto_enc_uint(&e, (uint64_t)m->kind, PROTO_KIND_EVAL);
    proto_enc_key(&e, "g");
    proto_enc_uint(&e, m->group, PROTO_MAX_SAMPLES);
    proto_enc_key(&e, "max_new");
    proto_enc_uint(&e, m->max_new, PROTO_MAX_TOKENS);
    proto_enc_key(&e, "temp");
    proto_enc_f32(&e, m->temperature);
    proto_enc_key(&e, "top_p");
    proto_enc_f32(&e, m->top_p);
    proto_enc_key(&e, "top_k");
    proto_enc_uint(&e, m->top_k, UINT32_MAX);
    proto_enc_key(&e, "seed");
    proto_enc_uint(&e, m->seed, UINT64_MAX);
    proto_enc_key(&e, "items");
    proto_enc_array(&e, m->n_items, PROTO_MAX_ITEMS, m->items);
    for (uint32_t i = 0; i < m->n_items && !e.bad; i++) {
        proto_enc_rc(&e, msgpack_pack_map(&e.pk, IT_N));
        proto_enc_key(&e, "i");
        proto_enc_uint(&e, m->items[i].index, UINT64_MAX);
        proto_enc_key(&e, "p");
        proto_enc_str(&e, m->items[i].prompt, PROTO_MAX_TEXT, false);
    }
    proto_enc_key(&e, "turns");
    proto_enc_uint(&e, m->max_turns ? m->max_turns : 1, PROTO_MAX_TURNS);
    proto_enc_key(&e, "ctx");
    proto_enc_uint(&e, m->max_ctx, PROTO_MAX_TOKENS);
    proto_enc_key(&e, "end");
    proto_enc_uint(&e, (uint64_t)m->end, PROTO_END_EOS);
    enc_tag(&e, m->has_tag, m->tag);
    return proto_enc_end(&e);
}

// An optional unsigned field: absent gives def.
static int proto_opt_u32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         uint32_t lo, uint32_t hi, uint32_t def, uint32_t *out) {
    if (!o) {
        *out = def;
        return 0;
    }
    return proto_get_u32(d, o, pre, name, lo, hi, out);
}

int proto_task_decode(const void *frame, size_t len, proto_task_t *m, char *err) {
    const proto_dec_t d = {"task", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[TK_N];
    const msgpack_object_array *items = NULL;
    uint64_t kind = 0;
    uint32_t end = 0;
    if (proto_open(&d, frame, len, &u, proto_task_keys, TK_N, f)) goto fail;
    if (proto_get_uint(&d, f[TK_TASK], "", "task", 0, UINT64_MAX, &m->task_id) ||
        proto_get_str(&d, f[TK_JOB], "", "job", PROTO_ID_LEN, false, &m->job) ||
        proto_get_u32(&d, f[TK_VER], "", "ver", 0, UINT32_MAX, &m->adapter_version) ||
        proto_get_uint(&d, f[TK_KIND], "", "kind", PROTO_KIND_TRAIN, PROTO_KIND_EVAL, &kind) ||
        proto_get_u32(&d, f[TK_G], "", "g", 0, PROTO_MAX_SAMPLES, &m->group) ||
        proto_get_u32(&d, f[TK_MAX_NEW], "", "max_new", 0, PROTO_MAX_TOKENS, &m->max_new) ||
        proto_get_f32(&d, f[TK_TEMP], "", "temp", &m->temperature) ||
        proto_get_f32(&d, f[TK_TOP_P], "", "top_p", &m->top_p) ||
        proto_get_u32(&d, f[TK_TOP_K], "", "top_k", 0, UINT32_MAX, &m->top_k) ||
        proto_get_uint(&d, f[TK_SEED], "", "seed", 0, UINT64_MAX, &m->seed) ||
        proto_get_array(&d, f[TK_ITEMS], "", "items", PROTO_MAX_ITEMS, &items) ||
        proto_opt_u32(&d, f[TK_TURNS], "", "turns", 1, PROTO_MAX_TURNS, 1, &m->max_turns) ||
        proto_opt_u32(&d, f[TK_CTX], "", "ctx", 0, PROTO_MAX_TOKENS, 0, &m->max_ctx) ||
        proto_opt_u32(&d, f[TK_END], "", "end", PROTO_END_LINE, PROTO_END_EOS, PROTO_END_LINE, &end) ||
        dec_tag(&d, f[TK_TAG], &m->has_tag, m->tag))
        goto fail;
    m->kind = (proto_kind_t)kind;
    m->end = (proto_end_t)end;
    if (items->size) {
        m->items = xcalloc(items->size, sizeof *m->items);
        m->n_items = items->size;
    }
    for (uint32_t i = 0; i < items->size; i++) {
        const msgpack_object *o = &items->ptr[i], *g[IT_N];
        char pre[32];
        snprintf(pre, sizeof pre, "items[%" PRIu32 "]", i);
        if (proto_check_map(&d, o, pre, "")) goto fail;
        strcat(pre, ".");
        if (proto_fields(&d, o, pre, proto_item_keys, IT_N, g) ||
            proto_get_uint(&d, g[IT_I], pre, "i", 0, UINT64_MAX, &m->items[i].index) ||
            proto_get_str(&d, g[IT_P], pre, "p", PROTO_MAX_TEXT, false, &m->items[i].prompt))
            goto fail;
    }
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_task_free(m);
    return -1;
}

void proto_task_free(proto_task_t *m) {
    if (!m) return;
    if (m->items)
        for (uint32_t i = 0; i < m->n_items; i++) free(m->items[i].prompt);
    free(m->items);
    free(m->job);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// "done" / "scored"

enum { BA_T, BA_V, BA_TASK, BA_JOB, BA_VER, BA_KIND, BA_TEMP, BA_WORKER, BA_GEN_S, BA_GROUPS, BA_MAX_NEW, BA_TOP_K,
       BA_TURNS, BA_CTX, BA_TOP_P, BA_SEED, BA_TAG, BA_N };
static const char *const proto_batch_keys[BA_N] = {"t", "v", "task", "job", "ver", "kind", "temp", "worker",
                                                   "gen_s", "groups", "max_new", "top_k", "turns", "ctx",
                                                   "top_p", "seed", "tag"};
enum { GR_I, GR_P, GR_S, GR_N };
static const char *const proto_group_keys[GR_N] = {"i", "p", "s"};
enum { SA_TOK, SA_LP, SA_TEXT, SA_FIN, SA_R, SA_FAIL, SA_ENV, SA_TURNS, SA_PEND, SA_OBS, SA_RW, SA_N };
static const char *const proto_sample_keys[SA_N] = {"tok", "lp", "text", "fin", "r", "fail", "env", "turns",
                                                    "pend", "obs", "rw"};

static bool proto_batch_type_ok(const char *type) {
    return type && (strcmp(type, "done") == 0 || strcmp(type, "scored") == 0 || strcmp(type, "cont") == 0);
}

// The environment mask: one byte per token, present only when some token is the environment's.
static bool proto_has_env(const proto_sample_t *s) {
    for (uint32_t i = 0; s->env && i < s->n; i++)
        if (s->env[i]) return true;
    return false;
}

static bool proto_multi_turn(const proto_sample_t *s) {
    return s->turns > 1 || s->pending || s->obs || s->rewarded || proto_has_env(s);
}

int proto_batch_encode(const char *type, const proto_batch_t *m, proto_buf_t *out) {
    if (!m || !out || !proto_batch_type_ok(type)) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, type, BA_N - 2);
    proto_enc_key(&e, "task");
    proto_enc_uint(&e, m->task_id, UINT64_MAX);
    proto_enc_key(&e, "job");
    proto_enc_str(&e, m->job, PROTO_ID_LEN, false);
    proto_enc_key(&e, "ver");
    proto_enc_uint(&e, m->adapter_version, UINT32_MAX);
    proto_enc_key(&e, "kind");
    proto_enc_uint(&e, (uint64_t)m->kind, PROTO_KIND_EVAL);
    proto_enc_key(&e, "temp");
    proto_enc_f32(&e, m->temperature);
    proto_enc_key(&e, "worker");
    proto_enc_str(&e, m->worker, PROTO_ID_LEN, false);
    proto_enc_key(&e, "gen_s");
    proto_enc_f64(&e, m->gen_seconds);
    proto_enc_key(&e, "max_new");
    proto_enc_uint(&e, m->max_new, PROTO_MAX_TOKENS);
    proto_enc_key(&e, "top_k");
    proto_enc_uint(&e, m->top_k, UINT32_MAX);
    proto_enc_key(&e, "turns");
    proto_enc_uint(&e, m->max_turns ? m->max_turns : 1, PROTO_MAX_TURNS);
    proto_enc_key(&e, "ctx");
    proto_enc_uint(&e, m->max_ctx, PROTO_MAX_TOKENS);
    proto_enc_key(&e, "top_p");
    proto_enc_f32(&e, m->top_p);
    proto_enc_key(&e, "seed");
    proto_enc_uint(&e, m->seed, UINT64_MAX);
    enc_tag(&e, m->has_tag, m->tag);
    proto_enc_key(&e, "groups");
    proto_enc_array(&e, m->n_groups, PROTO_MAX_ITEMS, m->groups);
    for (uint32_t i = 0; i < m->n_groups && !e.bad; i++) {
        const proto_group_t *g = &m->groups[i];
        proto_enc_rc(&e, msgpack_pack_map(&e.pk, GR_N));
        proto_enc_key(&e, "i");
        proto_enc_uint(&e, g->index, UINT64_MAX);
        proto_enc_key(&e, "p");
        proto_enc_tokens(&e, g->prompt, g->n_prompt);
        proto_enc_key(&e, "s");
        proto_enc_array(&e, g->n_samples, PROTO_MAX_SAMPLES, g->samples);
        for (uint32_t j = 0; j < g->n_samples && !e.bad; j++) {
            const proto_sample_t *s = &g->samples[j];
            bool multi = proto_multi_turn(s), env = proto_has_env(s);
            // multi-turn: the six fields, turns, pend and rw, then env and obs when present
            proto_enc_rc(&e, msgpack_pack_map(&e.pk, multi ? SA_ENV + 3 + (env ? 1 : 0) + (s->obs ? 1 : 0) : SA_ENV));
            proto_enc_key(&e, "tok");
            proto_enc_tokens(&e, s->tokens, s->n);
            proto_enc_key(&e, "lp");
            proto_enc_logprobs(&e, s->logprobs, s->n);
            proto_enc_key(&e, "text");
            proto_enc_str(&e, s->text, PROTO_MAX_TEXT, false);
            proto_enc_key(&e, "fin");
            if (s->finish < PROTO_FIN_EOS) e.bad = true;
            proto_enc_uint(&e, s->finish, PROTO_FIN_LENGTH);
            proto_enc_key(&e, "r");
            proto_enc_f32(&e, s->reward);
            proto_enc_key(&e, "fail");
            proto_enc_bool(&e, s->failed != 0);
            if (!multi) continue;
            if (env) {
                proto_enc_key(&e, "env");
                if (!e.bad) proto_enc_rc(&e, msgpack_pack_bin(&e.pk, s->n));
                if (!e.bad) proto_enc_rc(&e, msgpack_pack_bin_body(&e.pk, s->env, s->n));
            }
            proto_enc_key(&e, "turns");
            proto_enc_uint(&e, s->turns ? s->turns : 1, PROTO_MAX_TURNS);
            proto_enc_key(&e, "pend");
            proto_enc_bool(&e, s->pending != 0);
            proto_enc_key(&e, "rw");
            proto_enc_bool(&e, s->rewarded != 0);
            if (s->obs) {
                proto_enc_key(&e, "obs");
                proto_enc_str(&e, s->obs, PROTO_MAX_TEXT, false);
            }
        }
    }
    return proto_enc_end(&e);
}

static int proto_sample_decode(const proto_dec_t *d, const msgpack_object *o, const char *pre, proto_sample_t *s) {
    const msgpack_object *f[SA_N];
    uint32_t fin = 0;
    bool failed = false;
    if (proto_check_map(d, o, pre, "")) return -1;
    char dot[64];
    snprintf(dot, sizeof dot, "%s.", pre);
    if (proto_fields(d, o, dot, proto_sample_keys, SA_N, f) ||
        proto_get_tokens(d, f[SA_TOK], dot, "tok", &s->tokens, &s->n))
        return -1;
    const msgpack_object *lp = f[SA_LP];
    if (!lp) return proto_missing(d, dot, "lp");
    if (lp->type != MSGPACK_OBJECT_BIN)
        return proto_fail(d, "field '%slp' must be a binary, not %s", dot, proto_type_name(lp->type));
    if (lp->via.bin.size != (uint64_t)s->n * 4)
        return proto_fail(d, "field '%slp' has %" PRIu32 " bytes, expected 4 per token (%" PRIu32 " tokens)", dot,
                          lp->via.bin.size, s->n);
    if (s->n) {
        const uint8_t *b = (const uint8_t *)lp->via.bin.ptr;
        s->logprobs = xmalloc(sizeof *s->logprobs * s->n);
        for (uint32_t i = 0; i < s->n; i++) {
            uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                         (uint32_t)b[4 * i + 3] << 24;
            memcpy(&s->logprobs[i], &u, 4);
        }
    }
    if (proto_get_str(d, f[SA_TEXT], dot, "text", PROTO_MAX_TEXT, false, &s->text) ||
        proto_get_u32(d, f[SA_FIN], dot, "fin", PROTO_FIN_EOS, PROTO_FIN_LENGTH, &fin) ||
        proto_get_f32(d, f[SA_R], dot, "r", &s->reward) ||
        proto_get_bool(d, f[SA_FAIL], dot, "fail", &failed))
        return -1;
    s->finish = (uint8_t)fin;
    s->failed = failed ? 1 : 0;
    const msgpack_object *env = f[SA_ENV];
    if (env) {
        if (env->type != MSGPACK_OBJECT_BIN)
            return proto_fail(d, "field '%senv' must be a binary, not %s", dot, proto_type_name(env->type));
        if (env->via.bin.size != s->n)
            return proto_fail(d, "field '%senv' has %" PRIu32 " bytes, expected one per token (%" PRIu32 ")", dot,
                              env->via.bin.size, s->n);
        if (s->n) {
            s->env = xmalloc(s->n);
            for (uint32_t i = 0; i < s->n; i++) s->env[i] = ((const uint8_t *)env->via.bin.ptr)[i] ? 1 : 0;
        }
    }
    bool pending = false, rewarded = false;
    if (proto_opt_u32(d, f[SA_TURNS], dot, "turns", 1, PROTO_MAX_TURNS, 1, &s->turns) ||
        (f[SA_PEND] && proto_get_bool(d, f[SA_PEND], dot, "pend", &pending)) ||
        (f[SA_RW] && proto_get_bool(d, f[SA_RW], dot, "rw", &rewarded)) ||
        proto_get_str(d, f[SA_OBS], dot, "obs", PROTO_MAX_TEXT, true, &s->obs))
        return -1;
    s->pending = pending ? 1 : 0;
    s->rewarded = rewarded ? 1 : 0;
    // "done": pend marks a turn that ended at a tool call (the verifier steps it); "cont": the
    // episode goes on with the observation the environment gave
    if (s->pending && !s->obs && !strcmp(d->msg, "cont"))
        return proto_fail(d, "field '%spend' is true but '%sobs' is missing", dot, dot);
    return 0;
}

static int proto_group_decode(const proto_dec_t *d, const msgpack_object *o, uint32_t gi, proto_group_t *g) {
    const msgpack_object *f[GR_N];
    const msgpack_object_array *s = NULL;
    char pre[32];
    snprintf(pre, sizeof pre, "groups[%" PRIu32 "]", gi);
    if (proto_check_map(d, o, pre, "")) return -1;
    strcat(pre, ".");
    if (proto_fields(d, o, pre, proto_group_keys, GR_N, f) ||
        proto_get_uint(d, f[GR_I], pre, "i", 0, UINT64_MAX, &g->index) ||
        proto_get_tokens(d, f[GR_P], pre, "p", &g->prompt, &g->n_prompt) ||
        proto_get_array(d, f[GR_S], pre, "s", PROTO_MAX_SAMPLES, &s))
        return -1;
    if (s->size) {
        g->samples = xcalloc(s->size, sizeof *g->samples);
        g->n_samples = s->size;
    }
    for (uint32_t j = 0; j < s->size; j++) {
        char spre[48];
        snprintf(spre, sizeof spre, "%ss[%" PRIu32 "]", pre, j);
        if (proto_sample_decode(d, &s->ptr[j], spre, &g->samples[j])) return -1;
    }
    return 0;
}

int proto_batch_decode(const char *type, const void *frame, size_t len, proto_batch_t *m, char *err) {
    memset(m, 0, sizeof *m);
    if (!proto_batch_type_ok(type)) return err_set(err, "batch: message type must be 'done' or 'scored'");
    const proto_dec_t d = {type, err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    const msgpack_object *f[BA_N];
    const msgpack_object_array *groups = NULL;
    uint64_t kind = 0;
    if (proto_open(&d, frame, len, &u, proto_batch_keys, BA_N, f)) goto fail;
    if (proto_get_uint(&d, f[BA_TASK], "", "task", 0, UINT64_MAX, &m->task_id) ||
        proto_get_str(&d, f[BA_JOB], "", "job", PROTO_ID_LEN, false, &m->job) ||
        proto_get_u32(&d, f[BA_VER], "", "ver", 0, UINT32_MAX, &m->adapter_version) ||
        proto_get_uint(&d, f[BA_KIND], "", "kind", PROTO_KIND_TRAIN, PROTO_KIND_EVAL, &kind) ||
        proto_get_f32(&d, f[BA_TEMP], "", "temp", &m->temperature) ||
        proto_get_str(&d, f[BA_WORKER], "", "worker", PROTO_ID_LEN, false, &m->worker) ||
        proto_get_num(&d, f[BA_GEN_S], "", "gen_s", false, &m->gen_seconds) ||
        proto_get_array(&d, f[BA_GROUPS], "", "groups", PROTO_MAX_ITEMS, &groups) ||
        proto_opt_u32(&d, f[BA_MAX_NEW], "", "max_new", 0, PROTO_MAX_TOKENS, 0, &m->max_new) ||
        proto_opt_u32(&d, f[BA_TOP_K], "", "top_k", 0, UINT32_MAX, 0, &m->top_k) ||
        proto_opt_u32(&d, f[BA_TURNS], "", "turns", 1, PROTO_MAX_TURNS, 1, &m->max_turns) ||
        proto_opt_u32(&d, f[BA_CTX], "", "ctx", 0, PROTO_MAX_TOKENS, 0, &m->max_ctx) ||
        (f[BA_TOP_P] && proto_get_f32(&d, f[BA_TOP_P], "", "top_p", &m->top_p)) ||
        (f[BA_SEED] && proto_get_uint(&d, f[BA_SEED], "", "seed", 0, UINT64_MAX, &m->seed)) ||
        dec_tag(&d, f[BA_TAG], &m->has_tag, m->tag))
        goto fail;
    m->kind = (proto_kind_t)kind;
    if (groups->size) {
        m->groups = xcalloc(groups->size, sizeof *m->groups);
        m->n_groups = groups->size;
    }
    for (uint32_t i = 0; i < groups->size; i++)
        if (proto_group_decode(&d, &groups->ptr[i], i, &m->groups[i])) goto fail;
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_batch_free(m);
    return -1;
}

void proto_batch_destroy(proto_batch_t **pb) {
    if (!pb || !*pb) return;
    proto_batch_free(*pb);
    free(*pb);
    *pb = NULL;
}

void proto_batch_free(proto_batch_t *m) {
    if (!m) return;
    for (uint32_t i = 0; m->groups && i < m->n_groups; i++) {
        proto_group_t *g = &m->groups[i];
        for (uint32_t j = 0; g->samples && j < g->n_samples; j++) {
            free(g->samples[j].tokens);
            free(g->samples[j].logprobs);
            free(g->samples[j].text);
            free(g->samples[j].env);
            free(g->samples[j].obs);
        }
        free(g->samples);
        free(g->prompt);
    }
    free(m->groups);
    free(m->job);
    free(m->worker);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// "report"

_Static_assert(sizeof(proto_report_kind_t) == sizeof(int) && sizeof(proto_kind_t) == sizeof(int),
               "PROTO_F_ENUM members are int-sized");

#define U64(st, m, name) {name, PROTO_F_U64, offsetof(st, m), 0, UINT64_MAX, false, 0}
#define U32(st, m, name, lo, hi) {name, PROTO_F_U32, offsetof(st, m), lo, hi, false, 0}
#define ENUM(st, m, name, lo, hi) {name, PROTO_F_ENUM, offsetof(st, m), lo, hi, false, 0}
#define F64(st, m, name) {name, PROTO_F_F64, offsetof(st, m), 0, 0, false, 0}
#define STR(st, m, name, max) {name, PROTO_F_STR, offsetof(st, m), 0, max, false, 0}
#define STR_OR_NIL(st, m, name, max) {name, PROTO_F_STR, offsetof(st, m), 0, max, true, 0}
#define STRS(st, m, count, name, n_max, max) {name, PROTO_F_STRS, offsetof(st, m), n_max, max, false, offsetof(st, count)}
#define ARGS(st, m, name) {name, PROTO_F_ARGS, offsetof(st, m), 0, 0, false, 0}

static const proto_msg_t report_msg = {"report", sizeof(proto_report_t), 12, {
    ENUM(proto_report_t, kind, "kind", PROTO_REP_EPISODES, PROTO_REP_TASK_FAILED),
    STR(proto_report_t, job, "job", PROTO_ID_LEN),
    STR(proto_report_t, source, "src", PROTO_ID_LEN),
    U64(proto_report_t, task_id, "task"),
    ENUM(proto_report_t, task_kind, "tk", PROTO_KIND_TRAIN, PROTO_KIND_EVAL),
    U32(proto_report_t, n, "n", 0, UINT32_MAX),
    F64(proto_report_t, reward_sum, "rsum"),
    U32(proto_report_t, correct, "correct", 0, UINT32_MAX),
    U32(proto_report_t, errors, "errors", 0, UINT32_MAX),
    U32(proto_report_t, step, "step", 0, UINT32_MAX),
    U32(proto_report_t, adapter_version, "ver", 0, UINT32_MAX),
    STR_OR_NIL(proto_report_t, error, "error", PROTO_MAX_STR),
}};

int proto_report_encode(const proto_report_t *m, proto_buf_t *out) { return proto_msg_encode(&report_msg, m, out); }
int proto_report_decode(const void *frame, size_t len, proto_report_t *m, char *err) {
    return proto_msg_decode(&report_msg, frame, len, m, err);
}
void proto_report_free(proto_report_t *m) { proto_msg_free(&report_msg, m); }

// ---------------------------------------------------------------------------------------------
// "adapter"

static const proto_msg_t adapter_msg = {"adapter", sizeof(proto_adapter_event_t), 3, {
    STR(proto_adapter_event_t, job, "job", PROTO_ID_LEN),
    U32(proto_adapter_event_t, version, "ver", 0, UINT32_MAX),
    U32(proto_adapter_event_t, step, "step", 0, UINT32_MAX),
}};

int proto_adapter_event_encode(const proto_adapter_event_t *m, proto_buf_t *out) {
    return proto_msg_encode(&adapter_msg, m, out);
}
int proto_adapter_event_decode(const void *frame, size_t len, proto_adapter_event_t *m, char *err) {
    return proto_msg_decode(&adapter_msg, frame, len, m, err);
}
void proto_adapter_event_free(proto_adapter_event_t *m) { proto_msg_free(&adapter_msg, m); }

// ---------------------------------------------------------------------------------------------
// "reward_req" / "reward_rep"

enum { RP_T, RP_V, RP_ID, RP_REWARDS, RP_ERROR, RP_N };
static const char *const proto_reward_rep_keys[RP_N] = {"t", "v", "id", "rewards", "error"};

static const proto_msg_t reward_req_msg = {"reward_req", sizeof(proto_reward_req_t), 5, {
    U64(proto_reward_req_t, id, "id"),
    STR(proto_reward_req_t, job, "job", PROTO_ID_LEN),
    STR(proto_reward_req_t, prompt, "prompt", PROTO_MAX_TEXT),
    STRS(proto_reward_req_t, completions, n, "completions", PROTO_MAX_SAMPLES, PROTO_MAX_TEXT),
    STR_OR_NIL(proto_reward_req_t, meta, "meta", PROTO_MAX_STR),
}};

int proto_reward_req_encode(const proto_reward_req_t *m, proto_buf_t *out) {
    return proto_msg_encode(&reward_req_msg, m, out);
}
int proto_reward_req_decode(const void *frame, size_t len, proto_reward_req_t *m, char *err) {
    return proto_msg_decode(&reward_req_msg, frame, len, m, err);
}
void proto_reward_req_free(proto_reward_req_t *m) { proto_msg_free(&reward_req_msg, m); }

int proto_reward_rep_encode(const proto_reward_rep_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "reward_rep", RP_N - 2);
    proto_enc_key(&e, "id");
    proto_enc_uint(&e, m->id, UINT64_MAX);
    proto_enc_key(&e, "rewards");
    if (m->error) {
        if (m->n) e.bad = true;   // either rewards or an error, never both
        if (!e.bad) proto_enc_rc(&e, msgpack_pack_nil(&e.pk));
    } else {
        proto_enc_array(&e, m->n, PROTO_MAX_SAMPLES, m->rewards);
        for (uint32_t i = 0; i < m->n && !e.bad; i++) proto_enc_f64(&e, m->rewards[i]);
    }
    proto_enc_key(&e, "error");
    proto_enc_str(&e, m->error, PROTO_MAX_STR, true);
    return proto_enc_end(&e);
}

int proto_reward_rep_decode(const void *frame, size_t len, proto_reward_rep_t *m, char *err) {
    const proto_dec_t d = {"reward_rep", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[RP_N];
    const msgpack_object_array *r = NULL;
    if (proto_open(&d, frame, len, &u, proto_reward_rep_keys, RP_N, f) ||
        proto_get_uint(&d, f[RP_ID], "", "id", 0, UINT64_MAX, &m->id) ||
        proto_get_str(&d, f[RP_ERROR], "", "error", PROTO_MAX_STR, true, &m->error))
        goto fail;
    if (m->error) {
        if (f[RP_REWARDS] && f[RP_REWARDS]->type != MSGPACK_OBJECT_NIL) {
            proto_fail(&d, "field 'rewards' must be nil when 'error' is set");
            goto fail;
        }
    } else {
        if (proto_get_array(&d, f[RP_REWARDS], "", "rewards", PROTO_MAX_SAMPLES, &r)) goto fail;
        if (r->size) {
            m->rewards = xcalloc(r->size, sizeof *m->rewards);
            m->n = r->size;
        }
        for (uint32_t i = 0; i < r->size; i++) {
            char name[32];
            snprintf(name, sizeof name, "rewards[%" PRIu32 "]", i);
            if (proto_get_num(&d, &r->ptr[i], "", name, false, &m->rewards[i])) goto fail;
        }
    }
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_reward_rep_free(m);
    return -1;
}

void proto_reward_rep_free(proto_reward_rep_t *m) {
    if (!m) return;
    free(m->rewards);
    free(m->error);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// Argument maps

// The entry for key, emptied, appended if missing: a repeated key replaces the earlier value,
// so an encoded map never carries a duplicate (which the decoder rejects).
static proto_val_t *proto_args_slot(proto_args_t *a, const char *key) {
    ASSERT(a != NULL && key != NULL);
    for (uint32_t i = 0; i < a->n; i++) {
        proto_val_t *v = &a->v[i];
        if (v->key && strcmp(v->key, key) == 0) {
            char *k = v->key;
            free(v->s);
            memset(v, 0, sizeof *v);
            v->key = k;
            return v;
        }
    }
    a->v = xrealloc(a->v, sizeof *a->v * ((size_t)a->n + 1));
    proto_val_t *v = &a->v[a->n++];
    memset(v, 0, sizeof *v);
    v->key = xstrdup(key);
    return v;
}

void proto_args_str(proto_args_t *a, const char *key, const char *s) {
    proto_val_t *v = proto_args_slot(a, key);
    if (!s) return;   // a NULL string is sent as nil
    v->kind = PROTO_VAL_STR;
    v->s = xstrdup(s);
    v->len = strlen(s);
}

void proto_args_int(proto_args_t *a, const char *key, int64_t i) {
    proto_val_t *v = proto_args_slot(a, key);
    v->kind = PROTO_VAL_INT;
    v->i = i;
}

void proto_args_float(proto_args_t *a, const char *key, double f) {
    proto_val_t *v = proto_args_slot(a, key);
    v->kind = PROTO_VAL_FLOAT;
    v->f = f;
}

void proto_args_bool(proto_args_t *a, const char *key, bool b) {
    proto_val_t *v = proto_args_slot(a, key);
    v->kind = PROTO_VAL_BOOL;
    v->i = b ? 1 : 0;
}

void proto_args_bin(proto_args_t *a, const char *key, const void *data, size_t len) {
    ASSERT(data != NULL || len == 0);
    proto_val_t *v = proto_args_slot(a, key);
    v->kind = PROTO_VAL_BIN;
    v->s = xmalloc(len + 1);
    if (len) memcpy(v->s, data, len);
    v->s[len] = '\0';
    v->len = len;
}

const proto_val_t *proto_args_get(const proto_args_t *a, const char *key) {
    if (!a || !key) return NULL;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->v[i].key && strcmp(a->v[i].key, key) == 0) return &a->v[i];
    return NULL;
}

const char *proto_args_get_str(const proto_args_t *a, const char *key) {
    const proto_val_t *v = proto_args_get(a, key);
    return v && v->kind == PROTO_VAL_STR ? v->s : NULL;
}

const char *proto_args_get_text(const proto_args_t *a, const char *key) {
    const proto_val_t *v = proto_args_get(a, key);
    return v && (v->kind == PROTO_VAL_STR || v->kind == PROTO_VAL_BIN) ? v->s : NULL;
}

bool proto_args_get_int(const proto_args_t *a, const char *key, int64_t *out) {
    const proto_val_t *v = proto_args_get(a, key);
    if (!v || v->kind != PROTO_VAL_INT) return false;
    if (out) *out = v->i;
    return true;
}

void proto_args_free(proto_args_t *a) {
    if (!a) return;
    for (uint32_t i = 0; a->v && i < a->n; i++) {
        free(a->v[i].key);
        free(a->v[i].s);
    }
    free(a->v);
    memset(a, 0, sizeof *a);
}

// ---------------------------------------------------------------------------------------------
// "req" / "rep"

enum { RS_T, RS_V, RS_ID, RS_OK, RS_ERROR, RS_RESULT, RS_N };
static const char *const proto_rep_keys[RS_N] = {"t", "v", "id", "ok", "error", "result"};

static const proto_msg_t req_msg = {"req", sizeof(proto_req_t), 4, {
    U64(proto_req_t, id, "id"),
    STR(proto_req_t, op, "op", PROTO_ID_LEN),
    STR(proto_req_t, token, "token", PROTO_MAX_STR),
    ARGS(proto_req_t, args, "args"),
}};

int proto_req_encode(const proto_req_t *m, proto_buf_t *out) { return proto_msg_encode(&req_msg, m, out); }
int proto_req_decode(const void *frame, size_t len, proto_req_t *m, char *err) {
    return proto_msg_decode(&req_msg, frame, len, m, err);
}
void proto_req_free(proto_req_t *m) { proto_msg_free(&req_msg, m); }

int proto_rep_encode(const proto_rep_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "rep", RS_N - 2);
    proto_enc_key(&e, "id");
    proto_enc_uint(&e, m->id, UINT64_MAX);
    proto_enc_key(&e, "ok");
    proto_enc_bool(&e, m->ok);
    proto_enc_key(&e, "error");
    if (!m->ok && !m->error) e.bad = true;
    proto_enc_str(&e, m->error, PROTO_MAX_STR, true);
    proto_enc_key(&e, "result");
    proto_enc_args(&e, &m->result);
    return proto_enc_end(&e);
}

int proto_rep_decode(const void *frame, size_t len, proto_rep_t *m, char *err) {
    const proto_dec_t d = {"rep", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[RS_N];
    if (proto_open(&d, frame, len, &u, proto_rep_keys, RS_N, f) ||
        proto_get_uint(&d, f[RS_ID], "", "id", 0, UINT64_MAX, &m->id) ||
        proto_get_bool(&d, f[RS_OK], "", "ok", &m->ok) ||
        proto_get_str(&d, f[RS_ERROR], "", "error", PROTO_MAX_STR, true, &m->error))
        goto fail;
    if (!m->ok && !m->error) {
        proto_fail(&d, "field 'error' must be a string when 'ok' is false");
        goto fail;
    }
    if (proto_get_args(&d, f[RS_RESULT], "result", &m->result)) goto fail;
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_rep_free(m);
    return -1;
}

void proto_rep_free(proto_rep_t *m) {
    if (!m) return;
    free(m->error);
    proto_args_free(&m->result);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// "env_req" / "env_rep"

enum { EP_T, EP_V, EP_ID, EP_DONE, EP_OBS, EP_REWARD, EP_ERROR, EP_N };
static const char *const proto_env_rep_keys[EP_N] = {"t", "v", "id", "done", "obs", "reward", "error"};

static const proto_msg_t env_req_msg = {"env_req", sizeof(proto_env_req_t), 5, {
    U64(proto_env_req_t, id, "id"),
    STR(proto_env_req_t, job, "job", PROTO_ID_LEN),
    STR(proto_env_req_t, prompt, "prompt", PROTO_MAX_TEXT),
    STR(proto_env_req_t, transcript, "transcript", PROTO_MAX_TEXT),
    U32(proto_env_req_t, turn, "turn", 0, PROTO_MAX_TURNS),
}};

int proto_env_req_encode(const proto_env_req_t *m, proto_buf_t *out) { return proto_msg_encode(&env_req_msg, m, out); }
int proto_env_req_decode(const void *frame, size_t len, proto_env_req_t *m, char *err) {
    return proto_msg_decode(&env_req_msg, frame, len, m, err);
}
void proto_env_req_free(proto_env_req_t *m) { proto_msg_free(&env_req_msg, m); }

int proto_env_rep_encode(const proto_env_rep_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "env_rep", EP_N - 2);
    proto_enc_key(&e, "id");
    proto_enc_uint(&e, m->id, UINT64_MAX);
    proto_enc_key(&e, "done");
    proto_enc_bool(&e, m->done);
    proto_enc_key(&e, "obs");
    // an observation exactly when the episode goes on (and no error)
    if (!m->error && (m->done ? m->obs != NULL : m->obs == NULL)) e.bad = true;
    proto_enc_str(&e, m->done || m->error ? NULL : m->obs, PROTO_MAX_TEXT, true);
    proto_enc_key(&e, "reward");
    if (!e.bad) {
        if (m->done && !m->error) proto_enc_f64(&e, m->reward);
        else proto_enc_rc(&e, msgpack_pack_nil(&e.pk));
    }
    proto_enc_key(&e, "error");
    proto_enc_str(&e, m->error, PROTO_MAX_STR, true);
    return proto_enc_end(&e);
}

int proto_env_rep_decode(const void *frame, size_t len, proto_env_rep_t *m, char *err) {
    const proto_dec_t d = {"env_rep", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[EP_N];
    bool done = false;
    if (proto_open(&d, frame, len, &u, proto_env_rep_keys, EP_N, f) ||
        proto_get_uint(&d, f[EP_ID], "", "id", 0, UINT64_MAX, &m->id) ||
        proto_get_str(&d, f[EP_ERROR], "", "error", PROTO_MAX_STR, true, &m->error))
        goto fail;
    if (!m->error) {
        if (proto_get_bool(&d, f[EP_DONE], "", "done", &done)) goto fail;
        m->done = done;
        if (done) {
            if (proto_get_num(&d, f[EP_REWARD], "", "reward", false, &m->reward)) goto fail;
        } else if (proto_get_str(&d, f[EP_OBS], "", "obs", PROTO_MAX_TEXT, false, &m->obs)) {
            goto fail;
        }
    }
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_env_rep_free(m);
    return -1;
}

void proto_env_rep_free(proto_env_rep_t *m) {
    if (!m) return;
    free(m->obs);
    free(m->error);
    memset(m, 0, sizeof *m);
}

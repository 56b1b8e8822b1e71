// test_proto.c - wire protocol: bit-exact round trips of every message, caps at and past their
// limits, wrong types and versions, and decoders fed truncated, mutated, random and hostile
// frames (the suite runs under ASan and valgrind, so a leak or a stray read fails it).
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/proto.h"
#include "tests/unit/testbits.h"

// Criterion runs each test in a child process and ignores how it exits once the test has
// reported, so a leak report from LeakSanitizer or valgrind at exit would not fail anything:
// every test checks for leaks itself.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define PROTO_LSAN 1
#elif defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define PROTO_VALGRIND 1
#endif
#endif

static void leak_check(void) {
#if defined(PROTO_LSAN)
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "memory leaked (LeakSanitizer report above)");
#elif defined(PROTO_VALGRIND)
    if (!RUNNING_ON_VALGRIND) return;
    unsigned long leaked = 0, dubious = 0, reachable = 0, suppressed = 0;
    VALGRIND_DO_LEAK_CHECK;
    VALGRIND_COUNT_LEAKS(leaked, dubious, reachable, suppressed);
    // Criterion's messaging library keeps buffers that valgrind calls "possibly lost".
    (void)dubious;
    (void)reachable;
    (void)suppressed;
    cr_assert_eq(leaked, 0, "%lu bytes leaked (valgrind report above)", leaked);
#endif
}

// A test: its body, then the leak check, which runs after the body's frame is gone so nothing
// it left on the stack can hide a leak.
#define PROTO_TEST(name)              \
    static void name##_body(void);    \
    Test(proto, name) {               \
        name##_body();                \
        leak_check();                 \
    }                                 \
    static void name##_body(void)

// --- helpers -----------------------------------------------------------------------------------

// The longest id on the wire: ids leave room for a NUL in char[PROTO_MAX_ID].
#define ID_LEN (PROTO_MAX_ID - 1)

static uint64_t d2u(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static uint64_t rnd_next(uint64_t *s) {   // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static char *filled(size_t n, char c) {
    char *s = malloc(n + 1);
    cr_assert_not_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

static void assert_str_or_null(const char *a, const char *b, const char *what) {
    if (!a || !b) cr_assert(a == b, "%s: %s vs %s", what, a ? a : "NULL", b ? b : "NULL");
    else cr_assert_str_eq(a, b, "%s", what);
}

// Every message kind, so the generic tests can run over all of them.
typedef enum { K_TASK, K_DONE, K_SCORED, K_REPORT, K_ADAPTER, K_RREQ, K_RREP, K_REQ, K_REP, K_N } kind_t;
static const char *const kind_type[K_N] = {"task", "done", "scored", "report", "adapter",
                                           "reward_req", "reward_rep", "req", "rep"};

typedef union {
    proto_task_t task;
    proto_batch_t batch;
    proto_report_t report;
    proto_adapter_event_t adapter;
    proto_reward_req_t rreq;
    proto_reward_rep_t rrep;
    proto_req_t req;
    proto_rep_t rep;
} any_t;

static size_t kind_size(kind_t k) {
    switch (k) {
    case K_TASK: return sizeof(proto_task_t);
    case K_DONE: case K_SCORED: return sizeof(proto_batch_t);
    case K_REPORT: return sizeof(proto_report_t);
    case K_ADAPTER: return sizeof(proto_adapter_event_t);
    case K_RREQ: return sizeof(proto_reward_req_t);
    case K_RREP: return sizeof(proto_reward_rep_t);
    case K_REQ: return sizeof(proto_req_t);
    case K_REP: return sizeof(proto_rep_t);
    default: return 0;
    }
}

static int decode_into(kind_t k, const void *f, size_t len, any_t *m, char *err) {
    switch (k) {
    case K_TASK: return proto_task_decode(f, len, &m->task, err);
    case K_DONE: return proto_batch_decode("done", f, len, &m->batch, err);
    case K_SCORED: return proto_batch_decode("scored", f, len, &m->batch, err);
    case K_REPORT: return proto_report_decode(f, len, &m->report, err);
    case K_ADAPTER: return proto_adapter_event_decode(f, len, &m->adapter, err);
    case K_RREQ: return proto_reward_req_decode(f, len, &m->rreq, err);
    case K_RREP: return proto_reward_rep_decode(f, len, &m->rrep, err);
    case K_REQ: return proto_req_decode(f, len, &m->req, err);
    case K_REP: return proto_rep_decode(f, len, &m->rep, err);
    default: return -2;
    }
}

static int encode_from(kind_t k, const any_t *m, proto_buf_t *out) {
    switch (k) {
    case K_TASK: return proto_task_encode(&m->task, out);
    case K_DONE: return proto_batch_encode("done", &m->batch, out);
    case K_SCORED: return proto_batch_encode("scored", &m->batch, out);
    case K_REPORT: return proto_report_encode(&m->report, out);
    case K_ADAPTER: return proto_adapter_event_encode(&m->adapter, out);
    case K_RREQ: return proto_reward_req_encode(&m->rreq, out);
    case K_RREP: return proto_reward_rep_encode(&m->rrep, out);
    case K_REQ: return proto_req_encode(&m->req, out);
    case K_REP: return proto_rep_encode(&m->rep, out);
    default: return -2;
    }
}

static void free_any(kind_t k, any_t *m) {
    switch (k) {
    case K_TASK: proto_task_free(&m->task); break;
    case K_DONE: case K_SCORED: proto_batch_free(&m->batch); break;
    case K_REPORT: proto_report_free(&m->report); break;
    case K_ADAPTER: proto_adapter_event_free(&m->adapter); break;
    case K_RREQ: proto_reward_req_free(&m->rreq); break;
    case K_RREP: proto_reward_rep_free(&m->rrep); break;
    case K_REQ: proto_req_free(&m->req); break;
    case K_REP: proto_rep_free(&m->rep); break;
    default: break;
    }
}

// Decodes a frame as kind k. A failure must say why, name the message type and leave the struct
// zeroed; a success must re-encode, since the encoders apply the decoders' rules.
static int decode_check(kind_t k, const void *f, size_t len, char *err) {
    any_t m;
    memset(&m, 0xa5, sizeof m);   // the decoders must not depend on a zeroed struct
    err[0] = '\0';
    int rc = decode_into(k, f, len, &m, err);
    if (rc) {
        cr_assert_eq(rc, -1);
        size_t tl = strlen(kind_type[k]);
        cr_assert(strncmp(err, kind_type[k], tl) == 0 && err[tl] == ':', "error '%s' does not start with '%s:'",
                  err, kind_type[k]);
        const unsigned char *b = (const unsigned char *)&m;
        for (size_t i = 0; i < kind_size(k); i++)
            cr_assert_eq(b[i], 0, "%s: byte %zu of the struct is not zero after a failed decode", kind_type[k], i);
        return -1;
    }
    proto_buf_t out = {0};
    cr_assert_eq(encode_from(k, &m, &out), 0, "%s: a decoded message does not re-encode", kind_type[k]);
    proto_buf_free(&out);
    free_any(k, &m);
    return 0;
}

static void expect_reject_bytes(kind_t k, const void *f, size_t len, const char *want) {
    char err[ERR_LEN];
    cr_assert_eq(decode_check(k, f, len, err), -1, "%s: frame accepted (wanted '%s')", kind_type[k], want);
    if (want) cr_assert_not_null(strstr(err, want), "%s: error '%s' lacks '%s'", kind_type[k], err, want);
}

// --- fixtures: one valid message of each kind, with edge values ---------------------------------

static const char prompt_uni[] = "Compute 2+2. Réponds: ответ? 答え 🎉";
// Every ASCII byte but NUL, then the first and last code point of each UTF-8 length and those
// around the surrogates.
static char prompt_bytes[160];
static const char utf8_edges[] = "\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF"
                                 "\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";

static proto_item_t fx_items[3];

static proto_task_t fx_task(void) {
    for (int i = 0; i < 127; i++) prompt_bytes[i] = (char)(i + 1);
    memcpy(prompt_bytes + 127, utf8_edges, sizeof utf8_edges);
    fx_items[0] = (proto_item_t){7, (char *)prompt_uni};
    fx_items[1] = (proto_item_t){UINT64_MAX, ""};
    fx_items[2] = (proto_item_t){0, prompt_bytes};
    return (proto_task_t){.task_id = 0x0123456789abcdefull, .job = "job-α", .adapter_version = UINT32_MAX,
                          .kind = PROTO_KIND_TRAIN, .group = 8, .max_new = 512, .temperature = 0.7f,
                          .top_p = 0.95f, .top_k = 40, .seed = UINT64_MAX - 1, .n_items = 3, .items = fx_items,
                          .end = PROTO_END_EOS};
}

static int32_t fx_prompt[4] = {1, 2, INT32_MAX, 0};
static int32_t fx_tok[4] = {5, 0, INT32_MAX, 17};
static float fx_lp[4];
static proto_sample_t fx_samples[2];
static proto_group_t fx_groups[2];

static proto_batch_t fx_batch(void) {
    // -0, the smallest denormal, -inf and a NaN with a payload: all must arrive bit for bit.
    fx_lp[0] = tu_u2f(0x80000000u);
    fx_lp[1] = tu_u2f(0x00000001u);
    fx_lp[2] = tu_u2f(0xff800000u);
    fx_lp[3] = tu_u2f(0x7fc12345u);
    fx_samples[0] = (proto_sample_t){.n = 4, .tokens = fx_tok, .logprobs = fx_lp, .text = "Ответ: 4 ✓",
                                     .finish = PROTO_FIN_EOS, .reward = 0.75f, .failed = 0};
    fx_samples[1] = (proto_sample_t){.n = 0, .text = "", .finish = PROTO_FIN_LENGTH, .reward = -1.0f, .failed = 1};
    fx_groups[0] = (proto_group_t){.index = 3, .n_prompt = 4, .prompt = fx_prompt, .n_samples = 2,
                                   .samples = fx_samples};
    fx_groups[1] = (proto_group_t){.index = UINT64_MAX};
    return (proto_batch_t){.task_id = 42, .job = "j1", .adapter_version = 3, .kind = PROTO_KIND_EVAL,
                           .temperature = 1.0f, .worker = "rollout-3", .gen_seconds = 12.345678901234567,
                           .n_groups = 2, .groups = fx_groups};
}

static proto_report_t fx_report(void) {
    return (proto_report_t){.kind = PROTO_REP_EPISODES, .job = "j1", .source = "verifier-0", .task_id = 99,
                            .task_kind = PROTO_KIND_EVAL, .n = 64, .reward_sum = 31.5, .correct = 30,
                            .errors = 2, .step = 0, .adapter_version = 5, .error = NULL};
}

static proto_adapter_event_t fx_adapter(void) {
    return (proto_adapter_event_t){.job = "j1", .version = UINT32_MAX, .step = 123};
}

static char *fx_completions[3] = {"4", "", "four 四"};

static proto_reward_req_t fx_rreq(void) {
    return (proto_reward_req_t){.id = UINT64_MAX, .job = "j1", .prompt = (char *)prompt_uni, .n = 3,
                                .completions = fx_completions, .meta = "{\"answer\":4}"};
}

static double fx_rewards[5] = {1.0, -0.5, 0.0, 1e300, 5e-324};

static proto_reward_rep_t fx_rrep(void) {
    return (proto_reward_rep_t){.id = 5, .n = 5, .rewards = fx_rewards};
}

static void fx_args(proto_args_t *a) {
    uint8_t blob[256];
    for (int i = 0; i < 256; i++) blob[i] = (uint8_t)i;
    proto_args_str(a, "s", "spec ✓");
    proto_args_int(a, "n", INT64_MIN);
    proto_args_int(a, "p", INT64_MAX);
    proto_args_float(a, "f", -2.5);
    proto_args_bool(a, "b", true);
    proto_args_bool(a, "b0", false);
    proto_args_bin(a, "blob", blob, sizeof blob);
    proto_args_bin(a, "e", NULL, 0);
    proto_args_str(a, "z", NULL);
    proto_args_str(a, "es", "");
}

// The req / rep fixtures own their arguments (free with proto_args_free).
static proto_req_t fx_req(void) {
    proto_req_t m = {.id = 1, .op = "job_submit", .token = "tenant-token-xyz"};
    fx_args(&m.args);
    return m;
}

static proto_rep_t fx_rep(void) {
    proto_rep_t m = {.id = 1, .ok = true};
    proto_args_str(&m.result, "job", "j1");
    proto_args_int(&m.result, "version", 3);
    return m;
}

// Encodes the fixture of kind k (a fresh buffer).
static void fixture(kind_t k, proto_buf_t *out) {
    memset(out, 0, sizeof *out);
    int rc = -1;
    switch (k) {
    case K_TASK: { proto_task_t m = fx_task(); rc = proto_task_encode(&m, out); break; }
    case K_DONE: { proto_batch_t m = fx_batch(); rc = proto_batch_encode("done", &m, out); break; }
    case K_SCORED: { proto_batch_t m = fx_batch(); rc = proto_batch_encode("scored", &m, out); break; }
    case K_REPORT: { proto_report_t m = fx_report(); rc = proto_report_encode(&m, out); break; }
    case K_ADAPTER: { proto_adapter_event_t m = fx_adapter(); rc = proto_adapter_event_encode(&m, out); break; }
    case K_RREQ: { proto_reward_req_t m = fx_rreq(); rc = proto_reward_req_encode(&m, out); break; }
    case K_RREP: { proto_reward_rep_t m = fx_rrep(); rc = proto_reward_rep_encode(&m, out); break; }
    case K_REQ: {
        proto_req_t m = fx_req();
        rc = proto_req_encode(&m, out);
        proto_args_free(&m.args);
        break;
    }
    case K_REP: {
        proto_rep_t m = fx_rep();
        rc = proto_rep_encode(&m, out);
        proto_args_free(&m.result);
        break;
    }
    default: break;
    }
    cr_assert_eq(rc, 0, "fixture %s does not encode", kind_type[k]);
}

// --- comparisons ---------------------------------------------------------------------------------

static void cmp_task(const proto_task_t *a, const proto_task_t *b) {
    cr_assert_eq(a->task_id, b->task_id);
    cr_assert_str_eq(a->job, b->job);
    cr_assert_eq(a->adapter_version, b->adapter_version);
    cr_assert_eq(a->kind, b->kind);
    cr_assert_eq(a->group, b->group);
    cr_assert_eq(a->max_new, b->max_new);
    cr_assert_eq(tu_f2u(a->temperature), tu_f2u(b->temperature));
    cr_assert_eq(tu_f2u(a->top_p), tu_f2u(b->top_p));
    cr_assert_eq(a->top_k, b->top_k);
    cr_assert_eq(a->seed, b->seed);
    cr_assert_eq(a->end, b->end);
    cr_assert_eq(a->has_tag, b->has_tag);
    if (a->has_tag) cr_assert_arr_eq(a->tag, b->tag, PROTO_TAG_LEN);
    cr_assert_eq(a->n_items, b->n_items);
    for (uint32_t i = 0; i < a->n_items; i++) {
        cr_assert_eq(a->items[i].index, b->items[i].index, "item %u", i);
        cr_assert_str_eq(a->items[i].prompt, b->items[i].prompt, "item %u", i);
    }
}

static void cmp_batch(const proto_batch_t *a, const proto_batch_t *b) {
    cr_assert_eq(a->task_id, b->task_id);
    cr_assert_str_eq(a->job, b->job);
    cr_assert_eq(a->adapter_version, b->adapter_version);
    cr_assert_eq(a->kind, b->kind);
    cr_assert_eq(tu_f2u(a->temperature), tu_f2u(b->temperature));
    cr_assert_str_eq(a->worker, b->worker);
    cr_assert_eq(d2u(a->gen_seconds), d2u(b->gen_seconds));
    cr_assert_eq(a->has_tag, b->has_tag);
    if (a->has_tag) cr_assert_arr_eq(a->tag, b->tag, PROTO_TAG_LEN);
    cr_assert_eq(a->n_groups, b->n_groups);
    for (uint32_t i = 0; i < a->n_groups; i++) {
        const proto_group_t *g = &a->groups[i], *h = &b->groups[i];
        cr_assert_eq(g->index, h->index, "group %u", i);
        cr_assert_eq(g->n_prompt, h->n_prompt, "group %u", i);
        for (uint32_t t = 0; t < g->n_prompt; t++) cr_assert_eq(g->prompt[t], h->prompt[t], "group %u token %u", i, t);
        cr_assert_eq(g->n_samples, h->n_samples, "group %u", i);
        for (uint32_t j = 0; j < g->n_samples; j++) {
            const proto_sample_t *s = &g->samples[j], *r = &h->samples[j];
            cr_assert_eq(s->n, r->n, "group %u sample %u", i, j);
            for (uint32_t t = 0; t < s->n; t++) {
                cr_assert_eq(s->tokens[t], r->tokens[t], "group %u sample %u token %u", i, j, t);
                cr_assert_eq(tu_f2u(s->logprobs[t]), tu_f2u(r->logprobs[t]), "group %u sample %u logprob %u", i, j, t);
            }
            cr_assert_str_eq(s->text, r->text);
            cr_assert_eq(s->finish, r->finish);
            cr_assert_eq(tu_f2u(s->reward), tu_f2u(r->reward));
            cr_assert_eq(s->failed, r->failed);
        }
    }
}

static void cmp_report(const proto_report_t *a, const proto_report_t *b) {
    cr_assert_eq(a->kind, b->kind);
    cr_assert_str_eq(a->job, b->job);
    cr_assert_str_eq(a->source, b->source);
    cr_assert_eq(a->task_id, b->task_id);
    cr_assert_eq(a->task_kind, b->task_kind);
    cr_assert_eq(a->n, b->n);
    cr_assert_eq(d2u(a->reward_sum), d2u(b->reward_sum));
    cr_assert_eq(a->correct, b->correct);
    cr_assert_eq(a->errors, b->errors);
    cr_assert_eq(a->step, b->step);
    cr_assert_eq(a->adapter_version, b->adapter_version);
    assert_str_or_null(a->error, b->error, "report.error");
}

static void cmp_args(const proto_args_t *a, const proto_args_t *b) {
    cr_assert_eq(a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        const proto_val_t *x = &a->v[i], *y = &b->v[i];
        cr_assert_str_eq(x->key, y->key);
        cr_assert_eq(x->kind, y->kind, "arg %s", x->key);
        switch (x->kind) {
        case PROTO_VAL_INT: case PROTO_VAL_BOOL: cr_assert_eq(x->i, y->i, "arg %s", x->key); break;
        case PROTO_VAL_FLOAT: cr_assert_eq(d2u(x->f), d2u(y->f), "arg %s", x->key); break;
        case PROTO_VAL_STR:
            cr_assert_str_eq(x->s, y->s);
            cr_assert_eq(x->len, y->len);
            break;
        case PROTO_VAL_BIN:
            cr_assert_eq(x->len, y->len, "arg %s", x->key);
            cr_assert_eq(memcmp(x->s, y->s, x->len), 0, "arg %s", x->key);
            break;
        default: break;
        }
    }
}

// Re-encoding a decoded message must reproduce the frame byte for byte.
static void assert_reencodes(kind_t k, const any_t *m, const proto_buf_t *frame) {
    proto_buf_t again = {0};
    cr_assert_eq(encode_from(k, m, &again), 0);
    cr_assert_eq(again.len, frame->len, "%s: re-encoded length differs", kind_type[k]);
    cr_assert_eq(memcmp(again.data, frame->data, frame->len), 0, "%s: re-encoded bytes differ", kind_type[k]);
    proto_buf_free(&again);
}

// --- round trips ---------------------------------------------------------------------------------

PROTO_TEST(task_round_trip) {
    proto_task_t m = fx_task(), d;
    proto_buf_t b = {0};
    char err[ERR_LEN];
    cr_assert_eq(proto_task_encode(&m, &b), 0);
    cr_assert_eq(proto_task_decode(b.data, b.len, &d, err), 0, "%s", err);
    cmp_task(&m, &d);
    assert_reencodes(K_TASK, (const any_t *)&d, &b);
    proto_task_free(&d);
    // No items at all.
    m.n_items = 0;
    m.items = NULL;
    m.kind = PROTO_KIND_EVAL;
    b.len = 0;
    cr_assert_eq(proto_task_encode(&m, &b), 0);
    cr_assert_eq(proto_task_decode(b.data, b.len, &d, err), 0, "%s", err);
    cmp_task(&m, &d);
    cr_assert_null(d.items);
    proto_task_free(&d);
    proto_buf_free(&b);
}

// A task frame written before "end" existed (no turns, ctx or end keys) still means what it
// meant: completions end at a newline too.
PROTO_TEST(task_without_optional_fields) {
    proto_task_t m = fx_task(), d;
    proto_buf_t b = {0};
    char err[ERR_LEN];
    m.max_turns = 3;
    m.max_ctx = 50;
    cr_assert_eq(proto_task_encode(&m, &b), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)b.data, b.len, NULL), MSGPACK_UNPACK_SUCCESS);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    const msgpack_object_map *root = &u.data.via.map;
    uint32_t kept = 0;
    static const char *const optional[] = {"turns", "ctx", "end"};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) msgpack_pack_map(&pk, kept);
        for (uint32_t i = 0; i < root->size; i++) {
            const msgpack_object *k = &root->ptr[i].key;
            bool drop = false;
            for (int o = 0; o < 3; o++)
                drop |= k->via.str.size == strlen(optional[o]) && !memcmp(k->via.str.ptr, optional[o], k->via.str.size);
            if (drop) continue;
            if (pass == 0) kept++;
            else msgpack_pack_object(&pk, *k), msgpack_pack_object(&pk, root->ptr[i].val);
        }
    }
    cr_assert_eq(kept, root->size - 3);
    cr_assert_eq(proto_task_decode(sb.data, sb.size, &d, err), 0, "%s", err);
    cr_assert_eq(d.end, PROTO_END_LINE);
    cr_assert_eq(d.max_turns, 1);
    cr_assert_eq(d.max_ctx, 0);
    cr_assert_eq(d.n_items, 3);
    proto_task_free(&d);
    // an encoder refuses an end the decoder would refuse
    proto_buf_t b2 = {0};
    m.end = (proto_end_t)2;
    cr_assert_eq(proto_task_encode(&m, &b2), -1);
    cr_assert_eq(b2.len, 0);
    proto_buf_free(&b2);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    proto_buf_free(&b);
}

PROTO_TEST(batch_round_trip) {
    for (kind_t k = K_DONE; k <= K_SCORED; k++) {
        proto_batch_t m = fx_batch(), d;
        proto_buf_t b = {0};
        char err[ERR_LEN];
        cr_assert_eq(proto_batch_encode(kind_type[k], &m, &b), 0);
        cr_assert_eq(proto_batch_decode(kind_type[k], b.data, b.len, &d, err), 0, "%s", err);
        cmp_batch(&m, &d);
        cr_assert_null(d.groups[1].prompt);
        cr_assert_null(d.groups[1].samples);
        cr_assert_null(d.groups[0].samples[1].tokens);
        cr_assert_null(d.groups[0].samples[1].logprobs);
        assert_reencodes(k, (const any_t *)&d, &b);
        proto_batch_free(&d);
        // The other batch type is a different message.
        cr_assert_eq(proto_batch_decode(kind_type[k == K_DONE ? K_SCORED : K_DONE], b.data, b.len, &d, err), -1);
        cr_assert_not_null(strstr(err, "expected message type"), "%s", err);
        proto_buf_free(&b);
    }
}

PROTO_TEST(report_round_trip) {
    proto_report_t m = fx_report(), d;
    char err[ERR_LEN];
    const proto_report_kind_t kinds[] = {PROTO_REP_EPISODES, PROTO_REP_STEP, PROTO_REP_JOB_FAILED,
                                         PROTO_REP_TASK_FAILED};
    for (int i = 0; i < 4; i++) {
        proto_buf_t b = {0};
        m.kind = kinds[i];
        m.error = i >= 2 ? "NaN in the loss at step 7 — ошибка" : NULL;
        m.step = (uint32_t)i * 1000000u;
        cr_assert_eq(proto_report_encode(&m, &b), 0);
        cr_assert_eq(proto_report_decode(b.data, b.len, &d, err), 0, "%s", err);
        cmp_report(&m, &d);
        assert_reencodes(K_REPORT, (const any_t *)&d, &b);
        proto_report_free(&d);
        proto_buf_free(&b);
    }
}

// A task's tag travels unchanged through task, "done" and "scored"; it is bound to the task id,
// job, version and kind under the key; 31 bytes or a string are refused.
PROTO_TEST(task_tags_bind_task_job_version_kind) {
    uint8_t key[32], key2[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(3 * i + 1), key2[i] = key[i];
    key2[31] ^= 1;
    proto_task_t t = fx_task(), dt;
    t.has_tag = true;
    proto_task_tag(key, t.task_id, t.job, t.adapter_version, t.kind, t.tag);
    proto_buf_t b = {0};
    char err[ERR_LEN];
    cr_assert_eq(proto_task_encode(&t, &b), 0);
    cr_assert_eq(proto_task_decode(b.data, b.len, &dt, err), 0, "%s", err);
    cmp_task(&t, &dt);
    proto_task_free(&dt);
    proto_buf_free(&b);
    proto_batch_t m = fx_batch(), d;
    m.task_id = t.task_id, m.job = t.job, m.adapter_version = t.adapter_version, m.kind = t.kind;
    cr_assert_not(proto_batch_tag_ok(key, &m), "a batch without a tag");
    m.has_tag = true;
    memcpy(m.tag, t.tag, PROTO_TAG_LEN);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(proto_batch_encode(k ? "scored" : "done", &m, &b), 0);
        cr_assert_eq(proto_batch_decode(k ? "scored" : "done", b.data, b.len, &d, err), 0, "%s", err);
        cmp_batch(&m, &d);
        cr_assert(proto_batch_tag_ok(key, &d));
        cr_assert_not(proto_batch_tag_ok(key2, &d), "another key");
        proto_batch_free(&d);
        proto_buf_free(&b);
    }
    proto_batch_t v = m;
    v.task_id ^= 1;
    cr_assert_not(proto_batch_tag_ok(key, &v), "another task id");
    v = m, v.job = "job-β";
    cr_assert_not(proto_batch_tag_ok(key, &v), "another job");
    v = m, v.adapter_version ^= 1;
    cr_assert_not(proto_batch_tag_ok(key, &v), "another version");
    v = m, v.kind = PROTO_KIND_EVAL;
    cr_assert_not(proto_batch_tag_ok(key, &v), "another kind");
    v = m, v.tag[0] ^= 0x80;
    cr_assert_not(proto_batch_tag_ok(key, &v), "a flipped bit");
    // on the wire: exactly PROTO_TAG_LEN bytes of binary, or nil
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    cr_assert_eq(proto_task_encode(&t, &b), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)b.data, b.len, NULL), MSGPACK_UNPACK_SUCCESS);
    msgpack_object_map *mp = &u.data.via.map;
    for (uint32_t i = 0; i < mp->size; i++)
        if (mp->ptr[i].key.via.str.size == 3 && !memcmp(mp->ptr[i].key.via.str.ptr, "tag", 3))
            mp->ptr[i].val.via.bin.size = PROTO_TAG_LEN - 1;
    msgpack_pack_object(&pk, u.data);
    cr_assert_eq(proto_task_decode(sb.data, sb.size, &dt, err), -1);
    cr_assert_not_null(strstr(err, "field 'tag' must be nil or 32 bytes of binary"), "%s", err);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    proto_buf_free(&b);
}

// Text that is not UTF-8 (an error message cut inside a character) goes out repaired, each
// ill-formed byte as U+FFFD, so that receivers, which refuse ill-formed UTF-8, take it.
PROTO_TEST(ill_formed_text_is_sent_repaired) {
    proto_report_t m = fx_report(), d;
    m.kind = PROTO_REP_JOB_FAILED;
    m.error = "cut \xE2\x80|\xFF";
    proto_buf_t b = {0};
    char err[ERR_LEN];
    cr_assert_eq(proto_report_encode(&m, &b), 0);
    cr_assert_eq(proto_report_decode(b.data, b.len, &d, err), 0, "%s", err);
    cr_assert_str_eq(d.error, "cut \xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD");
    proto_report_free(&d);
    proto_buf_free(&b);
}

PROTO_TEST(adapter_round_trip) {
    proto_adapter_event_t m = fx_adapter(), d;
    proto_buf_t b = {0};
    char err[ERR_LEN];
    cr_assert_eq(proto_adapter_event_encode(&m, &b), 0);
    cr_assert_eq(proto_adapter_event_decode(b.data, b.len, &d, err), 0, "%s", err);
    cr_assert_str_eq(d.job, m.job);
    cr_assert_eq(d.version, m.version);
    cr_assert_eq(d.step, m.step);
    assert_reencodes(K_ADAPTER, (const any_t *)&d, &b);
    proto_adapter_event_free(&d);
    proto_buf_free(&b);
}

PROTO_TEST(reward_round_trip) {
    char err[ERR_LEN];
    for (int v = 0; v < 3; v++) {
        proto_reward_req_t m = fx_rreq(), d;
        proto_buf_t b = {0};
        if (v == 1) m.meta = NULL;
        if (v == 2) {
            m.n = 0;
            m.completions = NULL;
        }
        cr_assert_eq(proto_reward_req_encode(&m, &b), 0);
        cr_assert_eq(proto_reward_req_decode(b.data, b.len, &d, err), 0, "%s", err);
        cr_assert_eq(d.id, m.id);
        cr_assert_str_eq(d.job, m.job);
        cr_assert_str_eq(d.prompt, m.prompt);
        cr_assert_eq(d.n, m.n);
        for (uint32_t i = 0; i < m.n; i++) cr_assert_str_eq(d.completions[i], m.completions[i]);
        assert_str_or_null(d.meta, m.meta, "meta");
        assert_reencodes(K_RREQ, (const any_t *)&d, &b);
        proto_reward_req_free(&d);
        proto_buf_free(&b);
    }
    for (int v = 0; v < 3; v++) {
        proto_reward_rep_t m = fx_rrep(), d;
        proto_buf_t b = {0};
        if (v == 1) {
            m.n = 0;
            m.rewards = NULL;
        }
        if (v == 2) {
            m.n = 0;
            m.rewards = NULL;
            m.error = "reward service timed out";
        }
        cr_assert_eq(proto_reward_rep_encode(&m, &b), 0);
        cr_assert_eq(proto_reward_rep_decode(b.data, b.len, &d, err), 0, "%s", err);
        cr_assert_eq(d.id, m.id);
        cr_assert_eq(d.n, m.n);
        for (uint32_t i = 0; i < m.n; i++) cr_assert_eq(d2u(d.rewards[i]), d2u(m.rewards[i]), "reward %u", i);
        if (m.n == 0) cr_assert_null(d.rewards);
        assert_str_or_null(d.error, m.error, "error");
        assert_reencodes(K_RREP, (const any_t *)&d, &b);
        proto_reward_rep_free(&d);
        proto_buf_free(&b);
    }
}

PROTO_TEST(req_rep_round_trip) {
    char err[ERR_LEN];
    proto_req_t q = fx_req(), dq;
    proto_buf_t b = {0};
    cr_assert_eq(proto_req_encode(&q, &b), 0);
    cr_assert_eq(proto_req_decode(b.data, b.len, &dq, err), 0, "%s", err);
    cr_assert_eq(dq.id, q.id);
    cr_assert_str_eq(dq.op, q.op);
    cr_assert_str_eq(dq.token, q.token);
    cmp_args(&q.args, &dq.args);
    cr_assert_eq(proto_args_get(&dq.args, "z")->kind, PROTO_VAL_NIL);
    cr_assert_eq(proto_args_get(&dq.args, "blob")->s[256], '\0', "bin values are NUL-terminated too");
    assert_reencodes(K_REQ, (const any_t *)&dq, &b);
    proto_req_free(&dq);
    proto_args_free(&q.args);
    proto_buf_free(&b);

    for (int v = 0; v < 2; v++) {
        proto_rep_t p = fx_rep(), dp;
        if (v == 1) {
            proto_args_free(&p.result);
            p.ok = false;
            p.error = "unknown op 'x'";
        }
        cr_assert_eq(proto_rep_encode(&p, &b), 0);
        cr_assert_eq(proto_rep_decode(b.data, b.len, &dp, err), 0, "%s", err);
        cr_assert_eq(dp.id, p.id);
        cr_assert_eq(dp.ok, p.ok);
        assert_str_or_null(dp.error, p.error, "error");
        cmp_args(&p.result, &dp.result);
        assert_reencodes(K_REP, (const any_t *)&dp, &b);
        proto_rep_free(&dp);
        proto_args_free(&p.result);
        proto_buf_free(&b);
    }
}

// Every array and string at exactly its cap is accepted and round-trips.
PROTO_TEST(caps_at_limit_round_trip) {
    char err[ERR_LEN];
    char *id = filled(ID_LEN, 'i'), *text = filled(PROTO_MAX_TEXT, 't'), *str = filled(PROTO_MAX_STR, 's');
    proto_buf_t b = {0};

    proto_task_t t = fx_task(), dt;
    proto_item_t *items = calloc(PROTO_MAX_ITEMS, sizeof *items);
    for (uint32_t i = 0; i < PROTO_MAX_ITEMS; i++) items[i] = (proto_item_t){i, i == 5 ? text : "p"};
    t.items = items;
    t.n_items = PROTO_MAX_ITEMS;
    t.job = id;
    t.group = PROTO_MAX_SAMPLES;
    t.max_new = PROTO_MAX_TOKENS;
    cr_assert_eq(proto_task_encode(&t, &b), 0);
    cr_assert_eq(proto_task_decode(b.data, b.len, &dt, err), 0, "%s", err);
    cmp_task(&t, &dt);
    proto_task_free(&dt);
    free(items);
    b.len = 0;

    // One group with the most samples, one with the longest prompt and completion, then the most groups.
    int32_t *tok = calloc(PROTO_MAX_TOKENS, sizeof *tok);
    float *lp = calloc(PROTO_MAX_TOKENS, sizeof *lp);
    for (int i = 0; i < PROTO_MAX_TOKENS; i++) {
        tok[i] = (int32_t)((i * 2654435761u) & 0x7fffffff);
        lp[i] = -(float)i / 7.0f;
    }
    proto_sample_t *samples = calloc(PROTO_MAX_SAMPLES, sizeof *samples);
    for (int i = 0; i < PROTO_MAX_SAMPLES; i++)
        samples[i] = (proto_sample_t){.n = 3, .tokens = tok, .logprobs = lp, .text = "x", .finish = PROTO_FIN_STOP};
    proto_sample_t big = {.n = PROTO_MAX_TOKENS, .tokens = tok, .logprobs = lp, .text = text,
                          .finish = PROTO_FIN_LENGTH, .reward = 1.0f};
    proto_group_t *groups = calloc(PROTO_MAX_ITEMS, sizeof *groups);
    groups[0] = (proto_group_t){.index = 0, .n_prompt = 1, .prompt = tok, .n_samples = PROTO_MAX_SAMPLES,
                                .samples = samples};
    groups[1] = (proto_group_t){.index = 1, .n_prompt = PROTO_MAX_TOKENS, .prompt = tok, .n_samples = 1,
                                .samples = &big};
    for (uint32_t i = 2; i < PROTO_MAX_ITEMS; i++) groups[i].index = i;
    proto_batch_t ba = fx_batch(), db;
    ba.groups = groups;
    ba.n_groups = PROTO_MAX_ITEMS;
    ba.job = id;
    ba.worker = id;
    cr_assert_eq(proto_batch_encode("scored", &ba, &b), 0);
    cr_assert_eq(proto_batch_decode("scored", b.data, b.len, &db, err), 0, "%s", err);
    cmp_batch(&ba, &db);
    proto_batch_free(&db);
    b.len = 0;

    char **comp = calloc(PROTO_MAX_SAMPLES, sizeof *comp);
    double *rw = calloc(PROTO_MAX_SAMPLES, sizeof *rw);
    for (int i = 0; i < PROTO_MAX_SAMPLES; i++) {
        comp[i] = i == 0 ? text : "c";
        rw[i] = i / 256.0;
    }
    proto_reward_req_t rq = {.id = 1, .job = id, .prompt = text, .n = PROTO_MAX_SAMPLES, .completions = comp,
                             .meta = str}, drq;
    cr_assert_eq(proto_reward_req_encode(&rq, &b), 0);
    cr_assert_eq(proto_reward_req_decode(b.data, b.len, &drq, err), 0, "%s", err);
    cr_assert_eq(drq.n, PROTO_MAX_SAMPLES);
    cr_assert_str_eq(drq.completions[0], text);
    cr_assert_str_eq(drq.meta, str);
    proto_reward_req_free(&drq);
    b.len = 0;
    proto_reward_rep_t rp = {.id = 2, .n = PROTO_MAX_SAMPLES, .rewards = rw}, drp;
    cr_assert_eq(proto_reward_rep_encode(&rp, &b), 0);
    cr_assert_eq(proto_reward_rep_decode(b.data, b.len, &drp, err), 0, "%s", err);
    for (int i = 0; i < PROTO_MAX_SAMPLES; i++) cr_assert_eq(d2u(drp.rewards[i]), d2u(rw[i]));
    proto_reward_rep_free(&drp);
    b.len = 0;

    proto_req_t q = {.id = 3, .op = id, .token = str}, dq;
    for (int i = 0; i < PROTO_MAX_ARGS; i++) {
        char key[PROTO_MAX_ID];
        snprintf(key, sizeof key, "%0*d", i == 0 ? ID_LEN : 1, i);
        if (i == 0) proto_args_str(&q.args, key, str);
        else proto_args_int(&q.args, key, -i);
    }
    cr_assert_eq(q.args.n, PROTO_MAX_ARGS);
    cr_assert_eq(proto_req_encode(&q, &b), 0);
    cr_assert_eq(proto_req_decode(b.data, b.len, &dq, err), 0, "%s", err);
    cmp_args(&q.args, &dq.args);
    proto_req_free(&dq);
    proto_args_free(&q.args);

    free(comp);
    free(rw);
    free(groups);
    free(samples);
    free(tok);
    free(lp);
    free(id);
    free(text);
    free(str);
    proto_buf_free(&b);
}

// A frame of exactly PROTO_MAX_FRAME bytes is fine; one more byte is refused by both sides.
PROTO_TEST(frame_cap) {
    char err[ERR_LEN];
    proto_buf_t b = {0};
    proto_req_t q = {.id = 1, .op = "upload", .token = "t"}, dq;
    proto_args_bin(&q.args, "data", NULL, 0);
    cr_assert_eq(proto_req_encode(&q, &b), 0);
    // An empty bin has a 2-byte header, a large one 5.
    size_t blob = PROTO_MAX_FRAME - (b.len + 3);
    void *data = calloc(1, blob + 1);
    proto_args_bin(&q.args, "data", data, blob);
    b.len = 0;
    cr_assert_eq(proto_req_encode(&q, &b), 0);
    cr_assert_eq(b.len, PROTO_MAX_FRAME);
    cr_assert_eq(proto_req_decode(b.data, b.len, &dq, err), 0, "%s", err);
    cr_assert_eq(proto_args_get(&dq.args, "data")->len, blob);
    proto_req_free(&dq);
    char type[32];
    cr_assert_eq(proto_peek_type(b.data, b.len, type, err), 0, "%s", err);

    proto_args_bin(&q.args, "data", data, blob + 1);
    b.len = 0;
    cr_assert_eq(proto_req_encode(&q, &b), -1);
    cr_assert_eq(b.len, 0);

    uint8_t *big = calloc(1, PROTO_MAX_FRAME + 1);
    memcpy(big, b.data, 16);
    cr_assert_eq(proto_req_decode(big, PROTO_MAX_FRAME + 1, &dq, err), -1);
    cr_assert_not_null(strstr(err, "cap"), "%s", err);
    cr_assert_eq(proto_peek_type(big, PROTO_MAX_FRAME + 1, type, err), -1);
    free(big);
    free(data);
    proto_args_free(&q.args);
    proto_buf_free(&b);
}

// --- structural mutations of valid frames ---------------------------------------------------------
//
// A fixture frame is unpacked into a msgpack object tree, one node is replaced, removed or added,
// and the tree is packed again, so each bad frame differs from a valid one in one field only.

typedef struct {
    proto_buf_t frame;     // the tree's strings point into it
    msgpack_unpacked u;
} tree_t;

static msgpack_object *tree_open(tree_t *t, kind_t k) {
    fixture(k, &t->frame);
    msgpack_unpacked_init(&t->u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&t->u, (const char *)t->frame.data, t->frame.len, &off), MSGPACK_UNPACK_SUCCESS);
    return &t->u.data;
}

static void tree_close(tree_t *t) {
    msgpack_unpacked_destroy(&t->u);
    proto_buf_free(&t->frame);
}

static void *zalloc(tree_t *t, size_t n) {
    void *p = msgpack_zone_malloc(t->u.zone, n ? n : 1);
    cr_assert_not_null(p);
    return p;
}

static msgpack_object *tree_find(msgpack_object *o, const char *seg) {
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        unsigned long i = strtoul(seg, NULL, 10);
        cr_assert_lt(i, o->via.array.size, "index %s", seg);
        return &o->via.array.ptr[i];
    }
    cr_assert_eq(o->type, MSGPACK_OBJECT_MAP, "path segment %s", seg);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(seg) &&
            memcmp(k->via.str.ptr, seg, k->via.str.size) == 0)
            return &o->via.map.ptr[i].val;
    }
    cr_assert_fail("no key %s", seg);
    return NULL;
}

// path: "/"-separated map keys and array indices ("groups/0/s/1/tok"); "" is the root.
static msgpack_object *tree_at(msgpack_object *root, const char *path, char *last) {
    char seg[64];
    msgpack_object *o = root;
    while (*path) {
        size_t n = strcspn(path, "/");
        cr_assert_lt(n, sizeof seg);
        memcpy(seg, path, n);
        seg[n] = '\0';
        path += n + (path[n] == '/');
        if (last && !*path) {   // stop at the parent of the last segment
            strcpy(last, seg);
            return o;
        }
        o = tree_find(o, seg);
    }
    return o;
}

static void tree_delete(msgpack_object *root, const char *path) {
    char key[64];
    msgpack_object *m = tree_at(root, path, key);
    cr_assert_eq(m->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) && memcmp(k->via.str.ptr, key, k->via.str.size) == 0) {
            memmove(&m->via.map.ptr[i], &m->via.map.ptr[i + 1], sizeof m->via.map.ptr[0] * (m->via.map.size - i - 1));
            m->via.map.size--;
            return;
        }
    }
    cr_assert_fail("no key %s to delete", key);
}

static void tree_add(tree_t *t, msgpack_object *map, msgpack_object key, msgpack_object val) {
    cr_assert_eq(map->type, MSGPACK_OBJECT_MAP);
    uint32_t n = map->via.map.size;
    msgpack_object_kv *kv = zalloc(t, sizeof *kv * (n + 1));
    memcpy(kv, map->via.map.ptr, sizeof *kv * n);
    kv[n].key = key;
    kv[n].val = val;
    map->via.map.ptr = kv;
    map->via.map.size = n + 1;
}

static msgpack_object o_str(tree_t *t, const char *s, size_t n) {
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    char *p = zalloc(t, n);
    memcpy(p, s, n);
    o.via.str.ptr = p;
    o.via.str.size = (uint32_t)n;
    return o;
}

static msgpack_object o_fill(tree_t *t, size_t n) {
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    char *p = zalloc(t, n);
    memset(p, 'a', n);
    o.via.str.ptr = p;
    o.via.str.size = (uint32_t)n;
    return o;
}

static msgpack_object o_uint(uint64_t u) {
    msgpack_object o = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER};
    o.via.u64 = u;
    return o;
}

static msgpack_object o_int(int64_t i) {
    msgpack_object o = {.type = i < 0 ? MSGPACK_OBJECT_NEGATIVE_INTEGER : MSGPACK_OBJECT_POSITIVE_INTEGER};
    o.via.i64 = i;
    return o;
}

static msgpack_object o_f64(double d) {
    msgpack_object o = {.type = MSGPACK_OBJECT_FLOAT64};
    o.via.f64 = d;
    return o;
}

static void tree_pack(const msgpack_object *root, msgpack_sbuffer *sb) {
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    cr_assert_eq(msgpack_pack_object(&pk, *root), 0);
}

static void expect_reject_tree(kind_t k, const msgpack_object *root, const char *want) {
    msgpack_sbuffer sb;
    tree_pack(root, &sb);
    expect_reject_bytes(k, sb.data, sb.size, want);
    msgpack_sbuffer_destroy(&sb);
}

static void expect_accept_tree(kind_t k, const msgpack_object *root) {
    msgpack_sbuffer sb;
    char err[ERR_LEN];
    tree_pack(root, &sb);
    cr_assert_eq(decode_check(k, sb.data, sb.size, err), 0, "%s: %s", kind_type[k], err);
    msgpack_sbuffer_destroy(&sb);
}

typedef enum {
    R_DEL,      // remove the key
    R_NIL, R_TRUE, R_STR, R_EMPTY_MAP, R_EMPTY_ARRAY,
    R_UINT,     // positive integer n
    R_NEG,      // -1
    R_FLOAT,    // 1.5
    R_NAN, R_INF, R_HUGE,   // NaN, +inf, 1e39 (finite, beyond a float)
    R_NUL_STR,  // "a\0b"
    R_BAD_UTF8, // "a\xC0\xAFb" (an overlong '/')
    R_LONG,     // string of n bytes
    R_BIN,      // binary of n bytes
    R_GROW,     // the array with n copies of its first element
} repl_t;

typedef struct {
    kind_t k;
    const char *path;
    repl_t r;
    uint64_t n;
    const char *want;
} bad_field_t;

static void apply(tree_t *t, msgpack_object *root, const bad_field_t *c) {
    if (c->r == R_DEL) {
        tree_delete(root, c->path);
        return;
    }
    msgpack_object *o = tree_at(root, c->path, NULL), v = {.type = MSGPACK_OBJECT_NIL};
    switch (c->r) {
    case R_NIL: break;
    case R_TRUE: v.type = MSGPACK_OBJECT_BOOLEAN; v.via.boolean = true; break;
    case R_STR: v = o_str(t, "x", 1); break;
    case R_EMPTY_MAP: v.type = MSGPACK_OBJECT_MAP; break;
    case R_EMPTY_ARRAY: v.type = MSGPACK_OBJECT_ARRAY; break;
    case R_UINT: v = o_uint(c->n); break;
    case R_NEG: v = o_int(-1); break;
    case R_FLOAT: v = o_f64(1.5); break;
    case R_NAN: v = o_f64(NAN); break;
    case R_INF: v = o_f64(INFINITY); break;
    case R_HUGE: v = o_f64(1e39); break;
    case R_NUL_STR: v = o_str(t, "a\0b", 3); break;
    case R_BAD_UTF8: v = o_str(t, "a\xC0\xAF" "b", 4); break;
    case R_LONG: v = o_fill(t, c->n); break;
    case R_BIN:
        v.type = MSGPACK_OBJECT_BIN;
        v.via.bin.ptr = zalloc(t, c->n);
        memset((char *)v.via.bin.ptr, 0, c->n);
        v.via.bin.size = (uint32_t)c->n;
        break;
    case R_GROW: {
        cr_assert_eq(o->type, MSGPACK_OBJECT_ARRAY);
        cr_assert_gt(o->via.array.size, 0);
        msgpack_object *e = zalloc(t, sizeof *e * c->n);
        for (uint64_t i = 0; i < c->n; i++) e[i] = o->via.array.ptr[0];
        v.type = MSGPACK_OBJECT_ARRAY;
        v.via.array.ptr = e;
        v.via.array.size = (uint32_t)c->n;
        break;
    }
    default: cr_assert_fail("bad replacement"); break;
    }
    *o = v;
}

static void run_bad_fields(const bad_field_t *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        tree_t t;
        msgpack_object *root = tree_open(&t, cases[i].k);
        apply(&t, root, &cases[i]);
        expect_reject_tree(cases[i].k, root, cases[i].want);
        tree_close(&t);
    }
}

#define UINT32_PAST ((uint64_t)UINT32_MAX + 1)

PROTO_TEST(task_bad_fields) {
    static const bad_field_t c[] = {
        {K_TASK, "task", R_STR, 0, "task: field 'task' must be an unsigned integer"},
        {K_TASK, "task", R_FLOAT, 0, "task: field 'task' must be an unsigned integer"},
        {K_TASK, "task", R_NEG, 0, "task: field 'task' out of range"},
        {K_TASK, "task", R_DEL, 0, "task: missing field 'task'"},
        {K_TASK, "job", R_UINT, 1, "task: field 'job' must be a string"},
        {K_TASK, "job", R_NIL, 0, "task: field 'job' must be a string"},
        {K_TASK, "job", R_BIN, 2, "task: field 'job' must be a string"},
        {K_TASK, "job", R_NUL_STR, 0, "task: field 'job' contains a NUL byte"},
        {K_TASK, "job", R_BAD_UTF8, 0, "task: field 'job' is not valid UTF-8 (byte 1)"},
        {K_TASK, "job", R_LONG, ID_LEN + 1, "task: field 'job' is longer than 63 bytes"},
        {K_TASK, "job", R_DEL, 0, "task: missing field 'job'"},
        {K_TASK, "ver", R_UINT, UINT32_PAST, "task: field 'ver' out of range"},
        {K_TASK, "ver", R_NEG, 0, "task: field 'ver' out of range"},
        {K_TASK, "ver", R_TRUE, 0, "task: field 'ver' must be an unsigned integer"},
        {K_TASK, "kind", R_UINT, 2, "task: field 'kind' out of range"},
        {K_TASK, "kind", R_STR, 0, "task: field 'kind' must be an unsigned integer"},
        {K_TASK, "g", R_STR, 0, "task: field 'g' must be an unsigned integer"},
        {K_TASK, "g", R_UINT, PROTO_MAX_SAMPLES + 1, "task: field 'g' out of range"},
        {K_TASK, "g", R_NEG, 0, "task: field 'g' out of range"},
        {K_TASK, "max_new", R_UINT, PROTO_MAX_TOKENS + 1, "task: field 'max_new' out of range"},
        {K_TASK, "max_new", R_EMPTY_ARRAY, 0, "task: field 'max_new' must be an unsigned integer"},
        {K_TASK, "temp", R_STR, 0, "task: field 'temp' must be a number"},
        {K_TASK, "temp", R_NAN, 0, "task: field 'temp' must be finite"},
        {K_TASK, "temp", R_INF, 0, "task: field 'temp' must be finite"},
        {K_TASK, "temp", R_HUGE, 0, "task: field 'temp' out of range for a 32-bit float"},
        {K_TASK, "temp", R_DEL, 0, "task: missing field 'temp'"},
        {K_TASK, "top_p", R_TRUE, 0, "task: field 'top_p' must be a number"},
        {K_TASK, "top_k", R_UINT, UINT32_PAST, "task: field 'top_k' out of range"},
        {K_TASK, "seed", R_NEG, 0, "task: field 'seed' out of range"},
        {K_TASK, "seed", R_FLOAT, 0, "task: field 'seed' must be an unsigned integer"},
        {K_TASK, "items", R_EMPTY_MAP, 0, "task: field 'items' must be an array"},
        {K_TASK, "items", R_GROW, PROTO_MAX_ITEMS + 1, "task: field 'items' has 1025 elements, more than 1024"},
        {K_TASK, "items", R_DEL, 0, "task: missing field 'items'"},
        {K_TASK, "items/1", R_STR, 0, "task: field 'items[1]' must be a map"},
        {K_TASK, "items/0/i", R_NEG, 0, "task: field 'items[0].i' out of range"},
        {K_TASK, "items/2/i", R_DEL, 0, "task: missing field 'items[2].i'"},
        {K_TASK, "items/0/p", R_LONG, PROTO_MAX_TEXT + 1, "task: field 'items[0].p' is longer than 131072 bytes"},
        {K_TASK, "items/1/p", R_BIN, 1, "task: field 'items[1].p' must be a string"},
        {K_TASK, "items/0/p", R_NUL_STR, 0, "task: field 'items[0].p' contains a NUL byte"},
        {K_TASK, "items/0/p", R_BAD_UTF8, 0, "task: field 'items[0].p' is not valid UTF-8 (byte 1)"},
        {K_TASK, "end", R_UINT, 2, "task: field 'end' out of range"},
        {K_TASK, "end", R_NEG, 0, "task: field 'end' out of range"},
        {K_TASK, "end", R_STR, 0, "task: field 'end' must be an unsigned integer"},
        {K_TASK, "end", R_TRUE, 0, "task: field 'end' must be an unsigned integer"},
    };
    run_bad_fields(c, sizeof c / sizeof c[0]);
}

PROTO_TEST(batch_bad_fields) {
    static const bad_field_t c[] = {
        {K_DONE, "task", R_NEG, 0, "done: field 'task' out of range"},
        {K_DONE, "job", R_LONG, ID_LEN + 1, "done: field 'job' is longer than 63 bytes"},
        {K_DONE, "ver", R_UINT, UINT32_PAST, "done: field 'ver' out of range"},
        {K_DONE, "kind", R_UINT, 2, "done: field 'kind' out of range"},
        {K_DONE, "temp", R_INF, 0, "done: field 'temp' must be finite"},
        {K_DONE, "temp", R_STR, 0, "done: field 'temp' must be a number"},
        {K_DONE, "worker", R_NIL, 0, "done: field 'worker' must be a string"},
        {K_DONE, "worker", R_LONG, ID_LEN + 1, "done: field 'worker' is longer than 63 bytes"},
        {K_DONE, "gen_s", R_NAN, 0, "done: field 'gen_s' must be finite"},
        {K_DONE, "gen_s", R_STR, 0, "done: field 'gen_s' must be a number"},
        {K_DONE, "groups", R_STR, 0, "done: field 'groups' must be an array"},
        {K_DONE, "groups", R_GROW, PROTO_MAX_ITEMS + 1, "done: field 'groups' has 1025 elements"},
        {K_DONE, "groups/1", R_EMPTY_ARRAY, 0, "done: field 'groups[1]' must be a map"},
        {K_DONE, "groups/0/i", R_STR, 0, "done: field 'groups[0].i' must be an unsigned integer"},
        {K_DONE, "groups/0/p", R_GROW, PROTO_MAX_TOKENS + 1, "done: field 'groups[0].p' has 8193 elements"},
        {K_DONE, "groups/0/p", R_BIN, 4, "done: field 'groups[0].p' must be an array"},
        {K_DONE, "groups/0/p/1", R_NEG, 0, "done: field 'groups[0].p[1]' must be a token id"},
        {K_DONE, "groups/0/p/0", R_UINT, (uint64_t)INT32_MAX + 1, "done: field 'groups[0].p[0]' must be a token id"},
        {K_DONE, "groups/0/p/0", R_FLOAT, 0, "done: field 'groups[0].p[0]' must be a token id"},
        {K_DONE, "groups/0/s", R_GROW, PROTO_MAX_SAMPLES + 1, "done: field 'groups[0].s' has 257 elements"},
        {K_DONE, "groups/0/s", R_DEL, 0, "done: missing field 'groups[0].s'"},
        {K_DONE, "groups/0/s/1", R_STR, 0, "done: field 'groups[0].s[1]' must be a map"},
        {K_DONE, "groups/0/s/0/tok", R_GROW, PROTO_MAX_TOKENS + 1, "done: field 'groups[0].s[0].tok' has 8193"},
        {K_DONE, "groups/0/s/0/tok/3", R_STR, 0, "done: field 'groups[0].s[0].tok[3]' must be a token id"},
        {K_DONE, "groups/0/s/0/tok/2", R_NEG, 0, "done: field 'groups[0].s[0].tok[2]' must be a token id"},
        {K_DONE, "groups/0/s/0/lp", R_BIN, 15, "done: field 'groups[0].s[0].lp' has 15 bytes"},
        {K_DONE, "groups/0/s/1/lp", R_BIN, 4, "done: field 'groups[0].s[1].lp' has 4 bytes"},
        {K_DONE, "groups/0/s/0/lp", R_EMPTY_ARRAY, 0, "done: field 'groups[0].s[0].lp' must be a binary"},
        {K_DONE, "groups/0/s/0/lp", R_DEL, 0, "done: missing field 'groups[0].s[0].lp'"},
        {K_DONE, "groups/0/s/0/text", R_LONG, PROTO_MAX_TEXT + 1, "done: field 'groups[0].s[0].text' is longer"},
        {K_DONE, "groups/0/s/0/text", R_NUL_STR, 0, "done: field 'groups[0].s[0].text' contains a NUL byte"},
        {K_DONE, "groups/0/s/0/text", R_BAD_UTF8, 0, "done: field 'groups[0].s[0].text' is not valid UTF-8 (byte 1)"},
        {K_DONE, "groups/0/s/1/text", R_NIL, 0, "done: field 'groups[0].s[1].text' must be a string"},
        {K_DONE, "groups/0/s/0/fin", R_UINT, 0, "done: field 'groups[0].s[0].fin' out of range"},
        {K_DONE, "groups/0/s/0/fin", R_UINT, 4, "done: field 'groups[0].s[0].fin' out of range"},
        {K_DONE, "groups/0/s/0/r", R_NAN, 0, "done: field 'groups[0].s[0].r' must be finite"},
        {K_DONE, "groups/0/s/0/r", R_STR, 0, "done: field 'groups[0].s[0].r' must be a number"},
        {K_DONE, "groups/0/s/0/fail", R_UINT, 1, "done: field 'groups[0].s[0].fail' must be a boolean"},
        {K_DONE, "groups/0/s/1/fail", R_DEL, 0, "done: missing field 'groups[0].s[1].fail'"},
        {K_SCORED, "groups/0/s/1/r", R_HUGE, 0, "scored: field 'groups[0].s[1].r' out of range"},
        {K_SCORED, "worker", R_DEL, 0, "scored: missing field 'worker'"},
    };
    run_bad_fields(c, sizeof c / sizeof c[0]);
}

PROTO_TEST(report_adapter_bad_fields) {
    static const bad_field_t c[] = {
        {K_REPORT, "kind", R_UINT, 0, "report: field 'kind' out of range"},
        {K_REPORT, "kind", R_UINT, 5, "report: field 'kind' out of range"},
        {K_REPORT, "kind", R_STR, 0, "report: field 'kind' must be an unsigned integer"},
        {K_REPORT, "job", R_DEL, 0, "report: missing field 'job'"},
        {K_REPORT, "src", R_LONG, ID_LEN + 1, "report: field 'src' is longer than 63 bytes"},
        {K_REPORT, "task", R_FLOAT, 0, "report: field 'task' must be an unsigned integer"},
        {K_REPORT, "tk", R_UINT, 2, "report: field 'tk' out of range"},
        {K_REPORT, "n", R_UINT, UINT32_PAST, "report: field 'n' out of range"},
        {K_REPORT, "rsum", R_INF, 0, "report: field 'rsum' must be finite"},
        {K_REPORT, "rsum", R_NIL, 0, "report: field 'rsum' must be a number"},
        {K_REPORT, "correct", R_NEG, 0, "report: field 'correct' out of range"},
        {K_REPORT, "errors", R_STR, 0, "report: field 'errors' must be an unsigned integer"},
        {K_REPORT, "step", R_UINT, UINT32_PAST, "report: field 'step' out of range"},
        {K_REPORT, "ver", R_DEL, 0, "report: missing field 'ver'"},
        {K_REPORT, "error", R_UINT, 1, "report: field 'error' must be a string or nil"},
        {K_REPORT, "error", R_LONG, PROTO_MAX_STR + 1, "report: field 'error' is longer than 4096 bytes"},
        {K_ADAPTER, "job", R_LONG, ID_LEN + 1, "adapter: field 'job' is longer than 63 bytes"},
        {K_ADAPTER, "job", R_EMPTY_MAP, 0, "adapter: field 'job' must be a string"},
        {K_ADAPTER, "ver", R_UINT, UINT32_PAST, "adapter: field 'ver' out of range"},
        {K_ADAPTER, "step", R_NEG, 0, "adapter: field 'step' out of range"},
        {K_ADAPTER, "step", R_DEL, 0, "adapter: missing field 'step'"},
    };
    run_bad_fields(c, sizeof c / sizeof c[0]);
}

PROTO_TEST(reward_bad_fields) {
    static const bad_field_t c[] = {
        {K_RREQ, "id", R_NEG, 0, "reward_req: field 'id' out of range"},
        {K_RREQ, "job", R_LONG, ID_LEN + 1, "reward_req: field 'job' is longer than 63 bytes"},
        {K_RREQ, "prompt", R_LONG, PROTO_MAX_TEXT + 1, "reward_req: field 'prompt' is longer than 131072 bytes"},
        {K_RREQ, "prompt", R_DEL, 0, "reward_req: missing field 'prompt'"},
        {K_RREQ, "completions", R_GROW, PROTO_MAX_SAMPLES + 1, "reward_req: field 'completions' has 257 elements"},
        {K_RREQ, "completions", R_STR, 0, "reward_req: field 'completions' must be an array"},
        {K_RREQ, "completions/0", R_UINT, 1, "reward_req: field 'completions[0]' must be a string"},
        {K_RREQ, "completions/2", R_LONG, PROTO_MAX_TEXT + 1, "reward_req: field 'completions[2]' is longer"},
        {K_RREQ, "completions/1", R_NUL_STR, 0, "reward_req: field 'completions[1]' contains a NUL byte"},
        {K_RREQ, "completions/1", R_BAD_UTF8, 0, "reward_req: field 'completions[1]' is not valid UTF-8 (byte 1)"},
        {K_RREQ, "meta", R_UINT, 3, "reward_req: field 'meta' must be a string or nil"},
        {K_RREQ, "meta", R_LONG, PROTO_MAX_STR + 1, "reward_req: field 'meta' is longer than 4096 bytes"},
        {K_RREP, "id", R_STR, 0, "reward_rep: field 'id' must be an unsigned integer"},
        {K_RREP, "rewards", R_GROW, PROTO_MAX_SAMPLES + 1, "reward_rep: field 'rewards' has 257 elements"},
        {K_RREP, "rewards", R_DEL, 0, "reward_rep: missing field 'rewards'"},
        {K_RREP, "rewards", R_EMPTY_MAP, 0, "reward_rep: field 'rewards' must be an array"},
        {K_RREP, "rewards/1", R_STR, 0, "reward_rep: field 'rewards[1]' must be a number"},
        {K_RREP, "rewards/0", R_NAN, 0, "reward_rep: field 'rewards[0]' must be finite"},
        {K_RREP, "rewards/4", R_INF, 0, "reward_rep: field 'rewards[4]' must be finite"},
        {K_RREP, "error", R_UINT, 1, "reward_rep: field 'error' must be a string or nil"},
        {K_RREP, "error", R_LONG, PROTO_MAX_STR + 1, "reward_rep: field 'error' is longer than 4096 bytes"},
    };
    run_bad_fields(c, sizeof c / sizeof c[0]);
}

PROTO_TEST(req_rep_bad_fields) {
    static const bad_field_t c[] = {
        {K_REQ, "id", R_STR, 0, "req: field 'id' must be an unsigned integer"},
        {K_REQ, "op", R_LONG, ID_LEN + 1, "req: field 'op' is longer than 63 bytes"},
        {K_REQ, "op", R_NIL, 0, "req: field 'op' must be a string"},
        {K_REQ, "token", R_LONG, PROTO_MAX_STR + 1, "req: field 'token' is longer than 4096 bytes"},
        {K_REQ, "token", R_DEL, 0, "req: missing field 'token'"},
        {K_REQ, "args", R_EMPTY_ARRAY, 0, "req: field 'args' must be a map"},
        {K_REQ, "args", R_DEL, 0, "req: missing field 'args'"},
        {K_REQ, "args/s", R_LONG, PROTO_MAX_STR + 1, "req: field 'args.s' is longer than 4096 bytes"},
        {K_REQ, "args/s", R_NUL_STR, 0, "req: field 'args.s' contains a NUL byte"},
        {K_REQ, "args/s", R_BAD_UTF8, 0, "req: field 'args.s' is not valid UTF-8 (byte 1)"},
        {K_REQ, "args/p", R_UINT, (uint64_t)INT64_MAX + 1, "req: field 'args.p' out of range"},
        {K_REQ, "args/f", R_NAN, 0, "req: field 'args.f' must be finite"},
        {K_REQ, "args/b", R_EMPTY_ARRAY, 0, "req: field 'args.b' must be nil, a boolean"},
        {K_REQ, "args/z", R_EMPTY_MAP, 0, "req: field 'args.z' must be nil, a boolean"},
        {K_REP, "id", R_NEG, 0, "rep: field 'id' out of range"},
        {K_REP, "ok", R_UINT, 1, "rep: field 'ok' must be a boolean"},
        {K_REP, "ok", R_DEL, 0, "rep: missing field 'ok'"},
        {K_REP, "error", R_UINT, 5, "rep: field 'error' must be a string or nil"},
        {K_REP, "result", R_DEL, 0, "rep: missing field 'result'"},
        {K_REP, "result", R_STR, 0, "rep: field 'result' must be a map"},
        {K_REP, "result/job", R_LONG, PROTO_MAX_STR + 1, "rep: field 'result.job' is longer than 4096 bytes"},
    };
    run_bad_fields(c, sizeof c / sizeof c[0]);
}

// Argument maps: too many entries, long / duplicate / non-string keys; each value kind accepted.
PROTO_TEST(args_bad_maps) {
    tree_t t;
    msgpack_object *root = tree_open(&t, K_REQ);
    msgpack_object *args = tree_at(root, "args", NULL);
    for (int i = (int)args->via.map.size; i <= PROTO_MAX_ARGS; i++) {
        char key[24];
        snprintf(key, sizeof key, "extra%d", i);
        tree_add(&t, args, o_str(&t, key, strlen(key)), o_int(i));
    }
    expect_reject_tree(K_REQ, root, "req: field 'args' has 65 entries, more than 64");
    tree_close(&t);

    root = tree_open(&t, K_REQ);
    tree_add(&t, tree_at(root, "args", NULL), o_str(&t, "n", 1), o_int(1));
    expect_reject_tree(K_REQ, root, "req: duplicate key 'args.n'");
    tree_close(&t);

    root = tree_open(&t, K_REQ);
    tree_add(&t, tree_at(root, "args", NULL), o_fill(&t, ID_LEN + 1), o_int(1));
    expect_reject_tree(K_REQ, root, "req: field 'args' has a key longer than 63 bytes");
    tree_close(&t);

    root = tree_open(&t, K_REQ);
    tree_add(&t, tree_at(root, "args", NULL), o_uint(3), o_int(1));
    expect_reject_tree(K_REQ, root, "req: field 'args' has a key that is not a string");
    tree_close(&t);

    root = tree_open(&t, K_REQ);
    tree_add(&t, tree_at(root, "args", NULL), o_str(&t, "k\0", 2), o_int(1));
    expect_reject_tree(K_REQ, root, "req: field 'args' has a key that contains a NUL byte");
    tree_close(&t);

    root = tree_open(&t, K_REQ);
    tree_add(&t, tree_at(root, "args", NULL), o_str(&t, "k\xFF", 2), o_int(1));
    expect_reject_tree(K_REQ, root, "req: field 'args' has a key that is not valid UTF-8");
    tree_close(&t);

    // A key of exactly ID_LEN bytes and a positive INT64_MAX are fine.
    root = tree_open(&t, K_REP);
    tree_add(&t, tree_at(root, "result", NULL), o_fill(&t, ID_LEN), o_uint(INT64_MAX));
    expect_accept_tree(K_REP, root);
    tree_close(&t);
}

// Cross-field rules of the replies.
PROTO_TEST(reply_rules) {
    tree_t t;
    msgpack_object *root = tree_open(&t, K_RREP);
    *tree_at(root, "error", NULL) = o_str(&t, "down", 4);
    expect_reject_tree(K_RREP, root, "reward_rep: field 'rewards' must be nil when 'error' is set");
    tree_delete(root, "rewards");
    expect_accept_tree(K_RREP, root);
    tree_close(&t);

    // Rewards may be integers (a service in another language may send 1 rather than 1.0).
    root = tree_open(&t, K_RREP);
    tree_delete(root, "error");
    *tree_at(root, "rewards/0", NULL) = o_uint(1);
    *tree_at(root, "rewards/1", NULL) = o_int(-3);
    msgpack_sbuffer sb;
    tree_pack(root, &sb);
    proto_reward_rep_t r;
    char err[ERR_LEN];
    cr_assert_eq(proto_reward_rep_decode(sb.data, sb.size, &r, err), 0, "%s", err);
    cr_assert_eq(r.rewards[0], 1.0);
    cr_assert_eq(r.rewards[1], -3.0);
    cr_assert_null(r.error);
    proto_reward_rep_free(&r);
    msgpack_sbuffer_destroy(&sb);
    tree_close(&t);

    // Float fields take integers; f32 fields written as float64 are narrowed.
    root = tree_open(&t, K_TASK);
    *tree_at(root, "temp", NULL) = o_uint(2);
    *tree_at(root, "top_p", NULL) = o_f64(0.1);
    tree_pack(root, &sb);
    proto_task_t tk;
    cr_assert_eq(proto_task_decode(sb.data, sb.size, &tk, err), 0, "%s", err);
    cr_assert_eq(tk.temperature, 2.0f);
    cr_assert_eq(tu_f2u(tk.top_p), tu_f2u(0.1f));
    proto_task_free(&tk);
    msgpack_sbuffer_destroy(&sb);
    tree_close(&t);

    // A failed reply must say why.
    root = tree_open(&t, K_REP);
    tree_at(root, "ok", NULL)->via.boolean = false;
    expect_reject_tree(K_REP, root, "rep: field 'error' must be a string when 'ok' is false");
    tree_close(&t);

    // nil-able fields may be absent.
    root = tree_open(&t, K_REPORT);
    tree_delete(root, "error");
    expect_accept_tree(K_REPORT, root);
    tree_close(&t);
    root = tree_open(&t, K_RREQ);
    tree_delete(root, "meta");
    expect_accept_tree(K_RREQ, root);
    tree_close(&t);
}

// Header: wrong / missing "t" and "v", for every message type.
PROTO_TEST(header_checks) {
    for (kind_t k = 0; k < K_N; k++) {
        tree_t t;
        char want[96];
        msgpack_object *root = tree_open(&t, k);
        tree_at(root, "v", NULL)->via.u64 = 2;
        expect_reject_tree(k, root, "unsupported protocol version 2");
        tree_at(root, "v", NULL)->via.u64 = 0;
        expect_reject_tree(k, root, "unsupported protocol version 0");
        *tree_at(root, "v", NULL) = o_int(-1);
        expect_reject_tree(k, root, "unsupported protocol version -1");
        *tree_at(root, "v", NULL) = o_str(&t, "1", 1);
        expect_reject_tree(k, root, "field 'v' must be an unsigned integer");
        tree_delete(root, "v");
        expect_reject_tree(k, root, "missing field 'v'");
        tree_close(&t);

        root = tree_open(&t, k);
        const char *other = kind_type[(k + 1) % K_N];
        *tree_at(root, "t", NULL) = o_str(&t, other, strlen(other));
        snprintf(want, sizeof want, "%s: expected message type '%s', got '%s'", kind_type[k], kind_type[k], other);
        expect_reject_tree(k, root, want);
        *tree_at(root, "t", NULL) = o_uint(1);
        expect_reject_tree(k, root, "field 't' must be a string");
        tree_delete(root, "t");
        expect_reject_tree(k, root, "missing field 't'");
        tree_close(&t);

        // A listed key twice is ambiguous; an unknown key is ignored.
        root = tree_open(&t, k);
        tree_add(&t, root, o_str(&t, "v", 1), o_uint(PROTO_VERSION));
        expect_reject_tree(k, root, "duplicate field 'v'");
        tree_close(&t);
        root = tree_open(&t, k);
        tree_add(&t, root, o_str(&t, "future_field", 12), o_f64(1.0));
        expect_accept_tree(k, root);
        tree_add(&t, root, o_uint(7), o_uint(1));
        expect_reject_tree(k, root, "has a key that is not a string");
        tree_close(&t);

        // A frame of one type given to every other decoder.
        proto_buf_t b;
        fixture(k, &b);
        for (kind_t j = 0; j < K_N; j++)
            if (j != k) expect_reject_bytes(j, b.data, b.len, "expected message type");
        proto_buf_free(&b);
    }
    // Nested duplicates too.
    tree_t t;
    msgpack_object *root = tree_open(&t, K_DONE);
    tree_add(&t, tree_at(root, "groups/0/s/0", NULL), o_str(&t, "tok", 3), o_uint(1));
    expect_reject_tree(K_DONE, root, "done: duplicate field 'groups[0].s[0].tok'");
    tree_close(&t);
}

// --- hostile bytes ---------------------------------------------------------------------------------

PROTO_TEST(truncated_frames) {
    char err[ERR_LEN];
    for (kind_t k = 0; k < K_N; k++) {
        proto_buf_t b;
        fixture(k, &b);
        for (size_t n = 0; n < b.len; n++) {
            // A copy of exactly n bytes, so a read past the prefix is caught.
            uint8_t *p = malloc(n ? n : 1);
            memcpy(p, b.data, n);
            cr_assert_eq(decode_check(k, p, n, err), -1, "%s prefix of %zu / %zu bytes accepted", kind_type[k], n,
                         b.len);
            char type[32];
            if (proto_peek_type(p, n, type, err) == 0) cr_assert_str_eq(type, kind_type[k]);
            free(p);
        }
        proto_buf_free(&b);
    }
}

PROTO_TEST(trailing_bytes_and_non_maps) {
    for (kind_t k = 0; k < K_N; k++) {
        proto_buf_t b;
        fixture(k, &b);
        size_t n = b.len;
        b.data = realloc(b.data, 2 * n);
        memcpy(b.data + n, b.data, n);
        expect_reject_bytes(k, b.data, n + 1, "1 trailing bytes after the message");
        expect_reject_bytes(k, b.data, 2 * n, "trailing bytes");
        proto_buf_free(&b);

        static const uint8_t arr[] = {0x93, 0x01, 0x02, 0x03};
        static const uint8_t str[] = {0xa4, 't', 'a', 's', 'k'};
        static const uint8_t one[] = {0x01};
        static const uint8_t nil[] = {0xc0};
        static const uint8_t bad[] = {0xc1};
        // A valid array holding what a task map would hold.
        static const uint8_t arr_like[] = {0x94, 0xa1, 't', 0xa4, 't', 'a', 's', 'k'};
        expect_reject_bytes(k, arr, sizeof arr, "frame is an array, not a MessagePack map");
        expect_reject_bytes(k, str, sizeof str, "frame is a string, not a MessagePack map");
        expect_reject_bytes(k, one, sizeof one, "not a MessagePack map");
        expect_reject_bytes(k, nil, sizeof nil, "not a MessagePack map");
        expect_reject_bytes(k, bad, sizeof bad, "not a complete MessagePack object");
        expect_reject_bytes(k, arr_like, sizeof arr_like, "not a complete MessagePack object");
        expect_reject_bytes(k, arr_like, 0, "empty frame");
        expect_reject_bytes(k, NULL, 0, "empty frame");
        char err[ERR_LEN], type[32];
        cr_assert_eq(proto_peek_type(arr, sizeof arr, type, err), -1);
        cr_assert_eq(proto_peek_type(str, sizeof str, type, err), -1);
        cr_assert_eq(proto_peek_type(NULL, 0, type, err), -1);
    }
}

static long vm_peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    cr_assert_not_null(f, "/proc/self/status is needed to measure the address space");
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmPeak:", 7) == 0) kb = atol(line + 7);
    fclose(f);
    cr_assert_gt(kb, 0);
    return kb;
}

// Headers that declare far more elements than the frame holds. msgpack-c would size its object
// array from the declared count (2^32-1 elements: ~128 GiB), so this checks the decoders neither
// crash nor grow the address space for them.
PROTO_TEST(huge_declared_lengths) {
    static const uint8_t frames[][16] = {
        {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02, 0x03},                      // array 32
        {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 't', 0xa4, 't', 'a', 's', 'k'},   // map 32
        {0xdc, 0xff, 0xff, 0xc0},                                              // array 16
        {0xde, 0xff, 0xff, 0xc0, 0xc0},                                        // map 16
        {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'},                                   // str 32
        {0xc6, 0xff, 0xff, 0xff, 0xff, 0x00},                                  // bin 32
        {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00},                            // ext 32
        {0x91, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0},                            // nested
        {0x81, 0xa1, 'x', 0xdf, 0x7f, 0xff, 0xff, 0xff, 0xc0},                 // map value
        {0xdd, 0x04, 0x00, 0x00, 0x00, 0x90, 0x90, 0x90},                      // 2^26 elements
    };
    static const size_t lens[] = {8, 12, 4, 5, 6, 6, 7, 7, 9, 8};
    long before = vm_peak_kb();
    char err[ERR_LEN], type[32];
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (kind_t k = 0; k < K_N; k++) {
            expect_reject_bytes(k, frames[i], lens[i], NULL);
            cr_assert_eq(proto_peek_type(frames[i], lens[i], type, err), -1, "frame %zu", i);
        }
    long grown = vm_peak_kb() - before;
    cr_assert_lt(grown, 64 * 1024, "address space grew by %ld KiB", grown);

    // A valid header, then a field whose array claims 2^32-1 elements.
    uint8_t f[64];
    size_t n = 0;
    f[n++] = 0x83;
    f[n++] = 0xa1; f[n++] = 't';
    f[n++] = 0xa4; memcpy(f + n, "task", 4); n += 4;
    f[n++] = 0xa1; f[n++] = 'v';
    f[n++] = PROTO_VERSION;
    f[n++] = 0xa5; memcpy(f + n, "items", 5); n += 5;
    f[n++] = 0xdd; f[n++] = 0xff; f[n++] = 0xff; f[n++] = 0xff; f[n++] = 0xff;
    f[n++] = 0x82; f[n++] = 0xa1; f[n++] = 'i'; f[n++] = 0x00; f[n++] = 0xa1; f[n++] = 'p'; f[n++] = 0xa0;
    expect_reject_bytes(K_TASK, f, n, "not a complete MessagePack object");
    cr_assert_eq(proto_peek_type(f, n, type, err), 0, "%s", err);   // "t" and "v" come first
    cr_assert_str_eq(type, "task");
}

static void mutate_all_kinds(uint64_t seed, int iterations) {
    proto_buf_t fx[K_N];
    for (kind_t k = 0; k < K_N; k++) fixture(k, &fx[k]);
    int accepted = 0;
    char err[ERR_LEN], type[32];
    for (int it = 0; it < iterations; it++) {
        kind_t k = (kind_t)(it % K_N);
        size_t n = fx[k].len;
        uint8_t *p = malloc(n);
        memcpy(p, fx[k].data, n);
        size_t pos = rnd_next(&seed) % n;
        p[pos] ^= (uint8_t)(1 + rnd_next(&seed) % 255);
        if (decode_check(k, p, n, err) == 0) accepted++;
        proto_peek_type(p, n, type, err);
        free(p);
    }
    // Most single-byte changes land in a string or a number and still decode; some must not.
    cr_assert_gt(accepted, 0);
    cr_assert_lt(accepted, iterations);
    for (kind_t k = 0; k < K_N; k++) proto_buf_free(&fx[k]);
}

PROTO_TEST(bit_flips) {
    mutate_all_kinds(0x5eed0001u, 2000);
}

PROTO_TEST(random_garbage) {
    uint64_t seed = 0x5eed0002u;
    proto_buf_t fx[K_N];
    for (kind_t k = 0; k < K_N; k++) fixture(k, &fx[k]);
    char err[ERR_LEN], type[32];
    for (int it = 0; it < 5000; it++) {
        size_t n = rnd_next(&seed) % 512;
        uint8_t *p = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd_next(&seed);
        // A third start like a map, a third with the start of a valid frame, so the decoders
        // get past the first byte.
        int style = it % 3;
        if (style == 1 && n) p[0] = (uint8_t)(0x80 | (rnd_next(&seed) & 0x0f));
        if (style == 2) {
            const proto_buf_t *v = &fx[rnd_next(&seed) % K_N];
            size_t keep = rnd_next(&seed) % (v->len + 1);
            memcpy(p, v->data, keep < n ? keep : n);
        }
        for (kind_t k = 0; k < K_N; k++) decode_check(k, p, n, err);
        if (proto_peek_type(p, n, type, err) == 0) cr_assert_lt(strlen(type), 32);
        free(p);
    }
    for (kind_t k = 0; k < K_N; k++) proto_buf_free(&fx[k]);
}

// --- peek ---------------------------------------------------------------------------------------------

PROTO_TEST(peek_type) {
    char err[ERR_LEN], type[32];
    for (kind_t k = 0; k < K_N; k++) {
        proto_buf_t b;
        fixture(k, &b);
        cr_assert_eq(proto_peek_type(b.data, b.len, type, err), 0, "%s", err);
        cr_assert_str_eq(type, kind_type[k]);
        // Only "t" and "v" are read: a frame cut after them still peeks (the map header is one
        // byte up to 15 entries, three beyond).
        size_t head = (b.data[0] == 0xde ? 3 : 1) + 2 + 1 + strlen(kind_type[k]) + 2 + 1;
        cr_assert_eq(proto_peek_type(b.data, head, type, err), 0, "%s", err);
        cr_assert_str_eq(type, kind_type[k]);
        cr_assert_eq(proto_peek_type(b.data, head - 1, type, err), -1);
        proto_buf_free(&b);
    }

    tree_t t;
    msgpack_object *root = tree_open(&t, K_ADAPTER);
    msgpack_sbuffer sb;
    tree_at(root, "v", NULL)->via.u64 = 9;
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), -1);
    cr_assert_not_null(strstr(err, "unsupported protocol version 9"), "%s", err);
    cr_assert_str_eq(type, "");
    msgpack_sbuffer_destroy(&sb);
    tree_delete(root, "v");
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), -1);
    cr_assert_not_null(strstr(err, "missing field 'v'"), "%s", err);
    msgpack_sbuffer_destroy(&sb);
    tree_close(&t);

    // "t" and "v" found anywhere in the map, after other keys.
    root = tree_open(&t, K_ADAPTER);
    msgpack_object_kv *kv = root->via.map.ptr, tmp = kv[0];
    kv[0] = kv[root->via.map.size - 1];
    kv[root->via.map.size - 1] = tmp;
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), 0, "%s", err);
    cr_assert_str_eq(type, "adapter");
    msgpack_sbuffer_destroy(&sb);

    *tree_at(root, "t", NULL) = o_fill(&t, 31);
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), 0, "%s", err);
    cr_assert_eq(strlen(type), 31);
    msgpack_sbuffer_destroy(&sb);
    *tree_at(root, "t", NULL) = o_fill(&t, 32);
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), -1);
    msgpack_sbuffer_destroy(&sb);
    *tree_at(root, "t", NULL) = o_str(&t, "a\0b", 3);
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), -1);
    msgpack_sbuffer_destroy(&sb);
    *tree_at(root, "t", NULL) = o_uint(3);
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), -1);
    cr_assert_not_null(strstr(err, "field 't' must be a string"), "%s", err);
    msgpack_sbuffer_destroy(&sb);
    tree_delete(root, "t");
    tree_pack(root, &sb);
    cr_assert_eq(proto_peek_type(sb.data, sb.size, type, err), -1);
    cr_assert_not_null(strstr(err, "missing field 't'"), "%s", err);
    msgpack_sbuffer_destroy(&sb);
    tree_close(&t);
}

// --- encoders ---------------------------------------------------------------------------------------

// An encoder refuses what its decoder would reject and leaves the buffer as it was.
static void expect_encode_fails(int rc, const proto_buf_t *b, size_t len_before, const char *what) {
    cr_assert_eq(rc, -1, "encoder accepted %s", what);
    cr_assert_eq(b->len, len_before, "encoder left bytes behind for %s", what);
}

PROTO_TEST(encoders_reject_invalid_messages) {
    proto_buf_t b = {0};
    proto_adapter_event_t ad = fx_adapter();
    cr_assert_eq(proto_adapter_event_encode(&ad, &b), 0);   // something already in the buffer
    size_t keep = b.len;
    char *long_id = filled(ID_LEN + 1, 'x'), *long_str = filled(PROTO_MAX_STR + 1, 'x');
    char *long_text = filled(PROTO_MAX_TEXT + 1, 'x');

    proto_task_t t;
#define TASK_CASE(stmt, what)                                                  \
    do {                                                                       \
        t = fx_task();                                                         \
        stmt;                                                                  \
        expect_encode_fails(proto_task_encode(&t, &b), &b, keep, what);        \
    } while (0)
    TASK_CASE(t.job = NULL, "task without job");
    TASK_CASE(t.job = long_id, "task job too long");
    TASK_CASE(t.kind = (proto_kind_t)2, "task kind 2");
    TASK_CASE(t.group = PROTO_MAX_SAMPLES + 1, "task g too large");
    TASK_CASE(t.max_new = PROTO_MAX_TOKENS + 1, "task max_new too large");
    TASK_CASE(t.temperature = NAN, "task temp NaN");
    TASK_CASE(t.top_p = INFINITY, "task top_p inf");
    TASK_CASE(t.n_items = PROTO_MAX_ITEMS + 1, "task with too many items");
    TASK_CASE(t.items = NULL, "task items NULL");
    TASK_CASE(fx_items[1].prompt = NULL, "task prompt NULL");
    TASK_CASE(fx_items[0].prompt = long_text, "task prompt too long");
#undef TASK_CASE

    proto_batch_t ba;
#define BATCH_CASE(stmt, what)                                                 \
    do {                                                                       \
        ba = fx_batch();                                                       \
        stmt;                                                                  \
        expect_encode_fails(proto_batch_encode("done", &ba, &b), &b, keep, what); \
    } while (0)
    ba = fx_batch();
    expect_encode_fails(proto_batch_encode("other", &ba, &b), &b, keep, "batch type other");
    expect_encode_fails(proto_batch_encode(NULL, &ba, &b), &b, keep, "batch type NULL");
    BATCH_CASE(ba.worker = NULL, "batch without worker");
    BATCH_CASE(ba.gen_seconds = INFINITY, "batch gen_s inf");
    BATCH_CASE(ba.n_groups = PROTO_MAX_ITEMS + 1, "batch with too many groups");
    BATCH_CASE(fx_groups[0].n_samples = PROTO_MAX_SAMPLES + 1, "group with too many samples");
    BATCH_CASE(fx_groups[0].n_prompt = PROTO_MAX_TOKENS + 1, "prompt with too many tokens");
    BATCH_CASE(fx_groups[0].prompt = NULL, "prompt tokens NULL");
    BATCH_CASE(fx_prompt[1] = -1, "negative prompt token");
    fx_prompt[1] = 2;
    BATCH_CASE(fx_samples[0].n = PROTO_MAX_TOKENS + 1, "sample with too many tokens");
    BATCH_CASE(fx_samples[0].logprobs = NULL, "sample logprobs NULL");
    BATCH_CASE(fx_samples[0].tokens = NULL, "sample tokens NULL");
    BATCH_CASE(fx_samples[0].text = NULL, "sample text NULL");
    BATCH_CASE(fx_samples[0].text = long_text, "sample text too long");
    BATCH_CASE(fx_samples[0].finish = 0, "finish 0");
    BATCH_CASE(fx_samples[0].finish = 4, "finish 4");
    BATCH_CASE(fx_samples[1].reward = NAN, "reward NaN");
    BATCH_CASE(fx_tok[0] = -5, "negative completion token");
    fx_tok[0] = 5;
#undef BATCH_CASE

    proto_report_t r;
#define REPORT_CASE(stmt, what)                                                \
    do {                                                                       \
        r = fx_report();                                                       \
        stmt;                                                                  \
        expect_encode_fails(proto_report_encode(&r, &b), &b, keep, what);      \
    } while (0)
    REPORT_CASE(r.kind = (proto_report_kind_t)0, "report kind 0");
    REPORT_CASE(r.kind = (proto_report_kind_t)5, "report kind 5");
    REPORT_CASE(r.task_kind = (proto_kind_t)2, "report tk 2");
    REPORT_CASE(r.reward_sum = NAN, "report rsum NaN");
    REPORT_CASE(r.source = NULL, "report without source");
    REPORT_CASE(r.error = long_str, "report error too long");
#undef REPORT_CASE

    ad.job = long_id;
    expect_encode_fails(proto_adapter_event_encode(&ad, &b), &b, keep, "adapter job too long");

    proto_reward_req_t rq = fx_rreq();
    rq.n = PROTO_MAX_SAMPLES + 1;
    expect_encode_fails(proto_reward_req_encode(&rq, &b), &b, keep, "too many completions");
    rq = fx_rreq();
    rq.meta = long_str;
    expect_encode_fails(proto_reward_req_encode(&rq, &b), &b, keep, "meta too long");
    rq = fx_rreq();
    rq.prompt = NULL;
    expect_encode_fails(proto_reward_req_encode(&rq, &b), &b, keep, "reward_req prompt NULL");
    proto_reward_rep_t rp = fx_rrep();
    rp.error = "both";
    expect_encode_fails(proto_reward_rep_encode(&rp, &b), &b, keep, "rewards and error");
    rp = fx_rrep();
    fx_rewards[2] = INFINITY;
    expect_encode_fails(proto_reward_rep_encode(&rp, &b), &b, keep, "reward inf");
    fx_rewards[2] = 0.0;
    rp.n = PROTO_MAX_SAMPLES + 1;
    expect_encode_fails(proto_reward_rep_encode(&rp, &b), &b, keep, "too many rewards");

    proto_req_t q = fx_req();
    q.op = NULL;
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "req without op");
    q.op = "x";
    q.token = long_str;
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "req token too long");
    q.token = "t";
    proto_args_str(&q.args, "s", long_str);
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "string argument too long");
    proto_args_str(&q.args, "s", "ok");
    proto_args_float(&q.args, "f", NAN);
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "float argument NaN");
    proto_args_float(&q.args, "f", 1.0);
    proto_args_int(&q.args, long_id, 1);
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "argument key too long");
    proto_args_free(&q.args);
    for (int i = 0; i <= PROTO_MAX_ARGS; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        proto_args_int(&q.args, key, i);
    }
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "too many arguments");
    proto_args_free(&q.args);
    // Maps built by hand can hold what the builders never produce.
    proto_args_int(&q.args, "a", 1);
    proto_args_int(&q.args, "b", 2);
    strcpy(q.args.v[1].key, "a");
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "duplicate argument keys");
    q.args.v[1].key[0] = 'b';
    q.args.v[1].kind = (proto_val_kind_t)99;
    expect_encode_fails(proto_req_encode(&q, &b), &b, keep, "unknown argument kind");
    proto_args_free(&q.args);

    proto_rep_t p = {.id = 1, .ok = false};
    expect_encode_fails(proto_rep_encode(&p, &b), &b, keep, "failed reply without error");

    // The frame already in the buffer is untouched and a later message appends after it.
    proto_adapter_event_t d;
    char err[ERR_LEN];
    cr_assert_eq(proto_adapter_event_decode(b.data, b.len, &d, err), 0, "%s", err);
    proto_adapter_event_free(&d);
    proto_report_t rr = fx_report();
    cr_assert_eq(proto_report_encode(&rr, &b), 0);
    proto_report_t dr;
    cr_assert_eq(proto_report_decode(b.data + keep, b.len - keep, &dr, err), 0, "%s", err);
    cmp_report(&rr, &dr);
    proto_report_free(&dr);

    cr_assert_eq(proto_task_encode(NULL, &b), -1);
    cr_assert_eq(proto_task_encode(&t, NULL), -1);
    free(long_id);
    free(long_str);
    free(long_text);
    proto_buf_free(&b);
    cr_assert_null(b.data);
    cr_assert_eq(b.len + b.cap, 0);
}

// --- argument maps and freeing ------------------------------------------------------------------------

PROTO_TEST(args_builders_and_lookups) {
    proto_args_t a = {0};
    char src[] = "value";
    uint8_t blob[3] = {0, 1, 2};
    proto_args_str(&a, "s", src);
    src[0] = 'X';   // the builder copied it
    proto_args_bin(&a, "b", blob, sizeof blob);
    blob[0] = 9;
    proto_args_int(&a, "i", -7);
    proto_args_float(&a, "f", 0.25);
    proto_args_bool(&a, "t", true);
    cr_assert_eq(a.n, 5);
    cr_assert_str_eq(proto_args_get_str(&a, "s"), "value");
    const proto_val_t *v = proto_args_get(&a, "b");
    cr_assert_eq(v->kind, PROTO_VAL_BIN);
    cr_assert_eq(v->len, 3);
    cr_assert_eq(memcmp(v->s, "\0\1\2", 3), 0);
    int64_t i = 0;
    cr_assert(proto_args_get_int(&a, "i", &i));
    cr_assert_eq(i, -7);
    cr_assert_eq(proto_args_get(&a, "f")->f, 0.25);
    cr_assert_eq(proto_args_get(&a, "t")->kind, PROTO_VAL_BOOL);
    cr_assert_eq(proto_args_get(&a, "t")->i, 1);

    // Absent or of another kind.
    i = 42;
    cr_assert_null(proto_args_get(&a, "missing"));
    cr_assert_null(proto_args_get_str(&a, "missing"));
    cr_assert_null(proto_args_get_str(&a, "i"));
    cr_assert_null(proto_args_get_str(&a, "b"));
    cr_assert_not(proto_args_get_int(&a, "s", &i));
    cr_assert_not(proto_args_get_int(&a, "t", &i));
    cr_assert_not(proto_args_get_int(&a, "missing", &i));
    cr_assert_eq(i, 42);
    cr_assert_null(proto_args_get(NULL, "s"));

    // Setting a key again replaces its value in place.
    proto_args_int(&a, "s", 5);
    cr_assert_eq(a.n, 5);
    cr_assert_null(proto_args_get_str(&a, "s"));
    cr_assert(proto_args_get_int(&a, "s", &i));
    cr_assert_eq(i, 5);
    proto_args_str(&a, "s", NULL);
    cr_assert_eq(proto_args_get(&a, "s")->kind, PROTO_VAL_NIL);
    proto_args_free(&a);
    cr_assert_eq(a.n, 0);
    cr_assert_null(a.v);
    proto_args_free(&a);
}

// The free functions take zeroed and half-built messages and leave them zeroed.
PROTO_TEST(free_partial) {
    any_t m;
    for (kind_t k = 0; k < K_N; k++) {
        memset(&m, 0, sizeof m);
        free_any(k, &m);
    }
    proto_task_free(NULL);
    proto_batch_free(NULL);
    proto_buf_free(NULL);

    proto_batch_t b = {0};
    b.job = strdup("j");
    b.groups = calloc(3, sizeof *b.groups);
    b.n_groups = 3;
    b.groups[0].samples = calloc(2, sizeof *b.groups[0].samples);
    b.groups[0].n_samples = 2;
    b.groups[0].samples[0].tokens = malloc(4 * sizeof(int32_t));
    b.groups[0].samples[0].n = 4;
    b.groups[1].prompt = malloc(sizeof(int32_t));
    proto_batch_free(&b);
    const unsigned char *p = (const unsigned char *)&b;
    for (size_t i = 0; i < sizeof b; i++) cr_assert_eq(p[i], 0);

    proto_task_t t = {0};
    t.items = calloc(2, sizeof *t.items);
    t.n_items = 2;
    t.items[0].prompt = strdup("x");
    proto_task_free(&t);
    cr_assert_null(t.items);

    proto_reward_req_t rq = {0};
    rq.completions = calloc(2, sizeof *rq.completions);
    rq.n = 2;
    rq.completions[1] = strdup("c");
    proto_reward_req_free(&rq);
    cr_assert_null(rq.completions);

    proto_req_t q = {0};
    q.op = strdup("op");
    proto_args_int(&q.args, "k", 1);
    proto_req_free(&q);
    cr_assert_null(q.op);
    cr_assert_eq(q.args.n, 0);
}

// --- multi-turn episodes and the environment protocol ------------------------------------------

// A "cont" batch: one episode awaiting its next turn (observation pending, env tokens marked),
// one ended by an external environment (rewarded), one single-turn sample; every field back.
PROTO_TEST(episode_batch_round_trip) {
    int32_t tok0[5] = {3, 60, 61, 62, 4}, tok1[2] = {7, 8}, tok2[1] = {9};
    float lp0[5] = {-0.5f, 0.0f, 0.0f, 0.0f, -1.25f}, lp1[2] = {-0.1f, -0.2f}, lp2[1] = {-3.0f};
    uint8_t env0[5] = {0, 1, 1, 1, 0};
    proto_sample_t sm[3] = {
        {.n = 5, .tokens = tok0, .logprobs = lp0, .text = "<c:2*3>=6 6", .finish = PROTO_FIN_STOP, .env = env0,
         .turns = 2, .pending = 1, .obs = "=6 "},
        {.n = 2, .tokens = tok1, .logprobs = lp1, .text = "x", .finish = PROTO_FIN_EOS, .reward = 0.75f, .turns = 3,
         .rewarded = 1},
        {.n = 1, .tokens = tok2, .logprobs = lp2, .text = "", .finish = PROTO_FIN_LENGTH},
    };
    int32_t prompt[3] = {1, 2, 3};
    proto_group_t g = {.index = 42, .n_prompt = 3, .prompt = prompt, .n_samples = 3, .samples = sm};
    proto_batch_t b = {.task_id = 9, .job = "j-1", .adapter_version = 4, .kind = PROTO_KIND_TRAIN, .temperature = 1.3f,
                       .worker = "r-1", .gen_seconds = 0.5, .n_groups = 1, .groups = &g, .max_new = 24, .top_k = 5,
                       .max_turns = 4, .max_ctx = 100, .top_p = 0.9f, .seed = 77};
    proto_buf_t buf = {0};
    cr_assert_eq(proto_batch_encode("cont", &b, &buf), 0);
    char type[32], err[ERR_LEN];
    cr_assert_eq(proto_peek_type(buf.data, buf.len, type, err), 0);
    cr_assert_str_eq(type, "cont");
    proto_batch_t d;
    cr_assert_eq(proto_batch_decode("cont", buf.data, buf.len, &d, err), 0, "%s", err);
    cr_assert_eq(d.max_new, 24);
    cr_assert_eq(d.top_k, 5);
    cr_assert_eq(d.max_turns, 4);
    cr_assert_eq(d.max_ctx, 100);
    cr_assert_eq(d.seed, 77);
    cr_assert_eq(tu_f2u(d.top_p), tu_f2u(0.9f));
    const proto_sample_t *e = d.groups[0].samples;
    cr_assert_not_null(e[0].env);
    cr_assert_eq(memcmp(e[0].env, env0, 5), 0);
    cr_assert_eq(e[0].turns, 2);
    cr_assert_eq(e[0].pending, 1);
    cr_assert_str_eq(e[0].obs, "=6 ");
    cr_assert_eq(e[0].rewarded, 0);
    cr_assert_null(e[1].env);
    cr_assert_eq(e[1].turns, 3);
    cr_assert_eq(e[1].rewarded, 1);
    cr_assert_eq(e[1].pending, 0);
    cr_assert_null(e[1].obs);
    cr_assert_eq(tu_f2u(e[1].reward), tu_f2u(0.75f));
    // a single-turn sample reads back as one turn, nothing pending
    cr_assert_null(e[2].env);
    cr_assert_eq(e[2].turns, 1);
    cr_assert_eq(e[2].pending, 0);
    proto_batch_free(&d);
    // the same batch as "done" and "scored" keeps the episode fields too
    proto_buf_free(&buf);
    cr_assert_eq(proto_batch_encode("scored", &b, &buf), 0);
    cr_assert_eq(proto_batch_decode("scored", buf.data, buf.len, &d, err), 0, "%s", err);
    cr_assert_eq(d.groups[0].samples[0].turns, 2);
    proto_batch_free(&d);
    proto_buf_free(&buf);
}

// Episode fields that do not fit together are refused, naming the field.
PROTO_TEST(episode_batch_rejects) {
    int32_t tok[3] = {1, 2, 3};
    float lp[3] = {0};
    char err[ERR_LEN];
    proto_sample_t sm = {.n = 3, .tokens = tok, .logprobs = lp, .text = "t", .finish = PROTO_FIN_EOS, .turns = 2};
    proto_group_t g = {.index = 1, .n_prompt = 3, .prompt = tok, .n_samples = 1, .samples = &sm};
    proto_batch_t b = {.task_id = 1, .job = "j", .worker = "w", .n_groups = 1, .groups = &g};
    proto_buf_t buf = {0};
    proto_batch_t d;
    // pend without obs: build the frame by hand (the encoder writes obs whenever it is set)
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    cr_assert_eq(proto_batch_encode("cont", &b, &buf), 0);
    // re-pack the decoded tree with "pend": true added to the sample
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    cr_assert_eq(msgpack_unpack_next(&u, (const char *)buf.data, buf.len, NULL), MSGPACK_UNPACK_SUCCESS);
    msgpack_object root = u.data;
    msgpack_pack_map(&pk, root.via.map.size);
    for (uint32_t i = 0; i < root.via.map.size; i++) {
        msgpack_object_kv *kv = &root.via.map.ptr[i];
        msgpack_pack_object(&pk, kv->key);
        if (kv->key.via.str.size == 6 && !memcmp(kv->key.via.str.ptr, "groups", 6)) {
            msgpack_object_map *gm = &kv->val.via.array.ptr[0].via.map;
            msgpack_pack_array(&pk, 1);
            msgpack_pack_map(&pk, gm->size);
            for (uint32_t j = 0; j < gm->size; j++) {
                msgpack_pack_object(&pk, gm->ptr[j].key);
                if (gm->ptr[j].key.via.str.size == 1 && gm->ptr[j].key.via.str.ptr[0] == 's') {
                    msgpack_object_map *sm2 = &gm->ptr[j].val.via.array.ptr[0].via.map;
                    msgpack_pack_array(&pk, 1);
                    msgpack_pack_map(&pk, sm2->size + 1);
                    for (uint32_t q = 0; q < sm2->size; q++) {
                        msgpack_object_kv *skv = &sm2->ptr[q];
                        msgpack_pack_object(&pk, skv->key);
                        if (skv->key.via.str.size == 4 && !memcmp(skv->key.via.str.ptr, "pend", 4)) msgpack_pack_true(&pk);
                        else msgpack_pack_object(&pk, skv->val);
                    }
                    msgpack_pack_str(&pk, 3);
                    msgpack_pack_str_body(&pk, "env", 3);
                    msgpack_pack_bin(&pk, 2);   // 2 bytes for 3 tokens
                    msgpack_pack_bin_body(&pk, "\1\1", 2);
                } else {
                    msgpack_pack_object(&pk, gm->ptr[j].val);
                }
            }
        } else {
            msgpack_pack_object(&pk, kv->val);
        }
    }
    msgpack_unpacked_destroy(&u);
    cr_assert_eq(proto_batch_decode("cont", sb.data, sb.size, &d, err), -1);
    cr_assert(strstr(err, "env") || strstr(err, "obs"), "%s", err);
    msgpack_sbuffer_destroy(&sb);
    proto_buf_free(&buf);
}

PROTO_TEST(env_messages_round_trip) {
    proto_env_req_t rq = {.id = 5, .job = "j-2", .prompt = "tcalc 2*3+1=", .transcript = "<c:2*3>", .turn = 1};
    proto_buf_t buf = {0};
    char err[ERR_LEN];
    cr_assert_eq(proto_env_req_encode(&rq, &buf), 0);
    proto_env_req_t dq;
    cr_assert_eq(proto_env_req_decode(buf.data, buf.len, &dq, err), 0, "%s", err);
    cr_assert_eq(dq.id, 5);
    cr_assert_str_eq(dq.job, "j-2");
    cr_assert_str_eq(dq.prompt, "tcalc 2*3+1=");
    cr_assert_str_eq(dq.transcript, "<c:2*3>");
    cr_assert_eq(dq.turn, 1);
    proto_env_req_free(&dq);
    proto_buf_free(&buf);
    // an observation, an end with reward, an error
    proto_env_rep_t reps[3] = {{.id = 1, .done = false, .obs = "=6 "}, {.id = 2, .done = true, .reward = 0.25},
                               {.id = 3, .error = "no such tool"}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(proto_env_rep_encode(&reps[i], &buf), 0);
        proto_env_rep_t d;
        cr_assert_eq(proto_env_rep_decode(buf.data, buf.len, &d, err), 0, "%s", err);
        cr_assert_eq(d.id, reps[i].id);
        cr_assert_eq(d.done, reps[i].error ? false : reps[i].done);
        assert_str_or_null(d.obs, reps[i].error ? NULL : reps[i].obs, "obs");
        assert_str_or_null(d.error, reps[i].error, "error");
        if (reps[i].done) cr_assert_eq(d2u(d.reward), d2u(0.25));
        proto_env_rep_free(&d);
        proto_buf_free(&buf);
    }
    // inconsistent replies are refused by the encoder: done with an observation, going on without one
    proto_env_rep_t bad1 = {.id = 4, .done = true, .obs = "=1 "}, bad2 = {.id = 4, .done = false};
    cr_assert_eq(proto_env_rep_encode(&bad1, &buf), -1);
    cr_assert_eq(proto_env_rep_encode(&bad2, &buf), -1);
    cr_assert_eq(buf.len, 0);
    proto_buf_free(&buf);
    // and by the decoder: done without a reward, going on without an observation
    const char *maps[2][2] = {{"done", "reward"}, {"done", "obs"}};
    for (int i = 0; i < 2; i++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 4);
        msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "t", 1);
        msgpack_pack_str(&pk, 7), msgpack_pack_str_body(&pk, "env_rep", 7);
        msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "v", 1);
        msgpack_pack_uint32(&pk, PROTO_VERSION);
        msgpack_pack_str(&pk, 2), msgpack_pack_str_body(&pk, "id", 2);
        msgpack_pack_uint32(&pk, 1);
        msgpack_pack_str(&pk, 4), msgpack_pack_str_body(&pk, "done", 4);
        if (i == 0) msgpack_pack_true(&pk);
        else msgpack_pack_false(&pk);
        proto_env_rep_t d;
        cr_assert_eq(proto_env_rep_decode(sb.data, sb.size, &d, err), -1);
        cr_assert(strstr(err, maps[i][1]), "%s", err);
        msgpack_sbuffer_destroy(&sb);
    }
}

// marlaas-fuzz-send.c - a test tool: sends hostile frames to a MARLaaS socket and exits.
//
//   marlaas-fuzz-send --endpoint tcp://127.0.0.1:P --type push|dealer|req|pub --count N
//                     [--seed S] [--oversize] [--oversize-bytes B] [--token T] [--wait-ms MS]
//                     [--only KIND,...] [--message TYPE,...]
//                     [--keys DIR --as NAME --server NAME | --server-key KEY] [--file PATH]
//
// Every bound socket of a cluster takes frames from anyone who can reach it, so each must
// survive whatever arrives. This tool connects with the given socket type and sends N frames,
// each drawn from one of these kinds:
//   random     random bytes, often starting like a map
//   truncated  a valid message of any type (built with the proto_*_encode functions) cut short
//   valid      a complete valid message of any type, usually not the one the socket expects,
//              or valid MessagePack that is not a map
//   version    a valid message whose "v" is wrong (another number, a string, nil, a float,
//              missing, twice)
//   huge       a container or string header declaring ~2^32 elements or bytes, with a few
//              bytes behind it, at the top or inside a valid message
//   mutated    a valid message with one field, at any depth, dropped, doubled, of the wrong
//              type, out of range, non-finite or longer than its cap
//   bitflip    a valid message with a few bytes changed
//   deep       thousands to tens of thousands of nested arrays or maps
//   multipart  a message of 2..4 frames (for dealer: also the [""][request] REQ envelope)
//   oversize   with --oversize: a few frames larger than every frame cap (PROTO_MAX_FRAME + 1
//              bytes unless --oversize-bytes says otherwise)
// The frames depend only on the seed, the count and the flags, so a failure replays exactly.
// Job ids are never those of real jobs ("j-<number>"), and API requests only ever carry specs
// the scheduler must refuse, so valid messages do not create, change or cancel real work.
//
// --only draws from the listed kinds (oversize stays with --oversize); --message makes the
// kinds that start from a valid message use only the listed types (task, done, scored, report,
// adapter, reward_req, reward_rep, req, rep): to narrow a failure down, or to send many valid
// messages of one type. With --token, valid API requests carry that token and reach the
// operations themselves (invalid specs, unknown jobs, bad arguments) instead of stopping at
// "invalid token".
//
// --file PATH sends the file's bytes as each of the N frames instead: a message built elsewhere
// (a well-formed frame with hostile contents, e.g. a scored batch whose tokens lie outside the
// vocabulary, pushed with a stolen verifier key).
//
// --type pull or sub sends nothing: it takes the frames the socket yields within --wait-ms and
// prints how many ("received N frames"), as an eavesdropper on the work or event ports would.
//
// A cluster's links are CURVE-authenticated: a plain sender never gets a frame through. To test
// what an insider holding a stolen key could do, --keys DIR --as NAME --server NAME connects with
// service NAME's keypair (DIR/NAME.key_secret) to a socket of service --server; --server-key KEY
// (the key or a .key file) reaches the public API with a fresh keypair, as any client does.
//
// dealer and req sockets read the replies; each must decode as a "rep" (the scheduler API) or a
// "reward_rep" (a reward service). Answerable frames are those a ROUTER API or a REP service
// must answer: one-frame messages and [""][request] (dealer), every message (req); frames lost
// with a connection that an oversize frame made the peer drop are not answered. The last line
// on stdout sums up: what was sent, sends that failed (a full queue for 2 s), replies received,
// replies that were malformed. Exit status 0 when everything was sent, 1 when a send failed or
// a reply was malformed, 2 for bad arguments or a socket that cannot be set up.
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <czmq.h>
#include <zmq.h>

#include "common/net/bus.h"
#include "common/net/proto.h"

#define MAX_COUNT 1000000
#define MAX_OVERSIZE_FRAMES 8

// --- deterministic randomness -----------------------------------------------------------------

typedef struct {
    uint64_t s;
} rng_t;

static uint64_t rnd(rng_t *r) {   // splitmix64
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t below(rng_t *r, uint32_t n) { return n ? (uint32_t)(rnd(r) % n) : 0; }
static bool chance(rng_t *r, unsigned pct) { return below(r, 100) < pct; }
static double unit(rng_t *r) { return (double)(rnd(r) >> 11) / 9007199254740992.0; }

// Printable text of 0..max bytes (NUL-terminated, caller frees).
static char *rand_text(rng_t *r, uint32_t max) {
    uint32_t n = below(r, max + 1);
    char *s = malloc(n + 1);
    if (!s) abort();
    for (uint32_t i = 0; i < n; i++) s[i] = (char)(' ' + below(r, 95));
    s[n] = '\0';
    return s;
}

static char *dup_str(const char *s) {
    char *d = strdup(s);
    if (!d) abort();
    return d;
}

// An id that is never a real job's ("j-<number>") and sometimes sits at or past PROTO_MAX_ID.
static char *rand_job(rng_t *r) {
    char *s;
    switch (below(r, 8)) {
    case 0:
        // the longest id the protocol allows
        s = malloc(PROTO_MAX_ID);
        if (!s) abort();
        memset(s, 'f', PROTO_MAX_ID - 1);
        s[PROTO_MAX_ID - 1] = 0;
        return s;
    case 1: return dup_str("j-0");
    case 2: return dup_str("fuzz:*");
    default: {
        char b[32];
        snprintf(b, sizeof b, "fuzz-%08" PRIx32, (uint32_t)rnd(r));
        return dup_str(b);
    }
    }
}

// --- frames -------------------------------------------------------------------------------------

typedef struct {
    uint8_t *d;
    size_t n, cap;
} buf_t;

static void buf_put(buf_t *b, const void *p, size_t n) {
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) cap *= 2;
        uint8_t *d = realloc(b->d, cap);
        if (!d) abort();
        b->d = d;
        b->cap = cap;
    }
    if (n) memcpy(b->d + b->n, p, n);
    b->n += n;
}

static void buf_byte(buf_t *b, uint8_t c) { buf_put(b, &c, 1); }

static void buf_free(buf_t *b) {
    free(b->d);
    memset(b, 0, sizeof *b);
}

static int buf_write_cb(void *data, const char *p, size_t n) {
    buf_put(data, p, n);
    return 0;
}

// --- valid messages of every type ---------------------------------------------------------------

enum { MT_TASK, MT_DONE, MT_SCORED, MT_REPORT, MT_ADAPTER, MT_REWARD_REQ, MT_REWARD_REP, MT_REQ, MT_REP, MT_N };
static const char *const msg_name[MT_N] = {"task", "done", "scored", "report", "adapter",
                                           "reward_req", "reward_rep", "req", "rep"};

// Specs that the scheduler must refuse, each for a different rule: a valid one would create a
// job and change the cluster under test.
static const char *const bad_specs[] = {
    "",
    "{",
    "[]",
    "null",
    "{\"task\": \"vowels\", \"group\": 1}",
    "{\"task\": \"no-such-task\"}",
    "{\"task\": \"vowels\", \"bogus_field\": 1}",
    "{\"task\": \"vowels\", \"max_steps\": 1e300}",
    "{\"task\": \"vowels\", \"max_steps\": -5}",
    "{\"task\": \"vowels\", \"lr\": \"fast\"}",
    "{\"task\": \"vowels\", \"group\": 2.5}",
    "{\"task\": \"vowels\", \"temperature\": 0}",
    "{\"task\": \"vowels\", \"targets\": [\"q_proj\", 7]}",
    "{\"task\": \"vowels\", \"reward\": {\"endpoint\": 5}}",
    "{\"task\": \"vowels\", \"reward\": {\"endpoint\": \"tcp://127.0.0.1:1\", \"on_failure\": \"explode\"}}",
    "{\"task\": \"vowels\", \"reward\": {\"endpoint\": \"tcp://127.0.0.1:1\", \"timeout_ms\": -1}}",
    "{\"task\": \"vowels\", \"name\": \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\"}",
    "{\"task\": 42}",
    "{\"task\": \"vowels\", \"task\": \"pad\", \"group\": 0}",
    "{\"dataset\": true, \"task\": \"fuzzdata\"}",
};

static void add_bad_nested_spec(proto_args_t *a, rng_t *r) {
    // deeper than cJSON's nesting limit, within the 4096-byte string cap
    uint32_t depth = 900 + below(r, 1100);
    char *s = malloc(2 * depth + 1);
    if (!s) abort();
    for (uint32_t i = 0; i < depth; i++) s[i] = '[', s[depth + i] = ']';
    s[2 * depth] = 0;
    proto_args_str(a, "spec", s);
    free(s);
}

static void rand_args(rng_t *r, proto_args_t *a) {
    uint32_t n = below(r, 4);
    for (uint32_t i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%" PRIu32, i);
        switch (below(r, 5)) {
        case 0: proto_args_int(a, key, (int64_t)rnd(r)); break;
        case 1: proto_args_float(a, key, unit(r) * 1e9 - 5e8); break;
        case 2: proto_args_bool(a, key, chance(r, 50)); break;
        case 3: {
            char *t = rand_text(r, 64);
            proto_args_str(a, key, t);
            free(t);
            break;
        }
        default: {
            uint8_t bin[32];
            for (size_t k = 0; k < sizeof bin; k++) bin[k] = (uint8_t)rnd(r);
            proto_args_bin(a, key, bin, below(r, sizeof bin + 1));
        }
        }
    }
}

static void rand_req_args(rng_t *r, const char *op, proto_args_t *a) {
    if (!strcmp(op, "job_submit")) {
        uint32_t k = below(r, (uint32_t)(sizeof bad_specs / sizeof bad_specs[0]) + 3);
        if (k < sizeof bad_specs / sizeof bad_specs[0]) {
            proto_args_str(a, "spec", bad_specs[k]);
        } else if (k == sizeof bad_specs / sizeof bad_specs[0]) {
            add_bad_nested_spec(a, r);
        } else {
            // a dataset job whose regex does not compile: refused whole
            proto_args_str(a, "spec", "{\"task\": \"fuzzdata\", \"dataset\": true, \"verifier\": \"regex\"}");
            const char *ds = "{\"prompt\": \"a\", \"answer\": \"(\"}\n{\"prompt\": 3}\n";
            proto_args_bin(a, "dataset", ds, strlen(ds));
        }
        if (chance(r, 20)) {
            uint8_t bin[64];
            for (size_t i = 0; i < sizeof bin; i++) bin[i] = (uint8_t)rnd(r);
            proto_args_bin(a, "dataset", bin, sizeof bin);
        }
    } else if (!strcmp(op, "tenant_create")) {
        char *t = rand_text(r, 80);
        proto_args_str(a, "name", t);
        free(t);
        proto_args_int(a, "quota", (int64_t)rnd(r));
    } else if (strcmp(op, "ping") && strcmp(op, "job_list")) {
        if (chance(r, 85)) {
            char *j = rand_job(r);
            if (chance(r, 10)) {
                proto_args_int(a, "job", 7);
            } else if (chance(r, 10)) {
                // an argument may be longer than any id: one byte too long for a job's key
                char longer[PROTO_MAX_ID + 1];
                memset(longer, 'f', PROTO_MAX_ID);
                longer[PROTO_MAX_ID] = 0;
                proto_args_str(a, "job", longer);
            } else {
                proto_args_str(a, "job", j);
            }
            free(j);
        }
        if (chance(r, 40)) proto_args_int(a, "version", chance(r, 50) ? -1 : (int64_t)(rnd(r) >> 1));
        if (chance(r, 20)) proto_args_int(a, "count", (int64_t)rnd(r));
    }
    if (chance(r, 15)) rand_args(r, a);
}

static int build_valid(rng_t *r, int type, const char *token, proto_buf_t *out) {
    int rc = -1;
    switch (type) {
    case MT_TASK: {
        proto_task_t t = {.task_id = rnd(r), .job = rand_job(r), .adapter_version = (uint32_t)rnd(r),
                          .kind = (proto_kind_t)below(r, 2), .group = 1 + below(r, 8), .max_new = 1 + below(r, 32),
                          .temperature = (float)unit(r) * 2, .top_p = (float)unit(r), .top_k = below(r, 50),
                          .seed = rnd(r), .n_items = below(r, 4)};
        proto_item_t items[4];
        for (uint32_t i = 0; i < t.n_items; i++) items[i] = (proto_item_t){.index = rnd(r), .prompt = rand_text(r, 40)};
        t.items = items;
        rc = proto_task_encode(&t, out);
        for (uint32_t i = 0; i < t.n_items; i++) free(items[i].prompt);
        free(t.job);
        break;
    }
    case MT_DONE:
    case MT_SCORED: {
        proto_batch_t b = {.task_id = rnd(r), .job = rand_job(r), .adapter_version = (uint32_t)below(r, 100),
                           .kind = (proto_kind_t)below(r, 2), .temperature = (float)unit(r) * 2,
                           .worker = dup_str("fuzz-worker"), .gen_seconds = unit(r), .n_groups = below(r, 3)};
        proto_group_t groups[3];
        proto_sample_t samples[3][3];
        int32_t toks[3][3][8], ptok[3][8];
        float lps[3][3][8];
        for (uint32_t g = 0; g < b.n_groups; g++) {
            groups[g] = (proto_group_t){.index = rnd(r), .n_prompt = below(r, 9), .prompt = ptok[g],
                                        .n_samples = below(r, 4), .samples = samples[g]};
            for (uint32_t k = 0; k < 8; k++) ptok[g][k] = (int32_t)below(r, 100);
            for (uint32_t s = 0; s < groups[g].n_samples; s++) {
                proto_sample_t *ps = &samples[g][s];
                *ps = (proto_sample_t){.n = below(r, 9), .tokens = toks[g][s], .logprobs = lps[g][s],
                                       .text = rand_text(r, 24), .finish = (uint8_t)(1 + below(r, 3)),
                                       .reward = (float)below(r, 2), .failed = (uint8_t)below(r, 2)};
                for (uint32_t k = 0; k < 8; k++) toks[g][s][k] = (int32_t)below(r, 100), lps[g][s][k] = -(float)unit(r);
            }
        }
        b.groups = groups;
        rc = proto_batch_encode(type == MT_DONE ? "done" : "scored", &b, out);
        for (uint32_t g = 0; g < b.n_groups; g++)
            for (uint32_t s = 0; s < groups[g].n_samples; s++) free(samples[g][s].text);
        free(b.job);
        free(b.worker);
        break;
    }
    case MT_REPORT: {
        proto_report_t m = {.kind = (proto_report_kind_t)(1 + below(r, 4)), .job = rand_job(r),
                            .source = dup_str("fuzz"), .task_id = rnd(r), .task_kind = (proto_kind_t)below(r, 2),
                            .n = below(r, 1000), .reward_sum = unit(r) * 100, .correct = below(r, 100),
                            .errors = below(r, 100), .step = below(r, 100000), .adapter_version = below(r, 100000),
                            .error = chance(r, 50) ? rand_text(r, 100) : NULL};
        rc = proto_report_encode(&m, out);
        free(m.job);
        free(m.source);
        free(m.error);
        break;
    }
    case MT_ADAPTER: {
        proto_adapter_event_t m = {.job = rand_job(r), .version = (uint32_t)rnd(r), .step = (uint32_t)rnd(r)};
        rc = proto_adapter_event_encode(&m, out);
        free(m.job);
        break;
    }
    case MT_REWARD_REQ: {
        proto_reward_req_t m = {.id = rnd(r), .job = rand_job(r), .prompt = rand_text(r, 40), .n = below(r, 5),
                                .meta = chance(r, 50) ? rand_text(r, 40) : NULL};
        char *c[4] = {0};
        for (uint32_t i = 0; i < m.n; i++) c[i] = rand_text(r, 20);
        m.completions = c;
        rc = proto_reward_req_encode(&m, out);
        for (uint32_t i = 0; i < m.n; i++) free(c[i]);
        free(m.job);
        free(m.prompt);
        free(m.meta);
        break;
    }
    case MT_REWARD_REP: {
        double rw[8];
        proto_reward_rep_t m = {.id = rnd(r)};
        if (chance(r, 30)) {
            m.error = rand_text(r, 60);
        } else {
            m.n = below(r, 9);
            for (uint32_t i = 0; i < m.n; i++) rw[i] = unit(r);
            m.rewards = rw;
        }
        rc = proto_reward_rep_encode(&m, out);
        free(m.error);
        break;
    }
    case MT_REQ: {
        static const char *ops[] = {"ping", "job_submit", "job_list", "job_status", "job_cancel",
                                    "job_metrics", "adapter_get", "tenant_create", "no_such_op"};
        const char *op = ops[below(r, sizeof ops / sizeof ops[0])];
        char *tok = token && chance(r, 85) ? dup_str(token) : chance(r, 10) ? dup_str("") : rand_text(r, 64);
        proto_req_t m = {.id = rnd(r), .op = dup_str(op), .token = tok};
        rand_req_args(r, op, &m.args);
        rc = proto_req_encode(&m, out);
        proto_req_free(&m);
        break;
    }
    default: {
        proto_rep_t m = {.id = rnd(r), .ok = chance(r, 50)};
        if (!m.ok) m.error = rand_text(r, 60);
        rand_args(r, &m.result);
        rc = proto_rep_encode(&m, out);
        proto_rep_free(&m);
    }
    }
    return rc;
}

// A valid message as a frame; random bytes in the unlikely case the encoder refuses it.
static void valid_frame(rng_t *r, const char *token, int type, buf_t *f) {
    proto_buf_t pb = {0};
    if (build_valid(r, type, token, &pb) == 0) {
        buf_put(f, pb.data, pb.len);
    } else {
        for (int i = 0; i < 16; i++) buf_byte(f, (uint8_t)rnd(r));
    }
    proto_buf_free(&pb);
}

// --- hostile values -------------------------------------------------------------------------

// A header declaring about 2^32 elements or bytes, then a few bytes: the receiver must not
// allocate for the declared size.
static void put_huge(rng_t *r, buf_t *f) {
    static const uint8_t heads[] = {0xdd, 0xdf, 0xdb, 0xc6, 0xc9, 0xdc, 0xde, 0xda};
    uint8_t h = heads[below(r, sizeof heads)];
    buf_byte(f, h);
    bool wide = h == 0xdd || h == 0xdf || h == 0xdb || h == 0xc6 || h == 0xc9;
    uint32_t n = wide ? (chance(r, 50) ? 0xffffffffu : 0x80000000u + below(r, 1000)) : 0xffffu;
    if (wide) {
        uint8_t be[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
        buf_put(f, be, 4);
    } else {
        uint8_t be[2] = {0xff, 0xff};
        buf_put(f, be, 2);
    }
    if (h == 0xc9) buf_byte(f, 1);   // ext type
    for (uint32_t i = 0, k = below(r, 8); i < k; i++) buf_byte(f, (uint8_t)(0x90 + below(r, 16)));
}

// A value of another kind than o, or one out of range or not finite.
static void pack_wrong(rng_t *r, msgpack_packer *pk, const msgpack_object *o) {
    switch (below(r, 13)) {
    case 0: msgpack_pack_nil(pk); break;
    case 1: msgpack_pack_true(pk); break;
    case 2: msgpack_pack_str_with_body(pk, "x", 1); break;
    case 3: msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 1); break;
    case 4: msgpack_pack_map(pk, 0); break;
    case 5: msgpack_pack_double(pk, NAN); break;
    case 6: msgpack_pack_double(pk, chance(r, 50) ? INFINITY : -INFINITY); break;
    case 7: msgpack_pack_int64(pk, INT64_MIN); break;
    case 8: msgpack_pack_uint64(pk, UINT64_MAX); break;
    case 9: msgpack_pack_double(pk, 1e300); break;
    case 10: msgpack_pack_bin_with_body(pk, "\0\1\2", 3); break;
    case 11: {
        // a string just past a cap: ids, strings and texts have different ones
        static const size_t caps[] = {PROTO_MAX_ID, PROTO_MAX_STR + 1, PROTO_MAX_TEXT + 1};
        size_t n = caps[below(r, 3)];
        char *s = malloc(n);
        if (!s) abort();
        memset(s, 'z', n);
        msgpack_pack_str_with_body(pk, s, n);
        free(s);
        break;
    }
    default:
        // a string with a NUL inside, or of the right kind but otherwise unchanged
        if (o->type == MSGPACK_OBJECT_STR) msgpack_pack_str_with_body(pk, "a\0b", 3);
        else msgpack_pack_int64(pk, -1);
    }
}

enum { MUT_DROP, MUT_DUP, MUT_WRONG, MUT_HUGE, MUT_KEY, MUT_N };

// Packs o with exactly one change somewhere along a random path into it.
static void pack_mutated(rng_t *r, msgpack_packer *pk, buf_t *f, const msgpack_object *o, int forced, int depth) {
    bool container = (o->type == MSGPACK_OBJECT_MAP && o->via.map.size > 0) ||
                     (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size > 0);
    if (!container) {
        if (forced == MUT_HUGE) put_huge(r, f);
        else pack_wrong(r, pk, o);
        return;
    }
    uint32_t n = o->type == MSGPACK_OBJECT_MAP ? o->via.map.size : o->via.array.size;
    uint32_t at = below(r, n);
    const msgpack_object *child = o->type == MSGPACK_OBJECT_MAP ? &o->via.map.ptr[at].val : &o->via.array.ptr[at];
    bool descend = depth < 6 && chance(r, 60) &&
                   (child->type == MSGPACK_OBJECT_MAP || child->type == MSGPACK_OBJECT_ARRAY);
    int mut = descend ? -1 : forced >= 0 ? forced : (int)below(r, MUT_N);
    if (o->type == MSGPACK_OBJECT_ARRAY && (mut == MUT_KEY)) mut = MUT_WRONG;
    uint32_t out_n = n + (mut == MUT_DUP) - (mut == MUT_DROP);
    if (o->type == MSGPACK_OBJECT_MAP) msgpack_pack_map(pk, out_n);
    else msgpack_pack_array(pk, out_n);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = o->type == MSGPACK_OBJECT_MAP ? &o->via.map.ptr[i].key : NULL;
        const msgpack_object *v = o->type == MSGPACK_OBJECT_MAP ? &o->via.map.ptr[i].val : &o->via.array.ptr[i];
        if (i != at) {
            if (k) msgpack_pack_object(pk, *k);
            msgpack_pack_object(pk, *v);
            continue;
        }
        switch (mut) {
        case -1:
            if (k) msgpack_pack_object(pk, *k);
            pack_mutated(r, pk, f, v, forced, depth + 1);
            break;
        case MUT_DROP: break;
        case MUT_DUP:
            for (int t = 0; t < 2; t++) {
                if (k) msgpack_pack_object(pk, *k);
                msgpack_pack_object(pk, *v);
            }
            break;
        case MUT_KEY:
            msgpack_pack_int(pk, (int)below(r, 100));
            msgpack_pack_object(pk, *v);
            break;
        case MUT_HUGE:
            if (k) msgpack_pack_object(pk, *k);
            put_huge(r, f);
            break;
        default:
            if (k) msgpack_pack_object(pk, *k);
            pack_wrong(r, pk, v);
        }
    }
}

// Re-packs a valid message with "v" replaced, missing or twice.
static void pack_bad_version(rng_t *r, msgpack_packer *pk, const msgpack_object *o) {
    uint32_t n = o->via.map.size, how = below(r, 10);
    msgpack_pack_map(pk, n + (how == 8) - (how == 9));
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        bool is_v = kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == 1 && kv->key.via.str.ptr[0] == 'v';
        if (!is_v) {
            msgpack_pack_object(pk, kv->key);
            msgpack_pack_object(pk, kv->val);
            continue;
        }
        if (how == 9) continue;   // missing
        msgpack_pack_object(pk, kv->key);
        switch (how) {
        case 0: msgpack_pack_uint64(pk, 0); break;
        case 1: msgpack_pack_uint64(pk, PROTO_VERSION + 1 + below(r, 1000)); break;
        case 2: msgpack_pack_uint64(pk, UINT64_MAX); break;
        case 3: msgpack_pack_int64(pk, -1); break;
        case 4: msgpack_pack_str_with_body(pk, "1", 1); break;
        case 5: msgpack_pack_nil(pk); break;
        case 6: msgpack_pack_double(pk, (double)PROTO_VERSION); break;
        case 7: msgpack_pack_true(pk); break;
        default:   // twice, the second one wrong
            msgpack_pack_uint64(pk, PROTO_VERSION);
            msgpack_pack_object(pk, kv->key);
            msgpack_pack_uint64(pk, PROTO_VERSION + 1);
        }
    }
}

// Unpacks a valid frame so it can be re-packed with a change.
static bool unpack_frame(const buf_t *f, msgpack_unpacked *u) {
    size_t off = 0;
    msgpack_unpacked_init(u);
    return msgpack_unpack_next(u, (const char *)f->d, f->n, &off) == MSGPACK_UNPACK_SUCCESS &&
           u->data.type == MSGPACK_OBJECT_MAP;
}

// --- the kinds of frames ------------------------------------------------------------------------

typedef enum {
    K_RANDOM, K_TRUNCATED, K_VALID, K_VERSION, K_HUGE, K_MUTATED, K_BITFLIP, K_DEEP, K_MULTIPART, K_OVERSIZE, K_N
} kind_t;
static const char *const kind_name[K_N] = {"random", "truncated", "valid", "version", "huge",
                                           "mutated", "bitflip", "deep", "multipart", "oversize"};

static void frame_random(rng_t *r, buf_t *f) {
    uint32_t n = chance(r, 80) ? below(r, 64) : chance(r, 90) ? below(r, 4096) : below(r, 65536);
    if (n && chance(r, 50)) buf_byte(f, (uint8_t)(0x80 + below(r, 16))), n--;
    for (uint32_t i = 0; i < n; i++) buf_byte(f, (uint8_t)rnd(r));
}

static void frame_not_a_map(rng_t *r, buf_t *f) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, f, buf_write_cb);
    switch (below(r, 6)) {
    case 0: msgpack_pack_nil(&pk); break;
    case 1: msgpack_pack_int64(&pk, (int64_t)rnd(r)); break;
    case 2: msgpack_pack_str_with_body(&pk, "report", 6); break;
    case 3: msgpack_pack_array(&pk, 2), msgpack_pack_str_with_body(&pk, "t", 1), msgpack_pack_int(&pk, 1); break;
    case 4: msgpack_pack_double(&pk, unit(r)); break;
    default:
        // two complete maps in one frame
        for (int i = 0; i < 2; i++) {
            msgpack_pack_map(&pk, 1);
            msgpack_pack_str_with_body(&pk, "v", 1);
            msgpack_pack_int(&pk, PROTO_VERSION);
        }
    }
}

static void frame_deep(rng_t *r, buf_t *f) {
    uint32_t depth = 1000 + below(r, 60000);
    if (chance(r, 50)) {
        // inside a message that otherwise looks right
        msgpack_packer pk;
        msgpack_packer_init(&pk, f, buf_write_cb);
        msgpack_pack_map(&pk, 3);
        msgpack_pack_str_with_body(&pk, "t", 1);
        msgpack_pack_str_with_body(&pk, "report", 6);
        msgpack_pack_str_with_body(&pk, "v", 1);
        msgpack_pack_int(&pk, PROTO_VERSION);
        msgpack_pack_str_with_body(&pk, "job", 3);
    }
    bool maps = chance(r, 30);
    for (uint32_t i = 0; i < depth; i++) {
        if (maps) buf_put(f, "\x81\xa1k", 3);
        else buf_byte(f, 0x91);
    }
    buf_byte(f, 0xc0);
}

// What the frames are made of: the token for API requests, the message types the kinds that
// start from a valid message build (--message), the kinds drawn (--only).
typedef struct {
    const char *token;
    int msgs[MT_N], n_msgs;
    bool req_allowed;
    int kinds[K_N];
    int n_kinds;
} cfg_t;

// One frame of kind k (not multipart or oversize) into f.
static void make_frame(rng_t *r, kind_t k, const cfg_t *c, buf_t *f) {
    const char *token = c->token;
    // with a token the target is the API: half the messages are requests, so many get past
    // the decoder into the operations
    int type = token && c->req_allowed && chance(r, 50) ? MT_REQ : c->msgs[below(r, (uint32_t)c->n_msgs)];
    switch (k) {
    case K_RANDOM: frame_random(r, f); break;
    case K_TRUNCATED:
        valid_frame(r, token, type, f);
        f->n = f->n > 1 ? below(r, (uint32_t)f->n) : 0;
        break;
    case K_VALID:
        if (chance(r, 25)) frame_not_a_map(r, f);
        else valid_frame(r, token, type, f);
        break;
    case K_BITFLIP:
        valid_frame(r, token, type, f);
        for (uint32_t i = 0, n = 1 + below(r, 4); i < n && f->n; i++) f->d[below(r, (uint32_t)f->n)] ^= (uint8_t)(1 + below(r, 255));
        break;
    case K_DEEP: frame_deep(r, f); break;
    case K_HUGE:
    case K_VERSION:
    case K_MUTATED: {
        if (k == K_HUGE && chance(r, 30)) {
            put_huge(r, f);
            break;
        }
        // otherwise a valid message re-packed with the change (a huge header somewhere inside)
        buf_t v = {0};
        valid_frame(r, token, type, &v);
        msgpack_unpacked u;
        if (unpack_frame(&v, &u)) {
            msgpack_packer pk;
            msgpack_packer_init(&pk, f, buf_write_cb);
            if (k == K_VERSION) pack_bad_version(r, &pk, &u.data);
            else pack_mutated(r, &pk, f, &u.data, k == K_HUGE ? MUT_HUGE : -1, 0);
        } else {
            buf_put(f, v.d, v.n);
        }
        msgpack_unpacked_destroy(&u);
        buf_free(&v);
        break;
    }
    default: frame_random(r, f);
    }
}

// --- sending ----------------------------------------------------------------------------------

typedef struct {
    void *sock;
    int type;
    uint64_t sent, failed, replies, bad_replies, answerable;
} sender_t;

// Reads whatever replies are waiting (dealer, req), up to wait_ms for the first one.
static void drain_replies(sender_t *s, int wait_ms) {
    if (s->type != ZMQ_DEALER && s->type != ZMQ_REQ) return;
    for (;;) {
        zmq_pollitem_t it = {.socket = s->sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, wait_ms) <= 0) return;
        wait_ms = 0;
        zmq_msg_t last, part;
        zmq_msg_init(&last);
        if (zmq_msg_recv(&last, s->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&last);
            return;
        }
        // a dealer that sent [""][request] gets [""][reply]: the reply is the last frame
        while (zmq_msg_more(&last)) {
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, s->sock, 0) < 0) {
                zmq_msg_close(&part);
                break;
            }
            zmq_msg_move(&last, &part);
            zmq_msg_close(&part);
        }
        // the scheduler API answers with "rep", a reward service with "reward_rep"
        proto_rep_t rep;
        proto_reward_rep_t rrep;
        char err[ERR_LEN], err2[ERR_LEN];
        const void *d = zmq_msg_data(&last);
        size_t n = zmq_msg_size(&last);
        s->replies++;
        if (proto_rep_decode(d, n, &rep, err) == 0) {
            proto_rep_free(&rep);
        } else if (proto_reward_rep_decode(d, n, &rrep, err2) == 0) {
            proto_reward_rep_free(&rrep);
        } else {
            s->bad_replies++;
            fprintf(stderr, "marlaas-fuzz-send: malformed reply: %s\n", err);
        }
        zmq_msg_close(&last);
    }
}

static void send_parts(sender_t *s, buf_t *parts, int n) {
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
        ok = zmq_send(s->sock, parts[i].d ? (void *)parts[i].d : (void *)"", parts[i].n, i + 1 < n ? ZMQ_SNDMORE : 0) >= 0;
    if (ok) s->sent++;
    else s->failed++;
}

static void usage(FILE *f) {
    fprintf(f, "usage: marlaas-fuzz-send --endpoint tcp://HOST:PORT --type push|dealer|req|pub|pull|sub --count N\n"
               "                         [--seed S] [--oversize] [--oversize-bytes B] [--token T] [--wait-ms MS]\n"
               "                         [--only KIND,...] [--message TYPE,...]\n"
               "                         [--keys DIR --as NAME --server NAME | --server-key KEY] [--send-timeout-ms MS]\n"
               "                         [--file PATH]\n"
               "Sends N hostile frames (deterministic for the seed; with --file, N copies of the file's bytes)\n"
               "and exits; see the source header.\n");
}

// A comma-separated subset of names[0..n) as indices (all of them when list is NULL).
static int parse_list(const char *flag, const char *list, const char *const *names, int n, int *out, int *n_out) {
    *n_out = 0;
    if (!list) {
        for (int i = 0; i < n; i++) out[(*n_out)++] = i;
        return 0;
    }
    char copy[256];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < n && strcmp(w, names[i])) i++;
        if (i == n) {
            fprintf(stderr, "marlaas-fuzz-send: %s: unknown name '%s' (one of:", flag, w);
            for (int k = 0; k < n; k++) fprintf(stderr, " %s", names[k]);
            fprintf(stderr, ")\n");
            return -1;
        }
        bool dup = false;
        for (int k = 0; k < *n_out; k++) dup |= out[k] == i;
        if (!dup) out[(*n_out)++] = i;
    }
    if (*n_out == 0) {
        fprintf(stderr, "marlaas-fuzz-send: %s names nothing\n", flag);
        return -1;
    }
    return 0;
}

static int parse_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "marlaas-fuzz-send: %s takes an integer in %" PRIu64 "..%" PRIu64 ", got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    const char *endpoint = NULL, *type_s = "push", *token = NULL;
    uint64_t count = 100, seed = 1, oversize_bytes = (uint64_t)PROTO_MAX_FRAME + 1, wait_ms = 1000, send_ms = 2000;
    bool oversize = false;
    static struct option lo[] = {{"endpoint", required_argument, 0, 'e'}, {"type", required_argument, 0, 't'},
                                 {"count", required_argument, 0, 'n'},    {"seed", required_argument, 0, 's'},
                                 {"oversize", no_argument, 0, 'o'},       {"oversize-bytes", required_argument, 0, 'O'},
                                 {"token", required_argument, 0, 'k'},    {"wait-ms", required_argument, 0, 'w'},
                                 {"only", required_argument, 0, 'y'},     {"message", required_argument, 0, 'm'},
                                 {"keys", required_argument, 0, 'K'},     {"as", required_argument, 0, 'A'},
                                 {"server", required_argument, 0, 'S'},   {"server-key", required_argument, 0, 'P'},
                                 {"send-timeout-ms", required_argument, 0, 'T'}, {"file", required_argument, 0, 'F'},
                                 {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *only = NULL, *messages = NULL, *keys = NULL, *as = NULL, *server = NULL, *server_key = NULL,
               *file = NULL;
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int bad = 0;
        switch (o) {
        case 'e': endpoint = optarg; break;
        case 't': type_s = optarg; break;
        case 'n': bad = parse_u64("--count", optarg, 1, MAX_COUNT, &count); break;
        case 's': bad = parse_u64("--seed", optarg, 0, UINT64_MAX, &seed); break;
        case 'o': oversize = true; break;
        case 'O': bad = parse_u64("--oversize-bytes", optarg, 1, 1ull << 30, &oversize_bytes), oversize = true; break;
        case 'k': token = optarg; break;
        case 'w': bad = parse_u64("--wait-ms", optarg, 0, 600000, &wait_ms); break;
        case 'y': only = optarg; break;
        case 'm': messages = optarg; break;
        case 'K': keys = optarg; break;
        case 'A': as = optarg; break;
        case 'S': server = optarg; break;
        case 'P': server_key = optarg; break;
        case 'T': bad = parse_u64("--send-timeout-ms", optarg, 1, 600000, &send_ms); break;
        case 'F': file = optarg; break;
        case 'h': usage(stdout); return 0;
        default: bad = 1;
        }
        if (bad) {
            if (bad > 0) usage(stderr);
            return 2;
        }
    }
    cfg_t cfg = {.token = token};
    if (parse_list("--only", only, kind_name, K_OVERSIZE, cfg.kinds, &cfg.n_kinds) ||
        parse_list("--message", messages, msg_name, MT_N, cfg.msgs, &cfg.n_msgs))
        return 2;
    for (int i = 0; i < cfg.n_msgs; i++) cfg.req_allowed |= cfg.msgs[i] == MT_REQ;
    int type = !strcmp(type_s, "push") ? ZMQ_PUSH : !strcmp(type_s, "dealer") ? ZMQ_DEALER
             : !strcmp(type_s, "req") ? ZMQ_REQ : !strcmp(type_s, "pub") ? ZMQ_PUB
             : !strcmp(type_s, "pull") ? ZMQ_PULL : !strcmp(type_s, "sub") ? ZMQ_SUB : -1;
    if (!endpoint || type < 0 || optind < argc) {
        if (type < 0)
            fprintf(stderr, "marlaas-fuzz-send: --type must be push, dealer, req, pub, pull or sub, got '%s'\n", type_s);
        usage(stderr);
        return 2;
    }

    buf_t fbytes = {0};
    if (file) {
        FILE *f = fopen(file, "rb");
        char chunk[65536];
        size_t got;
        while (f && (got = fread(chunk, 1, sizeof chunk, f)) > 0) buf_put(&fbytes, chunk, got);
        if (!f || ferror(f)) {
            fprintf(stderr, "marlaas-fuzz-send: cannot read %s: %s\n", file, strerror(errno));
            if (f) fclose(f);
            buf_free(&fbytes);
            return 2;
        }
        fclose(f);
    }

    void *ctx = zmq_ctx_new();
    sender_t s = {.type = type, .sock = ctx ? zmq_socket(ctx, type) : NULL};
    if (!s.sock) {
        fprintf(stderr, "marlaas-fuzz-send: cannot create a socket: %s\n", zmq_strerror(zmq_errno()));
        if (ctx) zmq_ctx_term(ctx);
        return 2;
    }
    // Bounded everywhere: a peer that stops reading (or a handshake that never completes) costs
    // at most --send-timeout-ms (2000) per frame and 2 s at exit.
    int hwm = 100000, sndtimeo = (int)send_ms, linger = 2000, one = 1;
    zmq_setsockopt(s.sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s.sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    zmq_setsockopt(s.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_REQ) {
        // a request that gets no answer (it was malformed) must not block the next one
        zmq_setsockopt(s.sock, ZMQ_REQ_RELAXED, &one, sizeof one);
        zmq_setsockopt(s.sock, ZMQ_REQ_CORRELATE, &one, sizeof one);
    }
    if (keys || as || server || server_key) {
        char err[ERR_LEN], key[41];
        zcert_t *mine = NULL;
        if (server_key ? (keys || as || server) : !(keys && as && server)) {
            fprintf(stderr, "marlaas-fuzz-send: give --keys, --as and --server together, or --server-key alone\n");
        } else if (bus_public_key(keys, server_key ? server_key : server, key, err)) {
            fprintf(stderr, "marlaas-fuzz-send: %s\n", err);
        } else {
            char path[1200];
            snprintf(path, sizeof path, "%s/%s.key_secret", keys ? keys : "", as ? as : "");
            mine = server_key ? zcert_new() : zcert_load(path);
            if (!mine) fprintf(stderr, "marlaas-fuzz-send: cannot load the keypair %s\n", path);
        }
        if (!mine) {
            zmq_close(s.sock);
            zmq_ctx_term(ctx);
            buf_free(&fbytes);
            return 2;
        }
        zcert_apply(mine, s.sock);
        zcert_destroy(&mine);
        zmq_setsockopt(s.sock, ZMQ_CURVE_SERVERKEY, key, 40);
    }
    if (zmq_connect(s.sock, endpoint) != 0) {
        fprintf(stderr, "marlaas-fuzz-send: cannot connect to %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        zmq_close(s.sock);
        zmq_ctx_term(ctx);
        buf_free(&fbytes);
        return 2;
    }
    if (type == ZMQ_PULL || type == ZMQ_SUB) {
        // the eavesdropper: take what the socket yields within --wait-ms (a PULL on the work
        // port takes tasks meant for rollouts; a SUB on an event port reads every event)
        if (type == ZMQ_SUB) zmq_setsockopt(s.sock, ZMQ_SUBSCRIBE, "", 0);
        uint64_t got = 0, bytes = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            long left = (long)wait_ms - ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
            if (left <= 0) break;
            zmq_pollitem_t it = {.socket = s.sock, .events = ZMQ_POLLIN};
            if (zmq_poll(&it, 1, left) <= 0) continue;
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s.sock, ZMQ_DONTWAIT) >= 0) got++, bytes += zmq_msg_size(&m);
            zmq_msg_close(&m);
        }
        printf("received %" PRIu64 " frames (%" PRIu64 " bytes) from %s (%s) in %" PRIu64 " ms\n", got, bytes, endpoint,
               type_s, wait_ms);
        zmq_close(s.sock);
        zmq_ctx_term(ctx);
        buf_free(&fbytes);
        return 0;
    }
    if (type == ZMQ_PUB) {
        // a subscriber sees only what is sent after it has connected and subscribed
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
    }

    uint64_t n_over = oversize ? count / 100 + 1 : 0, by_kind[K_N] = {0};
    if (n_over > MAX_OVERSIZE_FRAMES) n_over = MAX_OVERSIZE_FRAMES;
    if (n_over > count) n_over = count;
    rng_t r = {.s = seed};
    uint64_t next_over = 0;
    for (uint64_t i = 0; file && i < count; i++) {
        // the file's bytes as one frame, a one-frame message (answerable on dealer and req)
        s.answerable++;
        send_parts(&s, &fbytes, 1);
        drain_replies(&s, type == ZMQ_REQ ? 100 : 0);
    }
    for (uint64_t i = 0; !file && i < count; i++) {
        buf_t parts[4] = {{0}};
        int n_parts = 1;
        kind_t k;
        // oversize frames sit evenly through the run, so frames follow each one
        if (next_over < n_over && i == (2 * next_over + 1) * count / (2 * n_over)) {
            k = K_OVERSIZE;
            next_over++;
        } else {
            k = (kind_t)cfg.kinds[below(&r, (uint32_t)cfg.n_kinds)];
        }
        by_kind[k]++;
        if (k == K_OVERSIZE) {
            // valid MessagePack (one string), so only the size is wrong
            size_t n = (size_t)oversize_bytes;
            parts[0].d = malloc(n);
            if (!parts[0].d) abort();
            parts[0].n = parts[0].cap = n;
            memset(parts[0].d, 'A', n);
            if (n > 5) {
                uint32_t body = (uint32_t)(n - 5);
                uint8_t h[5] = {0xdb, (uint8_t)(body >> 24), (uint8_t)(body >> 16), (uint8_t)(body >> 8), (uint8_t)body};
                memcpy(parts[0].d, h, 5);
            }
        } else if (k == K_MULTIPART) {
            n_parts = 2 + (int)below(&r, 3);
            bool envelope = type == ZMQ_DEALER && chance(&r, 40);
            if (envelope) n_parts = 2;   // [""][request]: what a REQ client sends, answered
            for (int p = envelope ? 1 : 0; p < n_parts; p++)
                make_frame(&r, p == 1 && envelope ? K_VALID : (kind_t)below(&r, K_DEEP), &cfg, &parts[p]);
            if (envelope) s.answerable++;
        } else {
            make_frame(&r, k, &cfg, &parts[0]);
        }
        // a ROUTER API answers a one-frame request (or [""][request]), malformed or not; a REQ
        // socket wraps every message in that envelope, so a REP peer answers each
        if (type == ZMQ_REQ ? k != K_OVERSIZE : k != K_MULTIPART && k != K_OVERSIZE) s.answerable++;
        send_parts(&s, parts, n_parts);
        for (int p = 0; p < n_parts; p++) buf_free(&parts[p]);
        drain_replies(&s, type == ZMQ_REQ ? 100 : 0);
    }
    // replies still on their way
    for (uint64_t waited = 0; (type == ZMQ_DEALER || type == ZMQ_REQ) && s.replies < s.answerable && waited < wait_ms;
         waited += 50)
        drain_replies(&s, 50);
    zmq_close(s.sock);
    zmq_ctx_term(ctx);

    printf("sent %" PRIu64 " of %" PRIu64 " frames to %s (%s, seed %" PRIu64 "):", s.sent, count, endpoint, type_s, seed);
    if (file) printf(" file %s (%zu bytes)", file, fbytes.n);
    buf_free(&fbytes);
    for (int k = 0; k < K_N; k++)
        if (by_kind[k]) printf(" %s %" PRIu64, kind_name[k], by_kind[k]);
    printf("; failed %" PRIu64, s.failed);
    if (type == ZMQ_DEALER || type == ZMQ_REQ)
        printf("; replies %" PRIu64 " to %" PRIu64 " answerable frames, %" PRIu64 " malformed", s.replies, s.answerable,
               s.bad_replies);
    printf("\n");
    return s.failed || s.bad_replies ? 1 : 0;
}

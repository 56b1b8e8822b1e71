// proto.c - MessagePack encoding and validating decoding of every MARLaaS message (proto.h).
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
#include "proto.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Services keep ids in char[PROTO_MAX_ID] buffers, so an id on the wire leaves room for the NUL.
#define PROTO_ID_LEN (PROTO_MAX_ID - 1)

void proto_buf_free(proto_buf_t *b) {
    if (!b) return;
    free(b->data);
    memset(b, 0, sizeof *b);
}

// ---------------------------------------------------------------------------------------------
// Bounds pre-check
//
// msgpack-c allocates a container's element array from the count in its header before it reads
// a single element, so a 5-byte header claiming 2^32-1 elements asks for ~128 GiB. This walk
// reads only headers and lengths (decoding stays with the library) and accepts an object only
// when every declared element has at least one byte behind it, which bounds the library's
// allocation by the size of the frame.

typedef struct {
    size_t head;       // bytes of the header (lead byte, length field, ext type)
    uint64_t body;     // bytes of payload after the header
    uint64_t items;    // objects nested directly in it (2 per map entry)
    bool map;
} proto_head_t;

static uint64_t proto_be(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

// Reads the header at p[pos] (pos < len). -1 for a byte that starts no object or a header cut off.
static int proto_head(const uint8_t *p, size_t len, size_t pos, proto_head_t *h) {
    uint8_t c = p[pos];
    size_t lb = 0, extra = 0;   // bytes of the big-endian length field; of the ext type after it
    int per = 0;                // 0: the length counts payload bytes; 1 / 2: objects per element
    memset(h, 0, sizeof *h);
    h->head = 1;
    if (c <= 0x7f || c >= 0xe0) return 0;                    // fixint
    if (c <= 0x8f) {                                         // fixmap
        h->items = 2u * (c & 0x0fu);
        h->map = true;
        return 0;
    }
    if (c <= 0x9f) { h->items = c & 0x0fu; return 0; }       // fixarray
    if (c <= 0xbf) { h->body = c & 0x1fu; return 0; }        // fixstr
    switch (c) {
    case 0xc0: case 0xc2: case 0xc3: return 0;               // nil, false, true
    case 0xc4: case 0xd9: lb = 1; break;                     // bin 8, str 8
    case 0xc5: case 0xda: lb = 2; break;
    case 0xc6: case 0xdb: lb = 4; break;
    case 0xc7: lb = 1; extra = 1; break;                     // ext 8 / 16 / 32
    case 0xc8: lb = 2; extra = 1; break;
    case 0xc9: lb = 4; extra = 1; break;
    case 0xcc: case 0xd0: h->body = 1; return 0;             // (u)int 8 .. 64
    case 0xcd: case 0xd1: h->body = 2; return 0;
    case 0xca: case 0xce: case 0xd2: h->body = 4; return 0;  // and float 32 / 64
    case 0xcb: case 0xcf: case 0xd3: h->body = 8; return 0;
    case 0xd4: h->body = 2; return 0;                        // fixext: type + 1 .. 16 bytes
    case 0xd5: h->body = 3; return 0;
    case 0xd6: h->body = 5; return 0;
    case 0xd7: h->body = 9; return 0;
    case 0xd8: h->body = 17; return 0;
    case 0xdc: lb = 2; per = 1; break;                       // array 16 / 32
    case 0xdd: lb = 4; per = 1; break;
    case 0xde: lb = 2; per = 2; break;                       // map 16 / 32
    case 0xdf: lb = 4; per = 2; break;
    default: return -1;                                      // 0xc1 is never used
    }
    if (1 + lb + extra > len - pos) return -1;
    uint64_t n = proto_be(p + pos + 1, lb);
    h->head = 1 + lb + extra;
    if (per == 0) {
        h->body = n;
    } else {
        h->items = n * (uint64_t)per;
        h->map = per == 2;
    }
    return 0;
}

// Advances *pos past one complete object. -1 if it is cut off, malformed, or declares more
// elements than there are bytes left in p[0..len).
static int proto_skip(const uint8_t *p, size_t len, size_t *pos) {
    size_t at = *pos;
    uint64_t pending = 1;
    while (pending > 0) {
        proto_head_t h;
        if (at >= len || proto_head(p, len, at, &h)) return -1;
        at += h.head;
        if (h.body > len - at) return -1;
        at += (size_t)h.body;
        pending = pending - 1 + h.items;
        if (pending > len - at) return -1;
    }
    *pos = at;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Decoding helpers. Each names the field as pre + name (pre is "" or a path like "groups[3].").

typedef struct {
    const char *msg;   // message type, the prefix of every error
    char *err;
} proto_dec_t;

__attribute__((format(printf, 2, 3)))
static int proto_fail(const proto_dec_t *d, const char *fmt, ...) {
    if (!d->err) return -1;
    int k = snprintf(d->err, ERR_LEN, "%s: ", d->msg);
    if (k < 0 || k >= ERR_LEN) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err + k, ERR_LEN - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

// Copies at most n-1 bytes of untrusted text for an error message, unprintable bytes as '?'.
static const char *proto_printable(char *dst, size_t n, const char *src, size_t len) {
    size_t k = 0;
    for (; k < len && k + 1 < n; k++) {
        unsigned char c = (unsigned char)src[k];
        dst[k] = c >= 0x20 && c < 0x7f && c != '\'' ? (char)c : '?';
    }
    dst[k] = '\0';
    return dst;
}

static const char *proto_type_name(msgpack_object_type t) {
    switch (t) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "a binary";
    case MSGPACK_OBJECT_EXT: return "an extension";
    }
    return "an unknown object";
}

static bool proto_key_is(const msgpack_object *k, const char *name) {
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, name, n) == 0;
}

// Finds the listed keys of a map: f[i] = value of names[i] or NULL.
static int proto_fields(const proto_dec_t *d, const msgpack_object *map, const char *pre,
                        const char *const *names, size_t n, const msgpack_object **f) {
    for (size_t i = 0; i < n; i++) f[i] = NULL;
    for (uint32_t e = 0; e < map->via.map.size; e++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[e];
        if (kv->key.type != MSGPACK_OBJECT_STR) {
            if (!*pre) return proto_fail(d, "the message map has a key that is not a string");
            return proto_fail(d, "field '%.*s' has a key that is not a string", (int)strlen(pre) - 1, pre);
        }
        for (size_t i = 0; i < n; i++) {
            if (!proto_key_is(&kv->key, names[i])) continue;
            if (f[i]) return proto_fail(d, "duplicate field '%s%s'", pre, names[i]);
            f[i] = &kv->val;
            break;
        }
    }
    return 0;
}

static int proto_missing(const proto_dec_t *d, const char *pre, const char *name) {
    return proto_fail(d, "missing field '%s%s'", pre, name);
}

static int proto_get_uint(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                          uint64_t min, uint64_t max, uint64_t *out) {
    if (!o) return proto_missing(d, pre, name);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return proto_fail(d, "field '%s%s' out of range (%" PRId64 "; must be %" PRIu64 "..%" PRIu64 ")", pre,
                          name, o->via.i64, min, max);
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return proto_fail(d, "field '%s%s' must be an unsigned integer, not %s", pre, name, proto_type_name(o->type));
    if (o->via.u64 < min || o->via.u64 > max)
        return proto_fail(d, "field '%s%s' out of range (%" PRIu64 "; must be %" PRIu64 "..%" PRIu64 ")", pre,
                          name, o->via.u64, min, max);
    *out = o->via.u64;
    return 0;
}

static int proto_get_u32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         uint32_t min, uint32_t max, uint32_t *out) {
    uint64_t v;
    if (proto_get_uint(d, o, pre, name, min, max, &v)) return -1;
    *out = (uint32_t)v;
    return 0;
}

// f32: the value must also fit a float, which a finite double need not.
static int proto_get_num(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         bool f32, double *out) {
    double v;
    if (!o) return proto_missing(d, pre, name);
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: v = o->via.f64; break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: v = (double)o->via.u64; break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: v = (double)o->via.i64; break;
    default: return proto_fail(d, "field '%s%s' must be a number, not %s", pre, name, proto_type_name(o->type));
    }
    if (!isfinite(v)) return proto_fail(d, "field '%s%s' must be finite", pre, name);
    if (f32 && fabs(v) > FLT_MAX) return proto_fail(d, "field '%s%s' out of range for a 32-bit float", pre, name);
    *out = v;
    return 0;
}

static int proto_get_f32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         float *out) {
    double v;
    if (proto_get_num(d, o, pre, name, true, &v)) return -1;
    *out = (float)v;
    return 0;
}

static int proto_get_bool(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                          bool *out) {
    if (!o) return proto_missing(d, pre, name);
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return proto_fail(d, "field '%s%s' must be a boolean, not %s", pre, name, proto_type_name(o->type));
    *out = o->via.boolean;
    return 0;
}

static int proto_copy_str(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                          size_t max, char **out) {
    size_t n = o->via.str.size;
    if (n > max) return proto_fail(d, "field '%s%s' is longer than %zu bytes", pre, name, max);
    if (n && memchr(o->via.str.ptr, 0, n)) return proto_fail(d, "field '%s%s' contains a NUL byte", pre, name);
    char *s = xmalloc(n + 1);
    if (n) memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    *out = s;
    return 0;
}

// nullable: nil or an absent key gives *out = NULL.
static int proto_get_str(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         size_t max, bool nullable, char **out) {
    if (nullable && (!o || o->type == MSGPACK_OBJECT_NIL)) {
        *out = NULL;
        return 0;
    }
    if (!o) return proto_missing(d, pre, name);
    if (o->type != MSGPACK_OBJECT_STR)
        return proto_fail(d, "field '%s%s' must be a string%s, not %s", pre, name, nullable ? " or nil" : "",
                          proto_type_name(o->type));
    return proto_copy_str(d, o, pre, name, max, out);
}

static int proto_get_array(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                           uint32_t max, const msgpack_object_array **out) {
    if (!o) return proto_missing(d, pre, name);
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return proto_fail(d, "field '%s%s' must be an array, not %s", pre, name, proto_type_name(o->type));
    if (o->via.array.size > max)
        return proto_fail(d, "field '%s%s' has %" PRIu32 " elements, more than %" PRIu32, pre, name,
                          o->via.array.size, max);
    *out = &o->via.array;
    return 0;
}

static int proto_check_map(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name) {
    if (o->type != MSGPACK_OBJECT_MAP)
        return proto_fail(d, "field '%s%s' must be a map, not %s", pre, name, proto_type_name(o->type));
    return 0;
}

static int proto_get_tokens(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                            int32_t **tokens, uint32_t *n) {
    const msgpack_object_array *a = NULL;
    if (proto_get_array(d, o, pre, name, PROTO_MAX_TOKENS, &a)) return -1;
    if (a->size == 0) return 0;
    int32_t *t = xmalloc(sizeof *t * a->size);
    *tokens = t;
    *n = a->size;
    for (uint32_t i = 0; i < a->size; i++) {
        const msgpack_object *e = &a->ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > INT32_MAX)
            return proto_fail(d, "field '%s%s[%" PRIu32 "]' must be a token id (0..%d), not %s", pre, name, i,
                              INT32_MAX, e->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? "a larger integer"
                                                                                   : proto_type_name(e->type));
        t[i] = (int32_t)e->via.u64;
    }
    return 0;
}

static int proto_get_args(const proto_dec_t *d, const msgpack_object *o, const char *name, proto_args_t *a) {
    if (!o) return proto_missing(d, "", name);
    if (proto_check_map(d, o, "", name)) return -1;
    const msgpack_object_map *m = &o->via.map;
    if (m->size > PROTO_MAX_ARGS)
        return proto_fail(d, "field '%s' has %" PRIu32 " entries, more than %d", name, m->size, PROTO_MAX_ARGS);
    if (m->size == 0) return 0;
    a->v = xcalloc(m->size, sizeof *a->v);
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key, *val = &m->ptr[i].val;
        char shown[PROTO_ID_LEN + 1];
        if (k->type != MSGPACK_OBJECT_STR)
            return proto_fail(d, "field '%s' has a key that is not a string", name);
        proto_printable(shown, sizeof shown, k->via.str.ptr, k->via.str.size);
        if (k->via.str.size > PROTO_ID_LEN)
            return proto_fail(d, "field '%s' has a key longer than %d bytes ('%s...')", name, PROTO_ID_LEN, shown);
        for (uint32_t j = 0; j < i; j++)
            if (m->ptr[j].key.via.str.size == k->via.str.size &&
                memcmp(m->ptr[j].key.via.str.ptr, k->via.str.ptr, k->via.str.size) == 0)
                return proto_fail(d, "duplicate key '%s.%s'", name, shown);
        if (memchr(k->via.str.ptr, 0, k->via.str.size))
            return proto_fail(d, "field '%s' has a key that contains a NUL byte ('%s')", name, shown);
        proto_val_t *v = &a->v[a->n++];
        v->key = xmalloc(k->via.str.size + 1);
        if (k->via.str.size) memcpy(v->key, k->via.str.ptr, k->via.str.size);
        v->key[k->via.str.size] = '\0';
        switch (val->type) {
        case MSGPACK_OBJECT_NIL: v->kind = PROTO_VAL_NIL; break;
        case MSGPACK_OBJECT_BOOLEAN:
            v->kind = PROTO_VAL_BOOL;
            v->i = val->via.boolean ? 1 : 0;
            break;
        case MSGPACK_OBJECT_POSITIVE_INTEGER:
            if (val->via.u64 > INT64_MAX)
                return proto_fail(d, "field '%s.%s' out of range (%" PRIu64 "; must fit a 64-bit signed integer)",
                                  name, shown, val->via.u64);
            v->kind = PROTO_VAL_INT;
            v->i = (int64_t)val->via.u64;
            break;
        case MSGPACK_OBJECT_NEGATIVE_INTEGER:
            v->kind = PROTO_VAL_INT;
            v->i = val->via.i64;
            break;
        case MSGPACK_OBJECT_FLOAT32:
        case MSGPACK_OBJECT_FLOAT64:
            if (!isfinite(val->via.f64)) return proto_fail(d, "field '%s.%s' must be finite", name, shown);
            v->kind = PROTO_VAL_FLOAT;
            v->f = val->via.f64;
            break;
        case MSGPACK_OBJECT_STR: {
            char path[PROTO_ID_LEN + 16];
            snprintf(path, sizeof path, "%s.", name);
            if (proto_copy_str(d, val, path, shown, PROTO_MAX_STR, &v->s)) return -1;
            v->kind = PROTO_VAL_STR;
            v->len = val->via.str.size;
            break;
        }
        case MSGPACK_OBJECT_BIN:
            // NUL-terminated as well, so a bin that holds text can be read as a string.
            v->kind = PROTO_VAL_BIN;
            v->len = val->via.bin.size;
            v->s = xmalloc(v->len + 1);
            if (v->len) memcpy(v->s, val->via.bin.ptr, v->len);
            v->s[v->len] = '\0';
            break;
        default:
            return proto_fail(d, "field '%s.%s' must be nil, a boolean, an integer, a float, a string or a binary, "
                              "not %s", name, shown, proto_type_name(val->type));
        }
    }
    return 0;
}

static int proto_check_frame(const proto_dec_t *d, const void *frame, size_t len) {
    if (len > PROTO_MAX_FRAME)
        return proto_fail(d, "frame of %zu bytes is larger than the %u byte cap", len, PROTO_MAX_FRAME);
    if (len == 0 || !frame) return proto_fail(d, "empty frame");
    return 0;
}

static int proto_check_version(const proto_dec_t *d, const msgpack_object *v) {
    if (!v) return proto_missing(d, "", "v");
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER && v->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return proto_fail(d, "field 'v' must be an unsigned integer, not %s", proto_type_name(v->type));
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return proto_fail(d, "unsupported protocol version %" PRId64, v->via.i64);
    if (v->via.u64 != PROTO_VERSION) return proto_fail(d, "unsupported protocol version %" PRIu64, v->via.u64);
    return 0;
}

// Unpacks a frame that must be one complete map of message type d->msg; finds its listed keys
// (names[0] = "t", names[1] = "v"). u owns the objects f points into.
static int proto_open(const proto_dec_t *d, const void *frame, size_t len, msgpack_unpacked *u,
                      const char *const *names, size_t n, const msgpack_object **f) {
    if (proto_check_frame(d, frame, len)) return -1;
    size_t end = 0, off = 0;
    if (proto_skip(frame, len, &end)) return proto_fail(d, "frame is not a complete MessagePack object");
    if (end != len) return proto_fail(d, "%zu trailing bytes after the message", len - end);
    if (msgpack_unpack_next(u, frame, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        return proto_fail(d, "frame is not a valid MessagePack object");
    if (u->data.type != MSGPACK_OBJECT_MAP)
        return proto_fail(d, "frame is %s, not a MessagePack map", proto_type_name(u->data.type));
    if (proto_fields(d, &u->data, "", names, n, f)) return -1;
    if (proto_check_version(d, f[1])) return -1;
    const msgpack_object *t = f[0];
    if (!t) return proto_missing(d, "", "t");
    if (t->type != MSGPACK_OBJECT_STR)
        return proto_fail(d, "field 't' must be a string, not %s", proto_type_name(t->type));
    if (!proto_key_is(t, d->msg)) {
        char shown[40];
        return proto_fail(d, "expected message type '%s', got '%s'", d->msg,
                          proto_printable(shown, sizeof shown, t->via.str.ptr, t->via.str.size));
    }
    return 0;
}

int proto_peek_type(const void *frame, size_t len, char type[32], char *err) {
    const proto_dec_t d = {"message", err};
    const uint8_t *p = frame;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    bool have_t = false, have_v = false;
    proto_head_t h;
    type[0] = '\0';
    if (proto_check_frame(&d, frame, len)) goto fail;
    if (proto_head(p, len, 0, &h) || !h.map) {
        proto_fail(&d, "frame is not a MessagePack map");
        goto fail;
    }
    // Only the entries up to "t" and "v" are read (encoders put them first); the full decode
    // validates the rest.
    size_t pos = h.head;
    for (uint64_t e = 0; e < h.items / 2 && !(have_t && have_v); e++) {
        size_t kpos = pos, vpos, off;
        if (proto_skip(p, len, &pos)) goto truncated;
        vpos = pos;
        if (proto_skip(p, len, &pos)) goto truncated;
        off = kpos;
        if (msgpack_unpack_next(&u, frame, vpos, &off) != MSGPACK_UNPACK_SUCCESS) goto truncated;
        bool is_t = proto_key_is(&u.data, "t"), is_v = proto_key_is(&u.data, "v");
        if (!is_t && !is_v) continue;
        if ((is_t && have_t) || (is_v && have_v)) {
            proto_fail(&d, "duplicate field '%s'", is_t ? "t" : "v");
            goto fail;
        }
        off = vpos;
        if (msgpack_unpack_next(&u, frame, pos, &off) != MSGPACK_UNPACK_SUCCESS) goto truncated;
        const msgpack_object *o = &u.data;
        if (is_v) {
            if (proto_check_version(&d, o)) goto fail;
            have_v = true;
            continue;
        }
        if (o->type != MSGPACK_OBJECT_STR) {
            proto_fail(&d, "field 't' must be a string, not %s", proto_type_name(o->type));
            goto fail;
        }
        if (o->via.str.size > 31 || (o->via.str.size && memchr(o->via.str.ptr, 0, o->via.str.size))) {
            proto_fail(&d, "field 't' is not a message type (longer than 31 bytes or contains NUL)");
            goto fail;
        }
        if (o->via.str.size) memcpy(type, o->via.str.ptr, o->via.str.size);
        type[o->via.str.size] = '\0';
        have_t = true;
    }
    if (!have_v) {
        proto_missing(&d, "", "v");
        goto fail;
    }
    if (!have_t) {
        proto_missing(&d, "", "t");
        goto fail;
    }
    msgpack_unpacked_destroy(&u);
    return 0;
truncated:
    proto_fail(&d, "frame is not a complete MessagePack map");
fail:
    msgpack_unpacked_destroy(&u);
    type[0] = '\0';
    return -1;
}

// ---------------------------------------------------------------------------------------------
// Encoding helpers. Each is a no-op once the message is known to be bad; proto_enc_end then
// rolls the buffer back.

typedef struct {
    msgpack_packer pk;
    proto_buf_t *out;
    size_t start;      // out->len before this message
    bool bad;
} proto_enc_t;

static int proto_enc_write(void *data, const char *buf, size_t n) {
    proto_enc_t *e = data;
    proto_buf_t *b = e->out;
    // Refusing here keeps an oversized message from growing the buffer to its full size.
    if (n > PROTO_MAX_FRAME - (b->len - e->start)) return -1;
    if (n > b->cap - b->len) {
        size_t cap = b->cap < 256 ? 256 : b->cap;
        while (cap - b->len < n) cap *= 2;
        b->data = xrealloc(b->data, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, buf, n);
    b->len += n;
    return 0;
}

static void proto_enc_rc(proto_enc_t *e, int rc) {
    if (rc) e->bad = true;
}

static void proto_enc_key(proto_enc_t *e, const char *k) {
    if (!e->bad) proto_enc_rc(e, msgpack_pack_str_with_body(&e->pk, k, strlen(k)));
}

static void proto_enc_str(proto_enc_t *e, const char *s, size_t max, bool nullable) {
    if (e->bad) return;
    if (!s) {
        if (nullable) proto_enc_rc(e, msgpack_pack_nil(&e->pk));
        else e->bad = true;
        return;
    }
    size_t n = strlen(s);
    if (n > max) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_str_with_body(&e->pk, s, n));
}

static void proto_enc_uint(proto_enc_t *e, uint64_t v, uint64_t max) {
    if (e->bad) return;
    if (v > max) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_uint64(&e->pk, v));
}

static void proto_enc_f32(proto_enc_t *e, float v) {
    if (e->bad) return;
    if (!isfinite(v)) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_float(&e->pk, v));
}

static void proto_enc_f64(proto_enc_t *e, double v) {
    if (e->bad) return;
    if (!isfinite(v)) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_double(&e->pk, v));
}

static void proto_enc_bool(proto_enc_t *e, bool v) {
    if (!e->bad) proto_enc_rc(e, v ? msgpack_pack_true(&e->pk) : msgpack_pack_false(&e->pk));
}

// An array header for n elements stored at p (which may be NULL only when n is 0).
static void proto_enc_array(proto_enc_t *e, size_t n, size_t max, const void *p) {
    if (e->bad) return;
    if (n > max || (n && !p)) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_array(&e->pk, n));
}

static void proto_enc_begin(proto_enc_t *e, proto_buf_t *out, const char *type, size_t n_fields) {
    e->out = out;
    e->start = out->len;
    e->bad = false;
    msgpack_packer_init(&e->pk, e, proto_enc_write);
    proto_enc_rc(e, msgpack_pack_map(&e->pk, n_fields + 2));
    proto_enc_key(e, "t");
    proto_enc_str(e, type, PROTO_MAX_STR, false);
    proto_enc_key(e, "v");
    proto_enc_uint(e, PROTO_VERSION, UINT64_MAX);
}

static int proto_enc_end(proto_enc_t *e) {
    if (!e->bad) return 0;
    e->out->len = e->start;
    return -1;
}

static void proto_enc_tokens(proto_enc_t *e, const int32_t *t, uint32_t n) {
    proto_enc_array(e, n, PROTO_MAX_TOKENS, t);
    for (uint32_t i = 0; i < n && !e->bad; i++) {
        if (t[i] < 0) e->bad = true;
        else proto_enc_rc(e, msgpack_pack_uint32(&e->pk, (uint32_t)t[i]));
    }
}

static void proto_enc_logprobs(proto_enc_t *e, const float *lp, uint32_t n) {
    if (e->bad) return;
    if (n && !lp) {
        e->bad = true;
        return;
    }
    proto_enc_rc(e, msgpack_pack_bin(&e->pk, (size_t)n * 4));
    uint8_t chunk[256];
    for (uint32_t i = 0; i < n && !e->bad;) {
        size_t k = 0;
        for (; i < n && k < sizeof chunk; i++, k += 4) {
            uint32_t u;
            memcpy(&u, &lp[i], 4);
            chunk[k] = (uint8_t)u;
            chunk[k + 1] = (uint8_t)(u >> 8);
            chunk[k + 2] = (uint8_t)(u >> 16);
            chunk[k + 3] = (uint8_t)(u >> 24);
        }
        proto_enc_rc(e, msgpack_pack_bin_body(&e->pk, chunk, k));
    }
}

static bool proto_args_dup(const proto_args_t *a, uint32_t i) {
    for (uint32_t j = 0; j < i; j++)
        if (strcmp(a->v[j].key, a->v[i].key) == 0) return true;
    return false;
}

static void proto_enc_args(proto_enc_t *e, const proto_args_t *a) {
    if (e->bad) return;
    if (a->n > PROTO_MAX_ARGS || (a->n && !a->v)) {
        e->bad = true;
        return;
    }
    proto_enc_rc(e, msgpack_pack_map(&e->pk, a->n));
    for (uint32_t i = 0; i < a->n && !e->bad; i++) {
        const proto_val_t *v = &a->v[i];
        if (!v->key || strlen(v->key) > PROTO_ID_LEN || proto_args_dup(a, i)) {
            e->bad = true;
            break;
        }
        proto_enc_key(e, v->key);
        switch (v->kind) {
        case PROTO_VAL_NIL: proto_enc_rc(e, msgpack_pack_nil(&e->pk)); break;
        case PROTO_VAL_INT: proto_enc_rc(e, msgpack_pack_int64(&e->pk, v->i)); break;
        case PROTO_VAL_FLOAT: proto_enc_f64(e, v->f); break;
        case PROTO_VAL_STR: proto_enc_str(e, v->s, PROTO_MAX_STR, false); break;
        case PROTO_VAL_BOOL: proto_enc_bool(e, v->i != 0); break;
        case PROTO_VAL_BIN:
            if ((v->len && !v->s) || v->len > PROTO_MAX_FRAME) {
                e->bad = true;
                break;
            }
            proto_enc_rc(e, msgpack_pack_bin_with_body(&e->pk, v->s, v->len));
            break;
        default: e->bad = true; break;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// "task"

enum { TK_T, TK_V, TK_TASK, TK_JOB, TK_VER, TK_KIND, TK_G, TK_MAX_NEW, TK_TEMP, TK_TOP_P, TK_TOP_K, TK_SEED,
       TK_ITEMS, TK_TURNS, TK_CTX, TK_END, TK_N };
static const char *const proto_task_keys[TK_N] = {"t", "v", "task", "job", "ver", "kind", "g", "max_new",
                                                  "temp", "top_p", "top_k", "seed", "items", "turns", "ctx", "end"};
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
        proto_opt_u32(&d, f[TK_END], "", "end", PROTO_END_LINE, PROTO_END_EOS, PROTO_END_LINE, &end))
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
       BA_TURNS, BA_CTX, BA_TOP_P, BA_SEED, BA_N };
static const char *const proto_batch_keys[BA_N] = {"t", "v", "task", "job", "ver", "kind", "temp", "worker",
                                                   "gen_s", "groups", "max_new", "top_k", "turns", "ctx",
                                                   "top_p", "seed"};
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
        (f[BA_SEED] && proto_get_uint(&d, f[BA_SEED], "", "seed", 0, UINT64_MAX, &m->seed)))
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

enum { RE_T, RE_V, RE_KIND, RE_JOB, RE_SRC, RE_TASK, RE_TK, RE_N_, RE_RSUM, RE_CORRECT, RE_ERRORS, RE_STEP, RE_VER,
       RE_ERROR, RE_N };
static const char *const proto_report_keys[RE_N] = {"t", "v", "kind", "job", "src", "task", "tk", "n", "rsum",
                                                    "correct", "errors", "step", "ver", "error"};

int proto_report_encode(const proto_report_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "report", RE_N - 2);
    proto_enc_key(&e, "kind");
    if (m->kind < PROTO_REP_EPISODES) e.bad = true;
    proto_enc_uint(&e, (uint64_t)m->kind, PROTO_REP_TASK_FAILED);
    proto_enc_key(&e, "job");
    proto_enc_str(&e, m->job, PROTO_ID_LEN, false);
    proto_enc_key(&e, "src");
    proto_enc_str(&e, m->source, PROTO_ID_LEN, false);
    proto_enc_key(&e, "task");
    proto_enc_uint(&e, m->task_id, UINT64_MAX);
    proto_enc_key(&e, "tk");
    proto_enc_uint(&e, (uint64_t)m->task_kind, PROTO_KIND_EVAL);
    proto_enc_key(&e, "n");
    proto_enc_uint(&e, m->n, UINT32_MAX);
    proto_enc_key(&e, "rsum");
    proto_enc_f64(&e, m->reward_sum);
    proto_enc_key(&e, "correct");
    proto_enc_uint(&e, m->correct, UINT32_MAX);
    proto_enc_key(&e, "errors");
    proto_enc_uint(&e, m->errors, UINT32_MAX);
    proto_enc_key(&e, "step");
    proto_enc_uint(&e, m->step, UINT32_MAX);
    proto_enc_key(&e, "ver");
    proto_enc_uint(&e, m->adapter_version, UINT32_MAX);
    proto_enc_key(&e, "error");
    proto_enc_str(&e, m->error, PROTO_MAX_STR, true);
    return proto_enc_end(&e);
}

int proto_report_decode(const void *frame, size_t len, proto_report_t *m, char *err) {
    const proto_dec_t d = {"report", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[RE_N];
    uint64_t kind = 0, tk = 0;
    if (proto_open(&d, frame, len, &u, proto_report_keys, RE_N, f)) goto fail;
    if (proto_get_uint(&d, f[RE_KIND], "", "kind", PROTO_REP_EPISODES, PROTO_REP_TASK_FAILED, &kind) ||
        proto_get_str(&d, f[RE_JOB], "", "job", PROTO_ID_LEN, false, &m->job) ||
        proto_get_str(&d, f[RE_SRC], "", "src", PROTO_ID_LEN, false, &m->source) ||
        proto_get_uint(&d, f[RE_TASK], "", "task", 0, UINT64_MAX, &m->task_id) ||
        proto_get_uint(&d, f[RE_TK], "", "tk", PROTO_KIND_TRAIN, PROTO_KIND_EVAL, &tk) ||
        proto_get_u32(&d, f[RE_N_], "", "n", 0, UINT32_MAX, &m->n) ||
        proto_get_num(&d, f[RE_RSUM], "", "rsum", false, &m->reward_sum) ||
        proto_get_u32(&d, f[RE_CORRECT], "", "correct", 0, UINT32_MAX, &m->correct) ||
        proto_get_u32(&d, f[RE_ERRORS], "", "errors", 0, UINT32_MAX, &m->errors) ||
        proto_get_u32(&d, f[RE_STEP], "", "step", 0, UINT32_MAX, &m->step) ||
        proto_get_u32(&d, f[RE_VER], "", "ver", 0, UINT32_MAX, &m->adapter_version) ||
        proto_get_str(&d, f[RE_ERROR], "", "error", PROTO_MAX_STR, true, &m->error))
        goto fail;
    m->kind = (proto_report_kind_t)kind;
    m->task_kind = (proto_kind_t)tk;
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_report_free(m);
    return -1;
}

void proto_report_free(proto_report_t *m) {
    if (!m) return;
    free(m->job);
    free(m->source);
    free(m->error);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// "adapter"

enum { AD_T, AD_V, AD_JOB, AD_VER, AD_STEP, AD_N };
static const char *const proto_adapter_keys[AD_N] = {"t", "v", "job", "ver", "step"};

int proto_adapter_event_encode(const proto_adapter_event_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "adapter", AD_N - 2);
    proto_enc_key(&e, "job");
    proto_enc_str(&e, m->job, PROTO_ID_LEN, false);
    proto_enc_key(&e, "ver");
    proto_enc_uint(&e, m->version, UINT32_MAX);
    proto_enc_key(&e, "step");
    proto_enc_uint(&e, m->step, UINT32_MAX);
    return proto_enc_end(&e);
}

int proto_adapter_event_decode(const void *frame, size_t len, proto_adapter_event_t *m, char *err) {
    const proto_dec_t d = {"adapter", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[AD_N];
    if (proto_open(&d, frame, len, &u, proto_adapter_keys, AD_N, f) ||
        proto_get_str(&d, f[AD_JOB], "", "job", PROTO_ID_LEN, false, &m->job) ||
        proto_get_u32(&d, f[AD_VER], "", "ver", 0, UINT32_MAX, &m->version) ||
        proto_get_u32(&d, f[AD_STEP], "", "step", 0, UINT32_MAX, &m->step))
        goto fail;
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_adapter_event_free(m);
    return -1;
}

void proto_adapter_event_free(proto_adapter_event_t *m) {
    if (!m) return;
    free(m->job);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// "reward_req" / "reward_rep"

enum { RQ_T, RQ_V, RQ_ID, RQ_JOB, RQ_PROMPT, RQ_COMPLETIONS, RQ_META, RQ_N };
static const char *const proto_reward_req_keys[RQ_N] = {"t", "v", "id", "job", "prompt", "completions", "meta"};
enum { RP_T, RP_V, RP_ID, RP_REWARDS, RP_ERROR, RP_N };
static const char *const proto_reward_rep_keys[RP_N] = {"t", "v", "id", "rewards", "error"};

int proto_reward_req_encode(const proto_reward_req_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "reward_req", RQ_N - 2);
    proto_enc_key(&e, "id");
    proto_enc_uint(&e, m->id, UINT64_MAX);
    proto_enc_key(&e, "job");
    proto_enc_str(&e, m->job, PROTO_ID_LEN, false);
    proto_enc_key(&e, "prompt");
    proto_enc_str(&e, m->prompt, PROTO_MAX_TEXT, false);
    proto_enc_key(&e, "completions");
    proto_enc_array(&e, m->n, PROTO_MAX_SAMPLES, m->completions);
    for (uint32_t i = 0; i < m->n && !e.bad; i++) proto_enc_str(&e, m->completions[i], PROTO_MAX_TEXT, false);
    proto_enc_key(&e, "meta");
    proto_enc_str(&e, m->meta, PROTO_MAX_STR, true);
    return proto_enc_end(&e);
}

int proto_reward_req_decode(const void *frame, size_t len, proto_reward_req_t *m, char *err) {
    const proto_dec_t d = {"reward_req", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[RQ_N];
    const msgpack_object_array *c = NULL;
    if (proto_open(&d, frame, len, &u, proto_reward_req_keys, RQ_N, f) ||
        proto_get_uint(&d, f[RQ_ID], "", "id", 0, UINT64_MAX, &m->id) ||
        proto_get_str(&d, f[RQ_JOB], "", "job", PROTO_ID_LEN, false, &m->job) ||
        proto_get_str(&d, f[RQ_PROMPT], "", "prompt", PROTO_MAX_TEXT, false, &m->prompt) ||
        proto_get_array(&d, f[RQ_COMPLETIONS], "", "completions", PROTO_MAX_SAMPLES, &c))
        goto fail;
    if (c->size) {
        m->completions = xcalloc(c->size, sizeof *m->completions);
        m->n = c->size;
    }
    for (uint32_t i = 0; i < c->size; i++) {
        char name[32];
        snprintf(name, sizeof name, "completions[%" PRIu32 "]", i);
        if (proto_get_str(&d, &c->ptr[i], "", name, PROTO_MAX_TEXT, false, &m->completions[i])) goto fail;
    }
    if (proto_get_str(&d, f[RQ_META], "", "meta", PROTO_MAX_STR, true, &m->meta)) goto fail;
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_reward_req_free(m);
    return -1;
}

void proto_reward_req_free(proto_reward_req_t *m) {
    if (!m) return;
    for (uint32_t i = 0; m->completions && i < m->n; i++) free(m->completions[i]);
    free(m->completions);
    free(m->job);
    free(m->prompt);
    free(m->meta);
    memset(m, 0, sizeof *m);
}

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

enum { RR_T, RR_V, RR_ID, RR_OP, RR_TOKEN, RR_ARGS, RR_N };
static const char *const proto_req_keys[RR_N] = {"t", "v", "id", "op", "token", "args"};
enum { RS_T, RS_V, RS_ID, RS_OK, RS_ERROR, RS_RESULT, RS_N };
static const char *const proto_rep_keys[RS_N] = {"t", "v", "id", "ok", "error", "result"};

int proto_req_encode(const proto_req_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "req", RR_N - 2);
    proto_enc_key(&e, "id");
    proto_enc_uint(&e, m->id, UINT64_MAX);
    proto_enc_key(&e, "op");
    proto_enc_str(&e, m->op, PROTO_ID_LEN, false);
    proto_enc_key(&e, "token");
    proto_enc_str(&e, m->token, PROTO_MAX_STR, false);
    proto_enc_key(&e, "args");
    proto_enc_args(&e, &m->args);
    return proto_enc_end(&e);
}

int proto_req_decode(const void *frame, size_t len, proto_req_t *m, char *err) {
    const proto_dec_t d = {"req", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[RR_N];
    if (proto_open(&d, frame, len, &u, proto_req_keys, RR_N, f) ||
        proto_get_uint(&d, f[RR_ID], "", "id", 0, UINT64_MAX, &m->id) ||
        proto_get_str(&d, f[RR_OP], "", "op", PROTO_ID_LEN, false, &m->op) ||
        proto_get_str(&d, f[RR_TOKEN], "", "token", PROTO_MAX_STR, false, &m->token) ||
        proto_get_args(&d, f[RR_ARGS], "args", &m->args))
        goto fail;
    msgpack_unpacked_destroy(&u);
    return 0;
fail:
    msgpack_unpacked_destroy(&u);
    proto_req_free(m);
    return -1;
}

void proto_req_free(proto_req_t *m) {
    if (!m) return;
    free(m->op);
    free(m->token);
    proto_args_free(&m->args);
    memset(m, 0, sizeof *m);
}

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

enum { EQ_T, EQ_V, EQ_ID, EQ_JOB, EQ_PROMPT, EQ_TRANSCRIPT, EQ_TURN, EQ_N };
static const char *const proto_env_req_keys[EQ_N] = {"t", "v", "id", "job", "prompt", "transcript", "turn"};
enum { EP_T, EP_V, EP_ID, EP_DONE, EP_OBS, EP_REWARD, EP_ERROR, EP_N };
static const char *const proto_env_rep_keys[EP_N] = {"t", "v", "id", "done", "obs", "reward", "error"};

int proto_env_req_encode(const proto_env_req_t *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, "env_req", EQ_N - 2);
    proto_enc_key(&e, "id");
    proto_enc_uint(&e, m->id, UINT64_MAX);
    proto_enc_key(&e, "job");
    proto_enc_str(&e, m->job, PROTO_ID_LEN, false);
    proto_enc_key(&e, "prompt");
    proto_enc_str(&e, m->prompt, PROTO_MAX_TEXT, false);
    proto_enc_key(&e, "transcript");
    proto_enc_str(&e, m->transcript, PROTO_MAX_TEXT, false);
    proto_enc_key(&e, "turn");
    proto_enc_uint(&e, m->turn, PROTO_MAX_TURNS);
    return proto_enc_end(&e);
}

int proto_env_req_decode(const void *frame, size_t len, proto_env_req_t *m, char *err) {
    const proto_dec_t d = {"env_req", err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, sizeof *m);
    const msgpack_object *f[EQ_N];
    if (proto_open(&d, frame, len, &u, proto_env_req_keys, EQ_N, f) ||
        proto_get_uint(&d, f[EQ_ID], "", "id", 0, UINT64_MAX, &m->id) ||
        proto_get_str(&d, f[EQ_JOB], "", "job", PROTO_ID_LEN, false, &m->job) ||
        proto_get_str(&d, f[EQ_PROMPT], "", "prompt", PROTO_MAX_TEXT, false, &m->prompt) ||
        proto_get_str(&d, f[EQ_TRANSCRIPT], "", "transcript", PROTO_MAX_TEXT, false, &m->transcript) ||
        proto_get_u32(&d, f[EQ_TURN], "", "turn", 0, PROTO_MAX_TURNS, &m->turn)) {
        msgpack_unpacked_destroy(&u);
        proto_env_req_free(m);
        return -1;
    }
    msgpack_unpacked_destroy(&u);
    return 0;
}

void proto_env_req_free(proto_env_req_t *m) {
    if (!m) return;
    free(m->job);
    free(m->prompt);
    free(m->transcript);
    memset(m, 0, sizeof *m);
}

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

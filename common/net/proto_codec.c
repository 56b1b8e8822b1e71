// proto_codec.c - the MessagePack codec under proto.c's messages (proto_codec.h): the bounds
// pre-check, validating decoders of fields, encoders of fields and argument maps, and
// proto_peek_type.
#include "common/net/proto_codec.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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


int proto_fail(const proto_dec_t *d, const char *fmt, ...) {
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

const char *proto_type_name(msgpack_object_type t) {
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
int proto_fields(const proto_dec_t *d, const msgpack_object *map, const char *pre,
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

int proto_missing(const proto_dec_t *d, const char *pre, const char *name) {
    return proto_fail(d, "missing field '%s%s'", pre, name);
}

int proto_get_uint(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
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

int proto_get_u32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         uint32_t min, uint32_t max, uint32_t *out) {
    uint64_t v;
    if (proto_get_uint(d, o, pre, name, min, max, &v)) return -1;
    *out = (uint32_t)v;
    return 0;
}

// f32: the value must also fit a float, which a finite double need not.
int proto_get_num(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
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

int proto_get_f32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                         float *out) {
    double v;
    if (proto_get_num(d, o, pre, name, true, &v)) return -1;
    *out = (float)v;
    return 0;
}

int proto_get_bool(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
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
    size_t bad;
    if (!util_utf8_valid(o->via.str.ptr, n, &bad))
        return proto_fail(d, "field '%s%s' is not valid UTF-8 (byte %zu)", pre, name, bad);
    char *s = xmalloc(n + 1);
    if (n) memcpy(s, o->via.str.ptr, n);
    s[n] = '\0';
    *out = s;
    return 0;
}

// nullable: nil or an absent key gives *out = NULL.
int proto_get_str(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
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

int proto_get_array(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
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

int proto_check_map(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name) {
    if (o->type != MSGPACK_OBJECT_MAP)
        return proto_fail(d, "field '%s%s' must be a map, not %s", pre, name, proto_type_name(o->type));
    return 0;
}

int proto_get_tokens(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
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

int proto_get_args(const proto_dec_t *d, const msgpack_object *o, const char *name, proto_args_t *a) {
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
        if (!util_utf8_valid(k->via.str.ptr, k->via.str.size, NULL))
            return proto_fail(d, "field '%s' has a key that is not valid UTF-8 ('%s')", name, shown);
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
int proto_open(const proto_dec_t *d, const void *frame, size_t len, msgpack_unpacked *u,
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

void proto_enc_rc(proto_enc_t *e, int rc) {
    if (rc) e->bad = true;
}

void proto_enc_key(proto_enc_t *e, const char *k) {
    if (!e->bad) proto_enc_rc(e, msgpack_pack_str_with_body(&e->pk, k, strlen(k)));
}

void proto_enc_str(proto_enc_t *e, const char *s, size_t max, bool nullable) {
    if (e->bad) return;
    if (!s) {
        if (nullable) proto_enc_rc(e, msgpack_pack_nil(&e->pk));
        else e->bad = true;
        return;
    }
    size_t n = strlen(s);
    if (util_utf8_valid(s, n, NULL)) {
        if (n > max) e->bad = true;
        else proto_enc_rc(e, msgpack_pack_str_with_body(&e->pk, s, n));
        return;
    }
    // Receivers refuse ill-formed UTF-8; text that is not (a message cut inside a character, the
    // bytes of a tool's output) goes out with each ill-formed byte as U+FFFD, as a lossy decode
    // would show it.
    char *fixed = xmalloc(3 * n + 1);
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool ok;
        size_t l = util_utf8_next((const uint8_t *)s + i, n - i, &cp, &ok);
        if (ok) {
            memcpy(fixed + w, s + i, l);
            w += l;
        } else {
            memcpy(fixed + w, "\xEF\xBF\xBD", 3);
            w += 3;
            l = 1;
        }
        i += l;
    }
    if (w > max) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_str_with_body(&e->pk, fixed, w));
    free(fixed);
}

void proto_enc_uint(proto_enc_t *e, uint64_t v, uint64_t max) {
    if (e->bad) return;
    if (v > max) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_uint64(&e->pk, v));
}

void proto_enc_f32(proto_enc_t *e, float v) {
    if (e->bad) return;
    if (!isfinite(v)) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_float(&e->pk, v));
}

void proto_enc_f64(proto_enc_t *e, double v) {
    if (e->bad) return;
    if (!isfinite(v)) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_double(&e->pk, v));
}

void proto_enc_bool(proto_enc_t *e, bool v) {
    if (!e->bad) proto_enc_rc(e, v ? msgpack_pack_true(&e->pk) : msgpack_pack_false(&e->pk));
}

// An array header for n elements stored at p (which may be NULL only when n is 0).
void proto_enc_array(proto_enc_t *e, size_t n, size_t max, const void *p) {
    if (e->bad) return;
    if (n > max || (n && !p)) e->bad = true;
    else proto_enc_rc(e, msgpack_pack_array(&e->pk, n));
}

void proto_enc_begin(proto_enc_t *e, proto_buf_t *out, const char *type, size_t n_fields) {
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

int proto_enc_end(proto_enc_t *e) {
    if (!e->bad) return 0;
    e->out->len = e->start;
    return -1;
}

void proto_enc_tokens(proto_enc_t *e, const int32_t *t, uint32_t n) {
    proto_enc_array(e, n, PROTO_MAX_TOKENS, t);
    for (uint32_t i = 0; i < n && !e->bad; i++) {
        if (t[i] < 0) e->bad = true;
        else proto_enc_rc(e, msgpack_pack_uint32(&e->pk, (uint32_t)t[i]));
    }
}

void proto_enc_logprobs(proto_enc_t *e, const float *lp, uint32_t n) {
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

void proto_enc_args(proto_enc_t *e, const proto_args_t *a) {
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
// table-driven messages

#define MEMBER(m, type, at) ((type *)((char *)(m) + (at)))

int proto_msg_encode(const proto_msg_t *d, const void *m, proto_buf_t *out) {
    if (!m || !out) return -1;
    proto_enc_t e;
    proto_enc_begin(&e, out, d->type, d->n);
    for (size_t i = 0; i < d->n && !e.bad; i++) {
        const proto_field_t *f = &d->f[i];
        proto_enc_key(&e, f->name);
        switch (f->type) {
        case PROTO_F_U64:
        case PROTO_F_U32:
        case PROTO_F_ENUM: {
            uint64_t v = f->type == PROTO_F_U64   ? *MEMBER(m, const uint64_t, f->at)
                         : f->type == PROTO_F_U32 ? *MEMBER(m, const uint32_t, f->at)
                                                  : (uint64_t)(int64_t)*MEMBER(m, const int, f->at);
            if (v < f->min) e.bad = true;
            proto_enc_uint(&e, v, f->max);
            break;
        }
        case PROTO_F_F64: proto_enc_f64(&e, *MEMBER(m, const double, f->at)); break;
        case PROTO_F_STR: proto_enc_str(&e, *MEMBER(m, char *const, f->at), f->max, f->nullable); break;
        case PROTO_F_STRS: {
            uint32_t n = *MEMBER(m, const uint32_t, f->count_at);
            char *const *v = *MEMBER(m, char **const, f->at);
            proto_enc_array(&e, n, f->min, v);
            for (uint32_t j = 0; j < n && !e.bad; j++) proto_enc_str(&e, v[j], f->max, false);
            break;
        }
        case PROTO_F_ARGS: proto_enc_args(&e, MEMBER(m, const proto_args_t, f->at)); break;
        }
    }
    return proto_enc_end(&e);
}

static int decode_field(const proto_dec_t *d, const proto_field_t *f, const msgpack_object *o, void *m) {
    switch (f->type) {
    case PROTO_F_U64: return proto_get_uint(d, o, "", f->name, f->min, f->max, MEMBER(m, uint64_t, f->at));
    case PROTO_F_U32:
        return proto_get_u32(d, o, "", f->name, (uint32_t)f->min, (uint32_t)f->max, MEMBER(m, uint32_t, f->at));
    case PROTO_F_ENUM: {
        uint64_t v = 0;
        if (proto_get_uint(d, o, "", f->name, f->min, f->max, &v)) return -1;
        *MEMBER(m, int, f->at) = (int)v;
        return 0;
    }
    case PROTO_F_F64: return proto_get_num(d, o, "", f->name, false, MEMBER(m, double, f->at));
    case PROTO_F_STR: return proto_get_str(d, o, "", f->name, f->max, f->nullable, MEMBER(m, char *, f->at));
    case PROTO_F_STRS: {
        const msgpack_object_array *a = NULL;
        if (proto_get_array(d, o, "", f->name, (uint32_t)f->min, &a)) return -1;
        char **v = a->size ? xcalloc(a->size, sizeof *v) : NULL;
        *MEMBER(m, char **, f->at) = v;
        *MEMBER(m, uint32_t, f->count_at) = a->size;
        for (uint32_t j = 0; j < a->size; j++) {
            char name[64];
            snprintf(name, sizeof name, "%s[%" PRIu32 "]", f->name, j);
            if (proto_get_str(d, &a->ptr[j], "", name, f->max, false, &v[j])) return -1;
        }
        return 0;
    }
    case PROTO_F_ARGS: return proto_get_args(d, o, f->name, MEMBER(m, proto_args_t, f->at));
    }
    return proto_fail(d, "field '%s' has no decoder", f->name);
}

int proto_msg_decode(const proto_msg_t *d, const void *frame, size_t len, void *m, char *err) {
    const proto_dec_t dec = {d->type, err};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    memset(m, 0, d->size);
    const char *names[PROTO_MAX_FIELDS + 2] = {"t", "v"};
    for (size_t i = 0; i < d->n; i++) names[2 + i] = d->f[i].name;
    const msgpack_object *f[PROTO_MAX_FIELDS + 2];
    int rc = proto_open(&dec, frame, len, &u, names, d->n + 2, f);
    for (size_t i = 0; i < d->n && !rc; i++) rc = decode_field(&dec, &d->f[i], f[2 + i], m);
    msgpack_unpacked_destroy(&u);
    if (rc) proto_msg_free(d, m);
    return rc ? -1 : 0;
}

void proto_msg_free(const proto_msg_t *d, void *m) {
    if (!m) return;
    for (size_t i = 0; i < d->n; i++) {
        const proto_field_t *f = &d->f[i];
        if (f->type == PROTO_F_STR) free(*MEMBER(m, char *, f->at));
        if (f->type == PROTO_F_STRS) {
            char **v = *MEMBER(m, char **, f->at);
            for (uint32_t j = 0; v && j < *MEMBER(m, uint32_t, f->count_at); j++) free(v[j]);
            free(v);
        }
        if (f->type == PROTO_F_ARGS) proto_args_free(MEMBER(m, proto_args_t, f->at));
    }
    memset(m, 0, d->size);
}

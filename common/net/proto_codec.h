// proto_codec.h - the MessagePack codec under proto.c's messages: bounded decoding that names
// the field of every error, and encoding that refuses what the decoder would refuse. Internal to
// common/net/proto*.c; the messages' schema is at the top of proto.c.
#ifndef MARLAAS_PROTO_CODEC_H
#define MARLAAS_PROTO_CODEC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/net/proto.h"

// Services keep ids in char[PROTO_MAX_ID] buffers, so an id on the wire leaves room for the NUL.
#define PROTO_ID_LEN (PROTO_MAX_ID - 1)

// Decoding: each helper names the field as pre + name (pre is "" or a path like "groups[3].").
typedef struct {
    const char *msg;   // message type, the prefix of every error
    char *err;
} proto_dec_t;

// Encoding: each helper is a no-op once the message is known to be bad; proto_enc_end then rolls
// the buffer back.
typedef struct {
    msgpack_packer pk;
    proto_buf_t *out;
    size_t start;      // out->len before this message
    bool bad;
} proto_enc_t;

__attribute__((format(printf, 2, 3))) int proto_fail(const proto_dec_t *d, const char *fmt, ...);
const char *proto_type_name(msgpack_object_type t);
int proto_fields(const proto_dec_t *d, const msgpack_object *map, const char *pre, const char *const *names, size_t n,
                 const msgpack_object **f);
int proto_missing(const proto_dec_t *d, const char *pre, const char *name);
int proto_get_uint(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, uint64_t min,
                   uint64_t max, uint64_t *out);
int proto_get_u32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, uint32_t min,
                  uint32_t max, uint32_t *out);
int proto_get_num(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, bool f32,
                  double *out);
int proto_get_f32(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, float *out);
int proto_get_bool(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, bool *out);
int proto_get_str(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, size_t max,
                  bool nullable, char **out);
int proto_get_array(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name, uint32_t max,
                    const msgpack_object_array **out);
int proto_check_map(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name);
int proto_get_tokens(const proto_dec_t *d, const msgpack_object *o, const char *pre, const char *name,
                     int32_t **tokens, uint32_t *n);
int proto_get_args(const proto_dec_t *d, const msgpack_object *o, const char *name, proto_args_t *a);
int proto_open(const proto_dec_t *d, const void *frame, size_t len, msgpack_unpacked *u, const char *const *names,
               size_t n, const msgpack_object **f);
void proto_enc_rc(proto_enc_t *e, int rc);
void proto_enc_key(proto_enc_t *e, const char *k);
void proto_enc_str(proto_enc_t *e, const char *s, size_t max, bool nullable);
void proto_enc_uint(proto_enc_t *e, uint64_t v, uint64_t max);
void proto_enc_f32(proto_enc_t *e, float v);
void proto_enc_f64(proto_enc_t *e, double v);
void proto_enc_bool(proto_enc_t *e, bool v);
void proto_enc_array(proto_enc_t *e, size_t n, size_t max, const void *p);
void proto_enc_begin(proto_enc_t *e, proto_buf_t *out, const char *type, size_t n_fields);
int proto_enc_end(proto_enc_t *e);
void proto_enc_tokens(proto_enc_t *e, const int32_t *t, uint32_t n);
void proto_enc_logprobs(proto_enc_t *e, const float *lp, uint32_t n);
void proto_enc_args(proto_enc_t *e, const proto_args_t *a);

// Table-driven messages: a flat message is a list of fields, each a C member at an offset of the
// message struct. One encoder, decoder and free serve every such message; the messages with
// nested arrays or rules between fields (task, done/scored/cont, reward_rep, env_rep, rep) are
// written out in proto.c.
typedef enum {
    PROTO_F_U64,    // uint64_t in [min, max]
    PROTO_F_U32,    // uint32_t in [min, max]
    PROTO_F_ENUM,   // an enum (int-sized) in [min, max]
    PROTO_F_F64,    // double, finite
    PROTO_F_STR,    // char *, at most max bytes; nil / absent allowed when nullable
    PROTO_F_STRS,   // char ** of count_at elements (uint32_t), at most min elements of max bytes
    PROTO_F_ARGS,   // proto_args_t
} proto_ftype_t;

typedef struct {
    const char *name;
    proto_ftype_t type;
    size_t at;           // offsetof the member
    uint64_t min, max;
    bool nullable;
    size_t count_at;     // PROTO_F_STRS: offsetof the element count
} proto_field_t;

#define PROTO_MAX_FIELDS 14

typedef struct {
    const char *type;    // the "t" of the message
    size_t size;         // sizeof the message struct
    size_t n;
    proto_field_t f[PROTO_MAX_FIELDS];
} proto_msg_t;

int proto_msg_encode(const proto_msg_t *d, const void *m, proto_buf_t *out);
// On failure the message is freed and zeroed and err names the field.
int proto_msg_decode(const proto_msg_t *d, const void *frame, size_t len, void *m, char *err);
void proto_msg_free(const proto_msg_t *d, void *m);

#endif

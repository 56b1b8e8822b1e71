// safetensors.h - reader and writer for the safetensors format (Hugging Face).
//
// File layout: u64 little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}},
// then the data section; offsets are relative to the data section start.
//
// The reader validates everything before any tensor is read: header length within the file,
// JSON well-formed, every entry's dtype known, shape non-negative, offsets inside the data
// section and equal to prod(shape) * dtype size, no two tensors overlapping. A reader never
// crashes on a corrupted file; it returns NULL with a message naming the file and the problem.
#ifndef MARLAAS_SAFETENSORS_H
#define MARLAAS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/util/util.h"

#define ST_MAX_DIMS 8

typedef enum { ST_F32 = 0, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL } st_dtype_t;

typedef struct {
    char *name;                  // tensor name as in the header
    st_dtype_t dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t offset;               // byte offset within the data section
    size_t nbytes;
} st_tensor_t;

typedef struct st_file st_file_t;

// Opens a file (read into memory or mmapped). NULL + err on any problem.
st_file_t *st_open(const char *path, char *err);
// Parses an in-memory safetensors image (e.g. a Redis blob). The bytes are copied.
st_file_t *st_open_buffer(const void *buf, size_t len, char *err);
void st_close(st_file_t **f);

int st_count(const st_file_t *f);
const st_tensor_t *st_tensor(const st_file_t *f, int i);
const st_tensor_t *st_find(const st_file_t *f, const char *name);   // NULL if absent
// Value of a "__metadata__" string entry, or NULL.
const char *st_metadata(const st_file_t *f, const char *key);
const char *st_dtype_name(st_dtype_t t);
size_t st_dtype_size(st_dtype_t t);

// Reads tensor `name` converted to fp32 into dst (prod(shape) floats). Checks that the tensor
// exists ("missing tensor X in FILE"), that its shape equals the expected one exactly
// ("tensor X has shape [a,b], expected [c,d]") and that its dtype is F32, F16 or BF16
// ("tensor X has dtype I64; only F32, F16, BF16 are supported"). Returns 0 or -1.
int st_read_f32(const st_file_t *f, const char *name, int ndim, const int64_t *shape, float *dst, char *err);

// --- a model folder's weights: one file or shards ---------------------------------------------
// DIR/model.safetensors when it exists (Hugging Face prefers it too), else the shards named by
// DIR/model.safetensors.index.json ({"weight_map": {"tensor": "file", ...}, "metadata": {...}}).
// The index is validated before any tensor is read, and every problem is an error naming it:
// weight_map an object of strings, each file a plain name inside DIR (no '/', not "." or ".."),
// each file opening as valid safetensors, each tensor of weight_map present in the file it names,
// and each tensor of each shard listed in weight_map with that shard (so no tensor is found
// twice and none is left unaccounted for). "metadata" (total_size) is informational.
typedef struct st_dir st_dir_t;

st_dir_t *st_dir_open(const char *dir, char *err);
void st_dir_close(st_dir_t **d);
// "DIR/model.safetensors" or "DIR/model.safetensors.index.json" (for messages).
const char *st_dir_source(const st_dir_t *d);
// Tensors over all files; tensor i (0 <= i < count), and the index of a name (-1 when absent).
int st_dir_count(const st_dir_t *d);
const st_tensor_t *st_dir_tensor(const st_dir_t *d, int i);
int st_dir_find(const st_dir_t *d, const char *name);
// st_read_f32 on the file that holds `name` ("missing tensor X in SOURCE" when none does).
int st_dir_read_f32(const st_dir_t *d, const char *name, int ndim, const int64_t *shape, float *dst, char *err);

// --- writer ---------------------------------------------------------------------------
typedef struct st_writer st_writer_t;

st_writer_t *st_writer_new(void);
void st_writer_destroy(st_writer_t **w);
// Adds an F32 tensor. The data is NOT copied: it must stay valid until save/serialize.
// Tensors are written in the order added (names must be unique; a duplicate is a
// programmer error and aborts).
void st_writer_add_f32(st_writer_t *w, const char *name, int ndim, const int64_t *shape, const float *data);
// Adds a string entry to "__metadata__" (copied).
void st_writer_metadata(st_writer_t *w, const char *key, const char *value);
// Serializes to a new buffer (owned by the caller, free()). Returns 0 or -1.
int st_writer_serialize(st_writer_t *w, uint8_t **out, size_t *out_len, char *err);
// Writes the file atomically (temp + rename). Returns 0 or -1.
int st_writer_save(st_writer_t *w, const char *path, char *err);

#endif

// safetensors.c - safetensors reader (validating, mmap or in-memory copy) and F32 writer.
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

// The format is little-endian and F32 data is copied straight into host floats.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

// Same limit as the reference implementation: a larger header is a corrupted length field.
#define ST_MAX_HEADER 100000000ull
#define ST_META_KEY "__metadata__"

struct st_file {
    char *src;                    // path, or "<buffer>", for messages
    uint8_t *image;               // whole file
    size_t image_len;
    bool mapped;                  // image is an mmap (else malloc)
    const uint8_t *data;          // data section
    size_t data_len;
    st_tensor_t *tensors;         // header order
    int n;
    const st_tensor_t **by_name;  // sorted by name, for st_find
    char **meta_keys;
    char **meta_vals;
    int n_meta;
};

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2}, [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2},  [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

const char *st_dtype_name(st_dtype_t t) { return (int)t >= 0 && (int)t < N_DTYPES ? dtypes[t].name : "?"; }

size_t st_dtype_size(st_dtype_t t) { return (int)t >= 0 && (int)t < N_DTYPES ? dtypes[t].size : 0; }

static int dtype_parse(const char *s) {
    for (int i = 0; i < N_DTYPES; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

// --- reader --------------------------------------------------------------------------------

void st_close(st_file_t **pf) {
    if (!pf || !*pf) return;
    st_file_t *f = *pf;
    if (f->image) {
        if (f->mapped)
            munmap(f->image, f->image_len);
        else
            free(f->image);
    }
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->src);
    free(f);
    *pf = NULL;
}

static int parse_tensor(st_file_t *f, const cJSON *e, st_tensor_t *t, char *err) {
    const char *src = f->src, *name = e->string;
    if (!cJSON_IsObject(e)) return err_set(err, "%s: tensor '%s': entry is not an object", src, name);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt)) return err_set(err, "%s: tensor '%s': dtype is missing or not a string", src, name);
    int d = dtype_parse(dt->valuestring);
    if (d < 0) return err_set(err, "%s: tensor '%s': unknown dtype '%s'", src, name, dt->valuestring);
    t->dtype = (st_dtype_t)d;

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(sh)) return err_set(err, "%s: tensor '%s': shape is missing or not an array", src, name);
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > ST_MAX_DIMS)
        return err_set(err, "%s: tensor '%s': %d dimensions, at most %d supported", src, name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    // Element count times dtype size must not wrap, or a huge shape could match small offsets.
    uint64_t nbytes = dtypes[d].size;
    bool overflow = false;
    int k = 0;
    for (const cJSON *v = sh->child; v; v = v->next, k++) {
        uint64_t dim;
        if (!json_uint(v, 9223372036854775808.0, &dim))
            return err_set(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", src, name, k);
        t->shape[k] = (int64_t)dim;
        if (__builtin_mul_overflow(nbytes, dim, &nbytes)) overflow = true;
    }
    // A zero dimension makes the tensor empty, whatever overflowed before it.
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] == 0) {
            overflow = false;
            nbytes = 0;
        }
    }
    if (overflow)
        return err_set(err, "%s: tensor '%s': shape is too large (byte size overflows)", src, name);

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, 18446744073709551616.0, &b) ||
        !json_uint(off->child->next, 18446744073709551616.0, &en))
        return err_set(err, "%s: tensor '%s': data_offsets must be [begin, end] with non-negative integers", src,
                       name);
    if (b > en)
        return err_set(err, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", src, name,
                       (unsigned long long)b, (unsigned long long)en);
    if (en > f->data_len)
        return err_set(err, "%s: tensor '%s': data_offsets [%llu, %llu] outside the data section of %zu bytes",
                       src, name, (unsigned long long)b, (unsigned long long)en, f->data_len);
    if (en - b != nbytes)
        return err_set(err, "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype %s need %llu", src,
                       name, (unsigned long long)(en - b), dtypes[d].name, (unsigned long long)nbytes);
    t->offset = (size_t)b;
    t->nbytes = (size_t)nbytes;
    return 0;
}

static int parse_metadata(st_file_t *f, const cJSON *m, char *err) {
    if (!cJSON_IsObject(m)) return err_set(err, "%s: %s is not an object", f->src, ST_META_KEY);
    int n = cJSON_GetArraySize(m);
    f->meta_keys = xcalloc((size_t)n, sizeof(char *));
    f->meta_vals = xcalloc((size_t)n, sizeof(char *));
    for (const cJSON *v = m->child; v; v = v->next) {
        if (!cJSON_IsString(v))
            return err_set(err, "%s: %s entry '%s' is not a string", f->src, ST_META_KEY, v->string);
        f->meta_keys[f->n_meta] = xstrdup(v->string);
        f->meta_vals[f->n_meta] = xstrdup(v->valuestring);
        f->n_meta++;
    }
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor_t *const *)a)->name, (*(const st_tensor_t *const *)b)->name);
}

static int cmp_offset(const void *a, const void *b) {
    const st_tensor_t *x = *(const st_tensor_t *const *)a, *y = *(const st_tensor_t *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Validates the image held by f and fills the tensor table.
static int parse_image(st_file_t *f, char *err) {
    const char *src = f->src;
    if (f->image_len < 8)
        return err_set(err, "%s: file of %zu bytes is shorter than the 8-byte header length", src, f->image_len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->image[i];
    if (hlen > ST_MAX_HEADER)
        return err_set(err, "%s: header length %llu exceeds the limit of %llu bytes", src, (unsigned long long)hlen,
                       ST_MAX_HEADER);
    if (hlen > f->image_len - 8)
        return err_set(err, "%s: header length %llu exceeds the file size of %zu bytes", src,
                       (unsigned long long)hlen, f->image_len);
    const char *hdr = (const char *)f->image + 8;
    f->data = f->image + 8 + hlen;
    f->data_len = f->image_len - 8 - (size_t)hlen;

    // The parse end pointer, unlike cJSON_GetErrorPtr(), is not shared between threads.
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root)
        return err_set(err, "%s: header is not valid JSON (near byte %td)", src, end ? end - hdr : (ptrdiff_t)0);
    const st_tensor_t **by_off = NULL;
    // Writers pad the header with spaces; anything else after the JSON value is corruption.
    for (const char *p = end; p < hdr + hlen; p++)
        if (!is_ws((uint8_t)*p)) {
            err_set(err, "%s: header has trailing bytes after the JSON object", src);
            goto fail;
        }
    if (!cJSON_IsObject(root)) {
        err_set(err, "%s: header is not a JSON object", src);
        goto fail;
    }

    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, ST_META_KEY) != 0) n++;
    f->tensors = xcalloc((size_t)n, sizeof(st_tensor_t));
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, ST_META_KEY)) {
            if (f->meta_keys) {
                err_set(err, "%s: duplicate %s", src, ST_META_KEY);
                goto fail;
            }
            if (parse_metadata(f, e, err) != 0) goto fail;
            continue;
        }
        st_tensor_t *t = &f->tensors[f->n];
        if (parse_tensor(f, e, t, err) != 0) goto fail;
        t->name = xstrdup(e->string);
        f->n++;
    }

    f->by_name = xmalloc((size_t)n * sizeof(st_tensor_t *) + 1);
    by_off = xmalloc((size_t)n * sizeof(st_tensor_t *) + 1);
    for (int i = 0; i < n; i++) f->by_name[i] = by_off[i] = &f->tensors[i];
    qsort(f->by_name, (size_t)n, sizeof(st_tensor_t *), cmp_name);
    qsort(by_off, (size_t)n, sizeof(st_tensor_t *), cmp_offset);
    for (int i = 1; i < n; i++) {
        if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name)) {
            err_set(err, "%s: tensor '%s' appears twice in the header", src, f->by_name[i]->name);
            goto fail;
        }
    }
    // Sorted by offset, a tensor overlaps another exactly when it starts before its predecessor ends.
    for (int i = 1; i < n; i++) {
        const st_tensor_t *a = by_off[i - 1], *b = by_off[i];
        if (b->offset < a->offset + a->nbytes) {
            err_set(err, "%s: tensor '%s' [%zu, %zu] overlaps tensor '%s' [%zu, %zu]", src, b->name, b->offset,
                    b->offset + b->nbytes, a->name, a->offset, a->offset + a->nbytes);
            goto fail;
        }
    }
    free(by_off);
    cJSON_Delete(root);
    return 0;
fail:
    free(by_off);
    cJSON_Delete(root);
    return -1;
}

st_file_t *st_open(const char *path, char *err) {
    st_file_t *f = xcalloc(1, sizeof *f);
    f->src = xstrdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(err, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err_set(err, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        err_set(err, "%s: not a regular file", path);
        goto fail;
    }
    f->image_len = (size_t)st.st_size;
    // Mapping rather than reading keeps multi-GB checkpoints out of the heap; files are replaced
    // by rename (util_write_file), never rewritten in place, so the mapping stays valid. mmap of
    // an empty file fails, and such a file is rejected by the parser anyway.
    if (f->image_len >= 8) {
        void *p = mmap(NULL, f->image_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            err_set(err, "cannot map %s: %s", path, strerror(errno));
            goto fail;
        }
        f->image = p;
        f->mapped = true;
    }
    close(fd);
    fd = -1;
    if (parse_image(f, err) != 0) goto fail;
    return f;
fail:
    if (fd >= 0) close(fd);
    st_close(&f);
    return NULL;
}

st_file_t *st_open_buffer(const void *buf, size_t len, char *err) {
    st_file_t *f = xcalloc(1, sizeof *f);
    f->src = xstrdup("<buffer>");
    f->image = xmalloc(len);
    if (len) memcpy(f->image, buf, len);
    f->image_len = len;
    if (parse_image(f, err) != 0) {
        st_close(&f);
        return NULL;
    }
    return f;
}

int st_count(const st_file_t *f) { return f->n; }

const st_tensor_t *st_tensor(const st_file_t *f, int i) { return i >= 0 && i < f->n ? &f->tensors[i] : NULL; }

const st_tensor_t *st_find(const st_file_t *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const st_tensor_t *t = f->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *st_metadata(const st_file_t *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

// Exact: every half value is representable in fp32. Bits are built directly so NaN payloads
// and signs survive unchanged.
static uint32_t f16_to_f32_bits(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return sign | 0x7f800000u | mant << 13;
    if (exp != 0) return sign | (exp + 127 - 15) << 23 | mant << 13;
    if (mant == 0) return sign;
    // Subnormal half: shift the mantissa up until its leading 1 is the implicit bit.
    uint32_t e = 127 - 15 + 1;
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return sign | e << 23 | (mant & 0x3ffu) << 13;
}

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int st_read_f32(const st_file_t *f, const char *name, int ndim, const int64_t *shape, float *dst, char *err) {
    const st_tensor_t *t = st_find(f, name);
    if (!t) return err_set(err, "missing tensor %s in %s", name, f->src);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[128], want[128];
        format_shape(have, sizeof have, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, shape);
        return err_set(err, "%s: tensor %s has shape %s, expected %s", f->src, name, have, want);
    }
    size_t count = t->nbytes / dtypes[t->dtype].size;
    const uint8_t *p = f->data + t->offset;
    switch (t->dtype) {
    case ST_F32:
        if (count) memcpy(dst, p, count * sizeof(float));
        return 0;
    case ST_F16:
        for (size_t i = 0; i < count; i++) {
            uint32_t bits = f16_to_f32_bits((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
            memcpy(&dst[i], &bits, sizeof bits);
        }
        return 0;
    case ST_BF16:
        for (size_t i = 0; i < count; i++) {
            uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &bits, sizeof bits);
        }
        return 0;
    default:
        return err_set(err, "%s: tensor %s has dtype %s; only F32, F16, BF16 are supported", f->src, name,
                       dtypes[t->dtype].name);
    }
}

// --- model folders ----------------------------------------------------------------------------

typedef struct {
    const st_tensor_t *t;
    int file;
} dir_entry_t;

struct st_dir {
    char *src;
    st_file_t **files;
    char **file_names;
    int n_files;
    dir_entry_t *e;        // sorted by tensor name
    int n;
};

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const dir_entry_t *)a)->t->name, ((const dir_entry_t *)b)->t->name);
}

void st_dir_close(st_dir_t **pd) {
    if (!pd || !*pd) return;
    st_dir_t *d = *pd;
    for (int i = 0; i < d->n_files; i++) {
        st_close(&d->files[i]);
        free(d->file_names[i]);
    }
    free(d->files);
    free(d->file_names);
    free(d->e);
    free(d->src);
    free(d);
    *pd = NULL;
}

// The shard list of an index: distinct file names in order of first use, each a plain name.
static int index_files(st_dir_t *d, const cJSON *wm, char *err) {
    for (const cJSON *it = wm->child; it; it = it->next) {
        if (!cJSON_IsString(it)) return err_set(err, "%s: weight_map entry '%.80s' is not a file name", d->src, it->string);
        const char *fn = it->valuestring;
        if (!fn[0] || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, ".."))
            return err_set(err, "%s: weight_map names '%.80s'; shards must be plain file names in the folder", d->src,
                           fn);
        bool seen = false;
        for (int i = 0; i < d->n_files && !seen; i++) seen = !strcmp(d->file_names[i], fn);
        if (seen) continue;
        d->file_names = xrealloc(d->file_names, sizeof(char *) * (size_t)(d->n_files + 1));
        d->files = xrealloc(d->files, sizeof(st_file_t *) * (size_t)(d->n_files + 1));
        d->file_names[d->n_files] = xstrdup(fn);
        d->files[d->n_files] = NULL;
        d->n_files++;
    }
    if (d->n_files == 0) return err_set(err, "%s: weight_map is empty", d->src);
    return 0;
}

static int open_index(st_dir_t *d, const char *dir, char *err) {
    char *text = util_read_file(d->src, NULL, err);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    int rc = -1;
    if (!root || !cJSON_IsObject(root)) {
        err_set(err, "%s: not a JSON object", d->src);
        goto out;
    }
    for (const cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "weight_map") && strcmp(it->string, "metadata")) {
            err_set(err, "%s: unknown key '%.60s' (weight_map, metadata)", d->src, it->string);
            goto out;
        }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        err_set(err, "%s: weight_map is missing or not an object", d->src);
        goto out;
    }
    if (index_files(d, wm, err)) goto out;
    char path[4096], e2[ERR_LEN];
    int total = 0;
    for (int i = 0; i < d->n_files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, d->file_names[i]);
        d->files[i] = st_open(path, e2);
        if (!d->files[i]) {
            err_set(err, "%s: shard %s: %s", d->src, d->file_names[i], e2);
            goto out;
        }
        total += st_count(d->files[i]);
    }
    int n_map = 0;
    for (const cJSON *it = wm->child; it; it = it->next, n_map++) {
        int fi = 0;
        while (strcmp(d->file_names[fi], it->valuestring)) fi++;
        if (!st_find(d->files[fi], it->string)) {
            err_set(err, "%s: weight_map puts %.80s in %s, which does not hold it", d->src, it->string,
                     d->file_names[fi]);
            goto out;
        }
    }
    d->e = xmalloc(sizeof(dir_entry_t) * (size_t)(total + 1));
    for (int fi = 0; fi < d->n_files; fi++)
        for (int j = 0; j < st_count(d->files[fi]); j++) {
            const st_tensor_t *t = st_tensor(d->files[fi], j);
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(wm, t->name);
            if (!m || strcmp(m->valuestring, d->file_names[fi])) {
                err_set(err, "%s: shard %s holds %.80s, which weight_map %s", d->src, d->file_names[fi], t->name,
                        m ? "puts in another shard" : "does not list");
                goto out;
            }
            d->e[d->n++] = (dir_entry_t){t, fi};
        }
    // Every shard tensor is in weight_map with its own shard, and every weight_map entry is in its
    // shard: the two sets are equal unless weight_map names a tensor twice.
    if (n_map != d->n) {
        err_set(err, "%s: weight_map has %d entries for %d tensors (a tensor is listed twice)", d->src, n_map, d->n);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

st_dir_t *st_dir_open(const char *dir, char *err) {
    st_dir_t *d = xcalloc(1, sizeof *d);
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &st) == 0 || errno != ENOENT) {
        d->src = xstrdup(path);
        d->files = xmalloc(sizeof(st_file_t *));
        d->file_names = xmalloc(sizeof(char *));
        d->file_names[0] = xstrdup("model.safetensors");
        d->n_files = 1;
        d->files[0] = st_open(path, err);
        if (!d->files[0]) goto fail;
        d->e = xmalloc(sizeof(dir_entry_t) * (size_t)(st_count(d->files[0]) + 1));
        for (int j = 0; j < st_count(d->files[0]); j++) d->e[d->n++] = (dir_entry_t){st_tensor(d->files[0], j), 0};
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        d->src = xstrdup(path);
        if (stat(path, &st) != 0) {
            err_set(err, "%s has neither model.safetensors nor model.safetensors.index.json", dir);
            goto fail;
        }
        if (open_index(d, dir, err)) goto fail;
    }
    qsort(d->e, (size_t)d->n, sizeof(dir_entry_t), cmp_entry);
    return d;
fail:
    st_dir_close(&d);
    return NULL;
}

const char *st_dir_source(const st_dir_t *d) { return d->src; }

int st_dir_count(const st_dir_t *d) { return d->n; }

const st_tensor_t *st_dir_tensor(const st_dir_t *d, int i) { return i >= 0 && i < d->n ? d->e[i].t : NULL; }

int st_dir_find(const st_dir_t *d, const char *name) {
    int lo = 0, hi = d->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, d->e[mid].t->name);
        if (c == 0) return mid;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

int st_dir_read_f32(const st_dir_t *d, const char *name, int ndim, const int64_t *shape, float *dst, char *err) {
    int i = st_dir_find(d, name);
    if (i < 0) return err_set(err, "missing tensor %s in %s", name, d->src);
    return st_read_f32(d->files[d->e[i].file], name, ndim, shape, dst, err);
}

// --- writer --------------------------------------------------------------------------------

typedef struct {
    char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data;
} wtensor_t;

struct st_writer {
    wtensor_t *t;
    int n, cap;
    char **meta_keys;
    char **meta_vals;
    int n_meta, meta_cap;
};

st_writer_t *st_writer_new(void) { return xcalloc(1, sizeof(st_writer_t)); }

void st_writer_destroy(st_writer_t **pw) {
    if (!pw || !*pw) return;
    st_writer_t *w = *pw;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_vals[i]);
    }
    free(w->meta_keys);
    free(w->meta_vals);
    free(w);
    *pw = NULL;
}

void st_writer_add_f32(st_writer_t *w, const char *name, int ndim, const int64_t *shape, const float *data) {
    ASSERT(name && ndim >= 0 && ndim <= ST_MAX_DIMS);
    ASSERT(strcmp(name, ST_META_KEY) != 0);
    for (int i = 0; i < w->n; i++) ASSERT(strcmp(w->t[i].name, name) != 0);
    for (int i = 0; i < ndim; i++) ASSERT(shape[i] >= 0);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->t = xrealloc(w->t, (size_t)w->cap * sizeof *w->t);
    }
    wtensor_t *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
}

void st_writer_metadata(st_writer_t *w, const char *key, const char *value) {
    ASSERT(key && value);
    // A repeated key replaces the value: the header is a JSON object and keys must be unique.
    for (int i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta_keys[i], key)) {
            free(w->meta_vals[i]);
            w->meta_vals[i] = xstrdup(value);
            return;
        }
    if (w->n_meta == w->meta_cap) {
        w->meta_cap = w->meta_cap ? 2 * w->meta_cap : 8;
        w->meta_keys = xrealloc(w->meta_keys, (size_t)w->meta_cap * sizeof(char *));
        w->meta_vals = xrealloc(w->meta_vals, (size_t)w->meta_cap * sizeof(char *));
    }
    w->meta_keys[w->n_meta] = xstrdup(key);
    w->meta_vals[w->n_meta] = xstrdup(value);
    w->n_meta++;
}

// Byte size of a writer tensor, or -1 if it is not representable exactly in the header
// (cJSON prints numbers as doubles, exact up to 2^53).
static int wtensor_bytes(const wtensor_t *t, uint64_t *out) {
    uint64_t n = sizeof(float);
    for (int i = 0; i < t->ndim; i++)
        if (__builtin_mul_overflow(n, (uint64_t)t->shape[i], &n)) return -1;
    if (n > (1ull << 53)) return -1;
    *out = n;
    return 0;
}

int st_writer_serialize(st_writer_t *w, uint8_t **out, size_t *out_len, char *err) {
    *out = NULL;
    *out_len = 0;
    uint64_t *sizes = xmalloc((size_t)w->n * sizeof(uint64_t) + 1);
    char *json = NULL;
    cJSON *root = json_need(cJSON_CreateObject());
    if (w->n_meta) {
        cJSON *m = json_need(cJSON_AddObjectToObject(root, ST_META_KEY));
        for (int i = 0; i < w->n_meta; i++) json_need(cJSON_AddStringToObject(m, w->meta_keys[i], w->meta_vals[i]));
    }
    uint64_t pos = 0;
    for (int i = 0; i < w->n; i++) {
        const wtensor_t *t = &w->t[i];
        if (wtensor_bytes(t, &sizes[i]) != 0 || __builtin_add_overflow(pos, sizes[i], &pos) || pos > (1ull << 53)) {
            err_set(err, "tensor '%s' is too large to serialize", t->name);
            goto fail;
        }
        cJSON *e = json_need(cJSON_AddObjectToObject(root, t->name));
        json_need(cJSON_AddStringToObject(e, "dtype", "F32"));
        cJSON *sh = json_need(cJSON_AddArrayToObject(e, "shape"));
        for (int k = 0; k < t->ndim; k++) json_push_number(sh, (double)t->shape[k]);
        cJSON *off = json_need(cJSON_AddArrayToObject(e, "data_offsets"));
        json_push_number(off, (double)(pos - sizes[i]));
        json_push_number(off, (double)pos);
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) json_need(NULL);
    size_t jlen = strlen(json);
    // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
    size_t hlen = (jlen + 7) & ~(size_t)7;
    if (hlen > ST_MAX_HEADER) {
        err_set(err, "safetensors header of %zu bytes exceeds the limit of %llu", hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (pos > SIZE_MAX - 8 - hlen) {
        err_set(err, "safetensors image too large");
        goto fail;
    }
    size_t total = 8 + hlen + (size_t)pos;
    uint8_t *buf = xmalloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', hlen - jlen);
    uint8_t *p = buf + 8 + hlen;
    for (int i = 0; i < w->n; i++) {
        if (sizes[i]) memcpy(p, w->t[i].data, (size_t)sizes[i]);
        p += sizes[i];
    }
    free(json);
    cJSON_Delete(root);
    free(sizes);
    *out = buf;
    *out_len = total;
    return 0;
fail:
    free(json);
    cJSON_Delete(root);
    free(sizes);
    return -1;
}

int st_writer_save(st_writer_t *w, const char *path, char *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    char e[ERR_LEN];
    if (st_writer_serialize(w, &buf, &len, e) != 0) return err_set(err, "%s: %s", path, e);
    int rc = util_write_file(path, buf, len, err);
    free(buf);
    return rc;
}

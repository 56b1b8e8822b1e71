// test_safetensors.c - safetensors reader/writer: bit-exact round trips, half/bfloat16
// conversion, and rejection of corrupted images without crashing.
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/safetensors.h"
#include "tests/unit/testbits.h"

#define TMP_DIR "build/test-tmp"

// Criterion runs tests in parallel processes, so each file name carries the test's tag and pid.
static void tmp_path(char *buf, size_t n, const char *tag) {
    char err[ERR_LEN];
    cr_assert_eq(util_mkdirs(TMP_DIR, err), 0, "%s", err);
    snprintf(buf, n, TMP_DIR "/st_%s_%d.safetensors", tag, (int)getpid());
}

static uint32_t lcg_state;
static uint32_t lcg(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return lcg_state;
}

// An image from a literal header and data_len bytes of data (byte i = i & 0xff).
static uint8_t *make_image(const char *hdr, size_t data_len, size_t *len) {
    size_t h = strlen(hdr);
    *len = 8 + h + data_len;
    uint8_t *buf = malloc(*len);
    cr_assert_not_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, hdr, h);
    for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (uint8_t)i;
    return buf;
}

static void expect_buffer_error(const char *hdr, size_t data_len, const char *want) {
    size_t len;
    uint8_t *img = make_image(hdr, data_len, &len);
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    if (f) st_close(&f);
    cr_assert_null(f, "header %s was accepted", hdr);
    cr_assert_not_null(strstr(err, want), "header %s: error '%s' lacks '%s'", hdr, err, want);
    cr_assert_not_null(strstr(err, "<buffer>"), "error '%s' does not name the source", err);
}

// Values whose bits must survive exactly: NaNs with payloads (quiet and signalling), both
// zeros, infinities, subnormals, extremes.
static const uint32_t special_bits[] = {
    0x7FA00001u, 0xFFC12345u, 0x7FC00000u, 0x80000000u, 0x00000000u, 0x7F800000u,
    0xFF800000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x3F800000u, 0xC0490FDBu,
};
#define N_SPECIAL ((int)(sizeof special_bits / sizeof special_bits[0]))

typedef struct {
    float special[N_SPECIAL];
    float scalar;
    float random[3 * 5 * 7];
} sample_t;

static void sample_fill(sample_t *s) {
    for (int i = 0; i < N_SPECIAL; i++) s->special[i] = tu_u2f(special_bits[i]);
    s->scalar = tu_u2f(0xFF812345u);
    lcg_state = 12345;
    for (int i = 0; i < 3 * 5 * 7; i++) s->random[i] = tu_u2f(lcg());
}

static const int64_t shape_special[2] = {3, 4};
static const int64_t shape_empty[2] = {0, 4};
static const int64_t shape_random[3] = {3, 5, 7};

// Names out of alphabetical order so that insertion order is distinguishable from sorting.
static st_writer_t *sample_writer(const sample_t *s, bool with_meta) {
    st_writer_t *w = st_writer_new();
    st_writer_add_f32(w, "zeta.special", 2, shape_special, s->special);
    st_writer_add_f32(w, "alpha.scalar", 0, NULL, &s->scalar);
    st_writer_add_f32(w, "mid.empty", 2, shape_empty, NULL);
    st_writer_add_f32(w, "beta.random", 3, shape_random, s->random);
    if (with_meta) {
        st_writer_metadata(w, "format", "pt");
        st_writer_metadata(w, "note", "quote \" and \\ and \xc3\xa9");
    }
    return w;
}

static void check_sample(const st_file_t *f, const sample_t *s, bool with_meta) {
    char err[ERR_LEN] = "";
    cr_assert_eq(st_count(f), 4);
    const char *order[] = {"zeta.special", "alpha.scalar", "mid.empty", "beta.random"};
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(st_tensor(f, i)->name, order[i]);
        cr_assert_eq(st_tensor(f, i)->dtype, ST_F32);
    }
    cr_assert_null(st_tensor(f, 4));
    cr_assert_null(st_tensor(f, -1));

    float special[N_SPECIAL], scalar, random[3 * 5 * 7];
    memset(special, 0, sizeof special);
    cr_assert_eq(st_read_f32(f, "zeta.special", 2, shape_special, special, err), 0, "%s", err);
    cr_assert_eq(memcmp(special, s->special, sizeof special), 0, "special values not bit exact");
    for (int i = 0; i < N_SPECIAL; i++) cr_assert_eq(tu_f2u(special[i]), special_bits[i], "value %d", i);
    cr_assert_eq(st_read_f32(f, "alpha.scalar", 0, NULL, &scalar, err), 0, "%s", err);
    cr_assert_eq(tu_f2u(scalar), 0xFF812345u);
    cr_assert_eq(st_read_f32(f, "mid.empty", 2, shape_empty, NULL, err), 0, "%s", err);
    cr_assert_eq(st_read_f32(f, "beta.random", 3, shape_random, random, err), 0, "%s", err);
    cr_assert_eq(memcmp(random, s->random, sizeof random), 0, "random values not bit exact");

    const st_tensor_t *t = st_find(f, "beta.random");
    cr_assert_not_null(t);
    cr_assert_eq(t->ndim, 3);
    cr_assert_eq(t->shape[0], 3);
    cr_assert_eq(t->shape[1], 5);
    cr_assert_eq(t->shape[2], 7);
    cr_assert_eq(t->nbytes, sizeof random);
    cr_assert_eq(st_find(f, "alpha.scalar")->ndim, 0);
    cr_assert_eq(st_find(f, "alpha.scalar")->nbytes, 4);
    cr_assert_eq(st_find(f, "mid.empty")->nbytes, 0);
    cr_assert_null(st_find(f, "beta"));
    cr_assert_null(st_find(f, "__metadata__"));

    if (with_meta) {
        cr_assert_str_eq(st_metadata(f, "format"), "pt");
        cr_assert_str_eq(st_metadata(f, "note"), "quote \" and \\ and \xc3\xa9");
    } else {
        cr_assert_null(st_metadata(f, "format"));
    }
    cr_assert_null(st_metadata(f, "absent"));
}

Test(safetensors, roundtrip_buffer_bit_exact) {
    sample_t s;
    sample_fill(&s);
    st_writer_t *w = sample_writer(&s, true);
    uint8_t *img;
    size_t len;
    char err[ERR_LEN] = "";
    cr_assert_eq(st_writer_serialize(w, &img, &len, err), 0, "%s", err);
    st_file_t *f = st_open_buffer(img, len, err);
    // The reader copies the bytes, so the caller's buffer may go away at once.
    memset(img, 0xAB, len);
    free(img);
    cr_assert_not_null(f, "%s", err);
    check_sample(f, &s, true);
    st_close(&f);
    cr_assert_null(f);
    st_close(&f);
    st_close(NULL);
    st_writer_destroy(&w);
    cr_assert_null(w);
    st_writer_destroy(&w);
    st_writer_destroy(NULL);
}

Test(safetensors, roundtrip_file_bit_exact) {
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "roundtrip");
    sample_t s;
    sample_fill(&s);
    st_writer_t *w = sample_writer(&s, true);
    cr_assert_eq(st_writer_save(w, path, err), 0, "%s", err);
    st_writer_destroy(&w);
    st_file_t *f = st_open(path, err);
    cr_assert_not_null(f, "%s", err);
    check_sample(f, &s, true);
    st_close(&f);
    unlink(path);
}

Test(safetensors, writer_layout) {
    sample_t s;
    sample_fill(&s);
    st_writer_t *w = sample_writer(&s, false);
    uint8_t *img;
    size_t len;
    char err[ERR_LEN] = "";
    cr_assert_eq(st_writer_serialize(w, &img, &len, err), 0, "%s", err);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | img[i];
    cr_assert_eq(hlen % 8, 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    cr_assert_eq(len, 8 + hlen + sizeof s.special + sizeof s.scalar + sizeof s.random);
    cr_assert_eq(img[8], '{');
    size_t end = 8 + hlen;
    while (img[end - 1] == ' ') end--;
    cr_assert_eq(img[end - 1], '}', "header not padded with spaces");
    cr_assert_lt(8 + hlen - end, 8);
    char *hdr = strndup((const char *)img + 8, hlen);
    cr_assert_null(strstr(hdr, "__metadata__"), "empty metadata written: %s", hdr);
    free(hdr);
    // The data section holds the tensors back to back in insertion order.
    cr_assert_eq(memcmp(img + 8 + hlen, s.special, sizeof s.special), 0);
    cr_assert_eq(memcmp(img + 8 + hlen + sizeof s.special, &s.scalar, 4), 0);
    cr_assert_eq(memcmp(img + 8 + hlen + sizeof s.special + 4, s.random, sizeof s.random), 0);

    st_file_t *f = st_open_buffer(img, len, err);
    cr_assert_not_null(f, "%s", err);
    check_sample(f, &s, false);
    size_t pos = 0;
    for (int i = 0; i < st_count(f); i++) {
        cr_assert_eq(st_tensor(f, i)->offset, pos, "tensor %d not contiguous", i);
        pos += st_tensor(f, i)->nbytes;
    }
    st_close(&f);
    free(img);
    st_writer_destroy(&w);
}

Test(safetensors, writer_metadata_first_and_replaced) {
    st_writer_t *w = st_writer_new();
    float x = 1;
    st_writer_add_f32(w, "x", 1, (const int64_t[]){1}, &x);
    st_writer_metadata(w, "k", "old");
    st_writer_metadata(w, "k", "new");
    uint8_t *img;
    size_t len;
    char err[ERR_LEN] = "";
    cr_assert_eq(st_writer_serialize(w, &img, &len, err), 0, "%s", err);
    cr_assert_eq(memcmp(img + 8, "{\"__metadata__\":{\"k\":\"new\"}", 27), 0, "%.40s", (const char *)img + 8);
    st_file_t *f = st_open_buffer(img, len, err);
    cr_assert_not_null(f, "%s", err);
    cr_assert_str_eq(st_metadata(f, "k"), "new");
    cr_assert_eq(st_count(f), 1);
    st_close(&f);
    free(img);
    st_writer_destroy(&w);
}

Test(safetensors, empty_writer) {
    st_writer_t *w = st_writer_new();
    uint8_t *img;
    size_t len;
    char err[ERR_LEN] = "";
    cr_assert_eq(st_writer_serialize(w, &img, &len, err), 0, "%s", err);
    cr_assert_eq(len, 16);
    cr_assert_eq(memcmp(img, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
    st_file_t *f = st_open_buffer(img, len, err);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(st_count(f), 0);
    cr_assert_null(st_find(f, "x"));
    st_close(&f);
    free(img);
    st_writer_destroy(&w);
}

// Reads `n` 16-bit values of the given dtype through a hand-made image.
static void read_16bit(const char *dtype, const uint16_t *vals, int n, float *out) {
    char hdr[256];
    snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", dtype, n, 2 * n);
    size_t len;
    uint8_t *img = make_image(hdr, (size_t)(2 * n), &len);
    uint8_t *data = img + len - 2 * n;
    for (int i = 0; i < n; i++) {
        data[2 * i] = (uint8_t)(vals[i] & 0xff);
        data[2 * i + 1] = (uint8_t)(vals[i] >> 8);
    }
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(st_read_f32(f, "t", 1, (const int64_t[]){n}, out, err), 0, "%s", err);
    st_close(&f);
}

Test(safetensors, f16_known_values) {
    static const struct {
        uint16_t h;
        float f;
    } cases[] = {
        {0x3C00, 1.0f},
        {0xC000, -2.0f},
        {0x0001, 5.960464477539063e-08f},   // smallest subnormal, 2^-24
        {0x03FF, 6.097555160522461e-05f},   // largest subnormal
        {0x0400, 6.103515625e-05f},         // smallest normal, 2^-14
        {0x8001, -5.960464477539063e-08f},
        {0x7BFF, 65504.0f},
        {0x3555, 0.333251953125f},
        {0x0000, 0.0f},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    uint16_t vals[16];
    float out[16];
    for (int i = 0; i < n; i++) vals[i] = cases[i].h;
    read_16bit("F16", vals, n, out);
    for (int i = 0; i < n; i++)
        cr_assert_eq(tu_f2u(out[i]), tu_f2u(cases[i].f), "half 0x%04x -> %.17g, want %.17g", cases[i].h, out[i],
                     cases[i].f);

    uint16_t special[] = {0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE3F};
    read_16bit("F16", special, 6, out);
    cr_assert(out[0] == 0 && signbit(out[0]), "0x8000 must be -0.0");
    cr_assert(isinf(out[1]) && out[1] > 0);
    cr_assert(isinf(out[2]) && out[2] < 0);
    cr_assert_eq(tu_f2u(out[3]), 0x7FC00000u);
    // NaN payloads move into the top of the fp32 mantissa; a signalling NaN stays signalling.
    cr_assert_eq(tu_f2u(out[4]), 0x7F802000u);
    cr_assert_eq(tu_f2u(out[5]), 0xFFC7E000u);
}

// Independent reference: the value formula of IEEE binary16, evaluated in double.
static double half_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0) {
        v = m;
        for (int i = 0; i < 24; i++) v *= 0.5;
    } else {
        v = 1024 + m;
        for (int i = 0; i < 25; i++) v *= 0.5;
        for (int i = 0; i < e; i++) v *= 2;
    }
    return (h & 0x8000) ? -v : v;
}

Test(safetensors, f16_all_values) {
    static uint16_t vals[65536];
    static float out[65536];
    for (int i = 0; i < 65536; i++) vals[i] = (uint16_t)i;
    read_16bit("F16", vals, 65536, out);
    for (int i = 0; i < 65536; i++) {
        int e = (i >> 10) & 0x1f;
        if (e == 0x1f) {
            cr_assert_eq(tu_f2u(out[i]), (uint32_t)(i & 0x8000) << 16 | 0x7F800000u | (uint32_t)(i & 0x3ff) << 13,
                         "half 0x%04x", i);
        } else {
            double want = half_value((uint16_t)i);
            cr_assert((double)out[i] == want && !!signbit(out[i]) == !!(i & 0x8000), "half 0x%04x -> %.17g, want %.17g",
                      i, out[i], want);
        }
    }
}

Test(safetensors, bf16_values) {
    uint16_t vals[] = {0x3F80, 0xC000, 0x0001, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x7F81, 0x4049};
    float out[9];
    read_16bit("BF16", vals, 9, out);
    cr_assert_eq(out[0], 1.0f);
    cr_assert_eq(out[1], -2.0f);
    cr_assert_eq(tu_f2u(out[2]), 0x00010000u);
    cr_assert_eq(out[2], 9.183549615799121e-41f);
    cr_assert(out[3] == 0 && signbit(out[3]));
    cr_assert(isinf(out[4]) && out[4] > 0);
    cr_assert(isinf(out[5]) && out[5] < 0);
    cr_assert_eq(tu_f2u(out[6]), 0x7FC10000u);
    cr_assert_eq(tu_f2u(out[7]), 0x7F810000u);
    cr_assert_eq(out[8], 3.140625f);

    static uint16_t all[65536];
    static float all_out[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    read_16bit("BF16", all, 65536, all_out);
    for (int i = 0; i < 65536; i++) cr_assert_eq(tu_f2u(all_out[i]), (uint32_t)i << 16, "bf16 0x%04x", i);
}

Test(safetensors, f32_unaligned_data) {
    // A 57-byte header puts the data section at offset 65: every float is misaligned.
    const char *hdr = "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}  ";
    cr_assert_eq((8 + strlen(hdr)) % 4, 1);
    size_t len;
    uint8_t *img = make_image(hdr, 12, &len);
    const float want[3] = {1.5f, -0.0f, tu_u2f(0x7FA00001u)};
    memcpy(img + len - 12, want, 12);
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    cr_assert_not_null(f, "%s", err);
    float got[3];
    cr_assert_eq(st_read_f32(f, "t", 1, (const int64_t[]){3}, got, err), 0, "%s", err);
    cr_assert_eq(memcmp(got, want, sizeof got), 0);
    st_close(&f);
}

Test(safetensors, read_f32_errors) {
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[24,40]},"
                      "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[40,43]}}";
    size_t len;
    uint8_t *img = make_image(hdr, 43, &len);
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(st_find(f, "ids")->dtype, ST_I64);
    cr_assert_eq(st_find(f, "b")->nbytes, 3);
    float dst[8];

    cr_assert_eq(st_read_f32(f, "nope", 1, (const int64_t[]){2}, dst, err), -1);
    cr_assert_str_eq(err, "missing tensor nope in <buffer>");

    cr_assert_eq(st_read_f32(f, "w", 2, (const int64_t[]){3, 2}, dst, err), -1);
    cr_assert_not_null(strstr(err, "tensor w has shape [2,3], expected [3,2]"), "%s", err);
    cr_assert_eq(st_read_f32(f, "w", 1, (const int64_t[]){6}, dst, err), -1);
    cr_assert_not_null(strstr(err, "has shape [2,3], expected [6]"), "%s", err);
    cr_assert_eq(st_read_f32(f, "w", 3, (const int64_t[]){2, 3, 1}, dst, err), -1);
    cr_assert_not_null(strstr(err, "expected [2,3,1]"), "%s", err);

    cr_assert_eq(st_read_f32(f, "ids", 1, (const int64_t[]){2}, dst, err), -1);
    cr_assert_not_null(strstr(err, "tensor ids has dtype I64; only F32, F16, BF16 are supported"), "%s", err);
    cr_assert_eq(st_read_f32(f, "b", 1, (const int64_t[]){3}, dst, err), -1);
    cr_assert_not_null(strstr(err, "dtype U8"), "%s", err);

    cr_assert_eq(st_read_f32(f, "w", 2, (const int64_t[]){2, 3}, dst, err), 0, "%s", err);
    st_close(&f);
}

Test(safetensors, dtype_table) {
    cr_assert_str_eq(st_dtype_name(ST_F32), "F32");
    cr_assert_str_eq(st_dtype_name(ST_BF16), "BF16");
    cr_assert_str_eq(st_dtype_name(ST_BOOL), "BOOL");
    cr_assert_eq(st_dtype_size(ST_F32), 4);
    cr_assert_eq(st_dtype_size(ST_F16), 2);
    cr_assert_eq(st_dtype_size(ST_BF16), 2);
    cr_assert_eq(st_dtype_size(ST_F64), 8);
    cr_assert_eq(st_dtype_size(ST_I64), 8);
    cr_assert_eq(st_dtype_size(ST_I32), 4);
    cr_assert_eq(st_dtype_size(ST_I16), 2);
    cr_assert_eq(st_dtype_size(ST_I8), 1);
    cr_assert_eq(st_dtype_size(ST_U8), 1);
    cr_assert_eq(st_dtype_size(ST_BOOL), 1);
}

Test(safetensors, all_dtypes_accepted) {
    const char *hdr = "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                      "\"c\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[12,14]},"
                      "\"d\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[14,15]},"
                      "\"e\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[15,16]},"
                      "\"f\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[16,18]}}";
    size_t len;
    uint8_t *img = make_image(hdr, 18, &len);
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(st_count(f), 6);
    st_dtype_t want[] = {ST_F64, ST_I32, ST_I16, ST_I8, ST_BOOL, ST_F16};
    for (int i = 0; i < 6; i++) cr_assert_eq(st_tensor(f, i)->dtype, want[i]);
    cr_assert_eq(st_find(f, "f")->ndim, ST_MAX_DIMS);
    st_close(&f);
}

Test(safetensors, header_length_errors) {
    char err[ERR_LEN] = "";
    uint8_t small[7] = {0};
    for (size_t n = 0; n < 8; n++) {
        err[0] = 0;
        cr_assert_null(st_open_buffer(small, n, err));
        cr_assert_not_null(strstr(err, "shorter than"), "%zu bytes: %s", n, err);
    }
    cr_assert_null(st_open_buffer(NULL, 0, err));

    // Header length one past the end of the file.
    uint8_t img[16] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    cr_assert_null(st_open_buffer(img, sizeof img, err));
    cr_assert_not_null(strstr(err, "exceeds the file size"), "%s", err);
    // Absurd lengths, including one where 8 + length wraps around.
    uint8_t big[16] = {0x00, 0xe1, 0xf5, 0x05, 1, 0, 0, 0, '{', '}'};
    cr_assert_null(st_open_buffer(big, sizeof big, err));
    cr_assert_not_null(strstr(err, "exceeds the limit"), "%s", err);
    memset(big, 0xff, 8);
    cr_assert_null(st_open_buffer(big, sizeof big, err));
    cr_assert_not_null(strstr(err, "exceeds the limit"), "%s", err);
    // Just above 100 MB.
    uint8_t limit[16] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0};
    cr_assert_null(st_open_buffer(limit, sizeof limit, err));
    cr_assert_not_null(strstr(err, "exceeds the limit"), "%s", err);

    // Header length zero: empty header is not JSON.
    uint8_t zero[8] = {0};
    cr_assert_null(st_open_buffer(zero, sizeof zero, err));
    cr_assert_not_null(strstr(err, "not valid JSON"), "%s", err);
}

Test(safetensors, header_json_errors) {
    expect_buffer_error("{\"a\":", 0, "not valid JSON");
    expect_buffer_error("garbage", 0, "not valid JSON");
    expect_buffer_error("[1,2,3]", 0, "not a JSON object");
    expect_buffer_error("\"str\"", 0, "not a JSON object");
    expect_buffer_error("{} x", 0, "trailing bytes");
    expect_buffer_error("{}{}", 0, "trailing bytes");
    expect_buffer_error("{\"__metadata__\":[1]}", 0, "__metadata__ is not an object");
    expect_buffer_error("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ entry 'k' is not a string");
}

Test(safetensors, entry_errors) {
    expect_buffer_error("{\"w\":3}", 0, "tensor 'w': entry is not an object");
    expect_buffer_error("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': dtype is missing");
    expect_buffer_error("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': dtype");
    expect_buffer_error("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                        "tensor 'w': unknown dtype 'Q4_K'");
    expect_buffer_error("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'f32'");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w': shape");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, "tensor 'w': shape");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                        "tensor 'w': shape[0] is not a non-negative integer");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1.5],\"data_offsets\":[0,4]}}", 4, "shape[1]");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                        "tensor 'w': 9 dimensions, at most 8");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': data_offsets");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "data_offsets");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4, "data_offsets");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"a\":0}}}", 4, "data_offsets");
}

Test(safetensors, offset_errors) {
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
                        "tensor 'w': data_offsets [4, 0] end before begin");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7,
                        "outside the data section of 7 bytes");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e30]}}", 4, "data_offsets");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 4, "outside");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8,
                        "tensor 'w': data_offsets span 4 bytes but shape and dtype F32 need 8");
    expect_buffer_error("{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 8, "need 6");
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 8, "need 0");
}

Test(safetensors, shape_overflow) {
    // 2^62 * 4 bytes wraps to 0 in 64 bits and would match empty offsets if unchecked.
    expect_buffer_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                        "tensor 'w': shape is too large");
    expect_buffer_error(
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, "too large");
    expect_buffer_error(
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[65536,65536,65536,65536,2],\"data_offsets\":[0,0]}}", 0, "too large");
    // A zero dimension makes any other dimensions harmless.
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}";
    size_t len;
    uint8_t *img = make_image(hdr, 0, &len);
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(st_find(f, "w")->nbytes, 0);
    st_close(&f);
}

Test(safetensors, overlap_and_duplicates) {
    expect_buffer_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        12, "tensor 'b' [4, 12] overlaps tensor 'a' [0, 8]");
    // Listed in reverse offset order, and one tensor inside another.
    expect_buffer_error("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                        16, "overlaps");
    expect_buffer_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                        8, "overlaps");
    expect_buffer_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                        16, "tensor 'a' appears twice");
    expect_buffer_error("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate __metadata__");

    // Adjacent tensors and empty tensors at a shared offset are fine.
    const char *hdr = "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                      "\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                      "\"e2\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    size_t len;
    uint8_t *img = make_image(hdr, 8, &len);
    char err[ERR_LEN] = "";
    st_file_t *f = st_open_buffer(img, len, err);
    free(img);
    cr_assert_not_null(f, "%s", err);
    cr_assert_eq(st_count(f), 4);
    cr_assert_str_eq(st_tensor(f, 0)->name, "b");
    cr_assert_eq(st_find(f, "a")->offset, 0);
    cr_assert_eq(st_find(f, "b")->offset, 4);
    st_close(&f);
}

Test(safetensors, open_file_errors) {
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "missing");
    unlink(path);
    cr_assert_null(st_open(path, err));
    cr_assert_not_null(strstr(err, path), "%s", err);
    cr_assert_not_null(strstr(err, "cannot open"), "%s", err);

    cr_assert_null(st_open(TMP_DIR, err));
    cr_assert_not_null(strstr(err, "not a regular file"), "%s", err);

    // Errors from a file name the file, not "<buffer>".
    tmp_path(path, sizeof path, "baddtype");
    size_t len;
    uint8_t *img = make_image("{\"w\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &len);
    cr_assert_eq(util_write_file(path, img, len, err), 0, "%s", err);
    free(img);
    cr_assert_null(st_open(path, err));
    cr_assert_not_null(strstr(err, path), "%s", err);
    cr_assert_not_null(strstr(err, "tensor 'w': unknown dtype 'X9'"), "%s", err);

    cr_assert_eq(util_write_file(path, "", 0, err), 0, "%s", err);
    cr_assert_null(st_open(path, err));
    cr_assert_not_null(strstr(err, "shorter than"), "%s", err);
    unlink(path);
}

Test(safetensors, truncation_every_length) {
    sample_t s;
    sample_fill(&s);
    st_writer_t *w = sample_writer(&s, true);
    uint8_t *img;
    size_t len;
    char err[ERR_LEN] = "";
    cr_assert_eq(st_writer_serialize(w, &img, &len, err), 0, "%s", err);
    st_writer_destroy(&w);
    char path[256];
    tmp_path(path, sizeof path, "trunc");
    for (size_t n = 0; n <= len; n++) {
        err[0] = 0;
        st_file_t *f = st_open_buffer(img, n, err);
        cr_assert_eq(util_write_file(path, img, n, err), 0, "%s", err);
        st_file_t *g = st_open(path, err);
        if (n < len) {
            cr_assert_null(f, "truncated at %zu of %zu bytes but accepted", n, len);
            cr_assert_null(g, "file truncated at %zu of %zu bytes but accepted", n, len);
            cr_assert_gt(strlen(err), 0, "no message at %zu", n);
        } else {
            cr_assert_not_null(f, "%s", err);
            cr_assert_not_null(g, "%s", err);
            check_sample(f, &s, true);
            check_sample(g, &s, true);
        }
        st_close(&f);
        st_close(&g);
    }
    unlink(path);
    free(img);
}

// Reading every tensor a damaged-but-accepted header describes must stay inside the image
// (AddressSanitizer and valgrind see any stray access).
static void read_all(const st_file_t *f) {
    char err[ERR_LEN];
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_tensor(f, i);
        size_t count = t->nbytes / st_dtype_size(t->dtype);
        float *dst = malloc(count * sizeof(float) + 1);
        cr_assert_not_null(dst);
        int rc = st_read_f32(f, t->name, t->ndim, t->shape, dst, err);
        if (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16) cr_assert_eq(rc, 0, "%s", err);
        free(dst);
    }
}

Test(safetensors, random_header_flips) {
    sample_t s;
    sample_fill(&s);
    st_writer_t *w = sample_writer(&s, true);
    uint8_t *img;
    size_t len;
    char err[ERR_LEN] = "";
    cr_assert_eq(st_writer_serialize(w, &img, &len, err), 0, "%s", err);
    st_writer_destroy(&w);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | img[i];
    uint8_t *copy = malloc(len);
    cr_assert_not_null(copy);
    lcg_state = 200;
    int accepted = 0;
    for (int iter = 0; iter < 200; iter++) {
        memcpy(copy, img, len);
        // One to three damaged bytes, anywhere in the length field or the header.
        int flips = 1 + (int)(lcg() % 3);
        for (int k = 0; k < flips; k++) {
            size_t at = lcg() % (8 + hlen);
            copy[at] ^= (uint8_t)(1u << (lcg() % 8));
        }
        err[0] = 0;
        st_file_t *f = st_open_buffer(copy, len, err);
        if (f) {
            accepted++;
            read_all(f);
            st_close(&f);
        } else {
            cr_assert_gt(strlen(err), 0, "iteration %d rejected without a message", iter);
            cr_assert_not_null(strstr(err, "<buffer>"), "iteration %d: %s", iter, err);
        }
    }
    // Most single-bit flips land in names, spaces or digits of the JSON; some must be caught.
    cr_assert_lt(accepted, 200);
    free(copy);
    free(img);
}

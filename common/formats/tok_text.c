// tok_text.c - buffers, pieces, UTF-8 and character classes, the byte-level alphabet and the
// strict tokenizer.json readers shared by the tokenizer's stages (see tok_text.h).
#include "common/formats/tok_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

// ---------------------------------------------------------------------------------------
// Buffers and pieces

void tok_buf_reserve(tok_buf_t *b, size_t extra) {
    if (b->n + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void tok_buf_add(tok_buf_t *b, const void *s, size_t n) {
    if (!n) return;
    tok_buf_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void tok_buf_addc(tok_buf_t *b, char c) {
    tok_buf_reserve(b, 1);
    b->p[b->n++] = c;
}

void tok_buf_add_cp(tok_buf_t *b, uint32_t cp) {
    tok_buf_reserve(b, 4);
    b->n += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)b->p + b->n);
}

void tok_buf_add_lossy(tok_buf_t *b, const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        bool ok;
        size_t l = tok_utf8_next(u + i, n - i, &cp, &ok);
        if (ok) {
            i += l;
            continue;
        }
        tok_buf_add(b, s + run, i - run);
        // The maximal subpart: the lead byte and as many continuation bytes as could still
        // begin a well-formed sequence (so "\xE2\x82" is one U+FFFD, "\xC0\x80" two).
        uint8_t c = u[i];
        size_t need = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        size_t k = 1;
        while (k <= need && i + k < n && u[i + k] >= lo && u[i + k] <= hi) {
            k++;
            lo = 0x80, hi = 0xBF;
        }
        tok_buf_add(b, "\xEF\xBF\xBD", 3);
        i += k;
        run = i;
    }
    tok_buf_add(b, s + run, n - run);
}

void tok_buf_free(tok_buf_t *b) {
    free(b->p);
    *b = (tok_buf_t){0};
}

void tok_pieces_push(tok_pieces_t *a, size_t off, size_t len, bool at_start) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = (tok_piece_t){(uint32_t)off, (uint32_t)len, at_start};
}

void tok_pieces_free(tok_pieces_t *a) {
    free(a->v);
    *a = (tok_pieces_t){0};
}

void tok_segs_push(tok_segs_t *a, size_t start, size_t end, bool match) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = (tok_seg_t){start, end, match};
}

void tok_work_free(tok_work_t *w) {
    tok_buf_free(&w->tmp);
    tok_buf_free(&w->tmp2);
    free(w->segs.v);
    free(w->segs2.v);
    tok_pieces_free(&w->pieces2);
    pcre2_match_data_free(w->match_data);
    *w = (tok_work_t){0};
}

// ---------------------------------------------------------------------------------------
// UTF-8 and character classes


size_t tok_utf8_last(const char *s, size_t n) {
    size_t i = n - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    return i;
}

bool tok_is_whitespace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool tok_is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool tok_is_word(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        break;
    }
    // Join_Control, and the symbols that are Other_Alphabetic (circled and squared letters).
    return cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
           (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189);
}

// bytes_to_unicode(): the printable bytes ! .. ~, ¡ .. ¬, ® .. ÿ stand for themselves; the
// other 68 bytes, in order, become U+0100 onwards.
const uint16_t tok_byte_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10A, 0x10B, 0x10C, 0x10D, 0x10E, 0x10F,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11A, 0x11B, 0x11C, 0x11D, 0x11E, 0x11F,
    0x120, 0x21,  0x22,  0x23,  0x24,  0x25,  0x26,  0x27,  0x28,  0x29,  0x2A,  0x2B,  0x2C,  0x2D,  0x2E,  0x2F,
    0x30,  0x31,  0x32,  0x33,  0x34,  0x35,  0x36,  0x37,  0x38,  0x39,  0x3A,  0x3B,  0x3C,  0x3D,  0x3E,  0x3F,
    0x40,  0x41,  0x42,  0x43,  0x44,  0x45,  0x46,  0x47,  0x48,  0x49,  0x4A,  0x4B,  0x4C,  0x4D,  0x4E,  0x4F,
    0x50,  0x51,  0x52,  0x53,  0x54,  0x55,  0x56,  0x57,  0x58,  0x59,  0x5A,  0x5B,  0x5C,  0x5D,  0x5E,  0x5F,
    0x60,  0x61,  0x62,  0x63,  0x64,  0x65,  0x66,  0x67,  0x68,  0x69,  0x6A,  0x6B,  0x6C,  0x6D,  0x6E,  0x6F,
    0x70,  0x71,  0x72,  0x73,  0x74,  0x75,  0x76,  0x77,  0x78,  0x79,  0x7A,  0x7B,  0x7C,  0x7D,  0x7E,  0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12A, 0x12B, 0x12C, 0x12D, 0x12E, 0x12F, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13A, 0x13B, 0x13C, 0x13D, 0x13E, 0x13F, 0x140, 0x141,
    0x142, 0xA1,  0xA2,  0xA3,  0xA4,  0xA5,  0xA6,  0xA7,  0xA8,  0xA9,  0xAA,  0xAB,  0xAC,  0x143, 0xAE,  0xAF,
    0xB0,  0xB1,  0xB2,  0xB3,  0xB4,  0xB5,  0xB6,  0xB7,  0xB8,  0xB9,  0xBA,  0xBB,  0xBC,  0xBD,  0xBE,  0xBF,
    0xC0,  0xC1,  0xC2,  0xC3,  0xC4,  0xC5,  0xC6,  0xC7,  0xC8,  0xC9,  0xCA,  0xCB,  0xCC,  0xCD,  0xCE,  0xCF,
    0xD0,  0xD1,  0xD2,  0xD3,  0xD4,  0xD5,  0xD6,  0xD7,  0xD8,  0xD9,  0xDA,  0xDB,  0xDC,  0xDD,  0xDE,  0xDF,
    0xE0,  0xE1,  0xE2,  0xE3,  0xE4,  0xE5,  0xE6,  0xE7,  0xE8,  0xE9,  0xEA,  0xEB,  0xEC,  0xED,  0xEE,  0xEF,
    0xF0,  0xF1,  0xF2,  0xF3,  0xF4,  0xF5,  0xF6,  0xF7,  0xF8,  0xF9,  0xFA,  0xFB,  0xFC,  0xFD,  0xFE,  0xFF,
};

int tok_cp_byte(uint32_t cp) {
    if (cp >= 0x100 && cp <= 0x143) {
        // The 68 remapped bytes, in increasing byte order: 0..32, 127..160, 173.
        uint32_t k = cp - 0x100;
        return k <= 32 ? (int)k : k <= 66 ? (int)(k - 33 + 127) : 173;
    }
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    return -1;
}

// ---------------------------------------------------------------------------------------
// Reading tokenizer.json values

const char *tok_where(char *buf, size_t cap, const char *where, const char *key, int index) {
    if (key)
        snprintf(buf, cap, "%s%s%s", where, where[0] ? "." : "", key);
    else
        snprintf(buf, cap, "%s[%d]", where, index);
    return buf;
}

int tok_json_keys(const cJSON *obj, const char *where, const char *what, const char *const *known, char *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++) ok = strcmp(*k, it->string) == 0;
        if (!ok)
            return err_set(err, "%s (%s): unknown key \"%.40s\"; refusing rather than ignoring it", where, what,
                           it->string);
    }
    return 0;
}

int tok_json_bool(const cJSON *obj, const char *key, bool dflt, bool *out, const char *where, char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return err_set(err, "%s.%s must be true or false", where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

int tok_json_str(const cJSON *obj, const char *key, const char *dflt, const char **out, const char *where,
                 char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsString(v)) return err_set(err, "%s.%s must be a string", where, key);
    *out = v->valuestring;
    return 0;
}

int tok_json_uint(const cJSON *obj, const char *key, int64_t dflt, int64_t max, int64_t *out, const char *where,
                  char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= (double)max) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return err_set(err, "%s.%s must be an integer from 0 to %lld", where, key, (long long)max);
    *out = (int64_t)v->valuedouble;
    return 0;
}

// tok_text.h - the small pieces the tokenizer's stages share: growable byte buffers, lists of
// pieces (byte ranges of a buffer), UTF-8 decoding and validation, the Unicode character
// classes the Hugging Face tokenizers library tests with Rust's char methods (whitespace,
// numeric), the GPT-2 byte <-> character table, and strict readers for tokenizer.json values
// that name the place in the file when they refuse one.
#ifndef MARLAAS_TOK_TEXT_H
#define MARLAAS_TOK_TEXT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util/util.h"

// Components nest (Sequence of Sequence ...); deeper than this is refused, so a hostile file
// cannot exhaust the stack.
#define TOK_MAX_DEPTH 8

// ---------------------------------------------------------------------------------------
// Buffers and pieces

typedef struct {
    char *p;
    size_t n, cap;
} tok_buf_t;

void tok_buf_reserve(tok_buf_t *b, size_t extra);
void tok_buf_add(tok_buf_t *b, const void *s, size_t n);
void tok_buf_addc(tok_buf_t *b, char c);
// Appends the UTF-8 encoding of code point cp (which must be a valid scalar value).
void tok_buf_add_cp(tok_buf_t *b, uint32_t cp);
// Appends s with every ill-formed UTF-8 subsequence replaced by U+FFFD, one per maximal
// subpart (the Unicode "best practice" that Rust's String::from_utf8_lossy follows).
void tok_buf_add_lossy(tok_buf_t *b, const char *s, size_t n);
void tok_buf_free(tok_buf_t *b);

// A byte range of some buffer. at_start: the piece begins at offset 0 of the original input
// text (Metaspace's prepend_scheme "first" asks this).
typedef struct {
    uint32_t off, len;
    bool at_start;
} tok_piece_t;

typedef struct {
    tok_piece_t *v;
    size_t n, cap;
} tok_pieces_t;

void tok_pieces_push(tok_pieces_t *a, size_t off, size_t len, bool at_start);
void tok_pieces_free(tok_pieces_t *a);

// A match list over a string: consecutive segments covering it, each a match or not.
typedef struct {
    size_t start, end;
    bool match;
} tok_seg_t;

typedef struct {
    tok_seg_t *v;
    size_t n, cap;
} tok_segs_t;

void tok_segs_push(tok_segs_t *a, size_t start, size_t end, bool match);

// Scratch space one encode or decode call reuses across its stages (nothing is shared
// between calls, so a tokenizer can encode from several threads at once).
typedef struct {
    tok_buf_t tmp, tmp2;      // normalizer and decoder intermediates
    tok_segs_t segs, segs2;
    tok_pieces_t pieces2;
    void *match_data;         // pcre2_match_data_8, created on first use
} tok_work_t;

void tok_work_free(tok_work_t *w);

// ---------------------------------------------------------------------------------------
// UTF-8 and character classes

// common/util's UTF-8 functions under the names this library has always used.
static inline size_t tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, bool *ok) {
    return util_utf8_next(s, n, cp, ok);
}
static inline bool tok_utf8_valid(const char *s, size_t n, size_t *bad) { return util_utf8_valid(s, n, bad); }
// Offset where the last character of s[0, n) begins (n > 0, s well-formed).
size_t tok_utf8_last(const char *s, size_t n);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool tok_is_whitespace(uint32_t cp);
// Rust's char::is_numeric (general categories Nd, Nl, No).
bool tok_is_numeric(uint32_t cp);
// The regex crate's \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool tok_is_word(uint32_t cp);

// GPT-2's byte-level alphabet: byte b is written as code point tok_byte_cp[b]; tok_cp_byte
// maps such a code point back to its byte, or -1.
extern const uint16_t tok_byte_cp[256];
int tok_cp_byte(uint32_t cp);

// ---------------------------------------------------------------------------------------
// Reading tokenizer.json values. `where` names the place in the file ("pre_tokenizer.
// pretokenizers[1]"); messages say what is wrong there.

// Refuses any key of obj outside the NULL-terminated list `known`, naming it and `what`.
int tok_json_keys(const cJSON *obj, const char *where, const char *what, const char *const *known, char *err);
// Optional bool / string / non-negative integer (absent or null: dflt).
int tok_json_bool(const cJSON *obj, const char *key, bool dflt, bool *out, const char *where, char *err);
int tok_json_str(const cJSON *obj, const char *key, const char *dflt, const char **out, const char *where, char *err);
int tok_json_uint(const cJSON *obj, const char *key, int64_t dflt, int64_t max, int64_t *out, const char *where,
                  char *err);
// "where" + ".key" or "where[i]" into buf.
const char *tok_where(char *buf, size_t cap, const char *where, const char *key, int index);

#endif

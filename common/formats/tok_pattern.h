// tok_pattern.h - the patterns of tokenizer.json ({"String": s} or {"Regex": r}) and the match
// lists the Split pre-tokenizer, the Replace normalizer and decoder build from them.
//
// A String is matched literally. A Regex is written for Oniguruma (the Rust library's regex
// engine) and is run with PCRE2 (UTF, Unicode properties, JIT): the few escapes whose meaning
// differs between the two are rewritten first (\s \S as White_Space, \w \W \d \D \h \H as
// Oniguruma defines them, \uHHHH), ^ and $ are line anchors as in Oniguruma, and what PCRE2
// cannot express the same way (character-class intersection &&, nested classes) is refused.
#ifndef MARLAAS_TOK_PATTERN_H
#define MARLAAS_TOK_PATTERN_H

#include "common/formats/tok_text.h"

typedef struct tok_pattern tok_pattern_t;

// Parses {"String": ...} or {"Regex": ...} at `where`.
tok_pattern_t *tok_pattern_parse(const cJSON *j, const char *where, char *err);
// Compiles an Oniguruma regex (for the built-in patterns of the pre-tokenizers).
tok_pattern_t *tok_pattern_regex(const char *src, const char *where, char *err);
void tok_pattern_destroy(tok_pattern_t **p);

// The matches of p in s[0, n) as Oniguruma's find_iter gives them (leftmost first, then from
// the end of the previous match; an empty match advances one character), written to segs as
// consecutive segments covering s (matches flagged), as the Rust library's find_matches does.
// With invert the flags are flipped. s must be well-formed UTF-8. Returns 0 or -1 with err (a
// regex that exceeds PCRE2's match limits).
int tok_pattern_segments(const tok_pattern_t *p, const char *s, size_t n, bool invert, tok_segs_t *segs,
                         tok_work_t *w, char *err);
// Appends s to out with every match of p replaced by `with`.
int tok_pattern_replace(const tok_pattern_t *p, const char *s, size_t n, const char *with, size_t with_len,
                        tok_buf_t *out, tok_work_t *w, char *err);

#endif

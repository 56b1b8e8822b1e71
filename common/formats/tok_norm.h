// tok_norm.h - the normalizers of tokenizer.json: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase,
// Strip, Prepend, Replace and Sequence of them, with the Rust library's semantics.
#ifndef MARLAAS_TOK_NORM_H
#define MARLAAS_TOK_NORM_H

#include "common/formats/tok_text.h"

typedef struct tok_norm tok_norm_t;

// Parses the normalizer object j found at `where`; refuses an unknown type or key.
tok_norm_t *tok_norm_parse(const cJSON *j, const char *where, int depth, char *err);
void tok_norm_destroy(tok_norm_t **n);
// Writes the normalized s[0, len) (well-formed UTF-8) to out (emptied first).
int tok_norm_apply(const tok_norm_t *n, const char *s, size_t len, tok_buf_t *out, tok_work_t *w, char *err);

#endif

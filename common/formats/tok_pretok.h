// tok_pretok.h - the pre-tokenizers of tokenizer.json: ByteLevel, Split, Metaspace, Digits,
// Whitespace, WhitespaceSplit and Sequence of them, with the Rust library's semantics
// (including every Split behavior: Removed, Isolated, MergedWithPrevious, MergedWithNext,
// Contiguous, and invert).
#ifndef MARLAAS_TOK_PRETOK_H
#define MARLAAS_TOK_PRETOK_H

#include "common/formats/tok_text.h"

typedef struct tok_pretok tok_pretok_t;

// Parses the pre-tokenizer object j found at `where`; refuses an unknown type or key.
tok_pretok_t *tok_pretok_parse(const cJSON *j, const char *where, int depth, char *err);
void tok_pretok_destroy(tok_pretok_t **p);
// Splits every piece of `pieces` (byte ranges of arena, well-formed UTF-8) into the words
// the model encodes one by one, in place. Text a pre-tokenizer rewrites (ByteLevel's byte
// alphabet, Metaspace's replacement) is appended to arena.
int tok_pretok_apply(const tok_pretok_t *p, tok_buf_t *arena, tok_pieces_t *pieces, tok_work_t *w, char *err);

#endif

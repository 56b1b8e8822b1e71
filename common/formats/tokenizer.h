// tokenizer.h - Hugging Face `tokenizer.json` with a BPE model: encode text to ids, decode
// ids to text.
//
// Pipeline (as in the tokenizers library): added tokens are matched first and split the
// text; each remaining piece goes through the pre-tokenizer (today: none, i.e. the piece is
// one word; ByteLevel with its split regex plugs in here), then the BPE model: the word is
// split into UTF-8 characters (or bytes via byte_fallback tokens "<0xNN>"), and adjacent
// pairs are merged by lowest merge rank until none applies. Unknown symbols map to
// byte_fallback tokens when the model has byte_fallback, else to unk_token when it has one,
// else encoding fails with an error naming the character (the order of HF tokenizers).
#ifndef MARLAAS_TOKENIZER_H
#define MARLAAS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "common/util/util.h"

typedef struct tokenizer tokenizer_t;

tokenizer_t *tokenizer_load(const char *path, char *err);
tokenizer_t *tokenizer_parse(const char *json, size_t len, char *err);
// Builds a tokenizer from an explicit vocabulary (strings, id = index), merges ("a b" =
// merge a with b; rank = index) and special tokens (appended after the vocab as added tokens,
// special=true). Strings are copied. Used by the pretraining tool to make its own models.
tokenizer_t *tokenizer_build(const char *const *vocab, int n_vocab, const char *const *merges, int n_merges,
                             const char *const *specials, int n_specials, char *err);
void tokenizer_destroy(tokenizer_t **t);
// Writes tokenizer.json that tokenizer_load (and HF tokenizers) read back to the same tokenizer.
int tokenizer_save(const tokenizer_t *t, const char *path, char *err);

// Encodes len bytes of text. *ids is a new array owned by the caller (free()).
// Returns the number of ids (>= 0) or -1 with err.
int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int32_t **ids, char *err);
// Decodes ids to a new NUL-terminated string (caller frees). Ids out of range are an error
// (NULL + err). With skip_special, special added tokens are left out.
char *tokenizer_decode(const tokenizer_t *t, const int32_t *ids, int n, bool skip_special, char *err);
// The text of one token (as it decodes), or NULL when out of range. Owned by the tokenizer.
const char *tokenizer_token_text(const tokenizer_t *t, int32_t id);
int tokenizer_vocab_size(const tokenizer_t *t);       // largest id + 1, added tokens included
int32_t tokenizer_token_id(const tokenizer_t *t, const char *token);  // -1 if absent
bool tokenizer_is_special(const tokenizer_t *t, int32_t id);

#endif

// tok_decode.h - the decoders of tokenizer.json: ByteLevel, Replace, ByteFallback, Fuse,
// Strip, Metaspace and Sequence of them, with the Rust library's semantics: each works on the
// list of token strings and hands a list to the next; the result is the list joined.
#ifndef MARLAAS_TOK_DECODE_H
#define MARLAAS_TOK_DECODE_H

#include "common/formats/tok_text.h"

typedef struct tok_decoder tok_decoder_t;

// Parses the decoder object j found at `where`; refuses an unknown type or key.
tok_decoder_t *tok_decoder_parse(const cJSON *j, const char *where, int depth, char *err);
void tok_decoder_destroy(tok_decoder_t **d);
// Runs the chain over the tokens (pieces of arena; the list is consumed) and appends the
// joined text to out. New token text is appended to arena.
int tok_decoder_run(const tok_decoder_t *d, tok_buf_t *arena, tok_pieces_t *toks, tok_buf_t *out, tok_work_t *w,
                    char *err);
// Appends to out the bytes one token stands for in the middle of a decoded text: the chain's
// per-token rewriting (byte-level characters to bytes, "<0xNN>" to the byte, Replace,
// Metaspace's replacement to a space) without what only the whole text gets (Strip, the
// Metaspace rule for the first token, replacing ill-formed UTF-8). May be part of a character.
int tok_decoder_token(const tok_decoder_t *d, const char *s, size_t n, tok_buf_t *out, tok_work_t *w, char *err);

#endif

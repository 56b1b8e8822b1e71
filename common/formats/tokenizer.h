// tokenizer.h - Hugging Face `tokenizer.json` with a BPE model: encode text to ids, decode
// ids to text, the way the Rust `tokenizers` library does.
//
// Encoding, stage by stage (tokenizer.c drives them):
//   1. added tokens with normalized=false are cut out of the raw text (leftmost, longest;
//      single_word, lstrip, rstrip honoured);
//   2. each remaining piece is normalized (tok_norm.h: NFC, NFD, NFKC, NFKD, Lowercase, Strip,
//      Prepend, Replace, Sequence), then added tokens with normalized=true are cut out of it;
//   3. the pre-tokenizer splits each piece into words (tok_pretok.h: ByteLevel, Split,
//      Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence);
//   4. BPE encodes each word: its characters (with continuing_subword_prefix /
//      end_of_word_suffix), unknown ones as "<0xNN>" byte tokens (byte_fallback) or unk_token
//      (fuse_unk), then merges by lowest rank; ignore_merges takes a word that is itself a
//      token as it is;
//   5. with special tokens asked for, the post-processor (TemplateProcessing, ByteLevel,
//      Sequence) adds its tokens, e.g. Llama's <s>.
// Decoding maps ids to token strings and runs the decoders (tok_decode.h: ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace, Sequence); with no decoder the tokens are joined with
// spaces, as in the Rust library. The Python library's clean_up_tokenization_spaces is not
// applied.
//
// Anything else in the file (another model such as WordPiece or Unigram, another component,
// dropout, truncation, padding, an unknown key) is refused with its name and its place in the
// file. Text to encode must be well-formed UTF-8 (the Rust library takes only Rust strings);
// other input is refused with the offset of the first bad byte. A character that is not in
// the vocabulary, with neither byte_fallback nor unk_token to stand for it, is an error here
// (the Rust library drops it silently).
//
// A tokenizer is read-only once made, so several threads may encode and decode with it at
// once (its cache of encoded words takes a lock).
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
// Writes tokenizer.json that tokenizer_load (and HF tokenizers) read back to the same tokenizer;
// the normalizer, pre-tokenizer, post-processor and decoder of a loaded file are written back
// as they were.
int tokenizer_save(const tokenizer_t *t, const char *path, char *err);

// Encodes len bytes of text without adding special tokens (what a prompt rendered by a chat
// template needs: the template writes them). *ids is a new array owned by the caller (free()).
// Returns the number of ids (>= 0) or -1 with err.
int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int32_t **ids, char *err);
// The same; with add_special_tokens the post-processor adds its tokens as Hugging Face's
// encode(text) does by default (Llama: <s> first; Qwen: nothing).
int tokenizer_encode_special(const tokenizer_t *t, const char *text, size_t len, bool add_special_tokens,
                             int32_t **ids, char *err);
// Decodes ids through the decoders to a new NUL-terminated string (caller frees), always
// well-formed UTF-8 (ill-formed bytes become U+FFFD, as in the Rust library). Ids out of range
// are an error (NULL + err). With skip_special, added tokens marked special are left out.
char *tokenizer_decode(const tokenizer_t *t, const int32_t *ids, int n, bool skip_special, char *err);
// The bytes one token stands for in the middle of a decoded text: byte-level characters mapped
// back to their bytes, "<0xNN>" byte-fallback tokens as that byte, Metaspace's and Replace's
// replacement character as a space, special tokens as their text. It may be part of a UTF-8
// character (a byte-level or byte-fallback token often is). Concatenated over a sequence it
// gives what tokenizer_decode gives without its rules for the start of the text (a Strip
// decoder, Metaspace's first token) and before ill-formed UTF-8 is replaced: the pieces to
// assemble incremental output and match stop strings with. NUL-terminated (a token for byte 0
// reads as ""); NULL when id is out of range or unused. Owned by the tokenizer.
const char *tokenizer_token_text(const tokenizer_t *t, int32_t id);
// The same with its length (counts a 0 byte).
const char *tokenizer_token_bytes(const tokenizer_t *t, int32_t id, size_t *len);
int tokenizer_vocab_size(const tokenizer_t *t);       // largest id + 1, added tokens included
// The id of a token given as it is written in tokenizer.json (vocab or added token, e.g.
// "<|im_end|>", "</s>"), or -1 if absent.
int32_t tokenizer_token_id(const tokenizer_t *t, const char *token);
bool tokenizer_is_special(const tokenizer_t *t, int32_t id);
// The first token the post-processor puts before / after the text when special tokens are
// added (Llama: bos = <s>, no eos), or -1 when it adds none there.
int32_t tokenizer_bos_id(const tokenizer_t *t);
int32_t tokenizer_eos_id(const tokenizer_t *t);

#endif

// test_tok_pipeline.c - the tokenizer's stages one by one (normalizers, pre-tokenizers with
// every split behavior, decoders, patterns) and the model options of tokenizer.json end to
// end. Expected values are worked out by hand from the Rust tokenizers library's code (its
// own unit tests where they exist: Metaspace, Digits, Whitespace, ByteLevel).
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/tok_decode.h"
#include "common/formats/tok_norm.h"
#include "common/formats/tok_pretok.h"
#include "common/formats/tokenizer.h"

// ---------------------------------------------------------------------------------------
// Helpers

static cJSON *json(const char *s) {
    cJSON *j = cJSON_Parse(s);
    cr_assert_not_null(j, "test JSON does not parse: %s", s);
    return j;
}

static void expect_norm(const char *spec, const char *in, const char *want) {
    char err[ERR_LEN] = "";
    cJSON *j = json(spec);
    tok_norm_t *n = tok_norm_parse(j, "normalizer", 0, err);
    cr_assert_not_null(n, "%s: %s", spec, err);
    tok_buf_t out = {0};
    tok_work_t w = {0};
    cr_assert_eq(tok_norm_apply(n, in, strlen(in), &out, &w, err), 0, "%s", err);
    tok_buf_addc(&out, 0);
    cr_assert_str_eq(out.p, want, "%s on '%s'", spec, in);
    tok_buf_free(&out);
    tok_work_free(&w);
    tok_norm_destroy(&n);
    cJSON_Delete(j);
}

// Pre-tokenizes `in` (one piece, at the start of the text unless not_first) and compares the
// pieces with want, a list separated by '|'.
static void expect_pretok_at(const char *spec, const char *in, bool at_start, const char *want) {
    char err[ERR_LEN] = "";
    cJSON *j = json(spec);
    tok_pretok_t *p = tok_pretok_parse(j, "pre_tokenizer", 0, err);
    cr_assert_not_null(p, "%s: %s", spec, err);
    tok_buf_t arena = {0}, got = {0};
    tok_pieces_t pieces = {0};
    tok_work_t w = {0};
    tok_buf_add(&arena, in, strlen(in));
    tok_pieces_push(&pieces, 0, strlen(in), at_start);
    cr_assert_eq(tok_pretok_apply(p, &arena, &pieces, &w, err), 0, "%s", err);
    for (size_t i = 0; i < pieces.n; i++) {
        if (i) tok_buf_addc(&got, '|');
        tok_buf_add(&got, arena.p + pieces.v[i].off, pieces.v[i].len);
    }
    tok_buf_addc(&got, 0);
    cr_assert_str_eq(got.p, want, "%s on '%s'", spec, in);
    tok_buf_free(&arena);
    tok_buf_free(&got);
    tok_pieces_free(&pieces);
    tok_work_free(&w);
    tok_pretok_destroy(&p);
    cJSON_Delete(j);
}

static void expect_pretok(const char *spec, const char *in, const char *want) {
    expect_pretok_at(spec, in, true, want);
}

// Decodes the tokens of `in` (separated by '|') and compares with want.
static void expect_decode(const char *spec, const char *in, const char *want) {
    char err[ERR_LEN] = "";
    cJSON *j = json(spec);
    tok_decoder_t *d = tok_decoder_parse(j, "decoder", 0, err);
    cr_assert_not_null(d, "%s: %s", spec, err);
    tok_buf_t arena = {0}, out = {0};
    tok_pieces_t toks = {0};
    tok_work_t w = {0};
    for (const char *s = in;;) {
        const char *bar = strchr(s, '|');
        size_t n = bar ? (size_t)(bar - s) : strlen(s);
        tok_pieces_push(&toks, arena.n, n, false);
        tok_buf_add(&arena, s, n);
        if (!bar) break;
        s = bar + 1;
    }
    cr_assert_eq(tok_decoder_run(d, &arena, &toks, &out, &w, err), 0, "%s", err);
    tok_buf_addc(&out, 0);
    cr_assert_str_eq(out.p, want, "%s on '%s'", spec, in);
    tok_buf_free(&arena);
    tok_buf_free(&out);
    tok_pieces_free(&toks);
    tok_work_free(&w);
    tok_decoder_destroy(&d);
    cJSON_Delete(j);
}

static void expect_refused(const char *what, const char *spec, const char *want,
                           void *(*parse)(const cJSON *, const char *, int, char *)) {
    char err[ERR_LEN] = "";
    cJSON *j = json(spec);
    void *p = parse(j, what, 0, err);
    cr_assert_null(p, "%s should be refused: %s", what, spec);
    cr_assert(strstr(err, want), "error '%s' does not mention '%s'", err, want);
    cJSON_Delete(j);
}

static void *parse_norm(const cJSON *j, const char *w, int d, char *err) {
    return tok_norm_parse(j, w, d, err);
}
static void *parse_pretok(const cJSON *j, const char *w, int d, char *err) {
    return tok_pretok_parse(j, w, d, err);
}
static void *parse_decoder(const cJSON *j, const char *w, int d, char *err) {
    return tok_decoder_parse(j, w, d, err);
}

static tokenizer_t *parse_ok(const char *s) {
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_parse(s, strlen(s), err);
    cr_assert_not_null(t, "parse failed: %s\n%s", err, s);
    return t;
}

static void expect_ids_opt(const tokenizer_t *t, const char *text, bool special, const int32_t *want, int n_want) {
    char err[ERR_LEN] = "", got_s[512] = "", want_s[512] = "";
    int32_t *ids = NULL;
    int n = tokenizer_encode_special(t, text, strlen(text), special, &ids, err);
    cr_assert_geq(n, 0, "encode '%s' failed: %s", text, err);
    size_t o = 0;
    for (int i = 0; i < n && o + 16 < sizeof got_s; i++) o += (size_t)snprintf(got_s + o, sizeof got_s - o, "%d,", ids[i]);
    o = 0;
    for (int i = 0; i < n_want && o + 16 < sizeof want_s; i++)
        o += (size_t)snprintf(want_s + o, sizeof want_s - o, "%d,", want[i]);
    cr_assert(n == n_want && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0),
              "encode '%s': got [%s], want [%s]", text, got_s, want_s);
    free(ids);
}

static void expect_ids(const tokenizer_t *t, const char *text, const int32_t *want, int n_want) {
    expect_ids_opt(t, text, false, want, n_want);
}

static void expect_text(const tokenizer_t *t, const int32_t *ids, int n, bool skip, const char *want) {
    char err[ERR_LEN] = "";
    char *s = tokenizer_decode(t, ids, n, skip, err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_str_eq(s, want);
    free(s);
}

// ---------------------------------------------------------------------------------------
// Normalizers

Test(tok_pipeline, normalizers) {
    // "é" decomposed (e + U+0301) and composed; "ﬁ" (U+FB01) has a compatibility decomposition.
    expect_norm("{\"type\":\"NFC\"}", "cafe\xcc\x81", "caf\xc3\xa9");
    expect_norm("{\"type\":\"NFD\"}", "caf\xc3\xa9", "cafe\xcc\x81");
    expect_norm("{\"type\":\"NFKC\"}", "\xef\xac\x81x\xe2\x91\xa0", "fix1");    // ﬁx① -> fix1
    expect_norm("{\"type\":\"NFKD\"}", "\xef\xac\x81\xc3\xa9", "fie\xcc\x81");
    expect_norm("{\"type\":\"NFC\"}", "plain ascii", "plain ascii");
    // Lowercase per character: Σ always σ (no final-sigma rule), İ -> i + U+0307.
    expect_norm("{\"type\":\"Lowercase\"}", "HeLLo \xce\xa3\xce\xa3 \xc4\xb0", "hello \xcf\x83\xcf\x83 i\xcc\x87");
    expect_norm("{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":false}", " \t\xc2\x85 x  ", "x  ");
    expect_norm("{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true}", "\xe3\x80\x80x y\n", "x y");
    expect_norm("{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"}", "hi", "\xe2\x96\x81hi");
    expect_norm("{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"}", "", "");  // not on empty text
    expect_norm("{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}", "a b  c",
                "a\xe2\x96\x81" "b\xe2\x96\x81\xe2\x96\x81" "c");
    expect_norm("{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"content\":\"_\"}", "a \t b\xc2\x85" "c",
                "a_b_c");
    // The Llama-2 normalizer.
    expect_norm("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
                "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]}",
                "Hi you", "\xe2\x96\x81Hi\xe2\x96\x81you");
    expect_norm("{\"type\":\"Sequence\",\"normalizers\":[]}", "same", "same");
    expect_norm("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},{\"type\":\"Lowercase\"},"
                "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}]}",
                "\xc3\x89T\xc3\x89", "\xc3\xa9t\xc3\xa9");
}

Test(tok_pipeline, normalizer_refusals) {
    expect_refused("normalizer", "{\"type\":\"BertNormalizer\"}", "normalizer BertNormalizer is not supported",
                   parse_norm);
    expect_refused("normalizer", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Precompiled\"}]}",
                   "normalizer.normalizers[1]: normalizer Precompiled", parse_norm);
    expect_refused("normalizer", "{\"type\":\"NFC\",\"form\":1}", "unknown key \"form\"", parse_norm);
    expect_refused("normalizer", "{\"type\":\"Strip\",\"strip_left\":1}", "strip_left must be true or false",
                   parse_norm);
    expect_refused("normalizer", "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"(\"},\"content\":\"\"}",
                   "normalizer.pattern: regex does not compile", parse_norm);
    expect_refused("normalizer", "{\"type\":\"Replace\",\"pattern\":{\"Glob\":\"*\"},\"content\":\"\"}",
                   "normalizer.pattern must be", parse_norm);
    expect_refused("normalizer", "{\"type\":\"Prepend\"}", "needs \"prepend\"", parse_norm);
    expect_refused("normalizer", "{\"type\":7}", "must be null or an object", parse_norm);
    // Nested beyond the limit.
    char deep[2048] = "";
    for (int i = 0; i < 12; i++) strcat(deep, "{\"type\":\"Sequence\",\"normalizers\":[");
    strcat(deep, "{\"type\":\"NFC\"}");
    for (int i = 0; i < 12; i++) strcat(deep, "]}");
    expect_refused("normalizer", deep, "nested more than", parse_norm);
}

// ---------------------------------------------------------------------------------------
// Pre-tokenizers

#define SPLIT(behavior, invert) \
    "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"" behavior "\",\"invert\":" invert "}"

Test(tok_pipeline, split_behaviors) {
    // "a  b": the matches are the two spaces, each its own match.
    expect_pretok(SPLIT("Isolated", "false"), "a  b", "a| | |b");
    expect_pretok(SPLIT("Removed", "false"), "a  b", "a|b");
    expect_pretok(SPLIT("Contiguous", "false"), "a  b", "a|  |b");
    // Only a match that follows a non-match joins it; the second space stays alone.
    expect_pretok(SPLIT("MergedWithPrevious", "false"), "a  b", "a | |b");
    expect_pretok(SPLIT("MergedWithNext", "false"), "a  b", "a| | b");
    expect_pretok(SPLIT("MergedWithPrevious", "false"), "How are you", "How |are |you");
    expect_pretok(SPLIT("MergedWithNext", "false"), "How are you", "How| are| you");
    expect_pretok(SPLIT("MergedWithNext", "false"), " x ", " x| ");
    // invert: the pattern marks what is kept.
    expect_pretok(SPLIT("Removed", "true"), "a  b", " | ");
    expect_pretok(SPLIT("MergedWithPrevious", "true"), "ab cd", "ab| cd");
    expect_pretok(SPLIT("Contiguous", "true"), "a  b", "a|  |b");
    expect_pretok(SPLIT("Isolated", "false"), "", "");
    // Regex patterns in Oniguruma syntax: \s is White_Space (U+0085 included), \p{..} classes,
    // (?i:) groups, lookahead.
    expect_pretok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Removed\",\"invert\":false}",
                  "a\xc2\x85" "b \t c", "a|b|c");
    expect_pretok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'ll)|\\\\p{L}+|\\\\p{N}\"},"
                  "\"behavior\":\"Isolated\",\"invert\":false}",
                  "IT'S we'LL 42", "IT|'S| |we|'LL| |4|2");
    expect_pretok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
                  "\"invert\":false}",
                  "a   b", "a|  | |b");
    expect_pretok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false}",
                  "d\xc3\xa9j\xc3\xa0-vu", "d\xc3\xa9j\xc3\xa0|-|vu");
    expect_pretok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\u00e9\"},\"behavior\":\"Removed\",\"invert\":false}",
                  "x\xc3\xa9y", "x|y");
}

Test(tok_pipeline, other_pre_tokenizers) {
    // From the Rust library's tests.
    expect_pretok("{\"type\":\"Digits\",\"individual_digits\":true}", "Call 123 please", "Call |1|2|3| please");
    expect_pretok("{\"type\":\"Digits\",\"individual_digits\":false}", "Call 123 please", "Call |123| please");
    expect_pretok("{\"type\":\"Whitespace\"}", "How are you doing?", "How|are|you|doing|?");
    expect_pretok("{\"type\":\"Whitespace\"}", "Hey man!", "Hey|man|!");
    expect_pretok("{\"type\":\"WhitespaceSplit\"}", "Hey man!", "Hey|man!");
    expect_pretok("{\"type\":\"WhitespaceSplit\"}", "  a\t\nb\xe3\x80\x80" "c ", "a|b|c");
    expect_pretok("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}",
                  "Hello my friend, how is your day going?",
                  "\xc4\xa0Hello|\xc4\xa0my|\xc4\xa0" "friend|,|\xc4\xa0how|\xc4\xa0is|\xc4\xa0your|\xc4\xa0" "day|"
                  "\xc4\xa0going|?");
    // Without the regex one piece; every byte becomes its character (\n is Ċ, é is Ã©).
    expect_pretok("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}", "a\n\xc3\xa9",
                  "a\xc4\x8a\xc3\x83\xc2\xa9");
    // Metaspace, from the Rust library's tests.
    const char *ms = "{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"always\",\"split\":true}";
    expect_pretok(ms, "Hey friend!", "\xe2\x96\x81Hey|\xe2\x96\x81" "friend!");
    expect_pretok(ms, "Hey   friend!", "\xe2\x96\x81Hey|\xe2\x96\x81|\xe2\x96\x81|\xe2\x96\x81" "friend!");
    const char *first = "{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"first\","
                        "\"split\":false}";
    expect_pretok_at(first, "Hey you", true, "\xe2\x96\x81Hey\xe2\x96\x81you");
    expect_pretok_at(first, "how", false, "how");
    expect_pretok_at("{\"type\":\"Metaspace\",\"replacement\":\"_\",\"add_prefix_space\":false}", "a b", true, "a|_b");
    // A Sequence applies each in turn to every piece.
    expect_pretok("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"},"
                  "{\"type\":\"Digits\",\"individual_digits\":true}]}",
                  "ab12 c3", "ab|1|2|c|3");
}

Test(tok_pipeline, pre_tokenizer_refusals) {
    expect_refused("pre_tokenizer", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Whitespace\"},"
                   "{\"type\":\"Punctuation\"}]}",
                   "pre_tokenizer.pretokenizers[1]: pre-tokenizer Punctuation is not supported", parse_pretok);
    expect_refused("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Sideways\"}",
                   "behavior Sideways", parse_pretok);
    expect_refused("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-z&&[^aeiou]]\"},"
                   "\"behavior\":\"Isolated\"}",
                   "intersection", parse_pretok);
    expect_refused("pre_tokenizer", "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[\\\\W]\"},\"behavior\":\"Isolated\"}",
                   "inside a character class", parse_pretok);
    expect_refused("pre_tokenizer", "{\"type\":\"Metaspace\",\"replacement\":\"ab\"}", "a single character",
                   parse_pretok);
    expect_refused("pre_tokenizer", "{\"type\":\"Metaspace\",\"replacement\":\"_\",\"add_prefix_space\":false,"
                   "\"prepend_scheme\":\"always\"}",
                   "contradicts", parse_pretok);
    expect_refused("pre_tokenizer", "{\"type\":\"ByteLevel\",\"offsets\":true}", "unknown key \"offsets\"",
                   parse_pretok);
}

// ---------------------------------------------------------------------------------------
// Decoders

Test(tok_pipeline, decoders) {
    expect_decode("{\"type\":\"ByteLevel\"}", "Hello|\xc4\xa0my|\xc4\xa0" "friend|,", "Hello my friend,");
    // Bytes that do not form UTF-8 become U+FFFD, one per maximal ill-formed part.
    // æ Ĳ a are the bytes E6 90 61: E6 90 starts a character that never ends.
    expect_decode("{\"type\":\"ByteLevel\"}", "\xc3\xa6|\xc4\xb2|a", "\xef\xbf\xbd" "a");
    expect_decode("{\"type\":\"ByteLevel\"}", "\xc3\xa5|\xc4\xb1|\xc2\xab", "\xe5\x8f\xab");  // E5 8F AB
    expect_decode("{\"type\":\"ByteFallback\"}", "<0x61>|b", "ab");
    expect_decode("{\"type\":\"ByteFallback\"}", "<0xE5>|<0x8F>|<0xAB>|a", "\xe5\x8f\xab" "a");
    expect_decode("{\"type\":\"ByteFallback\"}", "<0xE5>|<0x8F>|a", "\xef\xbf\xbd\xef\xbf\xbd" "a");
    expect_decode("{\"type\":\"ByteFallback\"}", "<0xZZ>|<0x6>", "<0xZZ><0x6>");
    expect_decode("{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"always\"}",
                  "\xe2\x96\x81Hey|\xe2\x96\x81" "friend!", "Hey friend!");
    expect_decode("{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"never\"}",
                  "\xe2\x96\x81Hey|\xe2\x96\x81" "friend!", " Hey friend!");
    // The first token loses every replacement character, as in the Rust library.
    expect_decode("{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\"}", "\xe2\x96\x81\xe2\x96\x81x|y", "xy");
    expect_decode("{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}", "  a| b", " ab");
    expect_decode("{\"type\":\"Strip\",\"content\":\"x\",\"start\":0,\"stop\":2}", "axxx|x", "ax");
    expect_decode("{\"type\":\"Strip\",\"content\":\" \",\"start\":5,\"stop\":5}", "  ", "");
    // The Llama-2 decoder.
    expect_decode("{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xe2\x96\x81\"},"
                  "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
                  "\"start\":1,\"stop\":0}]}",
                  "\xe2\x96\x81Hi|\xe2\x96\x81|<0xE2>|<0x9C>|<0x93>|\xe2\x96\x81\xe2\x96\x81" "x",
                  "Hi \xe2\x9c\x93  x");
    expect_decode("{\"type\":\"Fuse\"}", "a|b|", "ab");
}

Test(tok_pipeline, decoder_refusals) {
    expect_refused("decoder", "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"WordPiece\"}]}",
                   "decoder.decoders[1]: decoder WordPiece is not supported", parse_decoder);
    expect_refused("decoder", "{\"type\":\"Strip\",\"content\":\"  \",\"start\":1,\"stop\":0}", "a single character",
                   parse_decoder);
    expect_refused("decoder", "{\"type\":\"Strip\",\"content\":\" \",\"start\":-1,\"stop\":0}", "start must be",
                   parse_decoder);
    expect_refused("decoder", "{\"type\":\"Replace\",\"pattern\":{\"String\":\"x\"}}", "needs a string \"content\"",
                   parse_decoder);
}

// ---------------------------------------------------------------------------------------
// Whole tokenizers

// A byte-level tokenizer (Qwen's layout): a vocabulary holding the 256 byte characters plus
// "Ġh", "Ġhi", "hi", "ĠĠ"; a Split + ByteLevel pre-tokenizer; NFC; ByteLevel decoder.
static char *bytelevel_json(const char *post, const char *extra_added) {
    tok_buf_t b = {0};
    char tmp[256];
    const char *head = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
                       "{\"id\":260,\"content\":\"<|end|>\",\"special\":true,\"normalized\":false}%s],"
                       "\"normalizer\":{\"type\":\"NFC\"},"
                       "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                       "{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
                       "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
                       "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
                       "\"post_processor\":%s,\"decoder\":{\"type\":\"ByteLevel\"},"
                       "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","
                       "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
                       "\"vocab\":{";
    size_t need = strlen(head) + strlen(post) + strlen(extra_added) + 1;
    char *h = malloc(need);
    snprintf(h, need, head, extra_added, post);
    tok_buf_add(&b, h, strlen(h));
    free(h);
    for (int i = 0; i < 256; i++) {
        tok_buf_t c = {0};
        tok_buf_add_cp(&c, tok_byte_cp[i]);
        tok_buf_addc(&c, 0);
        const char *esc = tok_byte_cp[i] == '"' ? "\\\"" : tok_byte_cp[i] == '\\' ? "\\\\" : c.p;
        snprintf(tmp, sizeof tmp, "\"%s\":%d,", esc, i);
        tok_buf_add(&b, tmp, strlen(tmp));
        tok_buf_free(&c);
    }
    const char *tail = "\"\xc4\xa0h\":256,\"hi\":257,\"\xc4\xa0hi\":258,\"\xc4\xa0\xc4\xa0\":259},"
                       "\"merges\":[[\"\xc4\xa0\",\"h\"],[\"h\",\"i\"],[\"\xc4\xa0h\",\"i\"],[\"\xc4\xa0\",\"\xc4\xa0\"]]}}";
    tok_buf_add(&b, tail, strlen(tail) + 1);
    return b.p;
}

Test(tok_pipeline, bytelevel_tokenizer) {
    char *j = bytelevel_json("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
                             "\"use_regex\":false}", "");
    tokenizer_t *t = parse_ok(j);
    free(j);
    // " hi hi" -> Ġhi Ġhi; "hi" alone -> hi; "  hi": "Ġ" (the \s+(?!\S) piece) then "Ġhi".
    expect_ids(t, " hi hi", (int32_t[]){258, 258}, 2);
    expect_ids(t, "hi", (int32_t[]){257}, 1);
    expect_ids(t, "  hi", (int32_t[]){' ', 258}, 2);  // id = byte for the byte characters
    expect_ids(t, "x<|end|>hi", (int32_t[]){'x', 260, 257}, 3);
    // é as two bytes C3 A9 (ids 0xC3, 0xA9); decomposed e + U+0301 is composed by NFC first.
    expect_ids(t, "\xc3\xa9", (int32_t[]){0xC3, 0xA9}, 2);
    expect_ids(t, "e\xcc\x81", (int32_t[]){0xC3, 0xA9}, 2);
    // No post-processor tokens for ByteLevel.
    expect_ids_opt(t, "hi", true, (int32_t[]){257}, 1);
    cr_assert_eq(tokenizer_bos_id(t), -1);
    // Decoding maps the characters back to bytes.
    expect_text(t, (int32_t[]){258, 32, 0xC3, 0xA9, 260}, 5, false, " hi \xc3\xa9<|end|>");
    expect_text(t, (int32_t[]){258, 260}, 2, true, " hi");
    expect_text(t, (int32_t[]){0xC3}, 1, false, "\xef\xbf\xbd");  // half a character
    size_t n;
    cr_assert_str_eq(tokenizer_token_text(t, 258), " hi");
    const char *b = tokenizer_token_bytes(t, 0xC3, &n);
    cr_assert(n == 1 && (uint8_t)b[0] == 0xC3);
    b = tokenizer_token_bytes(t, 0, &n);  // byte 0 is the character Ā
    cr_assert(n == 1 && b[0] == 0);
    cr_assert_str_eq(tokenizer_token_text(t, 260), "<|end|>");
    // Text that is not UTF-8 is refused with the offset.
    char err[ERR_LEN] = "";
    int32_t *ids = NULL;
    cr_assert_eq(tokenizer_encode(t, "ab\xff", 3, &ids, err), -1);
    cr_assert(strstr(err, "offset 2"), "%s", err);
    tokenizer_destroy(&t);
}

// Llama-2 style: Prepend + Replace normalizer, no pre-tokenizer, byte_fallback, template.
static const char *LLAMA_JSON =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
    "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},"
    "\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],"
    "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]},"
    "\"</s>\":{\"id\":\"</s>\",\"ids\":[2],\"tokens\":[\"</s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xe2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
    "\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xE2>\":3,\"<0x9C>\":4,\"<0x93>\":5,\"\xe2\x96\x81\":6,\"h\":7,"
    "\"i\":8,\"\xe2\x96\x81h\":9,\"\xe2\x96\x81hi\":10},\"merges\":[\"\xe2\x96\x81 h\",\"\xe2\x96\x81h i\"]}}";

Test(tok_pipeline, llama_style_tokenizer) {
    tokenizer_t *t = parse_ok(LLAMA_JSON);
    expect_ids(t, "hi hi", (int32_t[]){10, 10}, 2);
    expect_ids_opt(t, "hi hi", true, (int32_t[]){1, 10, 10, 2}, 4);
    cr_assert_eq(tokenizer_bos_id(t), 1);
    cr_assert_eq(tokenizer_eos_id(t), 2);
    // ✓ (E2 9C 93) is not in the vocab: its bytes.
    expect_ids(t, "\xe2\x9c\x93", (int32_t[]){6, 3, 4, 5}, 4);
    // An added token cuts the text; each side is normalized (so gets its own ▁).
    expect_ids(t, "hi</s>hi", (int32_t[]){10, 2, 10}, 3);
    expect_ids(t, "", NULL, 0);
    expect_ids_opt(t, "", true, (int32_t[]){1, 2}, 2);
    expect_text(t, (int32_t[]){1, 10, 10, 6, 3, 4, 5, 2}, 8, false, "<s> hi hi \xe2\x9c\x93</s>");
    expect_text(t, (int32_t[]){1, 10, 10, 6, 3, 4, 5, 2}, 8, true, "hi hi \xe2\x9c\x93");
    cr_assert_str_eq(tokenizer_token_text(t, 10), " hi");  // the Strip applies to a whole text only
    cr_assert_str_eq(tokenizer_token_text(t, 3), "\xe2");
    tokenizer_destroy(&t);
}

Test(tok_pipeline, model_options) {
    // continuing_subword_prefix "##" and end_of_word_suffix "</w>": "abc" starts as a, ##b,
    // ##c</w>; "a ##b" merges to "ab" (b without its prefix), then "ab ##c</w>" to "abc</w>".
    const char *j = "{\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\",\"end_of_word_suffix\":\"</w>\","
                    "\"vocab\":{\"a\":0,\"##b\":1,\"##c</w>\":2,\"ab\":3,\"abc</w>\":4,\"a</w>\":5,\"##b</w>\":6},"
                    "\"merges\":[\"a ##b\",\"ab ##c</w>\"]}}";
    tokenizer_t *t = parse_ok(j);
    expect_ids(t, "abc", (int32_t[]){4}, 1);
    expect_ids(t, "a", (int32_t[]){5}, 1);
    expect_ids(t, "ab", (int32_t[]){0, 6}, 2);  // "a ##b</w>" is no merge
    tokenizer_destroy(&t);

    // ignore_merges: a word that is a token is taken whole, even without a merge path.
    j = "{\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"abc\":3,\"ab\":4},"
        "\"merges\":[\"a b\"]}}";
    t = parse_ok(j);
    expect_ids(t, "abc", (int32_t[]){3}, 1);
    tokenizer_destroy(&t);
    j = "{\"model\":{\"type\":\"BPE\",\"ignore_merges\":false,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"abc\":3,\"ab\":4},"
        "\"merges\":[\"a b\"]}}";
    t = parse_ok(j);
    expect_ids(t, "abc", (int32_t[]){4, 2}, 2);
    tokenizer_destroy(&t);

    // fuse_unk joins unknown characters within a word; byte_fallback takes bytes first.
    j = "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":{\"<unk>\":0,\"a\":1},"
        "\"merges\":[]}}";
    t = parse_ok(j);
    expect_ids(t, "xya\xc3\xa9\xc3\xa9", (int32_t[]){0, 1, 0}, 3);
    tokenizer_destroy(&t);
    // A character whose bytes are not all tokens falls to unk.
    j = "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"a\":1,"
        "\"<0xC3>\":2,\"<0xA9>\":3},\"merges\":[]}}";
    t = parse_ok(j);
    expect_ids(t, "a\xc3\xa9\xc3\xa8", (int32_t[]){1, 2, 3, 0}, 4);
    tokenizer_destroy(&t);
}

Test(tok_pipeline, added_token_options) {
    // A Lowercase normalizer: normalized=true tokens match the lowercased text; normalized=false
    // the raw text. single_word needs non-word characters (or the ends) around the token.
    const char *j =
        "{\"added_tokens\":["
        "{\"id\":10,\"content\":\"hello\",\"normalized\":true,\"special\":false},"
        "{\"id\":11,\"content\":\"CAT\",\"normalized\":false,\"special\":false,\"single_word\":true},"
        "{\"id\":12,\"content\":\"<L>\",\"normalized\":false,\"special\":true,\"lstrip\":true},"
        "{\"id\":13,\"content\":\"<R>\",\"normalized\":false,\"special\":true,\"rstrip\":true}],"
        "\"normalizer\":{\"type\":\"Lowercase\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"h\":0,\"e\":1,\"l\":2,\"o\":3,\"c\":4,\"a\":5,\"t\":6,\" \":7,"
        "\"x\":8,\"\\t\":9},\"merges\":[]}}";
    tokenizer_t *t = parse_ok(j);
    expect_ids(t, "HeLLo", (int32_t[]){10}, 1);
    expect_ids(t, "CAT", (int32_t[]){11}, 1);
    expect_ids(t, "x CAT x", (int32_t[]){8, 7, 11, 7, 8}, 5);
    expect_ids(t, "xCAT", (int32_t[]){8, 4, 5, 6}, 4);  // not a single word: lowercased text
    expect_ids(t, "CATx", (int32_t[]){4, 5, 6, 8}, 4);
    expect_ids(t, "x \t<L>x", (int32_t[]){8, 12, 8}, 3);
    expect_ids(t, "x<R> \tx", (int32_t[]){8, 13, 8}, 3);
    expect_ids(t, "<R> <L>", (int32_t[]){13, 12}, 2);
    tokenizer_destroy(&t);
}

Test(tok_pipeline, template_processing_sequence) {
    // A Sequence of ByteLevel and a template adding an id twice before and one after.
    const char *j = "{\"added_tokens\":[{\"id\":2,\"content\":\"[B]\",\"special\":true},"
                    "{\"id\":3,\"content\":\"[E]\",\"special\":true}],"
                    "\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\","
                    "\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},{\"type\":\"TemplateProcessing\","
                    "\"single\":[{\"SpecialToken\":{\"id\":\"[B]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
                    "{\"SpecialToken\":{\"id\":\"[E]\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{"
                    "\"[B]\":{\"id\":\"[B]\",\"ids\":[2,2],\"tokens\":[\"[B]\",\"[B]\"]},"
                    "\"[E]\":{\"id\":\"[E]\",\"ids\":[3],\"tokens\":[\"[E]\"]}}}]},"
                    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}";
    tokenizer_t *t = parse_ok(j);
    expect_ids_opt(t, "ab", true, (int32_t[]){2, 2, 0, 1, 3}, 5);
    expect_ids_opt(t, "ab", false, (int32_t[]){0, 1}, 2);
    cr_assert_eq(tokenizer_bos_id(t), 2);
    cr_assert_eq(tokenizer_eos_id(t), 3);
    // No decoder: tokens joined with spaces, as the Rust library does.
    expect_text(t, (int32_t[]){2, 0, 1, 3}, 4, false, "[B] a b [E]");
    tokenizer_destroy(&t);
}

Test(tok_pipeline, file_refusals) {
    struct {
        const char *json, *want;
    } cases[] = {
        {"{\"truncation\":{\"max_length\":8},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "truncation is not supported"},
        {"{\"padding\":{},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "padding is not supported"},
        {"{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{\"a\":0},\"merges\":[]}}", "dropout"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "model type Unigram is not supported"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"cache_capacity\":5}}",
         "unknown key \"cache_capacity\""},
        {"{\"extra\":1,\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "unknown key \"extra\""},
        {"{\"added_tokens\":[{\"id\":1,\"content\":\"x\",\"weird\":true}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
         "\"merges\":[]}}",
         "added_tokens[0] (added token): unknown key \"weird\""},
        {"{\"post_processor\":{\"type\":\"RobertaProcessing\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "post_processor: post-processor RobertaProcessing is not supported"},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}}],"
         "\"special_tokens\":{}},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "post_processor.single[0]: special token \"<s>\" is not in special_tokens"},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}}],"
         "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[9],\"tokens\":[\"<s>\"]}}},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "has id 9, which is no token"},
        {"{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?<=a+)b\"},"
         "\"behavior\":\"Isolated\"}]},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
         "pre_tokenizer.pretokenizers[0].pattern: regex does not compile"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u00ff\":0,\"a\xff\":1},\"merges\":[]}}", "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[ERR_LEN] = "";
        tokenizer_t *t = tokenizer_parse(cases[i].json, strlen(cases[i].json), err);
        cr_assert_null(t, "should be refused: %s", cases[i].json);
        cr_assert(strstr(err, cases[i].want), "error '%s' does not mention '%s'", err, cases[i].want);
    }
}

// Save writes the components back: the reloaded tokenizer encodes and decodes the same.
Test(tok_pipeline, save_keeps_components) {
    tokenizer_t *t = parse_ok(LLAMA_JSON);
    char path[256], err[ERR_LEN] = "";
    cr_assert_eq(util_mkdirs("build/test-tmp", err), 0, "%s", err);
    snprintf(path, sizeof path, "build/test-tmp/tok_pipeline_%d.json", (int)getpid());
    cr_assert_eq(tokenizer_save(t, path, err), 0, "%s", err);
    tokenizer_t *u = tokenizer_load(path, err);
    cr_assert_not_null(u, "%s", err);
    const char *texts[] = {"hi hi", "\xe2\x9c\x93 hi</s>", " leading", ""};
    for (size_t i = 0; i < 4; i++) {
        for (int sp = 0; sp < 2; sp++) {
            int32_t *a = NULL, *b = NULL;
            int na = tokenizer_encode_special(t, texts[i], strlen(texts[i]), sp, &a, err);
            int nb = tokenizer_encode_special(u, texts[i], strlen(texts[i]), sp, &b, err);
            cr_assert(na >= 0 && na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0), "'%s'", texts[i]);
            char *da = tokenizer_decode(t, a, na, false, err), *db = tokenizer_decode(u, b, nb, false, err);
            cr_assert_str_eq(da, db);
            free(da);
            free(db);
            free(a);
            free(b);
        }
    }
    unlink(path);
    tokenizer_destroy(&u);
    tokenizer_destroy(&t);
}

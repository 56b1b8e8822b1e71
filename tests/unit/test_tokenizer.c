// test_tokenizer.c - BPE tokenizer: exact encodings, merge order, added tokens, byte fallback,
// round trips, parse errors, save/load. The pipeline's components: test_tok_pipeline.c.
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/tokenizer.h"

// ---------------------------------------------------------------------------------------
// A small tokenizer whose ids are easy to work out by hand:
//   0..25 a..z, 26 ' ', 27..36 '0'..'9', 37..46 . , ! ? ' - < > | _
//   47 th, 48 the, 49 er, 50 he, 51 in, 52 ing, 53 " the"; specials 54, 55.
static const char *const STD_VOCAB[] = {
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r",
    "s", "t", "u", "v", "w", "x", "y", "z", " ", "0", "1", "2", "3", "4", "5", "6", "7", "8",
    "9", ".", ",", "!", "?", "'", "-", "<", ">", "|", "_", "th", "the", "er", "he", "in", "ing", " the",
};
// "h e" ranks after "e r" on purpose: "her" must become h + er, not he + r.
static const char *const STD_MERGES[] = {"t h", "th e", "e r", "h e", "i n", "in g", "  the"};
static const char *const STD_SPECIALS[] = {"<|endoftext|>", "<|im_start|>"};
enum { N_STD_VOCAB = 54, N_STD_MERGES = 7, ID_EOT = 54, ID_IM_START = 55 };
enum { ID_TH = 47, ID_THE = 48, ID_ER = 49, ID_HE = 50, ID_ING = 52, ID_SP_THE = 53, ID_SPACE = 26 };
static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyz 0123456789.,!?'-<>|_";

static int id_of(char c) {
    return (int)(strchr(ALPHABET, c) - ALPHABET);
}

static tokenizer_t *std_tokenizer(void) {
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_build(STD_VOCAB, N_STD_VOCAB, STD_MERGES, N_STD_MERGES, STD_SPECIALS, 2, err);
    cr_assert_not_null(t, "build failed: %s", err);
    return t;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
    char err[ERR_LEN];
    cr_assert_eq(util_mkdirs("build/test-tmp", err), 0, "%s", err);
    snprintf(buf, cap, "build/test-tmp/tokenizer_%s_%d.json", name, (int)getpid());
}

// Deterministic generator so failures reproduce.
static uint32_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static void ids_to_str(const int32_t *ids, int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o + 16 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", ids[i]);
}

static void expect_ids(const tokenizer_t *t, const char *text, const int32_t *want, int n_want) {
    char err[ERR_LEN] = "", got_s[512], want_s[512];
    int32_t *ids = NULL;
    int n = tokenizer_encode(t, text, strlen(text), &ids, err);
    cr_assert_geq(n, 0, "encode '%s' failed: %s", text, err);
    ids_to_str(ids, n, got_s, sizeof got_s);
    ids_to_str(want, n_want, want_s, sizeof want_s);
    bool same = n == n_want && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
    cr_assert(same, "encode '%s': got [%s], want [%s]", text, got_s, want_s);
    free(ids);
}

static char *roundtrip(const tokenizer_t *t, const char *text, size_t len) {
    char err[ERR_LEN] = "";
    int32_t *ids = NULL;
    int n = tokenizer_encode(t, text, len, &ids, err);
    cr_assert_geq(n, 0, "encode failed: %s", err);
    char *back = tokenizer_decode(t, ids, n, false, err);
    cr_assert_not_null(back, "decode failed: %s", err);
    free(ids);
    return back;
}

static void expect_same_tokenizer(const tokenizer_t *a, const tokenizer_t *b, const char *const *texts, int n) {
    cr_assert_eq(tokenizer_vocab_size(a), tokenizer_vocab_size(b));
    for (int32_t id = 0; id < tokenizer_vocab_size(a); id++) {
        const char *ta = tokenizer_token_text(a, id), *tb = tokenizer_token_text(b, id);
        cr_assert((ta == NULL) == (tb == NULL) && (!ta || strcmp(ta, tb) == 0), "token %d", id);
        cr_assert_eq(tokenizer_is_special(a, id), tokenizer_is_special(b, id), "token %d", id);
    }
    for (int i = 0; i < n; i++) {
        char err[ERR_LEN] = "";
        int32_t *ia = NULL, *ib = NULL;
        int na = tokenizer_encode(a, texts[i], strlen(texts[i]), &ia, err);
        int nb = tokenizer_encode(b, texts[i], strlen(texts[i]), &ib, err);
        cr_assert(na >= 0 && na == nb && memcmp(ia, ib, (size_t)na * sizeof *ia) == 0, "'%s'", texts[i]);
        for (int skip = 0; skip < 2; skip++) {
            char *da = tokenizer_decode(a, ia, na, skip, err), *db = tokenizer_decode(b, ib, nb, skip, err);
            cr_assert_str_eq(da, db);
            free(da);
            free(db);
        }
        free(ia);
        free(ib);
    }
}

static tokenizer_t *parse_ok(const char *json) {
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_parse(json, strlen(json), err);
    cr_assert_not_null(t, "parse failed: %s\n%s", err, json);
    return t;
}

static void expect_parse_error(const char *json, const char *want) {
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_parse(json, strlen(json), err);
    cr_assert_null(t, "parse should fail: %s", json);
    cr_assert(strstr(err, want) != NULL, "error '%s' does not mention '%s'", err, want);
}

// ---------------------------------------------------------------------------------------
// Encoding

Test(tokenizer, basic_properties) {
    tokenizer_t *t = std_tokenizer();
    cr_assert_eq(tokenizer_vocab_size(t), 56);
    cr_assert_eq(tokenizer_token_id(t, "the"), ID_THE);
    cr_assert_eq(tokenizer_token_id(t, " the"), ID_SP_THE);
    cr_assert_eq(tokenizer_token_id(t, "<|im_start|>"), ID_IM_START);
    cr_assert_eq(tokenizer_token_id(t, "xyz"), -1);
    cr_assert_str_eq(tokenizer_token_text(t, ID_ING), "ing");
    cr_assert_null(tokenizer_token_text(t, 56));
    cr_assert_null(tokenizer_token_text(t, -1));
    cr_assert(tokenizer_is_special(t, ID_EOT));
    cr_assert(!tokenizer_is_special(t, ID_THE));
    cr_assert(!tokenizer_is_special(t, 1000));
    tokenizer_destroy(&t);
    cr_assert_null(t);
    tokenizer_destroy(&t);
    tokenizer_destroy(NULL);
}

Test(tokenizer, exact_encodings) {
    tokenizer_t *t = std_tokenizer();
    expect_ids(t, "", NULL, 0);
    expect_ids(t, "the", (int32_t[]){ID_THE}, 1);
    expect_ids(t, "thing", (int32_t[]){ID_TH, ID_ING}, 2);
    expect_ids(t, "xyz", (int32_t[]){23, 24, 25}, 3);
    expect_ids(t, "a1.", (int32_t[]){0, 28, 37}, 3);
    // t-h (0), th-e (1), h-e (3), then " "+"the" (6); the no-longer-adjacent h-e at "the" is stale.
    expect_ids(t, "hello the world",
               (int32_t[]){ID_HE, 11, 11, 14, ID_SP_THE, ID_SPACE, 22, 14, 17, 11, 3}, 11);
    tokenizer_destroy(&t);
}

Test(tokenizer, merge_rank_order_not_left_to_right) {
    tokenizer_t *t = std_tokenizer();
    // Left-to-right greedy would merge h-e first: [he, r]. Rank order merges e-r (2) first.
    expect_ids(t, "her", (int32_t[]){id_of('h'), ID_ER}, 2);
    expect_ids(t, "here", (int32_t[]){id_of('h'), ID_ER, id_of('e')}, 3);
    // t-h (0) then th-e (1) take the e before e-r (2) can: [the, r], not [th, er].
    expect_ids(t, "other", (int32_t[]){id_of('o'), ID_THE, id_of('r')}, 3);
    tokenizer_destroy(&t);

    // After b-c (0) the queued a-b (1) is stale: the pair there is now a-bc (3), which must
    // wait for bc-d (2), leaving [a, bcd] rather than [abc, d].
    const char *vocab[] = {"a", "b", "c", "d", "ab", "bc", "bcd", "abc"};
    const char *merges[] = {"b c", "a b", "bc d", "a bc"};
    char err[ERR_LEN] = "";
    t = tokenizer_build(vocab, 8, merges, 4, NULL, 0, err);
    cr_assert_not_null(t, "%s", err);
    expect_ids(t, "abcd", (int32_t[]){0, 6}, 2);
    expect_ids(t, "abc", (int32_t[]){7}, 1);
    tokenizer_destroy(&t);
}

Test(tokenizer, special_tokens_in_text) {
    tokenizer_t *t = std_tokenizer();
    expect_ids(t, "the<|endoftext|>her", (int32_t[]){ID_THE, ID_EOT, id_of('h'), ID_ER}, 4);
    expect_ids(t, "<|im_start|>the<|im_start|>", (int32_t[]){ID_IM_START, ID_THE, ID_IM_START}, 3);
    expect_ids(t, "<|endoftext|><|endoftext|>", (int32_t[]){ID_EOT, ID_EOT}, 2);
    // An unfinished special is plain text.
    expect_ids(t, "a<|im_start|b",
               (int32_t[]){0, id_of('<'), id_of('|'), id_of('i'), id_of('m'), id_of('_'), id_of('s'), id_of('t'),
                           id_of('a'), id_of('r'), id_of('t'), id_of('|'), id_of('b')},
               13);
    // A special splits words: "t<|endoftext|>he" must not merge t with he.
    expect_ids(t, "t<|endoftext|>he", (int32_t[]){id_of('t'), ID_EOT, ID_HE}, 3);

    char err[ERR_LEN] = "";
    const int32_t ids[] = {ID_THE, ID_EOT, id_of('h'), ID_ER, ID_IM_START};
    char *s = tokenizer_decode(t, ids, 5, false, err);
    cr_assert_str_eq(s, "the<|endoftext|>her<|im_start|>");
    free(s);
    s = tokenizer_decode(t, ids, 5, true, err);
    cr_assert_str_eq(s, "theher");
    free(s);
    tokenizer_destroy(&t);
}

Test(tokenizer, added_tokens_longest_match_first) {
    const char *vocab[] = {"x", "y", "b", "<", "|", "a", ">"};
    const char *specials[] = {"<|a|>", "<|a|>b"};  // shorter first: order must not matter
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_build(vocab, 7, NULL, 0, specials, 2, err);
    cr_assert_not_null(t, "%s", err);
    expect_ids(t, "x<|a|>by<|a|>", (int32_t[]){0, 8, 1, 7}, 4);
    expect_ids(t, "<|a|", (int32_t[]){3, 4, 5, 4}, 4);
    tokenizer_destroy(&t);
}

Test(tokenizer, decode_encode_random_roundtrip) {
    tokenizer_t *t = std_tokenizer();
    uint64_t seed = 12345;
    char text[256];
    size_t alpha = strlen(ALPHABET);
    int merged = 0;
    for (int it = 0; it < 1000; it++) {
        size_t len = rng_next(&seed) % 80, o = 0;
        while (o < len) {
            uint32_t r = rng_next(&seed) % 100;
            const char *piece = r == 0 ? "<|endoftext|>" : r == 1 ? "<|im_start|>" : r < 10 ? "the" : NULL;
            if (piece) {
                memcpy(text + o, piece, strlen(piece));
                o += strlen(piece);
            } else {
                text[o++] = ALPHABET[rng_next(&seed) % alpha];
            }
        }
        text[o] = 0;
        char err[ERR_LEN] = "";
        int32_t *ids = NULL;
        int n = tokenizer_encode(t, text, o, &ids, err);
        cr_assert_geq(n, 0, "encode '%s': %s", text, err);
        cr_assert_leq((size_t)n, o);
        if ((size_t)n < o) merged++;
        char *back = tokenizer_decode(t, ids, n, false, err);
        cr_assert_not_null(back, "%s", err);
        cr_assert_str_eq(back, text);
        free(back);
        free(ids);
    }
    cr_assert_gt(merged, 500, "merges or specials should shorten most strings (%d did)", merged);
    tokenizer_destroy(&t);
}

Test(tokenizer, unknown_char_without_fallback_fails) {
    tokenizer_t *t = std_tokenizer();
    char err[ERR_LEN] = "";
    int32_t sentinel = 0, *ids = &sentinel;  // must be reset to NULL
    cr_assert_eq(tokenizer_encode(t, "caf\xc3\xa9", 5, &ids, err), -1);
    cr_assert_null(ids);
    cr_assert(strstr(err, "U+00E9") && strstr(err, "byte 3"), "%s", err);
    cr_assert_eq(tokenizer_encode(t, "theA", 4, &ids, err), -1);
    cr_assert(strstr(err, "'A'"), "%s", err);
    cr_assert_eq(tokenizer_encode(t, "a\tb", 3, &ids, err), -1);
    cr_assert(strstr(err, "U+0009"), "%s", err);
    cr_assert_eq(tokenizer_encode(t, "a\xff", 2, &ids, err), -1);
    cr_assert(strstr(err, "not valid UTF-8") && strstr(err, "0xFF at offset 1"), "%s", err);
    tokenizer_destroy(&t);
}

// ---------------------------------------------------------------------------------------
// Byte fallback and unk

// 0..255 are "<0x00>".."<0xFF>", then a, b, ' ', ab.
static char *byte_fallback_json(const char *extra_model) {
    size_t cap = 16384, o = 0;
    char *j = malloc(cap);
    o += (size_t)snprintf(j + o, cap - o,
                          "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,"
                          "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},"
                          "{\"type\":\"Fuse\"}]},\"post_processor\":null,"
                          "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,%s\"vocab\":{",
                          extra_model);
    for (int b = 0; b < 256; b++) o += (size_t)snprintf(j + o, cap - o, "\"<0x%02X>\":%d,", b, b);
    snprintf(j + o, cap - o, "\"a\":256,\"b\":257,\" \":258,\"ab\":259},\"merges\":[[\"a\",\"b\"]]}}");
    return j;
}

Test(tokenizer, byte_fallback_non_ascii) {
    char *json = byte_fallback_json("");
    tokenizer_t *t = parse_ok(json);
    free(json);
    expect_ids(t, "\xc3\xa9", (int32_t[]){0xC3, 0xA9}, 2);                        // é
    expect_ids(t, "\xf0\x9f\x98\x80", (int32_t[]){0xF0, 0x9F, 0x98, 0x80}, 4);    // emoji
    expect_ids(t, "ab \xc3\xa9", (int32_t[]){259, 258, 0xC3, 0xA9}, 4);
    cr_assert_str_eq(tokenizer_token_text(t, 0xC3), "\xc3");
    cr_assert_eq(tokenizer_token_id(t, "<0xC3>"), 0xC3);

    const char *cases[] = {"\xc3\xa9", "h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac",
                           "ab\xf0\x9f\x98\x80" "ab", "\x01\x7f\n"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *back = roundtrip(t, cases[i], strlen(cases[i]));
        cr_assert_str_eq(back, cases[i]);
        free(back);
    }
    // Text that is not UTF-8 is refused; byte tokens that do not make UTF-8 decode to one
    // U+FFFD per byte, as in the Rust library.
    char err[ERR_LEN] = "";
    int32_t *ids = NULL;
    cr_assert_eq(tokenizer_encode(t, "\xff(a", 3, &ids, err), -1);
    cr_assert(strstr(err, "offset 0"), "%s", err);
    char *s = tokenizer_decode(t, (int32_t[]){0xFF, 256, 0xC3}, 3, false, err);
    cr_assert_str_eq(s, "\xef\xbf\xbd" "a\xef\xbf\xbd");
    free(s);
    tokenizer_destroy(&t);
}

Test(tokenizer, unk_token_and_fuse_unk) {
    const char *json = "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"a\":1},"
                       "\"merges\":[]}}";
    tokenizer_t *t = parse_ok(json);
    expect_ids(t, "xa y", (int32_t[]){0, 1, 0, 0}, 4);
    tokenizer_destroy(&t);
    json = "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":{\"<unk>\":0,\"a\":1},"
           "\"merges\":[]}}";
    t = parse_ok(json);
    expect_ids(t, "xa y", (int32_t[]){0, 1, 0}, 3);
    tokenizer_destroy(&t);
}

// ---------------------------------------------------------------------------------------
// Long inputs and a large vocabulary

Test(tokenizer, long_word_encodes) {
    tokenizer_t *t = std_tokenizer();
    size_t n = 200 * 1024;
    char *text = malloc(n + 1);
    uint64_t seed = 7;
    for (size_t i = 0; i < n; i++) text[i] = ALPHABET[rng_next(&seed) % strlen(ALPHABET)];
    text[n] = 0;
    char *back = roundtrip(t, text, n);
    cr_assert(strcmp(back, text) == 0);
    free(back);
    tokenizer_destroy(&t);

    // One 200k-character word where every position is a merge candidate.
    const char *vocab[] = {"a", "aa", "aaaa"};
    const char *merges[] = {"a a", "aa aa"};
    char err[ERR_LEN] = "";
    t = tokenizer_build(vocab, 3, merges, 2, NULL, 0, err);
    cr_assert_not_null(t, "%s", err);
    memset(text, 'a', n);
    text[n] = 0;
    int32_t *ids = NULL;
    int k = tokenizer_encode(t, text, n, &ids, err);
    cr_assert_eq(k, (int)(n / 4), "%s", err);
    for (int i = 0; i < k; i++) cr_assert_eq(ids[i], 2);
    free(ids);
    k = tokenizer_encode(t, text, 7, &ids, err);
    cr_assert_eq(k, 3);
    cr_assert(ids[0] == 2 && ids[1] == 1 && ids[2] == 0);
    free(ids);
    free(text);
    tokenizer_destroy(&t);
}

Test(tokenizer, large_vocab_hash_tables) {
    // Every digit string of length 1..5 (111110 tokens); merge "p d" builds each longer one,
    // ranked by length, then value.
    int n_vocab = 0, n_merges = 0;
    char **vocab = malloc(111110 * sizeof *vocab), **merges = malloc(111110 * sizeof *merges);
    for (int len = 1, count = 10; len <= 5; len++, count *= 10) {
        for (int v = 0; v < count; v++) {
            char s[16], m[32];
            snprintf(s, sizeof s, "%0*d", len, v);
            vocab[n_vocab++] = strdup(s);
            if (len > 1) {
                snprintf(m, sizeof m, "%.*s %c", len - 1, s, s[len - 1]);
                merges[n_merges++] = strdup(m);
            }
        }
    }
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_build((const char *const *)vocab, n_vocab, (const char *const *)merges, n_merges,
                                     STD_SPECIALS, 2, err);
    cr_assert_not_null(t, "%s", err);
    for (int i = 0; i < n_vocab; i++) cr_assert_eq(tokenizer_token_id(t, vocab[i]), i, "token %s", vocab[i]);
    cr_assert_eq(tokenizer_token_id(t, "<|im_start|>"), n_vocab + 1);
    int id1 = 0, id2 = 10, id3 = 110;  // first id of each length
    // "5 7" (rank of 57) comes before "7 9" (79), then "57 9" completes it.
    expect_ids(t, "579", (int32_t[]){id3 + 579}, 1);
    // "7 5" (75) comes before "9 7" (97); "9" + "75" is no merge.
    expect_ids(t, "975", (int32_t[]){id1 + 9, id2 + 75}, 2);

    char path[256];
    tmp_path(path, sizeof path, "large");
    cr_assert_eq(tokenizer_save(t, path, err), 0, "%s", err);
    tokenizer_t *u = tokenizer_load(path, err);
    cr_assert_not_null(u, "%s", err);
    cr_assert_eq(tokenizer_vocab_size(u), tokenizer_vocab_size(t));
    uint64_t seed = 99;
    for (int i = 0; i < 200; i++) {
        char s[32];
        int len = 1 + (int)(rng_next(&seed) % 20);
        for (int k = 0; k < len; k++) s[k] = (char)('0' + rng_next(&seed) % 10);
        s[len] = 0;
        int32_t *a = NULL, *b = NULL;
        int na = tokenizer_encode(t, s, (size_t)len, &a, err), nb = tokenizer_encode(u, s, (size_t)len, &b, err);
        cr_assert(na > 0 && na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0, "%s", s);
        char *back = tokenizer_decode(u, b, nb, false, err);
        cr_assert_str_eq(back, s);
        free(back);
        free(a);
        free(b);
    }
    unlink(path);
    tokenizer_destroy(&u);
    tokenizer_destroy(&t);
    for (int i = 0; i < n_vocab; i++) free(vocab[i]);
    for (int i = 0; i < n_merges; i++) free(merges[i]);
    free(vocab);
    free(merges);
}

// ---------------------------------------------------------------------------------------
// Parsing

#define MINI_VOCAB "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

Test(tokenizer, parse_errors) {
    expect_parse_error("{\"model\": ", "invalid JSON");
    expect_parse_error("[]", "must be a JSON object");
    expect_parse_error("{}", "model");
    expect_parse_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", "WordPiece");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[\"a c\"]}}", "'c' is not in the vocab");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
                       "merge 0 ('a' 'b'): result 'ab' is not in the vocab");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}", "duplicate id 0");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1},\"merges\":[]}}", "appears twice");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "out of range");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1e12},\"merges\":[]}}", "out of range");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0.5},\"merges\":[]}}", "not an integer");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}", "not a number");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", "model.vocab");
    expect_parse_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", "no tokens");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[1]}}", "merges[0]");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[[\"a\"]]}}", "merges[0]");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[\"ab\"]}}", "separated by a space");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":{}}}", "model.merges");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[],\"unk_token\":\"<unk>\"}}",
                       "unk_token '<unk>'");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[],\"byte_fallback\":1}}",
                       "byte_fallback must be true or false");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB
                       ",\"merges\":[],\"continuing_subword_prefix\":7}}",
                       "continuing_subword_prefix must be a string");
    expect_parse_error("{\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":\"BPE\"," MINI_VOCAB
                       ",\"merges\":[]}}",
                       "pre_tokenizer: pre-tokenizer BertPreTokenizer is not supported");
    expect_parse_error("{\"normalizer\":{\"type\":\"StripAccents\"},\"model\":{\"type\":\"BPE\"," MINI_VOCAB
                       ",\"merges\":[]}}",
                       "normalizer: normalizer StripAccents is not supported");
    expect_parse_error("{\"normalizer\":7,\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[]}}", "normalizer");
    expect_parse_error("{\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"CTC\"}]},"
                       "\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[]}}",
                       "decoder.decoders[0]: decoder CTC is not supported");
    expect_parse_error("{\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
                       "\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[]}}",
                       "duplicate id 1");
    expect_parse_error("{\"added_tokens\":[{\"id\":5,\"content\":\"a\",\"special\":true}],"
                       "\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[]}}",
                       "has id 0 in the vocab and id 5");
    expect_parse_error("{\"added_tokens\":[{\"id\":3,\"content\":5}],\"model\":{\"type\":\"BPE\"," MINI_VOCAB
                       ",\"merges\":[]}}",
                       "added_tokens[0]");
    expect_parse_error("{\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"single_word\":\"yes\"}],"
                       "\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[]}}",
                       "added_tokens[0].single_word must be true or false");
    expect_parse_error("{\"model\":{\"type\":\"BPE\"," MINI_VOCAB ",\"merges\":[],\"dropout\":0}}",
                       "model.dropout is not supported");

    char err[ERR_LEN] = "";
    cr_assert_null(tokenizer_load("build/test-tmp/does-not-exist.json", err));
    cr_assert(strstr(err, "does-not-exist.json"), "%s", err);
}

Test(tokenizer, parse_accepts_hf_components) {
    // A file as HF writes it: added tokens repeated in the vocab, decoder, post_processor.
    const char *json =
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
        "\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":false,\"special\":true},"
        "{\"id\":4,\"content\":\"<pad>\",\"special\":true}],"
        "\"normalizer\":null,\"pre_tokenizer\":null,"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[]},"
        "\"decoder\":{\"type\":\"Fuse\"},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
        "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
        "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"<s>\":3},\"merges\":[\"a b\"]}}";
    tokenizer_t *t = parse_ok(json);
    cr_assert_eq(tokenizer_vocab_size(t), 5);
    cr_assert(tokenizer_is_special(t, 3) && tokenizer_is_special(t, 4));
    expect_ids(t, "<s>ab<pad>b", (int32_t[]){3, 2, 4, 1}, 4);
    tokenizer_destroy(&t);
}

Test(tokenizer, added_token_options) {
    // Tokens with normalized=false are matched over the whole text before normalized ones
    // (so "bc" wins in "abc"); lstrip/rstrip swallow the whitespace beside the token.
    const char *json =
        "{\"added_tokens\":["
        "{\"id\":4,\"content\":\"ab\",\"normalized\":true,\"special\":false},"
        "{\"id\":5,\"content\":\"bc\",\"normalized\":false,\"special\":true},"
        "{\"id\":6,\"content\":\"<L>\",\"lstrip\":true,\"normalized\":false,\"special\":true},"
        "{\"id\":7,\"content\":\"<R>\",\"rstrip\":true,\"normalized\":false,\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\" \":3},\"merges\":[]}}";
    tokenizer_t *t = parse_ok(json);
    expect_ids(t, "abc", (int32_t[]){0, 5}, 2);
    expect_ids(t, "ab", (int32_t[]){4}, 1);
    expect_ids(t, "a  <L> b", (int32_t[]){0, 6, 3, 1}, 4);
    expect_ids(t, "a <R>  b", (int32_t[]){0, 3, 7, 1}, 4);
    cr_assert(!tokenizer_is_special(t, 4) && tokenizer_is_special(t, 5));

    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "addedopts");
    cr_assert_eq(tokenizer_save(t, path, err), 0, "%s", err);
    tokenizer_t *u = tokenizer_load(path, err);
    cr_assert_not_null(u, "%s", err);
    const char *texts[] = {"abc", "ab", "a  <L> b", "a <R>  b", "cab<R>\t<L>bc"};
    expect_same_tokenizer(t, u, texts, 5);
    unlink(path);
    tokenizer_destroy(&u);
    tokenizer_destroy(&t);
}

Test(tokenizer, parse_truncated_input_never_crashes) {
    char *json = byte_fallback_json("\"unk_token\":null,");
    size_t n = strlen(json);
    for (size_t len = 0; len < n; len += (len < 300 || len > n - 300) ? 1 : 97) {
        char err[ERR_LEN] = "";
        tokenizer_t *t = tokenizer_parse(json, len, err);
        cr_assert_null(t, "prefix of %zu bytes parsed", len);
        cr_assert(err[0] != 0);
    }
    tokenizer_t *t = parse_ok(json);
    tokenizer_destroy(&t);
    free(json);
}

Test(tokenizer, merges_formats_parse_the_same) {
    // The old format cannot separate " " from "the" with a single space; "  the" still resolves.
    const char *vocab = "\"vocab\":{\"t\":0,\"h\":1,\"e\":2,\"r\":3,\" \":4,\"th\":5,\"the\":6,\"er\":7,\"he\":8,"
                        "\" the\":9}";
    char old_json[1024], new_json[1024];
    snprintf(old_json, sizeof old_json, "{\"model\":{\"type\":\"BPE\",%s,\"merges\":[\"t h\",\"th e\",\"e r\","
             "\"h e\",\"  the\"]}}", vocab);
    snprintf(new_json, sizeof new_json, "{\"model\":{\"type\":\"BPE\",%s,\"merges\":[[\"t\",\"h\"],[\"th\",\"e\"],"
             "[\"e\",\"r\"],[\"h\",\"e\"],[\" \",\"the\"]]}}", vocab);
    tokenizer_t *a = parse_ok(old_json), *b = parse_ok(new_json);
    const char *cases[] = {"the", "her", "ether", "ther the", " the", "there here", "hthe  the"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[ERR_LEN] = "";
        int32_t *ia = NULL, *ib = NULL;
        int na = tokenizer_encode(a, cases[i], strlen(cases[i]), &ia, err);
        int nb = tokenizer_encode(b, cases[i], strlen(cases[i]), &ib, err);
        cr_assert(na > 0 && na == nb && memcmp(ia, ib, (size_t)na * sizeof *ia) == 0, "'%s'", cases[i]);
        free(ia);
        free(ib);
    }
    expect_ids(a, "her the", (int32_t[]){1, 7, 9}, 3);
    expect_ids(b, "her the", (int32_t[]){1, 7, 9}, 3);
    tokenizer_destroy(&a);
    tokenizer_destroy(&b);
}

Test(tokenizer, decode_errors) {
    tokenizer_t *t = std_tokenizer();
    char err[ERR_LEN] = "";
    cr_assert_null(tokenizer_decode(t, (int32_t[]){0, 56}, 2, false, err));
    cr_assert(strstr(err, "56"), "%s", err);
    cr_assert_null(tokenizer_decode(t, (int32_t[]){-1}, 1, false, err));
    cr_assert(strstr(err, "-1"), "%s", err);
    char *s = tokenizer_decode(t, NULL, 0, false, err);
    cr_assert_str_eq(s, "");
    free(s);
    tokenizer_destroy(&t);

    // A gap in the ids is not a token either.
    t = parse_ok("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]}}");
    cr_assert_eq(tokenizer_vocab_size(t), 3);
    cr_assert_null(tokenizer_decode(t, (int32_t[]){1}, 1, false, err));
    tokenizer_destroy(&t);
}

Test(tokenizer, build_errors) {
    char err[ERR_LEN] = "";
    const char *dup[] = {"a", "b", "a"};
    cr_assert_null(tokenizer_build(dup, 3, NULL, 0, NULL, 0, err));
    cr_assert(strstr(err, "twice"), "%s", err);
    const char *v[] = {"a", "b"};
    const char *bad_merge[] = {"a b"};
    cr_assert_null(tokenizer_build(v, 2, bad_merge, 1, NULL, 0, err));
    cr_assert(strstr(err, "'ab'"), "%s", err);
    const char *sp[] = {"a"};
    cr_assert_null(tokenizer_build(v, 2, NULL, 0, sp, 1, err));
    cr_assert_null(tokenizer_build(v, -1, NULL, 0, NULL, 0, err));
}

// ---------------------------------------------------------------------------------------
// Saving

Test(tokenizer, save_load_roundtrip) {
    tokenizer_t *t = std_tokenizer();
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "saveload");
    cr_assert_eq(tokenizer_save(t, path, err), 0, "%s", err);
    tokenizer_t *u = tokenizer_load(path, err);
    cr_assert_not_null(u, "%s", err);

    const char *texts[] = {"the", "her", "other", "hello the world", "the<|endoftext|>her<|im_start|>", ""};
    expect_same_tokenizer(t, u, texts, 6);
    uint64_t seed = 3;
    for (int it = 0; it < 200; it++) {
        char s[64];
        int len = (int)(rng_next(&seed) % 60);
        for (int k = 0; k < len; k++) s[k] = ALPHABET[rng_next(&seed) % strlen(ALPHABET)];
        s[len] = 0;
        const char *one[] = {s};
        expect_same_tokenizer(t, u, one, 1);
    }

    // The file is in the HF layout.
    size_t len;
    char *text = util_read_file(path, &len, err);
    cr_assert_not_null(text, "%s", err);
    cJSON *root = cJSON_Parse(text);
    cr_assert_not_null(root);
    cr_assert_str_eq(cJSON_GetObjectItem(root, "version")->valuestring, "1.0");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "truncation")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "padding")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "normalizer")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "pre_tokenizer")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "post_processor")));
    cJSON *dec = cJSON_GetObjectItem(root, "decoder");
    cr_assert(cJSON_IsObject(dec) && cJSON_IsString(cJSON_GetObjectItem(dec, "type")) &&
              !strcmp(cJSON_GetObjectItem(dec, "type")->valuestring, "Fuse"));
    cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    cr_assert_eq(cJSON_GetArraySize(added), 2);
    cJSON *a1 = cJSON_GetArrayItem(added, 1);
    cr_assert_eq(cJSON_GetObjectItem(a1, "id")->valueint, ID_IM_START);
    cr_assert_str_eq(cJSON_GetObjectItem(a1, "content")->valuestring, "<|im_start|>");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(a1, "special")));
    const char *falses[] = {"single_word", "lstrip", "rstrip", "normalized"};
    for (int i = 0; i < 4; i++) cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(a1, falses[i])), "%s", falses[i]);
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cr_assert_str_eq(cJSON_GetObjectItem(model, "type")->valuestring, "BPE");
    const char *nulls[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 4; i++) cr_assert(cJSON_IsNull(cJSON_GetObjectItem(model, nulls[i])), "%s", nulls[i]);
    const char *mfalses[] = {"fuse_unk", "byte_fallback", "ignore_merges"};
    for (int i = 0; i < 3; i++) cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(model, mfalses[i])), "%s", mfalses[i]);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(model, "vocab")), N_STD_VOCAB);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(model, "vocab"), " the")->valueint, ID_SP_THE);
    cJSON *merges = cJSON_GetObjectItem(model, "merges");
    cr_assert_eq(cJSON_GetArraySize(merges), N_STD_MERGES);
    cJSON *last = cJSON_GetArrayItem(merges, N_STD_MERGES - 1);
    cr_assert(cJSON_IsArray(last) && cJSON_GetArraySize(last) == 2);
    cr_assert_str_eq(cJSON_GetArrayItem(last, 0)->valuestring, " ");
    cr_assert_str_eq(cJSON_GetArrayItem(last, 1)->valuestring, "the");
    cJSON_Delete(root);
    free(text);

    unlink(path);
    tokenizer_destroy(&u);
    tokenizer_destroy(&t);
}

Test(tokenizer, save_load_keeps_byte_fallback_and_decoder) {
    char *json = byte_fallback_json("\"unk_token\":null,");
    tokenizer_t *t = parse_ok(json);
    free(json);
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "bytefallback");
    cr_assert_eq(tokenizer_save(t, path, err), 0, "%s", err);
    tokenizer_t *u = tokenizer_load(path, err);
    cr_assert_not_null(u, "%s", err);
    const char *texts[] = {"ab \xc3\xa9", "\xf0\x9f\x98\x80!", "\xc3\xbf\xc3\xbe", "ba"};
    expect_same_tokenizer(t, u, texts, 4);
    expect_ids(u, "\xc3\xa9", (int32_t[]){0xC3, 0xA9}, 2);

    char *text = util_read_file(path, NULL, err);
    cJSON *root = cJSON_Parse(text);
    cr_assert_not_null(root);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "decoder"), "type")->valuestring, "Sequence");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "byte_fallback")));
    cJSON_Delete(root);
    free(text);
    unlink(path);
    tokenizer_destroy(&u);
    tokenizer_destroy(&t);
}

Test(tokenizer, duplicate_merge_takes_later_rank) {
    // As in the reference implementation's merge map, a repeated pair keeps its last rank:
    // "b c" at rank 2 loses to "a b" at rank 1.
    const char *json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4},"
                       "\"merges\":[\"b c\",\"a b\",\"b c\"]}}";
    tokenizer_t *t = parse_ok(json);
    expect_ids(t, "abc", (int32_t[]){3, 2}, 2);
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "dupmerge");
    cr_assert_eq(tokenizer_save(t, path, err), 0, "%s", err);
    tokenizer_t *u = tokenizer_load(path, err);
    cr_assert_not_null(u, "%s", err);
    expect_ids(u, "abc", (int32_t[]){3, 2}, 2);
    expect_ids(u, "bc", (int32_t[]){4}, 1);
    unlink(path);
    tokenizer_destroy(&u);
    tokenizer_destroy(&t);
}

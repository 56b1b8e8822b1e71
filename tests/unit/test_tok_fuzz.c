// test_tok_fuzz.c - damaged tokenizer.json files: a small valid file with every kind of
// component, mutated many times (truncated, bytes changed, values swapped for wrong types,
// huge numbers, bad regexes, ill-formed UTF-8, pieces deleted or repeated). Each must either
// be refused with a message or load into a tokenizer that encodes and decodes without
// crashing (run under SAN=1 for the memory checks). Deterministic: a failure reproduces.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/tokenizer.h"

static const char *BASE =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
    "{\"id\":9,\"content\":\"<|x|>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":false,\"normalized\":false,"
    "\"special\":true},"
    "{\"id\":10,\"content\":\"ab\",\"single_word\":true,\"lstrip\":false,\"rstrip\":true,\"normalized\":true,"
    "\"special\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s{2,}\"},\"content\":\" \"},{\"type\":\"Strip\","
    "\"strip_left\":false,\"strip_right\":true},{\"type\":\"Prepend\",\"prepend\":\"_\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s)|\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
    "\"invert\":false},{\"type\":\"Digits\",\"individual_digits\":true},{\"type\":\"Metaspace\",\"replacement\":\"_\","
    "\"prepend_scheme\":\"first\",\"split\":true},{\"type\":\"Split\",\"pattern\":{\"String\":\"b\"},"
    "\"behavior\":\"MergedWithNext\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":false,\"use_regex\":false}]},"
    "\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":false,\"use_regex\":false},{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
    "{\"id\":\"<|x|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":"
    "{\"<|x|>\":{\"id\":\"<|x|>\",\"ids\":[9],\"tokens\":[\"<|x|>\"]}}}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":false,\"use_regex\":false},{\"type\":\"Replace\",\"pattern\":{\"String\":\"_\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Metaspace\",\"replacement\":\"_\","
    "\"prepend_scheme\":\"always\",\"split\":true},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":1}]},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":true,\"byte_fallback\":true,\"ignore_merges\":true,"
    "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"_\":3,\"<0x41>\":4,\"\xc4\xa0\":5,\"c\":6,\"_a\":7,\"_ab\":8},"
    "\"merges\":[\"_ a\",[\"_a\",\"b\"]]}}";

static uint64_t rng = 0x5eed;
static uint32_t next_u32(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static const char *const VALUES[] = {
    "null", "true", "-1", "0", "1e308", "4294967296", "1.5", "\"\"", "\"x\"", "[]", "{}", "[1,[2]]",
    "{\"type\":\"Sequence\"}", "\"(?<=a+)b\"", "\"[\\\\p{Zz}]\"", "\"\xff\xfe\"", "\"\\ud800\"", "\"(((\"",
    "{\"Regex\":\"(a+)+$\"}", "{\"String\":\"\"}", "\"Sequence\"", "\"\xe2\x96\x81\"", "[\"a\",\"b\",\"c\"]",
};

// One mutation of src into out (a new string).
static char *mutate(const char *src) {
    size_t n = strlen(src);
    char *out = malloc(2 * n + 64);
    uint32_t kind = next_u32() % 5, at = next_u32() % (uint32_t)n;
    switch (kind) {
    case 0:  // truncate
        memcpy(out, src, at);
        out[at] = 0;
        break;
    case 1: {  // change a byte (often to one that breaks UTF-8 or the syntax)
        static const char pool[] = "\x80\xff\xc3\"{}[]:,\\0 ";
        strcpy(out, src);
        out[at] = pool[next_u32() % (sizeof pool - 1)];
        break;
    }
    case 2: {  // replace the value after a ':' with another value
        const char *colon = strchr(src + at, ':');
        if (!colon) colon = strchr(src, ':');
        size_t vs = (size_t)(colon - src) + 1, ve = vs;
        int depth = 0;
        bool str = false;
        for (; ve < n; ve++) {  // the end of the JSON value starting at vs
            char c = src[ve];
            if (str) {
                if (c == '\\') ve++;
                else if (c == '"') str = false;
                continue;
            }
            if (c == '"') str = true;
            else if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') {
                if (depth == 0) break;
                depth--;
            } else if (c == ',' && depth == 0) break;
        }
        const char *v = VALUES[next_u32() % (sizeof VALUES / sizeof *VALUES)];
        memcpy(out, src, vs);
        strcpy(out + vs, v);
        strcat(out, src + ve);
        break;
    }
    case 3: {  // delete a range
        size_t len = 1 + next_u32() % 40;
        if (at + len > n) len = n - at;
        memcpy(out, src, at);
        strcpy(out + at, src + at + len);
        break;
    }
    default: {  // repeat a range
        size_t len = 1 + next_u32() % 40;
        if (at + len > n) len = n - at;
        memcpy(out, src, at + len);
        memcpy(out + at + len, src + at, len);
        strcpy(out + at + 2 * len, src + at + len);
        break;
    }
    }
    return out;
}

static void exercise(const tokenizer_t *t) {
    static const char *const texts[] = {
        "", "ab ab<|x|>AB  cd's 12345", "  \t\n\n  trailing   ", "\xef\xac\x81 \xc3\xa9 e\xcc\x81 \xf0\x9f\x98\x80",
        "<|x|><|x|>ab", "_a_b", "bad \xff utf8", "\xe2\x96\x81\xe2\x96\x81 1\xe2\x80\x8d" "2",
    };
    char err[ERR_LEN];
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = NULL;
            err[0] = 0;
            int n = tokenizer_encode_special(t, texts[i], strlen(texts[i]), sp, &ids, err);
            if (n < 0) {
                cr_assert(err[0], "encode failed without a message");
                cr_assert_null(ids);
                continue;
            }
            char *s = tokenizer_decode(t, ids, n, sp, err);
            cr_assert_not_null(s, "decoding what was encoded failed: %s", err);
            free(s);
            free(ids);
        }
    }
    int V = tokenizer_vocab_size(t);
    int32_t ids[8];
    for (int k = 0; k < 8; k++) ids[k] = (int32_t)(next_u32() % (uint32_t)(V + 2)) - 1;
    err[0] = 0;
    char *s = tokenizer_decode(t, ids, 8, false, err);
    cr_assert(s || err[0], "decode failed without a message");
    free(s);
    for (int32_t id = -1; id <= V; id++) {
        size_t len;
        const char *b = tokenizer_token_bytes(t, id, &len);
        if (b) cr_assert_eq(strlen(b) <= len, true);
    }
}

Test(tok_fuzz, damaged_files_are_refused_or_work) {
    char err[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_parse(BASE, strlen(BASE), err);
    cr_assert_not_null(t, "the base file must load: %s", err);
    exercise(t);
    tokenizer_destroy(&t);
    int loaded = 0, refused = 0;
    char *cur = strdup(BASE);
    for (int it = 0; it < 3000; it++) {
        // Mostly one mutation of the base, sometimes a mutation of the last mutant.
        char *m = mutate(next_u32() % 4 ? BASE : cur);
        err[0] = 0;
        t = tokenizer_parse(m, strlen(m), err);
        if (t) {
            loaded++;
            exercise(t);
            tokenizer_destroy(&t);
        } else {
            refused++;
            cr_assert(err[0], "refused without a message: %s", m);
        }
        free(cur);
        cur = m;
    }
    free(cur);
    // Both outcomes must occur, or the mutations test nothing.
    cr_assert_gt(loaded, 100, "only %d mutants loaded", loaded);
    cr_assert_gt(refused, 100, "only %d mutants refused", refused);
}

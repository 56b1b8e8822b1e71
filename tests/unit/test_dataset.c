// test_dataset.c - user JSONL datasets: verifier specs, every validation error with its line
// number, limits, line endings, splits, and the exact / numeric / regex / choice verifiers.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tasks/dataset.h"

static dataset_t *parse_as(const char *text, const char *verifier, char *err) {
    verify_spec_t v;
    cr_assert_eq(verify_spec_parse(&v, verifier, err), 0, "%s", err);
    return dataset_parse("t.jsonl", text, strlen(text), &v, err);
}

// Expects text to be refused with an error containing every one of the fragments.
static void refused(const char *text, const char *verifier, const char *frag1, const char *frag2) {
    char err[ERR_LEN] = "";
    dataset_t *d = parse_as(text, verifier, err);
    cr_assert_null(d, "accepted: %s", text);
    cr_assert(strstr(err, frag1), "error '%s' lacks '%s'", err, frag1);
    if (frag2) cr_assert(strstr(err, frag2), "error '%s' lacks '%s'", err, frag2);
}

// Writes a file under build/test-tmp/ named after the test and the process (Criterion runs
// tests in parallel processes).
static void write_tmp(const char *tag, const char *data, size_t len, char *path, size_t path_len) {
    char err[ERR_LEN];
    cr_assert_eq(util_mkdirs("build/test-tmp", err), 0, "%s", err);
    snprintf(path, path_len, "build/test-tmp/dataset-%s-%d.jsonl", tag, (int)getpid());
    cr_assert_eq(util_write_file(path, data, len, err), 0, "%s", err);
}

// --- verifier specs ------------------------------------------------------------------------

Test(dataset, verify_spec_parse_accepts_the_four_kinds) {
    verify_spec_t v;
    char err[ERR_LEN];
    cr_assert_eq(verify_spec_parse(&v, "exact", err), 0);
    cr_assert_eq(v.kind, VERIFY_EXACT);
    cr_assert_eq(verify_spec_parse(&v, "regex", err), 0);
    cr_assert_eq(v.kind, VERIFY_REGEX);
    cr_assert_eq(verify_spec_parse(&v, "choice", err), 0);
    cr_assert_eq(v.kind, VERIFY_CHOICE);
    cr_assert_eq(verify_spec_parse(&v, "numeric", err), 0);
    cr_assert_eq(v.kind, VERIFY_NUMERIC);
    cr_assert_eq(v.tolerance, 0.0);
    cr_assert_eq(verify_spec_parse(&v, "numeric:0.01", err), 0);
    cr_assert_eq(v.kind, VERIFY_NUMERIC);
    cr_assert_float_eq(v.tolerance, 0.01, 1e-15);
    static const char *const bad[] = {"", "Exact", "numeric:", "numeric:-1", "numeric:abc", "numeric:inf",
                                      "numeric:0.1x", "numeric 0.1", "regexp", "choice:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        cr_assert_eq(verify_spec_parse(&v, bad[i], err), -1, "'%s' accepted", bad[i]);
        cr_assert(err[0], "no error for '%s'", bad[i]);
    }
    cr_assert_eq(verify_spec_parse(&v, NULL, err), -1);
    cr_assert_str_eq(verify_kind_name(VERIFY_NUMERIC), "numeric");
}

// --- validation ----------------------------------------------------------------------------

Test(dataset, empty_and_blank_files_have_no_records) {
    refused("", "exact", "t.jsonl", "no records");
    refused("\n\n  \n\t\r\n\r\n", "exact", "t.jsonl", "no records");
    char err[ERR_LEN];
    cr_assert_null(dataset_parse("t.jsonl", NULL, 0, NULL, err));
    cr_assert(strstr(err, "no records"), "%s", err);
}

Test(dataset, bad_json_reports_its_line) {
    const char *ok = "{\"prompt\":\"a\",\"answer\":\"b\"}\n";
    char text[512];
    snprintf(text, sizeof text, "%s%s{\"prompt\": \"a\", \"answer\": }\n%s", ok, ok, ok);
    refused(text, "exact", "t.jsonl:3:", "invalid JSON");
    // Blank lines count: the broken record is still on line 3.
    snprintf(text, sizeof text, "\n%s{oops\n", ok);
    refused(text, "exact", "t.jsonl:3:", "invalid JSON");
    refused("{\"prompt\":\"a\",\"answer\":\"b\"} extra\n", "exact", ":1:", "after the value");
    refused("{\"prompt\":\"a\",\"answer\":\"b\"}{}\n", "exact", ":1:", "after the value");
    refused("{\"prompt\":\"a\",\n\"answer\":\"b\"}\n", "exact", ":1:", "invalid JSON");
    // A raw NUL would otherwise cut the prompt silently.
    static const char nul[] = "{\"prompt\":\"a\0b\",\"answer\":\"c\"}\n";
    char err[ERR_LEN];
    cr_assert_null(dataset_parse("t.jsonl", nul, sizeof nul - 1, NULL, err));
    cr_assert(strstr(err, "t.jsonl:1:") && strstr(err, "NUL"), "%s", err);
}

Test(dataset, records_must_be_objects_with_string_fields) {
    refused("[1,2]\n", "exact", ":1:", "not a JSON object");
    refused("\"text\"\n", "exact", ":1:", "not a JSON object");
    refused("42\n", "exact", ":1:", "not a JSON object");
    refused("null\n", "exact", ":1:", "not a JSON object");
    refused("{\"answer\":\"b\"}\n", "exact", ":1:", "missing \"prompt\"");
    refused("{\"prompt\":\"a\"}\n", "exact", ":1:", "missing \"answer\"");
    refused("{\"Prompt\":\"a\",\"answer\":\"b\"}\n", "exact", ":1:", "missing \"prompt\"");
    refused("{\"prompt\":5,\"answer\":\"b\"}\n", "exact", ":1:", "\"prompt\" must be a string");
    refused("{\"prompt\":null,\"answer\":\"b\"}\n", "exact", ":1:", "\"prompt\" must be a string");
    refused("{\"prompt\":\"a\",\"answer\":5}\n", "exact", ":1:", "\"answer\" must be a string");
    refused("{\"prompt\":\"a\",\"answer\":5}\n", "numeric", ":1:", "\"answer\" must be a string");
    refused("{\"prompt\":\"a\",\"answer\":{}}\n", "choice", ":1:", "array of strings");
    refused("{\"prompt\":\"a\",\"answer\":[\"b\"]}\n", "exact", ":1:", "choice");
    refused("{\"prompt\":\"a\",\"answer\":[\"b\",3]}\n", "choice", ":1:", "item 2 is not a string");
    refused("{\"prompt\":\"a\",\"answer\":[]}\n", "choice", ":1:", "empty array");
    refused("{\"prompt\":\"\",\"answer\":\"b\"}\n", "exact", ":1:", "empty \"prompt\"");
    refused("{\"prompt\":\"a\",\"answer\":\"  \"}\n", "exact", ":1:", "empty \"answer\"");
    refused("{\"prompt\":\"a\",\"answer\":[\"b\",\"\"]}\n", "choice", ":1:", "empty \"answer\"");
    refused("{\"prompt\":\"a\",\"answer\":\"b\\nc\"}\n", "exact", ":1:", "newline");
    // The error is on the second record, after a valid one.
    refused("{\"prompt\":\"a\",\"answer\":\"b\"}\r\n{\"prompt\":\"a\"}\r\n", "exact", "t.jsonl:2:", "answer");
}

Test(dataset, numeric_answers_and_regexes_are_checked_at_load) {
    refused("{\"prompt\":\"a\",\"answer\":\"1\"}\n{\"prompt\":\"b\",\"answer\":\"two\"}\n", "numeric", "t.jsonl:2:",
            "not a number");
    refused("{\"prompt\":\"a\",\"answer\":\"0x10\"}\n", "numeric", ":1:", "not a number");
    refused("{\"prompt\":\"a\",\"answer\":\"inf\"}\n", "numeric", ":1:", "not a number");
    refused("{\"prompt\":\"a\",\"answer\":\"1e999\"}\n", "numeric", ":1:", "not a number");
    refused("{\"prompt\":\"a\",\"answer\":\"[0-9]+\"}\n{\"prompt\":\"b\",\"answer\":\"([a-z\"}\n", "regex",
            "t.jsonl:2:", "does not compile");
    refused("{\"prompt\":\"a\",\"answer\":\"a{2,1}\"}\n", "regex", ":1:", "does not compile");
    // The same text is fine as a plain answer.
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"a\",\"answer\":\"([a-z\"}\n", "exact", err);
    cr_assert_not_null(d, "%s", err);
    dataset_destroy(&d);
    cr_assert_null(d);
}

Test(dataset, line_length_limit) {
    // A record padded with spaces inside the JSON to exactly the limit loads; one byte more
    // does not (the CR of a CRLF ending does not count).
    const char *head = "{\"prompt\":\"p\",\"answer\":\"a\"";
    size_t n = DATASET_MAX_LINE;
    char *text = malloc(2 * n + 16);
    memcpy(text, head, strlen(head));
    memset(text + strlen(head), ' ', n - strlen(head) - 1);
    text[n - 1] = '}';
    memcpy(text + n, "\r\n", 3);
    char err[ERR_LEN];
    dataset_t *d = dataset_parse("t.jsonl", text, strlen(text), NULL, err);
    cr_assert_not_null(d, "%s", err);
    dataset_destroy(&d);

    memset(text + strlen(head), ' ', n - strlen(head));
    text[n] = '}';
    memcpy(text + n + 1, "\n", 2);
    cr_assert_null(dataset_parse("t.jsonl", text, strlen(text), NULL, err));
    cr_assert(strstr(err, "t.jsonl:1:") && strstr(err, "longer than"), "%s", err);
    // A huge blank line is still a huge line.
    memset(text, ' ', 2 * n);
    cr_assert_null(dataset_parse("t.jsonl", text, 2 * n, NULL, err));
    cr_assert(strstr(err, "longer than"), "%s", err);
    free(text);
}

Test(dataset, record_count_limit, .timeout = 300) {
    static const char rec[] = "{\"prompt\":\"p\",\"answer\":\"a\"}\n";
    size_t rl = sizeof rec - 1, n = (size_t)DATASET_MAX_RECORDS + 1;
    char *text = malloc(rl * n + 1);
    for (size_t i = 0; i < n; i++) memcpy(text + i * rl, rec, rl);
    char err[ERR_LEN];
    cr_assert_null(dataset_parse("t.jsonl", text, rl * n, NULL, err));
    char want[64];
    snprintf(want, sizeof want, "t.jsonl:%zu:", n);
    cr_assert(strstr(err, want) && strstr(err, "more than"), "%s", err);
    // Exactly the limit loads.
    dataset_t *d = dataset_parse("t.jsonl", text, rl * (n - 1), NULL, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(dataset_size(d), DATASET_MAX_RECORDS);
    dataset_destroy(&d);
    free(text);
}

// --- loading files -------------------------------------------------------------------------

Test(dataset, valid_file_loads_every_record) {
    char text[8192] = "";
    int n = 57;
    for (int i = 0; i < n; i++) {
        char line[128];
        snprintf(line, sizeof line, "{\"prompt\":\"q%d:\",\"answer\":\"a%d\",\"meta\":{\"i\":%d}}\n%s", i, i, i,
                 i % 7 == 3 ? "\n   \n" : "");
        strcat(text, line);
    }
    char path[256], err[ERR_LEN];
    write_tmp("valid", text, strlen(text), path, sizeof path);
    dataset_t *d = dataset_load(path, NULL, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(dataset_size(d), n);
    cr_assert_str_eq(dataset_name(d), path);
    cr_assert_eq(dataset_spec(d)->kind, VERIFY_EXACT);
    int nt = dataset_split_size(d, TASK_TRAIN), ne = dataset_split_size(d, TASK_EVAL);
    cr_assert_eq(nt + ne, n, "splits %d + %d", nt, ne);
    cr_assert(ne > 0 && nt > 0);
    // Every record is reachable, on the side its prompt hash says, with its own answer.
    int seen[57] = {0};
    for (int s = 0; s < 2; s++) {
        int size = dataset_split_size(d, (task_split_t)s);
        for (int k = 0; k < size; k++) {
            task_example_t ex = {0};
            int rec = dataset_example(d, (task_split_t)s, (uint64_t)k, &ex);
            cr_assert(rec >= 0 && rec < n);
            seen[rec]++;
            char p[32], a[32];
            snprintf(p, sizeof p, "q%d:", rec);
            snprintf(a, sizeof a, "a%d", rec);
            cr_assert_str_eq(ex.prompt, p);
            cr_assert_str_eq(ex.answer, a);
            cr_assert_eq(task_prompt_split(ex.prompt), (task_split_t)s);
            cr_assert_eq(dataset_verify(d, rec, ex.answer), 1.0f);
            cr_assert_eq(dataset_verify(d, rec, "a"), 0.0f);
            // Indices wrap around the split.
            task_example_t again = {0};
            cr_assert_eq(dataset_example(d, (task_split_t)s, (uint64_t)(k + size), &again), rec);
            task_example_free(&again);
            task_example_free(&ex);
        }
    }
    for (int i = 0; i < n; i++) cr_assert_eq(seen[i], 1, "record %d seen %d times", i, seen[i]);
    // The train order is shuffled, not file order.
    int in_order = 0;
    for (int k = 0; k + 1 < nt; k++) {
        task_example_t a = {0}, b = {0};
        in_order += dataset_example(d, TASK_TRAIN, (uint64_t)k, &a) < dataset_example(d, TASK_TRAIN, (uint64_t)k + 1, &b);
        task_example_free(&a);
        task_example_free(&b);
    }
    cr_assert_lt(in_order, nt - 1);
    dataset_destroy(&d);
    unlink(path);
}

Test(dataset, parse_reads_only_len_bytes) {
    // Buffers without a terminating NUL, ending inside or right after a record: AddressSanitizer
    // catches any read past len.
    static const char *const texts[] = {"{\"prompt\":\"a\",\"answer\":\"b\"}", "{\"prompt\":\"a\",\"answer\":\"b",
                                        "{\"prompt\":\"a\",\"answer\":\"b\"}\n12", "{\"prompt\":\"a\",\"answer\":\"b\"}\n{\"prompt\":\"a\",\"ans",
                                        "{\"prompt\":\"a\",\"answer\":\"b\"}\r"};
    static const bool valid[] = {true, false, false, false, true};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t n = strlen(texts[i]);
        char *buf = malloc(n);
        memcpy(buf, texts[i], n);
        char err[ERR_LEN];
        dataset_t *d = dataset_parse("t.jsonl", buf, n, NULL, err);
        cr_assert_eq(d != NULL, valid[i], "'%s': %s", texts[i], d ? "accepted" : err);
        dataset_destroy(&d);
        free(buf);
    }
}

Test(dataset, regex_answers_are_kept_verbatim) {
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"p\",\"answer\":\"a\\\\ \"}\n", "regex", err);
    cr_assert_not_null(d, "%s", err);
    task_example_t ex = {0};
    dataset_example(d, TASK_TRAIN, 0, &ex);
    cr_assert_str_eq(ex.answer, "a\\ ");
    task_example_free(&ex);
    // The completion is trimmed, so a pattern demanding a trailing space never matches.
    cr_assert_eq(dataset_verify(d, 0, "a "), 0.0f);
    dataset_destroy(&d);
    refused("{\"prompt\":\"a\",\"answer\":\"  \"}\n", "regex", ":1:", "empty \"answer\"");
}

Test(dataset, small_dataset_uses_every_record_for_both_splits) {
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"x\",\"answer\":\"1\"}\n{\"prompt\":\"y\",\"answer\":\"2\"}\n", "exact", err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(dataset_split_size(d, TASK_TRAIN), 2);
    cr_assert_eq(dataset_split_size(d, TASK_EVAL), 2);
    task_example_t ex = {0};
    cr_assert_eq(dataset_example(d, TASK_EVAL, 0, &ex), 0);
    cr_assert_str_eq(ex.prompt, "x");
    task_example_free(&ex);
    cr_assert_eq(dataset_example(d, TASK_EVAL, 1, &ex), 1);
    task_example_free(&ex);
    dataset_destroy(&d);
}

Test(dataset, crlf_and_missing_final_newline) {
    const char *crlf = "{\"prompt\":\"p1\",\"answer\":\"a1\"}\r\n\r\n{\"prompt\":\"p2\",\"answer\":\"a2\"}\r\n";
    const char *open_end = "{\"prompt\":\"p1\",\"answer\":\"a1\"}\n{\"prompt\":\"p2\",\"answer\":\"a2\"}";
    const char *texts[] = {crlf, open_end};
    for (int i = 0; i < 2; i++) {
        char path[256], err[ERR_LEN], tag[32];
        snprintf(tag, sizeof tag, "endings%d", i);
        write_tmp(tag, texts[i], strlen(texts[i]), path, sizeof path);
        dataset_t *d = dataset_load(path, NULL, err);
        cr_assert_not_null(d, "%s", err);
        cr_assert_eq(dataset_size(d), 2);
        task_example_t ex = {0};
        for (int k = 0; k < 2; k++) {
            int rec = dataset_example(d, TASK_EVAL, (uint64_t)k, &ex);
            cr_assert_eq(strchr(ex.prompt, '\r'), NULL);
            cr_assert_eq(strchr(ex.answer, '\r'), NULL);
            cr_assert_eq(dataset_verify(d, rec, ex.answer), 1.0f);
            task_example_free(&ex);
        }
        cr_assert_eq(dataset_verify(d, 1, "a2\r\n"), 1.0f);
        dataset_destroy(&d);
        unlink(path);
    }
}

Test(dataset, missing_file_is_an_error) {
    char err[ERR_LEN] = "";
    cr_assert_null(dataset_load("build/test-tmp/does-not-exist.jsonl", NULL, err));
    cr_assert(err[0]);
    dataset_destroy(NULL);
    dataset_t *d = NULL;
    dataset_destroy(&d);
}

// --- verifiers -----------------------------------------------------------------------------

Test(dataset, exact_verifier) {
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"capital of france:\",\"answer\":\" paris \"}\n", "exact", err);
    cr_assert_not_null(d, "%s", err);
    task_example_t ex = {0};
    dataset_example(d, TASK_TRAIN, 0, &ex);
    cr_assert_str_eq(ex.answer, "paris");
    task_example_free(&ex);
    static const struct {
        const char *c;
        float r;
    } cases[] = {{"paris", 1}, {"  paris\t", 1}, {"paris\nlyon", 1}, {"Paris", 0}, {"paris!", 0}, {"", 0},
                 {"pa ris", 0}, {"\nparis", 0}, {"\xff", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(dataset_verify(d, 0, cases[i].c), cases[i].r, "'%s'", cases[i].c);
    cr_assert_eq(dataset_verify(d, 0, NULL), 0.0f);
    cr_assert_eq(dataset_verify(d, 1, "paris"), 0.0f);
    cr_assert_eq(dataset_verify(d, -1, "paris"), 0.0f);
    cr_assert_eq(dataset_verify(NULL, 0, "paris"), 0.0f);
    dataset_destroy(&d);
}

Test(dataset, numeric_tolerance) {
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"pi:\",\"answer\":\"3.14\"}\n{\"prompt\":\"n:\",\"answer\":\"-12\"}\n",
                            "numeric:0.01", err);
    cr_assert_not_null(d, "%s", err);
    static const struct {
        int rec;
        const char *c;
        float r;
    } cases[] = {
        {0, "3.14", 1},  {0, "3.145", 1}, {0, "3.13", 1},    {0, "3.1", 0},    {0, "3.16", 0},   {0, " 3.15 \n", 1},
        {0, "3.12", 0},  {0, "3.1501", 0},
        {0, "314e-2", 1}, {0, ".314e1", 1}, {0, "3.", 0},    {0, "-3.14", 0},  {0, "3,14", 0},   {0, "0x3", 0},
        {0, "inf", 0},   {0, "nan", 0},   {0, "3.14abc", 0}, {0, "", 0},       {0, "+3.14", 0},  {0, "1e999", 0},
        {1, "-12", 1},   {1, "-12.0", 1}, {1, "-11.995", 1}, {1, "12", 0},     {1, "-12e0", 1},  {1, "- 12", 0},
        {1, "99999999999999999999999999", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(dataset_verify(d, cases[i].rec, cases[i].c), cases[i].r, "record %d '%s'", cases[i].rec,
                     cases[i].c);
    dataset_destroy(&d);

    // Without a tolerance only the same value counts, however it is written.
    d = parse_as("{\"prompt\":\"x:\",\"answer\":\"0.5\"}\n", "numeric", err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(dataset_verify(d, 0, "0.50"), 1.0f);
    cr_assert_eq(dataset_verify(d, 0, "5e-1"), 1.0f);
    cr_assert_eq(dataset_verify(d, 0, "0.5000001"), 0.0f);
    dataset_destroy(&d);
}

Test(dataset, regex_must_match_the_whole_completion) {
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"digits:\",\"answer\":\"[0-9]+\"}\n"
                            "{\"prompt\":\"alt:\",\"answer\":\"a|ab\"}\n"
                            "{\"prompt\":\"anchored:\",\"answer\":\"^(yes|no)$\"}\n",
                            "regex", err);
    cr_assert_not_null(d, "%s", err);
    static const struct {
        int rec;
        const char *c;
        float r;
    } cases[] = {
        {0, "123", 1}, {0, " 123 ", 1}, {0, "12a", 0}, {0, "a12", 0}, {0, "", 0},     {0, "1\n2", 1},
        {1, "a", 1},   {1, "ab", 1},    {1, "abc", 0}, {1, "b", 0},   {1, "xab", 0},
        {2, "yes", 1}, {2, "no", 1},    {2, "yesno", 0}, {2, "maybe", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(dataset_verify(d, cases[i].rec, cases[i].c), cases[i].r, "record %d '%s'", cases[i].rec,
                     cases[i].c);
    char *big = malloc(1024 * 1024 + 1);
    memset(big, '7', 1024 * 1024);
    big[1024 * 1024] = '\0';
    cr_assert_eq(dataset_verify(d, 0, big), 1.0f);
    big[512 * 1024] = 'x';
    cr_assert_eq(dataset_verify(d, 0, big), 0.0f);
    free(big);
    dataset_destroy(&d);
}

Test(dataset, choice_arrays) {
    char err[ERR_LEN];
    dataset_t *d = parse_as("{\"prompt\":\"ok?\",\"answer\":[\"yes\",\" y \",\"sure\"]}\n"
                            "{\"prompt\":\"one?\",\"answer\":\"1\"}\n",
                            "choice", err);
    cr_assert_not_null(d, "%s", err);
    task_example_t ex = {0};
    int rec = dataset_example(d, TASK_TRAIN, 0, &ex);
    cr_assert_str_eq(ex.answer, rec == 0 ? "yes" : "1", "the first choice is canonical");
    task_example_free(&ex);
    cr_assert_eq(dataset_verify(d, 0, "yes"), 1.0f);
    cr_assert_eq(dataset_verify(d, 0, "y"), 1.0f);
    cr_assert_eq(dataset_verify(d, 0, " sure\n"), 1.0f);
    cr_assert_eq(dataset_verify(d, 0, "no"), 0.0f);
    cr_assert_eq(dataset_verify(d, 0, "yes sure"), 0.0f);
    cr_assert_eq(dataset_verify(d, 0, ""), 0.0f);
    cr_assert_eq(dataset_verify(d, 1, "1"), 1.0f);
    cr_assert_eq(dataset_verify(d, 1, "01"), 0.0f);
    dataset_destroy(&d);
}

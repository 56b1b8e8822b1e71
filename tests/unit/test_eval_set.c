// test_eval_set.c - what a greedy eval counts: each distinct held-out prompt once. The string
// set, the dataset's eval list without repeated prompts, rl_source_eval_indices on datasets and
// on built-in families with few and with many prompts, and rl_evaluate's n and asked.
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rl/rl.h"
#include "common/util/strset.h"

Test(eval_set, strset_keeps_each_string_once_through_growth) {
    strset_t s = {0};
    char buf[32];
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 5000; i++) {
            snprintf(buf, sizeof buf, "p%d", i);
            cr_assert_eq(strset_add(&s, buf), round == 0, "round %d, %s", round, buf);
        }
    cr_assert_eq(s.n, 5000);
    cr_assert_eq(strset_add(&s, ""), 1);
    cr_assert_eq(strset_add(&s, ""), 0);
    cr_assert_eq(strset_add(&s, "p1 "), 1, "comparison is exact");
    strset_free(&s);
    cr_assert_eq(s.n, 0);
    cr_assert_eq(strset_add(&s, "p1"), 1, "reusable after free");
    strset_free(&s);
}

// A dataset of `lines` records over `distinct` prompts (record i asks prompt i % distinct).
static char *repeated_dataset(int lines, int distinct) {
    size_t cap = (size_t)lines * 64 + 1, len = 0;
    char *text = malloc(cap);
    for (int i = 0; i < lines; i++) {
        int k = i % distinct;
        len += (size_t)snprintf(text + len, cap - len, "{\"prompt\": \"sum %d+%d=\", \"answer\": \"%d\"}\n", k, 7 * k, 8 * k);
    }
    return text;
}

// The prompts of a split's examples 0..n-1 are pairwise distinct; returns how many there were.
static int distinct_prompts(const rl_source_t *src, const uint64_t *idx, int n) {
    strset_t seen = {0};
    for (int i = 0; i < n; i++) {
        task_example_t ex = {0};
        rl_source_example(src, TASK_EVAL, idx[i], &ex);
        cr_assert(strset_add(&seen, ex.prompt), "eval example %d repeats prompt '%s'", i, ex.prompt);
        task_example_free(&ex);
    }
    int k = (int)seen.n;
    strset_free(&seen);
    return k;
}

Test(eval_set, dataset_eval_split_holds_each_prompt_once) {
    char err[ERR_LEN];
    char *text = repeated_dataset(300, 95);
    dataset_t *d = dataset_parse("rep.jsonl", text, strlen(text), NULL, err);
    cr_assert_not_null(d, "%s", err);
    // count the held-out prompts independently: task_prompt_split over the distinct prompts
    int held_out = 0, train_records = 0;
    char prompt[64];
    for (int i = 0; i < 300; i++) {
        int k = i % 95;
        snprintf(prompt, sizeof prompt, "sum %d+%d=", k, 7 * k);
        bool out = task_prompt_split(prompt) == TASK_EVAL;
        held_out += out && i < 95;
        train_records += !out;
    }
    cr_assert_gt(held_out, 1, "the fixture must hold some prompts out");
    cr_assert_eq(dataset_split_size(d, TASK_EVAL), held_out);
    cr_assert_eq(dataset_split_size(d, TASK_TRAIN), train_records, "train keeps its repeated records");
    rl_source_t src = {.ds = d};
    uint64_t *idx = NULL;
    int n = rl_source_eval_indices(&src, 500, &idx);
    cr_assert_eq(n, held_out, "asked 500, the held-out set has %d distinct prompts", held_out);
    cr_assert_eq(distinct_prompts(&src, idx, n), n);
    free(idx);
    n = rl_source_eval_indices(&src, 2, &idx);
    cr_assert_eq(n, 2, "fewer asked than held out: exactly as many as asked");
    free(idx);
    dataset_destroy(&d);
    free(text);
}

Test(eval_set, small_dataset_evaluates_its_distinct_prompts) {
    char err[ERR_LEN];
    char *text = repeated_dataset(9, 3);   // under 10 records: every record in both splits
    dataset_t *d = dataset_parse("small.jsonl", text, strlen(text), NULL, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(dataset_split_size(d, TASK_TRAIN), 9);
    cr_assert_eq(dataset_split_size(d, TASK_EVAL), 3);
    dataset_destroy(&d);
    free(text);
}

Test(eval_set, builtin_family_with_few_prompts_gives_what_it_has) {
    char err[ERR_LEN];
    rl_source_t src;
    cr_assert_eq(rl_source_open(&src, "add1", NULL, NULL, err), 0, "%s", err);
    // add1 asks a+b for single digits: 100 prompts, of which task_prompt_split holds some out
    int held_out = 0;
    char prompt[32];
    for (int a = 0; a < 10; a++)
        for (int b = 0; b < 10; b++) {
            snprintf(prompt, sizeof prompt, "add %d+%d=", a, b);
            held_out += task_prompt_split(prompt) == TASK_EVAL;
        }
    task_example_t ex = {0};
    rl_source_example(&src, TASK_EVAL, 0, &ex);
    cr_assert_eq(strncmp(ex.prompt, "add ", 4), 0, "add1's prompts look like '%s'", ex.prompt);
    task_example_free(&ex);
    uint64_t *idx = NULL, *again = NULL;
    int n = rl_source_eval_indices(&src, 200, &idx);
    cr_assert_eq(n, held_out, "all %d held-out prompts of add1, each once (got %d)", held_out, n);
    cr_assert_eq(distinct_prompts(&src, idx, n), n);
    cr_assert_eq(rl_source_eval_indices(&src, 200, &again), n);
    cr_assert_arr_eq(idx, again, sizeof(uint64_t) * (size_t)n, "the same examples every time");
    free(idx);
    free(again);
    rl_source_close(&src);
}

Test(eval_set, builtin_family_with_many_prompts_gives_as_many_as_asked) {
    char err[ERR_LEN];
    rl_source_t src;
    cr_assert_eq(rl_source_open(&src, "add2", NULL, NULL, err), 0, "%s", err);
    uint64_t *idx = NULL;
    int n = rl_source_eval_indices(&src, 300, &idx);
    cr_assert_eq(n, 300);
    cr_assert_eq(distinct_prompts(&src, idx, n), 300);
    free(idx);
    cr_assert_eq(rl_source_eval_indices(&src, 0, &idx), 0);
    free(idx);
    rl_source_close(&src);
}

Test(eval_set, evaluate_counts_distinct_prompts_and_remembers_the_ask, .timeout = 120) {
    char err[ERR_LEN], path[256];
    cr_assert_eq(util_mkdirs("build/test-tmp", err), 0, "%s", err);
    snprintf(path, sizeof path, "build/test-tmp/eval-set-%d.jsonl", (int)getpid());
    char *text = repeated_dataset(300, 95);
    cr_assert_eq(util_write_file(path, text, strlen(text), err), 0, "%s", err);
    free(text);
    rl_runtime_t *rt = rl_runtime_open("models/micro", NULL, err);
    cr_assert_not_null(rt, "%s", err);
    rl_source_t src;
    cr_assert_eq(rl_source_open(&src, NULL, path, NULL, err), 0, "%s", err);
    rl_eval_t ev;
    cr_assert_eq(rl_evaluate(rt, -1, &src, 500, 8, RL_EVAL_MAX_TURNS, &ev, err), 0, "%s", err);
    cr_assert_eq(ev.asked, 500);
    cr_assert_eq(ev.n, dataset_split_size(src.ds, TASK_EVAL));
    cr_assert_lt(ev.n, 500);
    double lo, hi;
    rl_wilson(ev.correct, ev.n, &lo, &hi);
    cr_assert_eq(ev.lo, lo, "the interval is over the distinct prompts");
    cr_assert_eq(ev.hi, hi);
    rl_source_close(&src);
    rl_runtime_close(&rt);
    unlink(path);
}

// test_rl.c - GRPO advantages and the Wilson interval against hand-computed values.
#include <criterion/criterion.h>

#include "common/rl/rl.h"

Test(rl, group_advantages) {
    float r[4] = {1, 0, 0, 1}, a[4];
    rl_group_advantages(r, 4, false, a);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(a[i], r[i] - 0.5f, 1e-7);
    rl_group_advantages(r, 4, true, a);   // std 0.5
    for (int i = 0; i < 4; i++) cr_assert_float_eq(a[i], (r[i] - 0.5f) / (0.5f + 1e-4f), 1e-6);
    float same[3] = {0.3f, 0.3f, 0.3f};
    rl_group_advantages(same, 3, true, a);
    for (int i = 0; i < 3; i++) cr_assert_float_eq(a[i], 0.0f, 1e-7);
}

Test(rl, wilson_interval) {
    double lo, hi;
    rl_wilson(5, 10, &lo, &hi);   // reference values of the Wilson score interval, z = 1.96
    cr_assert_float_eq(lo, 0.2366, 1e-4);
    cr_assert_float_eq(hi, 0.7634, 1e-4);
    rl_wilson(0, 20, &lo, &hi);
    cr_assert_float_eq(lo, 0.0, 1e-12);
    cr_assert_float_eq(hi, 0.1611, 1e-4);
    rl_wilson(20, 20, &lo, &hi);
    cr_assert_float_eq(hi, 1.0, 1e-12);
    cr_assert_float_eq(lo, 0.8389, 1e-4);
}

Test(rl, sources_refuse_unknown_tasks_and_bad_datasets) {
    rl_source_t s;
    char err[ERR_LEN];
    cr_assert_eq(rl_source_open(&s, "no-such-task", NULL, NULL, err), -1);
    cr_assert(strstr(err, "unknown task"), "%s", err);
    cr_assert_eq(rl_source_open(&s, "x", "build/test-tmp/none.jsonl", NULL, err), -1);
    cr_assert_eq(rl_source_open(&s, "x", "build/test-tmp/none.jsonl", "fuzzy", err), -1);
    cr_assert_eq(rl_source_open(&s, "add2", NULL, NULL, err), 0, "%s", err);
    task_example_t ex;
    int h = rl_source_example(&s, TASK_EVAL, 3, &ex);
    cr_assert_float_eq(rl_source_verify(&s, &ex, h, ex.answer), 1.0f, 0);
    cr_assert_float_eq(rl_source_verify(&s, &ex, h, "nonsense"), 0.0f, 0);
    task_example_free(&ex);
    rl_source_close(&s);
}

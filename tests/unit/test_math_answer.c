// test_math_answer.c - the final answer of worked solutions (math_answer) and the dataset
// verifier built on it: boxed answers, GSM8K's "####", the last number, thousands separators,
// fractions, signs, LaTeX wrappers, and text that holds no number.
#include <criterion/criterion.h>
#include <string.h>

#include "common/tasks/dataset.h"
#include "common/tasks/math_answer.h"

static void answer_is(const char *text, double want) {
    double x = -12345.678;
    cr_assert_eq(math_answer(text, strlen(text), &x), 0, "no answer found in '%s'", text);
    cr_assert_eq(x, want, "'%s': got %.17g, want %.17g", text, x, want);
}

static void no_answer(const char *text) {
    double x;
    cr_assert_eq(math_answer(text, strlen(text), &x), -1, "'%s' gave %g", text, x);
}

Test(math_answer, where_the_answer_is) {
    answer_is("Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72", 72);
    answer_is("so the total is 5 + 7 = 12. \\boxed{12} (and 13 was wrong)", 12);
    answer_is("first \\boxed{3}, then corrected: \\boxed{4}", 4);
    answer_is("\\fbox{9} before \\boxed{8}", 8);
    answer_is("\\boxed{8} before \\fbox{9}", 9);
    answer_is("#### 10 and later #### 11", 11);
    answer_is("The answer is 42.", 42);
    answer_is("x = 3, y = 4, so x*y = 12", 12);
    answer_is("#### 1,234", 1234);
    answer_is("about 1,234,567 people", 1234567);
    answer_is("\\boxed{\\frac{3}{4}}", 0.75);
    answer_is("\\boxed{-\\dfrac{1}{2}}", -0.5);
    answer_is("\\boxed{2/8}", 0.25);
    answer_is("\\boxed{\\$18.50}", 18.5);
    answer_is("\\boxed{25\\%}", 25);
    answer_is("\\boxed{12\\text{ cm}}", 12);
    answer_is("\\boxed{ {7} }", 7);
    answer_is("\\boxed{x = -5}", -5);
    answer_is("it dropped to -3 degrees", -3);
    answer_is("3-2 is 1, not 5-7", 7);
    answer_is("\\boxed{1.5e3}", 1500);
    answer_is("pi is 3.14159", 3.14159);
    answer_is("unclosed \\boxed{17", 17);
    answer_is("a 1,23 typo", 23);   // not a thousands group: 1 then 23
}

Test(math_answer, refuses_text_without_a_number) {
    no_answer("");
    no_answer("no number here");
    no_answer("\\boxed{}");
    no_answer("####");
    no_answer("inf, -nan and e+");
    double x;
    cr_assert_eq(math_answer(NULL, 0, &x), -1);
    char noisy[300];
    for (int i = 0; i < 299; i++) noisy[i] = (char)(1 + (i * 37) % 255);
    noisy[299] = '\0';
    (void)math_answer(noisy, sizeof noisy - 1, &x);   // any bytes: an answer or none, no crash
}

Test(math_answer, dataset_verifier_grades_whole_solutions) {
    char err[ERR_LEN];
    verify_spec_t v;
    cr_assert_eq(verify_spec_parse(&v, "math", err), 0, "%s", err);
    cr_assert_eq(v.kind, VERIFY_MATH);
    cr_assert_str_eq(verify_kind_name(v.kind), "math");
    const char *data = "{\"prompt\": \"Tom has 3 boxes of 4 apples. How many?\", \"answer\": \"3*4 = 12\\n#### 12\"}\n"
                       "{\"prompt\": \"Half of 1,000?\", \"answer\": \"500\"}\n";
    dataset_t *d = dataset_parse("gsm.jsonl", data, strlen(data), &v, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_float_eq(dataset_verify(d, 0, "Each box has 4.\nSo 3 x 4 = 12.\n#### 12"), 1.0f, 0);
    cr_assert_float_eq(dataset_verify(d, 0, "Let me think.\nThe answer is \\boxed{12}."), 1.0f, 0);
    cr_assert_float_eq(dataset_verify(d, 0, "3 x 4 = 13\n#### 13"), 0.0f, 0);
    cr_assert_float_eq(dataset_verify(d, 0, "I do not know"), 0.0f, 0);
    cr_assert_float_eq(dataset_verify(d, 1, "half is 500.0"), 1.0f, 0);
    cr_assert_float_eq(dataset_verify(d, 1, "#### 5,00"), 0.0f, 0);
    dataset_destroy(&d);
    cr_assert_eq(verify_spec_parse(&v, "math:0.01", err), 0, "%s", err);
    cr_assert_float_eq(v.tolerance, 0.01, 0);
    const char *pi = "{\"prompt\": \"pi to two places?\", \"answer\": \"3.14\"}\n";
    d = dataset_parse("pi.jsonl", pi, strlen(pi), &v, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_float_eq(dataset_verify(d, 0, "about \\boxed{3.15}"), 1.0f, 0);
    cr_assert_float_eq(dataset_verify(d, 0, "about \\boxed{3.16}"), 0.0f, 0);
    dataset_destroy(&d);
    const char *bad = "{\"prompt\": \"p\", \"answer\": \"no number\"}\n";
    cr_assert_null(dataset_parse("bad.jsonl", bad, strlen(bad), &v, err));
    cr_assert(strstr(err, "bad.jsonl:1:") && strstr(err, "holds no number"), "%s", err);
    cr_assert_eq(verify_spec_parse(&v, "math:-1", err), -1);
    cr_assert_eq(verify_spec_parse(&v, "maths", err), -1);
}

// test_jobspec.c - job specs: defaults, round trip through JSON, precise errors.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/jobspec.h"

Test(jobspec, defaults_and_round_trip) {
    jobspec_t s, t;
    char err[ERR_LEN];
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"add2\"}", err), 0, "%s", err);
    cr_assert_str_eq(s.name, "add2");
    cr_assert_eq(s.group, 8);
    cr_assert_eq(s.staleness, 1);
    cr_assert_eq(jobspec_parse(&s,
                               "{\"task\": \"rev\", \"name\": \"my job\", \"group\": 4, \"prompts\": 16, \"lr\": 0.001,"
                               " \"targets\": [\"q\", \"v_proj\"], \"kl\": 0.05, \"staleness\": 0, \"weight\": 2.5,"
                               " \"reward\": {\"endpoint\": \"tcp://127.0.0.1:9100\", \"timeout_ms\": 500,"
                               " \"on_failure\": \"fail\"}}",
                               err),
                 0, "%s", err);
    char *js = jobspec_to_json(&s);
    cr_assert_eq(jobspec_parse(&t, js, err), 0, "%s: %s", err, js);
    cr_assert_eq(memcmp(&s, &t, sizeof s), 0, "round trip differs: %s", js);
    cr_assert_eq(t.targets, (1u << 0) | (1u << 2));
    cr_assert_eq(t.reward_on_failure, REWARD_FAIL_JOB);
    free(js);
}

// The stored text shows each number as the user wrote it: the shortest text that reads back as
// the same value, never a float's widening (0.003 as 0.0030000000260770321).
Test(jobspec, numbers_are_stored_as_written) {
    jobspec_t s;
    char err[ERR_LEN];
    cr_assert_eq(jobspec_parse(&s,
                               "{\"task\": \"add2\", \"lr\": 0.003, \"temperature\": 0.7, \"top_p\": 0.95,"
                               " \"alpha\": 32.5, \"kl\": 0.01, \"clip_low\": 0.1, \"clip_high\": 0.3, \"weight\": 0.3,"
                               " \"target_accuracy\": 0.9}",
                               err),
                 0, "%s", err);
    char *js = jobspec_to_json(&s);
    static const char *const want[] = {"\"lr\":0.003,", "\"temperature\":0.7,", "\"top_p\":0.95,",
                                       "\"alpha\":32.5,", "\"kl\":0.01,", "\"clip_low\":0.1,", "\"clip_high\":0.3,",
                                       "\"weight\":0.3", "\"target_accuracy\":0.9,"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_assert(strstr(js, want[i]), "%s not in %s", want[i], js);
    free(js);
}

Test(jobspec, precise_errors) {
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"[1,2]", "JSON object"},
        {"{\"group\": 4}", "spec.task is required"},
        {"{\"task\": \"nope\"}", "unknown task 'nope'"},
        {"{\"task\": \"add2\", \"group\": 1}", "spec.group must be an integer in 2..256"},
        {"{\"task\": \"add2\", \"group\": 2.5}", "spec.group"},
        {"{\"task\": \"add2\", \"lr\": -1}", "spec.lr"},
        {"{\"task\": \"add2\", \"temperature\": 0}", "spec.temperature"},
        {"{\"task\": \"add2\", \"targets\": [\"qq\"]}", "unknown target qq"},
        {"{\"task\": \"add2\", \"grup\": 4}", "unknown field 'grup'"},
        {"{\"task\": \"add2\", \"reward\": {\"endpoint\": \"http://x\"}}", "tcp://"},
        {"{\"task\": \"add2\", \"reward\": {\"on_failure\": \"maybe\"}}", "on_failure"},
        {"{\"task\": \"d\", \"dataset\": true, \"verifier\": \"fuzzy\"}", "spec.verifier"},
        {"{\"task\": 5}", "spec.task must be a non-empty string"},
        {"not json", "JSON object"},
        // what a parser must not let through silently: trailing text, a NUL that would cut a
        // string, bytes that are not UTF-8
        {"{\"task\": \"add2\"} {\"task\": \"add3\"}", "text after its JSON object"},
        {"{\"task\": \"add2\"}garbage", "text after its JSON object"},
        {"{\"task\": \"add2\", \"name\": \"a\\u0000b\"}", "NUL character"},
        {"{\"task\": \"add2\", \"name\": \"\xff\xfe\"}", "spec.name is not valid UTF-8"},
        {"{\"task\": \"add2\", \"name\": \"caf\xc3\"}", "spec.name is not valid UTF-8"},
        {"{\"task\": \"add2\", \"n\xffme\": 1}", "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jobspec_t s;
        char err[ERR_LEN] = "";
        cr_assert_eq(jobspec_parse(&s, cases[i].json, err), -1, "accepted: %s", cases[i].json);
        cr_assert(strstr(err, cases[i].want), "%s: error '%s' lacks '%s'", cases[i].json, err, cases[i].want);
    }
    jobspec_t s;
    char err[ERR_LEN];
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"mydata\", \"dataset\": true, \"verifier\": \"numeric:0.5\"}", err), 0,
                 "%s", err);
    // an escaped backslash before "u0000" is text, not a NUL; UTF-8 names and trailing blanks pass
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"add2\", \"name\": \"a\\\\u0000b caf\xc3\xa9\"}  \n", err), 0, "%s", err);
    cr_assert_str_eq(s.name, "a\\u0000b caf\xc3\xa9");
}

Test(jobspec, multi_turn_env) {
    jobspec_t s, t;
    char err[ERR_LEN];
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"add2\"}", err), 0, "%s", err);
    cr_assert_eq(s.max_turns, 1);
    cr_assert_eq(s.env_endpoint[0], 0);
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"tcalc\", \"env\": {\"max_turns\": 4, \"max_context\": 96}}", err), 0,
                 "%s", err);
    char *js = jobspec_to_json(&s);
    cr_assert_eq(jobspec_parse(&t, js, err), 0, "%s: %s", err, js);
    cr_assert_eq(memcmp(&s, &t, sizeof s), 0, "round trip differs: %s", js);
    cr_assert_eq(t.max_turns, 4);
    cr_assert_eq(t.max_context, 96);
    free(js);
    // an external environment steps any task, a dataset's too
    cr_assert_eq(jobspec_parse(&s, "{\"task\": \"vowels\", \"env\": {\"max_turns\": 3, \"endpoint\": \"tcp://h:9200\","
                                   " \"timeout_ms\": 100}}", err),
                 0, "%s", err);
    js = jobspec_to_json(&s);
    cr_assert_eq(jobspec_parse(&t, js, err), 0, "%s: %s", err, js);
    cr_assert_eq(memcmp(&s, &t, sizeof s), 0, "round trip differs: %s", js);
    cr_assert_str_eq(t.env_endpoint, "tcp://h:9200");
    cr_assert_eq(t.env_timeout_ms, 100);
    free(js);
    static const struct {
        const char *json, *want;
    } bad[] = {
        {"{\"task\": \"vowels\", \"env\": {\"max_turns\": 3}}", "has no tools"},
        {"{\"task\": \"d\", \"dataset\": true, \"env\": {\"max_turns\": 2}}", "has no tools"},
        {"{\"task\": \"tcalc\", \"env\": {\"max_turns\": 65}}", "spec.env.max_turns"},
        {"{\"task\": \"tcalc\", \"env\": {\"max_turns\": 0}}", "spec.env.max_turns"},
        {"{\"task\": \"tcalc\", \"env\": {\"endpoint\": \"http://x\"}}", "tcp://"},
        {"{\"task\": \"tcalc\", \"env\": {\"turns\": 2}}", "spec.env: unknown field 'turns'"},
        {"{\"task\": \"tcalc\", \"env\": 3}", "spec.env must be an object"},
        {"{\"task\": \"tcalc\", \"env\": {\"endpoint\": \"tcp://h:1\"}, \"reward\": {\"endpoint\": \"tcp://h:2\"}}",
         "leave spec.reward out"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char e2[ERR_LEN] = "";
        cr_assert_eq(jobspec_parse(&s, bad[i].json, e2), -1, "accepted: %s", bad[i].json);
        cr_assert(strstr(e2, bad[i].want), "%s: error '%s' lacks '%s'", bad[i].json, e2, bad[i].want);
    }
}

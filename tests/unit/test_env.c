// test_env.c - the tool environment of multi-turn tasks: the calculator (values, precedence,
// unary minus, parentheses, C division, every int64 overflow edge, malformed and huge input,
// random expressions against a 128-bit evaluator), the lookup table (its documented hash,
// key rules), env_step on transcripts, env_final_answer, the canonical traces of the tool tasks
// replayed through the environment, and greedy tool episodes through rl_evaluate (models/micro
// for the mechanics, models/tiny for real tool use).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rl/rl.h"
#include "common/tasks/env.h"
#include "common/tasks/tasks.h"
#include "testutil.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define ENV_VALGRIND 1
#endif
#endif

static int env_under_valgrind(void) {
#if defined(ENV_VALGRIND)
    return RUNNING_ON_VALGRIND;
#else
    return 0;
#endif
}

#define MB (1024 * 1024)

// --- calculator ----------------------------------------------------------------------------

static void calc_is(const char *expr, long long want) {
    int64_t v = 12345;
    cr_assert_eq(env_calc(expr, strlen(expr), &v), 0, "'%s' refused", expr);
    cr_assert_eq(v, want, "'%s' = %lld, expected %lld", expr, (long long)v, want);
}

static void calc_refuses(const char *expr) {
    int64_t v = 12345;
    cr_assert_eq(env_calc(expr, strlen(expr), &v), -1, "'%s' accepted (= %lld)", expr, (long long)v);
}

Test(env, calc_values_and_precedence) {
    calc_is("0", 0);
    calc_is("7", 7);
    calc_is("1+2", 3);
    calc_is("37*48", 1776);
    calc_is("1776+125", 1901);
    calc_is("2+3*4", 14);
    calc_is("2*3+4", 10);
    calc_is("(2+3)*4", 20);
    calc_is("2*(3+4)", 14);
    calc_is("10-4-3", 3);      // left to right
    calc_is("100/7/2", 7);
    calc_is("2*3%4", 2);       // * and % share a level, left to right
    calc_is("20-6/3*2", 16);
    calc_is("8%3*5", 10);
    calc_is("((((1))))", 1);
    calc_is("(1+2)*(3+4)-(5)", 16);
    calc_is("007", 7);         // leading zeros are fine in a calculator
}

Test(env, calc_division_is_c_division) {
    calc_is("7/2", 3);
    calc_is("-7/2", -3);
    calc_is("7/-2", -3);
    calc_is("-7/-2", 3);
    calc_is("7%3", 1);
    calc_is("-7%3", -1);
    calc_is("7%-3", 1);
    calc_is("-7%-3", -1);
    calc_is("0/5", 0);
    calc_refuses("1/0");
    calc_refuses("1%0");
    calc_refuses("0/0");
    calc_refuses("5/(3-3)");
    calc_refuses("5%(2*0)");
}

Test(env, calc_unary_minus_and_spaces) {
    calc_is("-5", -5);
    calc_is("--5", 5);
    calc_is("- 5", -5);
    calc_is("-(3+4)", -7);
    calc_is("2*-3", -6);
    calc_is("2--3", 5);
    calc_is("-2*-3", 6);
    calc_is("  1 +   2 ", 3);
    calc_is(" ( 4 ) * ( 2 - 5 ) ", -12);
    calc_refuses("+5");        // no unary plus
    calc_refuses("1 2");
    calc_refuses("3 4+1");
    calc_refuses("1\t+2");     // spaces only
}

Test(env, calc_refuses_malformed_text) {
    static const char *const bad[] = {"", " ", "   ", "1+", "*2", "1+*2", "(1", "1)", "()", "(1+2))", "((1)",
                                      "a", "1a", "x+1", "1+2=", "=3", "1.5", "0x10", "1e3", "1,000", "1++",
                                      "<c:1>", ">", "1=", "(-)", "-", "--", "1/", "%3", "\n1", "1\n",
                                      "\xff", "1+\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) calc_refuses(bad[i]);
    int64_t v;
    cr_assert_eq(env_calc(NULL, 3, &v), -1);
    cr_assert_eq(env_calc("1", 0, &v), -1);
    cr_assert_eq(env_calc("1\0", 2, &v), -1, "a NUL inside len is a character like any other");
    cr_assert_eq(env_calc("1+23", 3, &v), 0, "only len bytes are read");
    cr_assert_eq(v, 3);
    cr_assert_eq(env_calc("6*7", 3, NULL), 0, "out may be NULL");
}

Test(env, calc_int64_edges) {
    calc_is("9223372036854775807", INT64_MAX);
    calc_refuses("9223372036854775808");          // a literal must fit by itself
    calc_refuses("99999999999999999999999");
    calc_is("-9223372036854775807", -INT64_MAX);
    calc_is("-9223372036854775807-1", INT64_MIN); // INT64_MIN, as in C, only as an expression
    calc_refuses("-9223372036854775808");
    calc_refuses("9223372036854775807+1");
    calc_refuses("-9223372036854775807-2");
    calc_is("9223372036854775807-9223372036854775807", 0);
    calc_refuses("-(-9223372036854775807-1)");    // negating INT64_MIN
    calc_refuses("--(-9223372036854775807-1)");
    calc_refuses("(-9223372036854775807-1)/-1");
    calc_refuses("(-9223372036854775807-1)%-1"); // undefined in C, refused
    calc_is("(-9223372036854775807-1)/1", INT64_MIN);
    calc_is("(-9223372036854775807-1)%1", 0);
    calc_is("(-9223372036854775807-1)/2", INT64_MIN / 2);
    calc_refuses("3037000500*3037000500");
    calc_is("3037000499*3037000499", 3037000499LL * 3037000499LL);
    calc_refuses("4611686018427387904*2");
    calc_is("-4611686018427387904*2", INT64_MIN);
    calc_refuses("-4611686018427387904*-2");
    calc_refuses("(-9223372036854775807-1)*-1");
    calc_refuses("9223372036854775807*9223372036854775807");
    calc_refuses("1-9223372036854775807-3");
}

// n copies of open, then body, then n copies of close.
static char *nest(const char *open, const char *body, const char *close, int n) {
    size_t lo = strlen(open), lb = strlen(body), lc = strlen(close);
    char *s = malloc((size_t)n * (lo + lc) + lb + 1), *p = s;
    for (int i = 0; i < n; i++, p += lo) memcpy(p, open, lo);
    memcpy(p, body, lb), p += lb;
    for (int i = 0; i < n; i++, p += lc) memcpy(p, close, lc);
    *p = '\0';
    return s;
}

Test(env, calc_limits_depth_and_length) {
    char *s = nest("(", "5", ")", 30);
    calc_is(s, 5);
    free(s);
    s = nest("(", "5", ")", 100);
    calc_refuses(s);
    free(s);
    s = nest("-", "5", "", 30);
    calc_is(s, 5);
    free(s);
    s = nest("-", "5", "", 1000);
    calc_refuses(s);
    free(s);
    s = nest("(-", "5", ")", 10000);
    calc_refuses(s);
    free(s);
    // 1+1+...+1: 255 characters is fine, 257 is over the length limit
    char buf[300];
    int k = 0;
    for (int i = 0; i < 128; i++) k += snprintf(buf + k, sizeof buf - (size_t)k, i ? "+1" : "1");
    calc_is(buf, 128);
    k += snprintf(buf + k, sizeof buf - (size_t)k, "+1");
    calc_refuses(buf);
    // a megabyte of anything is refused without being parsed
    char *big = malloc(MB + 1);
    memset(big, '1', MB);
    big[MB] = '\0';
    calc_refuses(big);
    for (size_t i = 0; i < MB; i++) big[i] = "(1+-"[i % 4];
    calc_refuses(big);
    memset(big, '(', MB);
    calc_refuses(big);
    for (size_t i = 0; i < MB; i++) big[i] = (char)(1 + (i * 2654435761u >> 9) % 255);
    calc_refuses(big);
    free(big);
}

// Random expression trees, printed with every binary operation in parentheses and random
// spaces; each node's value computed in 128 bits, so any node outside int64 (or a division by
// zero, or INT64_MIN / -1) means the calculator must refuse the whole expression.
typedef struct {
    char *p, *end;
    uint64_t rng;
    bool bad;
} fuzz_t;

static uint64_t fz_next(fuzz_t *f) {
    f->rng ^= f->rng << 13, f->rng ^= f->rng >> 7, f->rng ^= f->rng << 17;
    return f->rng;
}

static void fz_put(fuzz_t *f, const char *s) {
    size_t n = strlen(s);
    cr_assert(f->p + n < f->end);
    memcpy(f->p, s, n + 1);
    f->p += n;
}

static void fz_space(fuzz_t *f) {
    if (fz_next(f) % 4 == 0) fz_put(f, " ");
}

static __int128 fz_expr(fuzz_t *f, int depth) {
    __int128 v;
    uint64_t kind = depth <= 0 ? 0 : fz_next(f) % 4;
    char num[32];
    fz_space(f);
    if (kind == 0) {
        // numbers of 1-19 digits, with the int64 edges often
        static const char *const edges[] = {"9223372036854775807", "4611686018427387904", "3037000499", "0", "1"};
        if (fz_next(f) % 5 == 0) {
            snprintf(num, sizeof num, "%s", edges[fz_next(f) % 5]);
        } else {
            int digits = 1 + (int)(fz_next(f) % 19);
            uint64_t x = fz_next(f) % 10;
            for (int i = 1; i < digits; i++) x = x * 10 + fz_next(f) % 10;
            if (x > INT64_MAX) x /= 10;
            snprintf(num, sizeof num, "%llu", (unsigned long long)x);
        }
        fz_put(f, num);
        v = (__int128)strtoull(num, NULL, 10);
    } else if (kind == 1) {
        fz_put(f, "-");
        v = -fz_expr(f, depth - 1);
    } else {
        static const char ops[] = "+-*/%";
        char op = ops[fz_next(f) % 5], o[2] = {op, 0};
        fz_put(f, "(");
        __int128 a = fz_expr(f, depth - 1);
        fz_space(f);
        fz_put(f, o);
        __int128 b = fz_expr(f, depth - 1);
        fz_space(f);
        fz_put(f, ")");
        if (f->bad) return 0;
        if ((op == '/' || op == '%') && (b == 0 || (a == INT64_MIN && b == -1))) {
            f->bad = true;
            return 0;
        }
        v = op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : op == '/' ? a / b : a % b;
    }
    if (v > INT64_MAX || v < INT64_MIN) f->bad = true;
    return f->bad ? 0 : v;
}

Test(env, calc_agrees_with_a_128_bit_evaluator) {
    char buf[4096];
    int ok = 0, refused = 0;
    for (int i = 0; i < 20000; i++) {
        fuzz_t f = {.p = buf, .end = buf + sizeof buf, .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)};
        buf[0] = '\0';
        __int128 want = fz_expr(&f, 1 + i % 4);
        size_t len = strlen(buf);
        int64_t got = 0;
        int rc = env_calc(buf, len, &got);
        if (len > 256) {   // over the length limit: refused whatever it means
            cr_assert_eq(rc, -1, "'%s' (%zu bytes) accepted", buf, len);
            continue;
        }
        if (f.bad) {
            cr_assert_eq(rc, -1, "'%s' should overflow or divide by zero, got %lld", buf, (long long)got);
            refused++;
        } else {
            cr_assert_eq(rc, 0, "'%s' refused", buf);
            cr_assert(got == (int64_t)want, "'%s' = %lld, expected %lld", buf, (long long)got, (long long)want);
            ok++;
        }
    }
    cr_assert(ok > 5000 && refused > 1000, "%d evaluated, %d refused: the generator lost its balance", ok, refused);
}

// --- lookup table --------------------------------------------------------------------------


Test(env, lookup_is_the_documented_table) {
    static const char *const keys[] = {"qz7", "a", "0", "zzzzzzzz", "abc", "abd", "k9", "tlook", "12345678"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int64_t v = 0, w = 0;
        cr_assert_eq(env_lookup(keys[i], strlen(keys[i]), &v), 0, "'%s'", keys[i]);
        cr_assert_eq(env_lookup(keys[i], strlen(keys[i]), &w), 0);
        cr_assert_eq(v, w, "'%s' not deterministic", keys[i]);
        cr_assert_eq(v, tu_lookup_table(keys[i]), "'%s' = %lld, the documented table says %lld", keys[i], (long long)v,
                     tu_lookup_table(keys[i]));
    }
    // pinned values: the shipped models learnt to use exactly this table
    int64_t v;
    cr_assert_eq(env_lookup("qz7", 3, &v), 0);
    cr_assert_eq(v, 422);
    cr_assert_eq(env_lookup("a", 1, &v), 0);
    cr_assert_eq(v, 683);
}

Test(env, lookup_values_spread_over_100_to_999) {
    static int seen[1000];
    memset(seen, 0, sizeof seen);
    char key[8];
    int n = 0, distinct = 0, most = 0;
    const char *al = "abcdefghijklmnopqrstuvwxyz0123456789";
    for (int a = 0; a < 36; a++)
        for (int b = 0; b < 36; b++)
            for (int c = 0; c < 8; c++) {
                snprintf(key, sizeof key, "%c%c%c", al[a], al[b], al[c * 4]);
                int64_t v;
                cr_assert_eq(env_lookup(key, 3, &v), 0);
                cr_assert(v >= 100 && v <= 999, "'%s' -> %lld", key, (long long)v);
                distinct += !seen[v]++;
                n++;
            }
    for (int i = 0; i < 1000; i++) most = seen[i] > most ? seen[i] : most;
    cr_assert_gt(distinct, 880, "%d of 900 values over %d keys", distinct, n);
    cr_assert_lt(most, 40, "one value taken %d times of %d", most, n);
}

Test(env, lookup_key_rules) {
    int64_t v;
    cr_assert_eq(env_lookup("abcdefgh", 8, &v), 0);
    cr_assert_eq(env_lookup("a1b2c3d4", 8, &v), 0);
    cr_assert_eq(env_lookup("7", 1, &v), 0);
    static const char *const bad[] = {"", "abcdefghi", "QZ7", "qZ7", "q-7", "q 7", " qz7", "qz7 ", "q_7", "q.7",
                                      "\xc3\xa9", "\xff", "q\n", "q+1", "q:1", "<k>"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(env_lookup(bad[i], strlen(bad[i]), &v), -1, "'%s' accepted", bad[i]);
    cr_assert_eq(env_lookup(NULL, 3, &v), -1);
    cr_assert_eq(env_lookup("ab\0", 3, &v), -1, "a NUL inside len is no key character");
    cr_assert_eq(env_lookup("qz7+12", 3, &v), 0, "only len bytes are read");
    cr_assert_eq(v, tu_lookup_table("qz7"));
    cr_assert_eq(env_lookup("qz7", 3, NULL), 0, "out may be NULL");
}

// --- env_step ------------------------------------------------------------------------------

static const task_t *tool_task(void) {
    const task_t *t = task_find("tcalc");
    cr_assert_not_null(t);
    return t;
}

// env_step on text: expects rc and, for rc 1, the observation want.
static void step_is(const char *text, int rc, const char *want) {
    char obs[ENV_OBS_MAX];
    memset(obs, 'x', sizeof obs);
    int got = env_step(tool_task(), NULL, text, obs, sizeof obs);
    cr_assert_eq(got, rc, "'%s': env_step %d, expected %d", text, got, rc);
    if (rc == 1) cr_assert_str_eq(obs, want, "'%s': observation '%s', expected '%s'", text, obs, want);
    else cr_assert_str_eq(obs, "", "'%s': no call leaves an empty observation", text);
}

Test(env, step_answers_the_call_at_the_end) {
    step_is("<c:37*48>", 1, "=1776 ");
    step_is("<c:37*48>=1776 <c:1776+125>", 1, "=1901 ");
    step_is("<c:-3-4>", 1, "=-7 ");
    step_is("<c: 2 * (3+4) >", 1, "=14 ");
    step_is("I will compute <c:6*7>", 1, "=42 ");
    char want[ENV_OBS_MAX];
    snprintf(want, sizeof want, "=%lld ", tu_lookup_table("qz7"));
    step_is("<k:qz7>", 1, want);
    step_is("<k:qz7>=418 <k:qz7>", 1, want);   // a wrong observation earlier changes nothing
    step_is("<c:9223372036854775807>", 1, "=9223372036854775807 ");
    step_is("<c:-9223372036854775807-1>", 1, "=-9223372036854775808 ");
    // the call is the text from the turn's last '<': an unfinished call before it is text
    step_is("<c:1+<c:2>", 1, "=2 ");
}

Test(env, step_returns_0_without_a_call_at_the_end) {
    step_is("", 0, NULL);
    step_is("1901", 0, NULL);
    step_is("<c:37*48>=1776 1776", 0, NULL);
    step_is("<c:37*48>=1776 <c:1776+125>=1901 1901", 0, NULL);
    step_is("<c:1+2", 0, NULL);
    step_is("<c:1+2>\n", 0, NULL);
    step_is("<c:1+2> ", 0, NULL);
    step_is("<c:1+2>=", 0, NULL);
    char obs[ENV_OBS_MAX] = "x";
    cr_assert_eq(env_step(tool_task(), NULL, NULL, obs, sizeof obs), 0, "NULL transcript");
    cr_assert_str_eq(obs, "");
}

// A transcript that ends with '>' always ends a model turn at a call: whatever is not a valid
// "<c:EXPR>" or "<k:KEY>" (no '<' in the turn at all included) is answered "=ERR ", so the
// model may correct itself.
Test(env, step_answers_err_to_malformed_calls) {
    static const char *const bad[] = {
        "<c:1/0>", "<c:>", "<k:>", "<c:1+>", "<c:a>", "<c:1.5>", "<c:9223372036854775807+1>", "<x:1>", "<C:1>",
        "<K:qz7>", "<c1+2>", "<:1+2>", "<>", "<c>", "<k:QZ7>", "<k:abcdefghi>", "<k:q z>", "<k:qz7+1>",
        "abc>", ">", "=5 >", "<c:1+1>=2 >", "<c:1+1>=2 x>", "<c:1>>", "\xff\xfe>", "<c:\xc3\xa9>", "<\n:1>",
        "<c:1\n>"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) step_is(bad[i], 1, "=ERR ");
    // a call's argument is at most 40 characters
    char call[64];
    snprintf(call, sizeof call, "<c:%s>", "1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1");   // 39
    step_is(call, 1, "=20 ");
    snprintf(call, sizeof call, "<c:%s>", "1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+10");   // 40
    step_is(call, 1, "=29 ");
    snprintf(call, sizeof call, "<c:%s>", "1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+100");  // 41
    step_is(call, 1, "=ERR ");
    snprintf(call, sizeof call, "<c:%s>", "                                       7");    // 40 with spaces
    step_is(call, 1, "=7 ");
}

Test(env, step_needs_a_task_with_tools) {
    char obs[ENV_OBS_MAX] = "x";
    cr_assert_eq(env_step(task_find("add2"), NULL, "<c:1+2>", obs, sizeof obs), -1);
    cr_assert_eq(env_step(NULL, NULL, "<c:1+2>", obs, sizeof obs), -1);
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        int rc = env_step(t, NULL, "<c:1+2>", obs, sizeof obs);
        cr_assert_eq(rc, t->env ? 1 : -1, "%s", t->name);
    }
}

Test(env, step_writes_only_cap_bytes) {
    const task_t *t = tool_task();
    char obs[8];
    memset(obs, 'x', sizeof obs);
    cr_assert_eq(env_step(t, NULL, "<c:1000*1000>", obs, 4), 1);
    cr_assert_str_eq(obs, "=10", "truncated to cap - 1 characters");
    cr_assert_eq(obs[4], 'x', "nothing written past cap");
    cr_assert_eq(env_step(t, NULL, "<c:1+1>", obs, 0), 1, "cap 0 writes nothing");
    cr_assert_eq(obs[0], '=');
    cr_assert_eq(env_step(t, NULL, "<c:1+1>", NULL, 0), 1, "obs may be NULL");
}

Test(env, step_survives_arbitrary_bytes) {
    const task_t *t = tool_task();
    char obs[ENV_OBS_MAX];
    char *big = malloc(MB + 1);
    uint64_t r = 88172645463325252ull;
    for (int round = 0; round < 6; round++) {
        for (size_t i = 0; i < MB; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            // mostly the characters calls are made of, so calls of every shape occur
            big[i] = round % 2 ? (char)(1 + r % 255) : "<>ck:=0123456789+-*/%() \n"[r % 25];
        }
        big[MB] = '\0';
        int rc = env_step(t, NULL, big, obs, sizeof obs);
        cr_assert(rc == 0 || rc == 1);
        if (round >= 2) {   // end with a call of the random text
            big[MB - 1] = '>';
            cr_assert_eq(env_step(t, NULL, big, obs, sizeof obs), 1);
            cr_assert(obs[0] == '=' && obs[strlen(obs) - 1] == ' ', "'%s'", obs);
        }
        // short random transcripts, every length
        for (int len = 0; len < 64; len++) {
            char save = big[len];
            big[len] = '\0';
            rc = env_step(t, NULL, big, obs, sizeof obs);
            cr_assert(rc == 0 || rc == 1);
            cr_assert_eq(rc, len > 0 && big[len - 1] == '>');
            big[len] = save;
        }
        const char *fa = env_final_answer(big);
        cr_assert(fa >= big && fa <= big + MB);
    }
    // a megabyte call: too long, answered =ERR
    memset(big, '1', MB);
    big[0] = '<', big[1] = 'c', big[2] = ':', big[MB - 1] = '>';
    cr_assert_eq(env_step(t, NULL, big, obs, sizeof obs), 1);
    cr_assert_str_eq(obs, "=ERR ");
    free(big);
}

// --- final answers -------------------------------------------------------------------------

static void final_is(const char *text, const char *want) {
    size_t n;
    const char *s = task_answer_span(env_final_answer(text), &n);
    cr_assert(n == strlen(want) && !memcmp(s, want, n), "'%s': final answer '%.*s', expected '%s'", text, (int)n, s,
              want);
}

Test(env, final_answer_follows_the_last_observation) {
    final_is("1901", "1901");
    final_is("  1901  ", "1901");
    final_is("<c:37*48>=1776 <c:1776+125>=1901 1901", "1901");
    final_is("<c:37*48>=1776 <c:1776+125>=1901  1901 ", "1901");
    final_is("<c:37*48>=1776 1776", "1776");
    final_is("<c:1/0>=ERR 5", "5");
    final_is("<k:qz7>=418 <c:418+12>=430 430\ngarbage", "430");
    final_is("<c:1+1>=2", "");              // an observation cut short: no answer yet
    final_is("<c:1+1>=2 ", "");
    final_is("<c:1+1>", "<c:1+1>");         // a call never answered is the answer (and wrong)
    final_is("5\n<c:1+1>=2 2", "5");        // the episode ends at its first newline
    final_is("<c:1>=1 7\n<c:2>=2 8", "7");
    final_is("a=b 3", "a=b 3");             // '=' without a call before it is no observation
    final_is("", "");
    final_is("\n7", "");
    cr_assert_str_eq(env_final_answer(NULL), "");
    const char *t = "<c:2*3>=6 6";
    cr_assert_eq(env_final_answer(t), t + 10, "a pointer into the transcript");
}

// --- tool tasks and their traces -----------------------------------------------------------

// Every tool task, both splits, 500 examples each: the model-written runs of the trace, fed to
// env_step one turn at a time, make it write exactly the trace's observations; the episode
// ends after the final answer; the verifier accepts the trace and refuses wrong final answers.
Test(env, traces_replay_through_the_environment) {
    int tool_tasks = 0;
    for (int ti = 0; ti < task_count(); ti++) {
        const task_t *t = task_at(ti);
        cr_assert_eq(t->env != NULL, t->trace != NULL, "%s: an environment and a trace go together", t->name);
        if (!t->env) continue;
        tool_tasks++;
        for (int s = 0; s < 2; s++)
            for (uint64_t k = 0; k < 500; k++) {
                task_example_t ex = {0};
                task_example(t, (task_split_t)s, k, &ex);
                char tr[256], episode[256], obs[ENV_OBS_MAX];
                uint8_t is_obs[256];
                memset(is_obs, 7, sizeof is_obs);
                int n = t->trace(&ex, tr, sizeof tr, is_obs);
                cr_assert_gt(n, 0, "%s: no trace for '%s'", t->name, ex.prompt);
                cr_assert_eq((size_t)n, strlen(tr));
                cr_assert_leq(strlen(ex.prompt) + (size_t)n + 1, 100, "%s: '%s' + '%s' leaves no margin in 128",
                              t->name, ex.prompt, tr);
                cr_assert_eq(is_obs[0], 0, "the model begins");
                cr_assert_eq(is_obs[n - 1], 0, "the model ends");
                int calls = 0, len = 0;
                for (int a = 0, b; a < n; a = b) {
                    for (b = a + 1; b < n && is_obs[b] == is_obs[a]; b++) {}
                    cr_assert(is_obs[a] <= 1);
                    if (is_obs[a]) continue;
                    // a model turn: up to and including its call's '>', or the final answer
                    memcpy(episode + len, tr + a, (size_t)(b - a));
                    len += b - a;
                    episode[len] = '\0';
                    int rc = env_step(t, &ex, episode, obs, sizeof obs);
                    if (b == n) {
                        cr_assert_eq(rc, 0, "%s: the final answer of '%s' is taken for a call", t->name, tr);
                        break;
                    }
                    cr_assert_eq(rc, 1, "%s: '%s' ends no call", t->name, episode);
                    size_t ol = strlen(obs);
                    int c = b;
                    while (c < n && is_obs[c]) c++;
                    cr_assert(ol == (size_t)(c - b) && !memcmp(tr + b, obs, ol),
                              "%s: after '%s' the environment says '%s', the trace '%.*s'", t->name, episode, obs,
                              c - b, tr + b);
                    cr_assert(strcmp(obs, "=ERR "), "%s: the canonical trace makes a failing call", t->name);
                    memcpy(episode + len, obs, ol);
                    len += (int)ol;
                    episode[len] = '\0';
                    calls++;
                }
                cr_assert_str_eq(episode, tr);
                cr_assert_geq(calls, 1, "%s: a trace without a call", t->name);
                cr_assert_eq(t->verify(&ex, tr), 1.0f, "%s: trace '%s' of '%s' (answer %s) refused", t->name, tr,
                             ex.prompt, ex.answer);
                cr_assert_str_eq(env_final_answer(tr), ex.answer, "%s", t->name);
                // wrong final answers after the right observations
                char wrong[300];
                long long a = atoll(ex.answer);
                static const long long delta[] = {1, -1, 10, 100};
                for (size_t d = 0; d < sizeof delta / sizeof delta[0]; d++) {
                    snprintf(wrong, sizeof wrong, "%.*s%lld", (int)(env_final_answer(tr) - tr), tr, a + delta[d]);
                    cr_assert_eq(t->verify(&ex, wrong), 0.0f, "%s: '%s' accepted", t->name, wrong);
                }
                snprintf(wrong, sizeof wrong, "%.*s", (int)(env_final_answer(tr) - tr), tr);
                cr_assert_eq(t->verify(&ex, wrong), 0.0f, "%s: no final answer accepted", t->name);
                snprintf(wrong, sizeof wrong, "%s %s", tr, ex.answer);
                cr_assert_eq(t->verify(&ex, wrong), 0.0f, "%s: the answer twice accepted", t->name);
                // the answer alone, without tools, is judged the same way
                cr_assert_eq(t->verify(&ex, ex.answer), 1.0f, "%s", t->name);
                // a trace cut at any point, or a buffer one byte short, is refused
                cr_assert_eq(t->trace(&ex, tr, (size_t)n, is_obs), -1, "%s: trace overran its buffer", t->name);
                cr_assert_eq(t->trace(&ex, tr, (size_t)n + 1, is_obs), n);
                cr_assert_eq(t->trace(&ex, tr, (size_t)n + 1, NULL), n, "is_obs may be NULL");
                task_example_free(&ex);
            }
    }
    cr_assert_geq(tool_tasks, 2);
}

Test(env, tool_tasks_match_the_documented_examples) {
    const task_t *t = task_find("tcalc");
    cr_assert_not_null(t);
    task_example_t ex = {.prompt = "tcalc 37*48+125=", .answer = "1901"};
    char tr[128];
    uint8_t o[128];
    cr_assert_eq(t->trace(&ex, tr, sizeof tr, o), 37);
    cr_assert_str_eq(tr, "<c:37*48>=1776 <c:1776+125>=1901 1901");
    static const char mask[] = "0000000001111110000000000001111110000";
    for (int i = 0; i < 37; i++) cr_assert_eq(o[i], mask[i] - '0', "is_obs[%d]", i);
    t = task_find("tlook");
    cr_assert_not_null(t);
    char want[128], answer[16];
    long long v = tu_lookup_table("qz7");
    snprintf(answer, sizeof answer, "%lld", v + 12);
    snprintf(want, sizeof want, "<k:qz7>=%lld <c:%lld+12>=%lld %lld", v, v, v + 12, v + 12);
    task_example_t ex2 = {.prompt = "tlook qz7+12=", .answer = answer};
    cr_assert_eq(t->trace(&ex2, tr, sizeof tr, o), (int)strlen(want));
    cr_assert_str_eq(tr, want);
    // prompts a trace cannot be made for
    static const char *const bad[] = {"tcalc 37*48=", "tcalc 370*48+125=", "tcalc 37*48+125", "tcalc 37*48+125=x",
                                      "tlook QZ7+12=", "tlook qz7+123=", "tlook abcdefghi+1=", "add 1+2=", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        task_example_t b = {.prompt = (char *)bad[i], .answer = "1"};
        cr_assert_eq(task_find("tcalc")->trace(&b, tr, sizeof tr, o), -1, "tcalc: '%s'", bad[i]);
        cr_assert_eq(task_find("tlook")->trace(&b, tr, sizeof tr, o), -1, "tlook: '%s'", bad[i]);
    }
    task_example_t none = {0};
    cr_assert_eq(task_find("tcalc")->trace(&none, tr, sizeof tr, o), -1);
    cr_assert_eq(task_find("tcalc")->trace(NULL, tr, sizeof tr, o), -1);
}

// --- greedy tool episodes ------------------------------------------------------------------

// models/micro never learnt the tools; the episodes must still run, count every example, and
// leave tasks without an environment exactly as single-turn evaluation has them.
Test(env, evaluate_runs_tool_episodes, .timeout = 120) {
    char err[ERR_LEN];
    rl_runtime_t *rt = rl_runtime_open("models/micro", NULL, err);
    cr_assert_not_null(rt, "%s", err);
    rl_source_t src;
    rl_eval_t a, b;
    cr_assert_eq(rl_source_open(&src, "add2", NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(rl_evaluate(rt, -1, &src, 40, 32, RL_EVAL_MAX_TURNS, &a, err), 0, "%s", err);
    cr_assert_eq(rl_evaluate(rt, -1, &src, 40, 32, 0, &b, err), 0, "%s", err);
    cr_assert_eq(a.n, 40);
    cr_assert_eq(a.correct, b.correct, "a task without tools is single-turn either way");
    rl_source_close(&src);
    static const char *const tools[] = {"tcalc", "tlook"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(rl_source_open(&src, tools[i], NULL, NULL, err), 0, "%s", err);
        for (int turns = 0; turns <= 4; turns++) {
            cr_assert_eq(rl_evaluate(rt, -1, &src, 30, turns ? 8 : 128, turns, &a, err), 0, "%s: %s", tools[i], err);
            cr_assert_eq(a.n, 30, "%s", tools[i]);
            cr_assert(a.acc >= 0 && a.acc <= 1);
        }
        rl_source_close(&src);
    }
    rl_runtime_close(&rt);
}

// models/tiny was pretrained on the tool traces: with the environment answering its calls it
// solves the tool tasks, and without one it cannot (it never learnt to write observations).
// This is the only test where observations really flow back into the model.
Test(env, tiny_solves_tool_tasks_only_with_tools, .timeout = 600) {
    char err[ERR_LEN];
    // under valgrind (50x slower) the first 10 eval prompts: greedy episodes on fixed prompts
    // give the same answers every run, and the code paths are the same
    int n = env_under_valgrind() ? 10 : 50;
    rl_runtime_t *rt = rl_runtime_open("models/tiny", NULL, err);
    cr_assert_not_null(rt, "%s", err);
    static const char *const tools[] = {"tcalc", "tlook"};
    for (int i = 0; i < 2; i++) {
        rl_source_t src;
        rl_eval_t with, without;
        cr_assert_eq(rl_source_open(&src, tools[i], NULL, NULL, err), 0, "%s", err);
        cr_assert_eq(rl_evaluate(rt, -1, &src, n, 32, RL_EVAL_MAX_TURNS, &with, err), 0, "%s", err);
        cr_assert_eq(rl_evaluate(rt, -1, &src, n, 32 * RL_EVAL_MAX_TURNS, 0, &without, err), 0, "%s", err);
        cr_assert_geq(with.acc, 0.5, "%s with tools: %.0f%% (was models/tiny pretrained without tool traces?)",
                      tools[i], 100 * with.acc);
        cr_assert_lt(without.acc + 0.3, with.acc, "%s: %.0f%% with tools, %.0f%% without", tools[i], 100 * with.acc,
                     100 * without.acc);
        // one turn is not enough: the first call's answer is never the final answer
        cr_assert_eq(rl_evaluate(rt, -1, &src, n, 32, 1, &without, err), 0, "%s", err);
        cr_assert_lt(without.acc + 0.3, with.acc, "%s: one turn", tools[i]);
        rl_source_close(&src);
    }
    rl_runtime_close(&rt);
}

// test_tasks.c - built-in task families: registry, determinism, train / eval separation,
// prompt alphabet and length, answers checked against independent oracles that re-solve each
// prompt from its text, and verifiers against correct, padded and adversarial completions.
// Tool tasks take part in every generic test (their completions are judged on the final
// answer, which for a plain answer is the answer itself); test_env.c covers their tools.
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tasks/tasks.h"
#include "testutil.h"

#define N_EXAMPLES 200
#define MAX_TEXT 48
#define MB (1024 * 1024)

static const char prompt_chars[] = "abcdefghijklmnopqrstuvwxyz0123456789 +-*%=<>[]()#:,.!?_";

static bool allowed(const char *s, bool upper_ok) {
    for (const char *p = s; *p; p++) {
        if (upper_ok && *p >= 'A' && *p <= 'Z') continue;
        if (!strchr(prompt_chars, *p)) return false;
    }
    return true;
}

// --- oracles: each re-solves a prompt from its text alone ----------------------------------

// Recursive descent over digits, + - * % and parentheses with the usual precedence.
static long long ev_expr(const char **s);
static long long ev_atom(const char **s) {
    if (**s == '(') {
        (*s)++;
        long long v = ev_expr(s);
        cr_assert_eq(**s, ')');
        (*s)++;
        return v;
    }
    cr_assert(isdigit((unsigned char)**s), "bad expression at '%s'", *s);
    long long v = 0;
    while (isdigit((unsigned char)**s)) v = v * 10 + (*(*s)++ - '0');
    return v;
}
static long long ev_term(const char **s) {
    long long v = ev_atom(s);
    while (**s == '*' || **s == '%') {
        char op = *(*s)++;
        long long w = ev_atom(s);
        v = op == '*' ? v * w : v % w;
    }
    return v;
}
static long long ev_expr(const char **s) {
    long long v = ev_term(s);
    while (**s == '+' || **s == '-') {
        char op = *(*s)++;
        long long w = ev_term(s);
        v = op == '+' ? v + w : v - w;
    }
    return v;
}
// Evaluates "EXPR=" starting at s.
static long long ev_eq(const char *s) {
    long long v = ev_expr(&s);
    cr_assert_eq(*s, '=', "expression not followed by '='");
    return v;
}

static int parse_list(const char *s, long long *v) {
    int n = 0;
    for (;;) {
        char *end;
        v[n++] = strtoll(s, &end, 10);
        cr_assert(end != s);
        if (*end != ',') {
            cr_assert_eq(*end, ':');
            return n;
        }
        s = end + 1;
    }
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}
static int cmp_c(const void *a, const void *b) { return *(const char *)a - *(const char *)b; }

static void join(const long long *v, int n, char *out) {
    out[0] = '\0';
    for (int i = 0; i < n; i++) sprintf(out + strlen(out), i ? ",%lld" : "%lld", v[i]);
}

// The single word argument of "name WORD:" into w (64 bytes); returns its length.
static int word_arg(const char *arg, char *w) {
    cr_assert_eq(sscanf(arg, "%63[a-z]:", w), 1, "no word in '%s'", arg);
    return (int)strlen(w);
}


// Writes the expected answer for a prompt of task `name`; returns false for an unknown task.
static bool oracle(const char *name, const char *p, char *out) {
    char w[64], x[64];
    long long v[16], a, b;
    int n, k;
    const char *arg = strchr(p, ' ') ? strchr(p, ' ') + 1 : p;
    if (!strncmp(name, "add", 3) || !strncmp(name, "sub", 3) || !strncmp(name, "mul", 3) || !strcmp(name, "mod") ||
        !strcmp(name, "calc") || !strcmp(name, "paren") || !strcmp(name, "tcalc")) {
        sprintf(out, "%lld", ev_eq(arg));
    } else if (!strcmp(name, "inc")) {
        sprintf(out, "%lld", atoll(arg) + 1);
    } else if (!strcmp(name, "dsum")) {
        long long s = 0;
        for (const char *q = arg; isdigit((unsigned char)*q); q++) s += *q - '0';
        sprintf(out, "%lld", s);
    } else if (!strcmp(name, "rev")) {
        n = word_arg(arg, w);
        for (int i = 0; i < n; i++) out[i] = w[n - 1 - i];
        out[n] = '\0';
    } else if (!strcmp(name, "csort")) {
        n = word_arg(arg, w);
        qsort(w, (size_t)n, 1, cmp_c);
        strcpy(out, w);
    } else if (!strcmp(name, "count")) {
        char c;
        cr_assert_eq(sscanf(arg, "%c in %63[a-z]:", &c, w), 2);
        k = 0;
        for (char *q = w; *q; q++) k += *q == c;
        sprintf(out, "%d", k);
    } else if (!strcmp(name, "dedup")) {
        n = word_arg(arg, w);
        k = 0;
        for (int i = 0; i < n; i++)
            if (!memchr(w, w[i], (size_t)i)) out[k++] = w[i];
        out[k] = '\0';
    } else if (!strcmp(name, "caesar")) {
        cr_assert_eq(sscanf(arg, "%d %63[a-z]:", &k, w), 2);
        for (n = 0; w[n]; n++) out[n] = (char)('a' + (w[n] - 'a' + k) % 26);
        out[n] = '\0';
    } else if (!strcmp(name, "upper")) {
        n = word_arg(arg, w);
        for (int i = 0; i <= n; i++) out[i] = (char)toupper((unsigned char)w[i]);
    } else if (!strcmp(name, "len")) {
        sprintf(out, "%d", word_arg(arg, w));
    } else if (!strcmp(name, "vowels")) {
        n = word_arg(arg, w);
        k = 0;
        for (int i = 0; i < n; i++) k += strchr("aeiou", w[i]) != NULL;
        sprintf(out, "%d", k);
    } else if (!strcmp(name, "twice")) {
        n = word_arg(arg, w);
        for (int i = 0; i < n; i++) out[2 * i] = out[2 * i + 1] = w[i];
        out[2 * n] = '\0';
    } else if (!strcmp(name, "max") || !strcmp(name, "min") || !strcmp(name, "sum") || !strcmp(name, "spread") ||
               !strcmp(name, "second") || !strcmp(name, "sort") || !strcmp(name, "lrev") || !strcmp(name, "issort")) {
        n = parse_list(arg, v);
        long long s[16], sum = 0;
        memcpy(s, v, sizeof v);
        qsort(s, (size_t)n, sizeof s[0], cmp_ll);
        for (int i = 0; i < n; i++) sum += v[i];
        if (!strcmp(name, "max")) sprintf(out, "%lld", s[n - 1]);
        if (!strcmp(name, "min")) sprintf(out, "%lld", s[0]);
        if (!strcmp(name, "sum")) sprintf(out, "%lld", sum);
        if (!strcmp(name, "spread")) sprintf(out, "%lld", s[n - 1] - s[0]);
        if (!strcmp(name, "second")) {
            cr_assert_neq(s[n - 1], s[n - 2], "second: tie in %s", p);
            sprintf(out, "%lld", s[n - 2]);
        }
        if (!strcmp(name, "sort")) join(s, n, out);
        if (!strcmp(name, "issort")) strcpy(out, memcmp(s, v, (size_t)n * sizeof v[0]) ? "no" : "yes");
        if (!strcmp(name, "lrev")) {
            for (int i = 0; i < n; i++) s[i] = v[n - 1 - i];
            join(s, n, out);
        }
    } else if (!strcmp(name, "parity") || !strcmp(name, "maj")) {
        cr_assert_eq(sscanf(arg, "%63[01]:", w), 1);
        n = (int)strlen(w);
        k = 0;
        for (int i = 0; i < n; i++) k += w[i] == '1';
        if (!strcmp(name, "maj")) cr_assert(n % 2 == 1, "maj: even length in %s", p);
        strcpy(out, !strcmp(name, "parity") ? (k % 2 ? "1" : "0") : (2 * k > n ? "1" : "0"));
    } else if (!strcmp(name, "cmp")) {
        cr_assert_eq(sscanf(arg, "%lld %lld:", &a, &b), 2);
        strcpy(out, a < b ? "<" : a > b ? ">" : "=");
    } else if (!strcmp(name, "pal")) {
        n = word_arg(arg, w);
        bool pal = true;
        for (int i = 0; i < n; i++) pal &= w[i] == w[n - 1 - i];
        strcpy(out, pal ? "yes" : "no");
    } else if (!strcmp(name, "xor")) {
        cr_assert_eq(sscanf(arg, "%63[01] %63[01]:", w, x), 2);
        cr_assert_eq(strlen(w), strlen(x));
        for (n = 0; w[n]; n++) out[n] = w[n] == x[n] ? '0' : '1';
        out[n] = '\0';
    } else if (!strcmp(name, "wrap")) {
        char o, c;
        cr_assert_eq(sscanf(p, "wrap in %c%c:", &o, &c), 2);
        sprintf(out, "%c%lld%c", o, ev_eq(strchr(p, ':') + 2), c);
    } else if (!strcmp(name, "words")) {
        static const char *const names[] = {"zero",     "one",     "two",     "three",     "four",
                                            "five",     "six",     "seven",   "eight",     "nine",
                                            "ten",      "eleven",  "twelve",  "thirteen",  "fourteen",
                                            "fifteen",  "sixteen", "seventeen", "eighteen"};
        a = ev_eq(arg);
        cr_assert(a >= 0 && a <= 18);
        strcpy(out, names[a]);
    } else if (!strcmp(name, "pad")) {
        cr_assert_eq(sscanf(arg, "%lld to %d:", &a, &k), 2);
        sprintf(out, "%0*lld", k, a);
    } else if (!strcmp(name, "commas")) {
        n = word_arg(arg, w);
        k = 0;
        for (int i = 0; i < n; i++) {
            if (i) out[k++] = ',';
            out[k++] = w[i];
        }
        out[k] = '\0';
    } else if (!strcmp(name, "rep")) {
        cr_assert_eq(sscanf(arg, "%d %63[a-z]:", &k, w), 2);
        out[0] = '\0';
        for (int i = 0; i < k; i++) strcat(out, w);
    } else if (!strcmp(name, "tlook")) {
        cr_assert_eq(sscanf(arg, "%63[a-z0-9]+%lld=", w, &a), 2, "tlook: '%s'", p);
        cr_assert(strlen(w) >= 1 && strlen(w) <= 8 && a >= 0, "tlook: '%s'", p);
        sprintf(out, "%lld", tu_lookup_table(w) + a);
    } else {
        return false;
    }
    return true;
}

// --- registry ------------------------------------------------------------------------------

Test(tasks, registry_is_complete_and_consistent) {
    int n = task_count();
    cr_assert_geq(n, 32);
    cr_assert_null(task_at(-1));
    cr_assert_null(task_at(n));
    cr_assert_null(task_find("no-such-task"));
    cr_assert_null(task_find(NULL));
    for (int i = 0; i < n; i++) {
        const task_t *t = task_at(i);
        cr_assert_not_null(t);
        cr_assert(t->name && *t->name && t->description && *t->description && t->generate && t->verify);
        cr_assert_eq(task_find(t->name), t, "task_find(%s)", t->name);
        cr_assert(!strcmp(t->family, "arithmetic") || !strcmp(t->family, "string") || !strcmp(t->family, "list") ||
                      !strcmp(t->family, "logic") || !strcmp(t->family, "format") || !strcmp(t->family, "tools"),
                  "%s: family %s", t->name, t->family);
        for (int j = 0; j < i; j++) cr_assert_str_neq(task_at(j)->name, t->name);
    }
    static const char *const required[] = {"add1", "add2", "add3", "sub2", "mul1", "mul2", "mod",  "calc",
                                           "rev",  "csort", "count", "dedup", "caesar", "upper", "max", "min",
                                           "sum",  "sort", "second", "parity", "cmp", "maj", "wrap", "words",
                                           "tcalc", "tlook"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        cr_assert_not_null(task_find(required[i]), "missing %s", required[i]);
}

// The registry order is part of the contract: new families go last, so the index of a task
// never moves (a task index may be stored), and tasks with tools are exactly those of the
// "tools" family, each with both an environment and a trace.
Test(tasks, registry_order_and_tool_members) {
    static const char *const first[] = {"add1", "add2", "add3", "add4", "sub1", "sub2", "sub3", "mul1", "mul21",
                                        "mul2", "mod",  "calc", "paren", "inc", "dsum", "rev", "csort", "count",
                                        "dedup", "caesar", "upper", "len", "vowels", "twice", "max", "min", "sum",
                                        "sort", "second", "lrev", "spread", "parity", "cmp", "maj", "pal", "xor",
                                        "issort", "wrap", "words", "pad", "commas", "rep", "tcalc", "tlook"};
    int n = (int)(sizeof first / sizeof first[0]);
    cr_assert_geq(task_count(), n);
    for (int i = 0; i < n; i++) cr_assert_str_eq(task_at(i)->name, first[i], "task %d", i);
    int tools = 0;
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        bool fam = !strcmp(t->family, "tools");
        cr_assert_eq(t->env != NULL, fam, "%s: env", t->name);
        cr_assert_eq(t->trace != NULL, fam, "%s: trace", t->name);
        tools += fam;
    }
    cr_assert_geq(tools, 2);
}

Test(tasks, every_task_has_an_oracle) {
    char out[128];
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        task_example_t ex = {0};
        task_example(t, TASK_TRAIN, 0, &ex);
        cr_assert(oracle(t->name, ex.prompt, out), "no oracle for %s: add one to test_tasks.c", t->name);
        task_example_free(&ex);
    }
}

// --- generators ----------------------------------------------------------------------------

Test(tasks, generators_are_deterministic) {
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        for (int s = 0; s < 2; s++)
            for (uint64_t k = 0; k < N_EXAMPLES; k++) {
                task_example_t a = {0}, b = {0};
                task_example(t, (task_split_t)s, k, &a);
                task_example(t, (task_split_t)s, k, &b);
                cr_assert_str_eq(a.prompt, b.prompt, "%s split %d index %llu", t->name, s, (unsigned long long)k);
                cr_assert_str_eq(a.answer, b.answer, "%s", t->name);
                task_example_free(&a);
                task_example_free(&b);
            }
        // The raw generator too, for seeds far apart.
        uint64_t seeds[] = {0, 1, 12345, 1ull << 40, ~0ull};
        for (size_t j = 0; j < sizeof seeds / sizeof seeds[0]; j++) {
            task_example_t a = {0}, b = {0};
            t->generate(seeds[j], &a);
            t->generate(seeds[j], &b);
            cr_assert_str_eq(a.prompt, b.prompt, "%s", t->name);
            cr_assert_str_eq(a.answer, b.answer, "%s", t->name);
            task_example_free(&a);
            task_example_free(&b);
        }
    }
}

Test(tasks, seeds_of_splits_are_disjoint) {
    for (uint64_t k = 0; k < 1000; k++) {
        cr_assert_eq(task_seed(TASK_TRAIN, k), k);
        cr_assert_neq(task_seed(TASK_EVAL, k), k);
        cr_assert(task_seed(TASK_EVAL, k) >> 63);
    }
    cr_assert_eq(task_seed(TASK_TRAIN, ~0ull) >> 63, 0);
    cr_assert_eq(task_seed(TASK_EVAL, 0) >> 63, 1);
}

Test(tasks, train_and_eval_prompts_never_meet) {
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        char *train[N_EXAMPLES];
        int distinct = 0;
        for (uint64_t k = 0; k < N_EXAMPLES; k++) {
            task_example_t tr = {0}, ev = {0};
            task_example(t, TASK_TRAIN, k, &tr);
            task_example(t, TASK_EVAL, k, &ev);
            cr_assert_str_neq(tr.prompt, ev.prompt, "%s index %llu", t->name, (unsigned long long)k);
            cr_assert_eq(task_prompt_split(tr.prompt), TASK_TRAIN, "%s: %s", t->name, tr.prompt);
            cr_assert_eq(task_prompt_split(ev.prompt), TASK_EVAL, "%s: %s", t->name, ev.prompt);
            bool seen = false;
            for (uint64_t j = 0; j < k; j++) seen |= !strcmp(train[j], tr.prompt);
            distinct += !seen;
            train[k] = tr.prompt;
            free(tr.answer);
            task_example_free(&ev);
        }
        // A generator that ignored its seed would pass every other test.
        cr_assert_geq(distinct, 20, "%s: only %d distinct prompts in %d", t->name, distinct, N_EXAMPLES);
        for (int k = 0; k < N_EXAMPLES; k++) free(train[k]);
    }
}

Test(tasks, prompt_split_hash_is_about_one_in_ten) {
    int eval = 0;
    char buf[32];
    for (int i = 0; i < 10000; i++) {
        snprintf(buf, sizeof buf, "p%d", i);
        eval += task_prompt_split(buf) == TASK_EVAL;
    }
    cr_assert(eval > 800 && eval < 1200, "%d of 10000", eval);
}

Test(tasks, prompts_use_the_alphabet_and_fit) {
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        for (int s = 0; s < 2; s++)
            for (uint64_t k = 0; k < N_EXAMPLES; k++) {
                task_example_t ex = {0};
                task_example(t, (task_split_t)s, k, &ex);
                size_t pl = strlen(ex.prompt), al = strlen(ex.answer);
                cr_assert(pl > 0 && al > 0, "%s: empty prompt or answer", t->name);
                cr_assert_leq(pl + al, MAX_TEXT, "%s: '%s' + '%s' too long", t->name, ex.prompt, ex.answer);
                cr_assert(allowed(ex.prompt, false), "%s: prompt '%s'", t->name, ex.prompt);
                // "upper" is the one family whose answers are uppercase.
                cr_assert(allowed(ex.answer, !strcmp(t->name, "upper")), "%s: answer '%s'", t->name, ex.answer);
                cr_assert(ex.prompt[pl - 1] == ':' || ex.prompt[pl - 1] == '=', "%s: '%s' must end with : or =",
                          t->name, ex.prompt);
                cr_assert(ex.answer[0] != ' ' && ex.answer[al - 1] != ' ', "%s: answer '%s'", t->name, ex.answer);
                task_example_free(&ex);
            }
    }
}

// The first word tells tasks apart; only difficulty variants of one operation (add1, add2,
// ...: the name without its trailing digits) share it, and then it is that operation's name.
static void first_word(const char *p, char *out) {
    size_t n = strcspn(p, " ");
    memcpy(out, p, n);
    out[n] = '\0';
}

static void stem(const char *name, char *out) {
    size_t n = strlen(name);
    while (n > 0 && isdigit((unsigned char)name[n - 1])) n--;
    memcpy(out, name, n);
    out[n] = '\0';
}

Test(tasks, prompt_prefixes_identify_tasks) {
    int n = task_count();
    char wi[64], wj[64], si[64], sj[64];
    for (int i = 0; i < n; i++) {
        task_example_t a = {0};
        task_example(task_at(i), TASK_TRAIN, 0, &a);
        first_word(a.prompt, wi);
        stem(task_at(i)->name, si);
        for (int j = 0; j < i; j++) {
            task_example_t b = {0};
            task_example(task_at(j), TASK_TRAIN, 0, &b);
            first_word(b.prompt, wj);
            stem(task_at(j)->name, sj);
            if (!strcmp(wi, wj))
                cr_assert(!strcmp(si, sj) && !strcmp(si, wi), "%s and %s share the prefix '%s'", task_at(i)->name,
                          task_at(j)->name, wi);
            task_example_free(&b);
        }
        task_example_free(&a);
    }
}

Test(tasks, answers_match_oracles) {
    char want[128];
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        for (int s = 0; s < 2; s++)
            for (uint64_t k = 0; k < N_EXAMPLES; k++) {
                task_example_t ex = {0};
                task_example(t, (task_split_t)s, k, &ex);
                cr_assert(oracle(t->name, ex.prompt, want));
                cr_assert_str_eq(ex.answer, want, "%s: '%s' answered '%s', expected '%s'", t->name, ex.prompt,
                                 ex.answer, want);
                task_example_free(&ex);
            }
    }
}

// --- verifiers -----------------------------------------------------------------------------

static char *cat(const char *a, const char *b) {
    char *s = malloc(strlen(a) + strlen(b) + 1);
    strcpy(s, a);
    strcat(s, b);
    return s;
}

// A different answer of the same shape: the last character changed.
static char *wrong(const char *ans) {
    char *s = strdup(ans);
    char *c = s + strlen(s) - 1;
    if (isdigit((unsigned char)*c)) *c = (char)('0' + (*c - '0' + 1) % 10);
    else if (islower((unsigned char)*c)) *c = (char)('a' + (*c - 'a' + 1) % 26);
    else if (isupper((unsigned char)*c)) *c = (char)('A' + (*c - 'A' + 1) % 26);
    else *c = *c == 'x' ? 'y' : 'x';
    return s;
}

static char *swap_case(const char *ans) {
    char *s = strdup(ans);
    for (char *c = s; *c; c++) *c = (char)(islower((unsigned char)*c) ? toupper((unsigned char)*c) : tolower((unsigned char)*c));
    return s;
}

static void expect(const task_t *t, const task_example_t *ex, const char *completion, float want, const char *what) {
    float got = t->verify(ex, completion);
    cr_assert(got >= 0.0f && got <= 1.0f, "%s: reward %f out of range", t->name, (double)got);
    cr_assert_eq(got, want, "%s: '%s' (answer '%s') with %s: reward %f, expected %f", t->name, ex->prompt, ex->answer,
                 what, (double)got, (double)want);
}

Test(tasks, verifiers_accept_the_answer_in_any_padding) {
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        for (uint64_t k = 0; k < N_EXAMPLES; k++) {
            task_example_t ex = {0};
            task_example(t, k % 2 ? TASK_EVAL : TASK_TRAIN, k, &ex);
            const char *a = ex.answer;
            char buf[256];
            expect(t, &ex, a, 1.0f, "the answer");
            snprintf(buf, sizeof buf, "%s\n garbage", a);
            expect(t, &ex, buf, 1.0f, "'\\n garbage' after it");
            snprintf(buf, sizeof buf, "  %s   ", a);
            expect(t, &ex, buf, 1.0f, "surrounding spaces");
            snprintf(buf, sizeof buf, "\t%s\r\n%s", a, "x");
            expect(t, &ex, buf, 1.0f, "tab before, CRLF after");
            snprintf(buf, sizeof buf, "%s\n", a);
            expect(t, &ex, buf, 1.0f, "a trailing newline");
            task_example_free(&ex);
        }
    }
}

Test(tasks, verifiers_refuse_wrong_and_malformed_completions) {
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        for (uint64_t k = 0; k < N_EXAMPLES; k++) {
            task_example_t ex = {0};
            task_example(t, k % 2 ? TASK_EVAL : TASK_TRAIN, k, &ex);
            const char *a = ex.answer;
            char *owned[] = {
                wrong(a),          cat(a, " x"),   cat(a, "x"),        cat("0", a),  cat("00", a),
                cat("+", a),       cat("-", a),    cat(a, ".0"),       cat(a, a),    cat("\n", a),
                cat(a, "\xc3\xa9"), cat("\xc3\xa9", a), cat(a, "\xa0"), cat("x", a), cat(a, ","),
                swap_case(a),
            };
            const char *what[] = {"a wrong answer", "' x' after it", "'x' after it", "a leading zero",
                                  "two leading zeros", "a '+' sign", "a '-' sign", "'.0' after it",
                                  "the answer twice", "a newline first", "UTF-8 after it", "UTF-8 before it",
                                  "a Latin-1 space after it", "'x' before it", "',' after it", "swapped case"};
            for (size_t j = 0; j < sizeof owned / sizeof owned[0]; j++) {
                // Swapping the case of digits or symbols changes nothing: not a wrong answer.
                if (!strcmp(owned[j], a)) continue;
                expect(t, &ex, owned[j], 0.0f, what[j]);
            }
            for (size_t j = 0; j < sizeof owned / sizeof owned[0]; j++) free(owned[j]);
            if (strlen(a) >= 2) {
                char buf[128];
                snprintf(buf, sizeof buf, "%c %s", a[0], a + 1);
                expect(t, &ex, buf, 0.0f, "a space inside");
            }
            static const char *const fixed[] = {"",
                                                " ",
                                                "   \t  ",
                                                "\n",
                                                "\r\n",
                                                "99999999999999999999999",
                                                "-99999999999999999999999",
                                                "9223372036854775808",
                                                "-9223372036854775809",
                                                "\xff\xfe",
                                                "\x80",
                                                "\xc3\xa9\xe2\x82\xac",
                                                "-",
                                                "--1",
                                                "nan",
                                                "0x10",
                                                "1e3"};
            for (size_t j = 0; j < sizeof fixed / sizeof fixed[0]; j++) expect(t, &ex, fixed[j], 0.0f, "a fixed string");
            cr_assert_eq(t->verify(&ex, NULL), 0.0f, "%s: NULL completion", t->name);
            task_example_free(&ex);
        }
    }
}

Test(tasks, verifiers_survive_megabyte_completions) {
    char *big = malloc(MB + 64);
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        task_example_t ex = {0};
        task_example(t, TASK_TRAIN, 7, &ex);
        size_t al = strlen(ex.answer);

        memset(big, '9', MB);
        big[MB] = '\0';
        expect(t, &ex, big, 0.0f, "1 MB of 9s");
        memset(big, 'a', MB);
        expect(t, &ex, big, 0.0f, "1 MB of 'a'");
        // Every byte value but NUL, no newline: nothing gets cut.
        for (size_t j = 0; j < MB; j++) big[j] = (char)(1 + (j * 2654435761u >> 7) % 255);
        for (size_t j = 0; j < MB; j++)
            if (big[j] == '\n') big[j] = 'n';
        expect(t, &ex, big, 0.0f, "1 MB of random bytes");
        memcpy(big, ex.answer, al);
        memset(big + al, 'x', MB - al);
        expect(t, &ex, big, 0.0f, "the answer then 1 MB of 'x'");
        memset(big + al, ' ', MB - al);
        expect(t, &ex, big, 1.0f, "the answer then 1 MB of spaces");
        memset(big, ' ', MB);
        memcpy(big + MB - al, ex.answer, al);
        expect(t, &ex, big, 1.0f, "1 MB of spaces then the answer");
        big[MB - al - 1] = '\n';
        expect(t, &ex, big, 0.0f, "spaces, a newline, then the answer");
        task_example_free(&ex);
    }
    free(big);
}

Test(tasks, verifiers_refuse_broken_examples) {
    // A verifier only trusts its example as far as not crashing: a NULL or non-numeric answer
    // scores 0 rather than failing.
    for (int i = 0; i < task_count(); i++) {
        const task_t *t = task_at(i);
        task_example_t none = {0};
        cr_assert_eq(t->verify(&none, "1"), 0.0f, "%s", t->name);
        cr_assert_eq(t->verify(NULL, "1"), 0.0f, "%s", t->name);
    }
}

// --- shared helpers ------------------------------------------------------------------------

Test(tasks, answer_span_cuts_and_trims) {
    size_t n;
    const char *s = task_answer_span("  42 \t\r\nrest", &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(strncmp(s, "42", 2), 0);
    s = task_answer_span("", &n);
    cr_assert_eq(n, 0);
    s = task_answer_span(NULL, &n);
    cr_assert_eq(n, 0);
    cr_assert_not_null(s);
    s = task_answer_span("\nabc", &n);
    cr_assert_eq(n, 0);
    s = task_answer_span("a b", &n);
    cr_assert_eq(n, 3);
}

Test(tasks, parse_int_is_strict) {
    static const struct {
        const char *s;
        int rc;
        long long v;
    } cases[] = {
        {"0", 0, 0},
        {"7", 0, 7},
        {"-5", 0, -5},
        {"123456789012345678", 0, 123456789012345678LL},
        {"-999999999999999999", 0, -999999999999999999LL},
        {"1234567890123456789", -1, 0},
        {"99999999999999999999999", -1, 0},
        {"007", -1, 0},
        {"00", -1, 0},
        {"-0", -1, 0},
        {"+5", -1, 0},
        {"", -1, 0},
        {"-", -1, 0},
        {"5 ", -1, 0},
        {" 5", -1, 0},
        {"5a", -1, 0},
        {"1.0", -1, 0},
        {"1e3", -1, 0},
        {"\xff", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t v = 12345;
        int rc = task_parse_int(cases[i].s, strlen(cases[i].s), &v);
        cr_assert_eq(rc, cases[i].rc, "'%s'", cases[i].s);
        if (rc == 0) cr_assert_eq(v, cases[i].v, "'%s'", cases[i].s);
    }
    int64_t v;
    cr_assert_eq(task_parse_int("12", 1, &v), 0, "only len bytes are read");
    cr_assert_eq(v, 1);
}

// tasks_tools.c - tool-using task families (multi-turn): the model calls the calculator
// "<c:EXPR>" or the lookup table "<k:KEY>", the environment (env.c) answers "=VALUE ", and only
// the final answer after the last observation is checked (strict integer).
//
// Each task is built so that the tool is what makes it solvable for a small character model:
// tcalc needs a two-digit product a character model cannot form in its head, tlook a value
// that only the table knows. Their traces are what a perfect tool user writes; pretraining
// learns the format from them (cmd_pretrain.c).
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/tasks/env.h"
#include "common/tasks/tasks_internal.h"

// A trace under construction: text and the matching is_obs flags, refusing to overrun cap.
typedef struct {
    char *text;
    uint8_t *is_obs;
    size_t cap, n;
    bool over;
} trace_buf_t;

static void trace_put(trace_buf_t *b, uint8_t obs, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void trace_put(trace_buf_t *b, uint8_t obs, const char *fmt, ...) {
    char s[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s, sizeof s, fmt, ap);
    va_end(ap);
    if (b->over || k < 0 || (size_t)k >= sizeof s || b->n + (size_t)k + 1 > b->cap) {
        b->over = true;
        return;
    }
    memcpy(b->text + b->n, s, (size_t)k);
    if (b->is_obs) memset(b->is_obs + b->n, obs, (size_t)k);
    b->n += (size_t)k;
    b->text[b->n] = '\0';
}

static int trace_end(trace_buf_t *b) { return b->over ? -1 : (int)b->n; }

static float verify_tools(const task_example_t *ex, const char *completion) {
    return task_verify_int(ex, completion ? env_final_answer(completion) : NULL);
}

static void set_int(task_example_t *ex, int64_t answer, const char *prompt) {
    char a[24];
    snprintf(a, sizeof a, "%lld", (long long)answer);
    task_set(ex, a, "%s", prompt);
}

// "tcalc 37*48+125=" -> 1901: a and b two-digit, c three-digit.
static void gen_tcalc(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t a = task_rand_digits(&r, 2), b = task_rand_digits(&r, 2), c = task_rand_digits(&r, 3);
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "tcalc %lld*%lld+%lld=", (long long)a, (long long)b, (long long)c);
    set_int(ex, a * b + c, p);
}

// "<c:37*48>=1776 <c:1776+125>=1901 1901"
static int trace_tcalc(const task_example_t *ex, char *text, size_t cap, uint8_t *is_obs) {
    long long a, b, c;
    int end = 0;
    if (!ex || !ex->prompt || !text || cap == 0 ||
        sscanf(ex->prompt, "tcalc %lld*%lld+%lld=%n", &a, &b, &c, &end) != 3 || ex->prompt[end] != '\0' ||
        a < 0 || a > 99 || b < 0 || b > 99 || c < 0 || c > 999)
        return -1;
    trace_buf_t tb = {.text = text, .is_obs = is_obs, .cap = cap};
    text[0] = '\0';
    trace_put(&tb, 0, "<c:%lld*%lld>", a, b);
    trace_put(&tb, 1, "=%lld ", a * b);
    trace_put(&tb, 0, "<c:%lld+%lld>", a * b, c);
    trace_put(&tb, 1, "=%lld ", a * b + c);
    trace_put(&tb, 0, "%lld", a * b + c);
    return trace_end(&tb);
}

// "tlook qz7+12=" -> the table's value of qz7, plus 12. Keys are 3-5 characters of [a-z0-9]
// starting with a letter (so a key never reads as a number), the addend 1-99.
static void gen_tlook(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char key[8];
    int n = (int)task_rand_range(&r, 3, 5);
    task_rand_word(&r, "abcdefghijklmnopqrstuvwxyz", 1, key);
    task_rand_word(&r, "abcdefghijklmnopqrstuvwxyz0123456789", n - 1, key + 1);
    int64_t add = task_rand_range(&r, 1, 99), v = 0;
    ASSERT(env_lookup(key, strlen(key), &v) == 0);
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "tlook %s+%lld=", key, (long long)add);
    set_int(ex, v + add, p);
}

// "<k:qz7>=418 <c:418+12>=430 430"
static int trace_tlook(const task_example_t *ex, char *text, size_t cap, uint8_t *is_obs) {
    char key[9];
    long long add;
    int end = 0;
    int64_t v;
    if (!ex || !ex->prompt || !text || cap == 0 ||
        sscanf(ex->prompt, "tlook %8[a-z0-9]+%lld=%n", key, &add, &end) != 2 || ex->prompt[end] != '\0' ||
        add < 0 || add > 99 || env_lookup(key, strlen(key), &v))
        return -1;
    trace_buf_t tb = {.text = text, .is_obs = is_obs, .cap = cap};
    text[0] = '\0';
    trace_put(&tb, 0, "<k:%s>", key);
    trace_put(&tb, 1, "=%lld ", (long long)v);
    trace_put(&tb, 0, "<c:%lld+%lld>", (long long)v, add);
    trace_put(&tb, 1, "=%lld ", (long long)v + add);
    trace_put(&tb, 0, "%lld", (long long)v + add);
    return trace_end(&tb);
}

#define TOOLS(name_, gen, trace_, desc)                                                                      \
    {.name = name_, .family = "tools", .description = desc, .generate = gen, .verify = verify_tools,            \
     .env = task_env_tools, .trace = trace_}

const task_t task_tools_table[] = {
    TOOLS("tcalc", gen_tcalc, trace_tcalc,
          "a*b+c with the calculator tool <c:EXPR>: 'tcalc 37*48+125=' -> 1901"),
    TOOLS("tlook", gen_tlook, trace_tlook,
          "a key's value from the lookup tool <k:KEY>, plus a number: 'tlook qz7+12=' -> value + 12"),
};
const int task_tools_count = (int)(sizeof task_tools_table / sizeof task_tools_table[0]);

// env.c - the built-in tool environment of multi-turn tasks: the integer calculator ('c'), the
// fixed key-value table ('k'), stepping an episode transcript and finding its final answer.
//
// Everything here reads model output, so every function takes arbitrary bytes: a call is at
// most ENV_ARG_MAX characters, the calculator refuses input over CALC_MAX_LEN bytes and
// nesting deeper than CALC_MAX_DEPTH, and no arithmetic is allowed to overflow.
#include "common/tasks/env.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/tasks/tasks_internal.h"

// Longest argument of a call (the text between "<c:" and ">"); a longer call gets "=ERR ".
#define ENV_ARG_MAX 40
// The calculator's own limits, independent of the call length, for callers that hand it
// other text (examples/env_service.c evaluates prompts with it).
#define CALC_MAX_LEN 256
#define CALC_MAX_DEPTH 32

// --- calculator ----------------------------------------------------------------------------

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
} calc_t;

static void calc_skip(calc_t *c) {
    while (c->i < c->n && c->s[c->i] == ' ') c->i++;
}

static int calc_expr(calc_t *c, int64_t *v);

// primary := number | '(' expr ')' | '-' primary. Unary minus binds tighter than * / %, as in
// C; with truncating division the value is the same either way, only overflow could differ.
static int calc_primary(calc_t *c, int64_t *v) {
    calc_skip(c);
    if (c->i >= c->n) return -1;
    char ch = c->s[c->i];
    if (ch == '(' || ch == '-') {
        if (++c->depth > CALC_MAX_DEPTH) return -1;
        c->i++;
        int rc;
        if (ch == '(') {
            rc = calc_expr(c, v);
            calc_skip(c);
            if (rc == 0 && (c->i >= c->n || c->s[c->i] != ')')) rc = -1;
            c->i++;
        } else {
            rc = calc_primary(c, v);
            if (rc == 0 && *v == INT64_MIN) rc = -1;
            if (rc == 0) *v = -*v;
        }
        c->depth--;
        return rc;
    }
    if (ch < '0' || ch > '9') return -1;
    // A literal must fit int64_t by itself: INT64_MIN is reachable only as an expression
    // (-9223372036854775807-1), as in C.
    int64_t x = 0;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
        int d = c->s[c->i++] - '0';
        if (x > (INT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

// term := primary (('*' | '/' | '%') primary)*
static int calc_term(calc_t *c, int64_t *v) {
    if (calc_primary(c, v)) return -1;
    for (;;) {
        calc_skip(c);
        if (c->i >= c->n) return 0;
        char op = c->s[c->i];
        if (op != '*' && op != '/' && op != '%') return 0;
        c->i++;
        int64_t w;
        if (calc_primary(c, &w)) return -1;
        if (op == '*') {
            if (__builtin_mul_overflow(*v, w, v)) return -1;
        } else {
            // INT64_MIN / -1 overflows, and INT64_MIN % -1 is undefined in C: both refused.
            if (w == 0 || (*v == INT64_MIN && w == -1)) return -1;
            *v = op == '/' ? *v / w : *v % w;
        }
    }
}

// expr := term (('+' | '-') term)*
static int calc_expr(calc_t *c, int64_t *v) {
    if (calc_term(c, v)) return -1;
    for (;;) {
        calc_skip(c);
        if (c->i >= c->n) return 0;
        char op = c->s[c->i];
        if (op != '+' && op != '-') return 0;
        c->i++;
        int64_t w;
        if (calc_term(c, &w)) return -1;
        if (op == '+' ? __builtin_add_overflow(*v, w, v) : __builtin_sub_overflow(*v, w, v)) return -1;
    }
}

int env_calc(const char *expr, size_t len, int64_t *out) {
    if (!expr || len == 0 || len > CALC_MAX_LEN) return -1;
    calc_t c = {.s = expr, .n = len};
    int64_t v;
    if (calc_expr(&c, &v)) return -1;
    calc_skip(&c);
    if (c.i != c.n) return -1;   // trailing text, a stray ')', a NUL inside len, ...
    if (out) *out = v;
    return 0;
}

// --- lookup table --------------------------------------------------------------------------

int env_lookup(const char *key, size_t len, int64_t *out) {
    if (!key || len < 1 || len > 8) return -1;
    // FNV-1a over the key, then the splitmix64 finaliser (FNV alone leaves short keys that
    // differ in one character close together mod 900).
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        char ch = key[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))) return -1;
        h ^= (unsigned char)ch;
        h *= 0x100000001b3ull;
    }
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    if (out) *out = 100 + (int64_t)(h % 900);
    return 0;
}

// --- episodes ------------------------------------------------------------------------------

// The tools every built-in tool task offers. A transcript that ends with '>' ends with a call:
// its text runs from the last '<' of the turn to that '>'; anything that is not "<c:EXPR>" or
// "<k:KEY>" with a valid argument of at most ENV_ARG_MAX characters (no '<' at all, an unknown
// tool letter, no ':', a bad expression or key) is answered "=ERR ", so the model learns its
// call failed and may go on. A transcript that does not end with '>' is not a call: 0.
int task_env_tools(const task_example_t *ex, const char *transcript, char *obs, size_t cap) {
    (void)ex;
    size_t n = strlen(transcript);
    if (n == 0 || transcript[n - 1] != '>') return 0;
    // j: the first character after the call's '<'; the scan stops at the previous call's '>'.
    size_t j = n - 1;
    while (j > 0 && transcript[j - 1] != '<' && transcript[j - 1] != '>') j--;
    int64_t v;
    int rc = -1;
    if (j > 0 && transcript[j - 1] == '<' && n - 1 - j >= 2 && transcript[j + 1] == ':') {
        const char *arg = transcript + j + 2;
        size_t len = n - 1 - (j + 2);
        if (len <= ENV_ARG_MAX) {
            if (transcript[j] == 'c') rc = env_calc(arg, len, &v);
            else if (transcript[j] == 'k') rc = env_lookup(arg, len, &v);
        }
    }
    if (rc == 0) snprintf(obs, cap, "=%" PRId64 " ", v);
    else snprintf(obs, cap, "=ERR ");
    return 1;
}

int env_step(const task_t *t, const task_example_t *ex, const char *transcript, char *obs, size_t cap) {
    if (!t || !t->env) return -1;
    // The task writes into a buffer of the documented size; the caller gets what fits of it.
    char o[ENV_OBS_MAX] = "";
    int rc = t->env(ex, transcript ? transcript : "", o, sizeof o) == 1 ? 1 : 0;
    if (obs && cap) snprintf(obs, cap, "%s", rc ? o : "");
    return rc;
}

// Observations are "=VALUE " right after a call's '>', and a value never holds a space, so the
// last observation of a line is its last ">=" up to the next space. The search stays in the
// first line: a newline ends a model turn and with it the episode, so nothing after it is
// part of the answer (the same cut every verifier makes).
const char *env_final_answer(const char *transcript) {
    if (!transcript) return "";
    size_t line = strcspn(transcript, "\n");
    const char *obs = NULL;
    for (size_t i = 0; i + 1 < line; i++)
        if (transcript[i] == '>' && transcript[i + 1] == '=') obs = transcript + i + 2;
    if (!obs) return transcript;
    const char *end = transcript + line;
    while (obs < end && *obs != ' ') obs++;
    return obs < end ? obs + 1 : end;
}

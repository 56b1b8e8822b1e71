// tasks.c - the registry of built-in task families, seeds and splits, and the helpers the
// family files (tasks_arith.c, tasks_text.c, tasks_list.c, tasks_logic.c, tasks_format.c,
// tasks_tools.c) share: random draws, example construction, answer spans and the exact /
// integer verifiers.
#include "common/tasks/tasks_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// --- registry ------------------------------------------------------------------------------

typedef struct {
    const task_t *tasks;
    const int *count;
} task_group_t;

// The one registry: every built-in family, in this order. Adding a family file means adding
// its table here and in tasks_internal.h; a new family goes last, so that the index of every
// existing task stays what it was.
static const task_group_t registry[] = {
    {task_arith_table, &task_arith_count}, {task_text_table, &task_text_count},
    {task_list_table, &task_list_count},   {task_logic_table, &task_logic_count},
    {task_format_table, &task_format_count}, {task_tools_table, &task_tools_count},
};
#define N_GROUPS ((int)(sizeof registry / sizeof registry[0]))

int task_count(void) {
    int n = 0;
    for (int g = 0; g < N_GROUPS; g++) n += *registry[g].count;
    return n;
}

const task_t *task_at(int i) {
    if (i < 0) return NULL;
    for (int g = 0; g < N_GROUPS; g++) {
        if (i < *registry[g].count) return &registry[g].tasks[i];
        i -= *registry[g].count;
    }
    return NULL;
}

const task_t *task_find(const char *name) {
    if (!name) return NULL;
    for (int g = 0; g < N_GROUPS; g++)
        for (int i = 0; i < *registry[g].count; i++)
            if (strcmp(registry[g].tasks[i].name, name) == 0) return &registry[g].tasks[i];
    return task_sim_find(name);
}

// --- seeds and splits ----------------------------------------------------------------------

#define SEED_EVAL_BIT (1ull << 63)
// Enough redraws that a family with one eval prompt in ten misses with probability 0.9^256;
// a family with no eval prompt at all (none today; the tests check) would take the last draw.
#define SPLIT_TRIES 256

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t task_seed(task_split_t split, uint64_t index) {
    return split == TASK_EVAL ? index | SEED_EVAL_BIT : index & ~SEED_EVAL_BIT;
}

task_split_t task_prompt_split(const char *prompt) {
    // FNV-1a alone clusters similar short strings mod 10; the final mix spreads them.
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)(prompt ? prompt : ""); *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return mix64(h) % 10 == 0 ? TASK_EVAL : TASK_TRAIN;
}

void task_example(const task_t *t, task_split_t split, uint64_t index, task_example_t *ex) {
    ASSERT(t != NULL && ex != NULL);
    uint64_t seed = task_seed(split, index);
    for (int k = 0;; k++) {
        t->generate(seed, ex);
        if (k == SPLIT_TRIES - 1 || task_prompt_split(ex->prompt) == split) return;
        task_example_free(ex);
        seed = (mix64(seed) & ~SEED_EVAL_BIT) | (seed & SEED_EVAL_BIT);
    }
}

void task_example_free(task_example_t *ex) {
    if (!ex) return;
    free(ex->prompt);
    free(ex->answer);
    ex->prompt = NULL;
    ex->answer = NULL;
}

// --- generator helpers ---------------------------------------------------------------------

int64_t task_rand_range(rng_t *r, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(rng_next(r) % span);
}

int64_t task_rand_digits(rng_t *r, int digits) {
    ASSERT(digits >= 1 && digits <= 18);
    if (digits == 1) return task_rand_range(r, 0, 9);
    int64_t lo = 1;
    for (int i = 1; i < digits; i++) lo *= 10;
    return task_rand_range(r, lo, lo * 10 - 1);
}

void task_rand_word(rng_t *r, const char *alphabet, int n, char *out) {
    int k = (int)strlen(alphabet);
    for (int i = 0; i < n; i++) out[i] = alphabet[task_rand_range(r, 0, k - 1)];
    out[n] = '\0';
}

void task_rand_alphabet(rng_t *r, int k, char *out) {
    ASSERT(k >= 1 && k <= 26);
    char all[26];
    for (int i = 0; i < 26; i++) all[i] = (char)('a' + i);
    for (int i = 0; i < k; i++) {   // partial Fisher-Yates
        int j = (int)task_rand_range(r, i, 25);
        char c = all[i];
        all[i] = all[j];
        all[j] = c;
        out[i] = all[i];
    }
    out[k] = '\0';
}

void task_set(task_example_t *ex, const char *answer, const char *prompt_fmt, ...) {
    char buf[TASK_MAX_TEXT * 2];
    va_list ap;
    va_start(ap, prompt_fmt);
    int n = vsnprintf(buf, sizeof buf, prompt_fmt, ap);
    va_end(ap);
    ASSERT(n >= 0 && (size_t)n < sizeof buf);
    ex->prompt = xstrdup(buf);
    ex->answer = xstrdup(answer);
}

char *task_join_ints(const int64_t *v, int n, char *out) {
    char *p = out;
    for (int i = 0; i < n; i++) p += sprintf(p, i ? ",%lld" : "%lld", (long long)v[i]);
    *p = '\0';
    return out;
}

// --- verifiers -----------------------------------------------------------------------------

static int is_pad(char c) { return c == ' ' || c == '\t' || c == '\r'; }

const char *task_answer_span(const char *completion, size_t *len) {
    if (!completion) {
        *len = 0;
        return "";
    }
    size_t n = strcspn(completion, "\n");
    const char *s = completion;
    while (n > 0 && is_pad(*s)) s++, n--;
    while (n > 0 && is_pad(s[n - 1])) n--;
    *len = n;
    return s;
}

int task_parse_int(const char *s, size_t len, int64_t *out) {
    size_t i = 0;
    bool neg = false;
    if (i < len && s[i] == '-') neg = true, i++;
    size_t digits = len - i;
    if (digits == 0 || digits > 18) return -1;   // 18 digits always fit in int64_t
    if (s[i] == '0' && (digits > 1 || neg)) return -1;
    int64_t v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

float task_verify_exact(const task_example_t *ex, const char *completion) {
    if (!ex || !ex->answer || !completion) return 0.0f;
    size_t n;
    const char *s = task_answer_span(completion, &n);
    return n == strlen(ex->answer) && memcmp(s, ex->answer, n) == 0 ? 1.0f : 0.0f;
}

float task_verify_int(const task_example_t *ex, const char *completion) {
    if (!ex || !ex->answer || !completion) return 0.0f;
    int64_t want, got;
    if (task_parse_int(ex->answer, strlen(ex->answer), &want) != 0) return 0.0f;
    size_t n;
    const char *s = task_answer_span(completion, &n);
    return task_parse_int(s, n, &got) == 0 && got == want ? 1.0f : 0.0f;
}

// tasks_format.c - format-following task families: the content is easy, the reward depends on
// writing it exactly as the prompt asks (wrapped in brackets, spelt in words, zero-padded,
// comma-separated, repeated).
#include <stdio.h>
#include <string.h>

#include "common/tasks/tasks_internal.h"

// "wrap in []: 3+4=" -> "[7]"; the wrapper pair varies with the seed.
static void gen_wrap(uint64_t seed, task_example_t *ex) {
    static const char *const pairs[] = {"[]", "()", "<>", "##", "__"};
    rng_t r;
    rng_seed(&r, seed);
    const char *w = pairs[task_rand_range(&r, 0, 4)];
    int64_t a = task_rand_range(&r, 0, 9), b = task_rand_range(&r, 0, 9);
    bool mul = task_rand_range(&r, 0, 1);
    char ans[16];
    snprintf(ans, sizeof ans, "%c%lld%c", w[0], (long long)(mul ? a * b : a + b), w[1]);
    task_set(ex, ans, "wrap in %s: %lld%c%lld=", w, (long long)a, mul ? '*' : '+', (long long)b);
}

// "words: 2+3=" -> "five" (sums 0-18).
static void gen_words(uint64_t seed, task_example_t *ex) {
    static const char *const names[] = {"zero",    "one",     "two",       "three",    "four",
                                        "five",    "six",     "seven",     "eight",    "nine",
                                        "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                                        "fifteen", "sixteen", "seventeen", "eighteen"};
    rng_t r;
    rng_seed(&r, seed);
    int a = (int)task_rand_range(&r, 0, 9), b = (int)task_rand_range(&r, 0, 9);
    task_set(ex, names[a + b], "words: %d+%d=", a, b);
}

// "pad 7 to 3:" -> "007"; the width is sometimes the number's own (no padding at all).
static void gen_pad(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int d = (int)task_rand_range(&r, 1, 3);
    int64_t v = task_rand_digits(&r, d);
    int width = (int)task_rand_range(&r, d, 5);
    char ans[16];
    snprintf(ans, sizeof ans, "%0*lld", width, (long long)v);
    task_set(ex, ans, "pad %lld to %d:", (long long)v, width);
}

// "commas abc:" -> "a,b,c".
static void gen_commas(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[32];
    int n = (int)task_rand_range(&r, 2, 7), k = 0;
    task_rand_word(&r, "abcdefghijklmnopqrstuvwxyz", n, w);
    for (int i = 0; i < n; i++) {
        if (i) a[k++] = ',';
        a[k++] = w[i];
    }
    a[k] = '\0';
    task_set(ex, a, "commas %s:", w);
}

// "rep 3 ab:" -> "ababab".
static void gen_rep(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[8], a[16];
    int k = (int)task_rand_range(&r, 2, 4);
    int n = (int)task_rand_range(&r, 1, 3);
    task_rand_word(&r, "abcdefghijklmnopqrstuvwxyz", n, w);
    for (int i = 0; i < k; i++) memcpy(a + i * n, w, (size_t)n);
    a[k * n] = '\0';
    task_set(ex, a, "rep %d %s:", k, w);
}

#define FORMAT(name_, gen, desc) \
    {.name = name_, .family = "format", .description = desc, .generate = gen, .verify = task_verify_exact}

const task_t task_format_table[] = {
    FORMAT("wrap", gen_wrap, "answer inside the pair asked for: 'wrap in []: 3+4=' -> [7]"),
    FORMAT("words", gen_words, "a sum 0-18 spelt in words: 'words: 2+3=' -> five"),
    FORMAT("pad", gen_pad, "zero-pad a number to a width: 'pad 7 to 3:' -> 007"),
    FORMAT("commas", gen_commas, "separate letters with commas: 'commas abc:' -> a,b,c"),
    FORMAT("rep", gen_rep, "repeat a short string k times: 'rep 3 ab:' -> ababab"),
};
const int task_format_count = (int)(sizeof task_format_table / sizeof task_format_table[0]);

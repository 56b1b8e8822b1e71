// tasks_text.c - string task families over lowercase words: reverse, sort characters, count a
// character, remove repeated characters, caesar shift, uppercase, length, vowel count and
// doubling every character.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tasks/tasks_internal.h"

static const char letters[] = "abcdefghijklmnopqrstuvwxyz";

// A word whose length is drawn from [lo, hi].
static int rand_word(rng_t *r, int lo, int hi, char *out) {
    int n = (int)task_rand_range(r, lo, hi);
    task_rand_word(r, letters, n, out);
    return n;
}

// A word over a few letters, so that repeats (for count and dedup) are common.
static int rand_repetitive(rng_t *r, int lo, int hi, char *out) {
    char alpha[8];
    task_rand_alphabet(r, (int)task_rand_range(r, 2, 5), alpha);
    int n = (int)task_rand_range(r, lo, hi);
    task_rand_word(r, alpha, n, out);
    return n;
}

static void set_int(task_example_t *ex, int v, const char *prompt) {
    char ans[16];
    snprintf(ans, sizeof ans, "%d", v);
    task_set(ex, ans, "%s", prompt);
}

static void gen_rev(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[16];
    int n = rand_word(&r, 2, 8, w);
    for (int i = 0; i < n; i++) a[i] = w[n - 1 - i];
    a[n] = '\0';
    task_set(ex, a, "rev %s:", w);
}

static int cmp_char(const void *x, const void *y) { return *(const char *)x - *(const char *)y; }

static void gen_csort(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[16];
    int n = rand_word(&r, 2, 8, w);
    memcpy(a, w, (size_t)n + 1);
    qsort(a, (size_t)n, 1, cmp_char);
    task_set(ex, a, "csort %s:", w);
}

// "count a in banana:" -> 3; the letter is absent about one time in five.
static void gen_count(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16];
    int n = rand_repetitive(&r, 4, 10, w);
    char c = task_rand_range(&r, 0, 4) ? w[task_rand_range(&r, 0, n - 1)] : letters[task_rand_range(&r, 0, 25)];
    int k = 0;
    for (int i = 0; i < n; i++) k += w[i] == c;
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "count %c in %s:", c, w);
    set_int(ex, k, p);
}

static void gen_dedup(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[16];
    int n = rand_repetitive(&r, 4, 10, w), k = 0;
    for (int i = 0; i < n; i++)
        if (!memchr(a, w[i], (size_t)k)) a[k++] = w[i];
    a[k] = '\0';
    task_set(ex, a, "dedup %s:", w);
}

// "caesar 3 abc:" -> "def": each letter moves k places forward, z wraps to a.
static void gen_caesar(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[16];
    int k = (int)task_rand_range(&r, 1, 25);
    int n = rand_word(&r, 2, 6, w);
    for (int i = 0; i < n; i++) a[i] = (char)('a' + (w[i] - 'a' + k) % 26);
    a[n] = '\0';
    task_set(ex, a, "caesar %d %s:", k, w);
}

// The one family whose answers use A-Z (prompts stay lowercase).
static void gen_upper(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[16];
    int n = rand_word(&r, 2, 8, w);
    for (int i = 0; i < n; i++) a[i] = (char)(w[i] - 'a' + 'A');
    a[n] = '\0';
    task_set(ex, a, "upper %s:", w);
}

static void gen_len(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[24];
    int n = rand_word(&r, 1, 15, w);
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "len %s:", w);
    set_int(ex, n, p);
}

static void gen_vowels(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16];
    int n = rand_word(&r, 3, 10, w), k = 0;
    for (int i = 0; i < n; i++) k += strchr("aeiou", w[i]) != NULL;
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "vowels %s:", w);
    set_int(ex, k, p);
}

static void gen_twice(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char w[16], a[32];
    int n = rand_word(&r, 2, 6, w);
    for (int i = 0; i < n; i++) a[2 * i] = a[2 * i + 1] = w[i];
    a[2 * n] = '\0';
    task_set(ex, a, "twice %s:", w);
}

#define TEXT(name_, gen, verify_, desc) \
    {.name = name_, .family = "string", .description = desc, .generate = gen, .verify = verify_}

const task_t task_text_table[] = {
    TEXT("rev", gen_rev, task_verify_exact, "reverse a 2-8 letter word: 'rev abc:' -> cba"),
    TEXT("csort", gen_csort, task_verify_exact, "sort the letters of a word: 'csort dbca:' -> abcd"),
    TEXT("count", gen_count, task_verify_int, "count a letter in a word: 'count a in banana:' -> 3"),
    TEXT("dedup", gen_dedup, task_verify_exact, "drop repeated letters, keep first ones: 'dedup banana:' -> ban"),
    TEXT("caesar", gen_caesar, task_verify_exact, "shift letters k places, z wraps to a: 'caesar 3 abc:' -> def"),
    TEXT("upper", gen_upper, task_verify_exact, "uppercase a word (answers use A-Z): 'upper abc:' -> ABC"),
    TEXT("len", gen_len, task_verify_int, "length of a 1-15 letter word: 'len hello:' -> 5"),
    TEXT("vowels", gen_vowels, task_verify_int, "count the vowels aeiou: 'vowels hello:' -> 2"),
    TEXT("twice", gen_twice, task_verify_exact, "write every letter twice: 'twice abc:' -> aabbcc"),
};
const int task_text_count = (int)(sizeof task_text_table / sizeof task_text_table[0]);

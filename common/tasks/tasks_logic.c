// tasks_logic.c - logic task families: parity of a bit string, comparing two numbers, majority
// bit, palindromes, bitwise xor and "is this list sorted".
#include <stdio.h>
#include <string.h>

#include "common/tasks/tasks_internal.h"

static void rand_bits(rng_t *r, int n, char *out) { task_rand_word(r, "01", n, out); }

// "parity 10110:" -> 1 (number of ones mod 2).
static void gen_parity(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char b[16];
    int n = (int)task_rand_range(&r, 2, 10), ones = 0;
    rand_bits(&r, n, b);
    for (int i = 0; i < n; i++) ones += b[i] == '1';
    task_set(ex, ones % 2 ? "1" : "0", "parity %s:", b);
}

// "cmp 12 34:" -> "<". A quarter of the pairs are equal and a quarter share their length, so
// neither "=" nor comparing lengths alone is a shortcut.
static void gen_cmp(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t a = task_rand_range(&r, 0, 999), b;
    switch (task_rand_range(&r, 0, 3)) {
    case 0: b = a; break;
    case 1: {
        int d = a < 10 ? 1 : a < 100 ? 2 : 3;
        b = task_rand_digits(&r, d);
        break;
    }
    default: b = task_rand_range(&r, 0, 999); break;
    }
    task_set(ex, a < b ? "<" : a > b ? ">" : "=", "cmp %lld %lld:", (long long)a, (long long)b);
}

// "maj 10110:" -> 1; odd lengths only, so there is always a majority.
static void gen_maj(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char b[16];
    int n = 2 * (int)task_rand_range(&r, 1, 5) + 1, ones = 0;
    rand_bits(&r, n, b);
    for (int i = 0; i < n; i++) ones += b[i] == '1';
    task_set(ex, 2 * ones > n ? "1" : "0", "maj %s:", b);
}

// "pal abba:" -> yes. Half the words are built as palindromes (random words almost never are).
static void gen_pal(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char alpha[8], w[16];
    task_rand_alphabet(&r, (int)task_rand_range(&r, 2, 4), alpha);
    int n = (int)task_rand_range(&r, 3, 8);
    task_rand_word(&r, alpha, n, w);
    if (task_rand_range(&r, 0, 1))
        for (int i = 0; i < n / 2; i++) w[n - 1 - i] = w[i];
    bool pal = true;
    for (int i = 0; i < n / 2; i++) pal &= w[i] == w[n - 1 - i];
    task_set(ex, pal ? "yes" : "no", "pal %s:", w);
}

// "xor 1011 0110:" -> 1101 (leading zeros kept: the answer has the operands' width).
static void gen_xor(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    char a[16], b[16], x[16];
    int n = (int)task_rand_range(&r, 2, 8);
    rand_bits(&r, n, a);
    rand_bits(&r, n, b);
    for (int i = 0; i < n; i++) x[i] = a[i] == b[i] ? '0' : '1';
    x[n] = '\0';
    task_set(ex, x, "xor %s %s:", a, b);
}

// "issort 1,3,2:" -> no. Non-decreasing counts as sorted; half the lists are sorted on purpose.
static void gen_issort(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t v[6];
    int n = (int)task_rand_range(&r, 3, 6);
    for (int i = 0; i < n; i++) v[i] = task_rand_range(&r, 0, 9);
    if (task_rand_range(&r, 0, 1))
        for (int i = 1; i < n; i++)   // insertion sort: n <= 6
            for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                int64_t t = v[j];
                v[j] = v[j - 1];
                v[j - 1] = t;
            }
    bool sorted = true;
    for (int i = 1; i < n; i++) sorted &= v[i - 1] <= v[i];
    char list[6 * 21];
    task_set(ex, sorted ? "yes" : "no", "issort %s:", task_join_ints(v, n, list));
}

#define LOGIC(name_, gen, desc) \
    {.name = name_, .family = "logic", .description = desc, .generate = gen, .verify = task_verify_exact}

const task_t task_logic_table[] = {
    LOGIC("parity", gen_parity, "parity of the ones in 2-10 bits: 'parity 10110:' -> 1"),
    LOGIC("cmp", gen_cmp, "compare two numbers with <, > or =: 'cmp 12 34:' -> <"),
    LOGIC("maj", gen_maj, "majority bit of an odd-length bit string: 'maj 10110:' -> 1"),
    LOGIC("pal", gen_pal, "is the word a palindrome, yes or no: 'pal abba:' -> yes"),
    LOGIC("xor", gen_xor, "bitwise xor of two bit strings: 'xor 1011 0110:' -> 1101"),
    LOGIC("issort", gen_issort, "is the list non-decreasing, yes or no: 'issort 1,3,2:' -> no"),
};
const int task_logic_count = (int)(sizeof task_logic_table / sizeof task_logic_table[0]);

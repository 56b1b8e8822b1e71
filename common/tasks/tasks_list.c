// tasks_list.c - list task families over short comma-separated lists of numbers 0-99:
// maximum, minimum, sum, sort, second largest, reverse and spread (max - min).
#include <stdio.h>
#include <stdlib.h>

#include "common/tasks/tasks_internal.h"

#define LIST_MAX 6

static int rand_list(rng_t *r, int lo, int hi, int64_t *v) {
    int n = (int)task_rand_range(r, lo, hi);
    for (int i = 0; i < n; i++) v[i] = task_rand_range(r, 0, 99);
    return n;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

typedef enum { L_MAX, L_MIN, L_SUM, L_SPREAD } list_stat_t;

static void gen_stat(uint64_t seed, task_example_t *ex, const char *word, list_stat_t stat) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t v[LIST_MAX];
    int n = rand_list(&r, stat == L_SUM ? 2 : 3, stat == L_SUM ? 5 : LIST_MAX, v);
    int64_t mx = v[0], mn = v[0], sum = 0;
    for (int i = 0; i < n; i++) {
        mx = v[i] > mx ? v[i] : mx;
        mn = v[i] < mn ? v[i] : mn;
        sum += v[i];
    }
    int64_t a = stat == L_MAX ? mx : stat == L_MIN ? mn : stat == L_SUM ? sum : mx - mn;
    char list[LIST_MAX * 21], ans[24];
    snprintf(ans, sizeof ans, "%lld", (long long)a);
    task_set(ex, ans, "%s %s:", word, task_join_ints(v, n, list));
}

static void gen_max(uint64_t s, task_example_t *ex) { gen_stat(s, ex, "max", L_MAX); }
static void gen_min(uint64_t s, task_example_t *ex) { gen_stat(s, ex, "min", L_MIN); }
static void gen_sum(uint64_t s, task_example_t *ex) { gen_stat(s, ex, "sum", L_SUM); }
static void gen_spread(uint64_t s, task_example_t *ex) { gen_stat(s, ex, "spread", L_SPREAD); }

static void gen_sort(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t v[LIST_MAX], s[LIST_MAX];
    int n = rand_list(&r, 3, LIST_MAX, v);
    for (int i = 0; i < n; i++) s[i] = v[i];
    qsort(s, (size_t)n, sizeof s[0], cmp_i64);
    char list[LIST_MAX * 21], ans[LIST_MAX * 21];
    task_set(ex, task_join_ints(s, n, ans), "sort %s:", task_join_ints(v, n, list));
}

static void gen_lrev(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t v[LIST_MAX], s[LIST_MAX];
    int n = rand_list(&r, 3, LIST_MAX, v);
    for (int i = 0; i < n; i++) s[i] = v[n - 1 - i];
    char list[LIST_MAX * 21], ans[LIST_MAX * 21];
    task_set(ex, task_join_ints(s, n, ans), "lrev %s:", task_join_ints(v, n, list));
}

// Distinct values, so "second largest" never needs a tie rule.
static void gen_second(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t v[LIST_MAX], s[LIST_MAX];
    int n = (int)task_rand_range(&r, 3, LIST_MAX);
    for (int i = 0; i < n; i++) {
        bool dup;
        do {
            v[i] = task_rand_range(&r, 0, 99);
            dup = false;
            for (int j = 0; j < i; j++) dup |= v[j] == v[i];
        } while (dup);
        s[i] = v[i];
    }
    qsort(s, (size_t)n, sizeof s[0], cmp_i64);
    char list[LIST_MAX * 21], ans[24];
    snprintf(ans, sizeof ans, "%lld", (long long)s[n - 2]);
    task_set(ex, ans, "second %s:", task_join_ints(v, n, list));
}

#define LIST(name_, gen, verify_, desc) \
    {.name = name_, .family = "list", .description = desc, .generate = gen, .verify = verify_}

const task_t task_list_table[] = {
    LIST("max", gen_max, task_verify_int, "largest of 3-6 numbers: 'max 3,9,2:' -> 9"),
    LIST("min", gen_min, task_verify_int, "smallest of 3-6 numbers: 'min 3,9,2:' -> 2"),
    LIST("sum", gen_sum, task_verify_int, "sum of 2-5 numbers: 'sum 3,9,2:' -> 14"),
    LIST("sort", gen_sort, task_verify_exact, "sort 3-6 numbers ascending: 'sort 9,2,5:' -> 2,5,9"),
    LIST("second", gen_second, task_verify_int, "second largest of distinct numbers: 'second 3,9,2:' -> 3"),
    LIST("lrev", gen_lrev, task_verify_exact, "reverse a list: 'lrev 1,2,3:' -> 3,2,1"),
    LIST("spread", gen_spread, task_verify_int, "largest minus smallest: 'spread 3,9,2:' -> 7"),
};
const int task_list_count = (int)(sizeof task_list_table / sizeof task_list_table[0]);

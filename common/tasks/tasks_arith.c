// tasks_arith.c - arithmetic task families: n-digit addition, subtraction and multiplication
// in several difficulty variants, modulo, expressions with operator precedence, parenthesised
// expressions, increment (carry chains) and digit sums. Every answer is an integer checked
// with the strict integer verifier.
#include <stdio.h>

#include "common/tasks/tasks_internal.h"

static void set_int(task_example_t *ex, int64_t answer, const char *prompt) {
    char a[24];
    snprintf(a, sizeof a, "%lld", (long long)answer);
    task_set(ex, a, "%s", prompt);
}

// Variants of one operation share the prompt word ("add"): the operand widths already tell
// the difficulty, and a prompt never means two different answers.
static void gen_binop(uint64_t seed, task_example_t *ex, const char *word, char op, int da, int db,
                      int nonneg) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t a = task_rand_digits(&r, da), b = task_rand_digits(&r, db);
    if (nonneg && a < b) {
        int64_t t = a;
        a = b;
        b = t;
    }
    int64_t v = op == '+' ? a + b : op == '-' ? a - b : a * b;
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "%s %lld%c%lld=", word, (long long)a, op, (long long)b);
    set_int(ex, v, p);
}

static void gen_add1(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "add", '+', 1, 1, 0); }
static void gen_add2(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "add", '+', 2, 2, 0); }
static void gen_add3(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "add", '+', 3, 3, 0); }
static void gen_add4(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "add", '+', 4, 4, 0); }
static void gen_sub1(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "sub", '-', 1, 1, 1); }
static void gen_sub2(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "sub", '-', 2, 2, 1); }
static void gen_sub3(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "sub", '-', 3, 3, 0); }
static void gen_mul1(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "mul", '*', 1, 1, 0); }
static void gen_mul21(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "mul", '*', 2, 1, 0); }
static void gen_mul2(uint64_t s, task_example_t *ex) { gen_binop(s, ex, "mul", '*', 2, 2, 0); }

static void gen_mod(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t a = task_rand_range(&r, 0, 99), b = task_rand_range(&r, 2, 9);
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "mod %lld%%%lld=", (long long)a, (long long)b);
    set_int(ex, a % b, p);
}

static char rand_op(rng_t *r) { return "+-*"[task_rand_range(r, 0, 2)]; }

static int64_t apply(int64_t a, char op, int64_t b) { return op == '+' ? a + b : op == '-' ? a - b : a * b; }

// "calc 3+4*2-5=": 3 or 4 one-digit operands; '*' binds tighter, equal precedence is left to
// right, as a model that learnt school arithmetic expects.
static void gen_calc(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int n = (int)task_rand_range(&r, 3, 4);
    int64_t v[4] = {0};   // zeroed: GCC cannot see n >= 3
    char op[3] = {0};
    for (int i = 0; i < n; i++) v[i] = task_rand_range(&r, 0, 9);
    for (int i = 0; i < n - 1; i++) op[i] = rand_op(&r);
    // Sum of products: `term` accumulates the current '*' run, `sign` is the +/- before it.
    int64_t total = 0, term = v[0];
    char sign = '+';
    for (int i = 0; i < n - 1; i++) {
        if (op[i] == '*') {
            term *= v[i + 1];
        } else {
            total = apply(total, sign, term);
            sign = op[i];
            term = v[i + 1];
        }
    }
    total = apply(total, sign, term);
    char p[TASK_MAX_TEXT];
    int k = snprintf(p, sizeof p, "calc %lld", (long long)v[0]);
    for (int i = 0; i < n - 1; i++) k += snprintf(p + k, sizeof p - (size_t)k, "%c%lld", op[i], (long long)v[i + 1]);
    snprintf(p + k, sizeof p - (size_t)k, "=");
    set_int(ex, total, p);
}

// "paren (3+4)*2=" or "paren 3*(4-2)=".
static void gen_paren(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t a = task_rand_range(&r, 0, 9), b = task_rand_range(&r, 0, 9), c = task_rand_range(&r, 0, 9);
    char o1 = rand_op(&r), o2 = rand_op(&r);
    bool left = task_rand_range(&r, 0, 1);
    char p[TASK_MAX_TEXT];
    int64_t v;
    if (left) {
        v = apply(apply(a, o1, b), o2, c);
        snprintf(p, sizeof p, "paren (%lld%c%lld)%c%lld=", (long long)a, o1, (long long)b, o2, (long long)c);
    } else {
        v = apply(a, o1, apply(b, o2, c));
        snprintf(p, sizeof p, "paren %lld%c(%lld%c%lld)=", (long long)a, o1, (long long)b, o2, (long long)c);
    }
    set_int(ex, v, p);
}

// "inc 399=": half the numbers end in a run of 9s so carries propagate.
static void gen_inc(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int d = (int)task_rand_range(&r, 1, 4);
    int64_t v = task_rand_digits(&r, d);
    if (task_rand_range(&r, 0, 1)) {
        int nines = (int)task_rand_range(&r, 1, d);
        int64_t m = 1;
        for (int i = 0; i < nines; i++) m *= 10;
        v = v - v % m + (m - 1);
    }
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "inc %lld=", (long long)v);
    set_int(ex, v + 1, p);
}

// "dsum 4821=" -> 15.
static void gen_dsum(uint64_t seed, task_example_t *ex) {
    rng_t r;
    rng_seed(&r, seed);
    int64_t v = task_rand_digits(&r, (int)task_rand_range(&r, 2, 6));
    int64_t s = 0;
    for (int64_t t = v; t > 0; t /= 10) s += t % 10;
    char p[TASK_MAX_TEXT];
    snprintf(p, sizeof p, "dsum %lld=", (long long)v);
    set_int(ex, s, p);
}

#define ARITH(name_, gen, desc) \
    {.name = name_, .family = "arithmetic", .description = desc, .generate = gen, .verify = task_verify_int}

const task_t task_arith_table[] = {
    ARITH("add1", gen_add1, "add two 1-digit numbers: 'add 3+4=' -> 7"),
    ARITH("add2", gen_add2, "add two 2-digit numbers: 'add 12+34=' -> 46"),
    ARITH("add3", gen_add3, "add two 3-digit numbers: 'add 123+456=' -> 579"),
    ARITH("add4", gen_add4, "add two 4-digit numbers: 'add 1234+5678=' -> 6912"),
    ARITH("sub1", gen_sub1, "subtract 1-digit numbers, result >= 0: 'sub 9-4=' -> 5"),
    ARITH("sub2", gen_sub2, "subtract 2-digit numbers, result >= 0: 'sub 52-17=' -> 35"),
    ARITH("sub3", gen_sub3, "subtract 3-digit numbers, result may be negative: 'sub 170-520=' -> -350"),
    ARITH("mul1", gen_mul1, "multiply 1-digit numbers: 'mul 7*8=' -> 56"),
    ARITH("mul21", gen_mul21, "multiply a 2-digit by a 1-digit number: 'mul 23*7=' -> 161"),
    ARITH("mul2", gen_mul2, "multiply 2-digit numbers: 'mul 12*34=' -> 408"),
    ARITH("mod", gen_mod, "remainder of a number up to 99 by 2-9: 'mod 47%6=' -> 5"),
    ARITH("calc", gen_calc, "3-4 one-digit operands with + - *, '*' first: 'calc 3+4*2=' -> 11"),
    ARITH("paren", gen_paren, "three operands with parentheses: 'paren (3+4)*2=' -> 14"),
    ARITH("inc", gen_inc, "add one, often through a carry chain: 'inc 399=' -> 400"),
    ARITH("dsum", gen_dsum, "sum of the digits of a 2-6 digit number: 'dsum 4821=' -> 15"),
};
const int task_arith_count = (int)(sizeof task_arith_table / sizeof task_arith_table[0]);

// tasks_sim.c - the simulated tasks (sim-easy, sim-medium, sim-hard, and any a parameter file of
// the simulated backend adds): prompts of the task's length in characters, answers that do not
// matter. Their rewards come from the task's learning curve (common/sim/sim.h sim_reward), which
// the verifier applies to simulated jobs instead of a verifier function. They are found by name
// (task_find) but not listed with the built-in families (task_count, task_at).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sim/sim.h"
#include "common/tasks/tasks_internal.h"

#define SIM_MAX_NAME 32

static void gen_sim(const char *name, uint64_t seed, task_example_t *ex) {
    sim_curve_t c;
    int n = sim_task_curve(name, &c) == 0 ? c.prompt : 64;
    rng_t r;
    rng_seed(&r, seed);
    char *p = xmalloc((size_t)n + 1);
    int h = snprintf(p, (size_t)n + 1, "%s %llu:", name, (unsigned long long)(seed % 1000000007ull));
    static const char letters[] = "abcdefghijklmnopqrstuvwxyz ";
    for (int i = h < n ? h : n; i < n; i++) p[i] = letters[task_rand_range(&r, 0, 26)];
    p[n] = 0;
    if (n > 0 && p[n - 1] != ':') p[n - 1] = '=';
    ex->prompt = p;
    ex->answer = xstrdup("x");
}

static void gen_easy(uint64_t seed, task_example_t *ex) { gen_sim("sim-easy", seed, ex); }
static void gen_medium(uint64_t seed, task_example_t *ex) { gen_sim("sim-medium", seed, ex); }
static void gen_hard(uint64_t seed, task_example_t *ex) { gen_sim("sim-hard", seed, ex); }

// The reward of a simulated task is its learning curve's (the verifier's); this function is
// what a caller without the curve's inputs (an adapter's trained steps) gets: nothing.
static float verify_none(const task_example_t *ex, const char *completion) {
    (void)ex, (void)completion;
    return 0.0f;
}

static const task_t sim_tasks[] = {
    {"sim-easy", "sim", "simulated task (learning curve: fast, high ceiling); --backend sim:DEVICE only", gen_easy,
     verify_none, NULL, NULL},
    {"sim-medium", "sim", "simulated task (learning curve: medium)", gen_medium, verify_none, NULL, NULL},
    {"sim-hard", "sim", "simulated task (learning curve: slow, low ceiling)", gen_hard, verify_none, NULL, NULL},
};

const task_t *task_sim_find(const char *name) {
    for (size_t i = 0; i < sizeof sim_tasks / sizeof sim_tasks[0]; i++)
        if (!strcmp(sim_tasks[i].name, name)) return &sim_tasks[i];
    return NULL;
}

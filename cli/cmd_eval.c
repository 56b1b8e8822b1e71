// cmd_eval.c - `marlaas eval`: greedy accuracy with a 95% Wilson interval, for one task, a
// user dataset, or every built-in task (--all, a markdown table). Tasks with tools run tool
// episodes (the environment answers the model's calls) unless --no-tools.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/rl/rl.h"

static void usage(void) {
    printf("usage: marlaas eval --model DIR [--adapter DIR] (--task NAME | --all | --dataset FILE [--verifier K])\n"
           "                    [--n N] [--max-new T] [--max-turns K] [--no-tools]\n"
           "  --n N         eval examples per task (default 500): distinct held-out prompts, each once\n"
           "                (greedy decoding is deterministic); fewer when the held-out set is smaller\n"
           "  --max-new T   tokens generated per answer, or per model turn of a tool episode (default 32)\n"
           "  --max-turns K model turns of a tool episode (default %d)\n"
           "  --no-tools    tasks with tools run single-turn, no tool answers: the model writes the observations\n"
           "                itself; its one turn gets the whole episode's budget, K x T tokens\n"
           "  --verifier K  exact | numeric[:tol] | math[:tol] | regex | choice (datasets; default exact)\n"
           "  --chat        prompts (and \"messages\" records) go through the model's chat template; answers end\n"
           "                at the model's end-of-turn token; --system TEXT adds a system message\n",
           RL_EVAL_MAX_TURNS);
}

// Evaluates one source and prints its table row; a source with fewer distinct held-out prompts
// than asked gets a note in notes, printed under the table.
static int eval_one(rl_runtime_t *rt, int slot, rl_source_t *src, int n, int max_new, int max_turns, bool no_tools,
                    FILE *notes) {
    char err[ERR_LEN];
    rl_eval_t ev;
    // Without tools the model writes a whole episode in one turn: the same token budget as with.
    if (no_tools && src->task && src->task->env) max_new *= max_turns;
    if (rl_evaluate(rt, slot, src, n, max_new, no_tools ? 0 : max_turns, &ev, err)) {
        fprintf(stderr, "marlaas eval: %s: %s\n", src->name, err);
        return -1;
    }
    printf("| %-14s | %5.1f%% | %5.1f–%5.1f%% | %4d |\n", src->name, 100 * ev.acc, 100 * ev.lo, 100 * ev.hi, ev.n);
    if (ev.n < ev.asked)
        fprintf(notes, "%s: %d distinct held-out prompts, each evaluated once (asked for %d); n and the interval count those\n",
                src->name, ev.n, ev.asked);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *task = NULL, *dataset = NULL, *verifier = NULL, *system = NULL;
    bool chat = false;
    long n = 500, max_new = 32, max_turns = RL_EVAL_MAX_TURNS;
    int all = 0;
    bool no_tools = false;
    static struct option opts[] = {{"model", required_argument, 0, 'm'},   {"adapter", required_argument, 0, 'a'},
                                   {"task", required_argument, 0, 't'},    {"all", no_argument, 0, 'A'},
                                   {"dataset", required_argument, 0, 'd'}, {"verifier", required_argument, 0, 'v'},
                                   {"n", required_argument, 0, 'n'},       {"max-new", required_argument, 0, 'x'},
                                   {"max-turns", required_argument, 0, 'T'}, {"no-tools", no_argument, 0, 'N'},
                                   {"chat", no_argument, 0, 'c'},          {"system", required_argument, 0, 's'},
                                   {"help", no_argument, 0, 'h'},          {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 'a': adapter = optarg; break;
        case 't': task = optarg; break;
        case 'A': all = 1; break;
        case 'd': dataset = optarg; break;
        case 'v': verifier = optarg; break;
        case 'n': if (cli_int("--n", optarg, 1, 1000000, &n)) return 2; break;
        case 'x': if (cli_int("--max-new", optarg, 1, 4096, &max_new)) return 2; break;
        case 'T': if (cli_int("--max-turns", optarg, 1, 64, &max_turns)) return 2; break;
        case 'N': no_tools = true; break;
        case 'c': chat = true; break;
        case 's': system = optarg; break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (!model || (!!task + all + !!dataset) != 1 || optind < argc || (system && !chat)) {
        fprintf(stderr, "marlaas eval: give --model and exactly one of --task, --all, --dataset\n");
        usage();
        return 2;
    }
    char err[ERR_LEN];
    rl_runtime_t *rt = rl_runtime_open(model, NULL, err);
    if (!rt) {
        fprintf(stderr, "marlaas eval: %s\n", err);
        return 1;
    }
    int slot = -1, rc = 0;
    if (adapter) {
        lora_t *a = lora_load(adapter, &rt->model->cfg, kernels_cpu(), err);
        if (!a || lora_pool_set(rt->pool, 0, &a, err)) {
            fprintf(stderr, "marlaas eval: adapter %s: %s\n", adapter, err);
            lora_destroy(&a);
            rl_runtime_close(&rt);
            return 1;
        }
        slot = 0;
    }
    static const char *header = "| task           | accuracy | 95% interval  |    n |\n|---|---|---|---|\n";
    char *note_text = NULL;
    size_t note_len = 0;
    FILE *notes = open_memstream(&note_text, &note_len);
    ASSERT(notes != NULL);
    if (all) {
        fputs(header, stdout);
        for (int i = 0; i < task_count() && rc == 0; i++) {
            rl_source_t src = {.task = task_at(i)};
            snprintf(src.name, sizeof src.name, "%s", task_at(i)->name);
            if (chat && rl_source_set_chat(&src, rt->chat, rt->chat_error, system, NULL, err)) {
                fprintf(stderr, "marlaas eval: %s\n", err);
                rc = 1;
                break;
            }
            rc = eval_one(rt, slot, &src, (int)n, (int)max_new, (int)max_turns, no_tools, notes);
        }
    } else {
        rl_source_t src;
        if (rl_source_open(&src, task, dataset, verifier, err) ||
            (chat && rl_source_set_chat(&src, rt->chat, rt->chat_error, system, NULL, err))) {
            fprintf(stderr, "marlaas eval: %s\n", err);
            rl_source_close(&src);
            rc = 1;
            goto done;
        }
        fputs(header, stdout);
        rc = eval_one(rt, slot, &src, (int)n, (int)max_new, (int)max_turns, no_tools, notes);
        rl_source_close(&src);
    }
done:
    fclose(notes);
    if (note_len) printf("\n%s", note_text);
    free(note_text);
    rl_runtime_close(&rt);
    return rc ? 1 : 0;
}

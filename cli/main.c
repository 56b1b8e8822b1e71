// main.c - `marlaas`: dispatches to the subcommands.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/util/log.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command_t;

static const command_t commands[] = {
    {"tasks", cmd_tasks, "list the built-in task families"},
    {"pretrain", cmd_pretrain, "train a base model from scratch on a task mixture"},
    {"eval", cmd_eval, "greedy accuracy of a model (and adapter) on tasks"},
    {"train-local", cmd_train_local, "single-process synchronous GRPO on one task (quality reference)"},
    {"init-model", cmd_init_model, "write a randomly initialised model of a given shape"},
    {"score", cmd_score, "per-token log-probs of a text or of token ids (JSON), optional greedy continuation"},
    {"tenant", cmd_tenant, "tenant create NAME: a tenant and its token (admin token)"},
    {"submit", cmd_submit, "submit a job (flags or a JSON spec, optional JSONL dataset)"},
    {"jobs", cmd_jobs, "the tenant's jobs"},
    {"status", cmd_status, "one job's state and spec"},
    {"cancel", cmd_cancel, "cancel a job"},
    {"metrics", cmd_metrics, "a job's step and eval metrics (JSON lines)"},
    {"watch", cmd_watch, "live progress of the tenant's jobs until they finish"},
    {"adapter", cmd_adapter, "adapter pull JOB -o DIR: download a job's adapter (PEFT layout)"},
    {"generate", cmd_generate, "generate text with a job's latest adapter"},
    {"chat", cmd_chat, "render a conversation (JSON on stdin) with a model's chat template"},
    {"tokenize", cmd_tokenize, "encode text lines to ids (or --decode ids) with a model's tokenizer"},
    {"keys", cmd_keys, "keys generate DIR: CURVE keypairs of the four services (authenticated links)"},
    {"up", cmd_up, "start a local cluster: redis-server + the four services (run/)"},
    {"down", cmd_down, "stop the local cluster"},
    {"demo", cmd_demo, "up, four jobs of two tenants on models/tiny, watch, before/after table, down"},
    {"info", cmd_info, "the compute setup here: CPU kernel variant, OpenBLAS kernels, threads, CUDA"},
    {"bench-api", cmd_bench_api, "the control plane under load: tenants, jobs, API latency (bench/sim_control.sh)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: marlaas COMMAND [options]   (marlaas COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    log_init("marlaas");
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "marlaas: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

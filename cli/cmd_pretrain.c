// cmd_pretrain.c - `marlaas pretrain`: trains a base model from scratch with full-parameter
// cross-entropy on a mixture of task examples, and writes a Hugging Face style model folder
// (config.json, model.safetensors, tokenizer.json, README.md with how it was made and its
// per-task accuracy). Deterministic for a seed and a thread count.
//
// Each training sequence is  prompt + answer + <|endoftext|>;  the loss covers the answer and
// the end token only (the prompt is random by construction: predicting it teaches nothing).
// A task with tools trains on  prompt + trace + <|endoftext|>  instead: the canonical episode
// (tool calls, the environment's observations, the final answer), with loss on what the model
// writes and the end token; the observations get none (the environment writes them, and their
// values are what the model cannot compute: learning to guess them would teach it to skip the
// tool).
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "common/engine/optim.h"
#include "common/rl/rl.h"

// Candidate shapes, smallest first: (D, L, H, KV, F). The one whose parameter count is
// closest to --params is used.
static const int shapes[][5] = {
    {32, 2, 2, 1, 96},    {48, 2, 4, 2, 128},   {64, 2, 4, 2, 176},   {96, 3, 4, 2, 256},   {128, 4, 4, 2, 352},
    {160, 4, 4, 2, 432},  {192, 4, 6, 2, 512},  {256, 4, 8, 4, 688},  {256, 6, 8, 4, 688},  {320, 6, 8, 4, 864},
    {384, 6, 6, 2, 1024}, {512, 8, 8, 4, 1376}, {768, 12, 12, 4, 2048},
};

static hf_config_t shape_config(const int *s, int vocab, int ctx, int eos) {
    hf_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.hidden_size = s[0], c.num_hidden_layers = s[1], c.num_attention_heads = s[2], c.num_key_value_heads = s[3];
    c.intermediate_size = s[4], c.head_dim = s[0] / s[2], c.vocab_size = vocab, c.max_position_embeddings = ctx;
    c.rms_norm_eps = 1e-5f, c.rope_theta = 10000.0f, c.tie_word_embeddings = true, c.bos_token_id = -1;
    c.eos_token_id = eos;
    return c;
}

static void usage(void) {
    printf("usage: marlaas pretrain --out DIR [--params N] [--tasks all|a,b,...] [--steps N] [--seed S]\n"
           "                        [--batch B] [--lr LR] [--eval-n N] [--tool-weight W]\n"
           "  --params N   target parameter count (default 2000000); the closest built-in shape is used\n"
           "  --tasks      task mixture (default all built-in tasks)\n"
           "  --steps N    optimiser steps (default 2000), --batch B examples per step (default 64)\n"
           "  --lr LR      peak learning rate (default 3e-3; warmup 5%%, cosine decay to 10%%)\n"
           "  --eval-n N   eval examples per task for the README table (default 200; 0 = skip)\n"
           "  --tool-weight W  how often a task with tools is drawn relative to one without (default 1)\n");
}

// Splits a comma list of task names into tasks[]; "all" = every built-in task.
static int parse_tasks(const char *list, const task_t **tasks, int *n) {
    *n = 0;
    if (!strcmp(list, "all")) {
        for (int i = 0; i < task_count(); i++) tasks[(*n)++] = task_at(i);
        return 0;
    }
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const task_t *t = task_find(tok);
        if (!t) {
            fprintf(stderr, "marlaas pretrain: unknown task '%s' (see `marlaas tasks`)\n", tok);
            return -1;
        }
        if (*n < 256) tasks[(*n)++] = t;
    }
    return *n ? 0 : -1;
}

// One row of the accuracy table; returns the accuracy, or -1 after writing the error.
static double eval_row(rl_runtime_t *rt, const task_t *t, int n, int max_new, int max_turns, FILE *out) {
    char err[ERR_LEN];
    rl_source_t src = {.task = t};
    snprintf(src.name, sizeof src.name, "%s", t->name);
    rl_eval_t ev;
    if (rl_evaluate(rt, -1, &src, n, max_new, max_turns, &ev, err)) {
        fprintf(out, "| %s | error: %s | | |\n", t->name, err);
        return -1;
    }
    fprintf(out, "| %s | %.1f%% | %.1f–%.1f%% | %d |\n", t->name, 100 * ev.acc, 100 * ev.lo, 100 * ev.hi, ev.n);
    return ev.acc;
}

// Writes the per-task accuracy table of rt's base model (slot -1), tasks with tools as tool
// episodes (what `marlaas eval` measures); returns mean accuracy.
double pretrain_eval_table(rl_runtime_t *rt, const task_t *const *tasks, int n_tasks, int n, FILE *out) {
    double sum = 0;
    fprintf(out, "| task | accuracy | 95%% interval | n |\n|---|---|---|---|\n");
    for (int i = 0; i < n_tasks; i++) {
        double acc = eval_row(rt, tasks[i], n, 32, RL_EVAL_MAX_TURNS, out);
        if (acc >= 0) sum += acc;
    }
    return n_tasks ? sum / n_tasks : 0;
}

// The tasks with tools once more without them (`marlaas eval --no-tools`: one turn with the
// whole episode's budget), to show what the tool adds. Writes nothing when there are none.
static void pretrain_no_tools_table(rl_runtime_t *rt, const task_t *const *tasks, int n_tasks, int n, const char *dir,
                                    FILE *out) {
    int k = 0;
    for (int i = 0; i < n_tasks; i++) k += tasks[i]->env != NULL;
    if (!k) return;
    fprintf(out, "\nThe same tasks with tools, without them: the model writes the observations itself in a single "
                 "turn (`marlaas eval --model %s --task NAME --n %d --no-tools`):\n\n", dir, n);
    fprintf(out, "| task | accuracy | 95%% interval | n |\n|---|---|---|---|\n");
    for (int i = 0; i < n_tasks; i++)
        if (tasks[i]->env) eval_row(rt, tasks[i], n, 32 * RL_EVAL_MAX_TURNS, 0, out);
}

// Appends the tokens of s[0..n) to a training sequence, each with loss weight wt.
static int seq_add(const tokenizer_t *tok, const char *s, size_t n, float wt, int32_t **toks, float **w, int *len,
                   char *err) {
    int32_t *ids = NULL;
    int k = tokenizer_encode(tok, s, n, &ids, err);
    if (k < 0) return -1;
    *toks = xrealloc(*toks, sizeof(int32_t) * (size_t)(*len + k + 1));
    *w = xrealloc(*w, sizeof(float) * (size_t)(*len + k + 1));
    if (k) memcpy(*toks + *len, ids, sizeof(int32_t) * (size_t)k);
    for (int j = 0; j < k; j++) (*w)[*len + j] = wt;
    *len += k;
    free(ids);
    return 0;
}

// The training sequence of one example into *toks / *w (grown as needed): prompt (weight 0),
// then the answer, or for a task with tools its trace (observations weight 0), then the end
// token (weight 1). Returns the length, or -1 + err.
static int build_seq(const tokenizer_t *tok, const task_t *t, const task_example_t *ex, int32_t eos, int ctx,
                     int32_t **toks, float **w, char *err) {
    int len = 0;
    if (seq_add(tok, ex->prompt, strlen(ex->prompt), 0.0f, toks, w, &len, err)) return -1;
    if (t->trace) {
        char tr[256];
        uint8_t obs[256];
        int n = t->trace(ex, tr, sizeof tr, obs);
        if (n < 0) return err_set(err, "no trace for '%s'", ex->prompt);
        // one run of model or environment characters at a time, so the weights follow the
        // tokens whatever the tokenizer merges inside a run
        for (int a = 0, b; a < n; a = b) {
            for (b = a + 1; b < n && obs[b] == obs[a]; b++) {}
            if (seq_add(tok, tr + a, (size_t)(b - a), obs[a] ? 0.0f : 1.0f, toks, w, &len, err)) return -1;
        }
    } else if (seq_add(tok, ex->answer, strlen(ex->answer), 1.0f, toks, w, &len, err)) {
        return -1;
    }
    if (len + 1 > ctx) return err_set(err, "too long: %d tokens and the end token in a context of %d", len, ctx);
    (*toks)[len] = eos;
    (*w)[len] = 1.0f;
    return len + 1;
}

// Draws the next example's task: uniformly, or with tasks that have tools weighted tool_weight.
// Uniform draws take exactly one random number, as before there were weights, so mixtures
// without tools give the same model for the same seed.
static const task_t *draw_task(rng_t *rng, const task_t *const *tasks, int n_tasks, double tool_weight) {
    double total = 0;
    bool uniform = true;
    for (int i = 0; i < n_tasks; i++) {
        double wt = tasks[i]->trace ? tool_weight : 1.0;
        total += wt;
        uniform &= wt == 1.0;
    }
    if (uniform) return tasks[rng_next(rng) % (uint64_t)n_tasks];
    double u = (double)(rng_next(rng) >> 11) * 0x1p-53 * total;
    for (int i = 0; i < n_tasks; i++) {
        u -= tasks[i]->trace ? tool_weight : 1.0;
        if (u < 0) return tasks[i];
    }
    return tasks[n_tasks - 1];
}

int cmd_pretrain(int argc, char **argv) {
    const char *out = NULL, *task_list = "all";
    long params = 2000000, steps = 2000, seed = 1, batch = 64, eval_n = 200;
    double lr = 3e-3, tool_weight = 1.0;
    static struct option opts[] = {{"out", required_argument, 0, 'o'},   {"params", required_argument, 0, 'p'},
                                   {"tasks", required_argument, 0, 't'}, {"steps", required_argument, 0, 's'},
                                   {"seed", required_argument, 0, 'S'},  {"batch", required_argument, 0, 'b'},
                                   {"lr", required_argument, 0, 'l'},    {"eval-n", required_argument, 0, 'e'},
                                   {"tool-weight", required_argument, 0, 'w'}, {"help", no_argument, 0, 'h'},
                                   {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'o': out = optarg; break;
        case 'p': if (cli_int("--params", optarg, 1000, 2000000000L, &params)) return 2; break;
        case 't': task_list = optarg; break;
        case 's': if (cli_int("--steps", optarg, 1, 10000000, &steps)) return 2; break;
        case 'S': if (cli_int("--seed", optarg, 0, 0x7fffffffL, &seed)) return 2; break;
        case 'b': if (cli_int("--batch", optarg, 1, 65536, &batch)) return 2; break;
        case 'l': if (cli_float("--lr", optarg, 1e-7, 1.0, &lr)) return 2; break;
        case 'e': if (cli_int("--eval-n", optarg, 0, 100000, &eval_n)) return 2; break;
        case 'w': if (cli_float("--tool-weight", optarg, 0.01, 1000.0, &tool_weight)) return 2; break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (!out || optind < argc) {
        fprintf(stderr, "marlaas pretrain: --out DIR is required%s\n", optind < argc ? " (and no positional arguments)" : "");
        return 2;
    }
    const task_t *tasks[256];
    int n_tasks;
    if (parse_tasks(task_list, tasks, &n_tasks)) return 2;

    char err[ERR_LEN];
    tokenizer_t *tok = cli_char_tokenizer(err);
    if (!tok) {
        fprintf(stderr, "marlaas pretrain: %s\n", err);
        return 1;
    }
    int V = tokenizer_vocab_size(tok), eos = tokenizer_token_id(tok, "<|endoftext|>");
    // closest shape
    int best = 0;
    double bestd = 1e30;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        hf_config_t c = shape_config(shapes[i], V, 128, eos);
        size_t sz[MODEL_N_TENSORS];
        double d = fabs((double)model_param_sizes(&c, sz) - (double)params);
        if (d < bestd) bestd = d, best = (int)i;
    }
    hf_config_t cfg = shape_config(shapes[best], V, 128, eos);
    model_t *m = model_new(&cfg, kernels_cpu(), err);
    if (!m) {
        fprintf(stderr, "marlaas pretrain: %s\n", err);
        tokenizer_destroy(&tok);
        return 1;
    }
    model_init_random(m, (uint64_t)seed);
    fprintf(stderr, "pretrain: %zu parameters (D=%d L=%d H=%d KV=%d F=%d V=%d), %d tasks, %ld steps x %ld examples, seed %ld, %d threads\n",
            m->n_params, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, V, n_tasks, steps, batch, seed, util_threads());

    lora_pool_t *pool = lora_pool_new(1);
    engine_t *e = engine_new(m, pool, err);
    optim_cfg_t oc = optim_defaults();
    oc.lr = (float)lr;
    oc.schedule = LR_WARMUP_COSINE;
    oc.warmup_steps = (int)(steps / 20 + 1);
    oc.total_steps = (int)steps;
    oc.weight_decay = 0.01f;
    optim_t *opt = optim_new(&oc, kernels_cpu(), m->n_params);
    float *grads = kernels_cpu()->alloc(sizeof(float) * m->n_params);
    engine_train_seq_t *seqs = xcalloc((size_t)batch, sizeof *seqs);
    int32_t **toks = xcalloc((size_t)batch, sizeof *toks);
    float **w = xcalloc((size_t)batch, sizeof *w);
    rng_t rng;
    rng_seed(&rng, (uint64_t)seed * 7919 + 17);
    loss_cfg_t lc = {.kind = LOSS_CE, .temperature = 1.0f};
    double t0 = util_now(), ema = 0, tok_total = 0;
    int rc = 1;
    for (long step = 0; step < steps; step++) {
        for (long i = 0; i < batch; i++) {
            const task_t *t = draw_task(&rng, tasks, n_tasks, tool_weight);
            task_example_t ex;
            task_example(t, TASK_TRAIN, rng_next(&rng) >> 20, &ex);
            int len = build_seq(tok, t, &ex, eos, cfg.max_position_embeddings, &toks[i], &w[i], err);
            task_example_free(&ex);
            if (len < 0) {
                fprintf(stderr, "marlaas pretrain: task %s example does not encode or fit: %s\n", t->name, err);
                goto done;
            }
            seqs[i] = (engine_train_seq_t){.tokens = toks[i], .len = len, .slot = -1, .weight = w[i]};
            tok_total += len;
        }
        kernels_cpu()->zero(grads, sizeof(float) * m->n_params);
        loss_stats_t st[2];
        if (engine_train(e, seqs, (int)batch, &lc, grads, NULL, st, (int)(sizeof st / sizeof st[0]), err)) {
            fprintf(stderr, "marlaas pretrain: step %ld: %s\n", step, err);
            goto done;
        }
        double gn = optim_step(opt, m->params, grads);
        if (!isfinite(gn) || !isfinite(st[0].loss)) {
            fprintf(stderr, "marlaas pretrain: step %ld: loss or gradient is not finite (loss %g, grad norm %g); "
                    "lower --lr\n", step, st[0].loss, gn);
            goto done;
        }
        ema = step == 0 ? st[0].loss : 0.95 * ema + 0.05 * st[0].loss;
        if (step % 25 == 0 || step == steps - 1) {
            double el = util_now() - t0;
            fprintf(stderr, "step %6ld/%ld  loss %.4f (avg %.4f)  lr %.2e  %.0f tok/s  elapsed %.0fs  ETA %.0fs\n",
                    step + 1, steps, st[0].loss, ema, optim_lr(&oc, step), tok_total / el, el,
                    el / (step + 1) * (steps - step - 1));
        }
    }
    double train_s = util_now() - t0;
    if (model_save(m, out, err)) {
        fprintf(stderr, "marlaas pretrain: %s\n", err);
        goto done;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    if (tokenizer_save(tok, path, err)) {
        fprintf(stderr, "marlaas pretrain: %s\n", err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/README.md", out);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "marlaas pretrain: cannot write %s\n", path);
        goto done;
    }
    char tw[48] = "";
    if (tool_weight != 1.0) snprintf(tw, sizeof tw, " --tool-weight %g", tool_weight);
    fprintf(f, "# Base model: %zu parameters\n\nMade by MARLaaS with\n\n```\nmarlaas pretrain --out %s --params %ld "
               "--tasks %s --steps %ld --seed %ld --batch %ld --lr %g%s\n```\n\n",
            m->n_params, out, params, task_list, steps, seed, batch, lr, tw);
    fprintf(f, "Llama-style decoder: hidden %d, %d layers, %d heads (%d KV heads), MLP %d, vocabulary %d "
               "(printable ASCII characters, newline, `<|endoftext|>`, `<|pad|>`), context %d, tied embeddings.\n\n",
            cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, V, cfg.max_position_embeddings);
    int n_tools = 0;
    for (int i = 0; i < n_tasks; i++) n_tools += tasks[i]->trace != NULL;
    char mix[160];
    if (n_tools && tool_weight != 1.0)
        snprintf(mix, sizeof mix, "drawn over %d tasks (the %d with tools %g times as often as the others)", n_tasks,
                 n_tools, tool_weight);
    else
        snprintf(mix, sizeof mix, "drawn uniformly over %d tasks", n_tasks);
    fprintf(f, "Training: full-parameter cross-entropy on `prompt + answer + <|endoftext|>` (loss on the answer and "
               "the end token), examples %s from their train split, AdamW (wd 0.01, clip 1.0), "
               "warmup-cosine LR. Final loss (moving average) %.4f after %ld steps, %.0f s on %d threads.\n\n",
            mix, ema, steps, train_s, util_threads());
    if (n_tools)
        fprintf(f, "Tasks with tools (tool calls `<c:EXPR>` calculator, `<k:KEY>` lookup; the environment answers "
                   "`=VALUE `) train on `prompt + trace + <|endoftext|>`, the trace being the episode a perfect tool "
                   "user writes, e.g. `<c:37*48>=1776 <c:1776+125>=1901 1901`: loss on the calls, the final answer "
                   "and the end token, none on the observations (`=1776 `), which the environment writes. They are "
                   "evaluated as tool episodes of up to %d turns.\n\n",
                RL_EVAL_MAX_TURNS);
    if (eval_n > 0) {
        fprintf(stderr, "pretrain: evaluating %d tasks x %ld examples\n", n_tasks, eval_n);
        model_t *mm = m;
        tokenizer_t *tt = tok;
        m = NULL, tok = NULL;
        engine_destroy(&e);
        rl_runtime_t *rt = rl_runtime_wrap(&mm, &tt, NULL, err);
        if (!rt) {
            fprintf(stderr, "marlaas pretrain: %s\n", err);
            fclose(f);
            goto done;
        }
        fprintf(f, "Greedy accuracy on each task's eval split (`marlaas eval --model %s --all --n %ld`):\n\n", out, eval_n);
        double mean = pretrain_eval_table(rt, tasks, n_tasks, (int)eval_n, f);
        fprintf(f, "\nMean accuracy %.1f%%.\n", 100 * mean);
        fprintf(stderr, "pretrain: mean accuracy %.1f%%\n", 100 * mean);
        pretrain_no_tools_table(rt, tasks, n_tasks, (int)eval_n, out, f);
        rl_runtime_close(&rt);
    }
    fclose(f);
    fprintf(stderr, "pretrain: wrote %s (%.0f s)\n", out, util_now() - t0);
    rc = 0;
done:
    for (long i = 0; i < batch; i++) free(toks[i]), free(w[i]);
    free(toks), free(w), free(seqs);
    kernels_cpu()->free(grads);
    optim_destroy(&opt);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
    tokenizer_destroy(&tok);
    return rc;
}

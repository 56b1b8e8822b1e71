// cmd_train_local.c - `marlaas train-local`: single-process synchronous GRPO on one job, using
// the engine directly. Each step: B prompts from the task's train split, G samples each
// (prefilled once, forked), verify, group-relative advantages, one RL optimiser step on the
// job's LoRA adapter (common/rl/batch.h: the trainer service's step); a greedy eval every K
// steps. It is the quality reference the services must match.
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/engine/optim.h"
#include "common/rl/batch.h"
#include "common/rl/jobspec.h"
#include "common/rl/rl.h"

typedef struct {
    const char *model, *task, *dataset, *verifier, *out, *metrics, *targets, *system, *weights;
    long steps, group, prompts, rank, eval_every, eval_n, max_new, seed, max_context;
    double lr, alpha, temperature, kl, clip_low, clip_high, top_p;
    int no_std, chat;
} opts_t;

static void usage(void) {
    printf("usage: marlaas train-local --model DIR (--task NAME | --dataset FILE [--verifier K]) --out ADAPTER_DIR\n"
           "                           [--steps N] [--group G] [--prompts B] [--lr LR] [--rank R] [--alpha A]\n"
           "                           [--targets all|q,k,v,o,gate,up,down] [--temperature T] [--top-p P] [--max-new T]\n"
           "                           [--kl BETA] [--clip-low E] [--clip-high E] [--no-std] [--eval-every K]\n"
           "                           [--eval-n N] [--seed S] [--metrics FILE.jsonl] [--chat [--system TEXT]]\n"
           "                           [--weights fp32|bf16] [--max-context N]\n"
           "defaults: those of a job spec (marlaas submit; README): steps 200, group 8, prompts 32, lr 1e-3,\n"
           "rank 8, alpha 16, all targets, temperature 1, top-p 1, max-new 24, kl 0, clip 0.2/0.28,\n"
           "std-normalised advantages, eval every 25 steps on 200 examples\n"
           "  --chat          prompts (and \"messages\" records) go through the model's chat template; completions\n"
           "                  end at the model's end-of-turn token, not at the first newline\n"
           "  --system TEXT   a system message before each prompt (needs --chat)\n"
           "  --weights W     base matrices in fp32 (default) or bf16\n"
           "  --max-context N positions of prompt + completion (default min(the model's, 4096))\n");
}

static int parse_targets(const char *s, unsigned *mask) {
    if (!strcmp(s, "all")) {
        *mask = LORA_ALL_TARGETS;
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *mask = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = peft_target_parse(t);
        if (k < 0) {
            fprintf(stderr, "marlaas train-local: unknown LoRA target '%s' (q,k,v,o,gate,up,down)\n", t);
            return -1;
        }
        *mask |= 1u << k;
    }
    return *mask ? 0 : -1;
}

static int parse(int argc, char **argv, opts_t *o) {
    // the job spec's defaults (one copy: jobspec_defaults)
    jobspec_t d;
    jobspec_defaults(&d);
    *o = (opts_t){.targets = "all", .steps = d.max_steps, .group = d.group, .prompts = d.prompts, .rank = d.rank,
                  .eval_every = d.eval_every, .eval_n = d.eval_n, .max_new = d.max_new, .seed = (long)d.seed,
                  .lr = d.lr, .alpha = d.alpha, .temperature = d.temperature, .kl = d.kl, .clip_low = d.clip_low,
                  .clip_high = d.clip_high, .top_p = d.top_p, .no_std = !d.std_norm};
    static struct option lo[] = {
        {"model", required_argument, 0, 'm'},       {"task", required_argument, 0, 't'},
        {"dataset", required_argument, 0, 'd'},     {"verifier", required_argument, 0, 'V'},
        {"out", required_argument, 0, 'o'},         {"metrics", required_argument, 0, 'M'},
        {"targets", required_argument, 0, 'T'},     {"steps", required_argument, 0, 's'},
        {"group", required_argument, 0, 'g'},       {"prompts", required_argument, 0, 'b'},
        {"rank", required_argument, 0, 'r'},        {"eval-every", required_argument, 0, 'E'},
        {"eval-n", required_argument, 0, 'n'},      {"max-new", required_argument, 0, 'x'},
        {"seed", required_argument, 0, 'S'},        {"lr", required_argument, 0, 'l'},
        {"alpha", required_argument, 0, 'a'},       {"temperature", required_argument, 0, 'k'},
        {"kl", required_argument, 0, 'K'},          {"clip-low", required_argument, 0, 'c'},
        {"clip-high", required_argument, 0, 'C'},   {"top-p", required_argument, 0, 'p'},
        {"no-std", no_argument, 0, 'N'},            {"help", no_argument, 0, 'h'},
        {"chat", no_argument, 0, 'H'},              {"system", required_argument, 0, 'Y'},
        {"weights", required_argument, 0, 'W'},     {"max-context", required_argument, 0, 'X'},
        {0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 't': o->task = optarg; break;
        case 'd': o->dataset = optarg; break;
        case 'V': o->verifier = optarg; break;
        case 'o': o->out = optarg; break;
        case 'M': o->metrics = optarg; break;
        case 'T': o->targets = optarg; break;
        case 's': bad = cli_int("--steps", optarg, 0, 10000000, &o->steps); break;
        case 'g': bad = cli_int("--group", optarg, 2, 1024, &o->group); break;
        case 'b': bad = cli_int("--prompts", optarg, 1, 4096, &o->prompts); break;
        case 'r': bad = cli_int("--rank", optarg, 1, 1024, &o->rank); break;
        case 'E': bad = cli_int("--eval-every", optarg, 1, 10000000, &o->eval_every); break;
        case 'n': bad = cli_int("--eval-n", optarg, 0, 100000, &o->eval_n); break;
        case 'x': bad = cli_int("--max-new", optarg, 1, 4096, &o->max_new); break;
        case 'S': bad = cli_int("--seed", optarg, 0, 0x7fffffffL, &o->seed); break;
        case 'l': bad = cli_float("--lr", optarg, 1e-8, 1.0, &o->lr); break;
        case 'a': bad = cli_float("--alpha", optarg, 1e-6, 1e6, &o->alpha); break;
        case 'k': bad = cli_float("--temperature", optarg, 1e-3, 10.0, &o->temperature); break;
        case 'K': bad = cli_float("--kl", optarg, 0.0, 100.0, &o->kl); break;
        case 'c': bad = cli_float("--clip-low", optarg, 0.0, 1.0, &o->clip_low); break;
        case 'C': bad = cli_float("--clip-high", optarg, 0.0, 10.0, &o->clip_high); break;
        case 'p': bad = cli_float("--top-p", optarg, 1e-6, 1.0, &o->top_p); break;
        case 'N': o->no_std = 1; break;
        case 'H': o->chat = 1; break;
        case 'Y': o->system = optarg; break;
        case 'W': o->weights = optarg; bad = strcmp(optarg, "fp32") && strcmp(optarg, "bf16"); break;
        case 'X': bad = cli_int("--max-context", optarg, 1, 1 << 24, &o->max_context); break;
        case 'h': usage(); exit(0);
        default: usage(); return -1;
        }
        if (bad) return -1;
    }
    if (!o->model || !o->out || (!!o->task + !!o->dataset) != 1 || optind < argc) {
        fprintf(stderr, "marlaas train-local: --model, --out and exactly one of --task / --dataset are required\n");
        return -1;
    }
    if (o->system && !o->chat) {
        fprintf(stderr, "marlaas train-local: --system needs --chat\n");
        return -1;
    }
    return 0;
}

int cmd_train_local(int argc, char **argv) {
    opts_t o;
    if (parse(argc, argv, &o)) return 2;
    unsigned targets;
    if (parse_targets(o.targets, &targets)) return 2;
    char err[ERR_LEN];
    rl_source_t src;
    if (rl_source_open(&src, o.task, o.dataset, o.verifier, err)) {
        fprintf(stderr, "marlaas train-local: %s\n", err);
        return 1;
    }
    if (src.task && src.task->env) {
        // the local loop samples single-turn completions; tool episodes run in the services
        fprintf(stderr, "marlaas train-local: task %s uses tools, and train-local does not run multi-turn episodes "
                        "yet; train it as a job: marlaas submit --task %s --max-turns 4\n", o.task, o.task);
        rl_source_close(&src);
        return 1;
    }
    double t_load = util_now();
    rl_runtime_cfg_t rcfg = {.bf16 = o.weights && !strcmp(o.weights, "bf16"), .max_context = (int)o.max_context};
    rl_runtime_t *rt = rl_runtime_open(o.model, &rcfg, err);
    if (!rt || (o.chat && rl_source_set_chat(&src, rt->chat, rt->chat_error, o.system, NULL, err))) {
        fprintf(stderr, "marlaas train-local: %s\n", err);
        rl_runtime_close(&rt);
        rl_source_close(&src);
        return 1;
    }
    fprintf(stderr, "train-local: model %s loaded in %.2f s (%s weights, context %d, KV cache %d tokens)\n", o.model,
            util_now() - t_load, rt->model->bf16 ? "bf16" : "fp32", rt->max_context,
            kvcache_total_blocks(rt->kc) * kvcache_block_size(rt->kc));
    FILE *mf = NULL;
    if (o.metrics && !(mf = fopen(o.metrics, "w"))) {
        fprintf(stderr, "marlaas train-local: cannot write %s\n", o.metrics);
        rl_runtime_close(&rt);
        rl_source_close(&src);
        return 1;
    }
    const hf_config_t *mc = &rt->model->cfg;
    peft_config_t pc = {.r = (int)o.rank, .alpha = (float)o.alpha, .targets = targets};
    snprintf(pc.base_model, sizeof pc.base_model, "%s", o.model);
    lora_t *a = lora_new(mc, &pc, kernels_cpu(), (uint64_t)o.seed, err);
    if (!a || lora_pool_set(rt->pool, 0, &a, err)) {
        fprintf(stderr, "marlaas train-local: %s\n", err);
        lora_destroy(&a);
        if (mf) fclose(mf);
        rl_runtime_close(&rt);
        rl_source_close(&src);
        return 1;
    }
    lora_t *ad = lora_pool_get(rt->pool, 0);
    optim_cfg_t oc = optim_defaults();
    oc.lr = (float)o.lr;
    optim_t *opt = optim_new(&oc, kernels_cpu(), ad->n_params);
    float *grad = kernels_cpu()->alloc(sizeof(float) * ad->n_params);
    int B = (int)o.prompts, G = (int)o.group, NS = B * G;
    rl_batch_t batch = {0};
    rl_group_t *groups = xcalloc((size_t)B, sizeof *groups);
    rl_sample_t *samples = xcalloc((size_t)NS, sizeof *samples);
    task_example_t *ex = xcalloc((size_t)B, sizeof *ex);
    int *handle = xcalloc((size_t)B, sizeof(int));
    int32_t **prompt = xcalloc((size_t)B, sizeof *prompt);
    int *plen = xcalloc((size_t)B, sizeof(int));
    gen_result_t **res = xcalloc((size_t)B, sizeof *res);
    const char *nl = "\n";
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = (float)o.temperature, .clip_low = (float)o.clip_low,
                     .clip_high = (float)o.clip_high, .kl_coef = (float)o.kl};
    int rc = 1;
    double t_start = util_now(), acc0 = -1, acc_last = -1;
    fprintf(stderr, "train-local: task %s, %ld steps x %d prompts x %d samples, LoRA r=%ld alpha=%g (%zu params), lr %g, %d threads\n",
            src.name, o.steps, B, G, o.rank, o.alpha, ad->n_params, o.lr, util_threads());
    for (long step = 0; step <= o.steps; step++) {
        if (o.eval_n > 0 && (step % o.eval_every == 0 || step == o.steps)) {
            rl_eval_t ev;
            if (rl_evaluate(rt, 0, &src, (int)o.eval_n, (int)o.max_new, RL_EVAL_MAX_TURNS, &ev, err)) {
                fprintf(stderr, "marlaas train-local: eval: %s\n", err);
                goto done;
            }
            if (acc0 < 0) acc0 = ev.acc;
            acc_last = ev.acc;
            fprintf(stderr, "eval   step %4ld  accuracy %5.1f%% [%4.1f, %4.1f] n=%d  (%.1fs)\n", step, 100 * ev.acc,
                    100 * ev.lo, 100 * ev.hi, ev.n, ev.seconds);
            if (mf) fprintf(mf, "{\"step\":%ld,\"eval_acc\":%.4f,\"eval_lo\":%.4f,\"eval_hi\":%.4f,\"eval_n\":%d}\n", step,
                            ev.acc, ev.lo, ev.hi, ev.n);
        }
        if (step == o.steps) break;
        double t0 = util_now();
        // 1. generate G samples for each of B prompts
        for (int i = 0; i < B; i++) {
            uint64_t idx = (uint64_t)step * (uint64_t)B + (uint64_t)i + (uint64_t)o.seed * 1000003ull;
            task_example_free(&ex[i]);
            handle[i] = rl_source_example(&src, TASK_TRAIN, idx, &ex[i]);
            free(prompt[i]);
            prompt[i] = NULL;
            char *text = rl_source_prompt(&src, &ex[i], handle[i], err);
            plen[i] = text ? tokenizer_encode(rt->tok, text, strlen(text), &prompt[i], err) : -1;
            free(text);
            int room = rt->max_context - plen[i];
            if (plen[i] < 0 || room < 1) {
                fprintf(stderr, "marlaas train-local: prompt %s: %s\n", ex[i].prompt, plen[i] < 0 ? err : "too long");
                goto done;
            }
            gen_request_t rq = {.prompt = prompt[i], .prompt_len = plen[i], .slot = 0, .n_samples = G,
                                .max_new_tokens = o.max_new < room ? (int)o.max_new : room,
                                .sp = {.temperature = (float)o.temperature, .top_p = (float)o.top_p},
                                .seed = idx * 7777 + 1, .stop_ids = rt->eos_ids, .n_stop_ids = rt->n_eos, .user = (uint64_t)i,
                                .stop_strings = &nl, .n_stop_strings = o.chat ? 0 : 1};
            if (gen_submit(rt->gen, &rq, err) < 0) {
                fprintf(stderr, "marlaas train-local: %s\n", err);
                goto done;
            }
        }
        if (gen_run(rt->gen, err)) {
            fprintf(stderr, "marlaas train-local: generation: %s\n", err);
            goto done;
        }
        double t_gen = util_now() - t0;
        gen_result_t *r;
        while ((r = gen_take(rt->gen))) res[r->user] = r;
        // 2. verify, advantages, training batch (groups with equal rewards carry no signal)
        int gen_tokens = 0;
        for (int i = 0; i < B; i++) {
            for (int g = 0; g < G; g++) {
                const gen_sample_t *s = &res[i]->samples[g];
                float reward = rl_source_verify(&src, &ex[i], handle[i], s->text ? s->text : "");
                samples[i * G + g] = (rl_sample_t){.tokens = s->tokens, .logprobs = s->logprobs, .n = s->n,
                                                   .reward = reward};
                gen_tokens += s->n;
            }
            groups[i] = (rl_group_t){.prompt = prompt[i], .n_prompt = plen[i], .samples = samples + i * G,
                                     .n_samples = G};
        }
        rl_batch_reset(&batch);
        rl_job_cfg_t jc = {.slot = 0, .std_norm = !o.no_std, .skip_flat = true};
        int added = rl_batch_add_job(&batch, &jc, groups, B, err);
        for (int i = 0; i < B; i++) gen_result_free(&res[i]);
        if (added < 0) {
            fprintf(stderr, "marlaas train-local: step %ld: %s\n", step + 1, err);
            goto done;
        }
        const rl_batch_job_t *bj = &batch.jobs[0];
        // 3. one optimiser step (none when no group carries a signal)
        loss_stats_t st = {0};
        double gnorm = 0;
        double t1 = util_now();
        if (bj->n_seqs > 0) {
            rl_step_job_t sj = {.opt = opt, .grad = grad};
            if (rl_train_step(NULL, rt->engine, &batch, 0, 1, &lc, &sj, err)) {
                fprintf(stderr, "marlaas train-local: step %ld: %s\n", step + 1, err);
                goto done;
            }
            if (sj.failed) {
                fprintf(stderr, "marlaas train-local: step %ld: %s; lower --lr\n", step + 1, sj.error);
                goto done;
            }
            st = sj.loss;
            gnorm = sj.grad_norm;
        }
        int skipped = bj->skipped, train_tokens = (int)bj->tokens;
        double t_train = util_now() - t1, dt = util_now() - t0;
        double rmean = bj->reward_sum / NS;
        fprintf(stderr, "step %4ld  reward %.3f  kl %.4f  clip %.3f  entropy %.3f  ratio %.4f  |g| %.3f  groups %d/%d  "
                "gen %.0f tok/s  train %.0f tok/s  %.2fs\n",
                step + 1, rmean, st.kl, st.clip_frac, st.entropy, st.ratio_mean, gnorm, B - skipped, B,
                gen_tokens / t_gen, train_tokens / (t_train > 0 ? t_train : 1), dt);
        if (mf)
            fprintf(mf, "{\"step\":%ld,\"reward\":%.4f,\"kl\":%.5f,\"clip_frac\":%.4f,\"entropy\":%.4f,\"ratio\":%.5f,"
                        "\"grad_norm\":%.4f,\"groups_used\":%d,\"gen_tokens\":%d,\"train_tokens\":%d,\"seconds\":%.3f}\n",
                    step + 1, rmean, st.kl, st.clip_frac, st.entropy, st.ratio_mean, gnorm, B - skipped,
                    gen_tokens, train_tokens, dt);
    }
    if (lora_save(ad, o.out, err)) {
        fprintf(stderr, "marlaas train-local: %s\n", err);
        goto done;
    }
    if (acc0 >= 0)
        fprintf(stderr, "train-local: %s accuracy %.1f%% -> %.1f%% in %ld steps, %.0f s; adapter written to %s\n",
                src.name, 100 * acc0, 100 * acc_last, o.steps, util_now() - t_start, o.out);
    else   // --eval-n 0: no eval
        fprintf(stderr, "train-local: %s, %ld steps, %.0f s; adapter written to %s\n", src.name, o.steps,
                util_now() - t_start, o.out);
    printf("%s %.4f %.4f %ld %.1f\n", src.name, acc0, acc_last, o.steps, util_now() - t_start);
    rc = 0;
done:
    for (int i = 0; i < B; i++) task_example_free(&ex[i]), free(prompt[i]), gen_result_free(&res[i]);
    rl_batch_free(&batch);
    free(groups), free(samples), free(ex), free(handle), free(prompt), free(plen), free(res);
    kernels_cpu()->free(grad);
    optim_destroy(&opt);
    if (mf) fclose(mf);
    rl_runtime_close(&rt);
    rl_source_close(&src);
    return rc;
}

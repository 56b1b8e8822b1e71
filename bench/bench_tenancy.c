// bench_tenancy.c - what many tenants sharing one base model cost, measured on the code the
// services run: rollout generation throughput vs batch size and vs distinct adapters in the
// batch (the continuous-batching generator of the rollout service), resident memory of a rollout
// runtime with 1 / 32 / 128 adapters loaded, and trainer optimiser steps/s for small per-job
// batches (GRPO groups sharing their prompt and without; packed and stepped by the trainer
// service's code, common/rl/batch.h), one job at a time vs several jobs in one mixed-adapter pass.
//
//   build/bin/marlaas-bench-tenancy rollout --model DIR [--quick]
//   build/bin/marlaas-bench-tenancy memory  --model DIR | --shape NAME
//   build/bin/marlaas-bench-tenancy trainer --model DIR [--quick]
//   build/bin/marlaas-bench-tenancy dp      --model DIR [--ranks 2] [--quick]  (data-parallel trainer)
//   build/bin/marlaas-bench-tenancy sgemm        (OpenBLAS sgemm GFLOP/s at MARLAAS_THREADS)
//
// Output: CSV rows on stdout (a header line first), progress on stderr. bench/run.sh runs each
// in its own process (resident memory only grows within a process).
#include <arpa/inet.h>
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "common/engine/optim.h"
#include "common/rl/batch.h"
#include "common/rl/dp.h"
#include "common/rl/rl.h"
#include "common/tasks/tasks.h"
#include "common/util/util.h"

static double min_seconds = 1.0;

// Resident set size of this process in MiB (VmRSS of /proc/self/status).
static double rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    double kb = -1;
    if (!f) return -1;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atof(line + 6);
    fclose(f);
    return kb / 1024.0;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "bench-tenancy: %s: %s\n", what, err);
    exit(1);
}

// An adapter of rank 8 on all targets whose every parameter is written (a fresh adapter has
// B = 0, pages a process may never touch; a trained one has none).
static lora_t *full_adapter(const hf_config_t *c, uint64_t seed) {
    char err[ERR_LEN];
    peft_config_t pc = {.r = 8, .alpha = 16, .targets = LORA_ALL_TARGETS};
    lora_t *a = lora_new(c, &pc, kernels_cpu(), seed, err);
    if (!a) die("adapter", err);
    for (size_t j = 0; j < a->n_params; j++) a->params[j] = 1e-3f * (float)((j * 2654435761u + seed) % 1000) / 1000.0f;
    return a;
}

static void fill_pool(lora_pool_t *pool, const hf_config_t *c, int from, int to) {
    char err[ERR_LEN];
    for (int i = from; i < to; i++) {
        lora_t *a = full_adapter(c, (uint64_t)i + 1);
        if (lora_pool_set(pool, i, &a, err)) die("pool", err);
    }
}

// The prompts of the benchmark: real task prompts, cycling over the built-in tasks.
static int32_t *task_prompt(const tokenizer_t *tok, int i, int *n) {
    task_example_t ex;
    task_example(task_at(i % task_count()), TASK_TRAIN, (uint64_t)i, &ex);
    int32_t *ids = NULL;
    char err[ERR_LEN];
    *n = tokenizer_encode(tok, ex.prompt, strlen(ex.prompt), &ids, err);
    task_example_free(&ex);
    if (*n < 1) die("tokenizer", err);
    return ids;
}

// --- sgemm: the machine's reference speed at this thread count -------------------------------------
static int cmd_sgemm(void) {
    printf("threads,gflops_2048\n%d,%.1f\n", util_threads(), bench_sgemm_gflops(2048, 2048, 2048, min_seconds));
    return 0;
}

// --- rollout ------------------------------------------------------------------------------------
// Generated tokens/s of `seqs` sequences (one sample each, 32 new tokens, no stop so every
// sequence runs its full length) with the requests spread over n_adapters adapters. The time
// includes the prompts' prefill and sampling, as in the rollout service.
#define NEW_TOKENS 32
static double gen_rate(rl_runtime_t *rt, int seqs, int n_adapters) {
    char err[ERR_LEN];
    double t = 0, toks = 0;
    for (int round = 0; t < min_seconds; round++) {
        for (int i = 0; i < seqs; i++) {
            int n;
            int32_t *p = task_prompt(rt->tok, i + round * seqs, &n);
            gen_request_t rq = {.prompt = p, .prompt_len = n, .slot = i % n_adapters, .n_samples = 1,
                                .max_new_tokens = NEW_TOKENS, .sp = {.temperature = 1.0f, .top_p = 1.0f},
                                .seed = (uint64_t)i + 1};
            if (gen_submit(rt->gen, &rq, err) < 0) die("gen_submit", err);
            free(p);
        }
        double t0 = util_now();
        if (gen_run(rt->gen, err)) die("gen_run", err);
        double dt = util_now() - t0;
        gen_result_t *r;
        while ((r = gen_take(rt->gen))) {
            if (round > 0)
                for (int s = 0; s < r->n_samples; s++) toks += r->samples[s].n;
            gen_result_free(&r);
        }
        if (round > 0) t += dt;   // round 0 warms buffers and pages
    }
    return toks / t;
}

static int cmd_rollout(const char *model, int quick) {
    char err[ERR_LEN];
    rl_runtime_cfg_t cfg = {.n_slots = 128, .max_batch_tokens = 512};
    rl_runtime_t *rt = rl_runtime_open(model, &cfg, err);
    if (!rt) die(model, err);
    fill_pool(rt->pool, &rt->model->cfg, 0, 128);
    printf("sweep,sequences,adapters,tokens_per_s\n");
    int batches[] = {1, 8, 32, 128, 256};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        if (quick && batches[i] == 256) continue;
        double r = gen_rate(rt, batches[i], 1);
        printf("batch,%d,1,%.1f\n", batches[i], r);
        fprintf(stderr, "rollout: %3d sequences, 1 adapter: %.0f tok/s\n", batches[i], r);
        fflush(stdout);
    }
    int adapters[] = {1, 8, 32, 128};
    for (size_t i = 0; i < sizeof adapters / sizeof adapters[0]; i++) {
        double r = gen_rate(rt, 128, adapters[i]);
        printf("adapters,128,%d,%.1f\n", adapters[i], r);
        fprintf(stderr, "rollout: 128 sequences, %3d adapters: %.0f tok/s\n", adapters[i], r);
        fflush(stdout);
    }
    rl_runtime_close(&rt);
    return 0;
}

// --- memory -------------------------------------------------------------------------------------
// Shapes for a model with no folder: weights random, the tokenizer of models/tiny (characters).
static int shape_config(const char *name, hf_config_t *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model_type, sizeof c->model_type, "llama");
    int D, L, H, KV, F;
    if (!strcmp(name, "25m")) D = 512, L = 8, H = 8, KV = 4, F = 1536;
    else if (!strcmp(name, "100m")) D = 768, L = 12, H = 12, KV = 4, F = 3072;
    else return -1;
    c->hidden_size = D, c->num_hidden_layers = L, c->num_attention_heads = H, c->num_key_value_heads = KV;
    c->head_dim = D / H, c->intermediate_size = F, c->vocab_size = 512, c->max_position_embeddings = 128;
    c->rms_norm_eps = 1e-6f, c->rope_theta = 10000.0f, c->bos_token_id = -1, c->eos_token_id = 96;
    c->tie_word_embeddings = true;
    return 0;
}

static int cmd_memory(const char *model, const char *shape) {
    char err[ERR_LEN];
    double rss0 = rss_mib();
    rl_runtime_cfg_t cfg = {.n_slots = 128, .max_batch_tokens = 512};
    rl_runtime_t *rt;
    const char *name = model;
    if (shape) {
        hf_config_t c;
        if (shape_config(shape, &c)) die(shape, "unknown shape (25m, 100m)");
        model_t *m = model_new(&c, kernels_cpu(), err);
        if (!m) die(shape, err);
        model_init_random(m, 1);
        tokenizer_t *tok = tokenizer_load("models/tiny/tokenizer.json", err);
        if (!tok) die("models/tiny/tokenizer.json", err);
        rt = rl_runtime_wrap(&m, &tok, &cfg, err);
        name = shape;
    } else {
        rt = rl_runtime_open(model, &cfg, err);
    }
    if (!rt) die(name, err);
    const hf_config_t *c = &rt->model->cfg;
    peft_config_t pc = {.r = 8, .alpha = 16, .targets = LORA_ALL_TARGETS};
    double model_mib = rt->model->n_params * 4.0 / (1 << 20), adapter_mib = lora_param_count(c, &pc) * 4.0 / (1 << 20);
    // one generation round so the KV cache and step buffers hold what a serving process holds
    int n;
    int32_t *p = task_prompt(rt->tok, 0, &n);
    gen_request_t rq = {.prompt = p, .prompt_len = n, .slot = -1, .n_samples = 8, .max_new_tokens = 16,
                        .sp = {.temperature = 1.0f, .top_p = 1.0f}, .seed = 1};
    if (gen_submit(rt->gen, &rq, err) < 0 || gen_run(rt->gen, err)) die("generate", err);
    free(p);
    gen_result_t *r;
    while ((r = gen_take(rt->gen))) gen_result_free(&r);
    printf("model,params,model_mib,adapter_mib,adapters,rss_mib\n");
    printf("%s,%zu,%.2f,%.3f,0,%.1f\n", name, rt->model->n_params, model_mib, adapter_mib, rss_mib());
    int steps[] = {1, 32, 128}, have = 0;
    for (int i = 0; i < 3; i++) {
        fill_pool(rt->pool, c, have, steps[i]);
        have = steps[i];
        printf("%s,%zu,%.2f,%.3f,%d,%.1f\n", name, rt->model->n_params, model_mib, adapter_mib, have, rss_mib());
    }
    fprintf(stderr, "memory: %s: process before loading %.1f MiB\n", name, rss0);
    rl_runtime_close(&rt);
    return 0;
}

// --- trainer ------------------------------------------------------------------------------------
// K jobs, each a GRPO step of B prompts x G samples (prompt of a real task, completion = the
// task's answer + EOS, as a learned policy writes), packed and trained by the trainer service's
// code (common/rl/batch.h: rl_batch_add_job, rl_train_step: RL loss, AdamW on each job's adapter).

enum { MAXJ = 32, B = 4, G = 8 };

// Job j's B groups, item i's: G samples of the answer with rewards -c, +c, -c, ... (c = 0.5, 1
// or 1.5 by item), so that the advantages (without std normalisation) are the rewards themselves.
static void add_job(rl_batch_t *b, const rl_runtime_t *rt, int job, int shared) {
    char err[ERR_LEN];
    rl_group_t groups[B];
    rl_sample_t *samples = xcalloc((size_t)(B * G), sizeof *samples);
    int32_t *prompts[B], *answers[B];
    for (int i = 0; i < B; i++) {
        task_example_t ex;
        task_example(task_at(job % task_count()), TASK_TRAIN, (uint64_t)(job * 1000 + i), &ex);
        int32_t *p = NULL, *a = NULL;
        int np = tokenizer_encode(rt->tok, ex.prompt, strlen(ex.prompt), &p, err);
        int na = tokenizer_encode(rt->tok, ex.answer, strlen(ex.answer), &a, err);
        task_example_free(&ex);
        if (np < 2 || na < 0) die("tokenizer", err);
        answers[i] = xrealloc(a, sizeof(int32_t) * (size_t)(na + 1));
        answers[i][na] = rt->eos;
        prompts[i] = p;
        for (int g = 0; g < G; g++)
            samples[i * G + g] = (rl_sample_t){.tokens = answers[i], .n = na + 1,
                                               .reward = (g % 2 ? 1.0f : -1.0f) * (1 + i % 3) / 2.0f};
        groups[i] = (rl_group_t){.prompt = p, .n_prompt = np, .samples = samples + i * G, .n_samples = G};
    }
    rl_job_cfg_t c = {.slot = job, .share_prompt = shared};
    if (rl_batch_add_job(b, &c, groups, B, err) < 0) die("batch", err);
    for (int i = 0; i < B; i++) free(prompts[i]), free(answers[i]);
    free(samples);
}

// Behaviour log-probs = the current policy's (ratios near 1, as on-policy), written into the
// batch's sequences (shared prompts have none: their log-probs go to scratch).
static void on_policy_logprobs(rl_runtime_t *rt, rl_batch_t *b) {
    char err[ERR_LEN];
    float **lp = xmalloc(sizeof(float *) * (size_t)b->n);
    void **scratch = xcalloc((size_t)b->n, sizeof(void *));
    for (int k = 0; k < b->n; k++)
        if (!(lp[k] = rl_batch_old_logp(b, k))) lp[k] = scratch[k] = xcalloc((size_t)b->seqs[k].len, sizeof(float));
    if (engine_logprobs(rt->engine, b->seqs, b->n, 1.0f, lp, NULL, err)) die("logprobs", err);
    for (int k = 0; k < b->n; k++) free(scratch[k]);
    free(scratch), free(lp);
}

// One optimiser step of each of K jobs, either one training pass per job or one mixed-adapter
// pass over all K (the trainer service's way when several jobs are ready at once).
static double trainer_rate(rl_runtime_t *rt, rl_batch_t *per_job, rl_batch_t *all, int K, int mixed, float **grads,
                           optim_t **opt) {
    char err[ERR_LEN];
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.2f};
    rl_step_job_t sj[MAXJ];
    double t = 0;
    long steps = 0;
    for (int round = 0; t < min_seconds; round++) {
        double t0 = util_now();
        for (int j = 0; j < K; j++) sj[j] = (rl_step_job_t){.opt = opt[j], .grad = grads[j]};
        if (mixed) {
            if (rl_train_step(NULL, rt->engine, all, 0, K, &lc, sj, err)) die("train", err);
        } else {
            for (int j = 0; j < K; j++)
                if (rl_train_step(NULL, rt->engine, &per_job[j], 0, 1, &lc, &sj[j], err)) die("train", err);
        }
        for (int j = 0; j < K; j++)
            if (sj[j].failed) die("train", sj[j].error);
        if (round == 0) continue;
        t += util_now() - t0;
        steps += K;
    }
    return steps / t;
}

// The trainer benchmarks' workload: MAXJ jobs on their own adapters, each a GRPO step of B prompts
// x G samples, with shared prompts and without, and all jobs' shared batches in one batch.
typedef struct {
    rl_runtime_t *rt;
    rl_batch_t shared[MAXJ], plain[MAXJ], all;
    float *grads[MAXJ];
    optim_t *opt[MAXJ];
    double tokens[MAXJ], flops[MAXJ];
} twork_t;

static void twork_open(twork_t *w, const char *model) {
    char err[ERR_LEN];
    memset(w, 0, sizeof *w);
    rl_runtime_cfg_t cfg = {.n_slots = MAXJ, .max_batch_tokens = 512};
    w->rt = rl_runtime_open(model, &cfg, err);
    if (!w->rt) die(model, err);
    rl_runtime_t *rt = w->rt;
    fill_pool(rt->pool, &rt->model->cfg, 0, MAXJ);
    optim_cfg_t oc = optim_defaults();
    oc.lr = 1e-6f;   // the parameters barely move: every measured step sees the same work
    for (int j = 0; j < MAXJ; j++) {
        add_job(&w->shared[j], rt, j, 1);
        add_job(&w->plain[j], rt, j, 0);
        add_job(&w->all, rt, j, 1);
        size_t np = lora_pool_get(rt->pool, j)->n_params;
        w->grads[j] = xcalloc(np, sizeof(float));
        w->opt[j] = optim_new(&oc, kernels_cpu(), np);
        on_policy_logprobs(rt, &w->plain[j]);
        on_policy_logprobs(rt, &w->shared[j]);
        // workload of one step: the tokens of its samples (prompt + completion each), and the
        // FLOPs of the forward plus the backward's input gradients (the same GEMMs again; LoRA's
        // own gradients not counted) over those tokens without sharing
        for (int k = 0; k < w->plain[j].n; k++) {
            int len = w->plain[j].seqs[k].len;
            w->tokens[j] += len;
            w->flops[j] += 2.0 * engine_forward_flops(rt->model, len, len, len / 2.0);
        }
    }
    // the mixed batch: the jobs' shared batches one after the other, their log-probs too
    for (int j = 0; j < MAXJ; j++)
        for (int q = 0; q < w->shared[j].n; q++) {
            float *dst = rl_batch_old_logp(&w->all, w->all.jobs[j].first + q);
            if (dst) memcpy(dst, rl_batch_old_logp(&w->shared[j], q), sizeof(float) * (size_t)w->shared[j].seqs[q].len);
        }
}

static void twork_close(twork_t *w) {
    for (int j = 0; j < MAXJ; j++)
        rl_batch_free(&w->shared[j]), rl_batch_free(&w->plain[j]), free(w->grads[j]), optim_destroy(&w->opt[j]);
    rl_batch_free(&w->all);
    rl_runtime_close(&w->rt);
}

// Mean tokens and FLOPs of one step of the first K jobs (the jobs differ: one task each).
static void twork_means(const twork_t *w, int K, double *tok, double *fl) {
    *tok = *fl = 0;
    for (int j = 0; j < K; j++) *tok += w->tokens[j] / K, *fl += w->flops[j] / K;
}

static int cmd_trainer(const char *model, int quick) {
    twork_t w;
    twork_open(&w, model);
    printf("jobs,mode,steps_per_s,tokens_per_s,tokens_per_step,gflops\n");
    int ks[] = {1, 4, 8, 16, 32};
    const char *modes[] = {"unshared", "one-by-one", "mixed"};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        int K = ks[ki];
        if (quick && (K == 4 || K == 16)) continue;
        double tok, fl;
        twork_means(&w, K, &tok, &fl);
        for (int mode = 0; mode < 3; mode++) {
            double r = trainer_rate(w.rt, mode == 0 ? w.plain : w.shared, &w.all, K, mode == 2, w.grads, w.opt);
            // GFLOP/s of the unshared work: what the pass replaces, so modes compare directly
            printf("%d,%s,%.2f,%.0f,%.0f,%.2f\n", K, modes[mode], r, r * tok, tok, r * fl / 1e9);
            fprintf(stderr, "trainer: %2d jobs %-10s %.1f steps/s\n", K, modes[mode], r);
            fflush(stdout);
        }
    }
    twork_close(&w);
    return 0;
}

// --- data-parallel trainer -------------------------------------------------------------------------
// The mixed pass of K jobs (as the trainer service runs it) in ONE process with R threads, then
// split over R data-parallel ranks of one thread each (common/rl/dp.h: rank 0 broadcasts the pass,
// each rank trains its share, gradients summed over the group's ZeroMQ sockets, the same AdamW step
// on every rank): the cost of the group's messages and of splitting the pass, side by side on the
// same cores. Ranks 1.. are forked before anything computes (OpenMP threads do not survive fork).

static int free_tcp_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len))
        die("socket", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static bool never(void) { return false; }

static int cmd_dp(const char *model, int ranks, int quick) {
    if (ranks < 2 || ranks > 16) die("--ranks", "must be 2..16");
    char ep[64], err[ERR_LEN];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_tcp_port());
    pid_t kids[16];
    for (int r = 1; r < ranks; r++) {
        kids[r] = fork();
        if (kids[r] < 0) die("fork", strerror(errno));
        if (kids[r] == 0) {
            setenv("MARLAAS_THREADS", "1", 1);
            util_threads_init();
            rl_runtime_cfg_t cfg = {.n_slots = MAXJ, .max_batch_tokens = 512};
            rl_runtime_t *rt = rl_runtime_open(model, &cfg, err);
            dp_cfg_t c = {.rank = r, .world = ranks, .endpoint = ep, .timeout_s = 600};
            dp_t *d = rt ? dp_open(&c, rt->engine, err) : NULL;
            int rc = d && dp_serve(d, never, err) == 0 ? 0 : 1;
            if (rc) fprintf(stderr, "rank %d: %s\n", r, err);
            dp_close(&d);
            rl_runtime_close(&rt);
            _exit(rc);
        }
    }
    twork_t w;
    twork_open(&w, model);
    rl_runtime_t *rt = w.rt;
    dp_cfg_t c = {.rank = 0, .world = ranks, .endpoint = ep, .timeout_s = 600};
    dp_t *d = dp_open(&c, rt->engine, err);
    if (!d) die("dp_open", err);
    for (int j = 0; j < MAXJ; j++)
        if (dp_load(d, j, w.opt[j], err)) die("dp_load", err);
    printf("jobs,ranks,threads_per_rank,steps_per_s,tokens_per_s,gflops\n");
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.2f};
    rl_step_job_t sj[MAXJ];
    int ks[] = {8, 32};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        int K = ks[ki];
        double tok, fl;
        twork_means(&w, K, &tok, &fl);
        for (int split = 0; split < 2; split++) {
            // one process with `ranks` threads, or the group with one thread per rank
            char th[8];
            snprintf(th, sizeof th, "%d", split ? 1 : ranks);
            setenv("MARLAAS_THREADS", th, 1);
            util_threads_init();
            double t = 0;
            long steps = 0;
            for (int round = 0; t < min_seconds * (quick ? 1 : 2); round++) {
                double t0 = util_now();
                for (int j = 0; j < K; j++) sj[j] = (rl_step_job_t){.opt = w.opt[j], .grad = w.grads[j]};
                if (rl_train_step(split ? d : NULL, rt->engine, &w.all, 0, K, &lc, sj, err)) die("rl_train_step", err);
                for (int j = 0; j < K; j++)
                    if (sj[j].failed) die("rl_train_step", sj[j].error);
                if (round == 0) continue;
                t += util_now() - t0;
                steps += K;
            }
            double r = steps / t;
            printf("%d,%d,%s,%.2f,%.0f,%.2f\n", K, split ? ranks : 1, th, r, r * tok, r * fl / 1e9);
            fprintf(stderr, "dp: %2d jobs, %d rank(s) x %s thread(s): %.1f steps/s\n", K, split ? ranks : 1, th, r);
            fflush(stdout);
        }
    }
    dp_close(&d);   // the workers stop
    int bad = 0;
    for (int r = 1; r < ranks; r++) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        bad |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    twork_close(&w);
    return bad;
}

int main(int argc, char **argv) {
    const char *usage = "usage: marlaas-bench-tenancy rollout|trainer --model DIR [--quick]\n"
                        "       marlaas-bench-tenancy dp --model DIR [--ranks 2] [--quick]\n"
                        "       marlaas-bench-tenancy memory --model DIR | --shape 25m|100m\n"
                        "       marlaas-bench-tenancy sgemm\n";
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1], *model = NULL, *shape = NULL;
    int quick = 0, ranks = 2, o;
    static struct option opts[] = {{"model", required_argument, NULL, 'm'}, {"shape", required_argument, NULL, 's'},
                                   {"quick", no_argument, NULL, 'q'}, {"ranks", required_argument, NULL, 'r'},
                                   {"help", no_argument, NULL, 'h'}, {0}};
    optind = 2;
    while ((o = getopt_long(argc, argv, "m:s:qr:h", opts, NULL)) != -1) {
        if (o == 'm') model = optarg;
        else if (o == 's') shape = optarg;
        else if (o == 'q') quick = 1;
        else if (o == 'r') ranks = atoi(optarg);
        else {
            fputs(usage, o == 'h' ? stdout : stderr);
            return o == 'h' ? 0 : 2;
        }
    }
    util_threads_init();
    if (quick) min_seconds = 0.4;
    if (!strcmp(cmd, "memory") && (model || shape)) return cmd_memory(model, shape);
    if (!strcmp(cmd, "sgemm")) return cmd_sgemm();
    if (!model) {
        fputs(usage, stderr);
        return 2;
    }
    if (!strcmp(cmd, "rollout")) return cmd_rollout(model, quick);
    if (!strcmp(cmd, "trainer")) return cmd_trainer(model, quick);
    if (!strcmp(cmd, "dp")) return cmd_dp(model, ranks, quick);
    fputs(usage, stderr);
    return 2;
}

// bench_engine.c - engine throughput, each figure beside the machine's limit measured in the
// same run:
//   - prefill and decode tokens/s at several batch sizes with 1 vs 32 (and, at batch >= 128, 128)
//     distinct LoRA adapters, train-step tokens/s, achieved GFLOP/s beside the backend's GEMM;
//   - decode at batch 1 as bytes of weights streamed per second, a fraction of the read
//     bandwidth (a vectorised read of a buffer larger than the last-level cache, same threads);
//   - fp32 and bf16 weights side by side (the bf16 / fp32 ratios);
//   - "contended": every phase alone, beside a CPU-bound competitor on the same cores, and as two
//     engine processes at once (processes of this program, re-executed with --phase);
// for the built-in shapes 3M, 25M, 100M (and a full-depth qwen2.5-0.5b shape without --quick) on
// the CPU backend, each target stated with PASS/FAIL.
//
//   build/bin/marlaas-bench-engine [--quick] [--weights fp32|bf16|both] [--shapes 3M,25M,100M,qwen2.5-0.5b]
//                                  [--no-contended]
//   build/cuda/bin/marlaas-bench-engine --backend cuda --weights bf16 --model DIR --batches 1,64,256
//       (DIR e.g. from `marlaas init-model --shape qwen2.5-0.5b`; tests/gpu/run.sh does this)
// --weights bf16 converts the base model's matrices to bf16 (model_to_bf16) before measuring.
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/engine/engine.h"
#include "common/engine/model.h"
#include "common/engine/sampler.h"
#include "bench/bench_util.h"
#include "common/util/util.h"

typedef struct {
    const char *name;
    hf_config_t c;
} shape_t;

static hf_config_t shape(int D, int L, int H, int KV, int F, int V) {
    hf_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.hidden_size = D, c.num_hidden_layers = L, c.num_attention_heads = H, c.num_key_value_heads = KV;
    c.head_dim = D / H, c.intermediate_size = F, c.vocab_size = V, c.max_position_embeddings = 1024;
    c.rms_norm_eps = 1e-6f, c.rope_theta = 10000.0f, c.bos_token_id = c.eos_token_id = -1;
    return c;
}

// Tokens/s of prefill steps (B sequences x P tokens in one step) or of decode steps (B
// sequences, one token each, contexts P .. P+DEC), with n_adapters distinct adapters over the
// rows. One warm-up round, then rounds until min_seconds have been measured; the figure is the
// fastest round's (another tenant of the machine only ever slows a round down, so the fastest
// is the one least disturbed; GFLOP/s from the same round).
#define DEC 16
static double min_seconds = 0.4;

static void step_or_die(engine_t *e, kvcache_t *kc, engine_seq_t *q, int B, float *logits) {
    char err[ERR_LEN];
    if (engine_step(e, kc, q, B, logits, err)) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
}

static double run_infer(engine_t *e, const hf_config_t *c, int B, int P, int n_adapters, int decode, double *gflops) {
    char err[ERR_LEN];
    int bs = 16, blocks = B * ((P + DEC) / bs + 2) + 8;
    kvcache_t *kc = kvcache_new_on(engine_model(e)->k, c->num_hidden_layers, c->num_key_value_heads * c->head_dim, bs,
                                   blocks, B, err);
    if (!kc) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)B * P);
    for (int i = 0; i < B * P; i++) tok[i] = (i * 7 + 3) % c->vocab_size;
    engine_seq_t *q = xcalloc((size_t)B, sizeof *q);
    float *logits = xmalloc(sizeof(float) * (size_t)B * c->vocab_size);
    for (int i = 0; i < B; i++)
        q[i] = (engine_seq_t){.tokens = tok + (size_t)i * P, .n_tokens = P, .kv_seq = kvcache_seq_new(kc, err),
                              .slot = n_adapters ? i % n_adapters : -1, .logits = ENGINE_LOGITS_LAST};
    double measured = 0, best = 0, best_flops = 0;
    for (int round = 0; measured < min_seconds; round++) {
        for (int i = 0; i < B; i++) kvcache_seq_truncate(kc, q[i].kv_seq, 0), q[i].n_tokens = P;
        double t0 = util_now();
        step_or_die(e, kc, q, B, logits);
        if (decode) {
            for (int i = 0; i < B; i++) q[i].n_tokens = 1;
            t0 = util_now();
            for (int s = 0; s < DEC; s++) step_or_die(e, kc, q, B, logits);
        }
        double t = util_now() - t0;
        if (round == 0) continue;   // warm-up: buffers grow, pages fault in
        measured += t;
        double ntok = decode ? (double)B * DEC : (double)B * P;
        double flops = decode ? engine_forward_flops(engine_model(e), (double)B * DEC, (double)B * DEC, P + DEC / 2.0)
                              : engine_forward_flops(engine_model(e), (double)B * P, (double)B, P / 2.0);
        if (ntok / t > best) best = ntok / t, best_flops = flops / t;
    }
    *gflops = best_flops / 1e9;
    kvcache_destroy(&kc);
    free(tok), free(q), free(logits);
    return best;
}

// Train-step tokens/s: RL loss forward + backward on B sequences of P tokens (LoRA grads).
static double run_train(engine_t *e, const hf_config_t *c, int B, int P, int n_adapters, float **grads) {
    char err[ERR_LEN];
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)B * P);
    float *w = xmalloc(sizeof(float) * (size_t)B * P), *old = xcalloc((size_t)B * P, sizeof(float));
    for (int i = 0; i < B * P; i++) tok[i] = (i * 5 + 1) % c->vocab_size, w[i] = (i % P) >= P / 2;
    engine_train_seq_t *s = xcalloc((size_t)B, sizeof *s);
    for (int i = 0; i < B; i++)
        s[i] = (engine_train_seq_t){.tokens = tok + (size_t)i * P, .len = P, .slot = i % n_adapters,
                                    .weight = w + (size_t)i * P, .old_logp = old + (size_t)i * P,
                                    .advantage = (i % 2) ? 1.0f : -1.0f};
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.2f};
    engine_train(e, s, B, &lc, NULL, grads, NULL, 0, err);   // warm-up (buffers)
    int reps = 0;
    double t0 = util_now(), t;
    const kernels_t *k = engine_model(e)->k;
    float probe;
    do {
        if (engine_train(e, s, B, &lc, NULL, grads, NULL, 0, err)) {
            fprintf(stderr, "bench: %s\n", err);
            exit(1);
        }
        k->to_host(&probe, grads[0], sizeof probe);   // the backward is complete (asynchronous backends)
        reps++;
    } while ((t = util_now() - t0) < 2.5 * min_seconds);
    free(tok), free(w), free(old), free(s);
    return (double)B * P * reps / t;
}

// GFLOP/s of the backend's GEMM on an M x N x K product (the time includes a copy of one float
// back to the host, so asynchronous backends are timed to completion).
static double backend_gemm_gflops(const kernels_t *k, int M, int N, int K, double seconds) {
    float *A = k->alloc(sizeof(float) * (size_t)M * K), *B = k->alloc(sizeof(float) * (size_t)K * N),
          *C = k->alloc(sizeof(float) * (size_t)M * N), probe;
    k->gemm(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    k->to_host(&probe, C, sizeof probe);
    int reps = 0;
    double t0 = util_now(), t;
    do {
        k->gemm(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        k->to_host(&probe, C, sizeof probe);
        reps++;
    } while ((t = util_now() - t0) < seconds);
    k->free(A), k->free(B), k->free(C);
    return 2.0 * M * N * K * reps / t / 1e9;
}

// Bytes of weights one decoded token streams at batch 1: every layer's matrices, the LM head
// (read whole to score the vocabulary) and one adapter. The embedding table gives one row; norms,
// biases and the KV cache are left out, so the fraction below understates the traffic.
static double decode_bytes(const model_t *m, const lora_t *a) {
    const hf_config_t *c = &m->cfg;
    double D = c->hidden_size, F = c->intermediate_size, Qd = (double)c->num_attention_heads * c->head_dim,
           KVd = (double)c->num_key_value_heads * c->head_dim;
    double per_layer = D * Qd + 2 * D * KVd + Qd * D + 3 * D * F;
    double elems = per_layer * c->num_hidden_layers + (double)c->vocab_size * D;
    return elems * (m->bf16 ? 2.0 : 4.0) + (a ? 4.0 * (double)a->n_params : 0.0);
}

// A pool of n adapters (rank 8, all targets) with non-zero B matrices, so every adapter's product
// is real work (params are backend memory).
static lora_pool_t *adapters(const model_t *m, int n) {
    char err[ERR_LEN];
    lora_pool_t *pool = lora_pool_new(n);
    // as the rollout holds them: on bf16 weights (CPU) with bf16 copies for decode
    if (m->bf16 && m->k == kernels_cpu()) lora_pool_bf16_copies(pool, true);
    peft_config_t pc = {.r = 8, .alpha = 16, .targets = LORA_ALL_TARGETS};
    for (int i = 0; i < n; i++) {
        lora_t *a = lora_new(&m->cfg, &pc, m->k, (uint64_t)i + 1, err);
        if (!a) {
            fprintf(stderr, "bench: %s\n", err);
            exit(1);
        }
        float *host = xmalloc(sizeof(float) * a->n_params);
        for (size_t j = 0; j < a->n_params; j++) host[j] = 0.01f;
        m->k->to_dev(a->params, host, sizeof(float) * a->n_params);
        free(host);
        if (lora_pool_set(pool, i, &a, err)) {
            fprintf(stderr, "bench: %s\n", err);
            exit(1);
        }
    }
    return pool;
}

// What one model's table measured, for the summary.
typedef struct {
    bool done;
    double dec1, bytes_tok;        // decode batch 1 tok/s (one adapter), bytes streamed per token
    double bw_near;                // read bandwidth measured in turn with dec1 (GB/s)
    double ad32_decode, ad32_prefill;   // worst 32-adapter / 1-adapter ratio at batch >= 32
    double ad32_bound;             // what the read bandwidth allows that decode ratio (see below)
    double ad128;                  // 128-adapter ratio at batch >= 128 (0: not measured)
    double prefill, train;         // prefill tok/s at the largest batch, train tok/s (one adapter)
} figs_t;

// The read buffer (bench_read_buffer), made once: read_near measures beside each decode.
static float *read_buf;
static size_t read_n;

// Decode batch 1 (one adapter) and the read bandwidth measured in turn, three times each: the
// best of each, so a slow spell of a shared machine (its memory bandwidth moves by a third from
// one minute to the next on the VMs measured) falls on both sides of the ratio alike. Raises
// *dec1 to the best decode seen; returns the best read (GB/s), 0 off the CPU backend.
static double dec1_and_read(engine_t *e, const hf_config_t *c, int P, double *dec1) {
    if (engine_model(e)->k != kernels_cpu()) return 0;
    if (!read_buf) read_buf = bench_read_buffer(&read_n);
    double best = 0, g;
    for (int rep = 0; rep < 3; rep++) {
        double r = bench_read_gbs_of(read_buf, read_n, util_threads(), 0.2);
        if (r > best) best = r;
        double t = run_infer(e, c, 1, P, 1, 1, &g);
        if (t > *dec1) *dec1 = t;
    }
    return best;
}

static void bench_model(const char *name, model_t *m, const int *batches, int n_batches, int P, double bw,
                        figs_t *fg) {
    const hf_config_t *c = &m->cfg;
    const kernels_t *k = m->k;
    char err[ERR_LEN];
    int n_ad = 32;
    for (int bi = 0; bi < n_batches; bi++)
        if (batches[bi] >= 128) n_ad = 128;
    lora_pool_t *pool = adapters(m, n_ad);
    engine_t *e = engine_new(m, pool, err);
    if (!e) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    int D = c->hidden_size, F = c->intermediate_size;
    bool cpu = k == kernels_cpu();
    double peak = cpu ? bench_sgemm_gflops(2048, 2048, 2048, 0.5) : backend_gemm_gflops(k, 4096, 4096, 4096, 1.0);
    double shaped = cpu ? bench_sgemm_gflops(4096, F, D, 0.5) : backend_gemm_gflops(k, 4096, F, D, 1.0);
    printf("\nmodel %s on the %s backend: %.2fM parameters (D=%d L=%d H=%d KV=%d F=%d V=%d), %s matrices (%.1f MiB "
           "of weights), LoRA rank 8 on all 7 targets, prompts of %d tokens\n", name, k->name, m->n_params / 1e6, D,
           c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, F, c->vocab_size,
           m->bf16 ? "bf16" : "fp32", (m->n_f32 * 4.0 + m->n_bf16 * 2.0) / (1 << 20), P);
    printf("%s: %.1f GFLOP/s (%s), %.1f GFLOP/s (4096x%dx%d, the model's MLP shape)\n",
           cpu ? "OpenBLAS sgemm" : "backend gemm (cuBLAS SGEMM, fp32)", peak, cpu ? "2048^3" : "4096^3", shaped, F,
           D);
    printf("%-8s %5s | %12s %12s %6s %12s %6s | %8s %8s\n", "phase", "batch", "tok/s 1 ad", "tok/s 32 ad", "ratio",
           "tok/s 128 ad", "ratio", "GFLOP/s", "%gemm");
    memset(fg, 0, sizeof *fg);
    fg->ad32_decode = fg->ad32_prefill = 1e9;
    double best_frac = 0;
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        for (int dec = 0; dec <= 1; dec++) {
            // the adapter counts in turn, twice where their ratio is a target (batch >= 32), each
            // the faster of its two: a slow spell of the machine then hits both sides alike
            double g1 = 0, t1 = 0, t32 = 0, t128 = 0;
            for (int rep = 0; rep < (B >= 32 ? 2 : 1); rep++) {
                double g, t = run_infer(e, c, B, P, 1, dec, &g);
                if (t > t1) t1 = t, g1 = g;
                if ((t = run_infer(e, c, B, P, 32, dec, &g)) > t32) t32 = t;
                if (B >= 128 && n_ad >= 128 && (t = run_infer(e, c, B, P, 128, dec, &g)) > t128) t128 = t;
            }
            if (dec && B == 1) fg->dec1 = t1;
            if (!dec) fg->prefill = t1;
            if (B >= 32) {
                double *w = dec ? &fg->ad32_decode : &fg->ad32_prefill;
                if (t32 / t1 < *w) {
                    *w = t32 / t1;
                    // a decode step of 32 adapters reads 31 adapters more than one of a single
                    // adapter: at the read bandwidth that alone takes this much longer
                    double step = B / t1, extra = 31.0 * 4.0 * (double)lora_pool_get(pool, 0)->n_params / (bw * 1e9);
                    if (dec && bw > 0) fg->ad32_bound = step / (step + extra);
                }
            }
            if (t128 > 0 && (fg->ad128 == 0 || t128 / t1 < fg->ad128)) fg->ad128 = t128 / t1;
            if (!dec && g1 / peak > best_frac) best_frac = g1 / peak;
            char c128[16] = "-", r128[16] = "-";
            if (t128 > 0) snprintf(c128, sizeof c128, "%.0f", t128), snprintf(r128, sizeof r128, "%.0f%%", 100 * t128 / t1);
            printf("%-8s %5d | %12.0f %12.0f %5.0f%% %12s %6s | %8.1f %7.0f%%\n", dec ? "decode" : "prefill", B, t1, t32,
                   100.0 * t32 / t1, c128, r128, g1, 100.0 * g1 / peak);
            fflush(stdout);
        }
    }
    float *grads[32];
    for (int i = 0; i < 32; i++) grads[i] = k->alloc(sizeof(float) * lora_pool_get(pool, i)->n_params);
    double tr1 = run_train(e, c, 8, P, 1, grads), tr8 = run_train(e, c, 8, P, 8, grads);
    fg->train = tr1;
    // forward + backward of the frozen base with LoRA: about 3x the forward's FLOPs
    double train_gflops = 3.0 * engine_forward_flops(m, 8.0 * P, 8.0 * P / 2, P / 2.0) / (8.0 * P) * tr1 / 1e9;
    printf("train step (RL loss, fwd+bwd, LoRA grads), 8 x %d tokens: %.0f tok/s one adapter, %.0f tok/s 8 adapters in "
           "one pass (about %.1f GFLOP/s, %.0f%% of gemm)\n", P, tr1, tr8, train_gflops, 100 * train_gflops / peak);
    for (int i = 0; i < 32; i++) k->free(grads[i]);
    fg->bytes_tok = decode_bytes(m, lora_pool_get(pool, 0));
    if (fg->dec1 > 0 && bw > 0) {
        fg->bw_near = dec1_and_read(e, c, P, &fg->dec1);
        printf("decode batch 1: %.0f tok/s x %.1f MB of weights per token = %.1f GB/s, %.0f%% of the read bandwidth "
               "measured in turn with it (%.1f GB/s; %.1f GB/s at the start)\n", fg->dec1, fg->bytes_tok / 1e6,
               fg->dec1 * fg->bytes_tok / 1e9, 100 * fg->dec1 * fg->bytes_tok / 1e9 / fg->bw_near, fg->bw_near, bw);
    }
    fg->done = true;
    engine_destroy(&e);
    lora_pool_destroy(&pool);
}

static int parse_batches(const char *s, int *out, int max) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int b = atoi(t);
        if (b < 1 || b > 4096 || n == max) return -1;
        out[n++] = b;
    }
    return n;
}

// --- the built-in shapes ----------------------------------------------------------------------

static const struct {
    const char *name;
    int D, L, H, KV, F, V, ctx;
} SHAPES[] = {
    {"3M", 256, 4, 4, 2, 688, 512, 1024},
    {"25M", 512, 8, 8, 4, 1536, 512, 1024},
    {"100M", 768, 12, 12, 4, 3072, 512, 1024},
    {"qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, 1024},   // full depth, Qwen2.5-0.5B's dimensions
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof *SHAPES))

static int shape_index(const char *name) {
    for (int i = 0; i < N_SHAPES; i++)
        if (!strcmp(SHAPES[i].name, name)) return i;
    return -1;
}

// A random model of a built-in shape on k, in bf16 when asked; exits with the reason otherwise.
static model_t *shape_model(int si, const kernels_t *k, bool bf16) {
    char err[ERR_LEN];
    hf_config_t c = shape(SHAPES[si].D, SHAPES[si].L, SHAPES[si].H, SHAPES[si].KV, SHAPES[si].F, SHAPES[si].V);
    c.max_position_embeddings = SHAPES[si].ctx;
    model_t *m = model_new(&c, k, err);
    if (!m) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    model_init_random(m, 1);
    if (bf16 && model_to_bf16(m, err)) {
        fprintf(stderr, "bench: %s\n", err);
        exit(1);
    }
    return m;
}

// --- contended: processes of this program, re-executed with --phase ----------------------------

// The phases measured under contention (one adapter per row group as in the tables above).
static const struct {
    const char *name, *what;
    int batch, adapters, decode, train;
} PHASES[] = {
    {"decode1", "decode batch 1", 1, 1, 1, 0},
    {"decode32", "decode batch 32, 32 adapters", 32, 32, 1, 0},
    {"prefill8", "prefill 8 x 64, 8 adapters", 8, 8, 0, 0},
    {"train8", "train step 8 x 64, 8 adapters", 8, 8, 0, 1},
};
#define N_PHASES ((int)(sizeof PHASES / sizeof *PHASES))

// The child: builds the model, says "ready", waits for a line on stdin, measures the phase for
// `seconds` and prints its tokens/s.
static int phase_child(const char *shape_name, const char *phase, bool bf16, double seconds) {
    int si = shape_index(shape_name), pi = -1;
    for (int i = 0; i < N_PHASES; i++)
        if (!strcmp(PHASES[i].name, phase)) pi = i;
    if (si < 0 || pi < 0) {
        fprintf(stderr, "bench: unknown --shape '%s' or --phase '%s'\n", shape_name, phase);
        return 2;
    }
    model_t *m = shape_model(si, kernels_cpu(), bf16);
    lora_pool_t *pool = adapters(m, 32);
    char err[ERR_LEN];
    engine_t *e = engine_new(m, pool, err);
    if (!e) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    float *grads[32];
    for (int i = 0; i < 32; i++) grads[i] = m->k->alloc(sizeof(float) * lora_pool_get(pool, i)->n_params);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    min_seconds = seconds;
    alarm((unsigned)(30 * seconds) + 10);   // a phase that collapses under contention ends as 0 tok/s
    double g, r = PHASES[pi].train ? run_train(e, &m->cfg, PHASES[pi].batch, 64, PHASES[pi].adapters, grads)
                                   : run_infer(e, &m->cfg, PHASES[pi].batch, 64, PHASES[pi].adapters,
                                               PHASES[pi].decode, &g);
    printf("%.3f\n", r);
    fflush(stdout);
    for (int i = 0; i < 32; i++) m->k->free(grads[i]);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
    return 0;
}

typedef struct {
    pid_t pid;
    FILE *to, *from;
} child_t;

static void child_start(child_t *c, const char *shape_name, const char *phase, bool bf16, double seconds) {
    int in[2], out[2];
    if (pipe(in) || pipe(out)) {
        fprintf(stderr, "bench: pipe: %s\n", strerror(errno));
        exit(1);
    }
    fflush(stdout);
    c->pid = fork();
    if (c->pid < 0) {
        fprintf(stderr, "bench: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (c->pid == 0) {
        dup2(in[0], 0), dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        char secs[32];
        snprintf(secs, sizeof secs, "%g", seconds);
        execl("/proc/self/exe", "marlaas-bench-engine", "--phase", phase, "--shape", shape_name, "--weights",
              bf16 ? "bf16" : "fp32", "--seconds", secs, (char *)NULL);
        _exit(127);
    }
    close(in[0]), close(out[1]);
    c->to = fdopen(in[1], "w"), c->from = fdopen(out[0], "r");
}

// Reads the child's next line; "0" when it died (a phase past its alarm: collapsed).
static void child_line(child_t *c, char *line, size_t n) {
    if (!fgets(line, (int)n, c->from)) {
        int st = 0;
        waitpid(c->pid, &st, 0);
        fprintf(stderr, "bench: a --phase child ended early (%s %d): counted as 0 tok/s\n",
                WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        snprintf(line, n, "0");
        c->pid = -1;
    }
}

// Tokens/s of `n` copies of the phase running at once (summed), each after all are ready.
static double phase_together(int n, const char *shape_name, const char *phase, bool bf16, double seconds) {
    child_t c[2];
    char line[64];
    for (int i = 0; i < n; i++) child_start(&c[i], shape_name, phase, bf16, seconds);
    for (int i = 0; i < n; i++) child_line(&c[i], line, sizeof line);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < n; i++) fputs("go\n", c[i].to), fflush(c[i].to);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        child_line(&c[i], line, sizeof line);
        sum += atof(line);
        fclose(c[i].to), fclose(c[i].from);
        if (c[i].pid > 0) waitpid(c[i].pid, NULL, 0);
    }
    return sum;
}

// A CPU-bound competitor: one busy process per core this program may use, on the same cores.
static int hogs_start(pid_t *pids, int max) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n < 1) n = 1;
    if (n > max) n = max;
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            volatile unsigned long x = 0;
            for (;;) x++;
        }
    }
    return n;
}

static void hogs_stop(const pid_t *pids, int n) {
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGKILL), waitpid(pids[i], NULL, 0);
}

static double median3(double *v, int n) {
    for (int a = 1; a < n; a++)
        for (int c = a; c > 0 && v[c - 1] > v[c]; c--) {
            double x = v[c];
            v[c] = v[c - 1], v[c - 1] = x;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Each phase alone, beside the competitor and as two processes, `rounds` times in turn; the
// ratios are the medians of each round's ratio to its own alone figure (this machine's speed
// moves by a fifth within minutes, so a ratio of two figures taken apart says more of the
// machine than of the engine).
static void contended(const char *shape_name, bool bf16, double seconds, int rounds, int *fails) {
    pid_t hogs[64];
    printf("\ncontended (%s, %s weights, MARLAAS_THREADS=%d): each phase alone, beside a competitor with one busy "
           "process per core on the same cores, and as two processes of this program at once (summed); %d round%s "
           "in turn, tok/s and ratios the medians of the rounds'\n",
           shape_name, bf16 ? "bf16" : "fp32", util_threads(), rounds, rounds == 1 ? "" : "s");
    printf("%-32s | %10s %10s %6s | %10s %6s\n", "phase", "alone", "competed", "ratio", "2 procs", "ratio");
    enum { MAX_ROUNDS = 9 };
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    for (int p = 0; p < N_PHASES; p++) {
        double alone[MAX_ROUNDS], comp[MAX_ROUNDS], two[MAX_ROUNDS], r1[MAX_ROUNDS], r2[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) {
            alone[r] = phase_together(1, shape_name, PHASES[p].name, bf16, seconds);
            int nh = hogs_start(hogs, 64);
            comp[r] = phase_together(1, shape_name, PHASES[p].name, bf16, seconds);
            hogs_stop(hogs, nh);
            two[r] = phase_together(2, shape_name, PHASES[p].name, bf16, seconds);
            r1[r] = alone[r] > 0 ? comp[r] / alone[r] : 0, r2[r] = alone[r] > 0 ? two[r] / alone[r] : 0;
        }
        double ra = median3(r1, rounds), rb = median3(r2, rounds);
        bool ok1 = ra >= 0.45, ok2 = rb >= 0.85;
        *fails += !ok1 + !ok2;
        printf("%-32s | %10.0f %10.0f %5.0f%% | %10.0f %5.0f%%   %s (>= 45%%) %s (>= 85%%)\n", PHASES[p].what,
               median3(alone, rounds), median3(comp, rounds), 100 * ra, median3(two, rounds), 100 * rb,
               ok1 ? "PASS" : "FAIL", ok2 ? "PASS" : "FAIL");
        fflush(stdout);
    }
}

// --- main -------------------------------------------------------------------------------------

static void target(const char *what, double got, double want, const char *unit_fmt, int *fails) {
    bool ok = got >= want;
    *fails += !ok;
    char g[32], w[32];
    snprintf(g, sizeof g, unit_fmt, got), snprintf(w, sizeof w, unit_fmt, want);
    printf("  %-4s %-70s %10s (>= %s)\n", ok ? "PASS" : "FAIL", what, g, w);
}

int main(int argc, char **argv) {
    int quick = 0, P = 64, contend = 1;
    double seconds = 0;
    const char *backend = "cpu", *model_dir = NULL, *batches_s = NULL, *weights = NULL, *shapes_s = NULL,
               *phase = NULL, *phase_shape = "25M";
    static struct option opts[] = {{"quick", no_argument, NULL, 'q'},        {"backend", required_argument, NULL, 'b'},
                                   {"model", required_argument, NULL, 'm'},  {"batches", required_argument, NULL, 'B'},
                                   {"prompt", required_argument, NULL, 'p'}, {"weights", required_argument, NULL, 'w'},
                                   {"shapes", required_argument, NULL, 's'}, {"no-contended", no_argument, NULL, 'n'},
                                   {"phase", required_argument, NULL, 'P'},  {"shape", required_argument, NULL, 'S'},
                                   {"seconds", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
                                   {0}};
    int o;
    while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (o == 'q') quick = 1;
        else if (o == 'b') backend = optarg;
        else if (o == 'm') model_dir = optarg;
        else if (o == 'w') weights = optarg;
        else if (o == 'B') batches_s = optarg;
        else if (o == 'p') P = atoi(optarg);
        else if (o == 's') shapes_s = optarg;
        else if (o == 'n') contend = 0;
        else if (o == 'P') phase = optarg;
        else if (o == 'S') phase_shape = optarg;
        else if (o == 't') seconds = atof(optarg);
        else {
            printf("usage: %s [--quick] [--backend cpu|cuda] [--weights fp32|bf16|both] [--model DIR] "
                   "[--shapes 3M,25M,100M,qwen2.5-0.5b|none] [--batches 1,8,32,128] [--prompt 64] [--no-contended]\n",
                   argv[0]);
            return o == 'h' ? 0 : 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!weights) weights = model_dir || strcmp(backend, "cpu") ? "fp32" : "both";
    if (strcmp(weights, "fp32") && strcmp(weights, "bf16") && strcmp(weights, "both")) {
        fprintf(stderr, "bench: unknown --weights '%s' (fp32, bf16 or both)\n", weights);
        return 2;
    }
    if (P < 1 || P > 4096) {
        fprintf(stderr, "bench: --prompt must be in 1..4096\n");
        return 2;
    }
    util_threads_init();
    if (phase) return phase_child(phase_shape, phase, !strcmp(weights, "bf16"), seconds > 0 ? seconds : 1.0);
    int batches[16] = {1, 8, 32, 128}, n_batches = 4;
    if (batches_s && (n_batches = parse_batches(batches_s, batches, 16)) < 1) {
        fprintf(stderr, "bench: --batches takes a comma-separated list of 1..4096\n");
        return 2;
    }
    char why[ERR_LEN];
    const kernels_t *k = kernels_by_name(backend, why, sizeof why);
    if (!k) {
        fprintf(stderr, "bench: --backend %s: %s\n", backend, why);
        return 2;
    }
    bench_machine();
    char err[ERR_LEN];
    if (model_dir) {
        model_t *m = model_load(model_dir, k, err);
        if (m && !strcmp(weights, "bf16") && model_to_bf16(m, err)) model_destroy(&m);
        if (!m) {
            fprintf(stderr, "bench: %s\n", err);
            return 1;
        }
        figs_t fg;
        bench_model(model_dir, m, batches, n_batches, P, 0, &fg);
        model_destroy(&m);
        return 0;
    }
    // shapes
    bool want[N_SHAPES] = {0};
    if (shapes_s && strcmp(shapes_s, "none")) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", shapes_s);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int si = shape_index(t);
            if (si < 0) {
                fprintf(stderr, "bench: unknown shape '%s' (3M, 25M, 100M, qwen2.5-0.5b)\n", t);
                return 2;
            }
            want[si] = true;
        }
    } else if (!shapes_s || strcmp(shapes_s, "none")) {
        want[0] = want[1] = want[2] = true;
        want[3] = !quick;
    }
    double bw = k == kernels_cpu() ? bench_read_gbs(util_threads(), 1.0) : 0;
    double bw1 = k == kernels_cpu() ? bench_read_gbs(1, 1.0) : 0;
    if (bw > 0)
        printf("read bandwidth: %.1f GB/s on %d threads, %.1f GB/s on 1 (a vectorised read of %.0f MiB, more than the "
               "last-level cache)\n", bw, util_threads(), bw1, bench_read_buffer_bytes() / 1048576.0);
    int nw = !strcmp(weights, "both") ? 2 : 1;
    bool w16[2] = {!strcmp(weights, "bf16"), true};
    figs_t figs[N_SHAPES][2];
    memset(figs, 0, sizeof figs);
    for (int si = 0; si < N_SHAPES; si++) {
        if (!want[si]) continue;
        for (int wi = 0; wi < nw; wi++) {
            model_t *m = shape_model(si, k, w16[wi]);
            if (si == 3) {   // the full-depth model: decode batch 1 only (its vocabulary makes the rest slow)
                int b1[1] = {1};
                figs_t *f = &figs[si][wi];
                lora_pool_t *pool = adapters(m, 1);
                engine_t *e = engine_new(m, pool, err);
                double g;
                f->dec1 = run_infer(e, &m->cfg, 1, P, 1, 1, &g);
                f->bw_near = bw > 0 ? dec1_and_read(e, &m->cfg, P, &f->dec1) : 0;
                f->bytes_tok = decode_bytes(m, lora_pool_get(pool, 0));
                f->done = true;
                printf("\nmodel %s (D=%d L=%d V=%d, %s matrices): decode batch %d: %.1f tok/s x %.0f MB per token = "
                       "%.1f GB/s, %.0f%% of the read bandwidth measured in turn with it (%.1f GB/s)\n",
                       SHAPES[si].name, SHAPES[si].D, SHAPES[si].L, SHAPES[si].V, m->bf16 ? "bf16" : "fp32", b1[0],
                       f->dec1, f->bytes_tok / 1e6, f->dec1 * f->bytes_tok / 1e9,
                       f->bw_near > 0 ? 100 * f->dec1 * f->bytes_tok / 1e9 / f->bw_near : 0, f->bw_near);
                fflush(stdout);
                engine_destroy(&e);
                lora_pool_destroy(&pool);
            } else {
                char name[64];
                snprintf(name, sizeof name, "%s %s", SHAPES[si].name, m->bf16 ? "bf16" : "fp32");
                bench_model(name, m, batches, quick && n_batches > 3 ? 3 : n_batches, P, bw, &figs[si][wi]);
            }
            model_destroy(&m);
        }
    }
    int fails = 0;
    if (k == kernels_cpu() && contend) contended("25M", false, quick ? 0.6 : 1.2, quick ? 1 : 3, &fails);
    printf("\ntargets (%s backend, %d threads; read bandwidth %.1f GB/s at the start, each decode batch 1 against the "
           "read measured in turn with it):\n", k->name, util_threads(), bw);
    for (int si = 0; si < N_SHAPES; si++) {
        for (int wi = 0; wi < nw; wi++) {
            const figs_t *f = &figs[si][wi];
            if (!f->done) continue;
            char what[128];
            const char *wn = w16[wi] ? "bf16" : "fp32";
            if (f->bw_near > 0 && f->dec1 > 0) {
                snprintf(what, sizeof what, "%s %s: decode batch 1 streams the weights at >= 80%% of read bandwidth",
                         SHAPES[si].name, wn);
                target(what, 100 * f->dec1 * f->bytes_tok / 1e9 / f->bw_near, 80, "%.0f%%", &fails);
            }
            if (si == 3) continue;
            if (f->ad32_decode < 1e9) {
                snprintf(what, sizeof what, "%s %s: 32 adapters keep >= 90%% of 1-adapter decode tok/s, batch >= 32",
                         SHAPES[si].name, wn);
                target(what, 100 * f->ad32_decode, 90, "%.0f%%", &fails);
                if (f->ad32_bound > 0)
                    printf("  %-4s %-70s %9.0f%%\n", "", "  its bound: 31 more adapters read per step at the read bandwidth",
                           100 * f->ad32_bound);
            }
            if (f->ad32_prefill < 1e9) {
                snprintf(what, sizeof what, "%s %s: 32 adapters keep >= 90%% of 1-adapter prefill tok/s, batch >= 32",
                         SHAPES[si].name, wn);
                target(what, 100 * f->ad32_prefill, 90, "%.0f%%", &fails);
            }
            if (f->ad128 > 0)
                printf("  %-4s %-70s %9.0f%%\n", "", "128 adapters / 1 adapter at batch >= 128 (reported)",
                       100 * f->ad128);
        }
        if (nw == 2 && figs[si][0].done && figs[si][1].done && figs[si][0].dec1 > 0) {
            const figs_t *a = &figs[si][0], *b = &figs[si][1];
            char what[128];
            snprintf(what, sizeof what, "%s: bf16 / fp32 decode tok/s at batch 1", SHAPES[si].name);
            target(what, b->dec1 / a->dec1, 1.7, "%.2fx", &fails);
            if (si == 3) continue;
            snprintf(what, sizeof what, "%s: bf16 / fp32 prefill tok/s (largest batch), not slower", SHAPES[si].name);
            target(what, b->prefill / a->prefill, 1.0, "%.2fx", &fails);
            snprintf(what, sizeof what, "%s: bf16 / fp32 train-step tok/s, not slower", SHAPES[si].name);
            target(what, b->train / a->train, 1.0, "%.2fx", &fails);
        }
    }
    printf("%d target(s) missed%s\n", fails, fails ? " (FAIL lines above)" : "");
    free(read_buf);
    return 0;
}

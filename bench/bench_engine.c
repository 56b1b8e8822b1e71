// bench_engine.c - engine throughput: prefill and decode tokens/s at several batch sizes with 1
// vs 32 distinct LoRA adapters, train-step tokens/s, and achieved GFLOP/s beside the backend's
// own GEMM GFLOP/s measured in the same run; by default for a ~3M and a ~25M parameter model on
// the CPU backend.
//
//   build/bin/marlaas-bench-engine [--quick] [--weights fp32|bf16]
//   build/cuda/bin/marlaas-bench-engine --backend cuda --weights bf16 --model DIR --batches 1,64,256
//       (DIR e.g. from `marlaas init-model --shape qwen2.5-0.5b`; tests/gpu/run.sh does this)
// --weights bf16 converts the base model's matrices to bf16 (model_to_bf16) before measuring.
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
// rows. One warm-up round, then rounds until MIN_SECONDS have been measured.
#define DEC 16
#define MIN_SECONDS 0.4

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
    double measured = 0, ntok = 0, flops = 0;
    for (int round = 0; measured < MIN_SECONDS; round++) {
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
        ntok += decode ? (double)B * DEC : (double)B * P;
        flops += decode ? engine_forward_flops(engine_model(e), (double)B * DEC, (double)B * DEC, P + DEC / 2.0)
                        : engine_forward_flops(engine_model(e), (double)B * P, (double)B, P / 2.0);
    }
    *gflops = flops / measured / 1e9;
    kvcache_destroy(&kc);
    free(tok), free(q), free(logits);
    return ntok / measured;
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
    } while ((t = util_now() - t0) < 1.0);
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

static void bench_model(const char *name, model_t *m, const int *batches, int n_batches, int P) {
    const hf_config_t *c = &m->cfg;
    const kernels_t *k = m->k;
    char err[ERR_LEN];
    lora_pool_t *pool = lora_pool_new(32);
    peft_config_t pc = {.r = 8, .alpha = 16, .targets = LORA_ALL_TARGETS};
    for (int i = 0; i < 32; i++) {
        lora_t *a = lora_new(c, &pc, k, (uint64_t)i + 1, err);
        if (!a) {
            fprintf(stderr, "bench: %s\n", err);
            exit(1);
        }
        // non-zero B matrices, so every adapter's product is real work (params are backend memory)
        float *host = xmalloc(sizeof(float) * a->n_params);
        for (size_t j = 0; j < a->n_params; j++) host[j] = 0.01f;
        k->to_dev(a->params, host, sizeof(float) * a->n_params);
        free(host);
        lora_pool_set(pool, i, &a, err);
    }
    engine_t *e = engine_new(m, pool, err);
    int D = c->hidden_size, F = c->intermediate_size;
    double peak = k == kernels_cpu() ? bench_sgemm_gflops(2048, 2048, 2048, 0.5) : backend_gemm_gflops(k, 4096, 4096, 4096, 1.0);
    double shaped = k == kernels_cpu() ? bench_sgemm_gflops(4096, F, D, 0.5) : backend_gemm_gflops(k, 4096, F, D, 1.0);
    printf("\nmodel %s on the %s backend: %.2fM parameters (D=%d L=%d H=%d KV=%d F=%d V=%d), %s matrices (%.1f MiB "
           "of weights), LoRA rank 8 on all 7 targets, prompts of %d tokens\n", name, k->name, m->n_params / 1e6, D,
           c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, F, c->vocab_size,
           m->bf16 ? "bf16" : "fp32", (m->n_f32 * 4.0 + m->n_bf16 * 2.0) / (1 << 20), P);
    printf("%s: %.1f GFLOP/s (%s), %.1f GFLOP/s (4096x%dx%d, the model's MLP shape)\n",
           k == kernels_cpu() ? "OpenBLAS sgemm" : "backend gemm (cuBLAS SGEMM, fp32)", peak,
           k == kernels_cpu() ? "2048^3" : "4096^3", shaped, F, D);
    printf("%-8s %5s | %12s %12s %6s | %8s %8s\n", "phase", "batch", "tok/s 1 ad", "tok/s 32 ad", "ratio", "GFLOP/s",
           "%gemm");
    double dec_small = 0, dec_mid = 0, worst_ratio = 1e9, best_frac = 0;
    int mid = 0;
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        for (int dec = 0; dec <= 1; dec++) {
            double g1, g32;
            double t1 = run_infer(e, c, B, P, 1, dec, &g1);
            double t32 = run_infer(e, c, B, P, 32, dec, &g32);
            if (dec && bi == 0) dec_small = t1;
            if (dec && B >= 32 && !mid) dec_mid = t1, mid = B;
            if (B >= 32 && t32 / t1 < worst_ratio) worst_ratio = t32 / t1;
            if (!dec && g1 / peak > best_frac) best_frac = g1 / peak;
            printf("%-8s %5d | %12.0f %12.0f %5.0f%% | %8.1f %7.0f%%\n", dec ? "decode" : "prefill", B, t1, t32,
                   100.0 * t32 / t1, g1, 100.0 * g1 / peak);
            fflush(stdout);
        }
    }
    float *grads[32];
    for (int i = 0; i < 32; i++) grads[i] = k->alloc(sizeof(float) * lora_pool_get(pool, i)->n_params);
    double tr1 = run_train(e, c, 8, P, 1, grads), tr8 = run_train(e, c, 8, P, 8, grads);
    // forward + backward of the frozen base with LoRA: about 3x the forward's FLOPs
    double train_gflops = 3.0 * engine_forward_flops(m, 8.0 * P, 8.0 * P / 2, P / 2.0) / (8.0 * P) * tr1 / 1e9;
    printf("train step (RL loss, fwd+bwd, LoRA grads), 8 x %d tokens: %.0f tok/s one adapter, %.0f tok/s 8 adapters in "
           "one pass (about %.1f GFLOP/s, %.0f%% of gemm)\n", P, tr1, tr8, train_gflops, 100 * train_gflops / peak);
    for (int i = 0; i < 32; i++) k->free(grads[i]);
    if (mid && worst_ratio < 1e9)
        printf("targets (%s): 32 adapters keep >= 90%% of 1-adapter tok/s at batch >= 32: %.0f%% %s | "
               "large-batch forward >= 50%% of gemm: %.0f%% %s | decode batch %d >= 8x batch %d: %.1fx %s\n",
               name, 100 * worst_ratio, worst_ratio >= 0.9 ? "PASS" : "FAIL", 100 * best_frac,
               best_frac >= 0.5 ? "PASS" : "FAIL", mid, batches[0], dec_mid / dec_small,
               dec_mid / dec_small >= 8 ? "PASS" : "FAIL");
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

int main(int argc, char **argv) {
    int quick = 0, P = 64;
    const char *backend = "cpu", *model_dir = NULL, *batches_s = NULL, *weights = "fp32";
    static struct option opts[] = {{"quick", no_argument, NULL, 'q'},      {"backend", required_argument, NULL, 'b'},
                                   {"model", required_argument, NULL, 'm'}, {"batches", required_argument, NULL, 'B'},
                                   {"prompt", required_argument, NULL, 'p'}, {"weights", required_argument, NULL, 'w'},
                                   {"help", no_argument, NULL, 'h'},         {0}};
    int o;
    while ((o = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (o == 'q') quick = 1;
        else if (o == 'b') backend = optarg;
        else if (o == 'm') model_dir = optarg;
        else if (o == 'w') weights = optarg;
        else if (o == 'B') batches_s = optarg;
        else if (o == 'p') P = atoi(optarg);
        else {
            printf("usage: %s [--quick] [--backend cpu|cuda] [--weights fp32|bf16] [--model DIR] [--batches 1,8,32,128] "
                   "[--prompt 64]\n", argv[0]);
            return o == 'h' ? 0 : 2;
        }
    }
    if (strcmp(weights, "fp32") != 0 && strcmp(weights, "bf16") != 0) {
        fprintf(stderr, "bench: unknown --weights '%s' (fp32 or bf16)\n", weights);
        return 2;
    }
    bool bf16 = !strcmp(weights, "bf16");
    if (P < 1 || P > 4096) {
        fprintf(stderr, "bench: --prompt must be in 1..4096\n");
        return 2;
    }
    int batches[16] = {1, 8, 32, 128}, n_batches = quick ? 3 : 4;
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
    util_threads_init();
    bench_machine();
    char err[ERR_LEN];
    if (model_dir) {
        model_t *m = model_load(model_dir, k, err);
        if (m && bf16 && model_to_bf16(m, err)) model_destroy(&m);
        if (!m) {
            fprintf(stderr, "bench: %s\n", err);
            return 1;
        }
        bench_model(model_dir, m, batches, n_batches, P);
        model_destroy(&m);
        return 0;
    }
    shape_t shapes[2] = {{"3M", shape(256, 4, 4, 2, 688, 512)}, {"25M", shape(512, 8, 8, 4, 1536, 512)}};
    for (int si = 0; si < 2; si++) {
        model_t *m = model_new(&shapes[si].c, k, err);
        if (!m) {
            fprintf(stderr, "bench: %s\n", err);
            return 1;
        }
        model_init_random(m, 1);
        if (bf16 && model_to_bf16(m, err)) {
            fprintf(stderr, "bench: %s\n", err);
            return 1;
        }
        bench_model(shapes[si].name, m, batches, n_batches, P);
        model_destroy(&m);
    }
    return 0;
}

// sim_calibrate.c - measures this machine as a simulated device (the `cpu` entry of
// common/sim/params.json, measured): the sgemm rate and the read bandwidth of one thread, then the
// engine's real step times on a model for a set of shapes (decode and prefill steps across
// adapters, training passes of groups sharing their prompt as the trainer packs them, with the
// optimiser; each shape the fastest of four rounds over all of them), and fits the device's six
// efficiency and overhead figures (gemm_efficiency, backward_efficiency, launch_us,
// step_overhead_us, gemm_half_rows, attention_efficiency) so that the simulator's cost of each
// shape matches its measurement (least squares of the log ratio: a grid, then each figure in turn
// by ever finer factors). Writes a parameter file for MARLAAS_SIM_PARAMS with the device
// "cpu-measured", whose steps share this machine's cores (shared_cores) with the other processes as
// the real services' steps do.
//
//   marlaas-sim-calibrate MODEL_DIR OUT.json
//   marlaas-sim-calibrate --probe MODEL_DIR OUT.json
//
// The machine's speed moves from one minute to the next (a 2-core cloud VM: the same run takes up
// to a quarter longer, a fit's shapes measured ten seconds apart a fifth), so a fitted device
// holds the relative costs of the shapes and a moment's speed. --probe measures a few of the
// shapes again (a third of a second) and prints the machine's speed now against OUT.json's device:
// "speed S", S = the geometric mean of modelled / measured over the probe's shapes (S < 1: slower
// than the device). bench/sim_calibrate.sh scales the device by it for a run measured then.
//
// One engine thread (MARLAAS_THREADS=1), as the services of a local cluster run.
#include <math.h>
#include <stdbool.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "common/engine/engine.h"
#include "common/rl/rl.h"
#include "common/sim/sim.h"

#define MAX_SHAPES 32
#define FIT_ROUNDS 4   // rounds over the fit's shapes (about 2.5 s each on models/micro)

typedef struct {
    char name[64];
    sim_mode_t mode;
    sim_seq_t *q;
    int n, n_adapters;
    double params, measured;
} shape_t;

static shape_t shapes[MAX_SHAPES];
static int n_shapes;

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1], v[j - 1] = x;
        }
    return v[n / 2];
}

// A shape measured again (the fit's rounds) keeps its fastest round: the machine's slow spells
// only add time, and a spell that falls on some shapes and not others would bend their relative
// costs. Returns whether the shape was already there.
static bool measured_again(const char *name, double measured) {
    for (int i = 0; i < n_shapes; i++)
        if (!strcmp(shapes[i].name, name)) {
            if (measured < shapes[i].measured) shapes[i].measured = measured;
            return true;
        }
    return false;
}

// An inference shape measured: n sequences of n_new rows after past positions, each needing one
// row of logits, adapters spread over n_adapters slots.
static void infer_shape(rl_runtime_t *rt, const char *name, int n, int n_new, int past, int n_adapters, double measured) {
    if (measured_again(name, measured)) return;
    shape_t *s = &shapes[n_shapes++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->mode = SIM_INFER;
    s->n = n;
    s->q = xcalloc((size_t)n, sizeof(sim_seq_t));
    for (int i = 0; i < n; i++) {
        const lora_t *a = n_adapters ? lora_pool_get(rt->pool, i % n_adapters) : NULL;
        s->q[i] = (sim_seq_t){.n_new = n_new, .past = past, .n_logits = 1, .slot = a ? i % n_adapters : -1,
                              .rank = a ? a->cfg.r : 0, .targets = a ? a->cfg.targets : 0};
    }
    s->measured = measured;
}

// n sequences of ctx tokens each in the cache, then REPS decode steps of one row per sequence
// (sampling included, as the generator's step), the sequences cut back to ctx after each.
static void decode_shape(rl_runtime_t *rt, int n, int ctx, int n_adapters, const char *name) {
    char err[ERR_LEN];
    const kernels_t *k = rt->model->k;
    int V = rt->model->cfg.vocab_size;
    int *seq = xmalloc(sizeof(int) * (size_t)n);
    engine_seq_t *rows = xcalloc((size_t)n, sizeof *rows);
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)n * ctx);
    for (int i = 0; i < n * ctx; i++) tok[i] = 3 + i % 60;
    for (int i = 0; i < n; i++) {
        seq[i] = kvcache_seq_new(rt->kc, err);
        ASSERT(seq[i] >= 0);
        rows[i] = (engine_seq_t){.tokens = tok + (size_t)i * ctx, .n_tokens = ctx, .kv_seq = seq[i],
                                 .slot = n_adapters ? i % n_adapters : -1, .logits = ENGINE_LOGITS_NONE};
    }
    for (int i = 0; i < n; i += 64)
        if (engine_step(rt->engine, rt->kc, rows + i, n - i < 64 ? n - i : 64, NULL, err)) {
            fprintf(stderr, "prefill: %s\n", err);
            exit(1);
        }
    for (int i = 0; i < n; i++) rows[i].n_tokens = 1, rows[i].logits = ENGINE_LOGITS_LAST;
    float *temp = xmalloc(sizeof(float) * (size_t)n * 4), *top_p = temp + n, *u = temp + 2 * n, *lp = temp + 3 * n;
    int *top_k = xcalloc((size_t)n, sizeof(int));
    int32_t *out = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) temp[i] = 1.0f, top_p[i] = 1.0f, u[i] = 0.37f;
    enum { REPS = 15 };
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = util_now();
        if (engine_step(rt->engine, rt->kc, rows, n, NULL, err)) {
            fprintf(stderr, "decode: %s\n", err);
            exit(1);
        }
        k->sample(out, lp, engine_step_logits(rt->engine), n, V, temp, top_k, top_p, u);
        t[r] = util_now() - t0;
        for (int i = 0; i < n; i++) kvcache_seq_truncate(rt->kc, seq[i], ctx);
    }
    for (int i = 0; i < n; i++) kvcache_seq_free(rt->kc, seq[i]);
    infer_shape(rt, name, n, 1, ctx, n_adapters, median(t, REPS));
    free(seq), free(rows), free(tok), free(temp), free(top_k), free(out);
}

// n fresh sequences of len prompt tokens prefilled in one step.
static void prefill_shape(rl_runtime_t *rt, int n, int len, int n_adapters, const char *name) {
    char err[ERR_LEN];
    engine_seq_t *rows = xcalloc((size_t)n, sizeof *rows);
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)n * len);
    for (int i = 0; i < n * len; i++) tok[i] = 3 + i % 60;
    enum { REPS = 11 };
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        for (int i = 0; i < n; i++) {
            int sq = kvcache_seq_new(rt->kc, err);
            ASSERT(sq >= 0);
            rows[i] = (engine_seq_t){.tokens = tok + (size_t)i * len, .n_tokens = len, .kv_seq = sq,
                                     .slot = n_adapters ? i % n_adapters : -1, .logits = ENGINE_LOGITS_LAST};
        }
        double t0 = util_now();
        if (engine_step(rt->engine, rt->kc, rows, n, NULL, err)) {
            fprintf(stderr, "prefill: %s\n", err);
            exit(1);
        }
        t[r] = util_now() - t0;
        for (int i = 0; i < n; i++) kvcache_seq_free(rt->kc, rows[i].kv_seq);
    }
    infer_shape(rt, name, n, len, 0, n_adapters, median(t, REPS));
    free(rows), free(tok);
}

// A training step as the trainer packs it (common/rl/batch.c, shared prompts): for each of `groups`
// groups its prompt less the last token once (P - 1 tokens), then G samples of P + C tokens that
// continue it (loss on the C completion tokens), groups spread over n_adapters adapters; then
// AdamW over each adapter: what the trainer runs per step.
static void train_shape(rl_runtime_t *rt, int groups, int G, int P, int C, int n_adapters, const char *name) {
    char err[ERR_LEN];
    const kernels_t *k = rt->model->k;
    int n = groups * (G + 1), len = P + C;
    engine_train_seq_t *q = xcalloc((size_t)n, sizeof *q);
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)len);
    float *w = xmalloc(sizeof(float) * (size_t)len), *old = xmalloc(sizeof(float) * (size_t)len);
    for (int t = 0; t < len; t++) tok[t] = 3 + t % 60, w[t] = t >= P, old[t] = -2.0f;
    for (int g = 0, i = 0; g < groups; g++) {
        int slot = g % n_adapters, first = i;
        q[i++] = (engine_train_seq_t){.tokens = tok, .len = P - 1, .slot = slot};
        for (int s = 0; s < G; s++)
            q[i++] = (engine_train_seq_t){.tokens = tok, .len = len, .slot = slot, .weight = w, .old_logp = old,
                                          .advantage = (s % 2) ? 1.0f : -1.0f, .on_policy = true,
                                          .prefix_of = first + 1, .prefix_len = P - 1};
    }
    int slots = lora_pool_slots(rt->pool);
    float **grads = xcalloc((size_t)slots, sizeof(float *)), **m = xcalloc((size_t)slots, sizeof(float *)),
          **v = xcalloc((size_t)slots, sizeof(float *));
    double params = 0;
    for (int a = 0; a < n_adapters; a++) {
        size_t np = lora_pool_get(rt->pool, a)->n_params;
        grads[a] = k->alloc(sizeof(float) * np), m[a] = k->alloc(sizeof(float) * np), v[a] = k->alloc(sizeof(float) * np);
        params += (double)np;
    }
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f};
    loss_stats_t *st = xcalloc((size_t)slots + 1, sizeof *st);
    enum { REPS = 9 };
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = util_now();
        for (int a = 0; a < n_adapters; a++) k->zero(grads[a], sizeof(float) * lora_pool_get(rt->pool, a)->n_params);
        if (engine_train(rt->engine, q, n, &lc, NULL, grads, st, slots + 1, err)) {
            fprintf(stderr, "train: %s\n", err);
            exit(1);
        }
        for (int a = 0; a < n_adapters; a++) {
            lora_t *ad = lora_pool_get(rt->pool, a);
            k->adamw(ad->params, grads[a], m[a], v[a], ad->n_params, 0.0f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.001f, 1.0f);
        }
        t[r] = util_now() - t0;
    }
    if (measured_again(name, median(t, REPS))) goto done;
    shape_t *s = &shapes[n_shapes++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->mode = SIM_TRAIN;
    s->n = n;
    s->n_adapters = n_adapters;
    s->params = params;
    s->q = xcalloc((size_t)n, sizeof(sim_seq_t));
    // as the simulated engine sees the pass (engine.c sim_run): each sequence's own rows after its prefix
    for (int i = 0; i < n; i++) {
        const lora_t *a = lora_pool_get(rt->pool, q[i].slot);
        int own = q[i].len - q[i].prefix_len;
        s->q[i] = (sim_seq_t){.n_new = own, .past = q[i].prefix_len, .n_logits = q[i].weight ? C : 0, .slot = q[i].slot,
                              .rank = a->cfg.r, .targets = a->cfg.targets};
    }
    s->measured = median(t, REPS);
done:
    for (int a = 0; a < n_adapters; a++) k->free(grads[a]), k->free(m[a]), k->free(v[a]);
    free(grads), free(m), free(v), free(q), free(tok), free(w), free(old), free(st);
}

// GB/s of reading a buffer of `bytes` (a vectorised sum, as bench_read_gbs) over and over on one
// thread: the bandwidth a model whose weights take that much sees (from the caches when it fits).
static double read_gbs_of(size_t bytes, double seconds) {
    size_t n = bytes / sizeof(float) / 64 * 64;
    if (n < 64) n = 64;
    float *a = falloc(n);
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    volatile float sink = 0;
    double best = 0, t_end = util_now() + seconds;
    while (util_now() < t_end) {
        int reps = (int)(((size_t)64 << 20) / (n * sizeof(float))) + 1;
        double t0 = util_now();
        for (int r = 0; r < reps; r++) sink += bench_read_sum(a, n);
        double gbs = (double)reps * n * sizeof(float) / (util_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    (void)sink;
    free(a);
    return best;
}

// The cores the services share (this process's affinity mask, else the online cores).
static int machine_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

static double fit_error(const sim_device_t *d, const hf_config_t *mc, bool print) {
    char err[ERR_LEN];
    sim_opts_t o = {.scale = 1};
    sim_t *s = sim_open_with(d, mc, &o, err);
    if (!s) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    double e = 0;
    for (int i = 0; i < n_shapes; i++) {
        double p = sim_cost(s, shapes[i].q, shapes[i].n, shapes[i].mode, shapes[i].n_adapters, shapes[i].params);
        double l = log(p / shapes[i].measured);
        e += l * l;
        if (print)
            printf("  %-34s measured %9.1f us  modelled %9.1f us  %+6.1f %%\n", shapes[i].name, shapes[i].measured * 1e6,
                   p * 1e6, 100 * (p / shapes[i].measured - 1));
    }
    sim_close(&s);
    return e;
}

// The probe: shapes of the fit that measure in a third of a second, decode, prefill and training.
static void probe_shapes(rl_runtime_t *rt) {
    decode_shape(rt, 128, 14, 1, "decode 128 rows, 1 adapter");
    prefill_shape(rt, 64, 12, 4, "prefill 64 x 12, 4 adapters");
    train_shape(rt, 16, 8, 14, 2, 1, "train 16 x 8, 14 + 2, 1 adapter");
    train_shape(rt, 32, 8, 14, 4, 2, "train 32 x 8, 14 + 4, 2 adapters");
}

static void add_adapters(rl_runtime_t *rt) {
    char err[ERR_LEN];
    peft_config_t pc = {.r = 8, .alpha = 16, .targets = LORA_ALL_TARGETS};
    for (int a = 0; a < 8; a++) {
        lora_t *ad = lora_new(&rt->model->cfg, &pc, rt->model->k, 100 + a, err);
        if (!ad || lora_pool_set(rt->pool, a, &ad, err)) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
    }
}

// --probe: the probe's shapes against the fitted device of fit_path.
static int probe(rl_runtime_t *rt, const char *fit_path) {
    char err[ERR_LEN];
    setenv("MARLAAS_SIM_PARAMS", fit_path, 1);
    sim_opts_t o = {.scale = 1};
    sim_t *sim = sim_open("cpu-measured", &rt->model->cfg, &o, err);
    if (!sim) {
        fprintf(stderr, "%s: %s (write it with marlaas-sim-calibrate MODEL_DIR %s)\n", fit_path, err, fit_path);
        return 1;
    }
    // a round to warm the process (its first steps fault the weights and the buffers in), then the probe
    probe_shapes(rt);
    for (int i = 0; i < n_shapes; i++) free(shapes[i].q);
    n_shapes = 0;
    probe_shapes(rt);
    double sum = 0;
    for (int i = 0; i < n_shapes; i++) {
        const shape_t *sh = &shapes[i];
        double p = sim_cost(sim, sh->q, sh->n, sh->mode, sh->n_adapters, sh->params);
        printf("  %-34s measured %9.1f us  modelled %9.1f us  %+6.1f %%\n", sh->name, sh->measured * 1e6, p * 1e6,
               100 * (p / sh->measured - 1));
        sum += log(p / sh->measured);
    }
    printf("speed %.4f\n", exp(sum / n_shapes));
    sim_close(&sim);
    return 0;
}

int main(int argc, char **argv) {
    bool probing = argc == 4 && !strcmp(argv[1], "--probe");
    if (!probing && argc != 3) {
        fprintf(stderr, "usage: marlaas-sim-calibrate MODEL_DIR OUT.json\n"
                        "       marlaas-sim-calibrate --probe MODEL_DIR OUT.json\n");
        return 2;
    }
    const char *model_dir = argv[probing ? 2 : 1];
    util_threads_init();
    char err[ERR_LEN];
    if (!probing) bench_machine();
    rl_runtime_cfg_t cfg = {.n_slots = 8, .max_seqs = 1024};
    rl_runtime_t *rt = rl_runtime_open(model_dir, &cfg, err);
    if (!rt) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (probing) {
        add_adapters(rt);
        int rc = probe(rt, argv[3]);
        for (int i = 0; i < n_shapes; i++) free(shapes[i].q);
        rl_runtime_close(&rt);
        return rc;
    }
    // the read bandwidth of a working set of the model's weights (twice, at least 64 KiB): a
    // model that fits in the caches streams from them, not from memory
    size_t wbytes = rt->model->n_params * sizeof(float) * 2;
    double flops = bench_sgemm_gflops(512, 512, 512, 1.0) * 1e9, bw = read_gbs_of(wbytes < 65536 ? 65536 : wbytes, 1.0) * 1e9,
           dram = bench_read_gbs(1, 1.0) * 1e9;
    printf("measured: sgemm %.1f GFLOP/s, read bandwidth %.1f GB/s over %.0f KiB (the weights, twice), %.1f GB/s from memory "
           "(%d thread)\n", flops / 1e9, bw / 1e9, wbytes / 1024.0, dram / 1e9, util_threads());
    const hf_config_t *mc = &rt->model->cfg;
    add_adapters(rt);
    // shapes of the benchmark's services on this model: decode and prefill steps of one to several
    // jobs' groups, training passes of one to four jobs' steps (16 prompts x 8 samples of a dozen
    // tokens each), measured in FIT_ROUNDS rounds over all of them, each keeping its fastest
    for (int round = 0; round < FIT_ROUNDS; round++) {
        decode_shape(rt, 1, 14, 1, "decode 1 row, ctx 14");
        decode_shape(rt, 16, 14, 1, "decode 16 rows");
        decode_shape(rt, 128, 14, 1, "decode 128 rows, 1 adapter");
        decode_shape(rt, 512, 14, 4, "decode 512 rows, 4 adapters");
        decode_shape(rt, 512, 30, 8, "decode 512 rows, ctx 30, 8 adapters");
        decode_shape(rt, 256, 24, 8, "decode 256 rows, ctx 24, 8 adapters");
        prefill_shape(rt, 16, 12, 1, "prefill 16 x 12");
        prefill_shape(rt, 64, 12, 4, "prefill 64 x 12, 4 adapters");
        prefill_shape(rt, 64, 22, 8, "prefill 64 x 22, 8 adapters");
        train_shape(rt, 16, 8, 14, 2, 1, "train 16 x 8, 14 + 2, 1 adapter");
        train_shape(rt, 16, 8, 14, 6, 1, "train 16 x 8, 14 + 6, 1 adapter");
        train_shape(rt, 32, 8, 14, 4, 2, "train 32 x 8, 14 + 4, 2 adapters");
        train_shape(rt, 64, 8, 16, 4, 4, "train 64 x 8, 16 + 4, 4 adapters");
        train_shape(rt, 16, 8, 20, 16, 1, "train 16 x 8, 20 + 16, 1 adapter");
        train_shape(rt, 32, 8, 24, 10, 4, "train 32 x 8, 24 + 10, 4 adapters");
        train_shape(rt, 64, 8, 18, 6, 8, "train 64 x 8, 18 + 6, 8 adapters");
    }
    // the grid: the four overhead figures
    sim_device_t d = {.name = "cpu-measured", .flops = flops, .bandwidth = bw, .memory = 8e9, .link_bandwidth = 5e9,
                      .weight_bytes = 4, .gemm_efficiency = 1.0, .bandwidth_efficiency = 1.0, .activation_reserve = 0.08,
                      .host_overlap = 0};
    sim_device_t best = d;
    double best_e = INFINITY;
    for (double be = 0.5; be <= 2.0; be += 0.25)
    for (double ge = 0.02; ge <= 1.0; ge *= 1.5)
        for (double lu = 0.01; lu < 40; lu *= 2.5)
            for (double su = 0; su < 800; su = su < 1 ? 2 : su * 3)
                for (double hr = 0.25; hr <= 512; hr *= 4)
                    for (double ae = 0.002; ae <= 0.6; ae *= 2) {
                        d.backward_efficiency = be, d.gemm_efficiency = ge, d.launch_s = lu * 1e-6, d.step_overhead_s = su * 1e-6, d.gemm_half_rows = hr;
                        d.attention_efficiency = ae;
                        double e = fit_error(&d, mc, false);
                        if (e < best_e) best_e = e, best = d;
                    }
    // then each figure in turn by ever finer factors while the error falls (the grid's steps are coarse)
    double *fig[6] = {&best.backward_efficiency, &best.gemm_efficiency, &best.launch_s, &best.step_overhead_s,
                      &best.gemm_half_rows, &best.attention_efficiency};
    const double lo[6] = {0.05, 1e-3, 1e-9, 1e-7, 1e-3, 1e-4}, hi[6] = {4, 1, 1e-3, 1e-2, 4096, 1};
    for (int i = 0; i < 6; i++)
        if (*fig[i] < lo[i]) *fig[i] = lo[i];   // a zero overhead of the grid: a factor moves it
    best_e = fit_error(&best, mc, false);
    for (double f = 1.5; f > 1.002; f = 1 + (f - 1) * 0.6)
        for (bool moved = true; moved;) {
            moved = false;
            for (int i = 0; i < 6; i++)
                for (int dir = -1; dir <= 1; dir += 2) {
                    double keep = *fig[i], x = dir > 0 ? keep * f : keep / f;
                    if (x < lo[i] || x > hi[i]) continue;
                    *fig[i] = x;
                    double e = fit_error(&best, mc, false);
                    if (e < best_e - 1e-12) best_e = e, moved = true;
                    else *fig[i] = keep;
                }
        }
    printf("fit: backward efficiency %.2f, gemm efficiency %.3f, launch %.2f us, step overhead %.1f us, gemm_half_rows %.2f, attention efficiency %.3f "
           "(rms log error %.3f)\n", best.backward_efficiency, best.gemm_efficiency, best.launch_s * 1e6, best.step_overhead_s * 1e6, best.gemm_half_rows, best.attention_efficiency,
           sqrt(best_e / n_shapes));
    fit_error(&best, mc, true);
    FILE *f = fopen(argv[2], "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    fprintf(f, "{\"devices\": {\"cpu-measured\": {\"description\": \"this machine, one engine thread, fp32 (measured)\",\n"
               " \"flops\": %.6g, \"bandwidth\": %.6g, \"memory\": 8e9, \"link_bandwidth\": 5e9, \"weight_bytes\": 4,\n"
               " \"gemm_efficiency\": %.4g, \"backward_efficiency\": %.4g, \"bandwidth_efficiency\": 1.0,\n"
               " \"activation_reserve\": 0.08, \"host_overlap\": 0, \"shared_cores\": %d,\n"
               " \"launch_us\": %.4g, \"step_overhead_us\": %.4g, \"gemm_half_rows\": %.4g, \"attention_efficiency\": %.4g,\n"
               " \"link_latency_us\": 0,\n"
               " \"source\": \"marlaas-sim-calibrate %s: sgemm and read bandwidth of one thread measured; "
               "the efficiencies and overheads fitted to %d engine steps and training passes measured on this machine (rms log error %.3f)\"}}}\n",
            best.flops, best.bandwidth, best.gemm_efficiency, best.backward_efficiency, machine_cores(), best.launch_s * 1e6, best.step_overhead_s * 1e6, best.gemm_half_rows,
            best.attention_efficiency, argv[1], n_shapes, sqrt(best_e / n_shapes));
    fclose(f);
    for (int i = 0; i < n_shapes; i++) free(shapes[i].q);
    rl_runtime_close(&rt);
    return 0;
}

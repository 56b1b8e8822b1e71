// test_sim.c - the simulated backend: its cost model against the physical bounds it models, the
// device memory rule, completion lengths, learning curves, parameter files, modelled adapters,
// the bookkeeping-only KV cache, and a generator and a training pass on a simulated engine.
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/engine/generate.h"
#include "common/engine/lora.h"
#include "common/formats/peft.h"
#include "common/rl/rl.h"
#include "common/sim/sim.h"
#include "common/util/util.h"

static hf_config_t load_cfg(const char *dir) {
    hf_config_t c;
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(hf_config_load(&c, path, err), 0, "%s", err);
    return c;
}

static sim_t *open_dev(const char *dev, const hf_config_t *c, int devices) {
    char err[ERR_LEN];
    sim_opts_t o = {.scale = 1e6, .devices = devices};
    sim_t *s = sim_open(dev, c, &o, err);
    cr_assert_not_null(s, "%s", err);
    return s;
}

// n sequences of one new row each after `past` positions, all needing logits, adapters as given
static double decode_cost(const sim_t *s, int n, int past, int n_adapters) {
    sim_seq_t *q = calloc((size_t)n, sizeof *q);
    for (int i = 0; i < n; i++)
        q[i] = (sim_seq_t){.n_new = 1, .past = past, .n_logits = 1, .slot = n_adapters ? i % n_adapters : -1,
                           .rank = n_adapters ? 16 : 0, .targets = n_adapters ? LORA_ALL_TARGETS : 0};
    double t = sim_cost(s, q, n, SIM_INFER, 0, 0);
    free(q);
    return t;
}

Test(sim, decode_is_bounded_by_the_bandwidth_and_prefill_by_the_flops) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    sim_t *s = open_dev("h100", &c, 1);
    const sim_device_t *d = sim_device(s);
    double w = sim_weight_bytes(s);
    // Qwen3-8B: 8.19e9 parameters in bf16
    cr_assert(fabs(w / 2 - 8.19e9) < 0.01e9, "weights %.3g", w);
    // batch-1 decode streams every weight once: at least bytes / bandwidth, at most that at the
    // modelled efficiency plus the launches and the step overhead
    double t1 = decode_cost(s, 1, 0, 0), lo = w / d->bandwidth;
    double hi = w / (d->bandwidth * d->bandwidth_efficiency) + 40 * d->launch_s * c.num_hidden_layers + d->step_overhead_s;
    cr_assert(t1 > lo && t1 < hi, "decode b1 %.3g s outside (%.3g, %.3g)", t1, lo, hi);
    // a long prefill is compute-bound: at least FLOPs / peak, at most FLOPs / (peak * efficiency) + 30 %
    sim_seq_t q = {.n_new = 4096, .past = 0, .n_logits = 1, .slot = -1};
    double flops = 2.0 * 4096 * (w / 2), tp = sim_cost(s, &q, 1, SIM_INFER, 0, 0);
    cr_assert(tp > flops / d->flops, "prefill %.3g below the compute bound %.3g", tp, flops / d->flops);
    cr_assert(tp < 1.3 * flops / (d->flops * d->gemm_efficiency), "prefill %.3g", tp);
    // more rows never cost less; a batch of 64 decodes costs far less than 64 single ones
    double t64 = decode_cost(s, 64, 512, 0), t65 = decode_cost(s, 65, 512, 0);
    cr_assert(t65 >= t64 && t64 > t1 && t64 < 8 * t1, "b1 %.3g b64 %.3g b65 %.3g", t1, t64, t65);
    // longer contexts read more KV
    cr_assert(decode_cost(s, 64, 4000, 0) > t64);
    // 32 distinct adapters cost more than one adapter for the same rows, which costs more than none
    double a0 = decode_cost(s, 64, 512, 0), a1 = decode_cost(s, 64, 512, 1), a32 = decode_cost(s, 64, 512, 32);
    cr_assert(a32 > a1 && a1 > a0, "adapters: none %.4g one %.4g 32 %.4g", a0, a1, a32);
    sim_close(&s);
}

Test(sim, devices_differ_as_their_datasheets) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    sim_t *h100 = open_dev("h100", &c, 1), *h200 = open_dev("H200", &c, 1), *a100 = open_dev("a100", &c, 1);
    // decode: bandwidth (H200 4.8 TB/s > H100 3.35 > A100 2.04)
    cr_assert(decode_cost(h200, 8, 256, 0) < decode_cost(h100, 8, 256, 0));
    cr_assert(decode_cost(h100, 8, 256, 0) < decode_cost(a100, 8, 256, 0));
    // prefill: the same peak on H100 and H200, three times less on the A100
    sim_seq_t q = {.n_new = 8192, .n_logits = 1, .slot = -1};
    double th = sim_cost(h100, &q, 1, SIM_INFER, 0, 0), t2 = sim_cost(h200, &q, 1, SIM_INFER, 0, 0),
           ta = sim_cost(a100, &q, 1, SIM_INFER, 0, 0);
    cr_assert(fabs(th - t2) / th < 0.05, "h100 %.3g h200 %.3g", th, t2);
    cr_assert(ta / th > 2.5 && ta / th < 3.5, "a100/h100 %.3g", ta / th);
    sim_close(&h100), sim_close(&h200), sim_close(&a100);
}

Test(sim, training_splits_over_devices_and_pays_the_allreduce) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    sim_t *one = open_dev("h100", &c, 1), *eight = open_dev("h100", &c, 8);
    sim_seq_t q[64];
    for (int i = 0; i < 64; i++) q[i] = (sim_seq_t){.n_new = 300 + 10 * i, .past = 0, .n_logits = 200, .slot = 0, .rank = 16, .targets = 127};
    double params = 4e7;
    double t1 = sim_cost(one, q, 64, SIM_TRAIN, 1, params), t8 = sim_cost(eight, q, 64, SIM_TRAIN, 1, params);
    cr_assert(t8 < t1 / 4 && t8 > t1 / 8, "1 device %.3g s, 8 devices %.3g s", t1, t8);
    // a training pass costs more than the forward of the same sequences
    cr_assert(t1 > 2 * sim_cost(one, q, 64, SIM_INFER, 0, 0));
    sim_close(&one), sim_close(&eight);
}

Test(sim, kv_blocks_fill_the_memory_left) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    sim_t *s = open_dev("h100", &c, 1);
    const sim_device_t *d = sim_device(s);
    char err[ERR_LEN];
    double ap = 4.36e7;
    int64_t b = sim_kv_blocks(s, 16, 32, ap, err);
    cr_assert_gt(b, 0, "%s", err);
    double used = sim_weight_bytes(s) + 32 * ap * 2 + (double)b * sim_kv_block_bytes(s, 16),
           cap = d->memory * (1 - d->activation_reserve);
    cr_assert(used <= cap && used + sim_kv_block_bytes(s, 16) > cap, "used %.4g of %.4g", used, cap);
    // Qwen3-8B's KV: 36 layers x 8 heads x 128 x 2 (K, V) x 2 bytes = 147456 bytes per position
    cr_assert_float_eq(sim_kv_block_bytes(s, 1), 147456.0, 1e-6);
    // a model that does not fit: refused with the reason
    hf_config_t big = c;
    big.num_hidden_layers = 400;
    sim_t *sb = open_dev("a100", &big, 1);
    cr_assert_eq(sim_kv_blocks(sb, 16, 1, ap, err), -1);
    cr_assert(strstr(err, "no room"), "%s", err);
    int jobs = 64;
    cr_assert_eq(sim_trainer_fit(sb, 2048, &jobs, err), -1);
    sim_close(&s), sim_close(&sb);
}

Test(sim, lengths_follow_their_distribution) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    char err[ERR_LEN];
    const char *specs[3] = {"fixed:37", "uniform:10,30", "lognormal:200,0.8"};
    for (int k = 0; k < 3; k++) {
        sim_opts_t o = {.scale = 60, .lengths = specs[k]};
        sim_t *s = sim_open("h100", &c, &o, err);
        cr_assert_not_null(s, "%s", err);
        rng_t r;
        rng_seed(&r, 7);
        enum { N = 20001 };
        static int v[N];
        double sum = 0;
        int capped = 0;
        for (int i = 0; i < N; i++) {
            v[i] = sim_length(s, &r, 1000);
            cr_assert(v[i] >= 1 && v[i] <= 1000);
            capped += v[i] == 1000;
            sum += v[i];
        }
        if (k == 0)
            for (int i = 0; i < N; i++) cr_assert_eq(v[i], 37);
        if (k == 1) cr_assert(fabs(sum / N - 20) < 0.3, "uniform mean %.3f", sum / N);
        if (k == 2) {
            int below = 0;
            for (int i = 0; i < N; i++) below += v[i] <= 200;
            // the median is 200; P(X > 1000) = P(Z > ln 5 / 0.8) = 2.2 %: the cap cuts the tail
            cr_assert(fabs((double)below / N - 0.5) < 0.02, "P(len <= 200) %.3f", (double)below / N);
            cr_assert(capped > N * 0.015 && capped < N * 0.03, "capped %d", capped);
        }
        sim_close(&s);
    }
    sim_lengths_t l;
    cr_assert_eq(sim_lengths_parse("lognormal:0,1", &l, err), -1);
    cr_assert_eq(sim_lengths_parse("uniform:5,2", &l, err), -1);
    cr_assert_eq(sim_lengths_parse("pareto:1,2", &l, err), -1);
    cr_assert(strstr(err, "lognormal:MEDIAN,SIGMA"), "%s", err);
}

Test(sim, rewards_follow_the_learning_curve) {
    sim_curve_t c;
    cr_assert_eq(sim_task_curve("sim-medium", &c), 0);
    cr_assert_eq(sim_task_curve("add2", &c), -1);
    cr_assert(sim_is_task("sim-hard") && !sim_is_task("sim-nope") && !sim_is_task(NULL));
    cr_assert_eq(sim_task_curve("sim-medium", &c), 0);
    // the mean reward at 0 steps is the curve's start, after many steps its ceiling
    const double steps[3] = {0, c.tau, 50 * c.tau};
    for (int k = 0; k < 3; k++) {
        double sum = 0;
        int n = 0;
        for (uint64_t g = 0; g < 400; g++)
            for (uint64_t i = 0; i < 16; i++, n++) sum += sim_reward(&c, steps[k], 12345, g, i, false);
        double p = sim_curve_p(&c, steps[k]);
        cr_assert(fabs(sum / n - p) < 0.03, "steps %.0f: mean %.3f, curve %.3f", steps[k], sum / n, p);
    }
    cr_assert(fabs(sim_curve_p(&c, 0) - c.start) < 1e-12 && fabs(sim_curve_p(&c, 1e6) - c.ceiling) < 1e-9);
    // deterministic in its inputs, different across keys
    int same = 0, diff = 0;
    for (uint64_t g = 0; g < 200; g++) {
        same += sim_reward(&c, 10, 1, g, 0, true) == sim_reward(&c, 10, 1, g, 0, true);
        diff += sim_reward(&c, 10, 1, g, 0, true) != sim_reward(&c, 10, 2, g, 0, true);
    }
    cr_assert_eq(same, 200);
    cr_assert_gt(diff, 40);
    // the simulated tasks are found by name, not listed with the built-in families
    cr_assert_not_null(task_find("sim-easy"));
    for (int i = 0; i < task_count(); i++) cr_assert_neq(strncmp(task_at(i)->name, "sim-", 4), 0);
    task_example_t ex;
    task_example(task_find("sim-hard"), TASK_TRAIN, 3, &ex);
    cr_assert_eq(sim_task_curve("sim-hard", &c), 0);
    cr_assert_eq((int)strlen(ex.prompt), c.prompt);
    task_example_free(&ex);
}

Test(sim, unknown_devices_and_bad_parameter_files_are_refused) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    char err[ERR_LEN], path[256];
    snprintf(path, sizeof path, "build/test-tmp/sim-params-%d.json", (int)getpid());
    cr_assert_eq(util_mkdirs("build/test-tmp", err), 0);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "{\"devices\": {\"toy\": {\"flops\": 1e12, \"bandwidth\": 1e11, \"memory\": 40e9, "
               "\"link_bandwidth\": 1e10, \"weight_bytes\": 2, \"launch_us\": 1},"
               " \"odd\": {\"flops\": 1e12, \"bandwidth\": 1e11, \"memory\": 40e9, \"link_bandwidth\": 1e10, "
               "\"weight_bytes\": 2, \"sparsity\": 2},"
               " \"fastback\": {\"flops\": 1e12, \"bandwidth\": 1e11, \"memory\": 40e9, \"link_bandwidth\": 1e10, "
               "\"weight_bytes\": 2, \"backward_efficiency\": 1.5},"
               " \"overback\": {\"flops\": 1e12, \"bandwidth\": 1e11, \"memory\": 40e9, \"link_bandwidth\": 1e10, "
               "\"weight_bytes\": 2, \"backward_efficiency\": 5}}}");
    fclose(f);
    setenv("MARLAAS_SIM_PARAMS", path, 1);   // read once per process: this test's own
    sim_opts_t o = {.scale = 60};
    sim_t *s = sim_open("toy", &c, &o, err);
    cr_assert_not_null(s, "%s", err);
    // its own figure where given, the defaults elsewhere
    cr_assert_float_eq(sim_device(s)->launch_s, 1e-6, 1e-12);
    cr_assert_float_eq(sim_device(s)->gemm_efficiency, 0.7, 1e-12);
    sim_close(&s);
    cr_assert_null(sim_open("odd", &c, &o, err));
    cr_assert(strstr(err, "sparsity"), "%s", err);
    // a measured backward cheaper than the model's ratios: above 1, up to 4
    s = sim_open("fastback", &c, &o, err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_float_eq(sim_device(s)->backward_efficiency, 1.5, 1e-12);
    sim_close(&s);
    cr_assert_null(sim_open("overback", &c, &o, err));
    cr_assert(strstr(err, "backward_efficiency"), "%s", err);
    cr_assert_null(sim_open("tpu-v9", &c, &o, err));
    cr_assert(strstr(err, "h100") && strstr(err, "toy"), "%s", err);
    o.lengths = "fixed:0";
    cr_assert_null(sim_open("h100", &c, &o, err));
    remove(path);
}

Test(sim, model_folders_have_the_shapes_of_the_parameter_file) {
    const char *names[3] = {"qwen3-8b", "qwen2.5-7b", "llama-3.1-8b"};
    for (int i = 0; i < 3; i++) {
        char dir[128], src[256];
        snprintf(dir, sizeof dir, "models/sim/%s", names[i]);
        hf_config_t c = load_cfg(dir), p = c;
        memset(&p.hidden_size, 0, sizeof(int) * 7);
        cr_assert_eq(sim_model_shape(names[i], &p, src, sizeof src), 0);
        cr_assert(strstr(src, "huggingface.co"), "%s", src);
        cr_assert_eq(p.hidden_size, c.hidden_size, "%s", names[i]);
        cr_assert_eq(p.intermediate_size, c.intermediate_size, "%s", names[i]);
        cr_assert_eq(p.num_hidden_layers, c.num_hidden_layers, "%s", names[i]);
        cr_assert_eq(p.num_attention_heads, c.num_attention_heads, "%s", names[i]);
        cr_assert_eq(p.num_key_value_heads, c.num_key_value_heads, "%s", names[i]);
        cr_assert_eq(p.head_dim, c.head_dim, "%s", names[i]);
        cr_assert_eq(p.vocab_size, c.vocab_size, "%s", names[i]);
        cr_assert_eq(p.tie_word_embeddings, c.tie_word_embeddings, "%s", names[i]);
    }
}

Test(sim, modelled_adapters_round_trip_and_only_the_simulator_takes_them) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    peft_config_t pc = {.r = 8, .alpha = 16, .targets = (1u << LORA_Q) | (1u << LORA_V)};
    uint8_t *blob = NULL, *blob2 = NULL, *tar = NULL;
    size_t len = 0, len2 = 0, tl = 0;
    char err[ERR_LEN];
    cr_assert_eq(lora_modelled_serialize(&c, &pc, &blob, &len, err), 0, "%s", err);
    cr_assert_lt(len, 1024);   // a configuration, not 3.8 M parameters
    lora_t *a = lora_deserialize(blob, len, &c, kernels_sim(), err);
    cr_assert_not_null(a, "%s", err);
    cr_assert(a->modelled && a->n_params == 0 && !a->params && a->cfg.r == 8 && a->cfg.targets == pc.targets);
    cr_assert_eq(lora_serialize(a, &blob2, &len2, err), 0);
    cr_assert(len2 == len && !memcmp(blob, blob2, len));
    lora_t *b = lora_clone(a);
    cr_assert(b->modelled && !b->params);
    cr_assert_eq(lora_save(a, "build/test-tmp/never", err), -1);
    cr_assert_null(lora_deserialize(blob, len, &c, kernels_cpu(), err));
    cr_assert(strstr(err, "sim:DEVICE"), "%s", err);
    cr_assert_eq(peft_archive_tar(blob, len, "x", "j-1-v0", &tar, &tl, err), -1);
    cr_assert(strstr(err, "simulated"), "%s", err);
    lora_destroy(&a), lora_destroy(&b);
    free(blob), free(blob2);
}

Test(sim, a_simulated_runtime_generates_its_lengths_and_trains_at_ratio_one) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    sim_opts_t o = {.scale = 1e6, .lengths = "fixed:9"};
    char err[ERR_LEN];
    sim_t *s = sim_open("h100", &c, &o, err);
    cr_assert_not_null(s, "%s", err);
    rl_runtime_cfg_t cfg = {.n_slots = 4, .sim = s, .max_seqs = 64};
    rl_runtime_t *rt = rl_runtime_open("models/sim/qwen3-8b", &cfg, err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_null(rt->model->params);
    cr_assert_null(kvcache_pool(rt->kc, false));
    cr_assert_gt(kvcache_total_blocks(rt->kc), 10000);   // an H100's memory, not the CPU budget
    peft_config_t pc = {.r = 16, .alpha = 32, .targets = LORA_ALL_TARGETS};
    uint8_t *blob;
    size_t len;
    cr_assert_eq(lora_modelled_serialize(&c, &pc, &blob, &len, err), 0);
    lora_t *a = lora_deserialize(blob, len, &c, kernels_sim(), err);
    free(blob);
    cr_assert_eq(lora_pool_set(rt->pool, 1, &a, err), 0, "%s", err);
    int32_t prompt[50];
    for (int i = 0; i < 50; i++) prompt[i] = 40 + i % 20;
    const char *stops[1] = {"\n"};
    gen_request_t rq = {.prompt = prompt, .prompt_len = 50, .slot = 1, .n_samples = 4, .max_new_tokens = 20,
                        .sp = {.temperature = 1.0f, .top_p = 1.0f}, .seed = 3, .stop_ids = rt->eos_ids,
                        .n_stop_ids = rt->n_eos, .stop_strings = stops, .n_stop_strings = 1, .user = 1};
    cr_assert_geq(gen_submit(rt->gen, &rq, err), 0, "%s", err);
    rq.max_new_tokens = 5;   // shorter than the drawn length: ends by length
    rq.user = 2;
    cr_assert_geq(gen_submit(rt->gen, &rq, err), 0, "%s", err);
    cr_assert_eq(gen_run(rt->gen, err), 0, "%s", err);
    for (int k = 0; k < 2; k++) {
        gen_result_t *r = gen_take(rt->gen);
        cr_assert_not_null(r);
        for (int i = 0; i < r->n_samples; i++) {
            gen_sample_t *g = &r->samples[i];
            bool first = r->user == 1;
            cr_assert_eq(g->n, first ? 9 : 5);
            cr_assert_eq(g->finish, first ? GEN_FINISH_EOS : GEN_FINISH_LENGTH);
            cr_assert_eq(g->tokens[g->n - 1] == rt->eos, first);
            for (int t = 0; t < g->n; t++) cr_assert_float_eq(g->logprobs[t], SIM_LOGP, 0);
            cr_assert(g->text && !strchr(g->text, '\n') && (int)strlen(g->text) == (first ? 8 : 5), "'%s'", g->text);
        }
        gen_result_free(&r);
    }
    cr_assert_eq(kvcache_live_seqs(rt->kc), 0);
    double modelled = sim_modelled_seconds(s);
    cr_assert_gt(modelled, 0.0);
    // a training pass: the behaviour log-probs come back, ratio 1, nothing clipped
    int32_t tok[30];
    float w[30], old[30];
    for (int t = 0; t < 30; t++) tok[t] = 40 + t, w[t] = t >= 10, old[t] = SIM_LOGP;
    engine_train_seq_t ts = {.tokens = tok, .len = 30, .slot = 1, .weight = w, .old_logp = old, .advantage = 1.0f,
                             .on_policy = true};
    loss_cfg_t lc = {.kind = LOSS_RL, .temperature = 1.0f, .clip_low = 0.2f, .clip_high = 0.28f};
    loss_stats_t st[5] = {0};
    float *grads[4] = {0};
    cr_assert_eq(engine_train(rt->engine, &ts, 1, &lc, NULL, grads, st, 5, err), 0, "%s", err);
    cr_assert_float_eq(st[2].ratio_mean, 1.0, 1e-9);
    cr_assert_float_eq(st[2].clip_frac, 0.0, 1e-12);
    cr_assert_float_eq(st[2].tokens, 20.0, 1e-9);
    cr_assert_float_eq(st[2].mismatch, 0.0, 1e-12);
    cr_assert_gt(sim_modelled_seconds(s), modelled);
    rl_runtime_close(&rt);
    sim_close(&s);
}

// A generator of simulated decode steps run back to back (coalesce_s, the default on an
// accelerator): the same tokens, steps and modelled time as one step per call, each result taken
// after the same step (admissions waiting for completions included), in fewer calls.
typedef struct {
    int calls, steps, n_res;
    int taken_at[8];        // the generator's step count when result `user` could first be taken
    int len[8][4];          // the samples' lengths of result `user`
    double modelled;
} gen_trace_t;

static gen_trace_t trace_generation(double coalesce_s) {
    hf_config_t c = load_cfg("models/sim/qwen3-8b");
    sim_opts_t o = {.scale = 1e6, .lengths = "lognormal:30,0.8", .coalesce_s = coalesce_s};
    char err[ERR_LEN];
    sim_t *s = sim_open("h100", &c, &o, err);
    cr_assert_not_null(s, "%s", err);
    rl_runtime_cfg_t cfg = {.n_slots = 2, .sim = s, .max_seqs = 12};
    rl_runtime_t *rt = rl_runtime_open("models/sim/qwen3-8b", &cfg, err);
    cr_assert_not_null(rt, "%s", err);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 40 + i % 20;
    gen_trace_t tr = {0};
    for (int i = 0; i < 8; i++) tr.taken_at[i] = -1;
    // six requests of four samples where twelve sequences fit: three wait for completions
    for (int u = 0; u < 6; u++) {
        gen_request_t rq = {.prompt = prompt, .prompt_len = 10 + 5 * u, .n_samples = 4, .max_new_tokens = 90,
                            .sp = {.temperature = 1.0f, .top_p = 1.0f}, .seed = 7 + (uint64_t)u,
                            .stop_ids = rt->eos_ids, .n_stop_ids = rt->n_eos, .user = (uint64_t)u, .slot = -1};
        cr_assert_geq(gen_submit(rt->gen, &rq, err), 0, "%s", err);
    }
    while (gen_pending(rt->gen)) {
        cr_assert_gt(gen_step(rt->gen, err), 0, "%s", err);
        tr.calls++;
        gen_result_t *r;
        while ((r = gen_take(rt->gen))) {
            cr_assert_lt(r->user, 8);
            tr.taken_at[r->user] = (int)gen_stats(rt->gen).steps;
            for (int j = 0; j < r->n_samples; j++) tr.len[r->user][j] = r->samples[j].n;
            tr.n_res++;
            gen_result_free(&r);
        }
    }
    tr.steps = (int)gen_stats(rt->gen).steps;
    tr.modelled = sim_modelled_seconds(s);
    rl_runtime_close(&rt);
    sim_close(&s);
    return tr;
}

Test(sim, coalesced_decode_steps_match_one_step_per_call) {
    gen_trace_t one = trace_generation(-1), many = trace_generation(0);
    cr_assert_eq(one.n_res, 6);
    cr_assert_eq(many.n_res, 6);
    cr_assert_eq(one.calls, one.steps);
    cr_assert_eq(many.steps, one.steps);
    cr_assert_lt(many.calls * 3, one.calls, "calls %d of %d steps", many.calls, many.steps);
    cr_assert_float_eq(many.modelled, one.modelled, 1e-9 * one.modelled);
    for (int u = 0; u < 6; u++) {
        cr_assert_eq(many.taken_at[u], one.taken_at[u], "result %d: after step %d, not %d", u, many.taken_at[u],
                     one.taken_at[u]);
        for (int j = 0; j < 4; j++) cr_assert_eq(many.len[u][j], one.len[u][j]);
    }
}

// A shared-cores device (this machine's CPU): a step slows down while other tasks are runnable.
static void *spin(void *arg) {
    volatile int *stop = arg;
    while (!*stop) {
    }
    return NULL;
}

static sim_t *open_shared(int cores) {
    char err[ERR_LEN];
    hf_config_t c = load_cfg("models/micro");
    sim_device_t d = {.name = "cpu-test", .flops = 1e11, .bandwidth = 1e10, .memory = 8e9, .link_bandwidth = 1e9,
                      .weight_bytes = 4, .gemm_efficiency = 1, .bandwidth_efficiency = 1, .attention_efficiency = 1,
                      .backward_efficiency = 1, .shared_cores = cores};
    sim_opts_t o = {.scale = 1};
    sim_t *s = sim_open_with(&d, &c, &o, err);
    cr_assert_not_null(s, "%s", err);
    return s;
}

Test(sim, a_shared_cpu_step_takes_its_share_of_the_cores) {
    // one core, one other runnable thread all along: the step gets at most half of it (the
    // machine's other work can only slow it further)
    sim_t *s = open_shared(1);
    volatile int stop = 0;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, spin, (void *)&stop), 0);
    usleep(20000);
    double t0 = util_now();
    sim_wait(s, 0.1);
    double t = util_now() - t0;
    stop = 1;
    pthread_join(th, NULL);
    cr_assert_geq(t, 0.16, "0.1 s of work on 1 core beside a busy thread took %.3f s (expected about 0.2)", t);
    cr_assert_float_eq(sim_modelled_seconds(s), 0.1, 1e-9);
    sim_close(&s);
    // a device of its own: the busy thread changes nothing (the step sleeps its modelled time)
    char err[ERR_LEN];
    hf_config_t c = load_cfg("models/micro");
    sim_opts_t o = {.scale = 1};
    sim_device_t d = {.name = "own", .flops = 1e11, .bandwidth = 1e10, .memory = 8e9, .link_bandwidth = 1e9,
                      .weight_bytes = 4, .gemm_efficiency = 1, .bandwidth_efficiency = 1, .attention_efficiency = 1,
                      .backward_efficiency = 1};
    s = sim_open_with(&d, &c, &o, err);
    cr_assert_not_null(s, "%s", err);
    stop = 0;
    cr_assert_eq(pthread_create(&th, NULL, spin, (void *)&stop), 0);
    t0 = util_now();
    sim_wait(s, 0.1);
    t = util_now() - t0;
    stop = 1;
    pthread_join(th, NULL);
    cr_assert_lt(t, 0.15, "a device of its own took %.3f s for 0.1 s", t);
    sim_close(&s);
}

Test(sim, shared_cpu_steps_between_idle_gaps_add_up_to_their_work) {
    // 300 steps of 0.3 ms, each after 1 ms of idle host time, on a device of so many cores that
    // the machine's load cannot slow them: their time adds up to their work, a late timer wake-up
    // counting towards the next step (without that: 1.24x on a 2-core cloud VM, whose wake-ups
    // come 70-90 us late)
    sim_t *s = open_shared(100000);
    double in_steps = 0;
    for (int i = 0; i < 300; i++) {
        usleep(1000);
        double t0 = util_now();
        sim_wait(s, 3e-4);
        in_steps += util_now() - t0;
    }
    cr_assert_float_eq(sim_modelled_seconds(s), 0.09, 1e-9);
    cr_assert_leq(in_steps, 0.09 * 1.15, "300 steps of 0.3 ms took %.1f ms in all", in_steps * 1e3);
    cr_assert_geq(in_steps, 0.09 * 0.95, "300 steps of 0.3 ms took %.1f ms in all", in_steps * 1e3);
    sim_close(&s);
}

// A task woken just before each step (as the message's sender is when a service's step starts)
// that computes a tenth of a millisecond: the steps share the core with its average demand, not
// with a whole task. Steps with and without it, in turn, so that the machine's other load falls
// on both alike; counting the tasks runnable when a step starts took 1.5x as long with it.
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go, stop;
} waker_t;

static void *waker(void *arg) {
    waker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        while (!w->go && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        w->go = 0;
        pthread_mutex_unlock(&w->mu);
        for (double t0 = util_now(); util_now() - t0 < 1e-4;) {
        }
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

Test(sim, a_shared_cpu_step_shares_the_core_with_a_waker_by_its_demand) {
    sim_t *s = open_shared(1);
    waker_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, waker, &w), 0);
    double with = 0, without = 0;
    for (int i = 0; i < 200; i++) {
        usleep(1000);
        if (i % 2) {
            pthread_mutex_lock(&w.mu);
            w.go = 1;
            pthread_cond_signal(&w.cv);
            pthread_mutex_unlock(&w.mu);
        }
        double t0 = util_now();
        sim_wait(s, 1e-3);
        *(i % 2 ? &with : &without) += util_now() - t0;
    }
    pthread_mutex_lock(&w.mu);
    w.stop = 1;
    pthread_cond_signal(&w.cv);
    pthread_mutex_unlock(&w.mu);
    pthread_join(th, NULL);
    sim_close(&s);
    cr_assert_lt(with / without, 1.25, "100 steps of 1 ms took %.1f ms with a waker of 0.1 ms before each, %.1f ms without",
                 with * 1e3, without * 1e3);
}

Test(sim, shared_cpu_simulators_see_each_other_and_a_killed_one_holds_nothing) {
    cr_assert_geq(sim_host_busy(0), 0, "no shared table (/dev/shm)");
    // a child in a step of 0.4 s (64 cores: the machine's load does not stretch it much)
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        sim_t *s = open_shared(64);
        sim_wait(s, 0.4);
        sim_close(&s);
        _exit(0);
    }
    int seen = 0;
    for (double t0 = util_now(); util_now() - t0 < 0.3 && !seen;) {
        seen = sim_host_busy(p) == 1;
        usleep(2000);
    }
    int st;
    waitpid(p, &st, 0);
    cr_assert(seen, "the child's step was never seen in the shared table");
    cr_assert_eq(sim_host_busy(p), 0, "a finished step still holds a core");
    // killed in the middle of a long step: its claim lapses within a slice
    p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        sim_t *s = open_shared(64);
        sim_wait(s, 10.0);
        _exit(0);
    }
    seen = 0;
    for (double t0 = util_now(); util_now() - t0 < 1.0 && !seen;) {
        seen = sim_host_busy(p) == 1;
        usleep(2000);
    }
    kill(p, SIGKILL);
    waitpid(p, &st, 0);
    cr_assert(seen, "the second child's step was never seen");
    usleep(20000);
    cr_assert_eq(sim_host_busy(p), 0, "a killed simulator still holds a core 20 ms later");
}

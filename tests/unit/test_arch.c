// test_arch.c - the architecture variants (biases, q/k norms and head_dim != hidden/heads, gelu
// activations, RoPE scalings, sliding windows) in the engine: the inference path (paged KV cache,
// incremental decode) against the training path, RoPE frequencies against the formulas of
// transformers' modeling_rope_utils.py, context limits, bf16 weights, save/load; sharded checkpoints
// and the refusal of tensors a config does not use; end-of-sequence lists in the runtime. (Log-probs
// against an independent NumPy implementation of Hugging Face's code: tests/integration/test_reference.sh;
// gradients: test_grad.c.)
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "archutil.h"
#include "common/formats/safetensors.h"
#include "common/rl/rl.h"

static hf_config_t variant(int v) { return au_config(v, 32, 48, 4, 2, 8, 41); }

// log softmax(logits)[target], in double.
static double logprob_of(const float *row, int V, int target) {
    double mx = row[0], s = 0;
    for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < V; j++) s += exp((double)row[j] - mx);
    return (double)row[target] - mx - log(s);
}

Test(arch, inference_path_equals_training_path) {
    enum { N = 23 };
    for (int v = 0; v < AU_N_VARIANTS; v++) {
        char err[ERR_LEN];
        hf_config_t c = variant(v);
        model_t *m = tu_model(&c, 30 + v);
        cr_assert_not_null(m);
        lora_pool_t *pool = lora_pool_new(1);
        lora_t *a = tu_adapter(&c, 4, LORA_ALL_TARGETS, 7);
        cr_assert_eq(lora_pool_set(pool, 0, &a, err), 0, "%s", err);
        engine_t *e = engine_new(m, pool, err);
        int V = c.vocab_size;
        int32_t tok[N];
        rng_t r;
        rng_seed(&r, 100 + v);
        for (int t = 0; t < N; t++) tok[t] = (int32_t)(rng_next(&r) % (uint64_t)V);
        for (int slot = -1; slot <= 0; slot++) {
            float lp[N], *lpp[1] = {lp};
            engine_train_seq_t s = {.tokens = tok, .len = N, .slot = slot};
            cr_assert_eq(engine_logprobs(e, &s, 1, 1.0f, lpp, NULL, err), 0, "%s", err);
            kvcache_t *kc = kvcache_new(c.num_hidden_layers, c.num_key_value_heads * c.head_dim, 4, 64, 4, err);
            int q = kvcache_seq_new(kc, err);
            float *logits = malloc(sizeof(float) * (size_t)N * V);
            // prefill 5 tokens, then one token per step
            engine_seq_t st = {.tokens = tok, .n_tokens = 5, .kv_seq = q, .slot = slot, .logits = ENGINE_LOGITS_ALL};
            cr_assert_eq(engine_step(e, kc, &st, 1, logits, err), 0, "%s", err);
            for (int t = 5; t < N; t++) {
                st = (engine_seq_t){.tokens = tok + t, .n_tokens = 1, .kv_seq = q, .slot = slot,
                                    .logits = ENGINE_LOGITS_LAST};
                cr_assert_eq(engine_step(e, kc, &st, 1, logits + (size_t)t * V, err), 0, "%s", err);
            }
            double worst = 0;
            for (int t = 1; t < N; t++) {
                double d = fabs(logprob_of(logits + (size_t)(t - 1) * V, V, tok[t]) - lp[t]);
                worst = d > worst ? d : worst;
            }
            cr_assert_lt(worst, 2e-5, "%s slot %d: |logp(step) - logp(train)| = %g", au_name(v), slot, worst);
            free(logits);
            kvcache_destroy(&kc);
        }
        engine_destroy(&e);
        lora_pool_destroy(&pool);
        model_destroy(&m);
    }
}

Test(arch, features_change_the_output) {
    // Guards the tests above and in test_grad.c: a variant whose new piece were skipped would pass
    // them trivially. Each piece switched off moves the log-probs.
    char err[ERR_LEN];
    enum { N = 12 };
    int32_t tok[N];
    for (int t = 0; t < N; t++) tok[t] = (int32_t)((t * 7 + 3) % 41);
    for (int piece = 0; piece < 5; piece++) {
        hf_config_t c = variant(piece == 4 ? AU_LLAMA3_TANH : piece < 2 ? AU_QWEN3_YARN : AU_LLAMA_BIAS_GELU);
        model_t *m = tu_model(&c, 5);
        float base[N], alt[N], *pb[1] = {base}, *pa[1] = {alt};
        lora_pool_t *pool = lora_pool_new(1);
        engine_t *e = engine_new(m, pool, err);
        engine_train_seq_t s = {.tokens = tok, .len = N, .slot = -1};
        cr_assert_eq(engine_logprobs(e, &s, 1, 1.0f, pb, NULL, err), 0, "%s", err);
        size_t sizes[MODEL_N_TENSORS], off = 0;
        model_param_sizes(&c, sizes);
        const char *what = "";
        if (piece == 0) {   // q norm weights all 1 instead of random: a norm that were skipped changes nothing
            for (int i = 0; i < 16; i++) off += sizes[i];
            for (size_t j = 0; j < sizes[16]; j++) m->params[off + j] = 1.0f;
            what = "q_norm";
        } else if (piece == 1) {   // yarn's attention factor and frequencies
            engine_destroy(&e);
            c.rope_scaling.type = HF_ROPE_DEFAULT;
            model_t *m2 = model_new(&c, kernels_cpu(), err);
            cr_assert_not_null(m2, "%s", err);
            memcpy(m2->params, m->params, sizeof(float) * m->n_params);
            model_destroy(&m);
            m = m2;
            e = engine_new(m, pool, err);
            what = "yarn";
        } else if (piece == 2) {   // o_proj bias zeroed
            for (int i = 0; i < 15; i++) off += sizes[i];
            memset(m->params + off, 0, sizeof(float) * sizes[15]);
            what = "o bias";
        } else if (piece == 3) {   // mlp biases zeroed
            for (int i = 0; i < 18; i++) off += sizes[i];
            memset(m->params + off, 0, sizeof(float) * (sizes[18] + sizes[19] + sizes[20]));
            what = "mlp biases";
        } else {   // the activation: gelu_tanh -> silu
            m->cfg.hidden_act = HF_ACT_SILU;
            what = "gelu_tanh";
        }
        cr_assert_eq(engine_logprobs(e, &s, 1, 1.0f, pa, NULL, err), 0, "%s", err);
        cr_assert_gt(tu_max_abs_diff(base + 1, alt + 1, N - 1, NULL), 1e-3f, "%s changes nothing", what);
        engine_destroy(&e);
        lora_pool_destroy(&pool);
        model_destroy(&m);
    }
}

// --- RoPE -------------------------------------------------------------------------------------------

Test(arch, rope_frequencies_follow_transformers) {
    hf_config_t c;
    char err[ERR_LEN];
    cr_assert_eq(hf_config_load(&c, "tests/reference/configs/llama-3.2-1b.json", err), 0, "%s", err);
    int half = c.head_dim / 2;
    float inv[64], def[64], af;
    hf_config_t d = c;
    d.rope_scaling.type = HF_ROPE_DEFAULT;
    model_rope_inv_freq(&d, def, &af);
    cr_assert_eq(af, 1.0f);
    for (int j = 0; j < half; j++) cr_assert_eq(def[j], 1.0f / powf(500000.0f, (float)(2 * j) / 64.0f));
    // llama3 (factor 32, low 1, high 4, original 8192): wavelengths below 8192/4 kept, above 8192
    // divided by 32, in between interpolated
    model_rope_inv_freq(&c, inv, &af);
    int kept = 0, scaled = 0, mid = 0;
    for (int j = 0; j < half; j++) {
        double wl = 2 * M_PI / def[j];
        if (wl < 2048) {
            cr_assert_eq(inv[j], def[j], "j %d", j);
            kept++;
        } else if (wl > 8192) {
            cr_assert_eq(inv[j], def[j] / 32.0f, "j %d", j);
            scaled++;
        } else {
            double s = (8192.0 / wl - 1.0) / 3.0, want = (1 - s) * def[j] / 32.0 + s * def[j];
            cr_assert_lt(fabs(inv[j] - want), 1e-6 * want, "j %d: %g vs %g", j, inv[j], want);
            mid++;
        }
    }
    cr_assert(kept > 0 && scaled > 0 && mid > 0, "kept %d scaled %d mid %d", kept, scaled, mid);
    // linear, dynamic
    d.rope_scaling.type = HF_ROPE_LINEAR, d.rope_scaling.factor = 4.0;
    model_rope_inv_freq(&d, inv, &af);
    for (int j = 0; j < half; j++) cr_assert_eq(inv[j], def[j] / 4.0f);
    d.rope_scaling.type = HF_ROPE_DYNAMIC;
    model_rope_inv_freq(&d, inv, &af);
    for (int j = 0; j < half; j++) cr_assert_eq(inv[j], def[j]);
    // yarn (factor 4, original 32768 of 131072 positions): attention factor 0.1 ln 4 + 1; the first
    // dimensions extrapolate (unchanged), the last interpolate (divided by 4)
    d = c;
    d.rope_scaling = (hf_rope_scaling_t){.type = HF_ROPE_YARN, .factor = 4.0, .original_max_position_embeddings = 32768};
    model_rope_inv_freq(&d, inv, &af);
    cr_assert_eq(af, (float)(0.1 * log(4.0) + 1.0));
    cr_assert_eq(inv[0], def[0]);
    cr_assert_eq(inv[half - 1], 1.0f / (4.0f * (1.0f / def[half - 1])) , "%g vs %g", inv[half - 1], def[half - 1] / 4);
    for (int j = 0; j < half; j++) cr_assert(inv[j] <= def[j] && inv[j] >= def[j] / 4.0f * 0.999999f, "j %d", j);
    d.rope_scaling.mscale = 1.0, d.rope_scaling.mscale_all_dim = 0.5;
    model_rope_inv_freq(&d, inv, &af);
    cr_assert_eq(af, (float)((0.1 * log(4.0) + 1.0) / (0.05 * log(4.0) + 1.0)));
    d.rope_scaling.attention_factor = 1.5;
    model_rope_inv_freq(&d, inv, &af);
    cr_assert_eq(af, 1.5f);
    // the tables: cos/sin of pos * inv_freq in fp32, times the attention factor
    hf_config_t small = au_config(AU_QWEN3_YARN, 32, 48, 4, 2, 8, 41);
    model_t *m = model_new(&small, kernels_cpu(), err);
    cr_assert_not_null(m, "%s", err);
    float sinv[16];
    model_rope_inv_freq(&small, sinv, &af);
    cr_assert_gt(af, 1.0f);
    int sh = small.head_dim / 2;
    for (int p = 0; p < m->n_pos; p += 17)
        for (int j = 0; j < sh; j++) {
            cr_assert_eq(m->rope_cos[(size_t)p * sh + j], cosf((float)p * sinv[j]) * af);
            cr_assert_eq(m->rope_sin[(size_t)p * sh + j], sinf((float)p * sinv[j]) * af);
        }
    model_destroy(&m);
}

// --- context limits -------------------------------------------------------------------------------------

Test(arch, sliding_window_bounds_the_context) {
    char err[ERR_LEN];
    hf_config_t c = variant(AU_MISTRAL_WINDOW);
    cr_assert_eq(hf_config_context(&c), 40);
    model_t *m = tu_model(&c, 3);
    cr_assert_eq(m->n_pos, 40);
    lora_pool_t *pool = lora_pool_new(1);
    engine_t *e = engine_new(m, pool, err);
    int32_t tok[41] = {0};
    kvcache_t *kc = kvcache_new(2, c.num_key_value_heads * c.head_dim, 4, 32, 4, err);
    int q = kvcache_seq_new(kc, err);
    engine_seq_t st = {.tokens = tok, .n_tokens = 41, .kv_seq = q, .slot = -1};
    cr_assert_eq(engine_step(e, kc, &st, 1, NULL, err), -1);
    cr_assert(strstr(err, "would reach position 41; the model supports 40 (its sliding window)"), "%s", err);
    st.n_tokens = 40;
    cr_assert_eq(engine_step(e, kc, &st, 1, NULL, err), 0, "%s", err);
    float lp[41], *lpp[1] = {lp};
    engine_train_seq_t s = {.tokens = tok, .len = 41, .slot = -1};
    cr_assert_eq(engine_logprobs(e, &s, 1, 1.0f, lpp, NULL, err), -1);
    cr_assert(strstr(err, "has 41 tokens; the model supports 40 (its sliding window)"), "%s", err);
    gen_t *g = gen_new(e, kc, NULL, 64, err);
    gen_request_t rq = {.prompt = tok, .prompt_len = 30, .n_samples = 1, .max_new_tokens = 11, .slot = -1,
                        .sp = {.top_p = 1.0f}};
    cr_assert_eq(gen_submit(g, &rq, err), -1);
    cr_assert(strstr(err, "exceeds the model's 40 positions"), "%s", err);
    gen_destroy(&g);
    kvcache_destroy(&kc);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
}

// --- bf16 and files ---------------------------------------------------------------------------------------

// The training path (engine_logprobs) of a bf16 model equals that of the fp32 model of its
// rounded weights: N tokens give every product more than 8 rows (the head N - 1), so gemm_bf16w
// takes its blocked path, which uses X exactly on the avx512, avx2 and scalar variants (amx and
// avx512-bf16 round X to bf16: test_bf16.c, test_cpu_isa.c; the test runs on avx512 where the CPU
// has AVX512_BF16).
Test(arch, bf16_weights_on_every_variant, .init = tu_x_exact_variant) {
    enum { N = 12 };
    for (int v = 0; v < AU_N_VARIANTS; v++) {
        char err[ERR_LEN];
        hf_config_t c = variant(v);
        model_t *m = tu_model(&c, 60 + v);
        model_t *ref = tu_bf16_reference(m);
        cr_assert_not_null(ref);
        cr_assert_eq(model_to_bf16(m, err), 0, "%s", err);
        int32_t tok[N];
        for (int t = 0; t < N; t++) tok[t] = (int32_t)((t * 5 + v) % 41);
        float a[N], b[N], *pa[1] = {a}, *pb[1] = {b};
        engine_train_seq_t s = {.tokens = tok, .len = N, .slot = -1};
        lora_pool_t *pool = lora_pool_new(1);
        engine_t *e1 = engine_new(m, pool, err), *e2 = engine_new(ref, pool, err);
        cr_assert_eq(engine_logprobs(e1, &s, 1, 1.0f, pa, NULL, err), 0, "%s", err);
        cr_assert_eq(engine_logprobs(e2, &s, 1, 1.0f, pb, NULL, err), 0, "%s", err);
        float d = tu_max_abs_diff(a, b, N, NULL);
        cr_assert_lt(d, 1e-5f, "%s: bf16 model vs fp32 model of rounded weights: %g", au_name(v), d);
        engine_destroy(&e1);
        engine_destroy(&e2);
        lora_pool_destroy(&pool);
        model_destroy(&m);
        model_destroy(&ref);
    }
}

Test(arch, variants_save_and_load_bit_exact) {
    char dir[256], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "arch-rt");
    for (int v = 0; v < AU_N_VARIANTS; v++) {
        hf_config_t c = variant(v);
        model_t *m = tu_model(&c, 80 + v);
        cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
        model_t *m2 = model_load(dir, kernels_cpu(), err);
        cr_assert_not_null(m2, "%s: %s", au_name(v), err);
        cr_assert_eq(m2->n_params, m->n_params);
        cr_assert_eq(memcmp(m->params, m2->params, sizeof(float) * m->n_params), 0);
        cr_assert_eq(m2->cfg.qk_norm, c.qk_norm);
        cr_assert_eq(m2->cfg.o_bias, c.o_bias);
        cr_assert_eq(m2->cfg.mlp_bias, c.mlp_bias);
        cr_assert_eq(m2->cfg.hidden_act, c.hidden_act);
        cr_assert_eq(m2->cfg.rope_scaling.type, c.rope_scaling.type);
        cr_assert_eq(m2->n_pos, m->n_pos);
        cr_assert_eq(memcmp(m->rope_cos, m2->rope_cos, sizeof(float) * (size_t)m->n_pos * c.head_dim / 2), 0);
        model_destroy(&m);
        model_destroy(&m2);
    }
}

// Rewrites DIR's model.safetensors as the shards of an index: tensor i goes to shard shard_of(i).
// Returns the number of tensors.
static int shard_model(const char *dir, int n_shards) {
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file_t *f = st_open(path, err);
    cr_assert_not_null(f, "%s", err);
    int n = st_count(f);
    float **data = calloc((size_t)n, sizeof(float *));
    st_writer_t *w[4];
    for (int s = 0; s < n_shards; s++) w[s] = st_writer_new();
    char *index = malloc(1 << 16);
    int k = snprintf(index, 1 << 16, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0; i < n; i++) {
        const st_tensor_t *t = st_tensor(f, i);
        data[i] = malloc(t->nbytes);
        cr_assert_eq(st_read_f32(f, t->name, t->ndim, t->shape, data[i], err), 0, "%s", err);
        st_writer_add_f32(w[i % n_shards], t->name, t->ndim, t->shape, data[i]);
        k += snprintf(index + k, (1 << 16) - k, "%s\"%s\": \"model-%05d-of-%05d.safetensors\"", i ? ", " : "",
                      t->name, i % n_shards + 1, n_shards);
    }
    snprintf(index + k, (1 << 16) - k, "}}");
    for (int s = 0; s < n_shards; s++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, n_shards);
        cr_assert_eq(st_writer_save(w[s], path, err), 0, "%s", err);
        st_writer_destroy(&w[s]);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    cr_assert_eq(util_write_file(path, index, strlen(index), err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(index);
    st_close(&f);
    return n;
}

static void write_index(const char *dir, const char *json) {
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    cr_assert_eq(util_write_file(path, json, strlen(json), err), 0, "%s", err);
}

static void expect_load_error(const char *dir, const char *want) {
    char err[ERR_LEN] = "";
    model_t *m = model_load(dir, kernels_cpu(), err);
    cr_assert_null(m, "loaded; expected an error with '%s'", want);
    cr_assert(strstr(err, want), "error '%s' lacks '%s'", err, want);
}

Test(arch, sharded_checkpoints) {
    char dir[256], path[512], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "arch-shards");
    hf_config_t c = variant(AU_QWEN3_YARN);
    model_t *m = tu_model(&c, 4);
    cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
    int n = shard_model(dir, 3);
    model_t *m2 = model_load(dir, kernels_cpu(), err);
    cr_assert_not_null(m2, "%s", err);
    cr_assert_eq(memcmp(m->params, m2->params, sizeof(float) * m->n_params), 0);
    model_destroy(&m2);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char *good = util_read_file(path, NULL, err);
    cr_assert_not_null(good);
    // a shard outside the folder, a shard that does not exist
    write_index(dir, "{\"weight_map\": {\"model.norm.weight\": \"../model-00001-of-00003.safetensors\"}}");
    expect_load_error(dir, "shards must be plain file names in the folder");
    write_index(dir, "{\"weight_map\": {\"model.norm.weight\": \"model-00009-of-00009.safetensors\"}}");
    expect_load_error(dir, "shard model-00009-of-00009.safetensors: cannot open");
    // a tensor put in a shard that does not hold it
    char *bad = malloc(strlen(good) + 256);
    strcpy(bad, good);
    char *p = strstr(bad, "\"model.embed_tokens.weight\": \"model-00001");
    cr_assert_not_null(p, "%s", bad);
    p[strlen("\"model.embed_tokens.weight\": \"model-0000")] = '2';
    write_index(dir, bad);
    expect_load_error(dir, "weight_map puts model.embed_tokens.weight in model-00002-of-00003.safetensors, which "
                           "does not hold it");
    // a tensor of a shard missing from weight_map (embed is the first entry), a tensor listed twice
    const char *first = "\"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\", ";
    p = strstr(good, first);
    cr_assert_not_null(p, "%s", good);
    snprintf(bad, strlen(good) + 256, "%.*s%s", (int)(p - good), good, p + strlen(first));
    write_index(dir, bad);
    expect_load_error(dir, "holds model.embed_tokens.weight, which weight_map does not list");
    snprintf(bad, strlen(good) + 256, "%.*s%.*s%s", (int)(p - good), good, (int)strlen(first), first, p);
    write_index(dir, bad);
    expect_load_error(dir, "(a tensor is listed twice)");
    write_index(dir, "{\"weight_map\": {}, \"shards\": 3}");
    expect_load_error(dir, "unknown key 'shards'");
    write_index(dir, "{\"metadata\": {}}");
    expect_load_error(dir, "weight_map is missing");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
    expect_load_error(dir, "has neither model.safetensors nor model.safetensors.index.json");
    write_index(dir, good);
    m2 = model_load(dir, kernels_cpu(), err);
    cr_assert_not_null(m2, "%s", err);
    cr_assert_gt(n, 10);
    free(bad);
    free(good);
    model_destroy(&m2);
    model_destroy(&m);
}

// A damaged model.safetensors.index.json (bytes flipped, cut, duplicated, JSON-significant
// characters inserted) is refused with a message or, where the damage leaves it meaning the same,
// loads the same weights: never a crash, a sanitizer report or other weights.
Test(arch, damaged_shard_index_is_refused_or_equal, .timeout = 120) {
    char dir[256], path[512], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "arch-shard-fuzz");
    hf_config_t c = variant(AU_QWEN3_YARN);
    model_t *m = tu_model(&c, 6);
    cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
    shard_model(dir, 2);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t len = 0;
    char *good = util_read_file(path, &len, err);
    cr_assert_not_null(good, "%s", err);
    static const char inserts[] = "{}[]\",:\\/ 0\n.";
    char *bad = malloc(2 * len + 64);
    rng_t r;
    rng_seed(&r, 2024);
    int refused = 0, loaded = 0;
    for (int round = 0; round < 400; round++) {
        memcpy(bad, good, len);
        size_t n = len;
        int edits = 1 + (int)(rng_next(&r) % 3);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = (size_t)(rng_next(&r) % n);
            switch (rng_next(&r) % 4) {
            case 0: bad[at] = (char)(rng_next(&r) % 256); break;                       // flip
            case 1: n = at; break;                                                      // cut
            case 2: bad[at] = inserts[rng_next(&r) % (sizeof inserts - 1)]; break;     // JSON syntax
            case 3: {                                                                   // repeat a span
                size_t span = 1 + (size_t)(rng_next(&r) % 40);
                if (at + span > n) span = n - at;
                memmove(bad + at + span, bad + at, n - at);
                n += span;
                break;
            }
            }
        }
        cr_assert_eq(util_write_file(path, bad, n, err), 0, "%s", err);
        err[0] = '\0';
        model_t *m2 = model_load(dir, kernels_cpu(), err);
        if (m2) {
            loaded++;
            cr_assert_eq(m2->n_params, m->n_params, "round %d", round);
            cr_assert_eq(memcmp(m->params, m2->params, sizeof(float) * m->n_params), 0, "round %d: other weights", round);
            model_destroy(&m2);
        } else {
            refused++;
            cr_assert(err[0], "round %d refused without a message", round);
        }
    }
    cr_assert_gt(refused, 300, "%d of 400 damaged indexes refused", refused);
    free(bad);
    free(good);
    model_destroy(&m);
}

// Writes DIR/model.safetensors with m's tensors plus one extra tensor (values v).
static void save_with_extra(const model_t *m, const char *dir, const char *extra, int ndim, const int64_t *shape,
                            const float *v) {
    char path[512], err[ERR_LEN];
    cr_assert_eq(model_save(m, dir, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file_t *f = st_open(path, err);
    cr_assert_not_null(f, "%s", err);
    st_writer_t *w = st_writer_new();
    float **data = calloc((size_t)st_count(f), sizeof(float *));
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_tensor(f, i);
        data[i] = malloc(t->nbytes);
        cr_assert_eq(st_read_f32(f, t->name, t->ndim, t->shape, data[i], err), 0, "%s", err);
        st_writer_add_f32(w, t->name, t->ndim, t->shape, data[i]);
    }
    st_writer_add_f32(w, extra, ndim, shape, v);
    cr_assert_eq(st_writer_save(w, path, err), 0, "%s", err);
    for (int i = 0; i < st_count(f); i++) free(data[i]);
    free(data);
    st_writer_destroy(&w);
    st_close(&f);
}

Test(arch, tensors_the_config_does_not_use) {
    char dir[256], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "arch-extra");
    hf_config_t c = tu_config();   // qwen2: q/k/v biases, no o_proj bias
    model_t *m = tu_model(&c, 2);
    float zeros[64] = {0};
    int64_t dshape[1] = {c.hidden_size}, ishape[1] = {4}, hshape[2] = {c.vocab_size, c.hidden_size};
    save_with_extra(m, dir, "model.layers.0.self_attn.o_proj.bias", 1, dshape, zeros);
    expect_load_error(dir, "holds tensor model.layers.0.self_attn.o_proj.bias, which config.json (model_type qwen2) "
                           "does not use");
    save_with_extra(m, dir, "model.layers.1.self_attn.rotary_emb.inv_freq", 1, ishape, zeros);
    model_t *m2 = model_load(dir, kernels_cpu(), err);
    cr_assert_not_null(m2, "a stale rotary_emb.inv_freq buffer is ignored, as transformers does: %s", err);
    model_destroy(&m2);
    model_destroy(&m);
    // a tied head: an lm_head.weight equal to the embedding is fine, any other is refused
    c.tie_word_embeddings = true;
    m = tu_model(&c, 3);
    save_with_extra(m, dir, "lm_head.weight", 2, hshape, m->w.embed);
    m2 = model_load(dir, kernels_cpu(), err);
    cr_assert_not_null(m2, "%s", err);
    model_destroy(&m2);
    float *other = malloc(sizeof(float) * (size_t)c.vocab_size * c.hidden_size);
    memcpy(other, m->w.embed, sizeof(float) * (size_t)c.vocab_size * c.hidden_size);
    other[5] += 1.0f;
    save_with_extra(m, dir, "lm_head.weight", 2, hshape, other);
    expect_load_error(dir, "lm_head.weight differs from model.embed_tokens.weight");
    free(other);
    model_destroy(&m);
}

// --- end-of-sequence lists ----------------------------------------------------------------------------------

Test(arch, runtime_stops_at_every_eos_id) {
    char dir[256], path[512], err[ERR_LEN];
    tu_tmpdir(dir, sizeof dir, "arch-eos");
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        char src[256];
        size_t n;
        snprintf(src, sizeof src, "models/micro/%s", files[i]);
        char *d = util_read_file(src, &n, err);
        cr_assert_not_null(d, "%s", err);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_assert_eq(util_write_file(path, d, n, err), 0, "%s", err);
        free(d);
    }
    rl_runtime_cfg_t rc = {.n_slots = 1, .kv_blocks = 64, .max_seqs = 8};
    rl_runtime_t *rt = rl_runtime_open(dir, &rc, err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_eq(rt->n_eos, 1);
    cr_assert_eq(rt->eos_ids[0], 96);
    // the greedy continuation of a prompt, with no stop ids
    int32_t prompt[4] = {33, 34, 35, 36};
    gen_request_t rq = {.prompt = prompt, .prompt_len = 4, .n_samples = 1, .max_new_tokens = 12, .slot = -1,
                        .sp = {.top_p = 1.0f}};
    cr_assert_geq(gen_submit(rt->gen, &rq, err), 0, "%s", err);
    cr_assert_eq(gen_run(rt->gen, err), 0, "%s", err);
    gen_result_t *r = gen_take(rt->gen);
    cr_assert_eq(r->samples[0].n, 12);
    int32_t third = r->samples[0].tokens[2];
    bool earlier = r->samples[0].tokens[0] == third || r->samples[0].tokens[1] == third;
    gen_result_free(&r);
    rl_runtime_close(&rt);
    // generation_config.json adds a second end-of-sequence id: the runtime stops at it too
    char gc[128];
    snprintf(gc, sizeof gc, "{\"eos_token_id\": [96, %d], \"transformers_version\": \"4.51.0\"}", third);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    cr_assert_eq(util_write_file(path, gc, strlen(gc), err), 0, "%s", err);
    rt = rl_runtime_open(dir, &rc, err);
    cr_assert_not_null(rt, "%s", err);
    cr_assert_eq(rt->n_eos, third == 96 ? 1 : 2);
    rq.stop_ids = rt->eos_ids, rq.n_stop_ids = rt->n_eos;
    cr_assert_geq(gen_submit(rt->gen, &rq, err), 0, "%s", err);
    cr_assert_eq(gen_run(rt->gen, err), 0, "%s", err);
    r = gen_take(rt->gen);
    cr_assert_leq(r->samples[0].n, 3);
    if (!earlier) cr_assert_eq(r->samples[0].n, 3);
    cr_assert_eq(r->samples[0].finish, GEN_FINISH_EOS);
    gen_result_free(&r);
    rl_runtime_close(&rt);
    // an id outside the vocabulary, or a malformed file, is refused
    cr_assert_eq(util_write_file(path, "{\"eos_token_id\": 5000}", 22, err), 0, "%s", err);
    cr_assert_null(rl_runtime_open(dir, &rc, err));
    cr_assert(strstr(err, "eos id 5000 is outside the vocabulary"), "%s", err);
    cr_assert_eq(util_write_file(path, "{\"eos_token_id\": ", 17, err), 0, "%s", err);
    cr_assert_null(rl_runtime_open(dir, &rc, err));
    cr_assert(strstr(err, "generation_config.json: not valid JSON"), "%s", err);
}

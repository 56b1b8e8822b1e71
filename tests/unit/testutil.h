// testutil.h - helpers shared by the unit tests: tiny random models and adapters, comparisons.
#ifndef MARLAAS_TESTUTIL_H
#define MARLAAS_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/engine/engine.h"
#include "common/engine/sampler.h"

// A tiny Qwen2-like config (GQA, qkv bias, untied head) unless overridden.
static inline hf_config_t tu_config(void) {
    hf_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "qwen2");
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.vocab_size = 41;
    c.max_position_embeddings = 128;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 10000.0f;
    c.tie_word_embeddings = false;
    c.qkv_bias = true;
    c.bos_token_id = -1;
    c.eos_token_id = 2;
    return c;
}

// A model whose weights are random with a scale large enough that every path matters.
static inline model_t *tu_model(const hf_config_t *c, uint64_t seed) {
    char err[ERR_LEN];
    model_t *m = model_new(c, kernels_cpu(), err);
    if (!m) {
        fprintf(stderr, "tu_model: %s\n", err);
        return NULL;
    }
    rng_t r;
    rng_seed(&r, seed);
    size_t sizes[MODEL_N_TENSORS];
    model_param_sizes(c, sizes);
    size_t off = 0;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        // norms (qwen3's q/k norms too) around 1, everything else uniform(-0.3, 0.3); a tensor a
        // config lacks has size 0 and draws nothing, so older models' weights do not move
        bool norm = i == 1 || i == 9 || i == 13 || i == 16 || i == 17;
        for (size_t j = 0; j < sizes[i]; j++)
            m->params[off + j] = norm ? 1.0f + 0.2f * (2.0f * rng_uniform(&r) - 1.0f)
                                      : 0.3f * (2.0f * rng_uniform(&r) - 1.0f);
        off += sizes[i];
    }
    return m;
}

// An adapter with random A and B (a fresh adapter has B = 0, which would hide bugs).
static inline lora_t *tu_adapter(const hf_config_t *c, int r, unsigned targets, uint64_t seed) {
    char err[ERR_LEN];
    peft_config_t pc = {.r = r, .alpha = 2.0f * r, .targets = targets};
    lora_t *a = lora_new(c, &pc, kernels_cpu(), seed, err);
    if (!a) return NULL;
    rng_t rr;
    rng_seed(&rr, seed ^ 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < a->n_params; i++) a->params[i] = 0.2f * (2.0f * rng_uniform(&rr) - 1.0f);
    return a;
}

// Whether arena kind i (model.c's order, see model_param_sizes) is a matrix: the tensors a bf16
// model (model_to_bf16) keeps in bf16. Kind 14 is the head.
static inline bool tu_kind_is_matrix(int i) {
    return i == 2 || i == 4 || i == 6 || i == 8 || (i >= 10 && i <= 12) || i == 14;
}

// Criterion .init of a test that checks bf16 weights used with the activations exact: on a CPU
// that runs the avx512-bf16 or amx variant (which round X to bf16 in gemm_bf16w), the process
// uses the avx512 variant instead (each test runs in a process of its own, and the variant is
// chosen at the first kernels_cpu()).
static inline void tu_x_exact_variant(void) {
    if (kernels_cpu_variant("avx512-bf16")) setenv("MARLAAS_CPU_ISA", "avx512", 1);
}

// Does the CPU variant in use round X to bf16 in gemm_bf16w (kernels.h) for this product? The
// avx512-bf16 and amx variants do in every product but the backward one (!trans_w) of up to 8
// rows.
static inline bool tu_bf16_rounds_x(bool trans_w, int M) {
    const char *isa = kernels_cpu_isa();
    return (!strcmp(isa, "amx") || !strcmp(isa, "avx512-bf16")) && (trans_w || M > 8);
}

// An fp32 CPU model computing what m converted with model_to_bf16 computes: m's values (m an
// fp32 model on any backend) with every matrix rounded to bf16. A tied m gets an untied copy whose
// head is the rounded embed and whose embed (the token gather) stays exact, as in a bf16 model.
// NULL on failure (message on stderr).
static inline model_t *tu_bf16_reference(const model_t *m) {
    char err[ERR_LEN];
    const kernels_t *k = kernels_cpu();
    hf_config_t c = m->cfg;
    c.tie_word_embeddings = false;
    model_t *r = model_new(&c, k, err);
    if (!r || m->bf16) {
        fprintf(stderr, "tu_bf16_reference: %s\n", r ? "the model is bf16 already" : err);
        model_destroy(&r);
        return NULL;
    }
    size_t ss[MODEL_N_TENSORS], sd[MODEL_N_TENSORS];
    size_t n_src = model_param_sizes(&m->cfg, ss);
    model_param_sizes(&c, sd);
    float *src = malloc(sizeof(float) * n_src);
    uint16_t *h = malloc(sizeof(uint16_t) * r->n_params);
    m->k->to_host(src, m->params, sizeof(float) * n_src);
    const float *p = src;
    float *dst = r->params;
    for (int i = 0; i < MODEL_N_TENSORS; i++) {
        memcpy(dst, i == 14 && m->cfg.tie_word_embeddings ? src : p, sizeof(float) * sd[i]);   // embed is first
        if (tu_kind_is_matrix(i)) {
            k->to_bf16(h, dst, sd[i]);
            k->from_bf16(dst, h, sd[i]);
        }
        p += ss[i];
        dst += sd[i];
    }
    free(h);
    free(src);
    return r;
}

// The lookup tool's table as env.c documents it: FNV-1a 64 of the key, the splitmix64 finaliser,
// mod 900, plus 100. Written again here, not called, so that a change to the table shows up as
// a failing test (models are pretrained on it).
static inline long long tu_lookup_table(const char *key) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return 100 + (long long)(h % 900);
}

static inline float tu_max_abs_diff(const float *a, const float *b, size_t n, size_t *where) {
    float mx = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (d > mx || isnan(d)) {
            mx = isnan(d) ? INFINITY : d;
            if (where) *where = i;
        }
    }
    return mx;
}

static inline void tu_tmpdir(char *buf, size_t n, const char *name) {
    char err[ERR_LEN];
    snprintf(buf, n, "build/test-tmp/%s-%d", name, (int)getpid());
    util_mkdirs(buf, err);
}

#endif

// test_hfconfig.c - config.json parsing (required fields, defaults, errors, the keys and values that
// are refused), the published configs of real checkpoints (tests/reference/configs), save/load
// round trips, and generation_config.json.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/hfconfig.h"

#define TMP_DIR "build/test-tmp"

static void tmp_path(char *buf, size_t n, const char *tag) {
    char err[ERR_LEN];
    cr_assert_eq(util_mkdirs(TMP_DIR, err), 0, "%s", err);
    snprintf(buf, n, TMP_DIR "/hf_%s_%d.json", tag, (int)getpid());
}

// The five required fields; tests append to or replace them.
#define REQUIRED \
    "\"hidden_size\": 64, \"intermediate_size\": 176, \"num_hidden_layers\": 2, " \
    "\"num_attention_heads\": 4, \"vocab_size\": 300"

static void expect_error(const char *json, const char *want) {
    hf_config_t cfg;
    char err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&cfg, json, err), -1, "accepted: %s", json);
    cr_assert_not_null(strstr(err, want), "%s: error '%s' lacks '%s'", json, err, want);
}

static void assert_config_eq(const hf_config_t *a, const hf_config_t *b) {
    cr_assert_str_eq(a->model_type, b->model_type);
    cr_assert_eq(a->hidden_size, b->hidden_size);
    cr_assert_eq(a->intermediate_size, b->intermediate_size);
    cr_assert_eq(a->num_hidden_layers, b->num_hidden_layers);
    cr_assert_eq(a->num_attention_heads, b->num_attention_heads);
    cr_assert_eq(a->num_key_value_heads, b->num_key_value_heads);
    cr_assert_eq(a->head_dim, b->head_dim);
    cr_assert_eq(a->vocab_size, b->vocab_size);
    cr_assert_eq(a->max_position_embeddings, b->max_position_embeddings);
    cr_assert_eq(a->rms_norm_eps, b->rms_norm_eps, "%.9g vs %.9g", a->rms_norm_eps, b->rms_norm_eps);
    cr_assert_eq(a->rope_theta, b->rope_theta, "%.9g vs %.9g", a->rope_theta, b->rope_theta);
    cr_assert_eq(a->tie_word_embeddings, b->tie_word_embeddings);
    cr_assert_eq(a->qkv_bias, b->qkv_bias);
    cr_assert_eq(a->bos_token_id, b->bos_token_id);
    cr_assert_eq(a->eos_token_id, b->eos_token_id);
    cr_assert_eq(a->o_bias, b->o_bias);
    cr_assert_eq(a->mlp_bias, b->mlp_bias);
    cr_assert_eq(a->qk_norm, b->qk_norm);
    cr_assert_eq(a->hidden_act, b->hidden_act);
    cr_assert_eq(a->sliding_window, b->sliding_window);
    cr_assert_eq(a->use_sliding_window, b->use_sliding_window);
    cr_assert_eq(hf_config_context(a), hf_config_context(b));
    cr_assert_eq(a->n_eos, b->n_eos);
    for (int i = 0; i < a->n_eos; i++) cr_assert_eq(a->eos_token_ids[i], b->eos_token_ids[i]);
    const hf_rope_scaling_t *x = &a->rope_scaling, *y = &b->rope_scaling;
    cr_assert_eq(x->type, y->type);
    cr_assert_eq(x->factor, y->factor);
    cr_assert_eq(x->original_max_position_embeddings, y->original_max_position_embeddings);
    cr_assert_eq(x->low_freq_factor, y->low_freq_factor);
    cr_assert_eq(x->high_freq_factor, y->high_freq_factor);
    cr_assert_eq(x->beta_fast, y->beta_fast);
    cr_assert_eq(x->beta_slow, y->beta_slow);
    cr_assert_eq(x->mscale, y->mscale);
    cr_assert_eq(x->mscale_all_dim, y->mscale_all_dim);
    cr_assert_eq(x->attention_factor, y->attention_factor);
    cr_assert_eq(x->truncate, y->truncate);
}

Test(hfconfig, minimal_defaults) {
    hf_config_t c;
    char err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED "}", err), 0, "%s", err);
    cr_assert_str_eq(c.model_type, "llama");
    cr_assert_eq(c.hidden_size, 64);
    cr_assert_eq(c.intermediate_size, 176);
    cr_assert_eq(c.num_hidden_layers, 2);
    cr_assert_eq(c.num_attention_heads, 4);
    cr_assert_eq(c.num_key_value_heads, 4);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_eq(c.vocab_size, 300);
    cr_assert_eq(c.max_position_embeddings, 2048);
    cr_assert_eq(c.rms_norm_eps, 1e-6f);
    cr_assert_eq(c.rope_theta, 10000.0f);
    cr_assert_eq(c.tie_word_embeddings, false);
    cr_assert_eq(c.qkv_bias, false);
    cr_assert_eq(c.bos_token_id, -1);
    cr_assert_eq(c.eos_token_id, -1);
}

Test(hfconfig, llama_full) {
    // Shaped like TinyLlama's config.json, with nulls and fields this parser ignores.
    const char *json = "{\n"
                       "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                       "  \"attention_bias\": false,\n"
                       "  \"bos_token_id\": 1,\n"
                       "  \"eos_token_id\": 2,\n"
                       "  \"hidden_act\": \"silu\",\n"
                       "  \"hidden_size\": 2048,\n"
                       "  \"initializer_range\": 0.02,\n"
                       "  \"intermediate_size\": 5632,\n"
                       "  \"max_position_embeddings\": 2048,\n"
                       "  \"model_type\": \"llama\",\n"
                       "  \"num_attention_heads\": 32,\n"
                       "  \"num_hidden_layers\": 22,\n"
                       "  \"num_key_value_heads\": 4,\n"
                       "  \"pretraining_tp\": 1,\n"
                       "  \"rms_norm_eps\": 1e-05,\n"
                       "  \"rope_scaling\": null,\n"
                       "  \"rope_theta\": 10000.0,\n"
                       "  \"tie_word_embeddings\": false,\n"
                       "  \"torch_dtype\": \"bfloat16\",\n"
                       "  \"use_cache\": true,\n"
                       "  \"vocab_size\": 32000\n"
                       "}\n";
    hf_config_t c;
    char err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&c, json, err), 0, "%s", err);
    cr_assert_eq(c.hidden_size, 2048);
    cr_assert_eq(c.num_key_value_heads, 4);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.num_hidden_layers, 22);
    cr_assert_eq(c.vocab_size, 32000);
    cr_assert_eq(c.rms_norm_eps, 1e-5f);
    cr_assert_eq(c.bos_token_id, 1);
    cr_assert_eq(c.eos_token_id, 2);
    cr_assert_eq(c.qkv_bias, false);
}

Test(hfconfig, qwen2_and_bias) {
    hf_config_t c;
    char err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&c,
                                 "{\"model_type\": \"qwen2\", " REQUIRED ", \"num_key_value_heads\": 2, "
                                 "\"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, "
                                 "\"eos_token_id\": [151645, 151643], \"max_position_embeddings\": 32768, "
                                 "\"sliding_window\": null, \"head_dim\": null}",
                                 err),
                 0, "%s", err);
    cr_assert_str_eq(c.model_type, "qwen2");
    cr_assert_eq(c.qkv_bias, true);
    cr_assert_eq(c.num_key_value_heads, 2);
    cr_assert_eq(c.rope_theta, 1e6f);
    cr_assert_eq(c.tie_word_embeddings, true);
    cr_assert_eq(c.eos_token_id, 151645);
    cr_assert_eq(c.max_position_embeddings, 32768);
    cr_assert_eq(c.head_dim, 16);

    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"attention_bias\": true}", err), 0, "%s", err);
    cr_assert_eq(c.qkv_bias, true);
    cr_assert_eq(hf_config_parse(&c, "{\"model_type\": \"mistral\", " REQUIRED "}", err), 0, "%s", err);
    cr_assert_eq(c.qkv_bias, false);
    cr_assert_str_eq(c.model_type, "mistral");
}

Test(hfconfig, explicit_head_dim) {
    hf_config_t c;
    char err[ERR_LEN] = "";
    // hidden_size need not be H * head_dim when head_dim is explicit.
    cr_assert_eq(hf_config_parse(&c,
                                 "{\"hidden_size\": 100, \"intermediate_size\": 176, \"num_hidden_layers\": 2, "
                                 "\"num_attention_heads\": 3, \"vocab_size\": 300, \"head_dim\": 32}",
                                 err),
                 0, "%s", err);
    cr_assert_eq(c.head_dim, 32);
    cr_assert_eq(c.num_key_value_heads, 3);
}

Test(hfconfig, token_ids) {
    hf_config_t c;
    char err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"bos_token_id\": 0, \"eos_token_id\": [7]}", err), 0, "%s",
                 err);
    cr_assert_eq(c.bos_token_id, 0);
    cr_assert_eq(c.eos_token_id, 7);
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"bos_token_id\": null, \"eos_token_id\": []}", err), 0, "%s",
                 err);
    cr_assert_eq(c.bos_token_id, -1);
    cr_assert_eq(c.eos_token_id, -1);
    expect_error("{" REQUIRED ", \"eos_token_id\": \"</s>\"}", "config.json: eos_token_id must be");
    expect_error("{" REQUIRED ", \"eos_token_id\": [\"a\"]}", "eos_token_id");
    expect_error("{" REQUIRED ", \"bos_token_id\": -3}", "bos_token_id");
    expect_error("{" REQUIRED ", \"bos_token_id\": 1.5}", "bos_token_id");
}

Test(hfconfig, missing_required) {
    static const char *const fields[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "vocab_size"};
    static const int values[] = {64, 176, 2, 4, 300};
    for (int skip = 0; skip < 5; skip++) {
        char json[512] = "{";
        for (int i = 0; i < 5; i++) {
            if (i == skip) continue;
            size_t n = strlen(json);
            snprintf(json + n, sizeof json - n, "%s\"%s\": %d", n > 1 ? ", " : "", fields[i], values[i]);
        }
        strcat(json, "}");
        char want[128];
        snprintf(want, sizeof want, "config.json: %s is missing", fields[skip]);
        expect_error(json, want);
    }
}

Test(hfconfig, bad_values) {
    expect_error("{\"hidden_size\": 64, \"intermediate_size\": 176, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 0, \"vocab_size\": 300}",
                 "config.json: num_attention_heads must be a positive integer");
    expect_error("{\"hidden_size\": -64, \"intermediate_size\": 176, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 300}",
                 "config.json: hidden_size must be a positive integer");
    expect_error("{\"hidden_size\": \"64\", \"intermediate_size\": 176, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 300}",
                 "hidden_size must be a positive integer");
    expect_error("{\"hidden_size\": 64, \"intermediate_size\": 176.5, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 300}",
                 "intermediate_size must be a positive integer");
    expect_error("{\"hidden_size\": 64, \"intermediate_size\": 176, \"num_hidden_layers\": 1e12, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 300}",
                 "num_hidden_layers must be a positive integer");
    expect_error("{\"hidden_size\": 64, \"intermediate_size\": 176, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"vocab_size\": null}",
                 "vocab_size is missing");
    expect_error("{" REQUIRED ", \"num_key_value_heads\": 3}",
                 "num_attention_heads (4) must be divisible by num_key_value_heads (3)");
    expect_error("{" REQUIRED ", \"num_key_value_heads\": 8}", "must be divisible by num_key_value_heads (8)");
    expect_error("{" REQUIRED ", \"num_key_value_heads\": 0}", "num_key_value_heads must be a positive integer");
    expect_error("{\"hidden_size\": 65, \"intermediate_size\": 176, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 300}",
                 "hidden_size (65) must be divisible by num_attention_heads (4)");
    expect_error("{" REQUIRED ", \"head_dim\": 0}", "head_dim must be a positive integer");
    expect_error("{" REQUIRED ", \"max_position_embeddings\": false}", "max_position_embeddings must be");
    expect_error("{" REQUIRED ", \"rms_norm_eps\": 0}", "config.json: rms_norm_eps must be a positive number");
    expect_error("{" REQUIRED ", \"rms_norm_eps\": \"1e-6\"}", "rms_norm_eps must be a positive number");
    expect_error("{" REQUIRED ", \"rms_norm_eps\": 1e-60}", "rms_norm_eps must be a positive number");
    expect_error("{" REQUIRED ", \"rope_theta\": -1}", "rope_theta must be a positive number");
    expect_error("{" REQUIRED ", \"rope_theta\": 1e300}", "rope_theta must be a positive number");
    expect_error("{" REQUIRED ", \"tie_word_embeddings\": 1}", "tie_word_embeddings must be true or false");
    expect_error("{" REQUIRED ", \"attention_bias\": \"yes\"}", "attention_bias must be true or false");
    expect_error("{" REQUIRED ", \"model_type\": 3}", "model_type must be a string");
    expect_error("{" REQUIRED ", \"model_type\": \"gpt2\"}", "model_type 'gpt2' is not supported");
}

Test(hfconfig, not_json) {
    expect_error("", "config.json: not valid JSON");
    expect_error("{\"hidden_size\": ", "not valid JSON");
    expect_error("[1, 2]", "config.json: not a JSON object");
}

static void roundtrip(const char *json, const char *tag) {
    hf_config_t a, b;
    char path[256], err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&a, json, err), 0, "%s", err);
    tmp_path(path, sizeof path, tag);
    cr_assert_eq(hf_config_save(&a, path, err), 0, "%s", err);
    cr_assert_eq(hf_config_load(&b, path, err), 0, "%s", err);
    assert_config_eq(&a, &b);
    unlink(path);
}

Test(hfconfig, save_load_roundtrip) {
    roundtrip("{" REQUIRED "}", "minimal");
    roundtrip("{\"model_type\": \"qwen2\", " REQUIRED ", \"num_key_value_heads\": 2, \"rope_theta\": 1000000.0, "
              "\"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": true, \"bos_token_id\": 151643, "
              "\"eos_token_id\": [151645, 151643], \"max_position_embeddings\": 32768}",
              "qwen2");
    roundtrip("{" REQUIRED ", \"attention_bias\": true, \"rms_norm_eps\": 3.3e-7, \"rope_theta\": 500000.0, "
              "\"head_dim\": 48, \"num_key_value_heads\": 1, \"bos_token_id\": 0}",
              "llama");
    roundtrip("{\"model_type\": \"mistral\", " REQUIRED ", \"rms_norm_eps\": 1.23456789e-5, \"rope_theta\": 1234567.8}",
              "mistral");
}

Test(hfconfig, save_contents) {
    hf_config_t c;
    char path[256], err[ERR_LEN] = "";
    cr_assert_eq(hf_config_parse(&c, "{\"model_type\": \"qwen2\", " REQUIRED ", \"eos_token_id\": 5}", err), 0, "%s",
                 err);
    tmp_path(path, sizeof path, "contents");
    cr_assert_eq(hf_config_save(&c, path, err), 0, "%s", err);
    char *text = util_read_file(path, NULL, err);
    cr_assert_not_null(text, "%s", err);
    cr_assert_not_null(strstr(text, "\"Qwen2ForCausalLM\""), "%s", text);
    cr_assert_not_null(strstr(text, "\"torch_dtype\":\t\"float32\""), "%s", text);
    cr_assert_not_null(strstr(text, "\"rms_norm_eps\":\t1e-06"), "%s", text);
    cr_assert_null(strstr(text, "bos_token_id"), "%s", text);
    free(text);

    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED "}", err), 0, "%s", err);
    cr_assert_eq(hf_config_save(&c, path, err), 0, "%s", err);
    text = util_read_file(path, NULL, err);
    cr_assert_not_null(text, "%s", err);
    cr_assert_not_null(strstr(text, "\"architectures\":\t[\"LlamaForCausalLM\"]"), "%s", text);
    cr_assert_not_null(strstr(text, "\"model_type\":\t\"llama\""), "%s", text);
    free(text);
    unlink(path);

    cr_assert_eq(hf_config_save(&c, TMP_DIR "/no/such/dir/config.json", err), -1);
    cr_assert_not_null(strstr(err, "no/such/dir"), "%s", err);
}

Test(hfconfig, load_errors_name_file) {
    hf_config_t c;
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "bad");
    const char *json = "{\"hidden_size\": 64}";
    cr_assert_eq(util_write_file(path, json, strlen(json), err), 0, "%s", err);
    cr_assert_eq(hf_config_load(&c, path, err), -1);
    cr_assert_not_null(strstr(err, path), "%s", err);
    cr_assert_not_null(strstr(err, "intermediate_size is missing"), "%s", err);
    unlink(path);
    cr_assert_eq(hf_config_load(&c, path, err), -1);
    cr_assert_not_null(strstr(err, path), "%s", err);
}

// --- the published configs of real checkpoints --------------------------------------------------------

static hf_config_t load_fixture(const char *name) {
    hf_config_t c;
    char path[256], err[ERR_LEN] = "";
    snprintf(path, sizeof path, "tests/reference/configs/%s.json", name);
    cr_assert_eq(hf_config_load(&c, path, err), 0, "%s: %s", name, err);
    return c;
}

static void expect_shape(const hf_config_t *c, const char *type, int D, int L, int H, int KV, int hd, int F, int V,
                         float theta, bool tie) {
    cr_assert_str_eq(c->model_type, type);
    cr_assert_eq(c->hidden_size, D);
    cr_assert_eq(c->num_hidden_layers, L);
    cr_assert_eq(c->num_attention_heads, H);
    cr_assert_eq(c->num_key_value_heads, KV);
    cr_assert_eq(c->head_dim, hd);
    cr_assert_eq(c->intermediate_size, F);
    cr_assert_eq(c->vocab_size, V);
    cr_assert_eq(c->rope_theta, theta);
    cr_assert_eq(c->tie_word_embeddings, tie);
    cr_assert_eq(c->hidden_act, HF_ACT_SILU);
}

Test(hfconfig, published_qwen_configs) {
    hf_config_t c = load_fixture("qwen2.5-0.5b");
    expect_shape(&c, "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 1e6f, true);
    cr_assert(c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm);
    // sliding_window 32768 with use_sliding_window false: no layer slides
    cr_assert_eq(c.sliding_window, 32768);
    cr_assert_eq(c.use_sliding_window, false);
    cr_assert_eq(c.max_window_layers, 24);
    cr_assert_eq(hf_config_sliding_layers(&c), 0);
    cr_assert_eq(hf_config_context(&c), 32768);
    cr_assert_eq(c.rope_scaling.type, HF_ROPE_DEFAULT);
    cr_assert_eq(c.eos_token_id, 151643);
    cr_assert_eq(c.bos_token_id, 151643);

    c = load_fixture("qwen2.5-7b");
    expect_shape(&c, "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 1e6f, false);
    cr_assert_eq(hf_config_context(&c), 131072);

    c = load_fixture("qwen3-0.6b");
    expect_shape(&c, "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 1e6f, true);
    cr_assert(c.qk_norm && !c.qkv_bias && !c.o_bias);
    cr_assert_eq(c.max_position_embeddings, 40960);
    cr_assert_eq(hf_config_context(&c), 40960);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(c.eos_token_id, 151645);

    c = load_fixture("qwen3-8b");
    expect_shape(&c, "qwen3", 4096, 36, 32, 8, 128, 12288, 151936, 1e6f, false);
}

Test(hfconfig, published_llama_mistral_smollm_configs) {
    hf_config_t c = load_fixture("llama-3.2-1b");
    expect_shape(&c, "llama", 2048, 16, 32, 8, 64, 8192, 128256, 500000.0f, true);
    cr_assert_eq(c.rope_scaling.type, HF_ROPE_LLAMA3);
    cr_assert_eq(c.rope_scaling.factor, 32.0);
    cr_assert_eq(c.rope_scaling.low_freq_factor, 1.0);
    cr_assert_eq(c.rope_scaling.high_freq_factor, 4.0);
    cr_assert_eq(c.rope_scaling.original_max_position_embeddings, 8192);
    cr_assert_eq(c.max_position_embeddings, 131072);
    cr_assert_eq(c.rms_norm_eps, 1e-5f);
    cr_assert(!c.qkv_bias && !c.o_bias && !c.mlp_bias);

    c = load_fixture("llama-3.1-8b");
    expect_shape(&c, "llama", 4096, 32, 32, 8, 128, 14336, 128256, 500000.0f, false);
    cr_assert_eq(c.rope_scaling.type, HF_ROPE_LLAMA3);
    cr_assert_eq(c.rope_scaling.factor, 8.0);

    c = load_fixture("mistral-7b-v0.1");
    expect_shape(&c, "mistral", 4096, 32, 32, 8, 128, 14336, 32000, 10000.0f, false);
    // a 4096-token window on every layer: the engine computes 4096 positions exactly
    cr_assert_eq(hf_config_sliding_layers(&c), 32);
    cr_assert_eq(hf_config_context(&c), 4096);

    c = load_fixture("mistral-7b-v0.3");
    expect_shape(&c, "mistral", 4096, 32, 32, 8, 128, 14336, 32768, 1e6f, false);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_eq(hf_config_context(&c), 32768);

    c = load_fixture("smollm2-135m");
    expect_shape(&c, "llama", 576, 30, 9, 3, 64, 1536, 49152, 100000.0f, true);
    cr_assert_eq(c.max_position_embeddings, 8192);
    cr_assert_eq(c.bos_token_id, 0);
    cr_assert_eq(c.eos_token_id, 0);
    cr_assert_eq(c.pad_token_id, -1);
}

Test(hfconfig, type_defaults) {
    hf_config_t c;
    char err[ERR_LEN] = "";
    // mistral: sliding_window 4096 and max_position_embeddings 131072 when absent; null = no window
    cr_assert_eq(hf_config_parse(&c, "{\"model_type\": \"mistral\", " REQUIRED "}", err), 0, "%s", err);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_eq(c.max_position_embeddings, 131072);
    cr_assert_eq(hf_config_context(&c), 4096);
    cr_assert_eq(hf_config_parse(&c, "{\"model_type\": \"mistral\", " REQUIRED ", \"sliding_window\": null}", err), 0,
                 "%s", err);
    cr_assert_eq(hf_config_context(&c), 131072);
    // qwen3: head_dim 128 when absent
    cr_assert_eq(hf_config_parse(&c, "{\"model_type\": \"qwen3\", " REQUIRED "}", err), 0, "%s", err);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.max_position_embeddings, 32768);
    // qwen2 with the window on: layers >= max_window_layers slide
    cr_assert_eq(hf_config_parse(&c,
                                 "{\"model_type\": \"qwen2\", " REQUIRED ", \"use_sliding_window\": true, "
                                 "\"sliding_window\": 1000, \"max_window_layers\": 1}",
                                 err),
                 0, "%s", err);
    cr_assert_eq(hf_config_sliding_layers(&c), 1);
    cr_assert_eq(hf_config_context(&c), 1000);
    cr_assert_eq(hf_config_parse(&c,
                                 "{\"model_type\": \"qwen2\", " REQUIRED ", \"use_sliding_window\": true, "
                                 "\"sliding_window\": 1000, \"max_window_layers\": 2, "
                                 "\"layer_types\": [\"full_attention\", \"full_attention\"]}",
                                 err),
                 0, "%s", err);
    cr_assert_eq(hf_config_context(&c), 32768);
    // eos lists: every id kept, duplicates once
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"eos_token_id\": [128001, 128008, 128009, 128008]}", err), 0,
                 "%s", err);
    int32_t ids[HF_MAX_EOS];
    cr_assert_eq(hf_config_eos(&c, ids, HF_MAX_EOS), 3);
    cr_assert(ids[0] == 128001 && ids[1] == 128008 && ids[2] == 128009);
    cr_assert_eq(c.eos_token_id, 128001);
    // hidden_act aliases, rope_parameters (transformers 5)
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"hidden_act\": \"gelu_new\"}", err), 0, "%s", err);
    cr_assert_eq(c.hidden_act, HF_ACT_GELU_TANH);
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"hidden_act\": \"swish\"}", err), 0, "%s", err);
    cr_assert_eq(c.hidden_act, HF_ACT_SILU);
    cr_assert_eq(hf_config_parse(&c,
                                 "{" REQUIRED ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0, "
                                 "\"rope_theta\": 50000.0}}",
                                 err),
                 0, "%s", err);
    cr_assert_eq(c.rope_scaling.type, HF_ROPE_LINEAR);
    cr_assert_eq(c.rope_theta, 50000.0f);
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"rope_parameters\": {\"rope_theta\": 20000.0}}", err), 0, "%s",
                 err);
    cr_assert_eq(c.rope_scaling.type, HF_ROPE_DEFAULT);
    cr_assert_eq(c.rope_theta, 20000.0f);
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}", err),
                 0, "%s", err);
    cr_assert_eq(c.rope_scaling.type, HF_ROPE_DYNAMIC);
}

Test(hfconfig, refused_keys_and_values) {
    // keys that could change the computation and are not understood
    expect_error("{" REQUIRED ", \"quantization_config\": {\"bits\": 4}}",
                 "unknown key 'quantization_config' for model_type 'llama'");
    expect_error("{" REQUIRED ", \"partial_rotary_factor\": 0.5}", "unknown key 'partial_rotary_factor'");
    expect_error("{" REQUIRED ", \"final_logit_softcapping\": 30.0}", "unknown key 'final_logit_softcapping'");
    expect_error("{" REQUIRED ", \"auto_map\": {}}", "unknown key 'auto_map'");
    // keys of other model types
    expect_error("{" REQUIRED ", \"sliding_window\": 4096}", "sliding_window is not read by model_type 'llama'");
    expect_error("{\"model_type\": \"qwen2\", " REQUIRED ", \"attention_bias\": true}",
                 "attention_bias is not read by model_type 'qwen2'");
    expect_error("{\"model_type\": \"mistral\", " REQUIRED ", \"mlp_bias\": false}",
                 "mlp_bias is not read by model_type 'mistral'");
    // values the engine does not compute
    expect_error("{" REQUIRED ", \"hidden_act\": \"relu\"}", "hidden_act 'relu' is not supported");
    expect_error("{" REQUIRED ", \"attention_dropout\": 0.1}", "attention_dropout 0.1 is not supported");
    expect_error("{" REQUIRED ", \"pretraining_tp\": 2}", "pretraining_tp must be 1");
    expect_error("{\"model_type\": \"qwen2\", " REQUIRED ", \"use_mrope\": true}", "use_mrope must be false");
    expect_error("{" REQUIRED ", \"rope_interleaved\": true}", "rope_interleaved must be false");
    expect_error("{" REQUIRED ", \"architectures\": [\"LlamaForSequenceClassification\"]}",
                 "architectures names LlamaForSequenceClassification; only LlamaForCausalLM");
    expect_error("{\"model_type\": \"qwen2\", " REQUIRED ", \"use_sliding_window\": true, \"max_window_layers\": 1, "
                 "\"layer_types\": [\"full_attention\", \"full_attention\"]}",
                 "layer_types[1] is not 'sliding_attention'");
    expect_error("{" REQUIRED ", \"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", "eos_token_id lists more than 8");
    // rope_scaling
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 2.0}}",
                 "rope_type 'longrope' is not supported (default, linear, dynamic, llama3, yarn)");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"type\": \"su\"}}", "rope_type 'su' is not supported");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"factor\": 2.0}}", "rope_scaling has no rope_type");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"linear\"}}",
                 "rope_scaling.factor is missing (rope_type 'linear')");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0}}",
                 "rope_scaling.factor must be positive");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"dynamic\", \"factor\": 2}}",
                 "has rope_type 'linear' and type 'dynamic'");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                 "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}",
                 "original_max_position_embeddings is missing (rope_type 'llama3')");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                 "\"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}}",
                 "needs 0 < low_freq_factor < high_freq_factor");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"low_freq_factor\": 1}}",
                 "rope_scaling.low_freq_factor is not read by rope_type 'yarn'");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"short_factor\": [1]}}",
                 "rope_scaling.short_factor is not supported");
    expect_error("{" REQUIRED ", \"max_position_embeddings\": 40960, \"rope_scaling\": {\"rope_type\": \"yarn\", "
                 "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}}",
                 "yarn factor 4 differs from max_position_embeddings / original_max_position_embeddings (40960 / 32768)");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"truncate\": 1}}",
                 "rope_scaling.truncate must be true or false");
    expect_error("{" REQUIRED ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, "
                 "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0}}",
                 "rope_scaling and rope_parameters are both given");
    expect_error("{" REQUIRED ", \"rope_parameters\": {\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5}}",
                 "partial_rotary_factor must be 1");
    expect_error("{" REQUIRED ", \"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_theta\": 20000.0}}",
                 "rope_theta and rope_parameters.rope_theta differ");
    expect_error("{" REQUIRED ", \"rope_scaling\": [1]}", "rope_scaling must be an object or null");
    // feature combinations a config built in code cannot express
    hf_config_t c;
    char err[ERR_LEN];
    cr_assert_eq(hf_config_parse(&c, "{" REQUIRED "}", err), 0, "%s", err);
    c.qkv_bias = true;
    cr_assert_eq(hf_config_validate(&c, err), -1);
    cr_assert(strstr(err, "attention_bias gives q, k, v and o_proj biases together"), "%s", err);
    c.o_bias = true;
    cr_assert_eq(hf_config_validate(&c, err), 0, "%s", err);
    c.qk_norm = true;
    cr_assert_eq(hf_config_validate(&c, err), -1);
    cr_assert(strstr(err, "q/k norms exist exactly for qwen3"), "%s", err);
}

Test(hfconfig, feature_round_trip) {
    roundtrip("{\"model_type\": \"qwen3\", " REQUIRED ", \"head_dim\": 24, \"attention_bias\": true, "
              "\"hidden_act\": \"gelu\", \"max_position_embeddings\": 1024, \"rope_scaling\": {\"rope_type\": \"yarn\", "
              "\"factor\": 4.0, \"original_max_position_embeddings\": 256, \"beta_fast\": 16, \"mscale\": 0.707, "
              "\"mscale_all_dim\": 0.707, \"truncate\": false}, \"eos_token_id\": [3, 4], \"pad_token_id\": 0}",
              "qwen3");
    roundtrip("{" REQUIRED ", \"mlp_bias\": true, \"hidden_act\": \"gelu_pytorch_tanh\", \"rope_scaling\": "
              "{\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
              "\"original_max_position_embeddings\": 8192}}",
              "llama3");
    roundtrip("{\"model_type\": \"mistral\", " REQUIRED ", \"sliding_window\": 48, \"rope_scaling\": "
              "{\"type\": \"linear\", \"factor\": 2.5}}",
              "mistral-window");
    roundtrip("{\"model_type\": \"qwen2\", " REQUIRED ", \"use_sliding_window\": true, \"sliding_window\": 512, "
              "\"max_window_layers\": 1, \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}",
              "qwen2-window");
    // every published config survives save + load
    static const char *const names[] = {"qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-8b", "llama-3.1-8b",
                                        "llama-3.2-1b", "mistral-7b-v0.1", "mistral-7b-v0.3", "smollm2-135m"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[256], src[256], err[ERR_LEN];
        snprintf(src, sizeof src, "tests/reference/configs/%s.json", names[i]);
        char *text = util_read_file(src, NULL, err);
        cr_assert_not_null(text, "%s", err);
        roundtrip(text, names[i]);
        free(text);
        (void)path;
    }
}

// --- generation_config.json --------------------------------------------------------------------------

Test(hfconfig, generation_configs) {
    hf_generation_config_t g;
    char err[ERR_LEN] = "";
    cr_assert_eq(hf_generation_config_load(&g, "tests/reference/configs/qwen3-0.6b.generation_config.json", err), 0,
                 "%s", err);
    cr_assert_eq(g.n_eos, 2);
    cr_assert(g.eos_token_ids[0] == 151645 && g.eos_token_ids[1] == 151643);
    cr_assert(g.has_do_sample && g.do_sample);
    cr_assert(g.has_temperature && g.temperature == 0.6f);
    cr_assert(g.has_top_k && g.top_k == 20);
    cr_assert(g.has_top_p && g.top_p == 0.95f);
    cr_assert_eq(g.pad_token_id, 151643);
    cr_assert_str_eq(g.unsupported, "");
    cr_assert_eq(hf_generation_config_load(&g, "tests/reference/configs/qwen2.5-0.5b-instruct.generation_config.json",
                                           err),
                 0, "%s", err);
    cr_assert_str_eq(g.unsupported, "repetition_penalty=1.1");
    cr_assert_eq(hf_generation_config_load(&g, "tests/reference/configs/qwen2.5-0.5b.generation_config.json", err), 0,
                 "%s", err);
    cr_assert(g.has_do_sample && !g.do_sample && g.has_max_new_tokens && g.max_new_tokens == 2048);
    cr_assert(!g.has_temperature);
    cr_assert_eq(hf_generation_config_load(&g, "tests/reference/configs/smollm2-135m.generation_config.json", err), 0,
                 "%s", err);
    cr_assert(g.n_eos == 1 && g.eos_token_ids[0] == 0 && g.bos_token_id == 0 && !g.has_do_sample);
    // neutral values of unsupported sampling keys are no-ops; others are listed
    cr_assert_eq(hf_generation_config_parse(&g, "{\"repetition_penalty\": 1.0, \"num_beams\": 1, \"num_beams_x\": 2, "
                                                "\"min_p\": 0.05}",
                                            err),
                 0, "%s", err);
    cr_assert_str_eq(g.unsupported, "num_beams_x=2, min_p=0.05");
    // absent file: 1, no settings; malformed values: errors naming the key
    cr_assert_eq(hf_generation_config_load(&g, "build/test-tmp/no/generation_config.json", err), 1);
    cr_assert(!g.n_eos && !g.has_temperature && g.bos_token_id == -1);
    cr_assert_eq(hf_generation_config_parse(&g, "{\"top_p\": 1.5}", err), -1);
    cr_assert(strstr(err, "top_p must be"), "%s", err);
    cr_assert_eq(hf_generation_config_parse(&g, "{\"eos_token_id\": [\"x\"]}", err), -1);
    cr_assert(strstr(err, "eos_token_id"), "%s", err);
    cr_assert_eq(hf_generation_config_parse(&g, "[]", err), -1);
}

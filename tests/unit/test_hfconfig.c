// test_hfconfig.c - config.json parsing (required fields, defaults, errors) and save/load round trip.
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

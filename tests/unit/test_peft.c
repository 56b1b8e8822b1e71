// test_peft.c - PEFT LoRA target and tensor names, adapter_config.json parsing and round trip.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/peft.h"

#define TMP_DIR "build/test-tmp"

static void tmp_path(char *buf, size_t n, const char *tag) {
    char err[ERR_LEN];
    cr_assert_eq(util_mkdirs(TMP_DIR, err), 0, "%s", err);
    snprintf(buf, n, TMP_DIR "/peft_%s_%d.json", tag, (int)getpid());
}

static void expect_error(const char *json, const char *want) {
    peft_config_t cfg;
    char err[ERR_LEN] = "";
    cr_assert_eq(peft_config_parse(&cfg, json, err), -1, "accepted: %s", json);
    cr_assert_not_null(strstr(err, want), "%s: error '%s' lacks '%s'", json, err, want);
}

Test(peft, target_names) {
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    cr_assert_eq(LORA_N_TARGETS, 7);
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        cr_assert_str_eq(peft_target_name((lora_target_t)t), names[t]);
        cr_assert_eq(peft_target_parse(names[t]), t);
        char stem[16];
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(names[t]) - 5), names[t]);
        cr_assert_eq(peft_target_parse(stem), t, "%s", stem);
    }
    cr_assert_null(peft_target_name(LORA_N_TARGETS));
    cr_assert_eq(peft_target_parse("lm_head"), -1);
    cr_assert_eq(peft_target_parse("q_pro"), -1);
    cr_assert_eq(peft_target_parse("Q_PROJ"), -1);
    cr_assert_eq(peft_target_parse("q_proj "), -1);
    cr_assert_eq(peft_target_parse(""), -1);
    cr_assert_eq(peft_target_parse("_proj"), -1);
    cr_assert_eq(peft_target_parse(NULL), -1);
    cr_assert_eq(LORA_ALL_TARGETS, 0x7fu);
}

Test(peft, tensor_names) {
    char buf[128];
    peft_tensor_name(buf, sizeof buf, 3, LORA_DOWN, 'B');
    cr_assert_str_eq(buf, "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight");
    peft_tensor_name(buf, sizeof buf, 0, LORA_Q, 'A');
    cr_assert_str_eq(buf, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    peft_tensor_name(buf, sizeof buf, 27, LORA_O, 'B');
    cr_assert_str_eq(buf, "base_model.model.model.layers.27.self_attn.o_proj.lora_B.weight");
    peft_tensor_name(buf, sizeof buf, 12, LORA_GATE, 'A');
    cr_assert_str_eq(buf, "base_model.model.model.layers.12.mlp.gate_proj.lora_A.weight");
    peft_tensor_name(buf, sizeof buf, 1, LORA_UP, 'A');
    cr_assert_str_eq(buf, "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight");
    peft_tensor_name(buf, sizeof buf, 5, LORA_K, 'A');
    cr_assert_str_eq(buf, "base_model.model.model.layers.5.self_attn.k_proj.lora_A.weight");
    peft_tensor_name(buf, sizeof buf, 5, LORA_V, 'B');
    cr_assert_str_eq(buf, "base_model.model.model.layers.5.self_attn.v_proj.lora_B.weight");
    // Truncates rather than overflowing a short buffer.
    char small[8];
    peft_tensor_name(small, sizeof small, 3, LORA_Q, 'A');
    cr_assert_str_eq(small, "base_mo");
}

Test(peft, parse_typical) {
    // As written by PEFT 0.x for a Llama adapter.
    const char *json = "{\n"
                       "  \"alpha_pattern\": {},\n"
                       "  \"auto_mapping\": null,\n"
                       "  \"base_model_name_or_path\": \"TinyLlama/TinyLlama-1.1B-Chat-v1.0\",\n"
                       "  \"bias\": \"none\",\n"
                       "  \"fan_in_fan_out\": false,\n"
                       "  \"inference_mode\": true,\n"
                       "  \"init_lora_weights\": true,\n"
                       "  \"layers_pattern\": null,\n"
                       "  \"layers_to_transform\": null,\n"
                       "  \"lora_alpha\": 32,\n"
                       "  \"lora_dropout\": 0.05,\n"
                       "  \"modules_to_save\": null,\n"
                       "  \"peft_type\": \"LORA\",\n"
                       "  \"r\": 16,\n"
                       "  \"rank_pattern\": {},\n"
                       "  \"revision\": null,\n"
                       "  \"target_modules\": [\"v_proj\", \"q_proj\", \"down_proj\"],\n"
                       "  \"task_type\": \"CAUSAL_LM\",\n"
                       "  \"use_dora\": false,\n"
                       "  \"use_rslora\": false\n"
                       "}\n";
    peft_config_t c;
    char err[ERR_LEN] = "";
    cr_assert_eq(peft_config_parse(&c, json, err), 0, "%s", err);
    cr_assert_eq(c.r, 16);
    cr_assert_eq(c.alpha, 32.0f);
    cr_assert_eq(c.targets, (1u << LORA_Q) | (1u << LORA_V) | (1u << LORA_DOWN));
    cr_assert_str_eq(c.base_model, "TinyLlama/TinyLlama-1.1B-Chat-v1.0");

    cr_assert_eq(peft_config_parse(&c,
                                   "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 0.5, "
                                   "\"target_modules\": \"all-linear\", \"base_model_name_or_path\": null}",
                                   err),
                 0, "%s", err);
    cr_assert_eq(c.targets, LORA_ALL_TARGETS);
    cr_assert_eq(c.alpha, 0.5f);
    cr_assert_str_eq(c.base_model, "");

    cr_assert_eq(peft_config_parse(&c,
                                   "{\"peft_type\": \"LORA\", \"r\": 1, \"lora_alpha\": 2, "
                                   "\"target_modules\": [\"q\", \"k\", \"q_proj\"]}",
                                   err),
                 0, "%s", err);
    cr_assert_eq(c.targets, (1u << LORA_Q) | (1u << LORA_K));
}

Test(peft, parse_errors) {
    expect_error("{\"peft_type\": \"LORA\", \"r\": 0, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}",
                 "adapter_config.json: r must be a positive integer");
    expect_error("{\"peft_type\": \"LORA\", \"r\": -4, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}",
                 "r must be a positive integer");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 2.5, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}",
                 "r must be a positive integer");
    expect_error("{\"peft_type\": \"LORA\", \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}",
                 "r must be a positive integer");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"target_modules\": [\"q_proj\"]}",
                 "lora_alpha must be a number");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": \"16\", \"target_modules\": [\"q_proj\"]}",
                 "lora_alpha must be a number");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 1e300, \"target_modules\": [\"q_proj\"]}",
                 "lora_alpha must be a number");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", "
                 "\"lm_head\"]}",
                 "adapter_config.json: unknown target module 'lm_head'");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", 3]}",
                 "target_modules must be a list of module names");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": \".*proj\"}",
                 "target_modules must be a list of module names");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16}", "target_modules must be a list");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": []}",
                 "target_modules is empty");
    expect_error("{\"peft_type\": \"PREFIX_TUNING\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"]}",
                 "peft_type must be \"LORA\"");
    expect_error("{\"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"]}", "peft_type must be \"LORA\"");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"], "
                 "\"base_model_name_or_path\": 5}",
                 "base_model_name_or_path must be a string");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"], "
                 "\"use_rslora\": true}",
                 "use_rslora is not supported");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"], "
                 "\"use_dora\": true}",
                 "use_dora is not supported");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"], "
                 "\"bias\": \"all\"}",
                 "bias must be \"none\"");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"], "
                 "\"rank_pattern\": {\"q_proj\": 4}}",
                 "rank_pattern is not supported");
    expect_error("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q\"], "
                 "\"modules_to_save\": [\"lm_head\"]}",
                 "modules_to_save is not supported");
    expect_error("", "adapter_config.json: not valid JSON");
    expect_error("[]", "not a JSON object");
}

static void assert_peft_eq(const peft_config_t *a, const peft_config_t *b) {
    cr_assert_eq(a->r, b->r);
    cr_assert_eq(a->alpha, b->alpha, "%.9g vs %.9g", a->alpha, b->alpha);
    cr_assert_eq(a->targets, b->targets);
    cr_assert_str_eq(a->base_model, b->base_model);
}

Test(peft, save_load_roundtrip) {
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "roundtrip");
    const peft_config_t cases[] = {
        {.r = 16, .alpha = 32.0f, .targets = LORA_ALL_TARGETS, .base_model = "TinyLlama/TinyLlama-1.1B"},
        {.r = 1, .alpha = 0.1f, .targets = 1u << LORA_DOWN, .base_model = ""},
        {.r = 64, .alpha = 1.0f / 3.0f, .targets = (1u << LORA_Q) | (1u << LORA_V), .base_model = "/m/x \"q\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        peft_config_t got;
        cr_assert_eq(peft_config_save(&cases[i], path, err), 0, "%s", err);
        cr_assert_eq(peft_config_load(&got, path, err), 0, "case %zu: %s", i, err);
        assert_peft_eq(&cases[i], &got);
    }
    unlink(path);
}

Test(peft, save_contents) {
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "contents");
    peft_config_t c = {.r = 8, .alpha = 16.0f, .targets = (1u << LORA_Q) | (1u << LORA_UP), .base_model = "base"};
    cr_assert_eq(peft_config_save(&c, path, err), 0, "%s", err);
    char *text = util_read_file(path, NULL, err);
    cr_assert_not_null(text, "%s", err);
    static const char *const want[] = {
        "\"peft_type\":\t\"LORA\"",   "\"task_type\":\t\"CAUSAL_LM\"", "\"r\":\t8",
        "\"lora_alpha\":\t16",        "\"lora_dropout\":\t0",          "\"bias\":\t\"none\"",
        "[\"q_proj\", \"up_proj\"]", "\"base_model_name_or_path\":\t\"base\"",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_not_null(strstr(text, want[i]), "missing %s in %s", want[i], text);
    free(text);

    c.base_model[0] = 0;
    cr_assert_eq(peft_config_save(&c, path, err), 0, "%s", err);
    text = util_read_file(path, NULL, err);
    cr_assert_not_null(text, "%s", err);
    cr_assert_not_null(strstr(text, "\"base_model_name_or_path\":\tnull"), "%s", text);
    free(text);
    unlink(path);
}

Test(peft, save_rejects_invalid) {
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "invalid");
    peft_config_t c = {.r = 0, .alpha = 16.0f, .targets = LORA_ALL_TARGETS};
    cr_assert_eq(peft_config_save(&c, path, err), -1);
    cr_assert_not_null(strstr(err, "r must be positive"), "%s", err);
    c.r = 4;
    c.targets = 0;
    cr_assert_eq(peft_config_save(&c, path, err), -1);
    cr_assert_not_null(strstr(err, "target"), "%s", err);
    c.targets = 1u << LORA_N_TARGETS;
    cr_assert_eq(peft_config_save(&c, path, err), -1);
    cr_assert_eq(access(path, F_OK), -1, "an invalid config was written");
}

Test(peft, load_errors_name_file) {
    peft_config_t c;
    char path[256], err[ERR_LEN] = "";
    tmp_path(path, sizeof path, "bad");
    const char *json = "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"w1\"]}";
    cr_assert_eq(util_write_file(path, json, strlen(json), err), 0, "%s", err);
    cr_assert_eq(peft_config_load(&c, path, err), -1);
    cr_assert_not_null(strstr(err, path), "%s", err);
    cr_assert_not_null(strstr(err, "unknown target module 'w1'"), "%s", err);
    unlink(path);
    cr_assert_eq(peft_config_load(&c, path, err), -1);
    cr_assert_not_null(strstr(err, path), "%s", err);
}

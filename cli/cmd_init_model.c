// cmd_init_model.c - `marlaas init-model`: a model folder with random weights and the architecture
// of a real checkpoint (its config.json as published, rope_scaling and all, and its
// generation_config.json), or of any config.json given: for benchmarks, GPU checks and tests that
// need real shapes without downloading weights.
#include <cjson/cJSON.h>
#include <getopt.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/engine/model.h"

// The published config.json and generation_config.json of each shape (tests/reference/configs
// holds the same files; tests/integration/test_reference.sh checks that they agree).
static const struct {
    const char *name, *repo, *config, *generation;
} shapes[] = {
    {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B",
     "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643, "
     "\"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896, \"initializer_range\": 0.02, "
     "\"intermediate_size\": 4864, \"max_position_embeddings\": 32768, \"max_window_layers\": 24, "
     "\"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24, "
     "\"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
     "\"sliding_window\": 32768, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
     "\"transformers_version\": \"4.40.1\", \"use_cache\": true, \"use_mrope\": false, "
     "\"use_sliding_window\": false, \"vocab_size\": 151936}",
     "{\"bos_token_id\": 151643, \"do_sample\": false, \"eos_token_id\": 151643, \"max_new_tokens\": 2048, "
     "\"transformers_version\": \"4.37.0\"}"},
    {"qwen3-0.6b", "Qwen/Qwen3-0.6B",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
     "\"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\", "
     "\"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 3072, "
     "\"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\", "
     "\"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, "
     "\"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, "
     "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", "
     "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}",
     "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643], "
     "\"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, "
     "\"transformers_version\": \"4.51.0\"}"},
    {"llama-3.2-1b", "meta-llama/Llama-3.2-1B",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
     "\"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\", "
     "\"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192, "
     "\"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\", "
     "\"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, "
     "\"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, "
     "\"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "
     "\"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, "
     "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, "
     "\"vocab_size\": 128256}",
     "{\"_from_model_config\": true, \"bos_token_id\": 128000, \"do_sample\": true, \"eos_token_id\": 128001, "
     "\"temperature\": 0.6, \"top_p\": 0.9, \"transformers_version\": \"4.45.0.dev0\"}"},
    {"smollm2-135m", "HuggingFaceTB/SmolLM2-135M",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
     "\"bos_token_id\": 0, \"eos_token_id\": 0, \"hidden_act\": \"silu\", \"hidden_size\": 576, "
     "\"initializer_range\": 0.041666666666666664, \"intermediate_size\": 1536, \"is_llama_config\": true, "
     "\"max_position_embeddings\": 8192, \"mlp_bias\": false, \"model_type\": \"llama\", "
     "\"num_attention_heads\": 9, \"num_hidden_layers\": 30, \"num_key_value_heads\": 3, "
     "\"pad_token_id\": null, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_interleaved\": false, "
     "\"rope_scaling\": null, \"rope_theta\": 100000, \"tie_word_embeddings\": true, "
     "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.42.3\", \"use_cache\": true, "
     "\"vocab_size\": 49152}",
     "{\"_from_model_config\": true, \"bos_token_id\": 0, \"eos_token_id\": 0, "
     "\"transformers_version\": \"4.42.3\"}"},
    {"tiny", "a small llama shape of this project (no published checkpoint)",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 192, "
     "\"intermediate_size\": 512, \"num_hidden_layers\": 4, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, "
     "\"vocab_size\": 98, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
     "\"tie_word_embeddings\": true, \"eos_token_id\": 0}",
     NULL},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static int copy_file(const char *from, const char *to, char *err) {
    size_t n;
    char *data = util_read_file(from, &n, err);
    if (!data) return -1;
    int rc = util_write_file(to, data, n, err);
    free(data);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f, "usage: marlaas init-model (--shape NAME | --config FILE) --out DIR [--tokenizer PATH] [--layers N] "
               "[--seed S] [--config-only]\n"
               "  a model folder with random weights (normal(0, 0.02); norms 1, biases 0): config.json, "
               "model.safetensors,\n"
               "  generation_config.json (shapes), and with --tokenizer the given tokenizer.json and the "
               "tokenizer_config.json\n"
               "  beside it, copied as they are. --layers keeps the first N layers of the architecture;\n"
               "  --config-only writes everything but the weights.\n"
               "shapes:\n");
    for (int i = 0; i < N_SHAPES; i++) fprintf(f, "  %-14s %s\n", shapes[i].name, shapes[i].repo);
}

int cmd_init_model(int argc, char **argv) {
    const char *out = NULL, *shape = NULL, *config = NULL, *tokenizer = NULL;
    long seed = 1, layers = 0;
    bool config_only = false;
    static struct option opts[] = {{"out", required_argument, 0, 'o'},       {"shape", required_argument, 0, 's'},
                                   {"config", required_argument, 0, 'c'},    {"tokenizer", required_argument, 0, 't'},
                                   {"layers", required_argument, 0, 'L'},    {"seed", required_argument, 0, 'S'},
                                   {"config-only", no_argument, 0, 'C'},     {"help", no_argument, 0, 'h'},
                                   {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'o') out = optarg;
        else if (o == 's') shape = optarg;
        else if (o == 'c') config = optarg;
        else if (o == 't') tokenizer = optarg;
        else if (o == 'C') config_only = true;
        else if (o == 'L') {
            if (cli_int("--layers", optarg, 1, 100000, &layers)) return 2;
        } else if (o == 'S') {
            if (cli_int("--seed", optarg, 0, 0x7fffffffL, &seed)) return 2;
        } else {
            usage(o == 'h' ? stdout : stderr);
            return o == 'h' ? 0 : 2;
        }
    }
    int k = 0;
    while (shape && k < N_SHAPES && strcmp(shapes[k].name, shape)) k++;
    if (!out || !!shape == !!config || (shape && k == N_SHAPES)) {
        fprintf(stderr, "marlaas init-model: --out and one of --config or a known --shape are required "
                        "(marlaas init-model --help)\n");
        return 2;
    }
    char err[ERR_LEN], path[4096];
    char *text = config ? util_read_file(config, NULL, err) : xstrdup(shapes[k].config);
    if (!text) {
        fprintf(stderr, "marlaas init-model: %s\n", err);
        return 1;
    }
    // The config as published, with the number of layers asked for and the dtype of the weights
    // written here; everything else (rope_scaling, token ids, metadata) as it was.
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "marlaas init-model: %s is not a JSON object\n", config ? config : shapes[k].name);
        cJSON_Delete(root);
        return 1;
    }
    if (layers > 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "num_hidden_layers");
        cJSON_AddNumberToObject(root, "num_hidden_layers", (double)layers);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "torch_dtype");
    cJSON_AddStringToObject(root, "torch_dtype", "float32");
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    hf_config_t c;
    model_t *m = NULL;
    int rc = 1;
    if (!json || hf_config_parse(&c, json, err)) {
        fprintf(stderr, "marlaas init-model: %s\n", json ? err : "out of memory");
        goto out;
    }
    // The weights (and model_save's own config.json, which the published one then replaces).
    if (!config_only) {
        m = model_new(&c, kernels_cpu(), err);
        if (!m) {
            fprintf(stderr, "marlaas init-model: %s\n", err);
            goto out;
        }
        model_init_random(m, (uint64_t)seed);
    }
    snprintf(path, sizeof path, "%s/config.json", out);
    size_t jn = strlen(json);
    char *jtext = xmalloc(jn + 2);
    memcpy(jtext, json, jn);
    jtext[jn] = '\n';
    int wrc = (m ? model_save(m, out, err) : util_mkdirs(out, err)) || util_write_file(path, jtext, jn + 1, err);
    free(jtext);
    if (wrc) {
        fprintf(stderr, "marlaas init-model: %s\n", err);
        goto out;
    }
    if (!config && shapes[k].generation) {
        snprintf(path, sizeof path, "%s/generation_config.json", out);
        hf_generation_config_t g;
        size_t gn = strlen(shapes[k].generation);
        char *gtext = xmalloc(gn + 2);
        memcpy(gtext, shapes[k].generation, gn);
        gtext[gn] = '\n';
        wrc = hf_generation_config_parse(&g, shapes[k].generation, err) || util_write_file(path, gtext, gn + 1, err);
        free(gtext);
        if (wrc) {
            fprintf(stderr, "marlaas init-model: %s\n", err);
            goto out;
        }
    }
    if (tokenizer) {
        // Copied without loading: whether this build's tokenizer reads them is checked when a runtime
        // opens the folder (marlaas score --ids needs no tokenizer).
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        if (copy_file(tokenizer, path, err)) {
            fprintf(stderr, "marlaas init-model: %s\n", err);
            goto out;
        }
        char *tdir = xstrdup(tokenizer), from[4096];
        snprintf(from, sizeof from, "%s/tokenizer_config.json", dirname(tdir));
        free(tdir);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
        FILE *probe = fopen(from, "rb");
        if (probe) fclose(probe);
        if (probe && copy_file(from, path, err)) {
            fprintf(stderr, "marlaas init-model: %s\n", err);
            goto out;
        }
        if (!probe) fprintf(stderr, "init-model: no %s to copy\n", from);
    }
    if (m)
        fprintf(stderr, "init-model: wrote %s (%zu parameters, random weights; %s%s, %d layers)\n", out, m->n_params,
                config ? "the architecture of " : "", config ? config : shapes[k].repo, c.num_hidden_layers);
    else
        fprintf(stderr, "init-model: wrote %s (configuration only: %s%s, %d layers)\n", out,
                config ? "the architecture of " : "", config ? config : shapes[k].repo, c.num_hidden_layers);
    rc = 0;
out:
    model_destroy(&m);
    cJSON_free(json);
    return rc;
}

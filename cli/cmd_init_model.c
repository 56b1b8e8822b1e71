// cmd_init_model.c - `marlaas init-model`: a randomly initialised model folder of a given shape
// (benchmarks and GPU checks use real checkpoints' shapes without downloading them).
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/engine/model.h"

// Known shapes: name, D, L, H, KV, F, V, qkv_bias, tie.
static const struct {
    const char *name;
    int D, L, H, KV, F, V, bias, tie;
} shapes[] = {
    {"qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, 1, 1},
    {"llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, 0, 1},
    {"tiny", 192, 4, 6, 2, 512, 98, 0, 1},
};

int cmd_init_model(int argc, char **argv) {
    const char *out = NULL, *shape = NULL;
    long seed = 1;
    static struct option opts[] = {{"out", required_argument, 0, 'o'},
                                   {"shape", required_argument, 0, 's'},
                                   {"seed", required_argument, 0, 'S'},
                                   {"help", no_argument, 0, 'h'},
                                   {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'o') out = optarg;
        else if (o == 's') shape = optarg;
        else if (o == 'S') {
            if (cli_int("--seed", optarg, 0, 0x7fffffffL, &seed)) return 2;
        } else {
            printf("usage: marlaas init-model --shape NAME --out DIR [--seed S]\nshapes:");
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) printf(" %s", shapes[i].name);
            printf("\n");
            return o == 'h' ? 0 : 2;
        }
    }
    size_t k = 0;
    while (shape && k < sizeof shapes / sizeof shapes[0] && strcmp(shapes[k].name, shape)) k++;
    if (!out || !shape || k == sizeof shapes / sizeof shapes[0]) {
        fprintf(stderr, "marlaas init-model: --out and a known --shape are required (marlaas init-model --help)\n");
        return 2;
    }
    hf_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "%s", shapes[k].bias ? "qwen2" : "llama");
    c.hidden_size = shapes[k].D, c.num_hidden_layers = shapes[k].L, c.num_attention_heads = shapes[k].H;
    c.num_key_value_heads = shapes[k].KV, c.intermediate_size = shapes[k].F, c.vocab_size = shapes[k].V;
    c.head_dim = c.hidden_size / c.num_attention_heads, c.max_position_embeddings = 4096, c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0f, c.qkv_bias = shapes[k].bias, c.tie_word_embeddings = shapes[k].tie;
    c.bos_token_id = -1, c.eos_token_id = 0;
    char err[ERR_LEN];
    model_t *m = model_new(&c, kernels_cpu(), err);
    if (!m) {
        fprintf(stderr, "marlaas init-model: %s\n", err);
        return 1;
    }
    model_init_random(m, (uint64_t)seed);
    int rc = model_save(m, out, err);
    if (rc) fprintf(stderr, "marlaas init-model: %s\n", err);
    else fprintf(stderr, "init-model: wrote %s (%zu parameters, random weights)\n", out, m->n_params);
    model_destroy(&m);
    return rc ? 1 : 0;
}

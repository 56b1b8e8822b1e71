// cmd_score.c - `marlaas score`: per-token log-probs of a text (or of token ids) under a model and
// an optional adapter, as JSON; optionally a greedy continuation. The training path of the engine
// (engine_logprobs: packed forward) scores, the inference path (generate.c over the paged KV cache)
// continues, so both can be compared with another implementation (tests/reference).
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/formats/tokenizer.h"

#define SCORE_MAX_SEQS 1024

typedef struct {
    int32_t *ids;
    int n;
} seq_t;

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap + 1);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) buf = xrealloc(buf, (cap *= 2) + 1);
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

// One JSON list of ids, or a list of such lists.
static int parse_ids(const char *text, int V, seq_t *seqs, int *n_seqs, char *err) {
    cJSON *root = cJSON_Parse(text);
    int rc = -1;
    *n_seqs = 0;
    if (!cJSON_IsArray(root) || !root->child) {
        err_set(err, "--ids: stdin must hold a non-empty JSON list of token ids, or a list of such lists");
        goto out;
    }
    bool nested = cJSON_IsArray(root->child);
    for (const cJSON *s = nested ? root->child : root; s; s = nested ? s->next : NULL) {
        if (!cJSON_IsArray(s) || !s->child) {
            err_set(err, "--ids: sequence %d is not a non-empty list of ids", *n_seqs);
            goto out;
        }
        if (*n_seqs == SCORE_MAX_SEQS) {
            err_set(err, "--ids: more than %d sequences", SCORE_MAX_SEQS);
            goto out;
        }
        seq_t *q = &seqs[(*n_seqs)++];
        q->n = cJSON_GetArraySize(s);
        q->ids = xmalloc(sizeof(int32_t) * (size_t)q->n);
        int t = 0;
        for (const cJSON *v = s->child; v; v = v->next, t++) {
            double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
            if (!(d >= 0 && d < V) || d != (double)(int)d) {
                err_set(err, "--ids: sequence %d token %d is not an id in 0..%d", *n_seqs - 1, t, V - 1);
                goto out;
            }
            q->ids[t] = (int32_t)d;
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

static cJSON *ids_json(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static void usage(FILE *f) {
    fprintf(f, "usage: marlaas score --model DIR [--adapter DIR] [--ids] [--generate N] [--weights fp32|bf16] "
               "[--temperature T]\n"
               "  stdin: a text (encoded with DIR/tokenizer.json), or with --ids a JSON list of token ids or a list\n"
               "  of such lists. stdout: {\"sequences\": [{\"tokens\", \"logprobs\" (null for the first token), "
               "\"sum\",\n"
               "  and with --generate N \"generated\" and \"generated_logprobs\": N greedy tokens, no stop "
               "tokens}]}.\n"
               "  Log-probs are taken under softmax(logits / T) (default T = 1).\n");
}

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *adapter = NULL, *weights = "fp32";
    bool ids_mode = false;
    long n_gen = 0;
    double temperature = 1.0;
    static struct option opts[] = {{"model", required_argument, 0, 'm'},    {"adapter", required_argument, 0, 'a'},
                                   {"ids", no_argument, 0, 'i'},            {"generate", required_argument, 0, 'g'},
                                   {"weights", required_argument, 0, 'w'},  {"temperature", required_argument, 0, 'T'},
                                   {"help", no_argument, 0, 'h'},           {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'm') model_dir = optarg;
        else if (o == 'a') adapter = optarg;
        else if (o == 'i') ids_mode = true;
        else if (o == 'w') weights = optarg;
        else if (o == 'g') {
            if (cli_int("--generate", optarg, 0, 100000, &n_gen)) return 2;
        } else if (o == 'T') {
            if (cli_float("--temperature", optarg, 1e-3, 100.0, &temperature)) return 2;
        } else {
            usage(o == 'h' ? stdout : stderr);
            return o == 'h' ? 0 : 2;
        }
    }
    if (!model_dir) {
        fprintf(stderr, "marlaas score: --model DIR is required (marlaas score --help)\n");
        return 2;
    }
    if (strcmp(weights, "fp32") && strcmp(weights, "bf16")) {
        fprintf(stderr, "marlaas score: --weights must be fp32 or bf16\n");
        return 2;
    }
    char err[ERR_LEN], path[4096];
    int rc = 1, n_seqs = 0;
    seq_t *seqs = xcalloc(SCORE_MAX_SEQS, sizeof(seq_t));
    tokenizer_t *tok = NULL;
    lora_pool_t *pool = NULL;
    engine_t *e = NULL;
    kvcache_t *kc = NULL;
    gen_t *gen = NULL;
    cJSON *outj = NULL;
    float **lp = NULL;
    engine_train_seq_t *ts = NULL;
    size_t len;
    char *input = read_stdin(&len);
    model_t *m = model_load(model_dir, kernels_cpu(), err);
    if (!m || (!strcmp(weights, "bf16") && model_to_bf16(m, err))) goto fail;
    const hf_config_t *cf = &m->cfg;
    if (ids_mode) {
        if (parse_ids(input, cf->vocab_size, seqs, &n_seqs, err)) goto fail;
    } else {
        snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
        if (!(tok = tokenizer_load(path, err))) goto fail;
        int n = tokenizer_encode(tok, input, len, &seqs[0].ids, err);
        if (n < 0) goto fail;
        if (n == 0) {
            err_set(err, "the text encodes to no tokens");
            goto fail;
        }
        seqs[0].n = n;
        n_seqs = 1;
        for (int t = 0; t < n; t++)
            if (seqs[0].ids[t] >= cf->vocab_size) {
                err_set(err, "the tokenizer gives id %d, outside the model's vocabulary (%d)", seqs[0].ids[t],
                        cf->vocab_size);
                goto fail;
            }
    }
    pool = lora_pool_new(1);
    int slot = -1;
    if (adapter) {
        lora_t *a = lora_load(adapter, cf, m->k, err);
        if (!a || lora_pool_set(pool, 0, &a, err)) {
            lora_destroy(&a);
            goto fail;
        }
        slot = 0;
    }
    if (!(e = engine_new(m, pool, err))) goto fail;
    ts = xcalloc((size_t)n_seqs, sizeof *ts);
    lp = xcalloc((size_t)n_seqs, sizeof *lp);
    for (int i = 0; i < n_seqs; i++) {
        ts[i] = (engine_train_seq_t){.tokens = seqs[i].ids, .len = seqs[i].n, .slot = slot};
        lp[i] = xcalloc((size_t)seqs[i].n, sizeof(float));
    }
    if (engine_logprobs(e, ts, n_seqs, (float)temperature, lp, NULL, err)) goto fail;
    outj = cJSON_CreateObject();
    cJSON_AddStringToObject(outj, "model", model_dir);
    if (adapter) cJSON_AddStringToObject(outj, "adapter", adapter);
    cJSON_AddStringToObject(outj, "weights", weights);
    cJSON *arr = cJSON_AddArrayToObject(outj, "sequences");
    for (int i = 0; i < n_seqs; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddItemToObject(s, "tokens", ids_json(seqs[i].ids, seqs[i].n));
        cJSON *l = cJSON_AddArrayToObject(s, "logprobs");
        double sum = 0;
        cJSON_AddItemToArray(l, cJSON_CreateNull());
        for (int t = 1; t < seqs[i].n; t++) {
            cJSON_AddItemToArray(l, cJSON_CreateNumber(lp[i][t]));
            sum += lp[i][t];
        }
        cJSON_AddNumberToObject(s, "sum", sum);
        cJSON_AddItemToArray(arr, s);
    }
    if (n_gen > 0) {
        int blocks = 0;
        // the generator's worst case per request: the prompt's blocks, the completion's, one more
        for (int i = 0; i < n_seqs; i++) blocks += (seqs[i].n + 15) / 16 + ((int)n_gen + 15) / 16 + 2;
        kc = kvcache_new_on(m->k, cf->num_hidden_layers, cf->num_key_value_heads * cf->head_dim, 16, blocks,
                            n_seqs + 1, err);
        if (!kc || !(gen = gen_new(e, kc, NULL, 512, err))) goto fail;
        for (int i = 0; i < n_seqs; i++) {
            gen_request_t rq = {.prompt = seqs[i].ids, .prompt_len = seqs[i].n, .slot = slot, .n_samples = 1,
                                .max_new_tokens = (int)n_gen, .sp = {.temperature = 0.0f, .top_p = 1.0f},
                                .user = (uint64_t)i};
            if (gen_submit(gen, &rq, err) < 0) goto fail;
        }
        if (gen_run(gen, err)) goto fail;
        gen_result_t *r;
        while ((r = gen_take(gen))) {
            cJSON *s = cJSON_GetArrayItem(arr, (int)r->user);
            const gen_sample_t *g = &r->samples[0];
            cJSON_AddItemToObject(s, "generated", ids_json(g->tokens, g->n));
            cJSON *gl = cJSON_AddArrayToObject(s, "generated_logprobs");
            for (int t = 0; t < g->n; t++) cJSON_AddItemToArray(gl, cJSON_CreateNumber(g->logprobs[t]));
            gen_result_free(&r);
        }
    }
    char *txt = cJSON_Print(outj);
    if (!txt) {
        err_set(err, "out of memory");
        goto fail;
    }
    printf("%s\n", txt);
    cJSON_free(txt);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "marlaas score: %s\n", err);
out:
    cJSON_Delete(outj);
    for (int i = 0; lp && i < n_seqs; i++) free(lp[i]);
    free(lp);
    free(ts);
    gen_destroy(&gen);
    kvcache_destroy(&kc);
    engine_destroy(&e);
    lora_pool_destroy(&pool);
    model_destroy(&m);
    tokenizer_destroy(&tok);
    for (int i = 0; i < SCORE_MAX_SEQS; i++) free(seqs[i].ids);
    free(seqs);
    free(input);
    return rc;
}

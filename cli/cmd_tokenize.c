// cmd_tokenize.c - `marlaas tokenize`: a model's tokenizer as a filter, for checking it against
// Hugging Face's and for looking at what a prompt becomes. Text lines in, id arrays out (or,
// with --decode, id arrays in, JSON strings out), one result line per input line.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"

static void usage(void) {
    printf("usage: marlaas tokenize (--model DIR | --tokenizer FILE.json) [--decode] [--special | --no-special]\n"
           "                        [--skip-special]\n"
           "  reads stdin line by line; a line that is a JSON string (\"a\\tb\\n\") is that string, so any text\n"
           "  can be given, any other line is taken as it is (without its newline)\n"
           "  encode (default): prints each line's ids as a JSON array, e.g. [9707,1879]\n"
           "  --decode        each line is a JSON array of ids; prints the decoded text as a JSON string\n"
           "  --special       add the post-processor's special tokens (e.g. Llama's <s>), as Hugging Face's\n"
           "                  encode(text) does by default\n"
           "  --no-special    add none (the default: this is what the engine does with a prompt, whose chat\n"
           "                  template already writes the special tokens it needs)\n"
           "  --skip-special  with --decode, leave special tokens out of the text\n");
}

// The text of one input line: a JSON string's value, else the line itself. *owned is what to free.
static const char *line_text(char *line, size_t len, size_t *n, cJSON **owned) {
    *owned = NULL;
    if (len && line[0] == '"') {
        // line[len] is the NUL that require_null_terminated looks for.
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(line, len + 1, &end, true);
        if (cJSON_IsString(j)) {
            *owned = j;
            *n = strlen(j->valuestring);
            return j->valuestring;
        }
        cJSON_Delete(j);
    }
    *n = len;
    return line;
}

static int encode_line(const tokenizer_t *tok, char *line, size_t len, bool special, char *err) {
    size_t n;
    cJSON *owned;
    const char *text = line_text(line, len, &n, &owned);
    int32_t *ids = NULL;
    int k = tokenizer_encode_special(tok, text, n, special, &ids, err);
    cJSON_Delete(owned);
    if (k < 0) return -1;
    putchar('[');
    for (int i = 0; i < k; i++) printf(i ? ",%d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
    return 0;
}

// line[len] must be a NUL.
static int decode_line(const tokenizer_t *tok, const char *line, size_t len, bool skip, char *err) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len + 1, &end, true), *it;
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return err_set(err, "expected a JSON array of ids");
    }
    int n = cJSON_GetArraySize(j), k = 0;
    int32_t *ids = xmalloc(((size_t)n + 1) * sizeof *ids);
    cJSON_ArrayForEach(it, j) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!(d >= 0 && d <= INT32_MAX) || d != (double)(int32_t)d) {
            free(ids);
            cJSON_Delete(j);
            return err_set(err, "element %d is not a token id", k);
        }
        ids[k++] = (int32_t)d;
    }
    cJSON_Delete(j);
    char *text = tokenizer_decode(tok, ids, k, skip, err);
    free(ids);
    if (!text) return -1;
    cJSON *s = cJSON_CreateString(text);
    char *out = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    free(text);
    if (!out) return err_set(err, "out of memory");
    puts(out);
    cJSON_free(out);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    bool decode = false, special = false, skip = false;
    static struct option opts[] = {{"model", required_argument, 0, 'm'}, {"tokenizer", required_argument, 0, 't'},
                                   {"decode", no_argument, 0, 'd'},      {"special", no_argument, 0, 's'},
                                   {"no-special", no_argument, 0, 'S'},  {"skip-special", no_argument, 0, 'k'},
                                   {"help", no_argument, 0, 'h'},        {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 't': file = optarg; break;
        case 'd': decode = true; break;
        case 's': special = true; break;
        case 'S': special = false; break;
        case 'k': skip = true; break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (!!model + !!file != 1 || optind < argc) {
        fprintf(stderr, "marlaas tokenize: give exactly one of --model DIR and --tokenizer FILE\n");
        usage();
        return 2;
    }
    char path[4096], err[ERR_LEN];
    if (model)
        snprintf(path, sizeof path, "%s/tokenizer.json", model);
    else
        snprintf(path, sizeof path, "%s", file);
    tokenizer_t *tok = tokenizer_load(path, err);
    if (!tok) {
        fprintf(stderr, "marlaas tokenize: %s\n", err);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long no = 0;
    int rc = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        no++;
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') line[--len] = 0;
        int r = decode ? decode_line(tok, line, len, skip, err) : encode_line(tok, line, len, special, err);
        if (r != 0) {
            fprintf(stderr, "marlaas tokenize: line %ld: %s\n", no, err);
            rc = 1;
            break;
        }
    }
    free(line);
    tokenizer_destroy(&tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "marlaas tokenize: cannot write the output\n");
        rc = 1;
    }
    return rc;
}

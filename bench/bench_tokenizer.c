// bench_tokenizer.c - `marlaas-bench-tokenizer`: load time of a tokenizer.json and encode
// throughput, single-threaded, timed the way bench/tokenizer_oracle.mjs times Hugging Face's
// JavaScript tokenizer on the same input (bench/tokenizer.sh runs both side by side).
//
//   marlaas-bench-tokenizer --tokenizer FILE --corpus FILE [--runs N]
//
// The corpus is a text file; each line is encoded on its own, without special tokens (a
// document at a time, as a data pipeline or a server does).
//   load_ms=... (best of 3)  encode_mb_s=... (best of N passes)  tokens=...  bytes=...
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/tokenizer.h"

int main(int argc, char **argv) {
    const char *file = NULL, *corpus = NULL;
    long runs = 3;
    static struct option opts[] = {{"tokenizer", required_argument, 0, 't'}, {"corpus", required_argument, 0, 'c'},
                                   {"runs", required_argument, 0, 'r'},      {0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 't') file = optarg;
        else if (o == 'c') corpus = optarg;
        else if (o == 'r') runs = strtol(optarg, NULL, 10);
        else return 2;
    }
    if (!file || !corpus || runs < 1) {
        fprintf(stderr, "usage: marlaas-bench-tokenizer --tokenizer FILE --corpus FILE [--runs N]\n");
        return 2;
    }
    char err[ERR_LEN];
    double best_load = 1e30, best_load_cpu = 1e30;
    tokenizer_t *t = NULL;
    for (int i = 0; i < 3; i++) {
        tokenizer_destroy(&t);
        double t0 = util_now(), c0 = util_cpu_time();
        t = tokenizer_load(file, err);
        double dt = util_now() - t0, dc = util_cpu_time() - c0;
        if (dc < best_load_cpu) best_load_cpu = dc;
        if (!t) {
            fprintf(stderr, "marlaas-bench-tokenizer: %s\n", err);
            return 1;
        }
        if (dt < best_load) best_load = dt;
    }
    size_t len;
    char *text = util_read_file(corpus, &len, err);
    if (!text) {
        fprintf(stderr, "marlaas-bench-tokenizer: %s\n", err);
        tokenizer_destroy(&t);
        return 1;
    }
    double best = 1e30, best_cpu = 1e30;
    long tokens = 0;
    for (long r = 0; r < runs; r++) {
        // A fresh tokenizer each pass would also time loading; the word cache is warm after the
        // first pass, as it is in a long-running process (the oracle's cache likewise).
        double t0 = util_now(), c0 = util_cpu_time();
        tokens = 0;
        for (char *s = text, *end = text + len; s < end;) {
            char *nl = memchr(s, '\n', (size_t)(end - s));
            size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
            int32_t *ids = NULL;
            int k = tokenizer_encode(t, s, n, &ids, err);
            if (k < 0) {
                fprintf(stderr, "marlaas-bench-tokenizer: %s\n", err);
                free(text);
                tokenizer_destroy(&t);
                return 1;
            }
            tokens += k;
            free(ids);
            s += n + 1;
        }
        double dt = util_now() - t0, dc = util_cpu_time() - c0;
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
    }
    printf("load_ms=%.1f load_cpu_ms=%.1f encode_mb_s=%.2f encode_cpu_mb_s=%.2f tokens=%ld bytes=%zu\n", 1e3 * best_load,
           1e3 * best_load_cpu, (double)len / 1e6 / best, (double)len / 1e6 / best_cpu, tokens, len);
    free(text);
    tokenizer_destroy(&t);
    return 0;
}

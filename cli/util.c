// util.c - helpers shared by the CLI subcommands.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <libgen.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

tokenizer_t *cli_char_tokenizer(char *err) {
    char chars[96][2];
    const char *vocab[96];
    int n = 0;
    chars[n][0] = '\n', chars[n][1] = 0, vocab[n] = chars[n], n++;
    for (int c = ' '; c <= '~'; c++) chars[n][0] = (char)c, chars[n][1] = 0, vocab[n] = chars[n], n++;
    const char *specials[2] = {"<|endoftext|>", "<|pad|>"};
    return tokenizer_build(vocab, n, NULL, 0, specials, 2, err);
}

int cli_int(const char *opt, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "marlaas: %s must be an integer in %ld..%ld, got '%s'\n", opt, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_float(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "marlaas: %s must be a number in [%g, %g], got '%s'\n", opt, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

void cli_file_stem(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    if (n > cap - 1) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)base[n] & 0xC0) == 0x80) n--;   // not inside a character
    }
    if (n == 0) {
        snprintf(out, cap, "dataset");
        return;
    }
    memcpy(out, base, n);
    out[n] = '\0';
}

void cli_bin_dir(char *out, size_t n) {
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) {
        snprintf(out, n, "build/bin");
        return;
    }
    exe[k] = 0;
    snprintf(out, n, "%s", dirname(exe));
}

const char *cli_default_model(void) {
    static char installed[4200];
    if (access("models/tiny/config.json", R_OK) == 0) return "models/tiny";
    char dir[4096];
    cli_bin_dir(dir, sizeof dir);
    char path[4400], real[PATH_MAX];
    snprintf(path, sizeof path, "%s/../share/marlaas/models/tiny", dir);
    if (!realpath(path, real)) return "models/tiny";
    snprintf(installed, sizeof installed, "%s", real);
    snprintf(path, sizeof path, "%s/config.json", installed);
    return access(path, R_OK) == 0 ? installed : "models/tiny";
}

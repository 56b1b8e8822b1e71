// util.c - error strings, checked allocation, clocks, whole-file IO, thread settings.
#include "util.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

int err_set(char *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void oom(size_t n, const char *file, int line) {
    log_fatal("out of memory allocating %zu bytes at %s:%d", n, file, line);
    abort();
}

void *util_xmalloc(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n, file, line);
    return p;
}

void *util_xcalloc(size_t n, size_t sz, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) oom(n * sz, file, line);
    return p;
}

void *util_xrealloc(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n, file, line);
    return q;
}

char *util_xstrdup(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *d = util_xmalloc(n, file, line);
    memcpy(d, s, n);
    return d;
}

float *util_falloc(size_t n, const char *file, int line) {
    size_t bytes = (n ? n : 1) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, bytes);
    if (!p) oom(bytes, file, line);
    return p;
}

void util_assert_fail(const char *what, const char *file, int line) {
    log_fatal("assertion failed: %s at %s:%d", what, file, line);
    abort();
}

double util_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double util_cpu_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

char *util_read_file(const char *path, size_t *len_out, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        err_set(err, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0) goto fail;
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        err_set(err, "cannot read %s: file of %ld bytes does not fit in memory", path, n);
        return NULL;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        goto fail;
    }
    fclose(f);
    buf[n] = 0;
    if (len_out) *len_out = (size_t)n;
    return buf;
fail:
    err_set(err, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    return NULL;
}

int util_write_file(const char *path, const void *buf, size_t len, char *err) {
    size_t n = strlen(path) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        err_set(err, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = fwrite(buf, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        err_set(err, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

int util_mkdirs(const char *path, char *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return err_set(err, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return err_set(err, "cannot create directory %s: %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, "%s exists and is not a directory", path);
    return 0;
}

int util_threads(void) {
    const char *s = getenv("MARLAAS_THREADS");
    if (s && *s) {
        int n = atoi(s);
        if (n >= 1 && n <= 1024) return n;
    }
    // the cores this process may run on (taskset, a container's cpuset), else the online ones
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

// --- UTF-8 ------------------------------------------------------------------------------------

size_t util_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, bool *ok) {
    uint8_t c = s[0];
    *cp = c;
    *ok = true;
    if (c < 0x80) return 1;
    size_t need;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        need = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4, v = c & 0x07, min = 0x10000;
    } else {
        *ok = false;
        return 1;
    }
    if (need > n) {
        *ok = false;
        return 1;
    }
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *ok = false;
            return 1;
        }
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *ok = false;
        return 1;
    }
    *cp = v;
    return need;
}

bool util_utf8_valid(const char *s, size_t n, size_t *bad) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        // ASCII runs eight bytes at a time: most text is mostly ASCII.
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        bool ok;
        size_t l = util_utf8_next(u + i, n - i, &cp, &ok);
        if (!ok) {
            if (bad) *bad = i;
            return false;
        }
        i += l;
    }
    return true;
}

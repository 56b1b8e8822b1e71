// log.c - single-line logging to stderr, as text or as one JSON object per line.
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int log_level = LOGL_INFO;
static int log_fmt = LOG_TEXT;
static char log_service[32] = "marlaas";
static char log_id[128];

// A text line is at most this long with its newline (as it always was).
#define TEXT_MAX 2048

int log_parse_level(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "debug")) return LOGL_DEBUG;
    if (!strcmp(s, "info")) return LOGL_INFO;
    if (!strcmp(s, "warn")) return LOGL_WARN;
    if (!strcmp(s, "error")) return LOGL_ERROR;
    return -1;
}

int log_parse_format(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "text")) return LOG_TEXT;
    if (!strcmp(s, "json")) return LOG_JSON;
    return -1;
}

void log_init(const char *service) {
    if (service) snprintf(log_service, sizeof log_service, "%s", service);
    int lvl = log_parse_level(getenv("MARLAAS_LOG_LEVEL"));
    if (lvl >= 0) log_level = lvl;
    int fmt = log_parse_format(getenv("MARLAAS_LOG_FORMAT"));
    if (fmt >= 0) log_fmt = fmt;
}

void log_set_level(int level) { log_level = level; }
void log_set_format(int format) { log_fmt = format == LOG_JSON ? LOG_JSON : LOG_TEXT; }
int log_get_format(void) { return log_fmt; }
void log_set_id(const char *id) { snprintf(log_id, sizeof log_id, "%s", id ? id : ""); }

// --- rendering: no allocation, no lock, no stdio (log_render may run in a signal handler) -------

// The civil date of a day count since 1970-01-01 (H. Hinnant's days_from_civil, inverted): gmtime_r
// takes glibc's time-zone lock, which a signal handler must not.
static void civil(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

static char *digits(char *p, uint64_t v, int width) {
    for (int i = width - 1; i >= 0; i--, v /= 10) p[i] = (char)('0' + v % 10);
    return p + width;
}

// "2026-11-30T08:49:50.123Z" (24 bytes, no NUL)
#define TIME_LEN 24
static void iso_time(char *p, const struct timespec *ts) {
    int64_t s = ts->tv_sec, days = s / 86400, rem = s % 86400;
    if (rem < 0) rem += 86400, days--;
    int64_t y;
    unsigned mo, d;
    civil(days, &y, &mo, &d);
    p = digits(p, (uint64_t)(y < 0 ? 0 : y % 10000), 4);
    *p++ = '-';
    p = digits(p, mo, 2);
    *p++ = '-';
    p = digits(p, d, 2);
    *p++ = 'T';
    p = digits(p, (uint64_t)(rem / 3600), 2);
    *p++ = ':';
    p = digits(p, (uint64_t)(rem / 60 % 60), 2);
    *p++ = ':';
    p = digits(p, (uint64_t)(rem % 60), 2);
    *p++ = '.';
    p = digits(p, (uint64_t)(ts->tv_nsec / 1000000) % 1000, 3);
    *p = 'Z';
}

static int clamp_level(int level) { return level < LOGL_DEBUG ? LOGL_DEBUG : level > LOGL_FATAL ? LOGL_FATAL : level; }

// The text line: "TIME LEVEL service [job=ID ]message", newlines folded, cut at TEXT_MAX - 2
// bytes (or cap - 2); a fatal line is "FATAL message".
static size_t render_text(char *out, size_t cap, int level, const struct timespec *ts, const char *service,
                          const char *job, const char *msg) {
    static const char *names[] = {"DEBUG", "INFO ", "WARN ", "ERROR", "FATAL"};
    size_t lim = (cap < TEXT_MAX ? cap : TEXT_MAX) - 2, n = 0;
#define ADD(s, k) do { size_t k_ = (k); if (k_ > lim - n) k_ = lim - n; memcpy(out + n, (s), k_); n += k_; } while (0)
    level = clamp_level(level);
    if (level != LOGL_FATAL) {
        char t[TIME_LEN + 1];
        iso_time(t, ts);
        t[TIME_LEN] = ' ';
        ADD(t, sizeof t);
    }
    ADD(names[level], 5);
    ADD(" ", 1);
    if (level != LOGL_FATAL) {
        ADD(service ? service : "", strlen(service ? service : ""));
        ADD(" ", 1);
        if (job) {
            ADD("job=", 4);
            ADD(job, strlen(job));
            ADD(" ", 1);
        }
    }
    ADD(msg ? msg : "", strlen(msg ? msg : ""));
#undef ADD
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\n') out[i] = ' ';
    out[n++] = '\n';
    out[n] = 0;
    return n;
}

// A JSON writer into a fixed buffer. Every opening piece is written whole or not at all, and the
// bytes that close the line ('"' of an open string, '}' of fields, '}', '\n', NUL) are held
// back, so a line cut short is still one complete object.
typedef struct {
    char *b;
    size_t cap, n;
    bool full;
} jw_t;
#define JW_RESERVE 5

static bool jw_put(jw_t *w, const char *s, size_t k) {
    if (w->full || w->n + k + JW_RESERVE > w->cap) {
        w->full = true;
        return false;
    }
    memcpy(w->b + w->n, s, k);
    w->n += k;
    return true;
}

// Opens a member: `,"key":"` (or `{"key":"` when first); false when it does not fit.
static bool jw_open(jw_t *w, bool first, const char *key, size_t klen) {
    if (w->full || w->n + klen + 5 + JW_RESERVE > w->cap) {
        w->full = true;
        return false;
    }
    w->b[w->n++] = first ? '{' : ',';
    w->b[w->n++] = '"';
    memcpy(w->b + w->n, key, klen);
    w->n += klen;
    memcpy(w->b + w->n, "\":\"", 3);
    w->n += 3;
    return true;
}

// The escaped body of a JSON string: quotes, backslashes and control characters escaped, bytes
// that are not well-formed UTF-8 replaced by U+FFFD. Stops (whole characters only) when full.
static void jw_body(jw_t *w, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < len && !w->full;) {
        uint32_t cp;
        bool ok;
        size_t l = util_utf8_next(u + i, len - i, &cp, &ok);
        char e[8];
        const char *p = e;
        size_t k = 2;
        if (!ok) p = "\\ufffd", k = 6;
        else if (cp == '"') p = "\\\"";
        else if (cp == '\\') p = "\\\\";
        else if (cp == '\n') p = "\\n";
        else if (cp == '\r') p = "\\r";
        else if (cp == '\t') p = "\\t";
        else if (cp == '\b') p = "\\b";
        else if (cp == '\f') p = "\\f";
        else if (cp < 0x20 || cp == 0x7f) {
            memcpy(e, "\\u00", 4);
            e[4] = hex[cp >> 4], e[5] = hex[cp & 15];
            k = 6;
        } else {
            p = s + i, k = l;
        }
        jw_put(w, p, k);
        i += l;
    }
}

static void jw_string(jw_t *w, bool first, const char *key, const char *val, size_t len) {
    if (!jw_open(w, first, key, strlen(key))) return;
    jw_body(w, val, len);
    w->b[w->n++] = '"';   // from the reserve
}

// key=value words of a message: key [A-Za-z_][A-Za-z0-9_./-]*, value up to the next space
// (a trailing , or ; dropped), the first of each key only.
#define MAX_FIELDS 32
static bool key_char(char c, bool first) {
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    return alpha || (!first && ((c >= '0' && c <= '9') || c == '.' || c == '/' || c == '-'));
}

static void jw_fields(jw_t *w, const char *msg) {
    const char *ks[MAX_FIELDS];
    size_t kl[MAX_FIELDS];
    int nf = 0;
    bool open = false;
    for (const char *p = msg; *p && nf < MAX_FIELDS && !w->full;) {
        while (*p == ' ') p++;
        const char *word = p;
        while (*p && *p != ' ') p++;
        const char *end = p, *eq = word;
        while (eq < end && key_char(*eq, eq == word)) eq++;
        if (eq == word || eq >= end || *eq != '=') continue;
        const char *v = eq + 1, *ve = end;
        while (ve > v && (ve[-1] == ',' || ve[-1] == ';')) ve--;
        if (ve == v) continue;
        size_t klen = (size_t)(eq - word);
        bool dup = false;
        for (int i = 0; i < nf && !dup; i++) dup = kl[i] == klen && !memcmp(ks[i], word, klen);
        if (dup) continue;
        ks[nf] = word, kl[nf] = klen, nf++;
        if (!open) {
            if (!jw_put(w, ",\"fields\":", 10)) return;
            open = true;
        }
        if (!jw_open(w, nf == 1, word, klen)) {
            if (nf == 1) {   // no member fits: an empty object
                w->n -= 10;
                open = false;
            }
            break;
        }
        jw_body(w, v, (size_t)(ve - v));
        w->b[w->n++] = '"';
    }
    if (open) w->b[w->n++] = '}';
}

static size_t render_json(char *out, size_t cap, int level, const struct timespec *ts, const char *service,
                          const char *id, const char *tenant, const char *job, const char *msg) {
    static const char *names[] = {"debug", "info", "warn", "error", "fatal"};
    jw_t w = {.b = out, .cap = cap};
    char t[TIME_LEN];
    iso_time(t, ts);
    jw_string(&w, true, "time", t, TIME_LEN);
    const char *lv = names[clamp_level(level)];
    jw_string(&w, false, "level", lv, strlen(lv));
    if (service && *service) jw_string(&w, false, "service", service, strlen(service));
    if (id && *id) jw_string(&w, false, "id", id, strlen(id));
    if (job && *job) jw_string(&w, false, "job", job, strlen(job));
    if (tenant && *tenant) jw_string(&w, false, "tenant", tenant, strlen(tenant));
    msg = msg ? msg : "";
    jw_string(&w, false, "message", msg, strlen(msg));
    jw_fields(&w, msg);
    w.b[w.n++] = '}';
    w.b[w.n++] = '\n';
    w.b[w.n] = 0;
    return w.n;
}

size_t log_render(char *out, size_t cap, int format, int level, const struct timespec *ts, const char *service,
                  const char *id, const char *tenant, const char *job, const char *msg) {
    if (cap < 64) {
        if (cap) out[0] = 0;
        return 0;
    }
    if (format == LOG_JSON) return render_json(out, cap, level, ts, service, id, tenant, job, msg);
    return render_text(out, cap, level, ts, service, job, msg);
}

size_t log_render_now(char *out, size_t cap, int level, const char *job, const char *msg) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return log_render(out, cap, log_fmt, level, &ts, log_service, log_id, NULL, job, msg);
}

// --- writing -------------------------------------------------------------------------------------

static void emit(int level, const char *tenant, const char *job, const char *fmt, va_list ap) {
    char msg[TEXT_MAX], line[LOG_LINE_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    size_t n = log_render(line, sizeof line, log_fmt, level, &ts, log_service, log_id, tenant, job, msg);
    fwrite(line, 1, n, stderr);
}

void log_write(int level, const char *job, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(level, NULL, job, fmt, ap);
    va_end(ap);
}

void log_write_tenant(int level, const char *tenant, const char *job, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(level, tenant, job, fmt, ap);
    va_end(ap);
}

void log_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(LOGL_FATAL, NULL, NULL, fmt, ap);
    va_end(ap);
}

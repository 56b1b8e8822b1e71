// log.c - single-line structured logging to stderr.
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int log_level = LOGL_INFO;
static char log_service[32] = "marlaas";

int log_parse_level(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "debug")) return LOGL_DEBUG;
    if (!strcmp(s, "info")) return LOGL_INFO;
    if (!strcmp(s, "warn")) return LOGL_WARN;
    if (!strcmp(s, "error")) return LOGL_ERROR;
    return -1;
}

void log_init(const char *service) {
    if (service) snprintf(log_service, sizeof log_service, "%s", service);
    int lvl = log_parse_level(getenv("MARLAAS_LOG_LEVEL"));
    if (lvl >= 0) log_level = lvl;
}

void log_set_level(int level) { log_level = level; }

void log_write(int level, const char *job, const char *fmt, ...) {
    static const char *names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     names[level < 0 ? 0 : level > 3 ? 3 : level], log_service);
    if (job && n < (int)sizeof line) n += snprintf(line + n, sizeof line - n, "job=%s ", job);
    if (n < (int)sizeof line) {
        va_list ap;
        va_start(ap, fmt);
        n += vsnprintf(line + n, sizeof line - n, fmt, ap);
        va_end(ap);
    }
    if (n >= (int)sizeof line - 1) n = sizeof line - 2;
    // One line per event: fold any newline in the message.
    for (int i = 0; i < n; i++)
        if (line[i] == '\n') line[i] = ' ';
    line[n] = '\n';
    fwrite(line, 1, (size_t)n + 1, stderr);
}

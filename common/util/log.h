// log.h - one line per event: time, level, service, optional job id, message.
//
// Two formats. text (the default):
//
//   2026-11-30T08:49:50.123Z INFO  rollout job=j-12 step=4 tokens/s=1234
//
// json (--log-format json, MARLAAS_LOG_FORMAT=json): one JSON object per line,
//
//   {"time":"2026-11-30T08:49:50.123Z","level":"info","service":"rollout","id":"rollout-h-42",
//    "job":"j-12","tenant":"t-3","message":"step=4 tokens/s=1234","fields":{"step":"4","tokens/s":"1234"}}
//
// id, job, tenant and fields appear when known; fields holds the message's key=value words
// (values as strings). Strings are escaped for JSON; bytes that are not UTF-8 become U+FFFD.
//
// The macros (log_info, logj_info(job, ...), logt_info(tenant, job, ...), ...) check the level
// before any formatting.
#ifndef MARLAAS_LOG_H
#define MARLAAS_LOG_H

#include <stddef.h>
#include <time.h>

// Level names avoid syslog.h's LOG_INFO / LOG_ERR macros, which czmq pulls in. LOGL_FATAL is
// for log_fatal only (a line written just before the process aborts).
enum { LOGL_DEBUG = 0, LOGL_INFO = 1, LOGL_WARN = 2, LOGL_ERROR = 3, LOGL_FATAL = 4 };
enum { LOG_TEXT = 0, LOG_JSON = 1 };

extern int log_level;

// Sets the service name printed on every line (default "marlaas"), the level from
// MARLAAS_LOG_LEVEL (debug|info|warn|error) and the format from MARLAAS_LOG_FORMAT (text|json)
// when set to a valid value (svc_init refuses an invalid one).
void log_init(const char *service);
void log_set_level(int level);
// Parses "debug|info|warn|error"; returns the level or -1.
int log_parse_level(const char *s);
// Parses "text|json"; returns LOG_TEXT or LOG_JSON, or -1.
int log_parse_format(const char *s);
void log_set_format(int format);
int log_get_format(void);
// The instance id shown by the json format (the text format has none).
void log_set_id(const char *id);
// job and tenant may be NULL. Writes one line to stderr.
void log_write(int level, const char *job, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void log_write_tenant(int level, const char *tenant, const char *job, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// The line of a process about to abort (out of memory, a failed assertion): "FATAL message" in
// the text format, level "fatal" in json. Never filtered by the level.
void log_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Longest line log_render writes (with its newline and NUL).
#define LOG_LINE_MAX 16384
// Formats one event as a line of the given format into out (cap bytes, at least 64): the text,
// newline-terminated and NUL-terminated; returns its length (without the NUL). Text lines are
// cut at 2046 bytes with newlines folded to spaces; a json line is always one complete object,
// its strings cut where the line would exceed cap. Any of service, id, tenant, job may be NULL.
// Allocates nothing, takes no lock and calls no stdio: safe in a signal handler.
size_t log_render(char *out, size_t cap, int format, int level, const struct timespec *ts, const char *service,
                  const char *id, const char *tenant, const char *job, const char *msg);
// log_render with this process's format, service, id and the current time.
size_t log_render_now(char *out, size_t cap, int level, const char *job, const char *msg);

#define LOG_AT(lvl, job, ...) do { if ((lvl) >= log_level) log_write((lvl), (job), __VA_ARGS__); } while (0)
#define LOGT_AT(lvl, tenant, job, ...) \
    do { if ((lvl) >= log_level) log_write_tenant((lvl), (tenant), (job), __VA_ARGS__); } while (0)
#define log_debug(...) LOG_AT(LOGL_DEBUG, NULL, __VA_ARGS__)
#define log_info(...) LOG_AT(LOGL_INFO, NULL, __VA_ARGS__)
#define log_warn(...) LOG_AT(LOGL_WARN, NULL, __VA_ARGS__)
#define log_error(...) LOG_AT(LOGL_ERROR, NULL, __VA_ARGS__)
#define logj_debug(job, ...) LOG_AT(LOGL_DEBUG, (job), __VA_ARGS__)
#define logj_info(job, ...) LOG_AT(LOGL_INFO, (job), __VA_ARGS__)
#define logj_warn(job, ...) LOG_AT(LOGL_WARN, (job), __VA_ARGS__)
#define logj_error(job, ...) LOG_AT(LOGL_ERROR, (job), __VA_ARGS__)
// With the tenant the event concerns (json: the field tenant; the text format does not show
// it, so a message that should name the tenant in text says so itself).
#define logt_info(tenant, job, ...) LOGT_AT(LOGL_INFO, (tenant), (job), __VA_ARGS__)
#define logt_warn(tenant, job, ...) LOGT_AT(LOGL_WARN, (tenant), (job), __VA_ARGS__)
#define logt_error(tenant, job, ...) LOGT_AT(LOGL_ERROR, (tenant), (job), __VA_ARGS__)

#endif

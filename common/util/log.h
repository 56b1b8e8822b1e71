// log.h - one line per event: time, level, service, optional job id, message.
//
//   2026-11-30T08:49:50.123Z INFO  rollout job=j-12 step=4 tokens/s=1234
//
// The macros (log_info, logj_info(job, ...), ...) check the level before any formatting.
#ifndef MARLAAS_LOG_H
#define MARLAAS_LOG_H

// Level names avoid syslog.h's LOG_INFO / LOG_ERR macros, which czmq pulls in.
enum { LOGL_DEBUG = 0, LOGL_INFO = 1, LOGL_WARN = 2, LOGL_ERROR = 3 };

extern int log_level;

// Sets the service name printed on every line (default "marlaas") and the level from
// MARLAAS_LOG_LEVEL (debug|info|warn|error) when set.
void log_init(const char *service);
void log_set_level(int level);
// Parses "debug|info|warn|error"; returns the level or -1.
int log_parse_level(const char *s);
// job may be NULL. Writes one line to stderr.
void log_write(int level, const char *job, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define LOG_AT(lvl, job, ...) do { if ((lvl) >= log_level) log_write((lvl), (job), __VA_ARGS__); } while (0)
#define log_debug(...) LOG_AT(LOGL_DEBUG, NULL, __VA_ARGS__)
#define log_info(...) LOG_AT(LOGL_INFO, NULL, __VA_ARGS__)
#define log_warn(...) LOG_AT(LOGL_WARN, NULL, __VA_ARGS__)
#define log_error(...) LOG_AT(LOGL_ERROR, NULL, __VA_ARGS__)
#define logj_debug(job, ...) LOG_AT(LOGL_DEBUG, (job), __VA_ARGS__)
#define logj_info(job, ...) LOG_AT(LOGL_INFO, (job), __VA_ARGS__)
#define logj_warn(job, ...) LOG_AT(LOGL_WARN, (job), __VA_ARGS__)
#define logj_error(job, ...) LOG_AT(LOGL_ERROR, (job), __VA_ARGS__)

#endif

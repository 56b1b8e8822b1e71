// log.h - one line per event: time, level, service, optional job id, message.
//
//   2026-11-30T08:49:50.123Z INFO  rollout job=j_12 step=4 tokens/s=1234
//
// The macros check the level before any formatting work is done.
#ifndef MARLAAS_LOG_H
#define MARLAAS_LOG_H

enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

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
#define LOG_DEBUG(...) LOG_AT(LOG_DEBUG, NULL, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_INFO, NULL, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_WARN, NULL, __VA_ARGS__)
#define LOG_ERROR(...) LOG_AT(LOG_ERROR, NULL, __VA_ARGS__)
#define LOGJ_DEBUG(job, ...) LOG_AT(LOG_DEBUG, (job), __VA_ARGS__)
#define LOGJ_INFO(job, ...) LOG_AT(LOG_INFO, (job), __VA_ARGS__)
#define LOGJ_WARN(job, ...) LOG_AT(LOG_WARN, (job), __VA_ARGS__)
#define LOGJ_ERROR(job, ...) LOG_AT(LOG_ERROR, (job), __VA_ARGS__)

#endif

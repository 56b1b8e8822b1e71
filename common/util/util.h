// util.h - small helpers shared by every module: error strings, checked allocation, timing.
//
// Library code returns 0 / -1 (or NULL) and writes a message into a caller-provided
// `char err[ERR_LEN]`; process code aborts only on programmer error or out-of-memory.
#ifndef MARLAAS_UTIL_H
#define MARLAAS_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define ERR_LEN 256

// Formats a message into err (may be NULL) and returns -1, so callers can `return err_set(...)`.
int err_set(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Allocation that aborts with file:line on out-of-memory (the only sane reaction in a
// compute process). xcalloc zero-fills. All return memory owned by the caller (free()).
#define xmalloc(n) util_xmalloc((n), __FILE__, __LINE__)
#define xcalloc(n, sz) util_xcalloc((n), (sz), __FILE__, __LINE__)
#define xrealloc(p, n) util_xrealloc((p), (n), __FILE__, __LINE__)
#define xstrdup(s) util_xstrdup((s), __FILE__, __LINE__)
void *util_xmalloc(size_t n, const char *file, int line);
void *util_xcalloc(size_t n, size_t sz, const char *file, int line);
void *util_xrealloc(void *p, size_t n, const char *file, int line);
char *util_xstrdup(const char *s, const char *file, int line);
// 64-byte aligned allocation for tensors (free with free()).
float *util_falloc(size_t n_floats, const char *file, int line);
#define falloc(n) util_falloc((n), __FILE__, __LINE__)

// Programmer-error assertion that stays on in release builds.
#define ASSERT(cond) do { if (!(cond)) util_assert_fail(#cond, __FILE__, __LINE__); } while (0)
void util_assert_fail(const char *what, const char *file, int line) __attribute__((noreturn));

// Monotonic wall clock in seconds; process CPU time in seconds.
double util_now(void);
double util_cpu_time(void);

// Reads a whole file into a NUL-terminated buffer (owned by the caller). Returns NULL and
// fills err on failure; *len_out (if not NULL) receives the length without the NUL.
char *util_read_file(const char *path, size_t *len_out, char *err);
// Writes len bytes atomically (temp file + rename). Returns 0 or -1 with err filled.
int util_write_file(const char *path, const void *buf, size_t len, char *err);
// Creates a directory (and parents) if missing. Returns 0 or -1 with err filled.
int util_mkdirs(const char *path, char *err);

// Thread count for OpenBLAS and the engine's own loops: MARLAAS_THREADS, else the number of
// cores the process may run on (its affinity mask: taskset, a container's cpuset), else the
// online cores. util_threads_init() gives it to the CPU backend's pool (OpenBLAS and OpenMP run
// one thread: the pool shares their work); call once at start
// (the engine calls it when a model is created, so tools need not).
int util_threads(void);
void util_threads_init(void);


// UTF-8. Length of the character at s (1..4) with its code point in *cp; for a byte that does
// not start a well-formed character, 1 with *cp = the byte and *ok = false.
size_t util_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, bool *ok);
// true when s[0, n) is well-formed UTF-8; else *bad (when not NULL) receives the offset of the
// first byte of the first ill-formed sequence.
bool util_utf8_valid(const char *s, size_t n, size_t *bad);

#endif

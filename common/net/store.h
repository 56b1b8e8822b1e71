// store.h - the Redis client every MARLaaS service uses for shared state: tenants, jobs,
// adapter versions and blobs, optimizer state, metrics streams.
//
// A store_t is one blocking connection (hiredis). It is not thread-safe: use one per thread.
//
// Failures. Every call returns 0 / -1 (or a pointer / NULL) and writes a message into a
// caller-provided `char err[ERR_LEN]` (may be NULL). Two kinds of failure are kept apart:
//   - A Redis error reply (wrong type, not an integer, syntax) is the server refusing the
//     command: it is returned as an error with the server's message and the connection stays
//     as it is.
//   - A lost connection (IO error, EOF, timeout) is retried: the connection is reopened with
//     exponential backoff (50 ms doubling to 2 s) until the retry budget (store_set_retry,
//     default 10 s) is spent, then the command is sent again. One warning is logged when an
//     outage starts and one info line when a command succeeds again, however many commands
//     fail in between. A command that was sent but whose reply was lost may therefore run
//     twice: SET / DEL / HSET / SADD / EXPIRE are idempotent, INCR / HINCRBY / RPUSH / XADD
//     and store_atomic transactions are not (a metric point may be recorded twice, a counter
//     bumped twice). Callers that cannot tolerate that need an idempotent design (explicit
//     ids, SET of absolute values).
// Each network round trip also has an IO timeout (STORE_IO_TIMEOUT_MS): a server that stops
// answering counts as a lost connection rather than hanging the caller. Blocking commands
// (BLPOP, XREAD BLOCK) sent through store_cmdv must block for less than that.
//
// Keys. The typed helpers take complete keys; build them with store_key, which prepends the
// store's prefix ("marlaas:" unless store_new was given another) so that several deployments
// or test runs can share one Redis. A NULL key (what store_key returns when the buffer is too
// small) is reported as an error rather than dereferenced.
//
// Binary safety. Values (store_set/get, store_hset_bin/hget, store_rpush/lrange, store_cmdv,
// store_atomic) may hold any bytes, NULs included. Keys, hash field names, set members and
// stream fields/values are C strings. Every byte buffer the store hands out carries one extra
// NUL after its length so text values can be used as C strings directly.
//
// SIGPIPE. Writing to a socket the server has closed would raise SIGPIPE, whose default action
// kills the process; the store blocks it on the calling thread around its own IO and discards
// one it caused, so the process-wide disposition is left untouched.
#ifndef MARLAAS_STORE_H
#define MARLAAS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "common/util/util.h"

#define STORE_DEFAULT_PREFIX "marlaas:"
#define STORE_DEFAULT_RETRY_MS 10000
#define STORE_CONNECT_TIMEOUT_MS 2000
#define STORE_IO_TIMEOUT_MS 30000
#define STORE_ID_LEN 64   // bytes of a stream entry id buffer, NUL included

typedef struct store store_t;

// One command as an argument vector (for store_atomic). lens may be NULL when every argument
// is a C string; otherwise lens[i] is the byte length of argv[i].
typedef struct {
    int argc;
    const char **argv;
    const size_t *lens;
} store_argv_t;

// A hash field (or stream field) and its value. value is binary: value_len bytes plus a NUL.
typedef struct {
    char *field;
    char *value;
    size_t value_len;
} store_kv_t;

// A byte string (list item). data holds len bytes plus a NUL.
typedef struct {
    uint8_t *data;
    size_t len;
} store_buf_t;

// A stream entry: its id ("1700000000000-0") and its field/value pairs in stored order.
typedef struct {
    char id[STORE_ID_LEN];
    int n;
    store_kv_t *kv;
} store_entry_t;

// --- connection --------------------------------------------------------------------------

// Connects to host:port (connect timeout STORE_CONNECT_TIMEOUT_MS). prefix NULL means
// STORE_DEFAULT_PREFIX. The first connection is not retried, so a misconfigured address is
// reported at once: NULL + err "cannot connect to Redis at HOST:PORT: <reason>; is
// redis-server running?".
store_t *store_new(const char *host, int port, const char *prefix, char *err);
// Same, authenticating every connection (the first and each reconnection) with AUTH: password
// alone (the default user, or a requirepass server) or user + password (a Redis 6+ ACL user).
// A refused password fails store_new_auth at once with a message that names the setting.
store_t *store_new_auth(const char *host, int port, const char *prefix, const char *user, const char *password,
                        char *err);
// AUTH on a connection of the caller's (NULL password: nothing to do). 0, or -1 + why.
int store_redis_auth(redisContext *c, const char *user, const char *password, char *why);

// A connection of its own with s's address, key prefix, credentials, retry budget and abort test
// (hiredis connections are not shared between threads: one per thread). NULL + err as store_new.
store_t *store_new_like(const store_t *s, char *err);

// Closes the connection and frees the store; sets *s to NULL. Accepts NULL and *s == NULL.
void store_destroy(store_t **s);

// Sets the total time (ms) one call may spend reopening a lost connection before it fails
// (default STORE_DEFAULT_RETRY_MS). 0 means one immediate reconnection attempt only.
// Negative values are treated as 0.
void store_set_retry(store_t *s, int max_wait_ms);

// While abort() returns true (the process is shutting down) a lost connection is tried once
// and the call fails instead of retrying for the rest of its budget: a service told to stop
// while Redis is unreachable stops within seconds. NULL = always retry.
void store_set_abort(store_t *s, bool (*abort)(void));

// The key prefix this store was created with.
const char *store_prefix(const store_t *s);

// Writes prefix + the formatted key into buf (size n) and returns buf, or NULL when it does
// not fit (a truncated key would silently alias another one).
const char *store_key(const store_t *s, char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// PING. 0 or -1 + err.
int store_ping(store_t *s, char *err);

// --- raw commands ------------------------------------------------------------------------

// Runs one command given as an argument vector (binary safe; lens NULL when every argument is
// a C string), reconnecting and resending as described at the top of this file. Returns the
// reply (free with freeReplyObject; nil replies included) or NULL + err on a lost connection
// that could not be restored in time or on a Redis error reply (err then holds the command
// name and the server's message, e.g. "redis INCR: ERR value is not an integer or out of
// range").
redisReply *store_cmdv(store_t *s, int argc, const char **argv, const size_t *lens, char *err);

// Like store_cmdv with a hiredis format string (redisCommand syntax: %s is a C string, %b a
// pointer and a size_t length; each expands to exactly one argument, never split on spaces).
// Literal words in fmt are split on spaces, so fmt must be a trusted constant: never pass
// text received from a user as fmt.
redisReply *store_cmd(store_t *s, char *err, const char *fmt, ...);

// Runs the commands inside MULTI ... EXEC in one round trip, so they are applied together and
// no other client's command runs between them (e.g. store a new adapter blob, move the version
// pointer, delete the old blob). Returns the EXEC reply, an array whose element i is the reply
// of cmds[i] (free with freeReplyObject), or NULL + err:
//   - a command Redis rejects while queueing (unknown command, wrong arity): nothing is
//     applied; err names the command and says so;
//   - a command failing while executing (e.g. INCR on text): Redis does not roll back, so the
//     other commands WERE applied; err names the failed command and says so;
//   - a lost connection: the whole transaction is resent after reconnecting (Redis discards an
//     unfinished MULTI when its connection closes, so a half-queued transaction never runs).
// ncmds must be >= 1. Commands may be binary (see store_argv_t).
redisReply *store_atomic(store_t *s, int ncmds, const store_argv_t *cmds, char *err);

// --- strings -----------------------------------------------------------------------------

// SET key value (len bytes, binary). 0 or -1 + err.
int store_set(store_t *s, const char *key, const void *data, size_t len, char *err);

// GET key. 0 with *data (len bytes + NUL, caller frees) and *len; 1 when the key is missing
// (*data NULL, *len 0); -1 + err.
int store_get(store_t *s, const char *key, uint8_t **data, size_t *len, char *err);

// DEL key. 0 when it was deleted, 1 when it did not exist, -1 + err.
int store_del(store_t *s, const char *key, char *err);

// EXISTS key. 0 when it exists, 1 when it does not, -1 + err.
int store_exists(store_t *s, const char *key, char *err);

// COPY src dst REPLACE: dst becomes a copy of src, on the server (Redis >= 6.2; the value never
// crosses the connection), idempotent (a resend after a lost reply copies the same value again).
// 0 when copied, 1 when src does not exist (dst untouched), -1 + err.
int store_copy(store_t *s, const char *src, const char *dst, char *err);

// INCR key (a missing key counts as 0). 0 with *out (may be NULL) the new value, -1 + err
// (e.g. when the value is not an integer).
int store_incr(store_t *s, const char *key, int64_t *out, char *err);

// EXPIRE key seconds. 0 when the timeout was set, 1 when the key does not exist, -1 + err.
int store_expire(store_t *s, const char *key, int seconds, char *err);

// --- hashes ------------------------------------------------------------------------------

// HSET key f1 v1 f2 v2 ... (C strings; nfields >= 1). 0 or -1 + err.
int store_hset(store_t *s, const char *key, int nfields, const char **fields, const char **values,
               char *err);

// HSET key field value with a binary value of len bytes. 0 or -1 + err.
int store_hset_bin(store_t *s, const char *key, const char *field, const void *data, size_t len,
                   char *err);

// HGET key field. 0 with *out a copy of the value (NUL-terminated, caller frees) and *len (may
// be NULL; the value's byte length, for binary values); 1 when the key or field is missing
// (*out NULL); -1 + err.
int store_hget(store_t *s, const char *key, const char *field, char **out, size_t *len, char *err);

// HGETALL key. 0 with *kv (n pairs, free with store_kv_free); 1 when the hash does not exist
// (Redis deletes empty hashes, so "empty" and "missing" are the same; *kv NULL, *n 0); -1 + err.
int store_hgetall(store_t *s, const char *key, store_kv_t **kv, int *n, char *err);

// Frees what store_hgetall returned and sets *kv to NULL. Accepts NULL.
void store_kv_free(store_kv_t **kv, int n);

// HINCRBY key field delta. 0 with *out (may be NULL) the new value, -1 + err.
int store_hincrby(store_t *s, const char *key, const char *field, int64_t delta, int64_t *out,
                  char *err);

// HINCRBYFLOAT key field delta (delta must be finite). 0 with *out (may be NULL) the new
// value, -1 + err.
int store_hincrbyfloat(store_t *s, const char *key, const char *field, double delta, double *out,
                       char *err);

// --- sets (members are C strings) --------------------------------------------------------

// SADD / SREM key m1 m2 ... (n >= 1). 0 with *changed (may be NULL) the number of members
// actually added / removed, -1 + err.
int store_sadd(store_t *s, const char *key, int n, const char **members, int64_t *changed,
               char *err);
int store_srem(store_t *s, const char *key, int n, const char **members, int64_t *changed,
               char *err);

// SMEMBERS key. 0 with *members (*n strings in no particular order; free with
// store_strv_free); a missing set is an empty one (0, *members NULL, *n 0). -1 + err.
int store_smembers(store_t *s, const char *key, char ***members, int *n, char *err);

// SCAN with MATCH pattern (a full key: give the prefix, store_key) until the cursor returns or max
// keys are found. 0 with *keys (*n strings, in no order; store_strv_free), -1 + err.
int store_scan(store_t *s, const char *pattern, int max, char ***keys, int *n, char *err);

// Frees an array of n strings and sets *v to NULL. Accepts NULL.
void store_strv_free(char ***v, int n);

// --- lists -------------------------------------------------------------------------------

// RPUSH key item1 item2 ... (n >= 1; binary: lens[i] bytes each, or lens NULL when every item
// is a C string). 0 with *list_len (may be NULL) the list's length afterwards, -1 + err.
int store_rpush(store_t *s, const char *key, int n, const void *const *items, const size_t *lens,
                int64_t *list_len, char *err);

// LTRIM key start stop (indices as LRANGE's: -8 -1 keeps the last 8). 0, -1 + err.
int store_ltrim(store_t *s, const char *key, long start, long stop, char *err);

// LRANGE key start stop (Redis indexing: 0 first, -1 last, both inclusive). 0 with *items
// (*n entries; free with store_bufv_free); a missing list is an empty one. -1 + err.
int store_lrange(store_t *s, const char *key, long start, long stop, store_buf_t **items, int *n,
                 char *err);

// Frees an array of n buffers and sets *v to NULL. Accepts NULL.
void store_bufv_free(store_buf_t **v, int n);

// --- streams -----------------------------------------------------------------------------

// XADD key [MAXLEN ~ maxlen_approx] * f1 v1 ... (C strings; nfields >= 1). maxlen_approx <= 0
// disables trimming. Approximate trimming drops whole internal nodes only, so the stream may
// keep somewhat more than maxlen_approx entries (never fewer). 0 with id_out (may be NULL)
// holding the new entry's id, -1 + err.
int store_xadd(store_t *s, const char *key, long maxlen_approx, int nfields, const char **fields,
               const char **values, char id_out[STORE_ID_LEN], char *err);

// XRANGE key start + [COUNT count]: entries with id >= start ("-" for the first; "(ID" for the
// entries after ID, the way to page through a stream), oldest first, at most count of them
// (count <= 0: all). 0 with *entries (*n; free with store_entries_free); a missing stream is
// an empty one. -1 + err.
int store_xrange(store_t *s, const char *key, const char *start, int count, store_entry_t **entries,
                 int *n, char *err);

// The latest count (> 0) entries of the stream (XREVRANGE key + - COUNT count), oldest first:
// what a reader of recent entries needs without reading the whole stream.
int store_xrange_latest(store_t *s, const char *key, int count, store_entry_t **entries, int *n, char *err);

// Frees what store_xrange returned and sets *entries to NULL. Accepts NULL.
void store_entries_free(store_entry_t **entries, int n);

#endif

// store.c - Redis client on hiredis: reconnecting round trips, typed helpers, MULTI/EXEC.
//
// Every command is formatted once (by hiredis) into a buffer and sent through one routine,
// store_roundtrip, which owns the reconnect policy; a transaction is the same buffer holding
// MULTI, the commands and EXEC, so it is resent whole after a reconnection.
#include "store.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/util/log.h"

#define STORE_BACKOFF_MIN_MS 50
#define STORE_BACKOFF_MAX_MS 2000
// A command the server keeps dropping the connection on (e.g. one over its size limits) would
// otherwise be resent after every successful reconnection until the retry budget runs out.
#define STORE_MAX_SENDS 4

struct store {
    char *host;
    int port;
    char *prefix;
    char *user, *password; // AUTH on every connection when password is set
    redisContext *ctx;     // NULL while disconnected
    int retry_ms;
    bool down;             // an outage was logged and no command has succeeded since
    double down_since;
    bool (*abort)(void);   // reconnection gives up at once when this returns true (shutdown)
};

#define T(x) (1u << REDIS_REPLY_##x)

// --- connection --------------------------------------------------------------------------

static void store_sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000.0), (long)(fmod(ms, 1000.0) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// Opens s->ctx. On failure leaves s->ctx NULL and writes hiredis' reason into why.
static int store_connect(store_t *s, int timeout_ms, char *why) {
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv);
    if (!c) return err_set(why, "out of memory");
    if (c->err) {
        err_set(why, "%s", c->errstr[0] ? c->errstr : "connection failed");
        redisFree(c);
        return -1;
    }
    // Without an IO timeout a server that stops answering (stopped, swapped out, partitioned)
    // would block the caller forever; keepalive finds dead peers on idle connections.
    struct timeval io = {STORE_IO_TIMEOUT_MS / 1000, (STORE_IO_TIMEOUT_MS % 1000) * 1000};
    if (redisSetTimeout(c, io) != REDIS_OK || redisEnableKeepAlive(c) != REDIS_OK) {
        err_set(why, "cannot configure the socket: %s", c->errstr[0] ? c->errstr : "unknown error");
        redisFree(c);
        return -1;
    }
    if (store_redis_auth(c, s->user, s->password, why)) {
        redisFree(c);
        return -1;
    }
    s->ctx = c;
    return 0;
}

int store_redis_auth(redisContext *c, const char *user, const char *password, char *why) {
    if (!password || !*password) return 0;
    redisReply *r = user && *user ? redisCommand(c, "AUTH %s %s", user, password) : redisCommand(c, "AUTH %s", password);
    if (!r) return err_set(why, "AUTH: %s", c->errstr[0] ? c->errstr : "no reply");
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR)
        rc = err_set(why, "Redis refused the password (%.200s): check MARLAAS_REDIS_PASSWORD%s", r->str,
                     user && *user ? " and MARLAAS_REDIS_USER" : "");
    freeReplyObject(r);
    return rc;
}

// Reconnects with exponential backoff until deadline (util_now() seconds). The connect
// timeout is cut to what is left so an unroutable host cannot overrun the budget by 2 s.
static int store_reconnect(store_t *s, double deadline, char *why) {
    int delay = STORE_BACKOFF_MIN_MS;
    for (;;) {
        double left_ms = (deadline - util_now()) * 1000.0;
        int cto = STORE_CONNECT_TIMEOUT_MS;
        if (left_ms < cto) cto = left_ms < STORE_BACKOFF_MIN_MS ? STORE_BACKOFF_MIN_MS : (int)left_ms;
        if (store_connect(s, cto, why) == 0) return 0;
        left_ms = (deadline - util_now()) * 1000.0;
        if (left_ms <= 0) return -1;
        if (s->abort && s->abort()) {
            snprintf(why + strlen(why), ERR_LEN - strlen(why), " (stopping: no more attempts)");
            return -1;
        }
        store_sleep_ms(delay < left_ms ? delay : left_ms);
        delay = delay * 2 > STORE_BACKOFF_MAX_MS ? STORE_BACKOFF_MAX_MS : delay * 2;
    }
}

store_t *store_new(const char *host, int port, const char *prefix, char *err) {
    return store_new_auth(host, port, prefix, NULL, NULL, err);
}

store_t *store_new_auth(const char *host, int port, const char *prefix, const char *user, const char *password,
                        char *err) {
    if (!host || !*host) {
        err_set(err, "cannot connect to Redis: no host given");
        return NULL;
    }
    if (port < 1 || port > 65535) {
        err_set(err, "cannot connect to Redis at %s:%d: port out of range", host, port);
        return NULL;
    }
    store_t *s = xcalloc(1, sizeof *s);
    s->host = xstrdup(host);
    s->port = port;
    s->prefix = xstrdup(prefix ? prefix : STORE_DEFAULT_PREFIX);
    s->user = user && *user ? xstrdup(user) : NULL;
    s->password = password && *password ? xstrdup(password) : NULL;
    s->retry_ms = STORE_DEFAULT_RETRY_MS;
    char why[ERR_LEN];
    if (store_connect(s, STORE_CONNECT_TIMEOUT_MS, why) != 0) {
        err_set(err, "cannot connect to Redis at %s:%d: %s; is redis-server running?", host, port, why);
        store_destroy(&s);
        return NULL;
    }
    return s;
}

store_t *store_new_like(const store_t *s, char *err) {
    store_t *d = store_new_auth(s->host, s->port, s->prefix, s->user, s->password, err);
    if (!d) return NULL;
    d->retry_ms = s->retry_ms;
    d->abort = s->abort;
    return d;
}

void store_destroy(store_t **sp) {
    if (!sp || !*sp) return;
    store_t *s = *sp;
    if (s->ctx) redisFree(s->ctx);
    free(s->host);
    free(s->prefix);
    free(s->user);
    if (s->password) sodium_memzero(s->password, strlen(s->password));
    free(s->password);
    free(s);
    *sp = NULL;
}

void store_set_abort(store_t *s, bool (*abort)(void)) {
    if (s) s->abort = abort;
}

void store_set_retry(store_t *s, int max_wait_ms) {
    if (s) s->retry_ms = max_wait_ms < 0 ? 0 : max_wait_ms;
}

const char *store_prefix(const store_t *s) { return s ? s->prefix : NULL; }

const char *store_key(const store_t *s, char *buf, size_t n, const char *fmt, ...) {
    if (!s || !buf || n == 0 || !fmt) return NULL;
    size_t p = strlen(s->prefix);
    if (p >= n) {
        buf[0] = 0;
        return NULL;
    }
    memcpy(buf, s->prefix, p);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + p, n - p, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= n - p) {
        buf[0] = 0;
        return NULL;
    }
    return buf;
}

// --- round trips -------------------------------------------------------------------------

// hiredis writes with write(2), so a write to a socket the server closed raises SIGPIPE,
// which kills the process by default. It is blocked on this thread around the IO and, if the
// IO raised it, consumed before unblocking; the process-wide disposition is not touched.
typedef struct {
    sigset_t old;
    bool pending_before;
} store_sigpipe_t;

static void store_sigpipe_block(store_sigpipe_t *g) {
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigemptyset(&pend);
    sigpending(&pend);
    g->pending_before = sigismember(&pend, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void store_sigpipe_restore(const store_sigpipe_t *g) {
    if (!g->pending_before) {
        sigset_t set, pend;
        sigemptyset(&pend);
        sigpending(&pend);
        if (sigismember(&pend, SIGPIPE) == 1) {
            sigemptyset(&set);
            sigaddset(&set, SIGPIPE);
            struct timespec zero = {0, 0};
            while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
            }
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

// Sends cmd on the current connection and reads nreplies replies into out. On failure every
// reply read so far is freed and s->ctx->errstr says why.
static int store_exchange(store_t *s, const char *cmd, size_t len, int nreplies, redisReply **out) {
    store_sigpipe_t g;
    store_sigpipe_block(&g);
    int got = 0, rc = redisAppendFormattedCommand(s->ctx, cmd, len) == REDIS_OK ? 0 : -1;
    while (rc == 0 && got < nreplies) {
        void *r = NULL;
        if (redisGetReply(s->ctx, &r) != REDIS_OK || !r) {
            rc = -1;
            break;
        }
        out[got++] = r;
    }
    store_sigpipe_restore(&g);
    if (rc != 0) {
        for (int i = 0; i < got; i++) {
            freeReplyObject(out[i]);
            out[i] = NULL;
        }
    }
    return rc;
}

// Sends a formatted command buffer (possibly several commands) and reads nreplies replies,
// reconnecting and resending on connection failures. Redis error replies are returned like
// any other reply: they are the server's answer, not a transport problem.
static int store_roundtrip(store_t *s, const char *cmd, size_t len, int nreplies, redisReply **out,
                           char *err) {
    char why[ERR_LEN] = "not connected";
    double deadline = -1.0;
    int sends = 0;
    for (;;) {
        if (s->ctx) {
            sends++;
            if (store_exchange(s, cmd, len, nreplies, out) == 0) {
                if (s->down) {
                    log_info("redis %s:%d connection restored after %.1f s", s->host, s->port,
                             util_now() - s->down_since);
                    s->down = false;
                }
                return 0;
            }
            err_set(why, "%s", s->ctx->errstr[0] ? s->ctx->errstr : "connection lost");
            redisFree(s->ctx);
            s->ctx = NULL;
            if (!s->down) {
                s->down = true;
                s->down_since = util_now();
                log_warn("redis %s:%d connection lost (%s); reconnecting, up to %d ms per command",
                         s->host, s->port, why, s->retry_ms);
            }
            if (sends >= STORE_MAX_SENDS)
                return err_set(err, "Redis at %s:%d dropped the connection %d times during one command "
                               "(last: %s)", s->host, s->port, sends, why);
        }
        if (deadline < 0) deadline = util_now() + s->retry_ms / 1000.0;
        if (store_reconnect(s, deadline, why) != 0)
            return err_set(err, "cannot reach Redis at %s:%d (gave up reconnecting after %d ms): %s; "
                           "is redis-server running?", s->host, s->port, s->retry_ms, why);
    }
}

// Turns a Redis error reply into NULL + err naming the command.
static redisReply *store_check(redisReply *r, const char *name, size_t name_len, char *err) {
    if (r->type != REDIS_REPLY_ERROR) return r;
    err_set(err, "redis %.*s: %s", (int)(name_len > 32 ? 32 : name_len), name, r->str ? r->str : "error");
    freeReplyObject(r);
    return NULL;
}

static int store_check_args(int argc, const char **argv, char *err) {
    if (argc < 1 || !argv || !argv[0]) return err_set(err, "redis: empty command");
    for (int i = 1; i < argc; i++)
        if (!argv[i])
            return err_set(err, "redis %.32s: argument %d is NULL (a key store_key could not fit?)",
                           argv[0], i);
    return 0;
}

redisReply *store_cmdv(store_t *s, int argc, const char **argv, const size_t *lens, char *err) {
    if (!s) {
        err_set(err, "redis: no store");
        return NULL;
    }
    if (store_check_args(argc, argv, err) != 0) return NULL;
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0) {
        err_set(err, "redis %.32s: cannot format the command", argv[0]);
        return NULL;
    }
    redisReply *r = NULL;
    int rc = store_roundtrip(s, cmd, (size_t)len, 1, &r, err);
    redisFreeCommand(cmd);
    if (rc != 0) return NULL;
    return store_check(r, argv[0], lens ? lens[0] : strlen(argv[0]), err);
}

redisReply *store_cmd(store_t *s, char *err, const char *fmt, ...) {
    if (!s || !fmt) {
        err_set(err, "redis: no store or no command");
        return NULL;
    }
    // The command name for messages is fmt's first word, unless that word is itself a
    // substitution.
    size_t nl = strcspn(fmt, " %");
    const char *name = nl > 0 && fmt[nl] != '%' ? fmt : "command";
    if (name != fmt) nl = strlen(name);
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len < 0) {
        err_set(err, "redis %.*s: cannot format the command (bad format string?)", (int)(nl > 32 ? 32 : nl),
                name);
        return NULL;
    }
    redisReply *r = NULL;
    int rc = store_roundtrip(s, cmd, (size_t)len, 1, &r, err);
    redisFreeCommand(cmd);
    if (rc != 0) return NULL;
    return store_check(r, name, nl, err);
}

int store_ping(store_t *s, char *err) {
    const char *argv[] = {"PING"};
    redisReply *r = store_cmdv(s, 1, argv, NULL, err);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

redisReply *store_atomic(store_t *s, int ncmds, const store_argv_t *cmds, char *err) {
    if (!s || ncmds < 1 || !cmds) {
        err_set(err, "redis atomic: no commands");
        return NULL;
    }
    for (int i = 0; i < ncmds; i++) {
        if (store_check_args(cmds[i].argc, cmds[i].argv, err) != 0) return NULL;
    }
    char *buf = NULL, *one = NULL;
    size_t used = 0;
    int nrep = ncmds + 2;
    redisReply **rep = xcalloc((size_t)nrep, sizeof *rep);
    redisReply *result = NULL;
    for (int i = -1; i <= ncmds; i++) {
        static const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
        int len = i < 0 ? redisFormatCommandArgv(&one, 1, multi, NULL)
                  : i == ncmds ? redisFormatCommandArgv(&one, 1, exec, NULL)
                               : redisFormatCommandArgv(&one, cmds[i].argc, cmds[i].argv, cmds[i].lens);
        if (len < 0) {
            err_set(err, "redis atomic: cannot format the transaction (out of memory)");
            goto done;
        }
        buf = xrealloc(buf, used + (size_t)len);
        memcpy(buf + used, one, (size_t)len);
        used += (size_t)len;
        redisFreeCommand(one);
        one = NULL;
    }
    if (store_roundtrip(s, buf, used, nrep, rep, err) != 0) goto done;
    if (rep[0]->type == REDIS_REPLY_ERROR) {
        err_set(err, "redis MULTI: %s", rep[0]->str);
        goto done;
    }
    for (int i = 0; i < ncmds; i++) {
        const redisReply *q = rep[i + 1];
        if (q->type == REDIS_REPLY_ERROR) {
            size_t nl = cmds[i].lens ? cmds[i].lens[0] : strlen(cmds[i].argv[0]);
            err_set(err, "redis atomic: cmds[%d] (%.*s) rejected: %s; nothing was applied", i,
                    (int)(nl > 32 ? 32 : nl), cmds[i].argv[0], q->str);
            goto done;
        }
    }
    redisReply *ex = rep[nrep - 1];
    if (ex->type == REDIS_REPLY_ERROR) {
        err_set(err, "redis EXEC: %s", ex->str);
        goto done;
    }
    if (ex->type != REDIS_REPLY_ARRAY || ex->elements != (size_t)ncmds) {
        err_set(err, "redis EXEC: transaction not executed (reply type %d)", ex->type);
        goto done;
    }
    for (int i = 0; i < ncmds; i++) {
        const redisReply *e = ex->element[i];
        if (e->type == REDIS_REPLY_ERROR) {
            size_t nl = cmds[i].lens ? cmds[i].lens[0] : strlen(cmds[i].argv[0]);
            err_set(err, "redis atomic: cmds[%d] (%.*s) failed: %s; the other commands were applied "
                    "(Redis does not roll back)", i, (int)(nl > 32 ? 32 : nl), cmds[i].argv[0], e->str);
            goto done;
        }
    }
    result = ex;
    rep[nrep - 1] = NULL;
done:
    for (int i = 0; i < nrep; i++)
        if (rep[i]) freeReplyObject(rep[i]);
    free(rep);
    free(buf);
    return result;
}

// --- typed helpers -----------------------------------------------------------------------

// Runs a command whose name is argv[0] (a C string) and checks the reply is of an expected
// type (a mask of T(...)).
static redisReply *store_run(store_t *s, int argc, const char **argv, const size_t *lens, unsigned types,
                             char *err) {
    redisReply *r = store_cmdv(s, argc, argv, lens, err);
    if (r && !((1u << r->type) & types)) {
        err_set(err, "redis %s: unexpected reply type %d", argv[0], r->type);
        freeReplyObject(r);
        r = NULL;
    }
    return r;
}

// Checks an array reply holds only strings and fits in an int count.
static int store_check_strings(const redisReply *r, const char *name, char *err) {
    if (r->elements > INT_MAX) return err_set(err, "redis %s: %zu elements is too many", name, r->elements);
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type != REDIS_REPLY_STRING)
            return err_set(err, "redis %s: unexpected element type %d", name, r->element[i]->type);
    return 0;
}

static char *store_dup(const char *p, size_t len) {
    char *d = xmalloc(len + 1);
    if (len) memcpy(d, p, len);
    d[len] = 0;
    return d;
}

// Data pointer for an argument: an empty value may be passed as NULL; a NULL with a length
// stays NULL so store_cmdv reports it.
static const char *store_bytes(const void *p, size_t len) { return p ? (const char *)p : len ? NULL : ""; }

static size_t store_len(const char *p) { return p ? strlen(p) : 0; }

// Runs a command expected to answer an integer.
static int store_int_cmd(store_t *s, int argc, const char **argv, const size_t *lens, int64_t *out,
                         char *err) {
    redisReply *r = store_run(s, argc, argv, lens, T(INTEGER), err);
    if (!r) return -1;
    if (out) *out = r->integer;
    freeReplyObject(r);
    return 0;
}

int store_set(store_t *s, const char *key, const void *data, size_t len, char *err) {
    const char *argv[] = {"SET", key, store_bytes(data, len)};
    size_t lens[] = {3, store_len(key), len};
    redisReply *r = store_run(s, 3, argv, lens, T(STATUS), err);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

int store_get(store_t *s, const char *key, uint8_t **data, size_t *len, char *err) {
    *data = NULL;
    *len = 0;
    const char *argv[] = {"GET", key};
    redisReply *r = store_run(s, 2, argv, NULL, T(STRING) | T(NIL), err);
    if (!r) return -1;
    int rc = 1;
    if (r->type == REDIS_REPLY_STRING) {
        *data = (uint8_t *)store_dup(r->str, r->len);
        *len = r->len;
        rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

int store_del(store_t *s, const char *key, char *err) {
    const char *argv[] = {"DEL", key};
    int64_t n;
    if (store_int_cmd(s, 2, argv, NULL, &n, err) != 0) return -1;
    return n > 0 ? 0 : 1;
}

int store_exists(store_t *s, const char *key, char *err) {
    const char *argv[] = {"EXISTS", key};
    int64_t n;
    if (store_int_cmd(s, 2, argv, NULL, &n, err) != 0) return -1;
    return n > 0 ? 0 : 1;
}

int store_copy(store_t *s, const char *src, const char *dst, char *err) {
    const char *argv[] = {"COPY", src, dst, "REPLACE"};
    int64_t n;
    if (store_int_cmd(s, 4, argv, NULL, &n, err) != 0) return -1;
    return n > 0 ? 0 : 1;
}

int store_incr(store_t *s, const char *key, int64_t *out, char *err) {
    const char *argv[] = {"INCR", key};
    return store_int_cmd(s, 2, argv, NULL, out, err);
}

int store_expire(store_t *s, const char *key, int seconds, char *err) {
    char sec[24];
    snprintf(sec, sizeof sec, "%d", seconds);
    const char *argv[] = {"EXPIRE", key, sec};
    int64_t n;
    if (store_int_cmd(s, 3, argv, NULL, &n, err) != 0) return -1;
    return n > 0 ? 0 : 1;
}

// Builds "CMD key a0 b0 a1 b1 ..." (b may be NULL for "CMD key a0 a1 ...") and runs it.
static redisReply *store_run_pairs(store_t *s, const char *cmd, const char *key, int n, const char **a,
                                   const char **b, unsigned types, char *err) {
    if (n < 1 || !a) {
        err_set(err, "redis %s: nothing to send", cmd);
        return NULL;
    }
    int per = b ? 2 : 1;
    if (n > (INT_MAX - 2) / per) {
        err_set(err, "redis %s: too many arguments", cmd);
        return NULL;
    }
    int argc = 2 + per * n;
    const char **argv = xmalloc((size_t)argc * sizeof *argv);
    argv[0] = cmd;
    argv[1] = key;
    for (int i = 0; i < n; i++) {
        argv[2 + per * i] = a[i];
        if (b) argv[3 + per * i] = b[i];
    }
    redisReply *r = store_run(s, argc, argv, NULL, types, err);
    free(argv);
    return r;
}

int store_hset(store_t *s, const char *key, int nfields, const char **fields, const char **values,
               char *err) {
    if (!values) return err_set(err, "redis HSET: no values");
    redisReply *r = store_run_pairs(s, "HSET", key, nfields, fields, values, T(INTEGER), err);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

int store_hset_bin(store_t *s, const char *key, const char *field, const void *data, size_t len,
                   char *err) {
    const char *argv[] = {"HSET", key, field, store_bytes(data, len)};
    size_t lens[] = {4, store_len(key), store_len(field), len};
    return store_int_cmd(s, 4, argv, lens, NULL, err);
}

int store_hget(store_t *s, const char *key, const char *field, char **out, size_t *len, char *err) {
    *out = NULL;
    if (len) *len = 0;
    const char *argv[] = {"HGET", key, field};
    redisReply *r = store_run(s, 3, argv, NULL, T(STRING) | T(NIL), err);
    if (!r) return -1;
    int rc = 1;
    if (r->type == REDIS_REPLY_STRING) {
        *out = store_dup(r->str, r->len);
        if (len) *len = r->len;
        rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

int store_hgetall(store_t *s, const char *key, store_kv_t **kv, int *n, char *err) {
    *kv = NULL;
    *n = 0;
    const char *argv[] = {"HGETALL", key};
    redisReply *r = store_run(s, 2, argv, NULL, T(ARRAY), err);
    if (!r) return -1;
    int rc = -1;
    if (store_check_strings(r, "HGETALL", err) != 0) goto done;
    if (r->elements % 2) {
        err_set(err, "redis HGETALL: odd number of elements (%zu)", r->elements);
        goto done;
    }
    int m = (int)(r->elements / 2);
    if (m == 0) {
        rc = 1;
        goto done;
    }
    store_kv_t *v = xcalloc((size_t)m, sizeof *v);
    for (int i = 0; i < m; i++) {
        const redisReply *f = r->element[2 * i], *x = r->element[2 * i + 1];
        v[i].field = store_dup(f->str, f->len);
        v[i].value = store_dup(x->str, x->len);
        v[i].value_len = x->len;
    }
    *kv = v;
    *n = m;
    rc = 0;
done:
    freeReplyObject(r);
    return rc;
}

void store_kv_free(store_kv_t **kv, int n) {
    if (!kv || !*kv) return;
    for (int i = 0; i < n; i++) {
        free((*kv)[i].field);
        free((*kv)[i].value);
    }
    free(*kv);
    *kv = NULL;
}

int store_hincrby(store_t *s, const char *key, const char *field, int64_t delta, int64_t *out,
                  char *err) {
    char d[24];
    snprintf(d, sizeof d, "%lld", (long long)delta);
    const char *argv[] = {"HINCRBY", key, field, d};
    return store_int_cmd(s, 4, argv, NULL, out, err);
}

int store_hincrbyfloat(store_t *s, const char *key, const char *field, double delta, double *out,
                       char *err) {
    if (!isfinite(delta)) return err_set(err, "redis HINCRBYFLOAT: delta %g is not finite", delta);
    char d[40];
    snprintf(d, sizeof d, "%.17g", delta);
    const char *argv[] = {"HINCRBYFLOAT", key, field, d};
    redisReply *r = store_run(s, 4, argv, NULL, T(STRING), err);
    if (!r) return -1;
    char *end = NULL;
    double v = strtod(r->str, &end);
    int rc = end && end != r->str && *end == 0
                 ? 0
                 : err_set(err, "redis HINCRBYFLOAT: bad number '%.40s'", r->str);
    if (rc == 0 && out) *out = v;
    freeReplyObject(r);
    return rc;
}

int store_sadd(store_t *s, const char *key, int n, const char **members, int64_t *changed, char *err) {
    redisReply *r = store_run_pairs(s, "SADD", key, n, members, NULL, T(INTEGER), err);
    if (!r) return -1;
    if (changed) *changed = r->integer;
    freeReplyObject(r);
    return 0;
}

int store_srem(store_t *s, const char *key, int n, const char **members, int64_t *changed, char *err) {
    redisReply *r = store_run_pairs(s, "SREM", key, n, members, NULL, T(INTEGER), err);
    if (!r) return -1;
    if (changed) *changed = r->integer;
    freeReplyObject(r);
    return 0;
}

int store_smembers(store_t *s, const char *key, char ***members, int *n, char *err) {
    *members = NULL;
    *n = 0;
    const char *argv[] = {"SMEMBERS", key};
    redisReply *r = store_run(s, 2, argv, NULL, T(ARRAY), err);
    if (!r) return -1;
    int rc = store_check_strings(r, "SMEMBERS", err);
    if (rc == 0 && r->elements > 0) {
        char **v = xcalloc(r->elements, sizeof *v);
        for (size_t i = 0; i < r->elements; i++) v[i] = store_dup(r->element[i]->str, r->element[i]->len);
        *members = v;
        *n = (int)r->elements;
    }
    freeReplyObject(r);
    return rc;
}

int store_scan(store_t *s, const char *pattern, int max, char ***keys, int *n, char *err) {
    *keys = NULL;
    *n = 0;
    char cursor[32] = "0";
    int cap = 0;
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "200"};
        redisReply *r = store_run(s, 6, argv, NULL, T(ARRAY), err);
        if (!r) goto fail;
        if (r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
            store_check_strings(r->element[1], "SCAN", err)) {
            if (r->elements != 2) err_set(err, "redis SCAN: malformed reply");
            freeReplyObject(r);
            goto fail;
        }
        snprintf(cursor, sizeof cursor, "%.*s", (int)r->element[0]->len, r->element[0]->str);
        const redisReply *a = r->element[1];
        for (size_t i = 0; i < a->elements && *n < max; i++) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                *keys = xrealloc(*keys, (size_t)cap * sizeof **keys);
            }
            (*keys)[(*n)++] = store_dup(a->element[i]->str, a->element[i]->len);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") && *n < max);
    return 0;
fail:
    store_strv_free(keys, *n);
    *n = 0;
    return -1;
}

void store_strv_free(char ***v, int n) {
    if (!v || !*v) return;
    for (int i = 0; i < n; i++) free((*v)[i]);
    free(*v);
    *v = NULL;
}

int store_rpush(store_t *s, const char *key, int n, const void *const *items, const size_t *lens,
                int64_t *list_len, char *err) {
    if (n < 1 || !items) return err_set(err, "redis RPUSH: nothing to send");
    if (n > INT_MAX - 2) return err_set(err, "redis RPUSH: too many items");
    int argc = n + 2;
    const char **argv = xmalloc((size_t)argc * sizeof *argv);
    size_t *alen = xmalloc((size_t)argc * sizeof *alen);
    argv[0] = "RPUSH";
    alen[0] = 5;
    argv[1] = key;
    alen[1] = store_len(key);
    for (int i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : store_len(items[i]);
        argv[2 + i] = store_bytes(items[i], l);
        alen[2 + i] = l;
    }
    int rc = store_int_cmd(s, argc, argv, alen, list_len, err);
    free(argv);
    free(alen);
    return rc;
}

int store_ltrim(store_t *s, const char *key, long start, long stop, char *err) {
    char a[24], b[24];
    snprintf(a, sizeof a, "%ld", start);
    snprintf(b, sizeof b, "%ld", stop);
    const char *argv[] = {"LTRIM", key, a, b};
    redisReply *r = store_run(s, 4, argv, NULL, T(STATUS), err);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

int store_lrange(store_t *s, const char *key, long start, long stop, store_buf_t **items, int *n,
                 char *err) {
    *items = NULL;
    *n = 0;
    char a[24], b[24];
    snprintf(a, sizeof a, "%ld", start);
    snprintf(b, sizeof b, "%ld", stop);
    const char *argv[] = {"LRANGE", key, a, b};
    redisReply *r = store_run(s, 4, argv, NULL, T(ARRAY), err);
    if (!r) return -1;
    int rc = store_check_strings(r, "LRANGE", err);
    if (rc == 0 && r->elements > 0) {
        store_buf_t *v = xcalloc(r->elements, sizeof *v);
        for (size_t i = 0; i < r->elements; i++) {
            v[i].data = (uint8_t *)store_dup(r->element[i]->str, r->element[i]->len);
            v[i].len = r->element[i]->len;
        }
        *items = v;
        *n = (int)r->elements;
    }
    freeReplyObject(r);
    return rc;
}

void store_bufv_free(store_buf_t **v, int n) {
    if (!v || !*v) return;
    for (int i = 0; i < n; i++) free((*v)[i].data);
    free(*v);
    *v = NULL;
}

int store_xadd(store_t *s, const char *key, long maxlen_approx, int nfields, const char **fields,
               const char **values, char id_out[STORE_ID_LEN], char *err) {
    if (id_out) id_out[0] = 0;
    if (nfields < 1 || !fields || !values) return err_set(err, "redis XADD: no fields");
    if (nfields > (INT_MAX - 6) / 2) return err_set(err, "redis XADD: too many fields");
    char ml[24];
    snprintf(ml, sizeof ml, "%ld", maxlen_approx);
    int argc = 3 + (maxlen_approx > 0 ? 3 : 0) + 2 * nfields, k = 0;
    const char **argv = xmalloc((size_t)argc * sizeof *argv);
    argv[k++] = "XADD";
    argv[k++] = key;
    if (maxlen_approx > 0) {
        argv[k++] = "MAXLEN";
        argv[k++] = "~";
        argv[k++] = ml;
    }
    argv[k++] = "*";
    for (int i = 0; i < nfields; i++) {
        argv[k++] = fields[i];
        argv[k++] = values[i];
    }
    redisReply *r = store_run(s, argc, argv, NULL, T(STRING), err);
    free(argv);
    if (!r) return -1;
    int rc = 0;
    if (r->len >= STORE_ID_LEN)
        rc = err_set(err, "redis XADD: entry id of %zu bytes does not fit", r->len);
    else if (id_out)
        memcpy(id_out, r->str, r->len + 1);
    freeReplyObject(r);
    return rc;
}

// XRANGE from start (latest false), or XREVRANGE of the latest count entries (latest true);
// entries come back oldest first either way.
static int xrange(store_t *s, const char *key, const char *start, int count, bool latest, store_entry_t **entries,
                  int *n, char *err) {
    *entries = NULL;
    *n = 0;
    char c[24];
    snprintf(c, sizeof c, "%d", count);
    const char *argv[] = {"XRANGE", key, start ? start : "-", "+", "COUNT", c};
    const char *rargv[] = {"XREVRANGE", key, "+", "-", "COUNT", c};
    redisReply *r = store_run(s, count > 0 ? 6 : 4, latest ? rargv : argv, NULL, T(ARRAY), err);
    if (!r) return -1;
    int rc = -1, m = 0;
    store_entry_t *v = NULL;
    if (r->elements > INT_MAX) {
        err_set(err, "redis XRANGE: %zu entries is too many", r->elements);
        goto done;
    }
    if (r->elements > 0) v = xcalloc(r->elements, sizeof *v);
    for (; m < (int)r->elements; m++) {
        const redisReply *e = r->element[m];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING ||
            e->element[1]->type != REDIS_REPLY_ARRAY || e->element[1]->elements % 2 ||
            store_check_strings(e->element[1], "XRANGE", err) != 0) {
            err_set(err, "redis XRANGE: malformed entry %d", m);
            goto done;
        }
        if (e->element[0]->len >= STORE_ID_LEN) {
            err_set(err, "redis XRANGE: entry id of %zu bytes does not fit", e->element[0]->len);
            goto done;
        }
        memcpy(v[m].id, e->element[0]->str, e->element[0]->len + 1);
        const redisReply *f = e->element[1];
        int nf = (int)(f->elements / 2);
        if (nf > 0) v[m].kv = xcalloc((size_t)nf, sizeof *v[m].kv);
        v[m].n = nf;
        for (int j = 0; j < nf; j++) {
            v[m].kv[j].field = store_dup(f->element[2 * j]->str, f->element[2 * j]->len);
            v[m].kv[j].value = store_dup(f->element[2 * j + 1]->str, f->element[2 * j + 1]->len);
            v[m].kv[j].value_len = f->element[2 * j + 1]->len;
        }
    }
    rc = 0;
    for (int i = 0; latest && i < m / 2; i++) {
        store_entry_t t = v[i];
        v[i] = v[m - 1 - i], v[m - 1 - i] = t;
    }
done:
    freeReplyObject(r);
    if (rc == 0) {
        *entries = v;
        *n = m;
    } else {
        store_entries_free(&v, m);
    }
    return rc;
}

int store_xrange(store_t *s, const char *key, const char *start, int count, store_entry_t **entries,
                 int *n, char *err) {
    return xrange(s, key, start, count, false, entries, n, err);
}

int store_xrange_latest(store_t *s, const char *key, int count, store_entry_t **entries, int *n, char *err) {
    if (count <= 0) return err_set(err, "redis XREVRANGE: count must be positive");
    return xrange(s, key, NULL, count, true, entries, n, err);
}

void store_entries_free(store_entry_t **entries, int n) {
    if (!entries || !*entries) return;
    for (int i = 0; i < n; i++) store_kv_free(&(*entries)[i].kv, (*entries)[i].n);
    free(*entries);
    *entries = NULL;
}

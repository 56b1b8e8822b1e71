// test_store.c - the Redis client against a real redis-server: binary-safe round trips, every
// typed helper, MULTI/EXEC semantics, error replies, and reconnection when the server dies.
//
// Criterion runs tests in parallel processes, so every test starts its own redis-server on a
// free loopback port (no persistence, data dir under /tmp) and kills it afterwards. The server
// is started with PR_SET_PDEATHSIG so a crashed or timed-out test does not leave it running.
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/net/store.h"
#include "common/rl/keys.h"
#include "tests/unit/testbits.h"

// --- a private redis-server per test -------------------------------------------------------

typedef struct {
    char bin[4096];   // redis-server's path
    char dir[64];     // its data dir, also holding its log
    int port;
    pid_t pid;        // the running server, 0 when none
    pid_t delayed;    // a server started later (reconnection tests), 0 when none
} rs_t;

static rs_t rs;
static store_t *st;

// REDIS_SERVER overrides the PATH search.
static int rs_find(char *out, size_t n) {
    const char *env = getenv("REDIS_SERVER");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return access(out, X_OK) == 0 ? 0 : -1;
    }
    const char *path = getenv("PATH");
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s", path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
    char *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/redis-server", d);
        if (access(out, X_OK) == 0) return 0;
    }
    return -1;
}

// Starts redis-server on port after delay_ms (the child sleeps, so the caller does not block).
static pid_t rs_spawn(int port, int delay_ms) {
    char portstr[16], logf[128];
    snprintf(portstr, sizeof portstr, "%d", port);
    snprintf(logf, sizeof logf, "%s/redis.log", rs.dir);
    char *argv[] = {rs.bin, "--port", portstr, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", rs.dir, "--logfile", logf, "--daemonize", "no", NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        if (delay_ms > 0) usleep((useconds_t)delay_ms * 1000);
        int fd = open("/dev/null", O_RDWR);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
        }
        execv(rs.bin, argv);
        _exit(127);
    }
    return pid;
}

static void rs_kill(pid_t *pid) {
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
    }
    *pid = 0;
}

// Waits until the server on port answers PING; -1 if pid exits first or timeout_s passes.
static int rs_wait(int port, pid_t pid, double timeout_s) {
    double t0 = util_now();
    while (util_now() - t0 < timeout_s) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return -1;
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        int ok = 0;
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
            if (r) freeReplyObject(r);
        }
        if (c) redisFree(c);
        if (ok) return 0;
        usleep(10000);
    }
    return -1;
}

static void rs_log_tail(char *buf, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "%s/redis.log", rs.dir);
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)n - 1 ? size - ((long)n - 1) : 0, SEEK_SET);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    fclose(f);
}

// Starts the test's server on a fresh port. Ports can be taken between picking and binding
// (another test, an outgoing connection), so a server that exits early is retried elsewhere.
static void rs_start(void) {
    for (int attempt = 0; attempt < 3; attempt++) {
        rs.port = tu_free_port();
        rs.pid = rs_spawn(rs.port, 0);
        if (rs_wait(rs.port, rs.pid, 10.0) == 0) return;
        rs_kill(&rs.pid);
    }
    char tail[1024];
    rs_log_tail(tail, sizeof tail);
    cr_assert_fail("redis-server (%s) did not start; its log ends with:\n%s", rs.bin, tail);
}

// Restarts the server on the same port right now and waits for it.
static void rs_restart_now(void) {
    rs.pid = rs_spawn(rs.port, 0);
    cr_assert_eq(rs_wait(rs.port, rs.pid, 10.0), 0, "redis-server did not restart on port %d", rs.port);
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void setup(void) {
    memset(&rs, 0, sizeof rs);
    cr_assert_eq(rs_find(rs.bin, sizeof rs.bin), 0,
                 "redis-server not found (PATH or $REDIS_SERVER): the store tests need a real Redis "
                 "(Debian: apt-get install redis-server)");
    snprintf(rs.dir, sizeof rs.dir, "/tmp/marlaas-store-XXXXXX");
    cr_assert_not_null(mkdtemp(rs.dir), "mkdtemp: %s", strerror(errno));
    rs_start();
    char err[ERR_LEN];
    st = store_new("127.0.0.1", rs.port, "t:", err);
    cr_assert_not_null(st, "%s", err);
}

static void teardown(void) {
    store_destroy(&st);
    rs_kill(&rs.pid);
    rs_kill(&rs.delayed);
    if (rs.dir[0]) rm_dir(rs.dir);
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 30);

// --- helpers -----------------------------------------------------------------------------

// Fills buf with a reproducible byte pattern that includes NULs, CR/LF and RESP markers.
static void fill(uint8_t *buf, size_t n, uint32_t seed) {
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = (uint8_t)(x >> 24);
    }
}

#define KEY(buf, ...) store_key(st, buf, sizeof buf, __VA_ARGS__)

static void expect_value(const char *key, const void *want, size_t want_len) {
    char err[ERR_LEN] = "";
    uint8_t *got = NULL;
    size_t len = 0;
    cr_assert_eq(store_get(st, key, &got, &len, err), 0, "GET %s: %s", key, err);
    cr_assert_eq(len, want_len, "GET %s: %zu bytes, want %zu", key, len, want_len);
    cr_assert(want_len == 0 || memcmp(got, want, want_len) == 0, "GET %s: bytes differ", key);
    cr_assert_eq(got[len], 0, "GET %s: no NUL after the value", key);
    free(got);
}

static long long int_reply(const char *cmd, const char *key) {
    char err[ERR_LEN] = "";
    redisReply *r = store_cmd(st, err, cmd, key);
    cr_assert_not_null(r, "%s %s: %s", cmd, key, err);
    cr_assert_eq(r->type, REDIS_REPLY_INTEGER, "%s: reply type %d", cmd, r->type);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Captures what this process writes to stderr (the log) into a file under the server's dir.
typedef struct {
    int saved;
    char path[128];
} capture_t;

static void capture_begin(capture_t *c) {
    snprintf(c->path, sizeof c->path, "%s/stderr.txt", rs.dir);
    fflush(stderr);
    c->saved = dup(2);
    int fd = open(c->path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    cr_assert(c->saved >= 0 && fd >= 0, "cannot capture stderr: %s", strerror(errno));
    dup2(fd, 2);
    close(fd);
}

// Restores stderr, echoes what was captured to it, returns it (caller frees).
static char *capture_end(capture_t *c) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    char err[ERR_LEN];
    size_t n = 0;
    char *text = util_read_file(c->path, &n, err);
    cr_assert_not_null(text, "%s", err);
    fputs(text, stderr);
    return text;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

// --- tests -------------------------------------------------------------------------------

Test(store, binary_round_trip) {
    char err[ERR_LEN] = "", k1[64], k2[64], k3[64], k4[64];
    KEY(k1, "small");
    KEY(k2, "big");
    KEY(k3, "empty");
    KEY(k4, "fmt");

    const uint8_t small[] = {'a', 0, 'b', 0, 0, 0xff, '\r', '\n', '$', '*', 0};
    cr_assert_eq(store_set(st, k1, small, sizeof small, err), 0, "%s", err);
    expect_value(k1, small, sizeof small);

    size_t big_len = 5u << 20;
    uint8_t *big = malloc(big_len);
    cr_assert_not_null(big);
    fill(big, big_len, 7);
    cr_assert_eq(store_set(st, k2, big, big_len, err), 0, "%s", err);
    expect_value(k2, big, big_len);
    free(big);

    cr_assert_eq(store_set(st, k3, NULL, 0, err), 0, "%s", err);
    expect_value(k3, "", 0);

    redisReply *r = store_cmd(st, err, "SET %s %b", k4, small, sizeof small);
    cr_assert_not_null(r, "%s", err);
    freeReplyObject(r);
    expect_value(k4, small, sizeof small);

    cr_assert_eq(store_exists(st, k1, err), 0, "%s", err);
    cr_assert_eq(store_del(st, k1, err), 0, "%s", err);
    cr_assert_eq(store_exists(st, k1, err), 1, "%s", err);
}

// COPY on the server: the copy equals the source, replaces what the destination held, repeats
// harmlessly, and a missing source leaves the destination as it was.
Test(store, copy) {
    char err[ERR_LEN] = "", src[64], dst[64], none[64];
    KEY(src, "copy-src");
    KEY(dst, "copy-dst");
    KEY(none, "copy-none");
    const uint8_t a[] = {1, 0, 2, 0xff}, b[] = {'o', 'l', 'd'};
    cr_assert_eq(store_set(st, src, a, sizeof a, err), 0, "%s", err);
    cr_assert_eq(store_set(st, dst, b, sizeof b, err), 0, "%s", err);
    cr_assert_eq(store_copy(st, src, dst, err), 0, "%s", err);
    expect_value(dst, a, sizeof a);
    cr_assert_eq(store_copy(st, src, dst, err), 0, "%s", err);   // again: the same
    expect_value(dst, a, sizeof a);
    expect_value(src, a, sizeof a);
    cr_assert_eq(store_copy(st, none, dst, err), 1, "%s", err);
    expect_value(dst, a, sizeof a);
}

Test(store, missing_things) {
    char err[ERR_LEN] = "", k[64];
    KEY(k, "nothing");
    uint8_t *data = (uint8_t *)"x";
    size_t len = 9;
    cr_assert_eq(store_get(st, k, &data, &len, err), 1, "%s", err);
    cr_assert_null(data);
    cr_assert_eq(len, 0);
    char *s = (char *)"x";
    cr_assert_eq(store_hget(st, k, "f", &s, NULL, err), 1, "%s", err);
    cr_assert_null(s);
    store_kv_t *kv = NULL;
    int n = 5;
    cr_assert_eq(store_hgetall(st, k, &kv, &n, err), 1, "%s", err);
    cr_assert(kv == NULL && n == 0);
    cr_assert_eq(store_del(st, k, err), 1, "%s", err);
    cr_assert_eq(store_exists(st, k, err), 1, "%s", err);
    cr_assert_eq(store_expire(st, k, 10, err), 1, "%s", err);
    char **m = NULL;
    cr_assert_eq(store_smembers(st, k, &m, &n, err), 0, "%s", err);
    cr_assert(m == NULL && n == 0);
    store_buf_t *items = NULL;
    cr_assert_eq(store_lrange(st, k, 0, -1, &items, &n, err), 0, "%s", err);
    cr_assert(items == NULL && n == 0);
    store_entry_t *e = NULL;
    cr_assert_eq(store_xrange(st, k, "-", 0, &e, &n, err), 0, "%s", err);
    cr_assert(e == NULL && n == 0);
}

Test(store, keys) {
    char err[ERR_LEN] = "", buf[64], tiny[8];
    cr_assert_str_eq(store_prefix(st), "t:");
    cr_assert_str_eq(store_key(st, buf, sizeof buf, "job:%s:v%d", "j1", 3), "t:job:j1:v3");
    cr_assert_null(store_key(st, tiny, sizeof tiny, "job:%s", "j1"), "a truncated key was returned");
    uint8_t *data = NULL;
    size_t len = 0;
    cr_assert_eq(store_get(st, NULL, &data, &len, err), -1);
    cr_assert_not_null(strstr(err, "NULL"), "err: %s", err);
    cr_assert_eq(store_set(st, NULL, "v", 1, err), -1);

    store_t *d = store_new("127.0.0.1", rs.port, NULL, err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_str_eq(store_key(d, buf, sizeof buf, "tenant:%s", "acme"), "marlaas:tenant:acme");
    cr_assert_eq(store_ping(d, err), 0, "%s", err);
    store_destroy(&d);
    cr_assert_null(d);
    store_destroy(&d);
    store_destroy(NULL);
}

Test(store, hashes) {
    char err[ERR_LEN] = "", k[64];
    KEY(k, "job:j1");
    const char *f[] = {"state", "tenant", "step"}, *v[] = {"running", "acme", "0"};
    cr_assert_eq(store_hset(st, k, 3, f, v, err), 0, "%s", err);
    char *s = NULL;
    size_t len = 0;
    cr_assert_eq(store_hget(st, k, "tenant", &s, &len, err), 0, "%s", err);
    cr_assert_str_eq(s, "acme");
    cr_assert_eq(len, 4);
    free(s);

    const uint8_t blob[] = {0, 1, 0, 2, '\n', 0};
    cr_assert_eq(store_hset_bin(st, k, "blob", blob, sizeof blob, err), 0, "%s", err);
    cr_assert_eq(store_hget(st, k, "blob", &s, &len, err), 0, "%s", err);
    cr_assert_eq(len, sizeof blob);
    cr_assert_eq(memcmp(s, blob, sizeof blob), 0);
    free(s);

    const char *f2[] = {"state"}, *v2[] = {"done"};
    cr_assert_eq(store_hset(st, k, 1, f2, v2, err), 0, "%s", err);

    int64_t out = 0;
    cr_assert_eq(store_hincrby(st, k, "step", 5, &out, err), 0, "%s", err);
    cr_assert_eq(out, 5);
    cr_assert_eq(store_hincrby(st, k, "step", -2, &out, err), 0, "%s", err);
    cr_assert_eq(out, 3);
    double d = 0;
    cr_assert_eq(store_hincrbyfloat(st, k, "loss", 1.5, &d, err), 0, "%s", err);
    cr_assert_eq(store_hincrbyfloat(st, k, "loss", 2.25, &d, err), 0, "%s", err);
    cr_assert_float_eq(d, 3.75, 1e-12);
    cr_assert_eq(store_hincrby(st, k, "tenant", 1, &out, err), -1, "HINCRBY on text succeeded");
    cr_assert_not_null(strstr(err, "not an integer"), "err: %s", err);

    store_kv_t *kv = NULL;
    int n = 0;
    cr_assert_eq(store_hgetall(st, k, &kv, &n, err), 0, "%s", err);
    cr_assert_eq(n, 5);
    int seen = 0;
    for (int i = 0; i < n; i++) {
        const char *name = kv[i].field;
        if (!strcmp(name, "state")) {
            seen |= 1;
            cr_assert_str_eq(kv[i].value, "done");
        } else if (!strcmp(name, "tenant")) {
            seen |= 2;
            cr_assert_str_eq(kv[i].value, "acme");
        } else if (!strcmp(name, "step")) {
            seen |= 4;
            cr_assert_str_eq(kv[i].value, "3");
        } else if (!strcmp(name, "loss")) {
            seen |= 8;
            cr_assert_str_eq(kv[i].value, "3.75");
        } else if (!strcmp(name, "blob")) {
            seen |= 16;
            cr_assert_eq(kv[i].value_len, sizeof blob);
            cr_assert_eq(memcmp(kv[i].value, blob, sizeof blob), 0);
        } else {
            cr_assert_fail("unexpected field %s", name);
        }
    }
    cr_assert_eq(seen, 31);
    store_kv_free(&kv, n);
    cr_assert_null(kv);
}

Test(store, sets) {
    char err[ERR_LEN] = "", k[64];
    KEY(k, "jobs:active");
    const char *a[] = {"j1", "j2", "j3", "j1"}, *b[] = {"j3", "j4"}, *c[] = {"j1", "zz"};
    int64_t changed = -1;
    cr_assert_eq(store_sadd(st, k, 4, a, &changed, err), 0, "%s", err);
    cr_assert_eq(changed, 3);
    cr_assert_eq(store_sadd(st, k, 2, b, &changed, err), 0, "%s", err);
    cr_assert_eq(changed, 1);
    char **m = NULL;
    int n = 0;
    cr_assert_eq(store_smembers(st, k, &m, &n, err), 0, "%s", err);
    cr_assert_eq(n, 4);
    qsort(m, (size_t)n, sizeof *m, cmp_str);
    const char *want[] = {"j1", "j2", "j3", "j4"};
    for (int i = 0; i < 4; i++) cr_assert_str_eq(m[i], want[i]);
    store_strv_free(&m, n);
    cr_assert_null(m);
    cr_assert_eq(store_srem(st, k, 2, c, &changed, err), 0, "%s", err);
    cr_assert_eq(changed, 1);
    cr_assert_eq(store_smembers(st, k, &m, &n, err), 0, "%s", err);
    cr_assert_eq(n, 3);
    store_strv_free(&m, n);
}

Test(store, lists) {
    char err[ERR_LEN] = "", k[64], k2[64];
    KEY(k, "list:bin");
    KEY(k2, "list:str");
    const char i0[] = "x", i1[] = {0, 'y', 0, '\r', '\n'};
    uint8_t *i3 = malloc(1 << 20);
    cr_assert_not_null(i3);
    fill(i3, 1 << 20, 3);
    const void *items[] = {i0, i1, "", i3};
    size_t lens[] = {1, sizeof i1, 0, 1 << 20};
    int64_t len = 0;
    cr_assert_eq(store_rpush(st, k, 3, items, lens, &len, err), 0, "%s", err);
    cr_assert_eq(len, 3);
    cr_assert_eq(store_rpush(st, k, 1, items + 3, lens + 3, &len, err), 0, "%s", err);
    cr_assert_eq(len, 4);

    store_buf_t *v = NULL;
    int n = 0;
    cr_assert_eq(store_lrange(st, k, 0, -1, &v, &n, err), 0, "%s", err);
    cr_assert_eq(n, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(v[i].len, lens[i], "item %d: %zu bytes", i, v[i].len);
        cr_assert(lens[i] == 0 || memcmp(v[i].data, items[i], lens[i]) == 0, "item %d differs", i);
        cr_assert_eq(v[i].data[v[i].len], 0);
    }
    store_bufv_free(&v, n);
    cr_assert_null(v);
    cr_assert_eq(store_lrange(st, k, 1, 1, &v, &n, err), 0, "%s", err);
    cr_assert(n == 1 && v[0].len == sizeof i1 && memcmp(v[0].data, i1, sizeof i1) == 0);
    store_bufv_free(&v, n);
    free(i3);

    const void *strs[] = {"alpha", "beta"};
    cr_assert_eq(store_rpush(st, k2, 2, strs, NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(store_lrange(st, k2, -1, -1, &v, &n, err), 0, "%s", err);
    cr_assert(n == 1 && !strcmp((char *)v[0].data, "beta"));
    store_bufv_free(&v, n);
}

// LTRIM keeps a list's tail (the verifier's kept samples: the latest JOB_SAMPLES_KEPT).
Test(store, ltrim_keeps_the_latest) {
    char err[ERR_LEN] = "", k[64];
    KEY(k, "list:trim");
    for (int i = 0; i < 12; i++) {
        char item[8];
        snprintf(item, sizeof item, "s%d", i);
        const void *it[1] = {item};
        cr_assert_eq(store_rpush(st, k, 1, it, NULL, NULL, err), 0, "%s", err);
        cr_assert_eq(store_ltrim(st, k, -8, -1, err), 0, "%s", err);
    }
    store_buf_t *v = NULL;
    int n = 0;
    cr_assert_eq(store_lrange(st, k, 0, -1, &v, &n, err), 0, "%s", err);
    cr_assert_eq(n, 8);
    cr_assert_str_eq((char *)v[0].data, "s4");
    cr_assert_str_eq((char *)v[7].data, "s11");
    store_bufv_free(&v, n);
    KEY(k, "list:none");
    cr_assert_eq(store_ltrim(st, k, -8, -1, err), 0, "a missing list: %s", err);
}

// SCAN finds keys by pattern across cursor pages, bounded by max (the console's heartbeats).
Test(store, scan_by_pattern) {
    char err[ERR_LEN] = "", k[64], pat[64];
    for (int i = 0; i < 450; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s:%d", i % 3 ? "other" : "svc:x", i);
        KEY(k, "%s", name);
        cr_assert_eq(store_set(st, k, "1", 1, err), 0, "%s", err);
    }
    KEY(pat, "svc:*");
    char **keys = NULL;
    int n = 0;
    cr_assert_eq(store_scan(st, pat, 1000, &keys, &n, err), 0, "%s", err);
    cr_assert_eq(n, 150, "found %d", n);
    for (int i = 0; i < n; i++) cr_assert(strstr(keys[i], "svc:x:"), "%s", keys[i]);
    store_strv_free(&keys, n);
    cr_assert_eq(store_scan(st, pat, 20, &keys, &n, err), 0, "%s", err);
    cr_assert_eq(n, 20);
    store_strv_free(&keys, n);
    KEY(pat, "nothing:*");
    cr_assert_eq(store_scan(st, pat, 10, &keys, &n, err), 0, "%s", err);
    cr_assert(n == 0 && !keys);
}

Test(store, expire) {
    char err[ERR_LEN] = "", k[64];
    KEY(k, "lease");
    cr_assert_eq(store_set(st, k, "1", 1, err), 0, "%s", err);
    cr_assert_eq(int_reply("TTL %s", k), -1);
    cr_assert_eq(store_expire(st, k, 100, err), 0, "%s", err);
    long long ttl = int_reply("TTL %s", k);
    cr_assert(ttl >= 1 && ttl <= 100, "TTL %lld", ttl);
}

Test(store, streams) {
    char err[ERR_LEN] = "", k[64], k2[64];
    KEY(k, "metrics:j1");
    KEY(k2, "metrics:j2");
    // Small stream nodes, so that approximate trimming has whole nodes to drop at this size.
    redisReply *r = store_cmd(st, err, "CONFIG SET stream-node-max-entries 4");
    cr_assert_not_null(r, "%s", err);
    freeReplyObject(r);

    const char *f[] = {"step", "loss"};
    char step[16], loss[32], last[STORE_ID_LEN] = "", prev[STORE_ID_LEN] = "";
    for (int i = 0; i < 40; i++) {
        snprintf(step, sizeof step, "%d", i);
        snprintf(loss, sizeof loss, "%.2f", 0.5 * i);
        const char *v[] = {step, loss};
        cr_assert_eq(store_xadd(st, k, 8, 2, f, v, last, err), 0, "%s", err);
        cr_assert_neq(last[0], 0, "no id returned");
        cr_assert_str_neq(last, prev);
        memcpy(prev, last, sizeof prev);
    }
    long long xlen = int_reply("XLEN %s", k);
    cr_assert(xlen >= 8 && xlen <= 12, "MAXLEN ~ 8 left %lld entries", xlen);

    store_entry_t *e = NULL;
    int n = 0;
    cr_assert_eq(store_xrange(st, k, "-", 0, &e, &n, err), 0, "%s", err);
    cr_assert_eq(n, xlen);
    cr_assert_str_eq(e[n - 1].id, last);
    cr_assert_eq(e[n - 1].n, 2);
    cr_assert_str_eq(e[n - 1].kv[0].field, "step");
    cr_assert_str_eq(e[n - 1].kv[0].value, "39");
    cr_assert_str_eq(e[n - 1].kv[1].value, "19.50");
    int first_step = atoi(e[0].kv[0].value);
    cr_assert_eq(first_step, 40 - n, "entries are not the newest ones");
    store_entries_free(&e, n);
    cr_assert_null(e);

    // Paging with an exclusive start id walks the stream without gaps or repeats.
    char start[STORE_ID_LEN + 1] = "-";
    int seen = 0, pages = 0;
    for (;;) {
        cr_assert_eq(store_xrange(st, k, start, 3, &e, &n, err), 0, "%s", err);
        if (n == 0) break;
        cr_assert_leq(n, 3);
        for (int i = 0; i < n; i++) cr_assert_eq(atoi(e[i].kv[0].value), first_step + seen + i);
        seen += n;
        pages++;
        snprintf(start, sizeof start, "(%s", e[n - 1].id);
        store_entries_free(&e, n);
    }
    cr_assert_eq(seen, xlen);
    cr_assert_eq(pages, (int)((xlen + 2) / 3));

    // The latest 3 entries, oldest first, equal the tail of the whole stream; more than there are
    // gives them all; a count below 1 is refused.
    cr_assert_eq(store_xrange_latest(st, k, 3, &e, &n, err), 0, "%s", err);
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) cr_assert_eq(atoi(e[i].kv[0].value), 37 + i, "latest entry %d: step %s", i, e[i].kv[0].value);
    cr_assert_str_eq(e[2].id, last);
    store_entries_free(&e, n);
    cr_assert_eq(store_xrange_latest(st, k, 1000, &e, &n, err), 0, "%s", err);
    cr_assert_eq(n, xlen);
    cr_assert_eq(atoi(e[0].kv[0].value), first_step);
    store_entries_free(&e, n);
    cr_assert_eq(store_xrange_latest(st, k, 0, &e, &n, err), -1);

    for (int i = 0; i < 20; i++) {
        const char *v[] = {"1", "2"};
        cr_assert_eq(store_xadd(st, k2, 0, 2, f, v, NULL, err), 0, "%s", err);
    }
    cr_assert_eq(int_reply("XLEN %s", k2), 20, "a stream without MAXLEN was trimmed");
}

Test(store, atomic) {
    char err[ERR_LEN] = "", v1[64], v2[64], ptr[64], cnt[64], text[64];
    KEY(v1, "adapter:j1:v1");
    KEY(v2, "adapter:j1:v2");
    KEY(ptr, "adapter:j1:current");
    KEY(cnt, "adapter:j1:publishes");
    KEY(text, "adapter:j1:note");
    cr_assert_eq(store_set(st, v1, "old", 3, err), 0, "%s", err);
    cr_assert_eq(store_set(st, ptr, "1", 1, err), 0, "%s", err);
    cr_assert_eq(store_set(st, text, "abc", 3, err), 0, "%s", err);

    uint8_t blob[4096];
    fill(blob, sizeof blob, 11);
    blob[0] = 0;
    const char *a_set[] = {"SET", v2, (const char *)blob};
    size_t l_set[] = {3, strlen(v2), sizeof blob};
    const char *a_ptr[] = {"SET", ptr, "2"}, *a_del[] = {"DEL", v1}, *a_inc[] = {"INCR", cnt};
    store_argv_t cmds[] = {{3, a_set, l_set}, {3, a_ptr, NULL}, {2, a_del, NULL}, {2, a_inc, NULL}};
    redisReply *r = store_atomic(st, 4, cmds, err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_eq(r->elements, 4);
    cr_assert_eq(r->element[0]->type, REDIS_REPLY_STATUS);
    cr_assert_eq(r->element[2]->type, REDIS_REPLY_INTEGER);
    cr_assert_eq(r->element[2]->integer, 1);
    cr_assert_eq(r->element[3]->integer, 1);
    freeReplyObject(r);
    expect_value(v2, blob, sizeof blob);
    expect_value(ptr, "2", 1);
    cr_assert_eq(store_exists(st, v1, err), 1, "old version survived: %s", err);

    // Rejected while queueing: nothing is applied.
    const char *a_ptr3[] = {"SET", ptr, "3"}, *a_bad[] = {"SET", v1};
    store_argv_t rejected[] = {{3, a_ptr3, NULL}, {2, a_bad, NULL}};
    cr_assert_null(store_atomic(st, 2, rejected, err));
    cr_assert_not_null(strstr(err, "cmds[1] (SET)"), "err: %s", err);
    cr_assert_not_null(strstr(err, "nothing was applied"), "err: %s", err);
    expect_value(ptr, "2", 1);

    // Failing while executing: Redis applies the rest, and the error says so.
    const char *a_ptr4[] = {"SET", ptr, "4"}, *a_inc_text[] = {"INCR", text};
    store_argv_t partial[] = {{3, a_ptr4, NULL}, {2, a_inc_text, NULL}};
    cr_assert_null(store_atomic(st, 2, partial, err));
    cr_assert_not_null(strstr(err, "cmds[1] (INCR)"), "err: %s", err);
    cr_assert_not_null(strstr(err, "not an integer"), "err: %s", err);
    cr_assert_not_null(strstr(err, "were applied"), "err: %s", err);
    expect_value(ptr, "4", 1);

    // The connection is out of MULTI: a plain command runs at once (queued, it would not be
    // visible to the GET).
    cr_assert_eq(store_set(st, ptr, "5", 1, err), 0, "%s", err);
    expect_value(ptr, "5", 1);
    cr_assert_null(store_atomic(st, 0, cmds, err));
}

Test(store, error_reply_keeps_connection) {
    char err[ERR_LEN] = "", k[64], k2[64];
    KEY(k, "text");
    KEY(k2, "counter");
    cr_assert_eq(store_set(st, k, "abc", 3, err), 0, "%s", err);
    long long id = int_reply("CLIENT ID", NULL);

    int64_t v = 0;
    cr_assert_eq(store_incr(st, k, &v, err), -1, "INCR on text succeeded");
    cr_assert_not_null(strstr(err, "redis INCR: ERR value is not an integer"), "err: %s", err);

    const char *argv[] = {"INCR", k};
    err[0] = 0;
    cr_assert_null(store_cmdv(st, 2, argv, NULL, err));
    cr_assert_not_null(strstr(err, "not an integer"), "err: %s", err);

    const char *bogus[] = {"NOSUCHCOMMAND", "x"};
    cr_assert_null(store_cmdv(st, 2, bogus, NULL, err));
    cr_assert_not_null(strstr(err, "unknown command"), "err: %s", err);

    cr_assert_null(store_cmd(st, err, "INCR %s", k));
    cr_assert_not_null(strstr(err, "redis INCR:"), "err: %s", err);

    cr_assert_eq(int_reply("CLIENT ID", NULL), id, "an error reply caused a reconnection");
    cr_assert_eq(store_incr(st, k2, &v, err), 0, "%s", err);
    cr_assert_eq(v, 1);
    cr_assert_eq(store_incr(st, k2, &v, err), 0, "%s", err);
    cr_assert_eq(v, 2);
}

Test(store, reconnects_after_server_restart) {
    char err[ERR_LEN] = "", k1[64], k2[64], k3[64];
    KEY(k1, "before");
    KEY(k2, "after");
    KEY(k3, "big");
    store_set_retry(st, 5000);
    cr_assert_eq(store_set(st, k1, "1", 1, err), 0, "%s", err);

    // The test runner ignores SIGPIPE; a service may not, and the default action would kill it.
    struct sigaction dfl, old;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    cr_assert_eq(sigaction(SIGPIPE, &dfl, &old), 0);

    capture_t cap;
    capture_begin(&cap);
    // Outage 1: the server dies between commands and is back ~300 ms later.
    rs_kill(&rs.pid);
    rs.delayed = rs_spawn(rs.port, 300);
    double t0 = util_now();
    int rc = store_set(st, k2, "2", 1, err);
    double dt = util_now() - t0;
    cr_assert_eq(rc, 0, "no reconnection: %s", err);
    // Backoff 50, 100, 200, 400 ms: the attempt after the restart comes at ~0.35 or ~0.75 s.
    cr_assert(dt >= 0.25 && dt < 1.5, "reconnected after %.3f s", dt);
    expect_value(k2, "2", 1);
    cr_assert_eq(store_exists(st, k1, err), 1, "the new server has no persistence, yet: %s", err);
    rs.pid = rs.delayed;
    rs.delayed = 0;

    // Outage 2: a 5 MB write hits the dead socket (the SIGPIPE path) and is resent whole.
    size_t big_len = 5u << 20;
    uint8_t *big = malloc(big_len);
    cr_assert_not_null(big);
    fill(big, big_len, 5);
    rs_kill(&rs.pid);
    rs.delayed = rs_spawn(rs.port, 300);
    rc = store_set(st, k3, big, big_len, err);
    cr_assert_eq(rc, 0, "no reconnection: %s", err);
    expect_value(k3, big, big_len);
    free(big);
    rs.pid = rs.delayed;
    rs.delayed = 0;

    sigaction(SIGPIPE, &old, NULL);
    char *log = capture_end(&cap);
    cr_assert_eq(count(log, "WARN"), 2, "one warning per outage expected:\n%s", log);
    cr_assert_eq(count(log, "connection restored"), 2, "one recovery line per outage expected:\n%s", log);
    free(log);
}

Test(store, gives_up_when_server_stays_down) {
    char err[ERR_LEN] = "", k[64], want[64];
    KEY(k, "x");
    store_set_retry(st, 600);
    capture_t cap;
    capture_begin(&cap);
    rs_kill(&rs.pid);

    uint8_t *data = NULL;
    size_t len = 0;
    double t0 = util_now();
    int rc = store_get(st, k, &data, &len, err);
    double dt = util_now() - t0;
    cr_assert_eq(rc, -1, "GET succeeded with no server");
    cr_assert(dt >= 0.5 && dt < 4.0, "gave up after %.3f s (retry budget 0.6 s)", dt);
    snprintf(want, sizeof want, "127.0.0.1:%d", rs.port);
    cr_assert_not_null(strstr(err, want), "err: %s", err);
    cr_assert_not_null(strstr(err, "600 ms"), "err: %s", err);
    cr_assert_not_null(strstr(err, "is redis-server running?"), "err: %s", err);

    // Still down: the next command also fails in bounded time, without a second warning.
    t0 = util_now();
    cr_assert_eq(store_ping(st, err), -1);
    dt = util_now() - t0;
    cr_assert(dt >= 0.5 && dt < 4.0, "gave up after %.3f s", dt);

    // Back up: the next command reconnects on its own.
    rs_restart_now();
    cr_assert_eq(store_ping(st, err), 0, "%s", err);
    cr_assert_eq(store_set(st, k, "y", 1, err), 0, "%s", err);

    char *log = capture_end(&cap);
    cr_assert_eq(count(log, "WARN"), 1, "one warning per outage expected:\n%s", log);
    cr_assert_eq(count(log, "connection restored"), 1, "one recovery line expected:\n%s", log);
    free(log);
}

static bool always(void) { return true; }

// A process that is stopping (the abort callback says so) does not spend its retry budget on a
// server that is gone: one reconnection attempt, then the error.
Test(store, abort_ends_retries) {
    char err[ERR_LEN] = "";
    store_set_retry(st, 8000);
    capture_t cap;
    capture_begin(&cap);
    rs_kill(&rs.pid);
    store_set_abort(st, always);
    double t0 = util_now();
    cr_assert_eq(store_ping(st, err), -1);
    double dt = util_now() - t0;
    cr_assert(dt < 1.0, "gave up after %.3f s with abort set (budget 8 s)", dt);
    cr_assert_not_null(strstr(err, "stopping"), "err: %s", err);
    store_set_abort(st, NULL);
    rs_restart_now();
    cr_assert_eq(store_ping(st, err), 0, "%s", err);
    free(capture_end(&cap));
}

Test(store_connect, refused_fails_fast) {
    char err[ERR_LEN] = "", want[64];
    int port = tu_free_port();
    double t0 = util_now();
    store_t *s = store_new("127.0.0.1", port, NULL, err);
    double dt = util_now() - t0;
    cr_assert_null(s, "connected to port %d where nothing listens", port);
    snprintf(want, sizeof want, "cannot connect to Redis at 127.0.0.1:%d: ", port);
    cr_assert_not_null(strstr(err, want), "err: %s", err);
    cr_assert_not_null(strstr(err, "is redis-server running?"), "err: %s", err);
    cr_assert_lt(dt, 1.0, "took %.3f s to fail", dt);

    cr_assert_null(store_new("127.0.0.1", 0, NULL, err));
    cr_assert_not_null(strstr(err, "port out of range"), "err: %s", err);
    cr_assert_null(store_new(NULL, 6379, NULL, err));
}

// The services' keys (common/rl/keys.h): each under the store's prefix, spelled once; a key that
// does not fit its buffer is NULL, never a cut key that could name another record.
Test(store, service_keys) {
    char k[KEY_LEN];
    const char *pre = "t:";
    cr_assert_not_null(key_job(st, k, sizeof k, "j-7"));
    cr_assert(!strncmp(k, pre, strlen(pre)) && !strcmp(k + strlen(pre), "job:j-7"), "%s", k);
    key_adapter(st, k, sizeof k, "j-7", 4294967295u);
    cr_assert_str_eq(k + strlen(pre), "adapter:j-7:4294967295");
    key_job_data(st, k, sizeof k, "j-7");
    cr_assert_str_eq(k + strlen(pre), "job:j-7:data");
    key_tenant_jobs(st, k, sizeof k, "acme");
    cr_assert_str_eq(k + strlen(pre), "jobs:acme");
    key_optim(st, k, sizeof k, "j-7");
    cr_assert_str_eq(k + strlen(pre), "optim:j-7");
    char small[24];
    cr_assert_null(key_adapter(st, small, sizeof small, "j-1234567890123", 1), "a key longer than the buffer is refused");
}

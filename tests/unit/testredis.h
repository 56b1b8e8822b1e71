// testredis.h - a private redis-server for one unit test: started on a free loopback port (no
// persistence, data directory under /tmp), killed by tr_redis_stop and, through
// PR_SET_PDEATHSIG, with a crashed test. REDIS_SERVER names the binary, else the PATH's.
#ifndef MARLAAS_TESTREDIS_H
#define MARLAAS_TESTREDIS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/net/store.h"
#include "common/util/util.h"
#include "tests/unit/testbits.h"

static struct {
    char bin[4096], dir[64];
    int port;
    pid_t pid;
} tr_redis;

static inline void tr_redis_stop(void) {
    if (tr_redis.pid > 0) {
        kill(tr_redis.pid, SIGKILL);
        waitpid(tr_redis.pid, NULL, 0);
    }
    tr_redis.pid = 0;
    if (!tr_redis.dir[0]) return;
    DIR *d = opendir(tr_redis.dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            snprintf(p, sizeof p, "%s/%s", tr_redis.dir, e->d_name), unlink(p);
    if (d) closedir(d);
    rmdir(tr_redis.dir);
    tr_redis.dir[0] = 0;
}

// Starts redis-server and returns a store on it with keys under prefix (caller destroys it).
static inline store_t *tr_redis_start(const char *prefix) {
    const char *env = getenv("REDIS_SERVER");
    if (env && *env) snprintf(tr_redis.bin, sizeof tr_redis.bin, "%s", env);
    else {
        char dirs[8192], *save = NULL;
        snprintf(dirs, sizeof dirs, "%s", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
        tr_redis.bin[0] = 0;
        for (char *d = strtok_r(dirs, ":", &save); d && !tr_redis.bin[0]; d = strtok_r(NULL, ":", &save)) {
            snprintf(tr_redis.bin, sizeof tr_redis.bin, "%s/redis-server", d);
            if (access(tr_redis.bin, X_OK)) tr_redis.bin[0] = 0;
        }
    }
    cr_assert(tr_redis.bin[0] && access(tr_redis.bin, X_OK) == 0,
              "redis-server not found (PATH or $REDIS_SERVER): this test needs a real Redis "
              "(Debian: apt-get install redis-server)");
    snprintf(tr_redis.dir, sizeof tr_redis.dir, "/tmp/marlaas-tr-XXXXXX");
    cr_assert_not_null(mkdtemp(tr_redis.dir), "mkdtemp: %s", strerror(errno));
    char err[ERR_LEN];
    for (int attempt = 0; attempt < 3; attempt++) {
        tr_redis.port = tu_free_port();
        char port[16], logf[128];
        snprintf(port, sizeof port, "%d", tr_redis.port);
        snprintf(logf, sizeof logf, "%s/redis.log", tr_redis.dir);
        char *argv[] = {tr_redis.bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", tr_redis.dir, "--logfile", logf, "--daemonize", "no", NULL};
        pid_t parent = getpid();
        tr_redis.pid = fork();
        cr_assert_geq(tr_redis.pid, 0, "fork: %s", strerror(errno));
        if (tr_redis.pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            int fd = open("/dev/null", O_RDWR);
            if (fd >= 0) dup2(fd, 0), dup2(fd, 1);
            execv(tr_redis.bin, argv);
            _exit(127);
        }
        for (double t0 = util_now(); util_now() - t0 < 10 && waitpid(tr_redis.pid, NULL, WNOHANG) == 0;) {
            store_t *st = store_new("127.0.0.1", tr_redis.port, prefix, err);
            if (st && store_ping(st, err) == 0) return st;
            store_destroy(&st);
            usleep(10000);
        }
        kill(tr_redis.pid, SIGKILL);
        waitpid(tr_redis.pid, NULL, 0);
        tr_redis.pid = 0;
    }
    cr_assert_fail("redis-server (%s) did not start (its log: %s/redis.log)", tr_redis.bin, tr_redis.dir);
    return NULL;
}

#endif

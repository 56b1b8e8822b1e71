// client.c - scheduler API client and the settings the CLI reads from the local cluster.
#include "cli/client.h"

#include "cli/cli.h"

#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/net/bus.h"

struct client {
    zsock_t *sock;
    char *token;
    int timeout_ms;
    uint64_t next_id;
};

static const char *setting(const char *flag, const char *env, const char *def);

// The scheduler's public key: MARLAAS_API_KEY (the key, or a file as `marlaas keys generate`
// writes it), else scheduler.key in MARLAAS_KEYS; none with MARLAAS_INSECURE (plain).
static int server_key(char out[41], bool *plain, char *err) {
    const char *ins = setting(NULL, "MARLAAS_INSECURE", NULL), *key = setting(NULL, "MARLAAS_API_KEY", NULL);
    const char *dir = setting(NULL, "MARLAAS_KEYS", NULL);
    *plain = false;
    if (key) return bus_public_key(NULL, key, out, err);
    if (dir) return bus_public_key(dir, "scheduler", out, err);
    if (ins && strcmp(ins, "0") != 0) {
        *plain = true;
        return 0;
    }
    return err_set(err, "the scheduler's public key is needed to reach its API: set MARLAAS_API_KEY to it (the "
                        "cluster's scheduler.key), or MARLAAS_INSECURE=1 for a cluster run with --insecure");
}

client_t *client_new(const char *endpoint, const char *token, int timeout_ms, char *err) {
    char ep[512];
    snprintf(ep, sizeof ep, "%s", endpoint);
    char *star = strstr(ep, "*");
    if (star) {
        char rest[512];
        snprintf(rest, sizeof rest, "%s", star + 1);
        snprintf(star, sizeof ep - (size_t)(star - ep), "127.0.0.1%s", rest);
    }
    zsys_init();
    zsys_set_logstream(NULL);
    char key[41];
    bool plain;
    if (server_key(key, &plain, err)) return NULL;
    zsock_t *s = bus_connect_public(ZMQ_DEALER, ep, plain ? NULL : key, 1000, PROTO_MAX_FRAME, err);
    if (!s) return NULL;
    client_t *c = xcalloc(1, sizeof *c);
    c->sock = s;
    c->token = xstrdup(token ? token : "");
    c->timeout_ms = timeout_ms;
    c->next_id = (uint64_t)getpid() << 20;
    return c;
}

void client_destroy(client_t **pc) {
    if (!pc || !*pc) return;
    zsock_destroy(&(*pc)->sock);
    free((*pc)->token);
    free(*pc);
    *pc = NULL;
}

int client_call(client_t *c, const char *op, proto_args_t *args, proto_rep_t *rep, char *err) {
    proto_req_t q = {.id = ++c->next_id, .op = (char *)op, .token = c->token};
    if (args) q.args = *args;
    proto_buf_t buf = {0};
    int rc = proto_req_encode(&q, &buf);
    if (args) proto_args_free(args);
    memset(rep, 0, sizeof *rep);
    if (rc) return err_set(err, "cannot encode the request");
    rc = zmq_send(zsock_resolve(c->sock), buf.data, buf.len, 0) < 0 ? -1 : 0;
    proto_buf_free(&buf);
    if (rc) return err_set(err, "cannot send to the scheduler: %s", zmq_strerror(zmq_errno()));
    zpoller_t *p = zpoller_new(c->sock, NULL);
    double deadline = zclock_mono() + c->timeout_ms;
    rc = -1;
    while (zclock_mono() < deadline) {
        if (!zpoller_wait(p, (int)(deadline - zclock_mono()))) break;
        zframe_t *f = zframe_recv(c->sock);
        if (!f) break;
        int d = proto_rep_decode(zframe_data(f), zframe_size(f), rep, err);
        zframe_destroy(&f);
        if (d) break;
        if (rep->id != q.id) {   // a late reply to an earlier request
            proto_rep_free(rep);
            continue;
        }
        rc = 0;
        break;
    }
    zpoller_destroy(&p);
    if (rc && !err[0]) err_set(err, "no answer from the scheduler within %d ms (is the cluster up? `marlaas up`)", c->timeout_ms);
    if (rc == 0 && !rep->ok) {
        err_set(err, "%s", rep->error ? rep->error : "error");
        proto_rep_free(rep);
        return -1;
    }
    return rc;
}

// KEY=VALUE lines of run/env (written by `marlaas up`)
static const char *run_env(const char *key) {
    static char buf[16][2][512];
    static int n = -1;
    if (n < 0) {
        n = 0;
        const char *dir = getenv("MARLAAS_RUN_DIR");
        char path[1024];
        snprintf(path, sizeof path, "%s/env", dir && *dir ? dir : "run");
        FILE *f = fopen(path, "r");
        char line[1100];
        while (f && n < 16 && fgets(line, sizeof line, f)) {
            char *eq = strchr(line, '=');
            if (!eq) continue;
            *eq = 0;
            line[strcspn(line, "\n")] = 0;
            eq[1 + strcspn(eq + 1, "\n")] = 0;
            snprintf(buf[n][0], 512, "%.500s", line);
            snprintf(buf[n][1], 512, "%.500s", eq + 1);
            n++;
        }
        if (f) fclose(f);
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(buf[i][0], key)) return buf[i][1];
    return NULL;
}

static const char *setting(const char *flag, const char *env, const char *def) {
    if (flag && *flag) return flag;
    const char *e = getenv(env);
    if (e && *e) return e;
    e = run_env(env);
    return e ? e : def;
}

const char *client_endpoint(const char *flag) { return setting(flag, "MARLAAS_API", "tcp://127.0.0.1:7000"); }
const char *client_token(const char *flag) { return setting(flag, "MARLAAS_TOKEN", NULL); }
const char *client_admin_token(const char *flag) { return setting(flag, "MARLAAS_ADMIN_TOKEN", NULL); }
const char *client_model(const char *flag) { return setting(flag, "MARLAAS_MODEL", cli_default_model()); }

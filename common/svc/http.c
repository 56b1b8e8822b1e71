// http.c - /healthz, /readyz and /metrics over libmicrohttpd. The listening socket is opened
// here (so a port in use gives a precise error) and handed to the daemon, which answers from
// its own thread; the registry it reads is locked per call.
#include "common/svc/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util/util.h"

#define HTTP_MAX_CONNECTIONS 512

struct http_srv {
    struct MHD_Daemon *d;
    metrics_t *m;
    int fd, port;
};

int http_parse_listen(const char *setting, char *host, size_t n_host, int *port, char *err) {
    if (!setting || !*setting || !strcmp(setting, "0") || !strcmp(setting, "off")) return 0;
    const char *colon = strrchr(setting, ':');
    const char *p = colon ? colon + 1 : setting;
    char *end;
    long v = strtol(p, &end, 10);
    if (!*p || *end || v < 1 || v > 65535) {
        err_set(err, "bad --http / MARLAAS_HTTP setting '%s': give PORT, HOST:PORT, or 0 to turn HTTP off", setting);
        return -1;
    }
    if (colon) {
        if (colon == setting || (size_t)(colon - setting) >= n_host) {
            err_set(err, "bad --http / MARLAAS_HTTP setting '%s': give PORT, HOST:PORT, or 0 to turn HTTP off", setting);
            return -1;
        }
        snprintf(host, n_host, "%.*s", (int)(colon - setting), setting);
    } else {
        snprintf(host, n_host, "0.0.0.0");
    }
    *port = (int)v;
    return 1;
}

static enum MHD_Result reply(struct MHD_Connection *c, int status, char *body, size_t len, const char *type) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static char *text(const char *s, size_t *len) {
    char *b = strdup(s);
    *len = b ? strlen(b) : 0;
    return b;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload;
    metrics_t *m = cls;
    // a request body (never expected) is consumed and ignored before the reply
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    (void)state;
    size_t len = 0;
    int status = 200;
    char *body;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        body = text("method not allowed: use GET\n", &len);
        return body ? reply(c, 405, body, len, "text/plain; charset=utf-8") : MHD_NO;
    }
    if (!strcmp(url, "/metrics")) {
        body = metrics_render(m, &len);
        return body ? reply(c, 200, body, len, "text/plain; version=0.0.4; charset=utf-8") : MHD_NO;
    }
    if (!strcmp(url, "/healthz")) body = metrics_health(m, &status, &len);
    else if (!strcmp(url, "/readyz")) body = metrics_readiness(m, &status, &len);
    else status = 404, body = text("not found: this service serves /healthz, /readyz and /metrics\n", &len);
    return body ? reply(c, status, body, len, "text/plain; charset=utf-8") : MHD_NO;
}

http_srv_t *http_start(const char *setting, metrics_t *m, char *err) {
    char host[256];
    int port = 0;
    if (err) err[0] = 0;
    int rc = http_parse_listen(setting, host, sizeof host, &port, err);
    if (rc <= 0) return NULL;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int g = getaddrinfo(host, ports, &hints, &res);
    if (g != 0) {
        err_set(err, "cannot resolve the HTTP listen host '%s': %s", host, gai_strerror(g));
        return NULL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 256) < 0) {
        err_set(err, "cannot serve HTTP on %s:%d: %s (set --http / MARLAAS_HTTP to a free port, or 0 to turn it off)",
                host, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return NULL;
    }
    freeaddrinfo(res);
    http_srv_t *h = calloc(1, sizeof *h);
    if (!h) {
        close(fd);
        err_set(err, "out of memory");
        return NULL;
    }
    h->m = m, h->fd = fd, h->port = port;
    // One polling thread serves every connection, so a client that trickles its request holds a
    // slot, not the thread. Slots are many and a silent connection is closed after 5 s; one
    // address may hold at most a quarter of them, so the probes (the kubelet's, the scraper's)
    // find a free slot while others hold connections open.
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC, 0, NULL, NULL, handle, m,
                            MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(HTTP_MAX_CONNECTIONS / 4),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)5, MHD_OPTION_END);
    if (!h->d) {
        err_set(err, "cannot start the HTTP server on %s:%d (libmicrohttpd refused its settings)", host, port);
        close(fd);
        free(h);
        return NULL;
    }
    return h;
}

int http_port(const http_srv_t *h) { return h ? h->port : 0; }

void http_stop(http_srv_t **ph) {
    http_srv_t *h = *ph;
    if (!h) return;
    // quiescing hands the listening socket back (and stops accepting); when it cannot, the daemon
    // still owns it and closes it on stop
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    MHD_stop_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    free(h);
    *ph = NULL;
}

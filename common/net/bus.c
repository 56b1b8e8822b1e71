// bus.c - czmq socket helpers: binding/connecting with limits, DNS expansion of endpoints,
// non-blocking sends.
#include "common/net/bus.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "common/util/log.h"

const char *bus_endpoint(const char *flag, const char *env, const char *def) {
    if (flag && *flag) return flag;
    const char *e = env ? getenv(env) : NULL;
    return (e && *e) ? e : def;
}

void bus_tune(zsock_t *s) {
    // ZMTP heartbeats: a peer whose host vanished (link cut, node lost) is found within
    // BUS_HEARTBEAT_TIMEOUT_MS instead of the kernel's TCP timeouts (minutes), so PUSH sockets stop
    // routing messages into a dead connection and connecting sockets start reconnecting
    zsock_set_heartbeat_ivl(s, BUS_HEARTBEAT_IVL_MS);
    zsock_set_heartbeat_timeout(s, BUS_HEARTBEAT_TIMEOUT_MS);
    zsock_set_heartbeat_ttl(s, BUS_HEARTBEAT_TIMEOUT_MS);
}

static zsock_t *make(int type, int hwm, size_t max_frame) {
    zsock_t *s = zsock_new(type);
    if (!s) return NULL;
    bus_tune(s);
    zsock_set_sndhwm(s, hwm);
    zsock_set_rcvhwm(s, hwm);
    zsock_set_linger(s, 0);
    if (max_frame) zsock_set_maxmsgsize(s, (int)(max_frame > 0x7fffffff ? 0x7fffffff : max_frame));
    return s;
}

zsock_t *bus_bind(int type, const char *endpoint, int hwm, size_t max_frame, char *err) {
    zsock_t *s = make(type, hwm, max_frame);
    if (!s) {
        err_set(err, "cannot create a ZeroMQ socket");
        return NULL;
    }
    if (zsock_bind(s, "%s", endpoint) < 0) {
        err_set(err, "cannot bind %s: %s (is another process using the port?)", endpoint, zmq_strerror(zmq_errno()));
        zsock_destroy(&s);
        return NULL;
    }
    return s;
}

int bus_resolve(const char *endpoints, char out[][256], int max, char *err) {
    char list[4096];
    snprintf(list, sizeof list, "%s", endpoints ? endpoints : "");
    int n = 0;
    for (char *save = NULL, *ep = strtok_r(list, ",", &save); ep; ep = strtok_r(NULL, ",", &save)) {
        while (*ep == ' ') ep++;
        if (!*ep) continue;
        char host[256];
        int port;
        // tcp://HOST:PORT with a DNS name: one endpoint per address
        if (sscanf(ep, "tcp://%255[^:]:%d", host, &port) == 2 && strcmp(host, "*") != 0) {
            struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
            int rc = getaddrinfo(host, NULL, &hints, &res);
            if (rc != 0) return err_set(err, "cannot resolve %s in %s: %s", host, ep, gai_strerror(rc));
            for (struct addrinfo *a = res; a; a = a->ai_next) {
                char ip[INET_ADDRSTRLEN];
                inet_ntop(AF_INET, &((struct sockaddr_in *)a->ai_addr)->sin_addr, ip, sizeof ip);
                char one[256];
                snprintf(one, sizeof one, "tcp://%s:%d", ip, port);
                bool dup = false;
                for (int i = 0; i < n; i++) dup |= !strcmp(out[i], one);
                if (!dup && n < max) snprintf(out[n++], 256, "%s", one);
            }
            freeaddrinfo(res);
        } else if (n < max) {
            snprintf(out[n++], 256, "%s", ep);
        }
    }
    // sorted, so that reconcile compares sets cheaply and logs are stable
    qsort(out, (size_t)n, 256, (int (*)(const void *, const void *))strcmp);
    return n;
}

int bus_reconcile(zsock_t *s, bus_peers_t *have, char want[][256], int n_want) {
    int changes = 0;
    for (int i = 0; i < have->n;) {
        bool keep = false;
        for (int j = 0; j < n_want; j++) keep |= !strcmp(have->ep[i], want[j]);
        if (keep) {
            i++;
            continue;
        }
        zsock_disconnect(s, "%s", have->ep[i]);
        log_info("disconnected from %s (no longer resolved)", have->ep[i]);
        memmove(have->ep[i], have->ep[i + 1], sizeof have->ep[0] * (size_t)(have->n - i - 1));
        have->n--;
        changes++;
    }
    for (int j = 0; j < n_want && have->n < BUS_MAX_ENDPOINTS; j++) {
        bool known = false;
        for (int i = 0; i < have->n; i++) known |= !strcmp(have->ep[i], want[j]);
        if (known) continue;
        if (zsock_connect(s, "%s", want[j]) < 0) {
            log_warn("cannot connect to %s: %s", want[j], zmq_strerror(zmq_errno()));
            continue;
        }
        snprintf(have->ep[have->n++], 256, "%s", want[j]);
        changes++;
    }
    return changes;
}

zsock_t *bus_connect(int type, const char *endpoints, int hwm, size_t max_frame, char *err) {
    char eps[BUS_MAX_ENDPOINTS][256];
    int n = bus_resolve(endpoints, eps, BUS_MAX_ENDPOINTS, err);
    if (n < 0) return NULL;
    if (n == 0) {
        err_set(err, "no endpoint to connect to in '%s'", endpoints ? endpoints : "");
        return NULL;
    }
    zsock_t *s = make(type, hwm, max_frame);
    if (!s) {
        err_set(err, "cannot create a ZeroMQ socket");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (zsock_connect(s, "%s", eps[i]) < 0) {
            err_set(err, "cannot connect to %s: %s", eps[i], zmq_strerror(zmq_errno()));
            zsock_destroy(&s);
            return NULL;
        }
    return s;
}

int bus_send(zsock_t *s, const proto_buf_t *buf) {
    return zmq_send(zsock_resolve(s), buf->data, buf->len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

int bus_send_routed(zsock_t *s, zframe_t *identity, bool delim, const proto_buf_t *buf) {
    void *h = zsock_resolve(s);
    if (zmq_send(h, zframe_data(identity), zframe_size(identity), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return -1;
    if (delim && zmq_send(h, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return -1;
    return zmq_send(h, buf->data, buf->len, ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

// bus.h - ZeroMQ sockets (czmq) for the services: endpoints from flags and environment, high-
// water marks, frame-size caps, one MessagePack message per frame.
//
// Endpoint lists: "tcp://a:7010,tcp://b:7010". A tcp endpoint whose host is a DNS name that
// resolves to several addresses (a Kubernetes headless Service) expands to one endpoint per
// address; bus_resolve() does the expansion and bus_reconcile() keeps a connected socket in
// step with a list that changes (re-resolved on an interval).
#ifndef MARLAAS_BUS_H
#define MARLAAS_BUS_H

#include <czmq.h>
#include <stdbool.h>

#include "common/net/proto.h"

#define BUS_DEFAULT_HWM 1000
#define BUS_MAX_ENDPOINTS 64
#define BUS_HEARTBEAT_IVL_MS 1000
#define BUS_HEARTBEAT_TIMEOUT_MS 5000

// flag if set, else getenv(env) if set and non-empty, else def.
const char *bus_endpoint(const char *flag, const char *env, const char *def);

// Settings every socket of ours gets (bus_bind and bus_connect apply them): ZMTP heartbeats
// every BUS_HEARTBEAT_IVL_MS, a connection silent for BUS_HEARTBEAT_TIMEOUT_MS is closed.
void bus_tune(zsock_t *s);

// A socket of `type` (ZMQ_PUSH, ZMQ_PULL, ...) bound to endpoint, with send/receive high-water
// marks `hwm` and incoming frames capped at max_frame bytes (larger frames drop the peer's
// connection inside libzmq, before any of our code sees them). NULL + err on failure.
zsock_t *bus_bind(int type, const char *endpoint, int hwm, size_t max_frame, char *err);
// Same, connected to every endpoint of a comma-separated list (after DNS expansion).
zsock_t *bus_connect(int type, const char *endpoints, int hwm, size_t max_frame, char *err);

// Expands a comma-separated endpoint list: tcp://NAME:PORT becomes tcp://IP:PORT for every
// IPv4 address NAME resolves to (sorted, unique). Returns the count (<= max) or -1 + err.
int bus_resolve(const char *endpoints, char out[][256], int max, char *err);

// Connection set of a socket for bus_reconcile.
typedef struct {
    char ep[BUS_MAX_ENDPOINTS][256];
    int n;
} bus_peers_t;
// Connects to endpoints newly in `want` and disconnects those no longer in it. Returns the
// number of changes.
int bus_reconcile(zsock_t *s, bus_peers_t *have, char want[][256], int n_want);

// Sends buf as one frame without blocking. Returns 0, or -1 when the high-water mark is
// reached or the socket has no peer (the caller keeps or drops the message: it still owns buf).
int bus_send(zsock_t *s, const proto_buf_t *buf);
// Same with a leading routing frame (ROUTER replies) and, when delim, an empty delimiter
// frame (REQ/REP peers).
int bus_send_routed(zsock_t *s, zframe_t *identity, bool delim, const proto_buf_t *buf);

#endif

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

// --- authenticated, encrypted links (ZeroMQ CURVE) ----------------------------------------------
// The services of a cluster (scheduler, rollout, verifier, trainer) each hold a CURVE keypair:
// DIR/NAME.key (public) and DIR/NAME.key_secret (secret), as zcert writes them. After
// bus_secure(DIR, NAME), every socket bus_bind makes is a CURVE server that admits only the
// public keys found in DIR (czmq's zauth, one per process), and every socket connected to a
// named peer service authenticates it by DIR/PEER.key: frames are encrypted both ways and a
// process without one of the cluster's keys cannot connect. After bus_insecure() (an explicit
// --insecure) sockets are plain ZeroMQ. Call one of them once, before the first socket.
int bus_secure(const char *keys_dir, const char *self, char *err);
void bus_insecure(void);
bool bus_is_secure(void);
// A 32-byte key this service shares with the service `peer` alone (X25519 of this service's
// secret key and peer's public key, hashed with both public keys and `purpose`): the two compute
// the same key without sending anything. -1 + err when links are not secured.
int bus_link_key(const char *peer, const char *purpose, uint8_t key[32], char *err);
// Stops the authenticator and forgets the keys (at exit; a no-op when never secured).
void bus_secure_end(void);
// Writes a fresh keypair for each of the four services into dir (created 0700; secrets 0600).
// Refuses to overwrite existing keys.
int bus_keys_generate(const char *dir, char *err);
// The public key (40 characters of Z85): the key text itself, or the certificate at a path (one
// with a slash), or DIR/NAME.key.
int bus_public_key(const char *keys_dir, const char *name_or_key, char out[41], char *err);

// flag if set, else getenv(env) if set and non-empty, else def.
const char *bus_endpoint(const char *flag, const char *env, const char *def);

// Settings every socket of ours gets (bus_bind and bus_connect apply them): ZMTP heartbeats
// every BUS_HEARTBEAT_IVL_MS, a connection silent for BUS_HEARTBEAT_TIMEOUT_MS is closed.
void bus_tune(zsock_t *s);

// A socket of `type` (ZMQ_PUSH, ZMQ_PULL, ...) bound to endpoint, with send/receive high-water
// marks `hwm` and incoming frames capped at max_frame bytes (larger frames drop the peer's
// connection inside libzmq, before any of our code sees them; 0: no cap; PUSH and PUB, which
// only send, take BUS_SEND_ONLY_MAX whatever max_frame says: room for subscriptions). NULL + err on failure. Secured:
// a CURVE server admitting the cluster's keys only.
zsock_t *bus_bind(int type, const char *endpoint, int hwm, size_t max_frame, char *err);
#define BUS_SEND_ONLY_MAX 65536
// The scheduler's client API: secured, a CURVE server that admits any client key (clients make
// theirs; the tenant's token authenticates the request) and encrypts every frame. It lives in
// a ZeroMQ context of its own, apart from the authenticator; close it with bus_close.
zsock_t *bus_bind_public(int type, const char *endpoint, int hwm, size_t max_frame, char *err);
// Same as bus_bind, connected to every endpoint of a comma-separated list (after DNS
// expansion). peer names the service at those endpoints ("scheduler", "verifier", "trainer"):
// secured, the connection authenticates it by its public key; NULL for a peer outside the
// cluster (a tenant's reward service), always plain.
zsock_t *bus_connect(int type, const char *endpoints, const char *peer, int hwm, size_t max_frame, char *err);
// An unconnected socket set up as bus_connect's (connect it with bus_reconcile).
zsock_t *bus_socket(int type, const char *peer, int hwm, size_t max_frame, char *err);
// A client of a public socket (bus_bind_public) whose server key is server_key (Z85): a fresh
// keypair of its own; plain when server_key is NULL.
zsock_t *bus_connect_public(int type, const char *endpoint, const char *server_key, int hwm, size_t max_frame,
                            char *err);
// Closes any socket of the above and sets *s to NULL.
void bus_close(zsock_t **s);

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

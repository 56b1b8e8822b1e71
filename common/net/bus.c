// bus.c - czmq socket helpers: binding/connecting with limits, DNS expansion of endpoints,
// non-blocking sends.
#include "common/net/bus.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sodium.h>

#include "common/util/log.h"

const char *bus_endpoint(const char *flag, const char *env, const char *def) {
    if (flag && *flag) return flag;
    const char *e = env ? getenv(env) : NULL;
    return (e && *e) ? e : def;
}

// --- CURVE ----------------------------------------------------------------------------------------

#define BUS_N_PEERS 4
static const char *const bus_services[BUS_N_PEERS] = {"scheduler", "rollout", "verifier", "trainer"};

static struct {
    bool secure;
    char dir[1024];
    zcert_t *self;          // this process's keypair
    char peer_key[BUS_N_PEERS][41];
    zactor_t *auth;         // zauth: admits the public keys of dir (started with the first bind)
    void *public_ctx;       // the context of bus_bind_public's sockets: no authenticator there
} sec;

// zcert_load, refusing first what czmq cannot parse: its file loader leaks its file object on a
// syntax error (libczmq 4.2), the string parser does not, so the text is parsed once on its own.
static zcert_t *cert_load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    bool whole = feof(f) && !ferror(f);
    fclose(f);
    if (!whole) return NULL;   // a certificate is a few hundred bytes
    buf[n] = 0;
    zconfig_t *c = zconfig_str_load(buf);
    if (!c) return NULL;
    zconfig_destroy(&c);
    return zcert_load(path);
}

int bus_public_key(const char *keys_dir, const char *name_or_key, char out[41], char *err) {
    char path[1200];
    uint8_t bin[32];
    bool file = strchr(name_or_key, '/') && access(name_or_key, F_OK) == 0;
    if (!file && strlen(name_or_key) == 40 && zmq_z85_decode(bin, name_or_key)) {   // the key itself
        snprintf(out, 41, "%s", name_or_key);
        return 0;
    }
    if (strchr(name_or_key, '/')) snprintf(path, sizeof path, "%s", name_or_key);
    else snprintf(path, sizeof path, "%s/%s.key", keys_dir ? keys_dir : ".", name_or_key);
    if (access(path, R_OK) != 0)
        return err_set(err, "cannot read the public key %s: %s (make keys with `marlaas keys generate DIR`)", path,
                       strerror(errno));
    zcert_t *c = cert_load(path);
    if (!c) return err_set(err, "%s is not a CURVE certificate (zcert format)", path);
    snprintf(out, 41, "%s", zcert_public_txt(c));
    zcert_destroy(&c);
    return 0;
}

int bus_secure(const char *keys_dir, const char *self, char *err) {
    bus_secure_end();
    if (!zsys_has_curve()) return err_set(err, "this libzmq has no CURVE support: links cannot be secured");
    if (!keys_dir || !*keys_dir)
        return err_set(err, "no CURVE keys: pass --keys DIR (MARLAAS_KEYS; `marlaas keys generate DIR` makes them), "
                            "or --insecure for plain links");
    snprintf(sec.dir, sizeof sec.dir, "%s", keys_dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.key_secret", keys_dir, self);
    if (access(path, R_OK) != 0)
        return err_set(err, "cannot read this service's secret key %s: %s (make keys with `marlaas keys generate %s`)",
                       path, strerror(errno), keys_dir);
    sec.self = cert_load(path);
    static const char zero[41] = "0000000000000000000000000000000000000000";   // Z85 of 32 zero bytes
    if (!sec.self || !strcmp(zcert_secret_txt(sec.self), zero)) {
        zcert_destroy(&sec.self);
        return err_set(err, "%s holds no CURVE secret key (zcert format)", path);
    }
    for (int i = 0; i < BUS_N_PEERS; i++) sec.peer_key[i][0] = 0;
    sec.secure = true;
    return 0;
}

int bus_link_key(const char *peer, const char *purpose, uint8_t key[32], char *err) {
    if (!sec.secure) return err_set(err, "links are not secured: no keys to derive a link key from");
    char pk[41];
    uint8_t peer_pub[32], self_sec[32], shared[crypto_scalarmult_BYTES];
    if (bus_public_key(sec.dir, peer, pk, err)) return -1;
    if (!zmq_z85_decode(peer_pub, pk) || !zmq_z85_decode(self_sec, zcert_secret_txt(sec.self)))
        return err_set(err, "the keys of %s or of this service are not Z85", peer);
    int rc = crypto_scalarmult(shared, self_sec, peer_pub);
    sodium_memzero(self_sec, sizeof self_sec);
    if (rc != 0) return err_set(err, "the public key of %s is degenerate", peer);
    // both ends hash the same X25519 secret with both public keys (in a fixed order) and the purpose
    uint8_t own_pub[32];
    zmq_z85_decode(own_pub, zcert_public_txt(sec.self));
    const uint8_t *lo = memcmp(own_pub, peer_pub, 32) < 0 ? own_pub : peer_pub, *hi = lo == own_pub ? peer_pub : own_pub;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, 32);
    crypto_generichash_update(&h, (const uint8_t *)purpose, strlen(purpose) + 1);
    crypto_generichash_update(&h, shared, sizeof shared);
    crypto_generichash_update(&h, lo, 32);
    crypto_generichash_update(&h, hi, 32);
    crypto_generichash_final(&h, key, 32);
    sodium_memzero(shared, sizeof shared);
    return 0;
}

void bus_insecure(void) {
    bus_secure_end();
    log_warn("--insecure: links between services are plain ZeroMQ, unauthenticated and unencrypted; anyone who "
             "reaches a port can read and forge the messages of this cluster; use only on a trusted host");
}

bool bus_is_secure(void) { return sec.secure; }

void bus_secure_end(void) {
    zactor_destroy(&sec.auth);
    zcert_destroy(&sec.self);
    if (sec.public_ctx) zmq_ctx_term(sec.public_ctx);
    sec.public_ctx = NULL;
    sec.secure = false;
}

int bus_keys_generate(const char *dir, char *err) {
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return err_set(err, "cannot create %s: %s", dir, strerror(errno));
    char path[1200];
    for (int i = 0; i < BUS_N_PEERS; i++) {
        snprintf(path, sizeof path, "%s/%s.key_secret", dir, bus_services[i]);
        if (access(path, F_OK) == 0) return err_set(err, "%s exists: keys are never overwritten", path);
    }
    // secrets are private from their creation (zcert writes with the process's umask)
    mode_t old = umask(077);
    int rc = 0;
    for (int i = 0; i < BUS_N_PEERS && !rc; i++) {
        zcert_t *c = zcert_new();
        if (!c) {
            rc = err_set(err, "cannot make a CURVE keypair (libsodium)");
            break;
        }
        zcert_set_meta(c, "service", "%s", bus_services[i]);
        snprintf(path, sizeof path, "%s/%s.key", dir, bus_services[i]);
        int saved = zcert_save(c, path);
        zcert_destroy(&c);
        // public keys readable by all (clients, other pods), secrets by their owner only
        bool ok = saved == 0 && chmod(path, 0644) == 0;
        snprintf(path, sizeof path, "%s/%s.key_secret", dir, bus_services[i]);
        if (!ok || chmod(path, 0600) != 0) rc = err_set(err, "cannot write the keys of %s in %s", bus_services[i], dir);
    }
    umask(old);
    return rc;
}

// The public key of a peer service, read once.
static const char *peer_key(const char *peer, char *err) {
    for (int i = 0; i < BUS_N_PEERS; i++) {
        if (strcmp(peer, bus_services[i])) continue;
        if (!sec.peer_key[i][0] && bus_public_key(sec.dir, peer, sec.peer_key[i], err)) return NULL;
        return sec.peer_key[i];
    }
    err_set(err, "no service named '%s' holds a key", peer);
    return NULL;
}

// Starts zauth, once, with a certificate store of exactly the four services' public keys (read
// by name, so a Kubernetes Secret volume's links and hidden directories play no part).
static int start_auth(char *err) {
    if (sec.auth) return 0;
    zcertstore_t *store = zcertstore_new(NULL);
    if (!store) return err_set(err, "cannot create a certificate store");
    for (int i = 0; i < BUS_N_PEERS; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.key", sec.dir, bus_services[i]);
        zcert_t *c = access(path, R_OK) == 0 ? cert_load(path) : NULL;
        if (!c) {
            zcertstore_destroy(&store);
            return err_set(err, "cannot load the public key %s (make keys with `marlaas keys generate DIR`)", path);
        }
        zcertstore_insert(store, &c);   // the store owns it
    }
    sec.auth = zactor_new(zauth, store);   // zauth owns the store from here
    if (!sec.auth) {
        zcertstore_destroy(&store);
        return err_set(err, "cannot start the ZeroMQ authenticator (zauth)");
    }
    return 0;
}

void bus_tune(zsock_t *s) {
    // ZMTP heartbeats: a peer whose host vanished (link cut, node lost) is found within
    // BUS_HEARTBEAT_TIMEOUT_MS instead of the kernel's TCP timeouts (minutes), so PUSH sockets stop
    // routing messages into a dead connection and connecting sockets start reconnecting
    zsock_set_heartbeat_ivl(s, BUS_HEARTBEAT_IVL_MS);
    zsock_set_heartbeat_timeout(s, BUS_HEARTBEAT_TIMEOUT_MS);
    zsock_set_heartbeat_ttl(s, BUS_HEARTBEAT_TIMEOUT_MS);
}

// ZMQ_MAXMSGSIZE for max_frame (0: no cap, -1 to libzmq). A socket that only sends (PUSH, PUB)
// still decodes what a peer writes to it: without a cap a junk peer declaring a frame of 2^63
// bytes makes libzmq try to allocate it, so those take BUS_SEND_ONLY_MAX at most.
static int frame_cap(int type, size_t max_frame) {
    if (type == ZMQ_PUSH || type == ZMQ_PUB) return BUS_SEND_ONLY_MAX;
    if (max_frame == 0) return -1;
    return max_frame > 0x7fffffff ? 0x7fffffff : (int)max_frame;
}

static zsock_t *make(int type, int hwm, size_t max_frame) {
    zsock_t *s = zsock_new(type);
    if (!s) return NULL;
    bus_tune(s);
    zsock_set_sndhwm(s, hwm);
    zsock_set_rcvhwm(s, hwm);
    zsock_set_linger(s, 0);
    zsock_set_maxmsgsize(s, frame_cap(type, max_frame));
    return s;
}

static int bind_to(zsock_t *s, const char *endpoint, char *err) {
    if (zsock_bind(s, "%s", endpoint) < 0)
        return err_set(err, "cannot bind %s: %s (is another process using the port?)", endpoint, zmq_strerror(zmq_errno()));
    return 0;
}

zsock_t *bus_bind(int type, const char *endpoint, int hwm, size_t max_frame, char *err) {
    if (sec.secure && start_auth(err)) return NULL;
    zsock_t *s = make(type, hwm, max_frame);
    if (!s) {
        err_set(err, "cannot create a ZeroMQ socket");
        return NULL;
    }
    if (sec.secure) {
        zcert_apply(sec.self, s);
        zsock_set_curve_server(s, 1);
        zsock_set_zap_domain(s, "marlaas");
    }
    if (bind_to(s, endpoint, err)) zsock_destroy(&s);
    return s;
}

zsock_t *bus_bind_public(int type, const char *endpoint, int hwm, size_t max_frame, char *err) {
    if (!sec.secure) return bus_bind(type, endpoint, hwm, max_frame, err);
    if (!sec.public_ctx && !(sec.public_ctx = zmq_ctx_new())) {
        err_set(err, "cannot create a ZeroMQ context");
        return NULL;
    }
    zsock_t *s = zmq_socket(sec.public_ctx, type);
    if (!s) {
        err_set(err, "cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    bus_tune(s);
    zsock_set_sndhwm(s, hwm);
    zsock_set_rcvhwm(s, hwm);
    zsock_set_linger(s, 0);
    zsock_set_maxmsgsize(s, frame_cap(type, max_frame));
    zcert_apply(sec.self, s);
    zsock_set_curve_server(s, 1);
    if (zmq_bind(s, endpoint) != 0) {
        err_set(err, "cannot bind %s: %s (is another process using the port?)", endpoint, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}

void bus_close(zsock_t **s) {
    if (!s || !*s) return;
    if (zsock_is(*s)) zsock_destroy(s);
    else zmq_close(*s), *s = NULL;
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

zsock_t *bus_socket(int type, const char *peer, int hwm, size_t max_frame, char *err) {
    const char *key = NULL;
    if (sec.secure && peer && !(key = peer_key(peer, err))) return NULL;
    zsock_t *s = make(type, hwm, max_frame);
    if (!s) {
        err_set(err, "cannot create a ZeroMQ socket");
        return NULL;
    }
    if (key) {
        zcert_apply(sec.self, s);
        zsock_set_curve_serverkey(s, key);
    }
    return s;
}

static int connect_all(zsock_t *s, const char *endpoints, char *err) {
    char eps[BUS_MAX_ENDPOINTS][256];
    int n = bus_resolve(endpoints, eps, BUS_MAX_ENDPOINTS, err);
    if (n < 0) return -1;
    if (n == 0) return err_set(err, "no endpoint to connect to in '%s'", endpoints ? endpoints : "");
    for (int i = 0; i < n; i++)
        if (zsock_connect(s, "%s", eps[i]) < 0)
            return err_set(err, "cannot connect to %s: %s", eps[i], zmq_strerror(zmq_errno()));
    return 0;
}

zsock_t *bus_connect(int type, const char *endpoints, const char *peer, int hwm, size_t max_frame, char *err) {
    zsock_t *s = bus_socket(type, peer, hwm, max_frame, err);
    if (s && connect_all(s, endpoints, err)) zsock_destroy(&s);
    return s;
}

zsock_t *bus_connect_public(int type, const char *endpoint, const char *server_key, int hwm, size_t max_frame,
                            char *err) {
    zsock_t *s = make(type, hwm, max_frame);
    if (!s) {
        err_set(err, "cannot create a ZeroMQ socket");
        return NULL;
    }
    if (server_key) {
        zcert_t *mine = zcert_new();
        if (!mine) {
            zsock_destroy(&s);
            err_set(err, "cannot make a CURVE keypair (libsodium)");
            return NULL;
        }
        zcert_apply(mine, s);
        zcert_destroy(&mine);
        zsock_set_curve_serverkey(s, server_key);
    }
    if (connect_all(s, endpoint, err)) zsock_destroy(&s);
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

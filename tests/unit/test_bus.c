// test_bus.c - the authenticated links (bus_secure): real ZeroMQ sockets over loopback TCP, CURVE
// keys written by bus_keys_generate. A cluster member's frames arrive; a plain peer's, a peer
// with a key of its own and a peer that trusts the wrong server key get nothing through; the
// public API admits any client key but no plain client; keys are never overwritten and
// secrets are private. Criterion runs each test in its own process, so each secures its own.
#include <criterion/criterion.h>

#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/net/bus.h"
#include "tests/unit/testutil.h"

static void keys_dir(char *dir, size_t n, const char *name) {
    char err[ERR_LEN];
    tu_tmpdir(dir, n, name);
    char sub[512];
    snprintf(sub, sizeof sub, "%s/keys", dir);
    cr_assert_eq(bus_keys_generate(sub, err), 0, "%s", err);
    snprintf(dir, n, "%s", sub);
}

// Whether one frame sent on `tx` arrives on `rx` within ms milliseconds.
static bool delivered(zsock_t *tx, zsock_t *rx, int ms) {
    zstr_sendx(tx, "hello", NULL);
    zpoller_t *p = zpoller_new(rx, NULL);
    bool got = zpoller_wait(p, ms) == (void *)rx || zpoller_wait(p, 0) != NULL;
    zpoller_destroy(&p);
    if (got) {
        char *s = zstr_recv(rx);
        got = s && !strcmp(s, "hello");
        zstr_free(&s);
    }
    return got;
}

static zsock_t *server(char *ep, size_t n) {
    char err[ERR_LEN];
    zsock_t *s = bus_bind(ZMQ_PULL, "tcp://127.0.0.1:*", 100, 1 << 20, err);
    cr_assert_not_null(s, "%s", err);
    char *last = zsock_last_endpoint(s);   // the caller's to free
    snprintf(ep, n, "%s", last);
    free(last);
    return s;
}

Test(bus, cluster_member_gets_through_others_do_not) {
    char dir[512], ep[256], err[ERR_LEN];
    keys_dir(dir, sizeof dir, "bus-member");
    cr_assert_eq(bus_secure(dir, "trainer", err), 0, "%s", err);
    cr_assert(bus_is_secure());
    zsock_t *rx = server(ep, sizeof ep);
    // a member of the cluster (this process's key), authenticating the server as the trainer
    zsock_t *tx = bus_connect(ZMQ_PUSH, ep, "trainer", 100, 0, err);
    cr_assert_not_null(tx, "%s", err);
    cr_assert(delivered(tx, rx, 3000), "a cluster member's frame did not arrive");
    zsock_destroy(&tx);
    // plain ZeroMQ: the handshake fails, nothing arrives
    zsock_t *plain = zsock_new_push(ep);
    cr_assert_not(delivered(plain, rx, 500), "a plain peer's frame arrived");
    zsock_destroy(&plain);
    // CURVE with a key of its own and the right server key: refused by the authenticator
    char tkey[41];
    cr_assert_eq(bus_public_key(dir, "trainer", tkey, err), 0, "%s", err);
    zsock_t *stranger = zsock_new(ZMQ_PUSH);
    zcert_t *c = zcert_new();
    zcert_apply(c, stranger);
    zcert_destroy(&c);
    zsock_set_curve_serverkey(stranger, tkey);
    zsock_connect(stranger, "%s", ep);
    cr_assert_not(delivered(stranger, rx, 500), "a stranger's key got a frame through");
    zsock_destroy(&stranger);
    // a member that expects another service at the endpoint (wrong server key): nothing
    zsock_t *wrong = bus_connect(ZMQ_PUSH, ep, "scheduler", 100, 0, err);
    cr_assert_not_null(wrong, "%s", err);
    cr_assert_not(delivered(wrong, rx, 500), "a frame reached a server with another key");
    zsock_destroy(&wrong);
    zsock_destroy(&rx);
    bus_secure_end();
}

Test(bus, public_api_admits_any_key_but_no_plain_client) {
    char dir[512], err[ERR_LEN], key[41];
    keys_dir(dir, sizeof dir, "bus-public");
    cr_assert_eq(bus_secure(dir, "scheduler", err), 0, "%s", err);
    // the authenticator runs (an internal socket is bound), yet the API is open to any key
    char ep0[256];
    zsock_t *internal = server(ep0, sizeof ep0);
    zsock_t *api = bus_bind_public(ZMQ_PULL, "tcp://127.0.0.1:*", 100, 1 << 20, err);
    cr_assert_not_null(api, "%s", err);
    char ep[256];
    size_t len = sizeof ep;
    cr_assert_eq(zmq_getsockopt(api, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    cr_assert_eq(bus_public_key(dir, "scheduler", key, err), 0, "%s", err);
    zsock_t *client = bus_connect_public(ZMQ_PUSH, ep, key, 100, 0, err);
    cr_assert_not_null(client, "%s", err);
    cr_assert(delivered(client, api, 3000), "a client with a fresh key did not reach the API");
    zsock_destroy(&client);
    zsock_t *plain = bus_connect_public(ZMQ_PUSH, ep, NULL, 100, 0, err);
    cr_assert_not(delivered(plain, api, 500), "a plain client reached the secured API");
    zsock_destroy(&plain);
    // the internal socket still refuses a fresh key
    char skey[41];
    cr_assert_eq(bus_public_key(dir, "scheduler", skey, err), 0, "%s", err);
    zsock_t *outsider = bus_connect_public(ZMQ_PUSH, ep0, skey, 100, 0, err);
    cr_assert_not(delivered(outsider, internal, 500), "a fresh key reached an internal socket");
    zsock_destroy(&outsider);
    bus_close(&api);
    cr_assert_null(api);
    zsock_destroy(&internal);
    bus_secure_end();
}

Test(bus, insecure_links_are_plain) {
    bus_insecure();
    cr_assert_not(bus_is_secure());
    char ep[256], err[ERR_LEN];
    zsock_t *rx = server(ep, sizeof ep);
    zsock_t *plain = zsock_new_push(ep);
    cr_assert(delivered(plain, rx, 3000), "with --insecure a plain peer must get through");
    zsock_destroy(&plain);
    zsock_destroy(&rx);
    (void)err;
}

Test(bus, keys_errors_are_named) {
    char dir[512], err[ERR_LEN], key[41];
    keys_dir(dir, sizeof dir, "bus-keys");
    // never overwritten; secrets private
    cr_assert_eq(bus_keys_generate(dir, err), -1);
    cr_assert(strstr(err, "never overwritten"), "%s", err);
    char path[600];
    snprintf(path, sizeof path, "%s/rollout.key_secret", dir);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 077, 0, "secret key readable by others: %o", st.st_mode & 0777);
    // no keys, a missing secret, a file that is no certificate, a bad Z85 key
    cr_assert_eq(bus_secure(NULL, "trainer", err), -1);
    cr_assert(strstr(err, "--keys") && strstr(err, "--insecure"), "%s", err);
    cr_assert_eq(bus_secure(dir, "nobody", err), -1);
    cr_assert(strstr(err, "nobody.key_secret"), "%s", err);
    snprintf(path, sizeof path, "%s/junk.key", dir);
    FILE *f = fopen(path, "w");
    fputs("not a certificate\n", f);
    fclose(f);
    cr_assert_eq(bus_public_key(dir, "junk", key, err), -1);
    cr_assert(strstr(err, "junk.key"), "%s", err);
    cr_assert_eq(bus_public_key(NULL, "not-a-z85-key-of-forty-characters!!!!!!", key, err), -1);
    cr_assert_eq(bus_public_key(dir, "trainer", key, err), 0, "%s", err);
    char again[41];
    cr_assert_eq(bus_public_key(NULL, key, again, err), 0, "%s", err);   // the key text itself
    cr_assert_str_eq(again, key);
}

// The task tag key: the scheduler and the trainer derive the same key, each from its own secret
// and the other's public key; any other pair, another purpose or another cluster's keys differ.
Test(bus, link_keys_agree_between_the_two_ends_only) {
    char dir[512], dir2[512], err[ERR_LEN];
    keys_dir(dir, sizeof dir, "bus-link");
    keys_dir(dir2, sizeof dir2, "bus-link2");
    uint8_t st[32], ts[32], sr[32], other[32], purpose[32], foreign[32];
    cr_assert_eq(bus_link_key("trainer", "p", st, err), -1, "not secured: no key");
    cr_assert_eq(bus_secure(dir, "scheduler", err), 0, "%s", err);
    cr_assert_eq(bus_link_key("trainer", "p", st, err), 0, "%s", err);
    cr_assert_eq(bus_link_key("rollout", "p", sr, err), 0, "%s", err);
    cr_assert_eq(bus_link_key("trainer", "q", purpose, err), 0, "%s", err);
    cr_assert_eq(bus_link_key("nobody", "p", other, err), -1);
    cr_assert_not_null(strstr(err, "nobody.key"), "%s", err);
    cr_assert_eq(bus_secure(dir, "trainer", err), 0, "%s", err);
    cr_assert_eq(bus_link_key("scheduler", "p", ts, err), 0, "%s", err);
    cr_assert_eq(bus_secure(dir, "verifier", err), 0, "%s", err);
    cr_assert_eq(bus_link_key("scheduler", "p", other, err), 0, "%s", err);
    cr_assert_eq(bus_secure(dir2, "trainer", err), 0, "%s", err);
    cr_assert_eq(bus_link_key("scheduler", "p", foreign, err), 0, "%s", err);
    bus_secure_end();
    cr_assert_arr_eq(st, ts, 32, "the two ends derive the same key");
    cr_assert_arr_neq(st, sr, 32);
    cr_assert_arr_neq(st, other, 32, "the verifier cannot derive the scheduler-trainer key");
    cr_assert_arr_neq(st, purpose, 32);
    cr_assert_arr_neq(st, foreign, 32);
}

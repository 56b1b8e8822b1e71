// test_score.c - the verifier's scoring with tenants' reward and environment services
// (services/verifier/score.c, compiled into this test) against a real redis-server and real
// ZeroMQ services on loopback:
//   spoofing     a tenant's service answers requests it was never sent (ids of another tenant's
//                requests, guessed neighbours, random ids, environment replies): none is
//                applied, each is counted, and the other tenant's rewards are its own service's
//   ids          request ids are random, not sequential
//   limits       a tenant with all its sockets busy gets a clear error for a new endpoint (the
//                job fails with on_failure "fail"), another tenant is served all the same, and
//                sockets close once idle, so the tenant is served again
//   rules        an endpoint the rules refuse (Redis's port, ipc://) fails its job naming the
//                rule and opens no socket
#include <criterion/criterion.h>

#include "tests/unit/testredis.h"

// The verifier's scoring is not part of the library: the test compiles it in.
#include "services/verifier/score.c"

static void fini(void) { tr_redis_stop(); }

TestSuite(score, .fini = fini, .timeout = 60);

// --- jobs, batches, services ---------------------------------------------------------------------

// A vowels job of tenant with an external reward service (or environment, env = true).
static void put_job(store_t *st, const char *job, const char *tenant, const char *endpoint, bool env,
                    const char *on_failure, int timeout_ms) {
    char spec[1024], key[KEY_LEN], err[ERR_LEN];
    if (env)
        snprintf(spec, sizeof spec, "{\"task\": \"vowels\", \"env\": {\"endpoint\": \"%s\", \"max_turns\": 2, "
                 "\"timeout_ms\": %d}}", endpoint, timeout_ms);
    else
        snprintf(spec, sizeof spec, "{\"task\": \"vowels\", \"reward\": {\"endpoint\": \"%s\", \"timeout_ms\": %d, "
                 "\"retries\": 0, \"on_failure\": \"%s\"}}", endpoint, timeout_ms, on_failure);
    cr_assert_not_null(key_job(st, key, sizeof key, job));
    const char *f[] = {JOB_SPEC, JOB_TENANT}, *v[] = {spec, tenant};
    cr_assert_eq(store_hset(st, key, 2, f, v, err), 0, "%s", err);
}

// A "done" batch of the job: one group of n samples.
static proto_batch_t one_group(const char *job, uint32_t n) {
    proto_batch_t b = {.job = xstrdup(job), .kind = PROTO_KIND_TRAIN, .task_id = 7, .n_groups = 1};
    b.groups = xcalloc(1, sizeof *b.groups);
    b.groups[0].n_samples = n;
    b.groups[0].samples = xcalloc(n, sizeof *b.groups[0].samples);
    for (uint32_t i = 0; i < n; i++) b.groups[0].samples[i].text = xstrdup("2");
    return b;
}

// A tenant's service: a ROUTER on a loopback port, answering by hand.
typedef struct {
    zsock_t *sock;
    char ep[64];
    zframe_t *peer;   // the verifier's connection (identity of its last request)
} fake_t;

static fake_t fake_open(void) {
    fake_t f = {0};
    f.sock = zsock_new(ZMQ_ROUTER);
    cr_assert_not_null(f.sock);
    for (int i = 0; i < 5; i++) {
        snprintf(f.ep, sizeof f.ep, "tcp://127.0.0.1:%d", tu_free_port());
        if (zsock_bind(f.sock, "%s", f.ep) >= 0) return f;
    }
    cr_assert_fail("cannot bind a service socket");
    return f;
}

static void fake_close(fake_t *f) {
    zframe_destroy(&f->peer);
    zsock_destroy(&f->sock);
}

// The next request at the service (the scorer polled meanwhile): its id and whether it is an
// environment request.
static uint64_t fake_recv(fake_t *f, scorer_t *s, bool *env) {
    for (double t0 = util_now(); util_now() - t0 < 10;) {
        scorer_poll(s);
        zmsg_t *m = zmsg_recv_nowait(f->sock);
        if (!m) {
            usleep(2000);
            continue;
        }
        zframe_destroy(&f->peer);
        f->peer = zmsg_pop(m);
        zframe_t *last = zmsg_last(m);
        char type[32], err[ERR_LEN];
        cr_assert_eq(proto_peek_type(zframe_data(last), zframe_size(last), type, err), 0, "%s", err);
        uint64_t id;
        if ((*env = !strcmp(type, "env_req"))) {
            proto_env_req_t rq;
            cr_assert_eq(proto_env_req_decode(zframe_data(last), zframe_size(last), &rq, err), 0, "%s", err);
            id = rq.id;
            proto_env_req_free(&rq);
        } else {
            proto_reward_req_t rq;
            cr_assert_eq(proto_reward_req_decode(zframe_data(last), zframe_size(last), &rq, err), 0, "%s", err);
            id = rq.id;
            proto_reward_req_free(&rq);
        }
        zmsg_destroy(&m);
        return id;
    }
    cr_assert_fail("no request reached %s", f->ep);
    return 0;
}

static void fake_send(fake_t *f, const proto_buf_t *buf) {
    zmsg_t *m = zmsg_new();
    zmsg_append(m, &(zframe_t *){zframe_dup(f->peer)});
    zmsg_addmem(m, "", 0);
    zmsg_addmem(m, buf->data, buf->len);
    cr_assert_eq(zmsg_send(&m, f->sock), 0);
}

// A reward reply: n rewards of value r.
static void fake_reward(fake_t *f, uint64_t id, uint32_t n, double r) {
    double rw[64];
    for (uint32_t i = 0; i < n; i++) rw[i] = r;
    proto_reward_rep_t rep = {.id = id, .n = n, .rewards = rw};
    proto_buf_t buf = {0};
    cr_assert_eq(proto_reward_rep_encode(&rep, &buf), 0);
    fake_send(f, &buf);
    proto_buf_free(&buf);
}

static void fake_env_done(fake_t *f, uint64_t id, double r) {
    proto_env_rep_t rep = {.id = id, .done = true, .reward = r};
    proto_buf_t buf = {0};
    cr_assert_eq(proto_env_rep_encode(&rep, &buf), 0);
    fake_send(f, &buf);
    proto_buf_free(&buf);
}

// Polls until a batch is done (or timeout_s passes: NULL).
static proto_batch_t *take_within(scorer_t *s, double timeout_s, bool *failed, char *error) {
    bool cont;
    for (double t0 = util_now(); util_now() - t0 < timeout_s; usleep(2000)) {
        scorer_poll(s);
        proto_batch_t *b = scorer_take(s, failed, &cont, error);
        if (b) return b;
    }
    return NULL;
}

typedef struct {
    int n;
    char last[2 * ERR_LEN];
} rejects_t;

static void count_reject(void *ctx, const char *msg) {
    rejects_t *r = ctx;
    r->n++;
    snprintf(r->last, sizeof r->last, "%s", msg);
}

// --- the tests ---------------------------------------------------------------------------------

Test(score, replies_only_from_the_requests_socket) {
    store_t *st = tr_redis_start("t:");
    fake_t A = fake_open(), B = fake_open();
    put_job(st, "j-a", "t-1", A.ep, false, "zero", 10000);
    put_job(st, "j-b", "t-2", B.ep, false, "zero", 10000);
    put_job(st, "j-ea", "t-1", A.ep, true, "zero", 10000);
    put_job(st, "j-eb", "t-2", B.ep, true, "zero", 10000);
    rejects_t rej = {0};
    scorer_cfg_t cfg = {.reject = count_reject, .ctx = &rej};
    char err[ERR_LEN];
    scorer_t *s = scorer_new(st, &cfg, err);
    cr_assert_not_null(s, "%s", err);

    proto_batch_t b = one_group("j-b", 4), a = one_group("j-a", 4);
    scorer_add(s, &b);
    bool env;
    uint64_t idB = fake_recv(&B, s, &env);
    scorer_add(s, &a);
    uint64_t idA = fake_recv(&A, s, &env);
    cr_assert_eq(scorer_endpoints(s), 2, "one socket per tenant's endpoint");
    uint64_t d = idA > idB ? idA - idB : idB - idA;
    cr_expect(d > 1000, "request ids look sequential: %llu then %llu", (unsigned long long)idB, (unsigned long long)idA);

    // tenant 1's service answers B's request (its id leaked, the worst case), ids around its own
    // and B's, and random ids, all with reward 0; B's own service then with a wrong id
    int spoofed = 0;
    uint64_t ids[] = {idB, idB + 1, idB - 1, idA + 1, idA - 1, 1, 2, 3, UINT64_MAX};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++, spoofed++) fake_reward(&A, ids[i], 4, 0.0);
    for (int i = 0; i < 200; i++, spoofed++) fake_reward(&A, ((uint64_t)rand() << 32) ^ (uint64_t)rand(), 4, 0.0);
    fake_env_done(&A, idB, 0.0), spoofed++;
    bool failed;
    char error[ERR_LEN];
    for (double t0 = util_now(); rej.n < spoofed && util_now() - t0 < 10; usleep(2000)) scorer_poll(s);
    cr_assert_eq(rej.n, spoofed, "%d of %d spoofed replies refused", rej.n, spoofed);
    cr_expect(strstr(rej.last, "unmatched environment reply") && strstr(rej.last, A.ep) && strstr(rej.last, "t-1"),
              "the refusal names the service it came from: %s", rej.last);
    fake_reward(&B, idB + 1, 4, 0.0), spoofed++;
    for (double t0 = util_now(); rej.n < spoofed && util_now() - t0 < 10; usleep(2000)) scorer_poll(s);
    cr_assert_eq(rej.n, spoofed, "%d of %d spoofed replies refused", rej.n, spoofed);
    cr_expect_eq(scorer_refused_replies(s), (uint64_t)spoofed);
    cr_expect(strstr(rej.last, "unmatched reward reply") && strstr(rej.last, B.ep) && strstr(rej.last, "t-2"),
              "the refusal names the service it came from: %s", rej.last);
    bool cont;
    cr_assert_null(scorer_take(s, &failed, &cont, error), "a batch was scored by replies that answer nothing");

    // the real replies
    fake_reward(&B, idB, 4, 1.0);
    proto_batch_t *got = take_within(s, 10, &failed, error);
    cr_assert_not_null(got);
    cr_assert_str_eq(got->job, "j-b");
    cr_expect(!failed);
    for (uint32_t i = 0; i < 4; i++) {
        cr_expect_eq(got->groups[0].samples[i].reward, 1.0f, "B's reward %u is %g, not its service's 1", i,
                     got->groups[0].samples[i].reward);
        cr_expect_eq(got->groups[0].samples[i].failed, 0);
    }
    proto_batch_destroy(&got);
    fake_reward(&A, idA, 4, 0.25);
    got = take_within(s, 10, &failed, error);
    cr_assert_not_null(got);
    cr_assert_str_eq(got->job, "j-a");
    cr_expect_eq(got->groups[0].samples[0].reward, 0.25f);
    proto_batch_destroy(&got);

    // environments: tenant 1's environment ends tenant 2's episode with its id: refused
    proto_batch_t eb = one_group("j-eb", 1), ea = one_group("j-ea", 1);
    scorer_add(s, &eb);
    uint64_t eidB = fake_recv(&B, s, &env);
    cr_assert(env);
    scorer_add(s, &ea);
    uint64_t eidA = fake_recv(&A, s, &env);
    cr_assert(env);
    int before = rej.n;
    fake_env_done(&A, eidB, 0.0);
    fake_reward(&A, eidA, 1, 0.0);   // a reward reply does not answer an environment request
    for (double t0 = util_now(); rej.n < before + 2 && util_now() - t0 < 10; usleep(2000)) scorer_poll(s);
    cr_assert_eq(rej.n, before + 2, "%s", rej.last);
    fake_env_done(&B, eidB, 1.0);
    got = take_within(s, 10, &failed, error);
    cr_assert_not_null(got);
    cr_assert_str_eq(got->job, "j-eb");
    cr_expect_eq(got->groups[0].samples[0].reward, 1.0f);
    proto_batch_destroy(&got);
    fake_env_done(&A, eidA, 0.5);
    got = take_within(s, 10, &failed, error);
    cr_assert_not_null(got);
    cr_expect_eq(got->groups[0].samples[0].reward, 0.5f);
    proto_batch_destroy(&got);

    scorer_destroy(&s);
    fake_close(&A);
    fake_close(&B);
    store_destroy(&st);
}

Test(score, endpoint_limits_per_tenant_and_idle_close) {
    store_t *st = tr_redis_start("t:");
    char dead[4][64];
    for (int i = 0; i < 4; i++) snprintf(dead[i], sizeof dead[i], "tcp://127.0.0.1:%d", tu_free_port());
    fake_t B = fake_open();
    put_job(st, "j-1", "t-1", dead[0], false, "zero", 600);
    put_job(st, "j-2", "t-1", dead[1], false, "zero", 600);
    put_job(st, "j-3", "t-1", dead[2], false, "zero", 600);
    put_job(st, "j-4", "t-1", dead[3], false, "fail", 600);
    put_job(st, "j-b", "t-2", B.ep, false, "fail", 5000);
    scorer_cfg_t cfg = {.per_tenant = 2, .idle_s = 0.3};
    char err[ERR_LEN], error[ERR_LEN];
    scorer_t *s = scorer_new(st, &cfg, err);
    cr_assert_not_null(s, "%s", err);
    bool failed;

    // two busy sockets: tenant 1's third and fourth endpoints are refused at once
    const char *jobs[] = {"j-1", "j-2", "j-3", "j-4"};
    for (int i = 0; i < 4; i++) {
        proto_batch_t b = one_group(jobs[i], 2);
        scorer_add(s, &b);
    }
    cr_expect_eq(scorer_endpoints(s), 2);
    proto_batch_t *got = take_within(s, 0.2, &failed, error);
    cr_assert_not_null(got);
    proto_batch_t *got2 = take_within(s, 0.2, &failed, error);
    cr_assert_not_null(got2);
    proto_batch_t *j3 = !strcmp(got->job, "j-3") ? got : got2, *j4 = j3 == got ? got2 : got;
    cr_assert_str_eq(j3->job, "j-3");
    cr_assert_str_eq(j4->job, "j-4");
    cr_expect(j3->groups[0].samples[0].failed && j3->groups[0].samples[1].failed);
    cr_expect(failed, "j-4 (on_failure fail) did not fail");
    cr_expect(strstr(error, "max_tenant_endpoints"), "error: %s", error);
    proto_batch_destroy(&got);
    proto_batch_destroy(&got2);

    // tenant 2 is served meanwhile
    proto_batch_t b = one_group("j-b", 2);
    scorer_add(s, &b);
    bool env;
    uint64_t id = fake_recv(&B, s, &env);
    cr_expect_eq(scorer_endpoints(s), 3);
    fake_reward(&B, id, 2, 1.0);
    got = take_within(s, 5, &failed, error);
    cr_assert_not_null(got);
    cr_assert_str_eq(got->job, "j-b");
    cr_expect(!failed && got->groups[0].samples[0].reward == 1.0f, "%s", error);
    proto_batch_destroy(&got);

    // the dead services time out; then every socket is idle and closes
    for (int k = 0; k < 2; k++) {
        got = take_within(s, 5, &failed, error);
        cr_assert_not_null(got);
        cr_expect(got->groups[0].samples[0].failed);
        proto_batch_destroy(&got);
    }
    for (double t0 = util_now(); scorer_endpoints(s) && util_now() - t0 < 5; usleep(5000)) scorer_poll(s);
    cr_expect_eq(scorer_endpoints(s), 0, "%d sockets still open", scorer_endpoints(s));

    // and tenant 1 connects again
    b = one_group("j-3", 2);
    scorer_add(s, &b);
    cr_expect_eq(scorer_endpoints(s), 1);
    scorer_destroy(&s);
    fake_close(&B);
    store_destroy(&st);
}

Test(score, refused_endpoints_fail_their_job) {
    store_t *st = tr_redis_start("t:");
    char err[ERR_LEN], error[ERR_LEN], redis[64], port[16];
    snprintf(redis, sizeof redis, "tcp://127.0.0.1:%d", tr_redis.port);
    snprintf(port, sizeof port, "%d", tr_redis.port);
    endpoint_rules_t *rules = endpoint_rules_new(NULL, err);
    cr_assert_not_null(rules, "%s", err);
    cr_assert_eq(endpoint_rules_deny(rules, port, "the cluster's Redis (--redis)", err), 0, "%s", err);
    put_job(st, "j-r", "t-1", redis, false, "zero", 1000);
    put_job(st, "j-i", "t-1", "ipc:///tmp/marlaas-test-reward.sock", false, "zero", 1000);
    scorer_cfg_t cfg = {.rules = rules};
    scorer_t *s = scorer_new(st, &cfg, err);
    cr_assert_not_null(s, "%s", err);
    bool failed;
    proto_batch_t b = one_group("j-r", 2);
    scorer_add(s, &b);
    proto_batch_t *got = take_within(s, 1, &failed, error);
    cr_assert_not_null(got);
    cr_expect(failed, "a job pointed at Redis did not fail");
    cr_expect(strstr(error, "refused") && strstr(error, "Redis (--redis)"), "error: %s", error);
    proto_batch_destroy(&got);
    b = one_group("j-i", 2);
    scorer_add(s, &b);
    got = take_within(s, 1, &failed, error);
    cr_assert_not_null(got);
    cr_expect(failed);
    cr_expect(strstr(error, "ipc://"), "error: %s", error);
    proto_batch_destroy(&got);
    cr_expect_eq(scorer_endpoints(s), 0, "a socket was opened to a refused endpoint");
    scorer_destroy(&s);
    endpoint_rules_destroy(&rules);
    store_destroy(&st);
}

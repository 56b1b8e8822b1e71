// test_tjobs.c - the trainer service's job step (services/trainer/jobs.c, compiled into this
// test) against a real redis-server: jobs loaded from Redis, scored groups buffered, stale ones
// dropped, mixed-adapter passes, new adapter versions, optimiser states and step metrics
// published. The results are fingerprinted (testfp.h): the step must compute them bit for bit
// as recorded.
//
// Every test starts its own redis-server on a free loopback port (no persistence, data dir
// under /tmp), killed afterwards; PR_SET_PDEATHSIG ends it with a crashed test.
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/testbits.h"
#include "tests/unit/testfp.h"
#include "tests/unit/testutil.h"

// The trainer's step is not part of the library: the test compiles it in.
#include "services/trainer/jobs.c"

// --- a private redis-server (tests/unit/testredis.h) ----------------------------------------

#include "tests/unit/testredis.h"

static void fini(void) { tr_redis_stop(); }

TestSuite(tjobs, .fini = fini, .timeout = 120);

// --- jobs and batches ------------------------------------------------------------------------

typedef struct {
    hf_config_t c;
    model_t *m;
    lora_pool_t *pool;
    engine_t *e;
    store_t *st;
} rig_t;

static void rig_open(rig_t *r, int slots, const char *prefix) {
    char err[ERR_LEN];
    r->c = tu_config();
    r->m = tu_model(&r->c, 11);
    r->pool = lora_pool_new(slots);
    r->e = engine_new(r->m, r->pool, err);
    cr_assert_not_null(r->e, "%s", err);
    r->st = tr_redis_start(prefix);
}

static void rig_close(rig_t *r) {
    store_destroy(&r->st);
    engine_destroy(&r->e);
    lora_pool_destroy(&r->pool);
    model_destroy(&r->m);
}

// A running job at version 0: its spec and a random adapter (LoRA rank `rank`, every target).
static void job_put(rig_t *r, const char *id, const char *spec, int rank, uint64_t seed) {
    char err[ERR_LEN], key[256];
    lora_t *a = tu_adapter(&r->c, rank, LORA_ALL_TARGETS, seed);
    uint8_t *blob = NULL;
    size_t len = 0;
    cr_assert_eq(lora_serialize(a, &blob, &len, err), 0, "%s", err);
    lora_destroy(&a);
    store_key(r->st, key, sizeof key, "adapter:%s:0", id);
    cr_assert_eq(store_set(r->st, key, blob, len, err), 0, "%s", err);
    free(blob);
    store_key(r->st, key, sizeof key, "job:%s", id);
    const char *f[4] = {"spec", "status", "adapter_version", "step"}, *v[4] = {spec, "running", "0", "0"};
    cr_assert_eq(store_hset(r->st, key, 4, f, v, err), 0, "%s", err);
}

// The fields of a training batch of n_groups (zeroed) groups for job, task and version.
static void batch_head(proto_batch_t *b, const char *job, uint64_t task_id, uint32_t version, int n_groups) {
    memset(b, 0, sizeof *b);
    b->task_id = task_id;
    b->job = strdup(job);
    b->adapter_version = version;
    b->kind = PROTO_KIND_TRAIN;
    b->temperature = 1.0f;
    b->n_groups = (uint32_t)n_groups;
    b->groups = calloc((size_t)n_groups, sizeof *b->groups);
}

// A scored batch of n_groups groups of G samples drawn with adapter `version`: random prompts of
// 1..6 tokens, completions of 1..7, behaviour log-probs, rewards in quarters; with env, some
// tokens of some samples are the environment's (multi-turn episodes).
static void batch_make(proto_batch_t *b, rng_t *r, const char *job, uint64_t task_id, uint32_t version, int n_groups,
                       int G, bool env) {
    batch_head(b, job, task_id, version, n_groups);
    b->gen_seconds = 0.25 * n_groups;
    for (int g = 0; g < n_groups; g++) {
        proto_group_t *pg = &b->groups[g];
        pg->index = task_id * 100 + (uint64_t)g;
        pg->n_prompt = 1 + (uint32_t)(rng_uniform(r) * 6);
        pg->prompt = malloc(sizeof(int32_t) * pg->n_prompt);
        for (uint32_t t = 0; t < pg->n_prompt; t++) pg->prompt[t] = 3 + (int32_t)(rng_uniform(r) * 37);
        pg->n_samples = (uint32_t)G;
        pg->samples = calloc((size_t)G, sizeof *pg->samples);
        for (int s = 0; s < G; s++) {
            proto_sample_t *ps = &pg->samples[s];
            ps->n = 1 + (uint32_t)(rng_uniform(r) * 7);
            ps->tokens = malloc(sizeof(int32_t) * ps->n);
            ps->logprobs = malloc(sizeof(float) * ps->n);
            for (uint32_t t = 0; t < ps->n; t++) {
                ps->tokens[t] = 3 + (int32_t)(rng_uniform(r) * 37);
                ps->logprobs[t] = -4.0f + 3.0f * rng_uniform(r);
            }
            if (env && s % 2 == 1) {
                ps->env = calloc(ps->n, 1);
                for (uint32_t t = 1; t < ps->n; t += 3) ps->env[t] = 1;
                ps->turns = 2;
            }
            ps->reward = 0.25f * (float)(int)(rng_uniform(r) * 5);
        }
    }
}

static void add(rig_t *r, tjobs_t *t, rng_t *rng, const char *job, uint64_t task_id, uint32_t version, int n_groups,
                int G, bool env) {
    proto_batch_t b;
    char err[ERR_LEN] = "";
    batch_make(&b, rng, job, task_id, version, n_groups, G, env);
    cr_assert_eq(tjobs_add(t, &b, err), 0, "tjobs_add %s task %llu: %s", job, (unsigned long long)task_id, err);
}

// The step metrics of a job (XRANGE of its stream), without the fields that measure time.
static void fp_metrics(tfp_t *f, rig_t *r, const char *id, int want_entries) {
    char key[256], err[ERR_LEN];
    store_key(r->st, key, sizeof key, "metrics:%s", id);
    redisReply *x = store_cmd(r->st, err, "XRANGE %s - +", key);
    cr_assert_not_null(x, "%s", err);
    cr_assert_eq(x->type, REDIS_REPLY_ARRAY);
    cr_assert_eq((int)x->elements, want_entries, "%s: %zu metrics entries", id, x->elements);
    for (size_t i = 0; i < x->elements; i++) {
        const redisReply *fv = x->element[i]->element[1];
        for (size_t k = 0; k + 1 < fv->elements; k += 2) {
            const char *name = fv->element[k]->str;
            if (!strcmp(name, "time") || !strcmp(name, "train_s")) continue;
            tfp_str(f, name);
            tfp_str(f, fv->element[k + 1]->str);
        }
    }
    freeReplyObject(x);
}

// The published adapter version and optimiser state of a job.
static void fp_published(tfp_t *f, rig_t *r, const char *id, uint32_t version) {
    char key[256], err[ERR_LEN];
    uint8_t *blob = NULL;
    size_t len = 0;
    store_key(r->st, key, sizeof key, "adapter:%s:%u", id, version);
    cr_assert_eq(store_get(r->st, key, &blob, &len, err), 0, "%s: %s", key, err);
    tfp_bytes(f, blob, len);
    free(blob);
    store_key(r->st, key, sizeof key, "optim:%s", id);
    cr_assert_eq(store_get(r->st, key, &blob, &len, err), 0, "%s: %s", key, err);
    tfp_bytes(f, blob, len);
    free(blob);
}

// Three steps of three jobs: "fa" and "fb" share passes, "fc" (KL, its own temperature and
// clipping) has its own; fb's episodes are multi-turn and it tolerates staleness 2; a group of fa sampled 2
// versions ago is dropped.
static uint64_t scenario(bool shared_prefix, const char *prefix, int lanes) {
    rig_t r;
    rig_open(&r, 4, prefix);
    job_put(&r, "fa", "{\"task\":\"add1\",\"prompts\":2,\"group\":3,\"lr\":0.01,\"rank\":2}", 2, 21);
    job_put(&r, "fb", "{\"task\":\"tcalc\",\"env\":{\"max_turns\":2},\"prompts\":1,\"group\":4,\"lr\":0.02,"
                      "\"rank\":3,\"std_norm\":false,\"staleness\":2}", 3, 22);
    job_put(&r, "fc", "{\"task\":\"add1\",\"prompts\":2,\"group\":2,\"lr\":0.005,\"rank\":2,\"kl\":0.1,"
                      "\"temperature\":0.8,\"clip_low\":0.1,\"clip_high\":0.15}", 2, 23);
    char err[ERR_LEN];
    tjobs_cfg_t cfg = {.max_jobs = 4, .keep_versions = 3, .optim_every = 1, .pass_rows = 4096,
                       .shared_prefix = shared_prefix, .lanes = lanes};
    tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    rng_t rng;
    rng_seed(&rng, 4242);
    tfp_t f;
    tfp_init(&f);
    uint64_t task = 1;
    for (uint32_t step = 0; step < 3; step++) {
        if (step == 2) add(&r, t, &rng, "fa", task++, 0, 1, 3, false);   // 2 versions old: dropped
        if (step == 2) add(&r, t, &rng, "fb", task++, 0, 1, 4, true);    // 2 versions old: trains
        else add(&r, t, &rng, "fb", task++, step, 1, 4, true);
        add(&r, t, &rng, "fa", task++, step, 2, 3, false);
        add(&r, t, &rng, "fc", task++, step, 1, 2, false);
        add(&r, t, &rng, "fc", task++, step, 1, 2, false);
        tjobs_result_t res[8];
        int n = tjobs_step(t, res, 8);
        cr_assert_eq(n, 3, "step %u: %d results", step, n);
        for (int i = 0; i < n; i++) {
            cr_assert(!res[i].failed, "%s: %s", res[i].job, res[i].error);
            cr_assert_eq(res[i].version, step + 1, "%s: version %u", res[i].job, res[i].version);
            tfp_str(&f, res[i].job);
            uint32_t v[4] = {res[i].step, res[i].version, res[i].consumed, res[i].dropped};
            tfp_bytes(&f, v, sizeof v);
        }
    }
    cr_assert_eq(tjobs_buffered(t), 0);
    const char *ids[3] = {"fa", "fb", "fc"};
    for (int i = 0; i < 3; i++) {
        fp_metrics(&f, &r, ids[i], 3);
        fp_published(&f, &r, ids[i], 3);
    }
    tjobs_destroy(&t);
    rig_close(&r);
    tr_redis_stop();
    return f.h;
}

Test(tjobs, step_fingerprint) {
    tfp_pin_threads();
    static const tfp_recorded_t shared[] = {
        {"gcc12/avx512f/SkylakeX", 0xee951b9267725154ull},
        {"gcc12/avx512f/SkylakeX/san", 0x9f3f98226bcfd76cull},
    };
    static const tfp_recorded_t unshared[] = {
        {"gcc12/avx512f/SkylakeX", 0x69f9c18e04cf2910ull},
        {"gcc12/avx512f/SkylakeX/san", 0x50df2841ee2aa59dull},
    };
    uint64_t a = scenario(true, "fp1:", 1), b = scenario(false, "fp2:", 1);
    tfp_expect("trainer step, shared prompts", a, shared);
    tfp_expect("trainer step, every sample whole", b, unshared);
}

// Lanes: the scenario's two passes of a step (fa with fb, fc alone) computed at once on two and
// on three lanes publish what one lane publishes, bit for bit.
Test(tjobs, lanes_compute_the_passes_one_lane_computes) {
    tfp_pin_threads();
    uint64_t one = scenario(true, "ln1:", 1);
    cr_assert_eq(scenario(true, "ln2:", 2), one, "two lanes");
    cr_assert_eq(scenario(true, "ln3:", 3), one, "three lanes");
    cr_assert_eq(scenario(false, "ln4:", 2), scenario(false, "ln5:", 1), "two lanes, every sample whole");
}

// Six jobs of one pass each (pass_rows 1), two steps' data each: a step trains one job, or with
// lanes two per lane (the first step: that many), and every job's published adapters, optimiser
// state and step metrics are those one lane computes, bit for bit. Returns their fingerprint.
static uint64_t six_jobs(int lanes, const char *prefix) {
    enum { J = 6 };
    rig_t r;
    rig_open(&r, 8, prefix);
    char err[ERR_LEN], id[16];
    for (int i = 0; i < J; i++) {
        snprintf(id, sizeof id, "s%d", i);
        job_put(&r, id, "{\"task\":\"add1\",\"prompts\":2,\"group\":3,\"lr\":0.02,\"rank\":2}", 2, 300 + (uint64_t)i);
    }
    tjobs_cfg_t cfg = {.max_jobs = 8, .keep_versions = 3, .optim_every = 1, .pass_rows = 1, .shared_prefix = true,
                       .lanes = lanes};
    tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    cr_assert_eq(t->n_lanes, lanes - 1);
    rng_t rng;
    rng_seed(&rng, 77);
    uint64_t task = 1;
    for (int i = 0; i < J; i++) {
        snprintf(id, sizeof id, "s%d", i);
        add(&r, t, &rng, id, task++, 0, 4, 3, false);   // two steps of 2 prompts, drawn with version 0
    }
    int trained = 0, first = -1, per_step = lanes > 1 ? 2 * lanes : 1;
    for (int k = 0; k < 4 * J && trained < 2 * J; k++) {
        tjobs_result_t res[8];
        int n = tjobs_step(t, res, 8);
        if (first < 0) first = n;
        cr_assert_leq(n, per_step, "a step of %d lanes trained %d jobs", lanes, n);
        for (int i = 0; i < n; i++) cr_assert(!res[i].failed && !res[i].drop_only, "%s: %s", res[i].job, res[i].error);
        trained += n;
    }
    cr_assert_eq(trained, 2 * J, "%d steps trained", trained);
    cr_assert_eq(first, per_step < J ? per_step : J, "the first step trained %d jobs on %d lanes", first, lanes);
    cr_assert_eq(tjobs_buffered(t), 0);
    tfp_t f;
    tfp_init(&f);
    for (int i = 0; i < J; i++) {
        snprintf(id, sizeof id, "s%d", i);
        fp_metrics(&f, &r, id, 2);
        fp_published(&f, &r, id, 2);
    }
    tjobs_destroy(&t);
    rig_close(&r);
    tr_redis_stop();
    return f.h;
}

Test(tjobs, lanes_take_a_pass_each) {
    tfp_pin_threads();
    uint64_t one = six_jobs(1, "sx1:");
    cr_assert_eq(six_jobs(2, "sx2:"), one, "two lanes");
    cr_assert_eq(six_jobs(3, "sx3:"), one, "three lanes");
}

// Lanes beyond the bound are refused with the setting named.
Test(tjobs, lanes_out_of_range_refused) {
    rig_t r;
    rig_open(&r, 2, "lr:");
    char err[ERR_LEN] = "";
    tjobs_cfg_t cfg = {.max_jobs = 2, .keep_versions = 2, .optim_every = 1, .pass_rows = 64, .shared_prefix = true,
                       .lanes = RL_MAX_LANES + 1};
    cr_assert_null(tjobs_new(r.e, r.st, &cfg, err));
    cr_assert(strstr(err, "lanes must be in 1..64"), "%s", err);
    rig_close(&r);
}

// More jobs than 256 (--set max_jobs): every job's slot and every pass's list of slots is sized
// from the pool. First only the job in the last slot is ready, then the 299 others at once, in one
// pass: each step trains and publishes exactly the ready jobs.
Test(tjobs, more_than_256_jobs) {
    enum { N = 300 };
    rig_t r;
    rig_open(&r, N, "many:");
    char err[ERR_LEN], id[16], spec[128];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "j%d", i);
        snprintf(spec, sizeof spec, "{\"task\":\"add1\",\"prompts\":%d,\"group\":2,\"lr\":0.01,\"rank\":1}",
                 i == N - 1 ? 1 : 2);
        job_put(&r, id, spec, 1, 1000 + (uint64_t)i);
    }
    tjobs_cfg_t cfg = {.max_jobs = N, .keep_versions = 2, .optim_every = 1, .pass_rows = 1 << 20,
                       .shared_prefix = true};
    tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    rng_t rng;
    rng_seed(&rng, 5);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "j%d", i);
        add(&r, t, &rng, id, 1, 0, 1, 2, false);
    }
    cr_assert_eq(tjobs_count(t), N);
    tjobs_result_t *res = calloc(N, sizeof *res);
    int n = tjobs_step(t, res, N);
    cr_assert_eq(n, 1, "%d results", n);
    cr_assert(!res[0].failed && !strcmp(res[0].job, "j299") && res[0].version == 1, "%s: version %u %s", res[0].job,
              res[0].version, res[0].error);
    for (int i = 0; i < N - 1; i++) {
        snprintf(id, sizeof id, "j%d", i);
        add(&r, t, &rng, id, 2, 0, 1, 2, false);
    }
    n = tjobs_step(t, res, N);
    cr_assert_eq(n, N - 1, "%d results", n);
    for (int i = 0; i < n; i++) {
        char want[16];
        snprintf(want, sizeof want, "j%d", i);
        cr_assert(!res[i].failed && !strcmp(res[i].job, want) && res[i].version == 1 && res[i].consumed == 2,
                  "result %d: %s version %u consumed %u %s", i, res[i].job, res[i].version, res[i].consumed,
                  res[i].error);
    }
    cr_assert_eq(tjobs_buffered(t), 0);
    free(res);
    tjobs_destroy(&t);
    rig_close(&r);
}

// A table of two slots holding job j1 (spec) and an rng: the start of the tests of one job's
// deliveries.
static tjobs_t *one_job(rig_t *r, const char *prefix, const char *spec, rng_t *rng, uint64_t seed) {
    char err[ERR_LEN];
    rig_open(r, 2, prefix);
    job_put(r, "j1", spec, 1, 7);
    tjobs_cfg_t cfg = {.max_jobs = 2, .keep_versions = 2, .optim_every = 1, .pass_rows = 1 << 20, .shared_prefix = true};
    tjobs_t *t = tjobs_new(r->e, r->st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    rng_seed(rng, seed);
    return t;
}

// A batch that claims an adapter version the trainer never published (a forged one: 2^32 - 1, or
// merely one ahead) is refused with the reason and trains nothing; the job's own version trains.
Test(tjobs, future_adapter_version_refused) {
    rig_t r;
    rng_t rng;
    char err[ERR_LEN];
    tjobs_t *t = one_job(&r, "future:", "{\"task\":\"add1\",\"prompts\":1,\"group\":2,\"lr\":0.01,\"rank\":1}", &rng, 9);
    uint32_t forged[2] = {UINT32_MAX, 1};
    for (int i = 0; i < 2; i++) {
        proto_batch_t b;
        err[0] = 0;
        batch_make(&b, &rng, "j1", 10 + (uint64_t)i, forged[i], 1, 2, false);
        cr_assert_eq(tjobs_add(t, &b, err), -1, "version %u accepted", forged[i]);
        cr_assert(strstr(err, "newer than the job's 0"), "%s", err);
        proto_batch_free(&b);
    }
    cr_assert_eq(tjobs_buffered(t), 0);
    add(&r, t, &rng, "j1", 20, 0, 1, 2, false);
    tjobs_result_t res[2];
    cr_assert_eq(tjobs_step(t, res, 2), 1);
    cr_assert(!res[0].failed && res[0].version == 1, "%s", res[0].error);
    tjobs_destroy(&t);
    rig_close(&r);
}

// A task's results delivered again (a replayed frame, a retried push) are ignored: the job's
// buffer holds the first delivery only, and a step consumes it once.
Test(tjobs, a_task_delivered_twice_is_used_once) {
    rig_t r;
    rng_t rng;
    char err[ERR_LEN];
    tjobs_t *t = one_job(&r, "twice:", "{\"task\":\"add1\",\"prompts\":2,\"group\":2,\"lr\":0.01,\"rank\":1}", &rng, 5);
    add(&r, t, &rng, "j1", 31, 0, 1, 2, false);
    cr_assert_eq(tjobs_buffered(t), 1);
    proto_batch_t b;
    batch_make(&b, &rng, "j1", 31, 0, 1, 2, false);
    cr_assert_eq(tjobs_add(t, &b, err), 1, "the second delivery of task 31 was taken");
    cr_assert_eq(tjobs_buffered(t), 1, "the replay joined the buffer");
    tjobs_result_t res[2];
    cr_assert_eq(tjobs_step(t, res, 2), 0, "a step of 2 prompts from one task's group and its replay");
    add(&r, t, &rng, "j1", 32, 0, 1, 2, false);
    cr_assert_eq(tjobs_step(t, res, 2), 1);
    cr_assert(!res[0].failed && res[0].version == 1, "%s", res[0].error);
    tjobs_destroy(&t);
    rig_close(&r);
}

// --- a publish whose reply is lost --------------------------------------------------------------

// A TCP relay in front of the test's redis-server that, once armed, forwards the next transaction
// (the chunk holding its "EXEC": the publish's MULTI ... EXEC) and Redis's answer to it never: it
// closes the client's connection instead, as a network cut or a killed Redis between the
// transaction's effect and its reply would.
typedef struct {
    int lfd, port;
    volatile int armed, cut, stop;
    pthread_t th;
} relay_t;

static int relay_pump(int from, int to, char *buf, size_t cap, ssize_t *got) {
    *got = read(from, buf, cap);
    if (*got <= 0) return -1;
    for (ssize_t o = 0; o < *got;) {
        ssize_t w = write(to, buf + o, (size_t)(*got - o));
        if (w <= 0) return -1;
        o += w;
    }
    return 0;
}

static void *relay_run(void *arg) {
    relay_t *rl = arg;
    static char buf[1 << 16];
    while (!rl->stop) {
        struct pollfd pa = {.fd = rl->lfd, .events = POLLIN};
        if (poll(&pa, 1, 50) <= 0) continue;
        int c = accept(rl->lfd, NULL, NULL);
        if (c < 0) continue;
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)tr_redis.port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) {
            close(c);
            if (s >= 0) close(s);
            continue;
        }
        bool held = false;   // an armed command went to Redis: its reply is swallowed, then the cut
        while (!rl->stop) {
            struct pollfd p[2] = {{.fd = c, .events = POLLIN}, {.fd = s, .events = POLLIN}};
            if (poll(p, 2, 50) <= 0) continue;
            ssize_t got;
            if (p[0].revents) {
                if (relay_pump(c, s, buf, sizeof buf, &got)) break;
                if (rl->armed && memmem(buf, (size_t)got, "EXEC", 4)) held = true, rl->armed = 0;
            }
            if (p[1].revents) {
                if (held) {
                    got = read(s, buf, sizeof buf);   // the script has run: its answer is lost
                    rl->cut++;
                    break;
                }
                if (relay_pump(s, c, buf, sizeof buf, &got)) break;
            }
        }
        close(c);
        close(s);
    }
    return NULL;
}

static void relay_open(relay_t *rl) {
    memset(rl, 0, sizeof *rl);
    rl->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(rl->lfd >= 0 && bind(rl->lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(rl->lfd, 4) == 0 &&
                  getsockname(rl->lfd, (struct sockaddr *)&a, &len) == 0,
              "relay: %s", strerror(errno));
    rl->port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&rl->th, NULL, relay_run, rl), 0);
}

static void relay_close(relay_t *rl) {
    rl->stop = 1;
    pthread_join(rl->th, NULL);
    close(rl->lfd);
}

static long long job_metric_entries(rig_t *r, const char *id) {
    char key[256], err[ERR_LEN];
    store_key(r->st, key, sizeof key, "metrics:%s", id);
    redisReply *x = store_cmd(r->st, err, "XLEN %s", key);
    cr_assert_not_null(x, "%s", err);
    long long n = x->integer;
    freeReplyObject(x);
    return n;
}

// The store client sends a command again when the connection drops before its reply (store.h).
// A step whose publish landed but whose answer was lost is therefore sent twice: it must count
// once (one metrics entry per step, the step and version advanced by one), the blobs it staged
// for the script are gone either way (renamed into place, or dropped by the resent transaction's
// script standing back), and the next step follows on.
Test(tjobs, a_publish_sent_again_after_a_lost_reply_counts_once) {
    rig_t r;
    rng_t rng;
    relay_t rl;
    char err[ERR_LEN];
    rig_open(&r, 2, "resend:");
    job_put(&r, "j1", "{\"task\":\"add1\",\"prompts\":1,\"group\":2,\"lr\":0.01,\"rank\":1}", 1, 7);
    relay_open(&rl);
    store_t *via = store_new("127.0.0.1", rl.port, "resend:", err);
    cr_assert_not_null(via, "%s", err);
    tjobs_cfg_t cfg = {.max_jobs = 2, .keep_versions = 2, .optim_every = 1, .pass_rows = 1 << 20, .shared_prefix = true};
    tjobs_t *t = tjobs_new(r.e, via, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    rng_seed(&rng, 3);
    tjobs_result_t res[2];
    for (uint32_t step = 1; step <= 2; step++) {
        add(&r, t, &rng, "j1", 40 + step, step - 1, 1, 2, false);
        rl.armed = step == 1;
        cr_assert_eq(tjobs_step(t, res, 2), 1);
        cr_assert(!res[0].failed && res[0].step == step && res[0].version == step, "step %u: %s", step, res[0].error);
        cr_assert_eq(job_metric_entries(&r, "j1"), step, "step %u: %lld metrics entries", step,
                     job_metric_entries(&r, "j1"));
        char key[256], *sv = NULL;
        size_t n = 0;
        store_key(r.st, key, sizeof key, "job:%s", "j1");
        cr_assert_eq(store_hget(r.st, key, "step", &sv, &n, err), 0, "%s", err);
        cr_assert_eq(strtoul(sv, NULL, 10), step, "stored step %s", sv);
        free(sv);
        // the job hash's token total (kept by the same script) counted each step once
        double sum = 0;
        store_key(r.st, key, sizeof key, "metrics:%s", "j1");
        store_entry_t *e = NULL;
        int ne = 0;
        cr_assert_eq(store_xrange(r.st, key, "-", 0, &e, &ne, err), 0, "%s", err);
        for (int i = 0; i < ne; i++)
            for (int q = 0; q < e[i].n; q++)
                if (!strcmp(e[i].kv[q].field, "tokens")) sum += strtod(e[i].kv[q].value, NULL);
        store_entries_free(&e, ne);
        store_key(r.st, key, sizeof key, "job:%s", "j1");
        cr_assert_eq(store_hget(r.st, key, "tokens", &sv, &n, err), 0, "%s", err);
        cr_assert(sum > 0 && strtod(sv, NULL) == sum, "step %u: job hash tokens %s, the stream's sum %g", step, sv, sum);
        free(sv);
        for (int k = 0; k < 2; k++) {
            store_key(r.st, key, sizeof key, "adapter:%s:%s", "j1", k ? "staged-optim" : "staged");
            cr_assert_eq(store_exists(r.st, key, err), 1, "step %u: %s is left in the store", step, key);
        }
        store_key(r.st, key, sizeof key, "adapter:%s:%u", "j1", step);
        cr_assert_eq(store_exists(r.st, key, err), 0, "step %u: no %s", step, key);
        store_key(r.st, key, sizeof key, "optim:%s", "j1");
        cr_assert_eq(store_exists(r.st, key, err), 0, "step %u: no %s", step, key);
    }
    cr_assert_eq(rl.cut, 1, "the relay cut %d replies", rl.cut);
    tjobs_destroy(&t);
    store_destroy(&via);
    relay_close(&rl);
    rig_close(&r);
}

// --- containment: one job's bad data fails no other job --------------------------------------

// job_put, and the job's tenant (job hash field `tenant`).
static void job_put_tenant(rig_t *r, const char *id, const char *spec, int rank, uint64_t seed, const char *tenant) {
    char err[ERR_LEN], key[256];
    job_put(r, id, spec, rank, seed);
    store_key(r->st, key, sizeof key, "job:%s", id);
    const char *f[1] = {"tenant"}, *v[1] = {tenant};
    cr_assert_eq(store_hset(r->st, key, 1, f, v, err), 0, "%s", err);
}

static const char *job_status(rig_t *r, const char *id) {
    static char st[32];
    char key[256], err[ERR_LEN], *v = NULL;
    store_key(r->st, key, sizeof key, "job:%s", id);
    cr_assert_eq(store_hget(r->st, key, "status", &v, NULL, err), 0, "%s", err);
    snprintf(st, sizeof st, "%s", v);
    free(v);
    return st;
}

// The ways a producer that is not ours spoils a batch of 1 group of 2 samples (batch_make with
// prompts of 1 and staleness 1), and what the refusal must say.
enum { SPOIL_N = 12 };
static const struct {
    const char *what, *says;
    bool sample;   // the refusal names group 0 sample 1
} spoils[SPOIL_N] = {
    {"a completion token outside the vocabulary", "completion token tok[", true},
    {"a prompt token outside the vocabulary", "prompt token p[0] = 41 is outside the vocabulary (0..40)", false},
    {"a negative token", "completion token tok[0] = -1", true},
    {"a NaN log-prob", "log-prob lp[0] = nan", true},
    {"an infinite log-prob", "log-prob lp[0] = -inf", true},
    {"a positive log-prob", "log-prob lp[0] = 0.5", true},
    {"a NaN reward", "reward r = nan", true},
    {"a reward above 1", "reward r = 2", true},
    {"three samples in a group of two", "3 samples, the job's group size is 2", false},
    {"an empty completion", "the completion (tok) is empty", true},
    {"more tokens than the model's context", "exceed the model's context (128)", true},
    {"an environment token in a single-turn job", "environment token in a single-turn job", true},
};

static void spoil(proto_batch_t *b, rng_t *rng, int kind, const char *job, uint64_t task, uint32_t version) {
    batch_make(b, rng, job, task, version, 1, kind == 8 ? 3 : 2, false);
    proto_sample_t *s = &b->groups[0].samples[1];
    switch (kind) {
    case 0: s->tokens[s->n - 1] = 41 + 1000; break;
    case 1: b->groups[0].prompt[0] = 41; break;
    case 2: s->tokens[0] = -1; break;
    case 3: s->logprobs[0] = NAN; break;
    case 4: s->logprobs[0] = -INFINITY; break;
    case 5: s->logprobs[0] = 0.5f; break;
    case 6: s->reward = NAN; break;
    case 7: s->reward = 2.0f; break;
    case 8: break;
    case 9: s->n = 0; break;
    case 10:
        s->tokens = realloc(s->tokens, sizeof(int32_t) * 128);
        s->logprobs = realloc(s->logprobs, sizeof(float) * 128);
        for (uint32_t q = s->n; q < 128; q++) s->tokens[q] = 5, s->logprobs[q] = -1.0f;
        s->n = 128;
        break;
    case 11:
        s->env = calloc(s->n, 1);
        s->env[s->n - 1] = 1;
        break;
    }
}

// Job ja (tenant A) gets a batch spoiled in each way a broken or hostile producer could spoil
// it, beside good batches of its own and of jb (tenant B). Each bad batch is refused naming the
// job, task, group, sample and field, is counted, and is not remembered as seen (the task's good
// delivery trains); every step then trains and publishes both jobs. Eight bad batches of ja in a
// row, no good one between, fail ja at the next step, and jb trains in that same step.
Test(tjobs, invalid_batches_are_refused_and_fail_no_other_job) {
    rig_t r;
    rig_open(&r, 4, "bad:");
    char err[ERR_LEN];
    const char *spec = "{\"task\":\"add1\",\"prompts\":1,\"group\":2,\"lr\":0.01,\"rank\":1,\"staleness\":1}";
    job_put_tenant(&r, "ja", spec, 1, 31, "A");
    job_put_tenant(&r, "jb", spec, 1, 32, "B");
    tjobs_cfg_t cfg = {.max_jobs = 4, .keep_versions = 2, .optim_every = 1, .pass_rows = 1 << 20, .shared_prefix = true};
    tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    rng_t rng;
    rng_seed(&rng, 77);
    uint64_t task = 100;
    for (int k = 0; k < SPOIL_N + 1; k++) {
        uint32_t v = (uint32_t)k;
        proto_batch_t b;
        if (k < SPOIL_N) {
            spoil(&b, &rng, k, "ja", task, v);
            err[0] = 0;
            cr_assert_eq(tjobs_add(t, &b, err), TJOBS_INVALID, "%s: not refused as invalid (%s)", spoils[k].what, err);
            proto_batch_free(&b);
            char where[96];
            snprintf(where, sizeof where, "invalid data: job ja task %llu group 0%s", (unsigned long long)task,
                     spoils[k].sample ? " sample 1: " : ": ");
            cr_assert(strstr(err, where) && strstr(err, spoils[k].says), "%s: the refusal says '%s'", spoils[k].what, err);
        } else {
            // too many groups: more than (staleness + 1) x prompts
            batch_make(&b, &rng, "ja", task, v, 3, 2, false);
            cr_assert_eq(tjobs_add(t, &b, err), TJOBS_INVALID);
            proto_batch_free(&b);
            cr_assert(strstr(err, "3 groups, more than the job may have in flight"), "%s", err);
        }
        cr_assert_eq(tjobs_buffered(t), 0, "%s: something of the refused batch was kept", k < SPOIL_N ? spoils[k].what : "groups");
        // the same task, delivered correctly, trains
        add(&r, t, &rng, "ja", task++, v, 1, 2, false);
        add(&r, t, &rng, "jb", task++, v, 1, 2, false);
        tjobs_result_t res[4];
        int n = tjobs_step(t, res, 4);
        cr_assert_eq(n, 2, "after %s: %d results", k < SPOIL_N ? spoils[k].what : "groups", n);
        for (int i = 0; i < n; i++)
            cr_assert(!res[i].failed && res[i].version == v + 1, "after %s: %s failed or at version %u: %s",
                      k < SPOIL_N ? spoils[k].what : "too many groups", res[i].job, res[i].version, res[i].error);
    }
    // eight in a row fail ja, and only ja
    uint32_t v = SPOIL_N + 1;
    for (int k = 0; k < BAD_RUN; k++) {
        proto_batch_t b;
        spoil(&b, &rng, k % SPOIL_N, "ja", task++, v);
        cr_assert_eq(tjobs_add(t, &b, err), TJOBS_INVALID);
        proto_batch_free(&b);
        cr_assert(k < BAD_RUN - 1 || strstr(err, "the job fails"), "%s", err);
    }
    add(&r, t, &rng, "jb", task++, v, 1, 2, false);
    tjobs_result_t res[4];
    int n = tjobs_step(t, res, 4);
    cr_assert_eq(n, 2, "%d results", n);
    cr_assert(!strcmp(res[0].job, "ja") && res[0].failed && strstr(res[0].error, "8 scored batches in a row"), "%s: %s",
              res[0].job, res[0].error);
    cr_assert(!strcmp(res[1].job, "jb") && !res[1].failed && res[1].version == v + 1, "%s: %s", res[1].job, res[1].error);
    cr_assert_str_eq(job_status(&r, "ja"), "failed");
    cr_assert_str_eq(job_status(&r, "jb"), "running");
    // what still arrives for the failed job is ignored
    proto_batch_t b;
    batch_make(&b, &rng, "ja", task++, v, 1, 2, false);
    cr_assert_eq(tjobs_add(t, &b, err), 1);
    cr_assert_eq(tjobs_count(t), 1);
    tjobs_destroy(&t);
    rig_close(&r);
}

// The published adapter and optimiser state of a job, fingerprinted.
static uint64_t published(rig_t *r, const char *id, uint32_t version) {
    tfp_t f;
    tfp_init(&f);
    fp_published(&f, r, id, version);
    return f.h;
}

// Data the engine refuses that got past check_batch (the test writes a token outside the
// vocabulary into job ja's buffered group, as a gap in the checks would let through) makes the
// shared pass of ja, jb and jc fail. Only ja fails: jb and jc are trained again alone and publish
// exactly what they publish when trained alone from the start (the refused pass left their
// gradients, optimiser states and adapters as they were).
Test(tjobs, a_refused_shared_pass_fails_only_its_culprit) {
    rig_t r;
    rig_open(&r, 4, "cul:");
    char err[ERR_LEN];
    const char *spec = "{\"task\":\"add1\",\"prompts\":2,\"group\":3,\"lr\":0.02,\"rank\":2}";
    uint64_t fp[2][2];
    for (int run = 0; run < 2; run++) {
        // run 0: ja, jb, jc in one pass, ja spoiled; run 1 (under another key prefix): jb and jc
        // alone, each in a pass of its own (pass_rows 1), from the same adapters and data
        if (run == 1) {
            store_destroy(&r.st);
            r.st = store_new("127.0.0.1", tr_redis.port, "cul2:", err);
            cr_assert_not_null(r.st, "%s", err);
        }
        if (run == 0) job_put(&r, "ja", spec, 2, 41);
        job_put(&r, "jb", spec, 2, 42);
        job_put(&r, "jc", spec, 2, 43);
        tjobs_cfg_t cfg = {.max_jobs = 4, .keep_versions = 2, .optim_every = 1, .pass_rows = run ? 1 : 1 << 20,
                           .shared_prefix = true};
        tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
        cr_assert_not_null(t, "%s", err);
        rng_t rng;
        rng_seed(&rng, 99);
        proto_batch_t b;
        if (run == 0) add(&r, t, &rng, "ja", 1, 0, 2, 3, false);
        else batch_make(&b, &rng, "ja", 1, 0, 2, 3, false), proto_batch_free(&b);   // the same data for jb, jc
        add(&r, t, &rng, "jb", 2, 0, 2, 3, false);
        add(&r, t, &rng, "jc", 3, 0, 2, 3, false);
        tjobs_result_t res[4];
        int n = 0;
        if (run == 0) {
            tjob_t *ja = find(t, "ja");
            ja->buf[1].samples[2].tokens[0] = 41 + 7;
            n = tjobs_step(t, res, 4);
            cr_assert_eq(n, 3, "%d results", n);
            cr_assert(!strcmp(res[0].job, "ja") && res[0].failed && strstr(res[0].error, "outside the vocabulary"),
                      "%s: %s", res[0].job, res[0].error);
            cr_assert_str_eq(job_status(&r, "ja"), "failed");
        } else {
            n = tjobs_step(t, res, 4);
            cr_assert_eq(n, 1, "pass_rows 1: one job a pass");
            n += tjobs_step(t, res + 1, 3);
            cr_assert_eq(n, 2);
        }
        for (int i = run ? 0 : 1; i < n; i++)
            cr_assert(!res[i].failed && res[i].version == 1, "run %d: %s: %s", run, res[i].job, res[i].error);
        fp[run][0] = published(&r, "jb", 1);
        fp[run][1] = published(&r, "jc", 1);
        cr_assert_str_eq(job_status(&r, "jb"), "running");
        tjobs_destroy(&t);
    }
    cr_assert_eq(fp[0][0], fp[1][0], "jb's published state differs from jb trained alone");
    cr_assert_eq(fp[0][1], fp[1][1], "jc's published state differs from jc trained alone");
    rig_close(&r);
}

// --- fair share of the passes ---------------------------------------------------------------

// A scored batch of n_groups groups of G samples of fixed sizes: prompts of P tokens, completions
// of C, so that every job's step has the same rows.
static void batch_fixed(proto_batch_t *b, const char *job, uint64_t task_id, uint32_t version, int n_groups, int G,
                        int P, int C) {
    batch_head(b, job, task_id, version, n_groups);
    for (int g = 0; g < n_groups; g++) {
        proto_group_t *pg = &b->groups[g];
        pg->n_prompt = (uint32_t)P;
        pg->prompt = malloc(sizeof(int32_t) * (size_t)P);
        for (int q = 0; q < P; q++) pg->prompt[q] = 3 + (int32_t)((task_id * 7 + (uint64_t)g * 5 + (uint64_t)q) % 37);
        pg->n_samples = (uint32_t)G;
        pg->samples = calloc((size_t)G, sizeof *pg->samples);
        for (int s = 0; s < G; s++) {
            proto_sample_t *ps = &pg->samples[s];
            ps->n = (uint32_t)C;
            ps->tokens = malloc(sizeof(int32_t) * (size_t)C);
            ps->logprobs = malloc(sizeof(float) * (size_t)C);
            for (int q = 0; q < C; q++) ps->tokens[q] = 3 + (s * 11 + q * 3) % 37, ps->logprobs[q] = -1.5f;
            ps->reward = (float)(s % 2);
        }
    }
}

// Gives every job of ids[] that has no batch buffered its next one.
static void refill(tjobs_t *t, const char *const *ids, int n, uint64_t *task) {
    char err[ERR_LEN];
    for (int i = 0; i < n; i++) {
        tjob_t *j = find(t, ids[i]);
        if (j && j->n_buf > 0) continue;
        proto_batch_t b;
        batch_fixed(&b, ids[i], (*task)++, j ? j->version : 0, 1, 2, 4, 6);
        cr_assert_eq(tjobs_add(t, &b, err), 0, "%s: %s", ids[i], err);
    }
}

static int tenants_in_use(const tjobs_t *t) {
    int n = 0, refs = 0;
    for (int i = 0; i < t->cfg.max_jobs; i++) n += t->tinfo[i].refs > 0, refs += t->tinfo[i].refs;
    cr_assert_eq(refs, tjobs_count(t), "tenant references %d, jobs held %d", refs, tjobs_count(t));
    return n;
}

// Tenant A's four jobs and tenant B's one, all ready at every step: each step trains one of A's
// and B's (B half the steps, not a fifth); with tenant:A's weight set to 3 in Redis, three of A's
// per B's one. Jobs come and go through two slots without leaving tenant entries behind.
Test(tjobs, passes_are_fair_per_tenant) {
    rig_t r;
    rig_open(&r, 8, "fair:");
    char err[ERR_LEN];
    const char *spec = "{\"task\":\"add1\",\"prompts\":1,\"group\":2,\"lr\":0.01,\"rank\":1}";
    const char *ids[5] = {"a1", "a2", "a3", "a4", "b1"};
    for (int i = 0; i < 5; i++) job_put_tenant(&r, ids[i], spec, 1, 50 + (uint64_t)i, i < 4 ? "A" : "B");
    tjobs_cfg_t cfg = {.max_jobs = 8, .keep_versions = 2, .optim_every = 1, .pass_rows = 1 << 20, .shared_prefix = true};
    tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    uint64_t task = 1;
    long steps[5] = {0};
    tjobs_result_t res[8];
    for (int round = 0; round < 12; round++) {
        refill(t, ids, 5, &task);
        int n = tjobs_step(t, res, 8);
        cr_assert_eq(n, 2, "round %d: %d jobs stepped", round, n);
        for (int i = 0; i < n; i++) {
            cr_assert(!res[i].failed, "%s: %s", res[i].job, res[i].error);
            for (int k = 0; k < 5; k++) steps[k] += !strcmp(res[i].job, ids[k]);
        }
        cr_assert(steps[4] == round + 1, "round %d: B's job stepped %ld times", round, steps[4]);
    }
    for (int k = 0; k < 4; k++) cr_assert_eq(steps[k], 3, "A's job %s: %ld steps of 12", ids[k], steps[k]);
    cr_assert_eq(tenants_in_use(t), 2);
    // tenant A's weight 3, read again once the trainer's copy is old
    char key[256];
    store_key(r.st, key, sizeof key, "tenant:A");
    const char *f[1] = {"weight"}, *v[1] = {"3"};
    cr_assert_eq(store_hset(r.st, key, 1, f, v, err), 0, "%s", err);
    for (int i = 0; i < cfg.max_jobs; i++) t->tinfo[i].weight_read -= TENANT_WEIGHT_S;
    long a = 0, b = 0;
    for (int round = 0; round < 12; round++) {
        refill(t, ids, 5, &task);
        int n = tjobs_step(t, res, 8);
        for (int i = 0; i < n; i++) *(!strcmp(res[i].job, "b1") ? &b : &a) += 1;
    }
    cr_assert(b == 12 && a >= 35 && a <= 37, "weights 3:1: A stepped %ld times, B %ld", a, b);
    tjobs_destroy(&t);
    // two slots, jobs of five tenants one after another: an idle job is evicted for the next,
    // and its tenant's entry goes with its last job
    cfg.max_jobs = 2;
    t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    for (int i = 0; i < 5; i++) {
        char id[16], ten[16];
        snprintf(id, sizeof id, "x%d", i);
        snprintf(ten, sizeof ten, "T%d", i);
        job_put_tenant(&r, id, spec, 1, 60 + (uint64_t)i, ten);
        const char *one[1] = {id};
        refill(t, one, 1, &task);
        cr_assert_eq(tjobs_step(t, res, 8), 1);
        cr_assert_leq(tenants_in_use(t), 2);
    }
    cr_assert_eq(tenants_in_use(t), 2);
    tjobs_destroy(&t);
    rig_close(&r);
}

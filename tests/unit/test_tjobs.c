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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/testbits.h"
#include "tests/unit/testfp.h"
#include "tests/unit/testutil.h"

// The trainer's step is not part of the library: the test compiles it in.
#include "services/trainer/jobs.c"

// --- a private redis-server ------------------------------------------------------------------

static struct {
    char bin[4096], dir[64];
    int port;
    pid_t pid;
} rs;

static void rs_stop(void) {
    if (rs.pid > 0) {
        kill(rs.pid, SIGKILL);
        waitpid(rs.pid, NULL, 0);
    }
    rs.pid = 0;
    if (!rs.dir[0]) return;
    DIR *d = opendir(rs.dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            snprintf(p, sizeof p, "%s/%s", rs.dir, e->d_name), unlink(p);
    if (d) closedir(d);
    rmdir(rs.dir);
    rs.dir[0] = 0;
}

// Starts redis-server (REDIS_SERVER, else the PATH's) and returns a store on it, keys under prefix.
static store_t *rs_start(const char *prefix) {
    const char *env = getenv("REDIS_SERVER");
    if (env && *env) snprintf(rs.bin, sizeof rs.bin, "%s", env);
    else {
        char dirs[8192], *save = NULL;
        snprintf(dirs, sizeof dirs, "%s", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
        rs.bin[0] = 0;
        for (char *d = strtok_r(dirs, ":", &save); d && !rs.bin[0]; d = strtok_r(NULL, ":", &save)) {
            snprintf(rs.bin, sizeof rs.bin, "%s/redis-server", d);
            if (access(rs.bin, X_OK)) rs.bin[0] = 0;
        }
    }
    cr_assert(rs.bin[0] && access(rs.bin, X_OK) == 0,
              "redis-server not found (PATH or $REDIS_SERVER): the trainer tests need a real Redis "
              "(Debian: apt-get install redis-server)");
    snprintf(rs.dir, sizeof rs.dir, "/tmp/marlaas-tjobs-XXXXXX");
    cr_assert_not_null(mkdtemp(rs.dir), "mkdtemp: %s", strerror(errno));
    char err[ERR_LEN];
    for (int attempt = 0; attempt < 3; attempt++) {
        rs.port = tu_free_port();
        char port[16], logf[128];
        snprintf(port, sizeof port, "%d", rs.port);
        snprintf(logf, sizeof logf, "%s/redis.log", rs.dir);
        char *argv[] = {rs.bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", rs.dir, "--logfile", logf, "--daemonize", "no", NULL};
        pid_t parent = getpid();
        rs.pid = fork();
        cr_assert_geq(rs.pid, 0, "fork: %s", strerror(errno));
        if (rs.pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            int fd = open("/dev/null", O_RDWR);
            if (fd >= 0) dup2(fd, 0), dup2(fd, 1);
            execv(rs.bin, argv);
            _exit(127);
        }
        for (double t0 = util_now(); util_now() - t0 < 10 && waitpid(rs.pid, NULL, WNOHANG) == 0;) {
            store_t *st = store_new("127.0.0.1", rs.port, prefix, err);
            if (st && store_ping(st, err) == 0) return st;
            store_destroy(&st);
            usleep(10000);
        }
        kill(rs.pid, SIGKILL);
        waitpid(rs.pid, NULL, 0);
        rs.pid = 0;
    }
    cr_assert_fail("redis-server (%s) did not start (its log: %s/redis.log)", rs.bin, rs.dir);
    return NULL;
}

static void fini(void) { rs_stop(); }

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
    r->st = rs_start(prefix);
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

// A scored batch of n_groups groups of G samples drawn with adapter `version`: random prompts of
// 1..6 tokens, completions of 1..7, behaviour log-probs, rewards in quarters; with env, some
// tokens of some samples are the environment's (multi-turn episodes).
static void batch_make(proto_batch_t *b, rng_t *r, const char *job, uint64_t task_id, uint32_t version, int n_groups,
                       int G, bool env) {
    memset(b, 0, sizeof *b);
    b->task_id = task_id;
    b->job = strdup(job);
    b->adapter_version = version;
    b->kind = PROTO_KIND_TRAIN;
    b->temperature = 1.0f;
    b->gen_seconds = 0.25 * n_groups;
    b->n_groups = (uint32_t)n_groups;
    b->groups = calloc((size_t)n_groups, sizeof *b->groups);
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
static uint64_t scenario(bool shared_prefix, const char *prefix) {
    rig_t r;
    rig_open(&r, 4, prefix);
    job_put(&r, "fa", "{\"task\":\"add1\",\"prompts\":2,\"group\":3,\"lr\":0.01,\"rank\":2}", 2, 21);
    job_put(&r, "fb", "{\"task\":\"add1\",\"prompts\":1,\"group\":4,\"lr\":0.02,\"rank\":3,\"std_norm\":false,"
                      "\"staleness\":2}", 3, 22);
    job_put(&r, "fc", "{\"task\":\"add1\",\"prompts\":2,\"group\":2,\"lr\":0.005,\"rank\":2,\"kl\":0.1,"
                      "\"temperature\":0.8,\"clip_low\":0.1,\"clip_high\":0.15}", 2, 23);
    char err[ERR_LEN];
    tjobs_cfg_t cfg = {.max_jobs = 4, .keep_versions = 3, .optim_every = 1, .pass_rows = 4096,
                       .shared_prefix = shared_prefix};
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
    rs_stop();
    return f.h;
}

Test(tjobs, step_fingerprint) {
    tfp_pin_threads();
    static const tfp_recorded_t shared[] = {
        {"gcc12/avx512f/SkylakeX", 0xb74668d65f4b5e94ull},
        {"gcc12/avx512f/SkylakeX/san", 0x57d962ca8b2300ecull},
    };
    static const tfp_recorded_t unshared[] = {
        {"gcc12/avx512f/SkylakeX", 0x0c825d10ef5f565eull},
        {"gcc12/avx512f/SkylakeX/san", 0x67bb3a1e2d5645b9ull},
    };
    uint64_t a = scenario(true, "fp1:"), b = scenario(false, "fp2:");
    tfp_expect("trainer step, shared prompts", a, shared);
    tfp_expect("trainer step, every sample whole", b, unshared);
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

// A batch that claims an adapter version the trainer never published (a forged one: 2^32 - 1, or
// merely one ahead) is refused with the reason and trains nothing; the job's own version trains.
Test(tjobs, future_adapter_version_refused) {
    rig_t r;
    rig_open(&r, 2, "future:");
    char err[ERR_LEN];
    job_put(&r, "j1", "{\"task\":\"add1\",\"prompts\":1,\"group\":2,\"lr\":0.01,\"rank\":1}", 1, 7);
    tjobs_cfg_t cfg = {.max_jobs = 2, .keep_versions = 2, .optim_every = 1, .pass_rows = 1 << 20, .shared_prefix = true};
    tjobs_t *t = tjobs_new(r.e, r.st, &cfg, err);
    cr_assert_not_null(t, "%s", err);
    rng_t rng;
    rng_seed(&rng, 9);
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

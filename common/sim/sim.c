// sim.c - the simulated backend's device model, cost model, lengths and learning curves (sim.h).
#include "common/sim/sim.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "common/util/log.h"
#include "common/util/util.h"

// The compiled-in params.json (build/gen/sim_params.c, from common/sim/params.json).
extern const unsigned char sim_params_json[];
extern const size_t sim_params_json_len;

struct sim {
    sim_device_t d;
    hf_config_t m;
    double scale;
    int devices;
    sim_lengths_t len;
    double modelled;
    double cpu_mark;     // the calling thread's CPU time at the end of the last sim_wait
    double deadline;     // CLOCK_MONOTONIC time the last modelled step ended
    double late;         // wall seconds the sleeps overslept, not yet taken off a later step
    double deferred;     // modelled seconds of steps counted by sim_defer, not yet waited for
    double coalesce_s;   // wall seconds of decode steps one generator call may run (0: one step)
    double last_len;     // wall length of the last modelled step
    double hidden;       // host seconds overlapped with modelled time
    bool slack_set;
    int host_slot;       // shared_cores: this simulator's entry in the host table, -1 before the first step
    double others;       // shared_cores: the other computations on the cores (host_others), read at load_read
    int64_t stat_t;      // shared_cores: when the machine's CPU time was last read (/proc/stat)
    double stat_busy;    // the machine's busy CPU seconds then (-1: unreadable)
    double stat_own;     // this thread's CPU seconds then
    double demand;       // the other tasks' CPU demand in cores, averaged over about DEMAND_TAU_S, times
    double demand_w;     // this weight (the average's weight so far: the readings' span counts)
    bool stat_warned;
    int64_t load_read;
    double load;         // shared_cores: the fraction of time in steps, over about LOAD_TAU_S
    int64_t load_t;      // when load was last brought up to date
};

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// --- parameters -------------------------------------------------------------------------------------

// The compiled-in file and the MARLAAS_SIM_PARAMS one (NULL when unset), parsed once.
static cJSON *builtin_root, *user_root;
static char user_error[ERR_LEN];
static pthread_once_t params_once = PTHREAD_ONCE_INIT;

static void params_load(void) {
    builtin_root = cJSON_ParseWithLength((const char *)sim_params_json, sim_params_json_len);
    ASSERT(builtin_root != NULL);
    const char *path = getenv("MARLAAS_SIM_PARAMS");
    if (!path || !path[0]) return;
    char err[ERR_LEN];
    char *text = util_read_file(path, NULL, err);
    if (!text) {
        snprintf(user_error, sizeof user_error, "MARLAAS_SIM_PARAMS: %.200s", err);
        return;
    }
    user_root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(user_root))
        snprintf(user_error, sizeof user_error, "MARLAAS_SIM_PARAMS %s: not a JSON object", path);
}

static const char *params_error(void) {
    pthread_once(&params_once, params_load);
    return user_error[0] ? user_error : NULL;
}

const char *sim_params_text(size_t *len) {
    if (len) *len = sim_params_json_len;
    return (const char *)sim_params_json;
}

// Entry `name` of a section, the user file's first (case-insensitive names).
static const cJSON *entry(const char *section, const char *name, bool *user) {
    pthread_once(&params_once, params_load);
    const cJSON *roots[2] = {user_root, builtin_root};
    for (int i = 0; i < 2; i++) {
        const cJSON *sec = roots[i] ? cJSON_GetObjectItemCaseSensitive(roots[i], section) : NULL;
        const cJSON *e;
        cJSON_ArrayForEach(e, sec) {
            if (e->string && !strcasecmp(e->string, name) && cJSON_IsObject(e)) {
                if (user) *user = i == 0;
                return e;
            }
        }
    }
    return NULL;
}

static void known_names(const char *section, char *out, size_t n) {
    out[0] = 0;
    const cJSON *roots[2] = {user_root, builtin_root};
    size_t used = 0;
    for (int i = 0; i < 2; i++) {
        const cJSON *sec = roots[i] ? cJSON_GetObjectItemCaseSensitive(roots[i], section) : NULL;
        const cJSON *e;
        cJSON_ArrayForEach(e, sec) {
            if (!cJSON_IsObject(e) || !e->string) continue;
            int w = snprintf(out + used, n - used, "%s%s", used ? ", " : "", e->string);
            if (w < 0 || (size_t)w >= n - used) return;
            used += (size_t)w;
        }
    }
}

// A device figure: the device's own, else the user file's defaults, else the built-in defaults.
static int number(const cJSON *dev, const char *key, bool required, double *out, char *err) {
    const cJSON *roots[2] = {user_root, builtin_root};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(dev, key);
    for (int i = 0; !v && !required && i < 2; i++) {
        const cJSON *def = roots[i] ? cJSON_GetObjectItemCaseSensitive(roots[i], "defaults") : NULL;
        v = def ? cJSON_GetObjectItemCaseSensitive(def, key) : NULL;
    }
    if (!v) return err_set(err, "device %s: no \"%s\"", dev->string, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite(v->valuedouble))
        return err_set(err, "device %s: \"%s\" must be a finite number >= 0", dev->string, key);
    *out = v->valuedouble;
    return 0;
}

static int device_read(const cJSON *dev, sim_device_t *d, char *err) {
    static const char *keys[] = {"description", "source", "flops", "bandwidth", "memory", "link_bandwidth",
                                 "weight_bytes", "gemm_efficiency", "gemm_half_rows", "bandwidth_efficiency",
                                 "attention_efficiency", "launch_us", "step_overhead_us", "link_latency_us",
                                 "activation_reserve", "backward_efficiency", "host_overlap", "shared_cores"};
    const cJSON *f;
    cJSON_ArrayForEach(f, dev) {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) known |= !strcmp(f->string, keys[i]);
        if (!known) return err_set(err, "device %s: unknown parameter \"%s\"", dev->string, f->string);
    }
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", dev->string);
    double launch_us, step_us, lat_us;
    if (number(dev, "flops", true, &d->flops, err) || number(dev, "bandwidth", true, &d->bandwidth, err) ||
        number(dev, "memory", true, &d->memory, err) || number(dev, "link_bandwidth", true, &d->link_bandwidth, err) ||
        number(dev, "weight_bytes", true, &d->weight_bytes, err) ||
        number(dev, "gemm_efficiency", false, &d->gemm_efficiency, err) ||
        number(dev, "gemm_half_rows", false, &d->gemm_half_rows, err) ||
        number(dev, "bandwidth_efficiency", false, &d->bandwidth_efficiency, err) ||
        number(dev, "attention_efficiency", false, &d->attention_efficiency, err) ||
        number(dev, "launch_us", false, &launch_us, err) || number(dev, "step_overhead_us", false, &step_us, err) ||
        number(dev, "link_latency_us", false, &lat_us, err) ||
        number(dev, "activation_reserve", false, &d->activation_reserve, err) ||
        number(dev, "backward_efficiency", false, &d->backward_efficiency, err) ||
        number(dev, "host_overlap", false, &d->host_overlap, err) ||
        number(dev, "shared_cores", false, &d->shared_cores, err))
        return -1;
    if (d->shared_cores != floor(d->shared_cores) || d->shared_cores > 4096 || (d->shared_cores > 0 && d->host_overlap))
        return err_set(err, "device %s: shared_cores must be a whole number of cores in 0..4096, and 0 with host_overlap "
                       "(a CPU computes host and device work in turn)", d->name);
    if (!(d->flops > 0 && d->bandwidth > 0 && d->memory > 0 && d->link_bandwidth > 0))
        return err_set(err, "device %s: flops, bandwidth, memory and link_bandwidth must be > 0", d->name);
    if (d->weight_bytes != 2 && d->weight_bytes != 4)
        return err_set(err, "device %s: weight_bytes must be 2 (bf16) or 4 (fp32)", d->name);
    if (!(d->gemm_efficiency > 0 && d->gemm_efficiency <= 1 && d->bandwidth_efficiency > 0 &&
          d->bandwidth_efficiency <= 1 && d->attention_efficiency > 0 && d->attention_efficiency <= 1 &&
          d->backward_efficiency > 0 && d->backward_efficiency <= 4 && (d->host_overlap == 0 || d->host_overlap == 1) &&
          d->activation_reserve < 1))
        return err_set(err, "device %s: efficiencies must be in (0, 1] (backward_efficiency, relative to the model's "
                       "backward, in (0, 4]) and activation_reserve below 1", d->name);
    d->launch_s = launch_us * 1e-6;
    d->step_overhead_s = step_us * 1e-6;
    d->link_latency_s = lat_us * 1e-6;
    return 0;
}

int sim_lengths_parse(const char *spec, sim_lengths_t *out, char *err) {
    double a = 0, b = 0;
    char tail;
    if (sscanf(spec, "lognormal:%lf,%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= 0 && b <= 4)
        *out = (sim_lengths_t){SIM_LEN_LOGNORMAL, a, b};
    else if (sscanf(spec, "fixed:%lf%c", &a, &tail) == 1 && a >= 1 && a <= 1e6)
        *out = (sim_lengths_t){SIM_LEN_FIXED, a, a};
    else if (sscanf(spec, "uniform:%lf,%lf%c", &a, &b, &tail) == 2 && a >= 1 && b >= a && b <= 1e6)
        *out = (sim_lengths_t){SIM_LEN_UNIFORM, a, b};
    else
        return err_set(err, "completion lengths '%s': use lognormal:MEDIAN,SIGMA (MEDIAN >= 1, SIGMA in 0..4), "
                       "fixed:N or uniform:A,B (1 <= A <= B)", spec);
    return 0;
}

static sim_t *sim_new(const sim_device_t *d, const hf_config_t *mc, const sim_opts_t *o, char *err);

sim_t *sim_open_with(const sim_device_t *d, const hf_config_t *mc, const sim_opts_t *o, char *err) {
    return sim_new(d, mc, o, err);
}

sim_t *sim_open(const char *name, const hf_config_t *mc, const sim_opts_t *o, char *err) {
    const char *pe = params_error();
    if (pe) {
        err_set(err, "%s", pe);
        return NULL;
    }
    const cJSON *dev = entry("devices", name, NULL);
    if (!dev) {
        char known[512];
        known_names("devices", known, sizeof known);
        err_set(err, "unknown simulated device '%s' (known: %s; more in a file named by MARLAAS_SIM_PARAMS)", name, known);
        return NULL;
    }
    sim_device_t d;
    if (device_read(dev, &d, err)) return NULL;
    return sim_new(&d, mc, o, err);
}

static sim_t *sim_new(const sim_device_t *d, const hf_config_t *mc, const sim_opts_t *o, char *err) {
    sim_t *s = xcalloc(1, sizeof *s);
    s->d = *d;
    s->host_slot = -1;
    s->m = *mc;
    s->scale = o && o->scale > 0 ? o->scale : 60.0;
    if (o && !(o->scale >= 0 && o->scale <= 1e6)) {
        err_set(err, "time scale %g: must be in (0, 1e6]", o->scale);
        goto fail;
    }
    s->devices = o && o->devices > 1 ? o->devices : 1;
    s->coalesce_s = d->shared_cores > 0 || (o && o->coalesce_s < 0) ? 0.0 : o && o->coalesce_s > 0 ? o->coalesce_s : 1e-3;
    if (o && (o->devices < 0 || o->devices > 4096)) {
        err_set(err, "devices %d: must be in 1..4096", o->devices);
        goto fail;
    }
    if (o && o->weight_bytes) {
        if (o->weight_bytes != 2 && o->weight_bytes != 4) {
            err_set(err, "weight bytes %d: 2 (bf16) or 4 (fp32)", o->weight_bytes);
            goto fail;
        }
        s->d.weight_bytes = o->weight_bytes;
    }
    if (sim_lengths_parse(o && o->lengths && o->lengths[0] ? o->lengths : "lognormal:200,0.8", &s->len, err)) goto fail;
    return s;
fail:
    free(s);
    return NULL;
}

// --- a CPU shared with the machine's other processes (shared_cores) --------------------------------

// Every simulator of a shared-cores device on this machine (all users' clusters of this uid) keeps
// an entry in one table in shared memory: its pid and until when its modelled step holds a core. A
// step then counts the CPU demand of the machine's other tasks (their CPU time per second, in
// cores, from /proc/stat less the calling thread's own, averaged over about a quarter of a second)
// and the other simulators computing, and runs at 1 / (1 + others / cores) of its speed: each other
// computation sits on the step's core with probability 1 / cores and takes its turn there. That is
// how the kernel's scheduler treats a CPU-bound service beside woken ones (run queues are balanced
// lazily, a woken task preempts the running one): measured on 2 cores, the real trainer waits in
// its run queue for a fifth to a quarter of its CPU time while the services' demand averages about
// 1.1 cores, where an ideal share of the 2 cores would let it run undisturbed. An average, not a
// count of the tasks runnable when the step starts: nearly every step starts just after a message
// woke it, its sender still runnable, yet having run least the woken service takes the core first
// (counting the tasks runnable at each step's start stretched the simulated steps of a one-job run
// to 1.4-1.7x their work where the real ones take 1.0-1.2x their time alone). The share is not
// symmetric: the kernel runs first the task that has run least (its virtual runtime), so a step
// yields only to the tasks that compute a smaller fraction of their time than it does. The
// machine's other tasks (verifiers, the scheduler, Redis, the services' socket threads) compute
// little and always count; another simulator counts when its busy fraction (over about a second,
// published in the table) is not above this one's. Entries of processes that died are taken over; a
// step's claim lapses on its own (busy_until), so a killed process holds nothing.
#define HOST_SLOTS 512
#define LOAD_TAU_S 1.0   // the busy fraction's time constant
#define DEMAND_TAU_S 0.25   // the other tasks' demand's
#define DEMAND_READ_NS 5000000
typedef struct {
    _Atomic int32_t pid;
    _Atomic int32_t load_pm;   // its busy fraction, per mille
    _Atomic int64_t busy_until_ns;
} host_slot_t;

static host_slot_t *host_tab;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void host_open(void) {
    char name[64];
    snprintf(name, sizeof name, "/marlaas-sim-cores-v2-%u", (unsigned)getuid());
    int fd = shm_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    size_t size = sizeof(host_slot_t) * HOST_SLOTS;
    if (fd < 0 || ftruncate(fd, (off_t)size)) {
        log_warn("simulated CPU: shared memory %s: %s; steps count the machine's runnable processes but not the "
                 "other simulators' steps (check /dev/shm)", name, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        log_warn("simulated CPU: cannot map %s: %s", name, strerror(errno));
        return;
    }
    host_tab = m;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int host_claim(void) {
    pthread_once(&host_once, host_open);
    if (!host_tab) return -1;
    int32_t me = (int32_t)getpid();
    for (int i = 0; i < HOST_SLOTS; i++) {
        int32_t p = atomic_load(&host_tab[i].pid);
        if ((p == 0 || (p != me && kill(p, 0) && errno == ESRCH)) && atomic_compare_exchange_strong(&host_tab[i].pid, &p, me)) {
            atomic_store(&host_tab[i].busy_until_ns, 0);
            atomic_store(&host_tab[i].load_pm, 0);
            return i;
        }
    }
    log_warn("simulated CPU: all %d entries of the host table are held by live processes; this one's steps are not "
             "seen by the others", HOST_SLOTS);
    return -1;
}

// The machine's busy CPU time in seconds, all cores (/proc/stat's first line: user, nice, system,
// irq and softirq; in clock ticks, 10 ms each), or -1 when it cannot be read.
static double machine_busy_s(void) {
    char buf[256];
    int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    unsigned long long u, ni, sy, id, io, irq, sirq;
    if (n <= 0)
        return -1;
    buf[n] = 0;
    if (sscanf(buf, "cpu %llu %llu %llu %llu %llu %llu %llu", &u, &ni, &sy, &id, &io, &irq, &sirq) != 7) return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return (double)(u + ni + sy + irq + sirq) / (double)(hz > 0 ? hz : 100);
}

// Brings the other tasks' CPU demand up to date (at most every DEMAND_READ_NS): the machine's busy
// CPU time less the calling thread's since the last reading, per second, averaged over about
// DEMAND_TAU_S (the first readings weighed by the time they span, not against a made-up zero).
static void demand_update(sim_t *s, int64_t now) {
    if (s->stat_t && now - s->stat_t < DEMAND_READ_NS) return;
    double busy = machine_busy_s(), own = thread_cpu();
    if (busy < 0) {
        if (!s->stat_warned)
            log_warn("simulated CPU: cannot read /proc/stat; steps count the other simulators' steps but not the "
                     "machine's other work (mount /proc)");
        s->stat_warned = true;
        s->stat_t = now, s->stat_busy = -1;
        return;
    }
    if (s->stat_t && s->stat_busy >= 0) {
        double dt = (double)(now - s->stat_t) * 1e-9;
        double d = (busy - s->stat_busy - (own - s->stat_own)) / dt;
        double k = exp(-dt / DEMAND_TAU_S);
        s->demand = s->demand * k + (d < 0 ? 0 : d) * (1 - k);
        s->demand_w = s->demand_w * k + (1 - k);
    }
    s->stat_t = now, s->stat_busy = busy, s->stat_own = own;
}

// The other computations a step shares the cores with: the machine's other tasks' CPU demand in
// cores, plus the other simulators whose modelled step holds a core now and whose busy fraction
// is not above the caller's.
static double host_others(sim_t *s, int64_t now) {
    demand_update(s, now);
    double others = s->demand_w > 0 ? s->demand / s->demand_w : 0;
    int mine = (int)(s->load * 1000);
    for (int i = 0; host_tab && i < HOST_SLOTS; i++)
        if (i != s->host_slot && atomic_load(&host_tab[i].pid) && atomic_load(&host_tab[i].busy_until_ns) > now &&
            atomic_load(&host_tab[i].load_pm) <= mine)
            others++;
    return others;
}

// `work` wall seconds of a whole core, in slices of at most a millisecond, each at the share of a
// core the machine's load leaves it (the other simulators' steps read at most every half
// millisecond, the machine's demand every 5 ms). A sleep that woke late
// (70-90 us on a 2-core cloud VM: a quarter of a 0.3 ms step) did that much of the next step's
// work, whenever it comes: the steps' time adds up to their work, as the real engine's does.
static void shared_wait(sim_t *s, double work) {
    if (s->host_slot < 0) s->host_slot = host_claim();
    host_slot_t *me = s->host_slot >= 0 ? &host_tab[s->host_slot] : NULL;
    int64_t now = mono_ns();
    work -= s->late;
    s->late = 0;
    // the busy fraction decays over the idle time since the last step
    if (s->load_t) s->load *= exp(-(double)(now - s->load_t) * 1e-9 / LOAD_TAU_S);
    s->load_t = now;
    if (me) atomic_store(&me->load_pm, (int32_t)(s->load * 1000));
    while (work > 1e-7) {
        if (now - s->load_read > 500000) s->others = host_others(s, now), s->load_read = now;
        double others = s->others;
        double rate = 1.0 / (1.0 + others / s->d.shared_cores);
        double slice = work / rate < 1e-3 ? work / rate : 1e-3;
        int64_t end = now + (int64_t)(slice * 1e9) + 1;
        if (me) atomic_store(&me->busy_until_ns, end + 200000);   // held across the wake-up
        struct timespec ts = {.tv_sec = (time_t)(end / 1000000000), .tv_nsec = (long)(end % 1000000000)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        int64_t t = mono_ns();
        work -= (double)(t - now) * 1e-9 * rate;
        double k = exp(-(double)(t - now) * 1e-9 / LOAD_TAU_S);
        s->load = s->load * k + (1 - k);
        if (me) atomic_store(&me->load_pm, (int32_t)(s->load * 1000));
        now = t;
    }
    s->load_t = now;
    if (me) atomic_store(&me->busy_until_ns, 0);
    s->late = work < 0 ? -work : 0;
}

int sim_host_busy(int pid) {
    pthread_once(&host_once, host_open);
    if (!host_tab) return -1;
    int64_t now = mono_ns();
    int32_t me = (int32_t)getpid();
    int n = 0;
    for (int i = 0; i < HOST_SLOTS; i++) {
        int32_t p = atomic_load(&host_tab[i].pid);
        n += p && (pid ? p == pid : p != me) && atomic_load(&host_tab[i].busy_until_ns) > now;
    }
    return n;
}

void sim_close(sim_t **ps) {
    if (!ps || !*ps) return;
    if ((*ps)->host_slot >= 0) {
        atomic_store(&host_tab[(*ps)->host_slot].busy_until_ns, 0);
        atomic_store(&host_tab[(*ps)->host_slot].pid, 0);
    }
    free(*ps);
    *ps = NULL;
}

const sim_device_t *sim_device(const sim_t *s) { return &s->d; }
double sim_scale(const sim_t *s) { return s->scale; }
int sim_devices(const sim_t *s) { return s->devices; }
double sim_modelled_seconds(const sim_t *s) { return s->modelled; }

int sim_model_shape(const char *name, hf_config_t *mc, char *source, size_t n) {
    const cJSON *e = entry("models", name, NULL);
    if (!e) return -1;
    static const struct {
        const char *key;
        size_t off;
    } f[] = {{"hidden_size", offsetof(hf_config_t, hidden_size)},
             {"intermediate_size", offsetof(hf_config_t, intermediate_size)},
             {"num_hidden_layers", offsetof(hf_config_t, num_hidden_layers)},
             {"num_attention_heads", offsetof(hf_config_t, num_attention_heads)},
             {"num_key_value_heads", offsetof(hf_config_t, num_key_value_heads)},
             {"head_dim", offsetof(hf_config_t, head_dim)},
             {"vocab_size", offsetof(hf_config_t, vocab_size)}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, f[i].key);
        if (cJSON_IsNumber(v)) *(int *)((char *)mc + f[i].off) = v->valueint;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "tie_word_embeddings");
    if (cJSON_IsBool(t)) mc->tie_word_embeddings = cJSON_IsTrue(t);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(e, "source");
    if (source && n) snprintf(source, n, "%s", cJSON_IsString(src) ? src->valuestring : "");
    return 0;
}

// --- cost model -------------------------------------------------------------------------------------

static double gemm(const sim_device_t *d, double m, double n, double k) {
    if (m <= 0 || n <= 0 || k <= 0) return 0.0;
    double eff = d->gemm_efficiency * m / (m + d->gemm_half_rows);
    double tc = 2.0 * m * n * k / (d->flops * eff);
    double bytes = (n * k + m * k + m * n) * d->weight_bytes;
    double tm = bytes / (d->bandwidth * d->bandwidth_efficiency);
    return (tc > tm ? tc : tm) + d->launch_s;
}

static double stream(const sim_device_t *d, double bytes, int launches) {
    return bytes / (d->bandwidth * d->bandwidth_efficiency) + launches * d->launch_s;
}

static void target_dims(const hf_config_t *m, int t, double *in, double *out) {
    double D = m->hidden_size, F = m->intermediate_size, Qd = (double)m->num_attention_heads * m->head_dim,
           KVd = (double)m->num_key_value_heads * m->head_dim;
    static const int q = 0, k = 1, v = 2, o = 3, g = 4, u = 5;
    *in = t == o ? Qd : t == 6 ? F : D;
    *out = t == q ? Qd : t == k || t == v ? KVd : t == o ? D : t == g || t == u ? F : D;
}

// The forward (or forward + backward) of one device's share of the sequences.
static double pass_cost(const sim_t *s, const sim_seq_t *seqs, int n, bool train) {
    const sim_device_t *d = &s->d;
    const hf_config_t *m = &s->m;
    double D = m->hidden_size, F = m->intermediate_size, V = m->vocab_size, L = m->num_hidden_layers;
    double Qd = (double)m->num_attention_heads * m->head_dim, KVd = (double)m->num_key_value_heads * m->head_dim;
    double wb = d->weight_bytes, T = 0, R = 0, att_flops = 0, att_bytes = 0;
    for (int i = 0; i < n; i++) {
        double nn = seqs[i].n_new, p = seqs[i].past;
        T += nn;
        R += seqs[i].n_logits;
        att_flops += 4.0 * nn * (p + (nn + 1) / 2.0) * Qd;
        att_bytes += ((p + nn) * 2.0 * KVd + nn * 2.0 * Qd) * wb;
    }
    if (T <= 0) return 0.0;
    // forward; training adds the backward: the frozen base's input gradients (the GEMMs once
    // more), attention 2.5x its forward, LoRA twice its forward, the element-wise ops once more,
    // the head's input gradient, all at the device's backward_efficiency
    double gemms = gemm(d, T, Qd + 2 * KVd, D) + gemm(d, T, D, Qd) + gemm(d, T, 2 * F, D) + gemm(d, T, D, F);
    double ta = att_flops / (d->flops * d->attention_efficiency), tb = att_bytes / (d->bandwidth * d->bandwidth_efficiency);
    double att = (ta > tb ? ta : tb) + d->launch_s, elem = stream(d, T * (8 * D + 3 * F + 2 * Qd + 2 * KVd) * wb, 6);
    // multi-LoRA: each adapter's rows through shrink and expand, one launch per target and kind
    // (the adapters of the batch: their slots, ranks, targets and rows, in order of appearance)
    enum { MAX_SEG = 512 };
    int seg_slot[MAX_SEG], seg_rank[MAX_SEG], n_seg = 0;
    unsigned seg_tg[MAX_SEG], any = 0;
    double seg_rows[MAX_SEG];
    for (int i = 0; i < n; i++) {
        if (seqs[i].slot < 0 || seqs[i].rank <= 0) continue;
        int g = 0;
        while (g < n_seg && seg_slot[g] != seqs[i].slot) g++;
        if (g == n_seg) {
            if (n_seg == MAX_SEG) g = MAX_SEG - 1;   // beyond: counted with the last (never with 512 slots)
            else seg_slot[g] = seqs[i].slot, seg_rank[g] = seqs[i].rank, seg_tg[g] = seqs[i].targets, seg_rows[g] = 0, n_seg++;
        }
        seg_rows[g] += seqs[i].n_new;
        any |= seqs[i].targets;
    }
    double lora = 0;
    for (int g = 0; g < n_seg; g++)
        for (int t = 0; t < 7; t++)
            if (seg_tg[g] >> t & 1) {
                double in, out, r = seg_rank[g];
                target_dims(m, t, &in, &out);
                lora += gemm(d, seg_rows[g], r, in) + gemm(d, seg_rows[g], out, r) - 2 * d->launch_s;
            }
    for (int t = 0; t < 7; t++)
        if (any >> t & 1) lora += 2 * d->launch_s;
    double hg = gemm(d, R, V, D), fwd = L * (gemms + att + elem + lora) + hg + stream(d, R * V * 4.0, 1) +
                                        stream(d, (T + R) * D * wb, 2);
    if (!train) return fwd;
    double back = L * (gemms + 2.5 * att + elem + 2.0 * lora) + hg;
    return fwd + back / d->backward_efficiency;
}

double sim_cost(const sim_t *s, const sim_seq_t *seqs, int n, sim_mode_t mode, int n_adapters, double adapter_params) {
    // adapter_params: the parameters of the n_adapters adapters together
    const sim_device_t *d = &s->d;
    if (n <= 0) return 0.0;
    if (mode == SIM_INFER) return pass_cost(s, seqs, n, false) + d->step_overhead_s;
    int D = s->devices;
    double t = 0;
    if (D <= 1) {
        t = pass_cost(s, seqs, n, true);
    } else {
        // longest sequences first onto the least loaded device; the pass lasts as long as its slowest
        int *order = xmalloc(sizeof(int) * (size_t)n), *bin = xmalloc(sizeof(int) * (size_t)n);
        double *load = xcalloc((size_t)D, sizeof(double));
        for (int i = 0; i < n; i++) order[i] = i;
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && seqs[order[j]].n_new > seqs[order[j - 1]].n_new; j--) {
                int x = order[j];
                order[j] = order[j - 1], order[j - 1] = x;
            }
        for (int i = 0; i < n; i++) {
            int b = 0;
            for (int q = 1; q < D; q++)
                if (load[q] < load[b]) b = q;
            bin[order[i]] = b;
            load[b] += seqs[order[i]].n_new;
        }
        sim_seq_t *part = xmalloc(sizeof(sim_seq_t) * (size_t)n);
        for (int b = 0; b < D; b++) {
            int k = 0;
            for (int i = 0; i < n; i++)
                if (bin[i] == b) part[k++] = seqs[i];
            double c = pass_cost(s, part, k, true);
            if (c > t) t = c;
        }
        free(part), free(order), free(bin), free(load);
        double bytes = adapter_params * 4.0;
        t += 2.0 * (D - 1) / D * bytes / d->link_bandwidth + D * d->link_latency_s;
    }
    // AdamW over each adapter: parameters, gradients and both moments read and written (fp32)
    t += adapter_params * 16.0 / (d->bandwidth * d->bandwidth_efficiency) + n_adapters * d->launch_s;
    return t + d->step_overhead_s;
}

void sim_defer(sim_t *s, double dt) {
    if (dt > 0) s->deferred += dt;
}

double sim_deferred(const sim_t *s) { return s->deferred; }
double sim_coalesce_s(const sim_t *s) { return s->coalesce_s; }

void sim_wait(sim_t *s, double dt) {
    if (!(dt >= 0)) dt = 0;
    dt += s->deferred;
    s->deferred = 0;
    if (!(dt > 0)) return;
    s->modelled += dt;
    if (!s->slack_set) {
        // wake-ups within microseconds, not the default 50 us of timer slack (a modelled decode
        // step at scale 60 is about 100 us of wall time)
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        s->slack_set = true;
    }
    if (s->d.shared_cores > 0) {
        shared_wait(s, dt / s->scale);
        return;
    }
    // The modelled device runs one step after another: this step starts when the last one ended
    // or when the host issued it, whichever is later. The host's work since the last step (this
    // thread's CPU time) overlapped the device's time, as a GPU runtime's asynchronous launches do:
    // the step counts as issued that much before now.
    double now = (double)mono_ns() * 1e-9, cpu = thread_cpu();
    double host = s->d.host_overlap > 0 && s->cpu_mark > 0 ? cpu - s->cpu_mark : 0.0;
    // Only work done right after the last step (the thread busy since it woke) can have overlapped
    // it, and no more than its length; after an idle wait (a gap longer than that work) the step
    // starts now: CPU spent polling while idle hides nothing.
    double start = now;
    if (now - s->deadline <= host + s->late + 1e-4) {
        double over = host < s->last_len ? host : s->last_len;
        start = now - over > s->deadline ? now - over : s->deadline;
    }
    double end = start + dt / s->scale;
    s->last_len = end - start;
    s->hidden += now - start > 0 ? now - start : 0.0;
    // Sleeps wake late (70-90 us on a cloud VM, more than a decode step's wall time at a large
    // scale): what the earlier sleeps overslept is owed, and this step sleeps that much less, or
    // not at all while the debt exceeds it, so the steps' wall time adds up to their modelled time
    // at any scale instead of each taking at least one wake-up's latency.
    double wake = end - s->late;
    if (wake > now) {
        struct timespec ts = {.tv_sec = (time_t)wake, .tv_nsec = (long)((wake - (double)(time_t)wake) * 1e9)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        double woke = (double)mono_ns() * 1e-9;
        s->late = woke - wake > 0 ? woke - wake : 0.0;
    } else {
        s->late -= end > now ? end - now : 0.0;
    }
    s->deadline = end;
    s->cpu_mark = thread_cpu();
}

double sim_hidden_seconds(const sim_t *s) { return s->hidden; }

double sim_weight_bytes(const sim_t *s) {
    const hf_config_t *m = &s->m;
    double D = m->hidden_size, F = m->intermediate_size, V = m->vocab_size, L = m->num_hidden_layers;
    double Qd = (double)m->num_attention_heads * m->head_dim, KVd = (double)m->num_key_value_heads * m->head_dim;
    double params = V * D * (m->tie_word_embeddings ? 1 : 2) + L * (2 * D * Qd + 2 * D * KVd + 3 * D * F + 2 * D) + D;
    return params * s->d.weight_bytes;
}

double sim_kv_block_bytes(const sim_t *s, int block_size) {
    const hf_config_t *m = &s->m;
    return (double)block_size * 2.0 * m->num_hidden_layers * m->num_key_value_heads * m->head_dim * s->d.weight_bytes;
}

int64_t sim_kv_blocks(const sim_t *s, int block_size, int n_slots, double adapter_params, char *err) {
    const sim_device_t *d = &s->d;
    double w = sim_weight_bytes(s), a = n_slots * adapter_params * d->weight_bytes;
    double left = d->memory * (1.0 - d->activation_reserve) - w - a;
    double blocks = left / sim_kv_block_bytes(s, block_size);
    if (blocks < 1)
        return err_set(err, "the model (%.1f GB of weights) and %d adapters (%.2f GB) leave no room for a KV cache in "
                       "%s's %.0f GB (%.0f %% kept for activations)", w / 1e9, n_slots, a / 1e9, d->name,
                       d->memory / 1e9, d->activation_reserve * 100);
    return blocks > 1e9 ? (int64_t)1e9 : (int64_t)blocks;
}

static double adapter_params_r16(const hf_config_t *m) {
    double n = 0;
    for (int t = 0; t < 7; t++) {
        double in, out;
        target_dims(m, t, &in, &out);
        n += 16.0 * (in + out);
    }
    return n * m->num_hidden_layers;
}

int sim_trainer_fit(const sim_t *s, int pass_rows, int *max_jobs, char *err) {
    const sim_device_t *d = &s->d;
    const hf_config_t *m = &s->m;
    double rows = (double)(pass_rows > 0 ? pass_rows : 1) / s->devices;
    double act = rows * m->num_hidden_layers * (16.0 * m->hidden_size + 4.0 * m->intermediate_size) * d->weight_bytes;
    double job = adapter_params_r16(m) * 16.0;
    double left = d->memory * (1.0 - d->activation_reserve) - sim_weight_bytes(s) - act;
    int fit = left > 0 ? (int)fmin(left / job, 1e6) : 0;
    if (fit < 1)
        return err_set(err, "simulated trainer: %.1f GB of weights and %.1f GB of activations for %.0f rows per device "
                       "leave no room for one adapter's training state on %s (%.0f GB): lower --set pass_rows or add "
                       "devices (--set sim_devices)", sim_weight_bytes(s) / 1e9, act / 1e9, rows, d->name, d->memory / 1e9);
    if (*max_jobs > fit) {
        log_warn("simulated trainer: %s holds the training state of %d jobs (weights %.1f GB, activations %.1f GB, "
                 "%.2f GB per job); max_jobs lowered from %d", d->name, fit, sim_weight_bytes(s) / 1e9, act / 1e9,
                 job / 1e9, *max_jobs);
        *max_jobs = fit;
    }
    return 0;
}

// --- lengths ----------------------------------------------------------------------------------------

int sim_length(const sim_t *s, rng_t *rng, int max_new) {
    const sim_lengths_t *l = &s->len;
    double x;
    if (l->kind == SIM_LEN_FIXED) {
        x = l->a;
    } else if (l->kind == SIM_LEN_UNIFORM) {
        x = l->a + floor(rng_uniform(rng) * (l->b - l->a + 1));
    } else {
        double u1 = rng_uniform(rng), u2 = rng_uniform(rng);
        double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
        x = l->a * exp(l->b * z);
    }
    long n = lround(x);
    if (n < 1) n = 1;
    return n > max_new ? max_new : (int)n;
}

// --- tasks ------------------------------------------------------------------------------------------

int sim_task_curve(const char *task, sim_curve_t *c) {
    if (!task || strncmp(task, "sim-", 4) != 0 || params_error()) return -1;
    const cJSON *e = entry("tasks", task, NULL);
    if (!e) return -1;
    const char *k[4] = {"start", "ceiling", "steps", "noise"};
    double v[4];
    for (int i = 0; i < 4; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(e, k[i]);
        if (!cJSON_IsNumber(x)) return -1;
        v[i] = x->valuedouble;
    }
    if (!(v[0] >= 0 && v[1] <= 1 && v[0] <= v[1] && v[2] > 0 && v[3] >= 0 && v[3] <= 0.5)) return -1;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(e, "prompt");
    int prompt = cJSON_IsNumber(pr) ? pr->valueint : 128;
    if (prompt < 16 || prompt > 65536) return -1;
    *c = (sim_curve_t){v[0], v[1], v[2], v[3], prompt};
    return 0;
}

bool sim_is_task(const char *task) {
    sim_curve_t c;
    return sim_task_curve(task, &c) == 0;
}

double sim_curve_p(const sim_curve_t *c, double steps) {
    return c->ceiling - (c->ceiling - c->start) * exp(-(steps > 0 ? steps : 0) / c->tau);
}

uint64_t sim_key(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; s && *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double unit(uint64_t h) { return (double)(h >> 11) * (1.0 / 9007199254740992.0); }

float sim_reward(const sim_curve_t *c, double steps, uint64_t key, uint64_t group, uint64_t sample, bool eval) {
    double p = sim_curve_p(c, steps);
    uint64_t g = mix(key ^ mix(group + 1));
    if (!eval) p += (2.0 * unit(mix(g ^ 0x5151)) - 1.0) * c->noise;
    return unit(mix(g ^ mix(sample + 0x77))) < p ? 1.0f : 0.0f;
}

// metrics.c - thread-safe registry of counters and gauges, rendered in the Prometheus text
// format, plus the liveness and readiness state behind /healthz and /readyz.
#include "common/svc/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/util.h"

typedef struct {
    char job[96];
    double v;
    uint64_t touched;      // update clock, for dropping the stalest series
} series_t;

typedef struct {
    char name[96];
    char help[200];
    met_type_t type;
    bool has_plain;
    double plain;
    series_t *s;
    int n, cap;
} family_t;

struct metrics {
    pthread_mutex_t mu;
    char service[64], id[128];
    family_t fam[METRICS_MAX_FAMILIES];
    int n_fam;
    uint64_t clock;
    double t_start, last_alive, stall_s;
    bool ready;
    char why_not[256];
    metrics_check_fn check;
    void *check_ctx;
};

metrics_t *metrics_new(const char *service, const char *id) {
    metrics_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    snprintf(m->service, sizeof m->service, "%s", service ? service : "");
    snprintf(m->id, sizeof m->id, "%s", id ? id : "");
    m->t_start = m->last_alive = util_now();
    m->stall_s = 300;
    snprintf(m->why_not, sizeof m->why_not, "starting");
    return m;
}

void metrics_destroy(metrics_t **pm) {
    metrics_t *m = *pm;
    if (!m) return;
    for (int i = 0; i < m->n_fam; i++) free(m->fam[i].s);
    pthread_mutex_destroy(&m->mu);
    free(m);
    *pm = NULL;
}

// Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*
static bool valid_name(const char *s) {
    if (!s || !*s || strlen(s) >= 96) return false;
    for (const char *p = s; *p; p++) {
        bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':';
        if (!alpha && !(p > s && *p >= '0' && *p <= '9')) return false;
    }
    return true;
}

static int def(metrics_t *m, const char *name, met_type_t type, const char *help, bool plain) {
    if (!m || !valid_name(name)) return -1;
    pthread_mutex_lock(&m->mu);
    int h = -1;
    for (int i = 0; i < m->n_fam; i++)
        if (!strcmp(m->fam[i].name, name)) h = i;
    if (h < 0 && m->n_fam < METRICS_MAX_FAMILIES) {
        h = m->n_fam++;
        family_t *f = &m->fam[h];
        memset(f, 0, sizeof *f);
        snprintf(f->name, sizeof f->name, "%s", name);
        // help text: one line, no backslashes (the format would need them escaped)
        snprintf(f->help, sizeof f->help, "%s", help ? help : "");
        for (char *p = f->help; *p; p++)
            if (*p == '\n' || *p == '\\') *p = ' ';
        f->type = type;
        f->has_plain = plain;
    }
    pthread_mutex_unlock(&m->mu);
    return h;
}

int metrics_def(metrics_t *m, const char *name, met_type_t type, const char *help) {
    return def(m, name, type, help, true);
}

int metrics_def_job(metrics_t *m, const char *name, met_type_t type, const char *help) {
    return def(m, name, type, help, false);
}

// The series of a job (created when create is set; the stalest dropped when full). Lock held.
static double *slot(metrics_t *m, int fam, const char *job, bool create) {
    if (fam < 0 || fam >= m->n_fam) return NULL;
    family_t *f = &m->fam[fam];
    m->clock++;
    if (!job || !*job) {
        if (!f->has_plain && !create) return NULL;
        f->has_plain = true;
        return &f->plain;
    }
    for (int i = 0; i < f->n; i++)
        if (!strncmp(f->s[i].job, job, sizeof f->s[i].job - 1)) {
            f->s[i].touched = m->clock;
            return &f->s[i].v;
        }
    if (!create) return NULL;
    int at;
    if (f->n < METRICS_MAX_JOBS) {
        if (f->n == f->cap) {
            int cap = f->cap ? f->cap * 2 : 16;
            series_t *s = realloc(f->s, sizeof *s * (size_t)cap);
            if (!s) return NULL;
            f->s = s, f->cap = cap;
        }
        at = f->n++;
    } else {
        at = 0;
        for (int i = 1; i < f->n; i++)
            if (f->s[i].touched < f->s[at].touched) at = i;
    }
    snprintf(f->s[at].job, sizeof f->s[at].job, "%s", job);
    f->s[at].v = 0;
    f->s[at].touched = m->clock;
    return &f->s[at].v;
}

void metrics_set(metrics_t *m, int fam, const char *job, double v) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    double *p = slot(m, fam, job, true);
    if (p) *p = v;
    pthread_mutex_unlock(&m->mu);
}

void metrics_add(metrics_t *m, int fam, const char *job, double dv) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    double *p = slot(m, fam, job, true);
    if (p) *p += dv;
    pthread_mutex_unlock(&m->mu);
}

double metrics_get(metrics_t *m, int fam, const char *job) {
    if (!m) return 0;
    pthread_mutex_lock(&m->mu);
    double *p = slot(m, fam, job, false);
    double v = p ? *p : 0;
    pthread_mutex_unlock(&m->mu);
    return v;
}

void metrics_forget_job(metrics_t *m, const char *job) {
    if (!m || !job || !*job) return;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n_fam; i++) {
        family_t *f = &m->fam[i];
        for (int k = 0; k < f->n;)
            if (!strncmp(f->s[k].job, job, sizeof f->s[k].job - 1)) f->s[k] = f->s[--f->n];
            else k++;
    }
    pthread_mutex_unlock(&m->mu);
}

void metrics_alive(metrics_t *m) {
    if (!m) return;
    double now = util_now();
    pthread_mutex_lock(&m->mu);
    m->last_alive = now;
    pthread_mutex_unlock(&m->mu);
}

void metrics_set_stall(metrics_t *m, double stall_s) {
    if (!m || !(stall_s > 0)) return;
    pthread_mutex_lock(&m->mu);
    m->stall_s = stall_s;
    pthread_mutex_unlock(&m->mu);
}

void metrics_ready(metrics_t *m, bool ready, const char *why_not) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->ready = ready;
    snprintf(m->why_not, sizeof m->why_not, "%s", ready ? "" : (why_not && *why_not ? why_not : "not ready"));
    pthread_mutex_unlock(&m->mu);
}

// Label values: backslash, double quote and newline escaped.
static void put_label(FILE *o, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"') fputc('\\', o), fputc(*p, o);
        else if (*p == '\n') fputs("\\n", o);
        else fputc(*p, o);
    }
}

static void put_value(FILE *o, double v) {
    if (isnan(v)) fputs("NaN", o);
    else if (isinf(v)) fputs(v > 0 ? "+Inf" : "-Inf", o);
    else if (v == floor(v) && fabs(v) < 9e15) fprintf(o, "%.0f", v);
    else fprintf(o, "%.9g", v);
}

void metrics_set_check(metrics_t *m, metrics_check_fn fn, void *ctx) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->check = fn, m->check_ctx = ctx;
    pthread_mutex_unlock(&m->mu);
}

char *metrics_render(metrics_t *m, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *o = open_memstream(&buf, &n);
    if (!o) return NULL;
    pthread_mutex_lock(&m->mu);
    fputs("# HELP marlaas_info The service and instance id of this process (value 1).\n# TYPE marlaas_info gauge\n"
          "marlaas_info{service=\"", o);
    put_label(o, m->service);
    fputs("\",id=\"", o);
    put_label(o, m->id);
    fputs("\"} 1\n", o);
    double now = util_now();
    fprintf(o, "# HELP marlaas_up_seconds Seconds since the process started.\n# TYPE marlaas_up_seconds gauge\n"
               "marlaas_up_seconds %.3f\n", now - m->t_start);
    fprintf(o, "# HELP marlaas_loop_age_seconds Seconds since the main loop last turned (GET /healthz fails past "
               "MARLAAS_STALL_S).\n# TYPE marlaas_loop_age_seconds gauge\nmarlaas_loop_age_seconds %.3f\n",
            now - m->last_alive);
    fprintf(o, "# HELP marlaas_ready 1 when the service is ready (GET /readyz).\n# TYPE marlaas_ready gauge\n"
               "marlaas_ready %d\n", m->ready ? 1 : 0);
    for (int i = 0; i < m->n_fam; i++) {
        const family_t *f = &m->fam[i];
        if (!f->has_plain && f->n == 0) continue;
        fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type == MET_COUNTER ? "counter" : "gauge");
        if (f->has_plain) {
            fprintf(o, "%s ", f->name);
            put_value(o, f->plain);
            fputc('\n', o);
        }
        for (int k = 0; k < f->n; k++) {
            fprintf(o, "%s{job_id=\"", f->name);
            put_label(o, f->s[k].job);
            fputs("\"} ", o);
            put_value(o, f->s[k].v);
            fputc('\n', o);
        }
    }
    pthread_mutex_unlock(&m->mu);
    fclose(o);
    *len = n;
    return buf;
}

char *metrics_health(metrics_t *m, int *status, size_t *len) {
    pthread_mutex_lock(&m->mu);
    double idle = util_now() - m->last_alive, stall = m->stall_s;
    pthread_mutex_unlock(&m->mu);
    char *s = NULL;
    int n;
    if (idle <= stall) {
        *status = 200;
        n = asprintf(&s, "ok\n");
    } else {
        *status = 503;
        n = asprintf(&s, "unhealthy: the main loop of %s has not turned for %.0f s (limit %.0f s); restart the "
                         "process and check its log\n", m->service, idle, stall);
    }
    if (n < 0) return NULL;
    *len = (size_t)n;
    return s;
}

char *metrics_readiness(metrics_t *m, int *status, size_t *len) {
    pthread_mutex_lock(&m->mu);
    bool ready = m->ready;
    char why[256];
    snprintf(why, sizeof why, "%s", m->why_not);
    metrics_check_fn check = m->check;
    void *ctx = m->check_ctx;
    pthread_mutex_unlock(&m->mu);
    if (ready && check) ready = check(ctx, why, sizeof why);
    char *s = NULL;
    *status = ready ? 200 : 503;
    int n = ready ? asprintf(&s, "ready\n") : asprintf(&s, "not ready: %s\n", why);
    if (n < 0) return NULL;
    *len = (size_t)n;
    return s;
}

double met_window_rate(met_window_t *w, double t, double v, double window_s) {
    int k = w->n % MET_WINDOW;
    w->t[k] = t, w->v[k] = v;
    w->n++;
    int have = w->n < MET_WINDOW ? w->n : MET_WINDOW;
    int first = w->n <= MET_WINDOW ? 0 : w->n % MET_WINDOW;   // oldest sample kept
    int j = k;
    for (int i = 0; i < have; i++) {
        int c = (first + i) % MET_WINDOW;
        if (t - w->t[c] <= window_s) {
            j = c;
            break;
        }
    }
    double dt = t - w->t[j];
    return dt > 0 ? (v - w->v[j]) / dt : 0;
}

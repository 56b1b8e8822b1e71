// cmd_bench_api.c - `marlaas bench-api`: the control plane under load (bench/sim_control.sh).
// Creates tenants with the admin token, submits jobs round-robin over them (each submission
// timed), then, while the jobs run, queries the API at a steady rate as the tenants would (a
// job's status, a tenant's job list, alternately; one connection per tenant) and times every
// call, until every job has ended (or --timeout). Prints one CSV row: jobs, tenants, submit p50 /
// p99, query p50 / p99 and count (milliseconds), the seconds until every job ended, failures.
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/client.h"
#include "common/util/util.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(p * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int cmd_bench_api(int argc, char **argv) {
    long jobs = 100, tenants = 20, rate = 50, timeout = 1800;
    const char *spec_txt = NULL, *prefix = "bench";
    static struct option lo[] = {{"jobs", required_argument, 0, 'j'},   {"tenants", required_argument, 0, 't'},
                                 {"spec", required_argument, 0, 's'},   {"rate", required_argument, 0, 'r'},
                                 {"timeout", required_argument, 0, 'T'}, {"help", no_argument, 0, 'h'},
                                 {"prefix", required_argument, 0, 'p'},
                                 {0}};
    const char *usage = "marlaas bench-api --spec JSON [--jobs 100] [--tenants 20] [--rate 50] [--timeout 1800] [--prefix bench]\n"
                        "  (the admin token and API of the local cluster, or MARLAAS_ADMIN_TOKEN / MARLAAS_API)";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'j') {
            if (cli_int("--jobs", optarg, 1, 100000, &jobs)) return 2;
        } else if (c == 't') {
            if (cli_int("--tenants", optarg, 1, 10000, &tenants)) return 2;
        } else if (c == 'r') {
            if (cli_int("--rate", optarg, 1, 10000, &rate)) return 2;
        } else if (c == 'T') {
            if (cli_int("--timeout", optarg, 1, 86400, &timeout)) return 2;
        } else if (c == 's') {
            spec_txt = optarg;
        } else if (c == 'p') {
            prefix = optarg;
        } else {
            printf("usage: %s\n", usage);
            return c == 'h' ? 0 : 2;
        }
    }
    if (!spec_txt) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    char err[ERR_LEN];
    const char *ep = client_endpoint(NULL);
    client_t *admin = client_new(ep, client_admin_token(NULL), 30000, err);
    if (!admin) {
        fprintf(stderr, "marlaas bench-api: %s\n", err);
        return 1;
    }
    client_t **cl = xcalloc((size_t)tenants, sizeof *cl);
    char(*jid)[64] = xcalloc((size_t)jobs, sizeof *jid);
    double *sub = xcalloc((size_t)jobs, sizeof(double));
    int fails = 0, rc = 1;
    for (long t = 0; t < tenants; t++) {
        proto_args_t a = {0};
        char name[40];
        snprintf(name, sizeof name, "%.20s%ld", prefix, t);
        proto_args_str(&a, "name", name);
        proto_rep_t rep;
        if (client_call(admin, "tenant_create", &a, &rep, err)) {
            fprintf(stderr, "marlaas bench-api: tenant_create: %s\n", err);
            goto done;
        }
        cl[t] = client_new(ep, proto_args_get_str(&rep.result, "token"), 30000, err);
        proto_rep_free(&rep);
        if (!cl[t]) {
            fprintf(stderr, "marlaas bench-api: %s\n", err);
            goto done;
        }
    }
    double t_start = util_now();
    for (long j = 0; j < jobs; j++) {
        proto_args_t a = {0};
        proto_args_str(&a, "spec", spec_txt);
        proto_rep_t rep;
        double t0 = util_now();
        int r = client_call(cl[j % tenants], "job_submit", &a, &rep, err);
        sub[j] = (util_now() - t0) * 1e3;
        if (r) {
            fprintf(stderr, "marlaas bench-api: job %ld: %s\n", j, err);
            fails++;
            continue;
        }
        snprintf(jid[j], sizeof jid[j], "%s", proto_args_get_str(&rep.result, "job"));
        proto_rep_free(&rep);
    }
    // queries at a steady rate until every job ended: a job's status, then a tenant's list
    size_t cap = 1 << 16, nq = 0;
    double *q = xmalloc(sizeof(double) * cap);
    long next_job = 0, next_ten = 0, ended = 0;
    double period = 1.0 / (double)rate, next = util_now(), last_check = 0, t_end = 0;
    char *ended_flag = xcalloc((size_t)jobs, 1);
    for (long j = 0; j < jobs; j++) ended_flag[j] = !jid[j][0];
    for (long j = 0; j < jobs; j++) ended += ended_flag[j];
    while (ended < jobs && util_now() - t_start < (double)timeout) {
        double now = util_now();
        if (now < next) {
            struct timespec ts = {0, (long)((next - now) * 1e9)};
            nanosleep(&ts, NULL);
        }
        next += period;
        bool status = (nq % 2) == 0;
        long j = next_job;
        if (status) {
            // the next job not known to have ended
            for (long k = 0; k < jobs && ended_flag[j]; k++) j = (j + 1) % jobs;
            next_job = (j + 1) % jobs;
        }
        long t = status ? j % tenants : next_ten;
        if (!status) next_ten = (next_ten + 1) % tenants;
        proto_args_t a = {0};
        if (status) proto_args_str(&a, "job", jid[j]);
        proto_rep_t rep;
        double t0 = util_now();
        int r = client_call(cl[t], status ? "job_status" : "job_list", status ? &a : NULL, &rep, err);
        double ms = (util_now() - t0) * 1e3;
        if (nq == cap) cap *= 2, q = xrealloc(q, sizeof(double) * cap);
        q[nq++] = ms;
        if (r) {
            fails++;
            continue;
        }
        if (status) {
            cJSON *js = cJSON_Parse(proto_args_get_text(&rep.result, "status"));
            const cJSON *sv = cJSON_GetObjectItemCaseSensitive(js, "status");
            const char *st = cJSON_IsString(sv) ? sv->valuestring : NULL;
            if (st && (!strcmp(st, "done") || !strcmp(st, "failed") || !strcmp(st, "cancelled")) && !ended_flag[j])
                ended_flag[j] = 1, ended++;
            cJSON_Delete(js);
        }
        proto_rep_free(&rep);
        if (util_now() - last_check > 5) {
            last_check = util_now();
            fprintf(stderr, "bench-api: %.0f s, %ld of %ld jobs ended, %zu queries\n", last_check - t_start, ended, jobs, nq);
        }
    }
    t_end = util_now() - t_start;
    double s50 = pct(sub, (int)jobs, 0.5), s99 = pct(sub, (int)jobs, 0.99);
    double q50 = pct(q, (int)nq, 0.5), q99 = pct(q, (int)nq, 0.99);
    printf("jobs,tenants,submit_p50_ms,submit_p99_ms,query_p50_ms,query_p99_ms,queries,end_s,ended,failures\n");
    printf("%ld,%ld,%.3f,%.3f,%.3f,%.3f,%zu,%.2f,%ld,%d\n", jobs, tenants, s50, s99, q50, q99, nq, t_end, ended, fails);
    rc = ended == jobs ? 0 : 1;
    free(q), free(ended_flag);
done:
    for (long t = 0; t < tenants; t++) client_destroy(&cl[t]);
    client_destroy(&admin);
    free(cl), free(jid), free(sub);
    return rc;
}

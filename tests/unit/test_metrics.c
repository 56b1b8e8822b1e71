// test_metrics.c - the metrics registry (exact Prometheus text, per-job series and their bound,
// escaping, sliding rates), liveness and readiness, and the HTTP endpoint over a real socket.
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/svc/http.h"
#include "common/svc/metrics.h"
#include "common/util/util.h"
#include "tests/unit/testbits.h"

// The sample line of a series ("name value" or "name{job_id=...} value"), or NULL.
static const char *line_of(const char *text, const char *series, char *out, size_t n) {
    size_t k = strlen(series);
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > k && !strncmp(p, series, k) && p[k] == ' ') {
            snprintf(out, n, "%.*s", (int)len, p);
            return out;
        }
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

Test(metrics, exact_text_format) {
    metrics_t *m = metrics_new("trainer", "t-1");
    int c = metrics_def(m, "marlaas_x_total", MET_COUNTER, "Things.\nSecond line \\ slash");
    int g = metrics_def_job(m, "marlaas_x_job_step", MET_GAUGE, "Step per job.");
    cr_assert_eq(metrics_def(m, "marlaas_x_total", MET_GAUGE, "again"), c, "a second def returns the first handle");
    cr_assert_eq(metrics_def(m, "9bad", MET_GAUGE, ""), -1);
    cr_assert_eq(metrics_def(m, "bad-name", MET_GAUGE, ""), -1);
    metrics_add(m, c, NULL, 2);
    metrics_add(m, c, NULL, 3);
    metrics_set(m, g, "j-1", 7);
    metrics_set(m, g, "we\"ird\\job\n", 0.25);
    size_t len;
    char *t = metrics_render(m, &len);
    cr_assert_eq(strlen(t), len);
    char l[256];
    cr_assert(strstr(t, "marlaas_info{service=\"trainer\",id=\"t-1\"} 1\n"));
    cr_assert(strstr(t, "# HELP marlaas_x_total Things. Second line   slash\n# TYPE marlaas_x_total counter\n"
                        "marlaas_x_total 5\n"), "%s", t);
    cr_assert(strstr(t, "# TYPE marlaas_x_job_step gauge\nmarlaas_x_job_step{job_id=\"j-1\"} 7\n"), "%s", t);
    cr_assert(strstr(t, "marlaas_x_job_step{job_id=\"we\\\"ird\\\\job\\n\"} 0.25\n"), "%s", t);
    cr_assert_null(line_of(t, "marlaas_x_job_step", l, sizeof l), "a per-job family has no unlabelled series");
    cr_assert_not_null(line_of(t, "marlaas_ready", l, sizeof l));
    cr_assert_str_eq(l, "marlaas_ready 0");
    free(t);
    cr_assert_float_eq(metrics_get(m, c, NULL), 5.0, 0);
    cr_assert_float_eq(metrics_get(m, g, "j-1"), 7.0, 0);
    cr_assert_float_eq(metrics_get(m, g, "nope"), 0.0, 0);
    metrics_forget_job(m, "j-1");
    t = metrics_render(m, &len);
    cr_assert_null(strstr(t, "job_id=\"j-1\""));
    free(t);
    metrics_destroy(&m);
    cr_assert_null(m);
}

Test(metrics, special_values_and_counters_start_at_zero) {
    metrics_t *m = metrics_new("s", "i");
    int a = metrics_def(m, "a", MET_GAUGE, ""), b = metrics_def(m, "b", MET_GAUGE, ""),
        d = metrics_def(m, "d", MET_GAUGE, "");
    metrics_def(m, "c", MET_COUNTER, "");
    metrics_set(m, a, NULL, 0.0 / 0.0);
    metrics_set(m, b, NULL, -1.0 / 0.0);
    metrics_set(m, d, NULL, 1e20);
    size_t len;
    char *t = metrics_render(m, &len), l[128];
    cr_assert_str_eq(line_of(t, "a", l, sizeof l), "a NaN");
    cr_assert_str_eq(line_of(t, "b", l, sizeof l), "b -Inf");
    cr_assert_str_eq(line_of(t, "c", l, sizeof l), "c 0", "a declared counter shows 0 before its first event");
    cr_assert_str_eq(line_of(t, "d", l, sizeof l), "d 1e+20");
    free(t);
    metrics_destroy(&m);
}

Test(metrics, per_job_series_are_bounded_dropping_the_stalest) {
    metrics_t *m = metrics_new("s", "i");
    int f = metrics_def_job(m, "f", MET_COUNTER, "");
    char job[32];
    for (int i = 0; i < METRICS_MAX_JOBS; i++) {
        snprintf(job, sizeof job, "j-%d", i);
        metrics_add(m, f, job, i + 1);
    }
    metrics_add(m, f, "j-0", 1);   // j-0 is now the freshest; j-1 the stalest
    metrics_add(m, f, "new", 42);
    cr_assert_float_eq(metrics_get(m, f, "new"), 42, 0);
    cr_assert_float_eq(metrics_get(m, f, "j-0"), 2, 0);
    cr_assert_float_eq(metrics_get(m, f, "j-1"), 0, 0, "the stalest series was dropped");
    cr_assert_float_eq(metrics_get(m, f, "j-2"), 3, 0);
    size_t len;
    char *t = metrics_render(m, &len);
    int lines = 0;
    for (char *p = t; (p = strstr(p, "f{job_id=")); p++) lines++;
    cr_assert_eq(lines, METRICS_MAX_JOBS);
    free(t);
    metrics_destroy(&m);
}

Test(metrics, window_rate) {
    met_window_t w = {0};
    cr_assert_float_eq(met_window_rate(&w, 0, 0, 10), 0, 0, "one sample: no rate");
    cr_assert_float_eq(met_window_rate(&w, 1, 100, 10), 100, 1e-9);
    // constant 100/s for 40 s, then 10/s: the 10 s window shows the new rate once the old
    // samples leave it
    double v = 100;
    for (int t = 2; t <= 40; t++) met_window_rate(&w, t, v += 100, 10);
    double r = 0;
    for (int t = 41; t <= 60; t++) r = met_window_rate(&w, t, v += 10, 10);
    cr_assert_float_eq(r, 10, 1e-9);
    // samples 0.5 s apart: the window still spans no more than 10 s
    met_window_t w2 = {0};
    double r2 = 0;
    for (int k = 0; k < 100; k++) r2 = met_window_rate(&w2, k * 0.5, k < 80 ? k * 0.5 : 40 + (k - 80) * 0.5 * 3, 10);
    // last 10 s (t = 39.5 .. 49.5): 0.5 s at rate 1 and 9.5 s at rate 3 -> mean 2.9
    cr_assert_float_eq(r2, 2.9, 1e-9, "got %g", r2);
}

static bool fail_check(void *ctx, char *why, size_t n) {
    snprintf(why, n, "dependency %s down", (const char *)ctx);
    return false;
}

Test(metrics, health_and_readiness) {
    metrics_t *m = metrics_new("rollout", "r");
    int st;
    size_t len;
    char *b = metrics_readiness(m, &st, &len);
    cr_assert_eq(st, 503);
    cr_assert_str_eq(b, "not ready: starting\n");
    free(b);
    metrics_ready(m, true, NULL);
    b = metrics_readiness(m, &st, &len);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(b, "ready\n");
    free(b);
    metrics_set_check(m, fail_check, "X");
    b = metrics_readiness(m, &st, &len);
    cr_assert_eq(st, 503);
    cr_assert_str_eq(b, "not ready: dependency X down\n");
    free(b);
    metrics_ready(m, false, "no verifier");
    b = metrics_readiness(m, &st, &len);
    cr_assert_str_eq(b, "not ready: no verifier\n", "the service's own reason comes first");
    free(b);
    b = metrics_health(m, &st, &len);
    cr_assert_eq(st, 200);
    free(b);
    metrics_set_stall(m, 0.05);
    usleep(120 * 1000);
    b = metrics_health(m, &st, &len);
    cr_assert_eq(st, 503);
    cr_assert(strstr(b, "main loop of rollout has not turned"), "%s", b);
    free(b);
    // the age of the loop's last turn is exported (alerts fire before the liveness probe)
    char l[256];
    b = metrics_render(m, &len);
    cr_assert(strstr(b, "# TYPE marlaas_loop_age_seconds gauge\n"), "%s", b);
    cr_assert_not_null(line_of(b, "marlaas_loop_age_seconds", l, sizeof l));
    cr_assert_geq(atof(l + strlen("marlaas_loop_age_seconds ")), 0.1, "%s", l);
    free(b);
    metrics_alive(m);
    b = metrics_health(m, &st, &len);
    cr_assert_eq(st, 200);
    free(b);
    b = metrics_render(m, &len);
    cr_assert_not_null(line_of(b, "marlaas_loop_age_seconds", l, sizeof l));
    cr_assert_lt(atof(l + strlen("marlaas_loop_age_seconds ")), 0.1, "%s", l);
    free(b);
    metrics_destroy(&m);
}

Test(http, listen_settings) {
    char host[64], err[ERR_LEN];
    int port = -1;
    cr_assert_eq(http_parse_listen("0", host, sizeof host, &port, err), 0);
    cr_assert_eq(http_parse_listen("off", host, sizeof host, &port, err), 0);
    cr_assert_eq(http_parse_listen("", host, sizeof host, &port, err), 0);
    cr_assert_eq(http_parse_listen("9501", host, sizeof host, &port, err), 1);
    cr_assert_str_eq(host, "0.0.0.0");
    cr_assert_eq(port, 9501);
    cr_assert_eq(http_parse_listen("127.0.0.1:80", host, sizeof host, &port, err), 1);
    cr_assert_str_eq(host, "127.0.0.1");
    cr_assert_eq(port, 80);
    const char *bad[] = {"99999", "-1", "abc", ":80", "host:", "1.2.3.4:0", "80x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        cr_assert_eq(http_parse_listen(bad[i], host, sizeof host, &port, err), -1, "%s", bad[i]);
        cr_assert(strstr(err, "give PORT, HOST:PORT, or 0"), "%s: %s", bad[i], err);
    }
}

// One HTTP/1.0 request over a real socket; returns the whole response (malloc'd).
static char *request(int port, const char *method, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method, path);
    cr_assert_eq(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    ssize_t r;
    while ((r = read(fd, buf + len, cap - len - 1)) > 0) len += (size_t)r;
    close(fd);
    return buf;
}

Test(http, serves_the_three_endpoints_over_a_socket) {
    metrics_t *m = metrics_new("verifier", "v-1");
    int f = metrics_def(m, "marlaas_verifier_samples_total", MET_COUNTER, "Samples.");
    metrics_add(m, f, NULL, 12);
    char setting[64], err[ERR_LEN];
    int port = tu_free_port();
    snprintf(setting, sizeof setting, "127.0.0.1:%d", port);
    http_srv_t *h = http_start(setting, m, err);
    cr_assert_not_null(h, "%s", err);
    cr_assert_eq(http_port(h), port);
    char *r = request(port, "GET", "/metrics");
    cr_assert(!strncmp(r, "HTTP/1.0 200", 12) || !strncmp(r, "HTTP/1.1 200", 12), "%s", r);
    cr_assert(strstr(r, "text/plain; version=0.0.4"), "%s", r);
    cr_assert(strstr(r, "\r\n\r\n# HELP marlaas_info"), "%s", r);
    cr_assert(strstr(r, "\nmarlaas_verifier_samples_total 12\n"), "%s", r);
    free(r);
    metrics_add(m, f, NULL, 1);   // live: the next scrape sees it
    r = request(port, "GET", "/metrics");
    cr_assert(strstr(r, "\nmarlaas_verifier_samples_total 13\n"), "%s", r);
    free(r);
    r = request(port, "GET", "/readyz");
    cr_assert(strstr(r, " 503 ") && strstr(r, "not ready: starting"), "%s", r);
    free(r);
    metrics_ready(m, true, NULL);
    r = request(port, "GET", "/readyz");
    cr_assert(strstr(r, " 200 ") && strstr(r, "\r\n\r\nready\n"), "%s", r);
    free(r);
    r = request(port, "GET", "/healthz");
    cr_assert(strstr(r, " 200 ") && strstr(r, "\r\n\r\nok\n"), "%s", r);
    free(r);
    r = request(port, "GET", "/other");
    cr_assert(strstr(r, " 404 "), "%s", r);
    free(r);
    r = request(port, "DELETE", "/metrics");
    cr_assert(strstr(r, " 405 "), "%s", r);
    free(r);
    // the same port again: refused with the reason and what to set
    metrics_t *m2 = metrics_new("x", "y");
    cr_assert_null(http_start(setting, m2, err));
    cr_assert(strstr(err, "Address already in use") && strstr(err, "MARLAAS_HTTP"), "%s", err);
    metrics_destroy(&m2);
    http_stop(&h);
    cr_assert_null(h);
    // stopped: the port is free again
    h = http_start(setting, m, err);
    cr_assert_not_null(h, "%s", err);
    http_stop(&h);
    // off: no server, no error
    cr_assert_null(http_start("0", m, err));
    cr_assert_str_eq(err, "");
    metrics_destroy(&m);
}

// test_log.c - the log line formats (common/util/log.c): the text line exactly as it always was,
// the time against gmtime_r, and the json format parsed back with cJSON: every field, escaping
// (quotes, backslashes, control characters, bytes that are not UTF-8), one object per line at
// every buffer size, key=value fields, and lines written by log_write to stderr.
#include <criterion/criterion.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util/log.h"
#include "common/util/rng.h"

// 2026-11-30T08:49:50.123Z
static const struct timespec T0 = {.tv_sec = 1796028590, .tv_nsec = 123456789};

static cJSON *parse_line(const char *line, size_t n) {
    cr_assert_gt(n, 0);
    cr_assert_eq(line[n - 1], '\n', "a line ends with its newline: %s", line);
    cr_assert_eq(strlen(line), n);
    cr_assert_eq(memchr(line, '\n', n - 1), NULL, "one line: %s", line);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(line, n - 1, &end, false);
    cr_assert_not_null(o, "not JSON: %s", line);
    cr_assert_eq(end, line + n - 1, "one object, nothing after it: %s", line);
    cr_assert(cJSON_IsObject(o));
    return o;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

Test(log, text_line_as_before) {
    char l[LOG_LINE_MAX];
    size_t n = log_render(l, sizeof l, LOG_TEXT, LOGL_INFO, &T0, "trainer", "trainer-h-1", "t-1", "j-3", "step=12 version=12");
    cr_assert_str_eq(l, "2026-11-30T08:49:50.123Z INFO  trainer job=j-3 step=12 version=12\n");
    cr_assert_eq(n, strlen(l));
    log_render(l, sizeof l, LOG_TEXT, LOGL_WARN, &T0, "rollout", NULL, NULL, NULL, "two\nlines");
    cr_assert_str_eq(l, "2026-11-30T08:49:50.123Z WARN  rollout two lines\n");
    log_render(l, sizeof l, LOG_TEXT, LOGL_ERROR, &T0, "verifier", NULL, NULL, NULL, "x");
    cr_assert_str_eq(l, "2026-11-30T08:49:50.123Z ERROR verifier x\n");
    log_render(l, sizeof l, LOG_TEXT, LOGL_DEBUG, &T0, "scheduler", NULL, NULL, NULL, "");
    cr_assert_str_eq(l, "2026-11-30T08:49:50.123Z DEBUG scheduler \n");
    log_render(l, sizeof l, LOG_TEXT, LOGL_FATAL, &T0, "scheduler", NULL, NULL, "j", "out of memory at x.c:3");
    cr_assert_str_eq(l, "FATAL out of memory at x.c:3\n");
    // cut at 2046 bytes and a newline, as the text format always was
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    n = log_render(l, sizeof l, LOG_TEXT, LOGL_INFO, &T0, "trainer", NULL, NULL, NULL, big);
    cr_assert_eq(n, 2047);
    cr_assert_eq(l[2046], '\n');
    cr_assert_eq(l[2045], 'a');
    // a small buffer cuts the line too, never past cap
    n = log_render(l, 64, LOG_TEXT, LOGL_INFO, &T0, "trainer", NULL, NULL, NULL, big);
    cr_assert_eq(n, 63);
    cr_assert_eq(l[62], '\n');
}

Test(log, time_matches_gmtime) {
    rng_t r;
    rng_seed(&r, 7);
    char l[256], want[64];
    for (int i = 0; i < 20000; i++) {
        // 1970 .. 2200, with the ends of months and leap days likely enough
        struct timespec ts = {.tv_sec = (time_t)(rng_next(&r) % 7258118400ULL), .tv_nsec = (long)(rng_next(&r) % 1000000000)};
        if (i < 400) ts.tv_sec = (time_t)(951782400 + 86400LL * (i - 200) + i % 2);   // around 2000-02-29
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        snprintf(want, sizeof want, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
        log_render(l, sizeof l, LOG_TEXT, LOGL_INFO, &ts, "s", NULL, NULL, NULL, "m");
        cr_assert(!strncmp(l, want, strlen(want)), "%lld: %s vs %s", (long long)ts.tv_sec, l, want);
        log_render(l, sizeof l, LOG_JSON, LOGL_INFO, &ts, "s", NULL, NULL, NULL, "m");
        cr_assert(!strncmp(l + 9, want, strlen(want)), "%s vs %s", l, want);
    }
}

Test(log, json_fields) {
    char l[LOG_LINE_MAX];
    size_t n = log_render(l, sizeof l, LOG_JSON, LOGL_INFO, &T0, "trainer", "trainer-h-1", "t-7", "j-3",
                          "step=12 version=3 reward=0.512, kl=0.01; tokens/s=1234 a=b=c (n=8) x= =y step=99 done");
    cJSON *o = parse_line(l, n);
    cr_assert_str_eq(str(o, "time"), "2026-11-30T08:49:50.123Z");
    cr_assert_str_eq(str(o, "level"), "info");
    cr_assert_str_eq(str(o, "service"), "trainer");
    cr_assert_str_eq(str(o, "id"), "trainer-h-1");
    cr_assert_str_eq(str(o, "job"), "j-3");
    cr_assert_str_eq(str(o, "tenant"), "t-7");
    cr_assert_str_eq(str(o, "message"), "step=12 version=3 reward=0.512, kl=0.01; tokens/s=1234 a=b=c (n=8) x= =y step=99 done");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "fields");
    cr_assert(cJSON_IsObject(f));
    cr_assert_str_eq(str(f, "step"), "12", "the first of a key");
    cr_assert_str_eq(str(f, "version"), "3");
    cr_assert_str_eq(str(f, "reward"), "0.512");
    cr_assert_str_eq(str(f, "kl"), "0.01");
    cr_assert_str_eq(str(f, "tokens/s"), "1234");
    cr_assert_str_eq(str(f, "a"), "b=c");
    cr_assert_eq(cJSON_GetArraySize(f), 6, "no field from '(n=8)', 'x=', '=y': %s", l);
    cr_assert_str_eq(l, "{\"time\":\"2026-11-30T08:49:50.123Z\",\"level\":\"info\",\"service\":\"trainer\","
                        "\"id\":\"trainer-h-1\",\"job\":\"j-3\",\"tenant\":\"t-7\",\"message\":\"step=12 version=3 "
                        "reward=0.512, kl=0.01; tokens/s=1234 a=b=c (n=8) x= =y step=99 done\",\"fields\":{\"step\":"
                        "\"12\",\"version\":\"3\",\"reward\":\"0.512\",\"kl\":\"0.01\",\"tokens/s\":\"1234\","
                        "\"a\":\"b=c\"}}\n");
    cJSON_Delete(o);
    // unknown parts are left out, not written empty; the levels by name
    static const char *levels[] = {"debug", "info", "warn", "error", "fatal"};
    for (int lv = LOGL_DEBUG; lv <= LOGL_FATAL; lv++) {
        n = log_render(l, sizeof l, LOG_JSON, lv, &T0, "rollout", "", NULL, "", "no pairs here");
        o = parse_line(l, n);
        cr_assert_str_eq(str(o, "level"), levels[lv]);
        cr_assert_null(cJSON_GetObjectItemCaseSensitive(o, "id"));
        cr_assert_null(cJSON_GetObjectItemCaseSensitive(o, "job"));
        cr_assert_null(cJSON_GetObjectItemCaseSensitive(o, "tenant"));
        cr_assert_null(cJSON_GetObjectItemCaseSensitive(o, "fields"));
        cr_assert_eq(cJSON_GetArraySize(o), 4, "%s", l);
        cJSON_Delete(o);
    }
}

Test(log, json_escaping) {
    char l[LOG_LINE_MAX];
    // quotes, backslashes, every control character, DEL, valid multi-byte characters
    char msg[128];
    int k = 0;
    msg[k++] = '"';
    msg[k++] = '\\';
    for (int c = 1; c < 0x20; c++) msg[k++] = (char)c;
    msg[k++] = 0x7f;
    const char *utf = "é€😀";
    memcpy(msg + k, utf, strlen(utf));
    k += (int)strlen(utf);
    msg[k] = 0;
    size_t n = log_render(l, sizeof l, LOG_JSON, LOGL_WARN, &T0, "verifier", "v\"1", "t\\x", "j\n1", msg);
    cJSON *o = parse_line(l, n);
    cr_assert_str_eq(str(o, "message"), msg, "the message comes back as it was");
    cr_assert_str_eq(str(o, "id"), "v\"1");
    cr_assert_str_eq(str(o, "tenant"), "t\\x");
    cr_assert_str_eq(str(o, "job"), "j\n1");
    cJSON_Delete(o);
    cr_assert(strstr(l, "\\\"\\\\\\u0001\\u0002"), "%s", l);
    cr_assert(strstr(l, "\\b\\t\\n\\u000b\\f\\r"), "%s", l);
    cr_assert(strstr(l, "\\u001f\\u007fé€😀"), "%s", l);
    // not UTF-8: a stray continuation byte, 0xff, a cut sequence, an overlong '/', a surrogate
    static const struct {
        const char *in, *out;
    } bad[] = {
        {"a\x80z", "a\xEF\xBF\xBDz"},
        {"a\xffz", "a\xEF\xBF\xBDz"},
        {"a\xe2\x82", "a\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"a\xc0\xafz", "a\xEF\xBF\xBD\xEF\xBF\xBDz"},
        {"a\xed\xa0\x80z", "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz"},
        {"k=\xff", "k=\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = log_render(l, sizeof l, LOG_JSON, LOGL_INFO, &T0, "s", NULL, NULL, NULL, bad[i].in);
        cr_assert_eq(memchr(l, 0x80, n), NULL);
        o = parse_line(l, n);
        cr_assert_str_eq(str(o, "message"), bad[i].out, "case %zu: %s", i, l);
        cJSON_Delete(o);
    }
    cr_assert(strstr(l, "\"fields\":{\"k\":\"\\ufffd\"}"), "%s", l);
}

// Every cap, hostile messages: always one complete object on one line within cap; uncut
// messages come back byte for byte.
Test(log, json_always_one_object) {
    rng_t r;
    rng_seed(&r, 11);
    static const char alphabet[] = "ab=\" \\\n\t\x01\x7f\xc3\xa9\xff\xe2\x82\xac,;/.";
    char msg[2048], l[LOG_LINE_MAX];
    for (int it = 0; it < 3000; it++) {
        size_t len = rng_next(&r) % (it % 10 == 0 ? sizeof msg - 1 : 300);
        for (size_t i = 0; i < len; i++) msg[i] = alphabet[rng_next(&r) % (sizeof alphabet - 1)];
        msg[len] = 0;
        size_t cap = it % 3 == 0 ? LOG_LINE_MAX : 64 + rng_next(&r) % 1500;
        size_t n = log_render(l, cap, LOG_JSON, LOGL_INFO, &T0, "rollout", "rollout-host-12", "tenant-9", "j-77", msg);
        cr_assert_lt(n, cap);
        cJSON *o = parse_line(l, n);
        cr_assert_str_eq(str(o, "time"), "2026-11-30T08:49:50.123Z");
        if (cap == LOG_LINE_MAX) {
            // the json line of the longest text message fits whole
            const char *m = str(o, "message");
            cr_assert_not_null(m);
            bool valid = true;
            for (size_t i = 0; i < len && valid; i++) valid = (unsigned char)msg[i] < 0x80;
            if (valid) cr_assert_str_eq(m, msg);
        }
        cJSON_Delete(o);
    }
}

// log_write and log_fatal: what reaches stderr, in both formats, and the level filter.
Test(log, write_to_stderr) {
    char path[] = "/tmp/marlaas-log-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    log_init("trainer");
    log_set_id("trainer-host-9");
    log_set_level(LOGL_INFO);
    cr_assert_eq(log_parse_format("json"), LOG_JSON);
    cr_assert_eq(log_parse_format("text"), LOG_TEXT);
    cr_assert_eq(log_parse_format("JSON"), -1);
    cr_assert_eq(log_parse_format(NULL), -1);
    log_set_format(LOG_TEXT);
    logj_info("j-1", "step=%d", 4);
    log_set_format(LOG_JSON);
    cr_assert_eq(log_get_format(), LOG_JSON);
    logj_info("j-1", "step=%d", 5);
    logt_warn("t-2", "j-2", "reward service: %s", "timeout");
    log_debug("filtered out");
    log_fatal("assertion failed: %s", "x > 0");
    log_set_format(LOG_TEXT);
    log_fatal("out of memory");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    char line[LOG_LINE_MAX];
    char *lines[8];
    int nl = 0;
    while (nl < 8 && fgets(line, sizeof line, f)) lines[nl++] = strdup(line);
    fclose(f);
    unlink(path);
    cr_assert_eq(nl, 5, "five lines (the debug one filtered)");
    cr_assert(!strcmp(lines[0] + 24, " INFO  trainer job=j-1 step=4\n"), "%s", lines[0]);
    cJSON *o = parse_line(lines[1], strlen(lines[1]));
    cr_assert_str_eq(str(o, "service"), "trainer");
    cr_assert_str_eq(str(o, "id"), "trainer-host-9");
    cr_assert_str_eq(str(o, "job"), "j-1");
    cr_assert_str_eq(str(cJSON_GetObjectItemCaseSensitive(o, "fields"), "step"), "5");
    cJSON_Delete(o);
    o = parse_line(lines[2], strlen(lines[2]));
    cr_assert_str_eq(str(o, "level"), "warn");
    cr_assert_str_eq(str(o, "tenant"), "t-2");
    cr_assert_str_eq(str(o, "message"), "reward service: timeout");
    cJSON_Delete(o);
    o = parse_line(lines[3], strlen(lines[3]));
    cr_assert_str_eq(str(o, "level"), "fatal");
    cr_assert_str_eq(str(o, "message"), "assertion failed: x > 0");
    cJSON_Delete(o);
    cr_assert_str_eq(lines[4], "FATAL out of memory\n");
    for (int i = 0; i < nl; i++) free(lines[i]);
}

// console.c - the scheduler's web console (console.h).
#include "services/scheduler/console.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/formats/peft.h"
#include "common/rl/keys.h"
#include "common/svc/http.h"
#include "common/util/log.h"

#define COOKIE "marlaas_session"
#define MAX_METRICS 4000     // entries of a job's stream the job page gets (its latest)
#define MAX_JOBS_SUMMED 200  // jobs of the table whose streams are read for tokens/s
#define TABLE_ENTRIES 32     // latest metrics entries read per job for the table
#define MAX_ADAPTERS 16      // versions looked for below the current one
#define MAX_SERVICES 256     // heartbeats of the cluster view

typedef struct {
    bool used, admin;
    char id[65];             // hex of 32 random bytes: the cookie
    char csrf[65];           // hex of 32 random bytes: X-CSRF-Token
    char token[256];         // the token logged in with (server memory only)
    char tenant[PROTO_MAX_ID];
    double created, expires;
} session_t;

struct console {
    struct MHD_Daemon *d;
    api_t *api;
    store_t *st;
    int port;
    uint64_t refused;         // logins refused
    double refused_logged;    // when the last refusal was logged
    session_t s[CONSOLE_MAX_SESSIONS];
};

typedef struct {             // one request's state across libmicrohttpd's calls
    char body[CONSOLE_MAX_BODY + 1];
    size_t len;
    bool too_big;
} req_t;

static double now_s(void) { return (double)time(NULL); }

// --- responses ---------------------------------------------------------------------------------

// Every response carries the same security headers: the page's scripts and styles come from this
// origin only (no inline script, no eval), it may not be framed, types are not sniffed.
static void secure_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                            "frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-store");
}

static enum MHD_Result send_buf(struct MHD_Connection *con, unsigned status, const void *data, size_t len,
                                enum MHD_ResponseMemoryMode mode, const char *type, const char *cookie,
                                const char *disposition) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, mode);
    if (!r) return MHD_NO;
    secure_headers(r);
    MHD_add_response_header(r, "Content-Type", type);
    if (cookie) MHD_add_response_header(r, "Set-Cookie", cookie);
    if (disposition) MHD_add_response_header(r, "Content-Disposition", disposition);
    enum MHD_Result ok = MHD_queue_response(con, status, r);
    MHD_destroy_response(r);
    return ok;
}

// o is consumed.
static enum MHD_Result send_json(struct MHD_Connection *con, unsigned status, cJSON *o, const char *cookie) {
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!txt) return MHD_NO;
    size_t n = strlen(txt);
    char *copy = xmalloc(n + 1);   // libmicrohttpd frees with free(); cJSON's allocator may differ
    memcpy(copy, txt, n + 1);
    cJSON_free(txt);
    return send_buf(con, status, copy, n, MHD_RESPMEM_MUST_FREE, "application/json; charset=utf-8", cookie, NULL);
}

static enum MHD_Result send_error(struct MHD_Connection *con, unsigned status, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    return send_json(con, status, o, NULL);
}

// --- sessions ----------------------------------------------------------------------------------

static void session_clear(session_t *s) { sodium_memzero(s, sizeof *s); }

// The live session of the request's cookie, or NULL. Ids are compared in constant time.
static session_t *session_of(console_t *c, struct MHD_Connection *con) {
    const char *id = MHD_lookup_connection_value(con, MHD_COOKIE_KIND, COOKIE);
    if (!id || strlen(id) != 64) return NULL;
    double now = now_s();
    for (int i = 0; i < CONSOLE_MAX_SESSIONS; i++) {
        session_t *s = &c->s[i];
        if (!s->used) continue;
        if (s->expires <= now) {
            session_clear(s);
            continue;
        }
        if (sodium_memcmp(s->id, id, 64) == 0) return s;
    }
    return NULL;
}

// A new session for a token (checked by the caller). The table is bounded: a token keeps at most
// CONSOLE_MAX_SESSIONS_PER_TOKEN (its oldest goes), the table CONSOLE_MAX_SESSIONS (the oldest
// goes), so no token can crowd the others out for long.
static session_t *session_new(console_t *c, const char *token, const char *tenant, bool admin) {
    double now = now_s();
    int free_i = -1, oldest = -1, mine = 0, my_oldest = -1;
    for (int i = 0; i < CONSOLE_MAX_SESSIONS; i++) {
        session_t *s = &c->s[i];
        if (s->used && s->expires <= now) session_clear(s);
        if (!s->used) {
            if (free_i < 0) free_i = i;
            continue;
        }
        if (oldest < 0 || s->created < c->s[oldest].created) oldest = i;
        if (!strcmp(s->token, token)) {
            mine++;
            if (my_oldest < 0 || s->created < c->s[my_oldest].created) my_oldest = i;
        }
    }
    int at = mine >= CONSOLE_MAX_SESSIONS_PER_TOKEN ? my_oldest : free_i >= 0 ? free_i : oldest;
    session_t *s = &c->s[at];
    session_clear(s);
    unsigned char rnd[32];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(s->id, sizeof s->id, rnd, sizeof rnd);
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(s->csrf, sizeof s->csrf, rnd, sizeof rnd);
    sodium_memzero(rnd, sizeof rnd);
    snprintf(s->token, sizeof s->token, "%s", token);
    snprintf(s->tenant, sizeof s->tenant, "%s", tenant);
    s->admin = admin;
    s->created = now;
    s->expires = now + CONSOLE_SESSION_S;
    s->used = true;
    return s;
}

// The request's X-CSRF-Token equals its session's (constant time).
static bool csrf_ok(const session_t *s, struct MHD_Connection *con) {
    const char *t = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "X-CSRF-Token");
    return t && strlen(t) == 64 && sodium_memcmp(t, s->csrf, 64) == 0;
}

// --- the API, through the session's token --------------------------------------------------------

// Runs op with the session's token through api_handle: the API's own checks decide. 0 with *rep
// (proto_rep_free), -1 with the API's error in err.
static int call(console_t *c, const session_t *s, const char *op, proto_args_t *args, proto_rep_t *rep, char *err,
                size_t n_err) {
    proto_req_t q = {.op = (char *)op, .token = (char *)s->token};
    if (args) q.args = *args;
    memset(rep, 0, sizeof *rep);
    api_handle(c->api, &q, rep);
    if (args) proto_args_free(args);
    if (rep->ok) return 0;
    snprintf(err, n_err, "%s", rep->error ? rep->error : "failed");
    proto_rep_free(rep);
    return -1;
}

static unsigned status_of(const char *err) {
    if (!strncmp(err, "no such job", 11)) return 404;
    if (strstr(err, "token")) return 401;
    return 400;
}

static cJSON *result_parsed(const proto_rep_t *rep, const char *key) {
    const char *t = proto_args_get_text(&rep->result, key);
    return t ? cJSON_Parse(t) : NULL;
}

// A job's metrics stream (its latest count entries) as a JSON array, NULL + err.
static cJSON *job_metrics(console_t *c, const session_t *s, const char *job, int count, char *err, size_t n_err) {
    proto_args_t a = {0};
    proto_args_str(&a, "job", job);
    proto_args_int(&a, "count", count);
    proto_rep_t rep;
    if (call(c, s, "job_metrics", &a, &rep, err, n_err)) return NULL;
    cJSON *m = result_parsed(&rep, "metrics");
    proto_rep_free(&rep);
    if (!m) snprintf(err, n_err, "metrics unreadable");
    return m;
}

static double num(const cJSON *o, const char *k, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

// The table's summary of a job's stream: latest reward, staleness and mismatch, tokens generated,
// compute seconds (rollout generation + training), tokens per second of the latest steps.
// Tokens/s over the wall time of the latest 10 steps of m (the job's latest entries): their
// tokens since the step before. Totals, the latest reward and staleness come with the job (the
// trainer keeps them in the job hash).
static void summarize(cJSON *job, const cJSON *m) {
    double tok_recent = 0, t_first = 0, t_last = 0;
    int seen = 0;
    for (int i = cJSON_GetArraySize(m) - 1; i >= 0 && seen < 11; i--) {
        const cJSON *e = cJSON_GetArrayItem(m, i);
        if (!cJSON_HasObjectItem(e, "reward")) continue;
        if (seen == 0) t_last = num(e, "time", 0);
        if (seen < 10) tok_recent += num(e, "tokens", 0);
        t_first = num(e, "time", 0);
        seen++;
    }
    if (seen > 1 && t_last > t_first) cJSON_AddNumberToObject(job, "tokens_per_s", tok_recent / (t_last - t_first));
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

// --- handlers ------------------------------------------------------------------------------------

static enum MHD_Result h_login(console_t *c, struct MHD_Connection *con, const req_t *rq) {
    // A header a cross-site form cannot send (and a cross-site script cannot without a preflight
    // this server never grants): no login forged from another site.
    if (!MHD_lookup_connection_value(con, MHD_HEADER_KIND, "X-Marlaas-Console"))
        return send_error(con, 403, "missing the X-Marlaas-Console header");
    char token[256] = "";
    const char *p = rq->body, *end = rq->body + rq->len;
    // application/x-www-form-urlencoded: token=...
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *e = amp ? amp : end;
        if (e - p > 6 && !memcmp(p, "token=", 6)) {
            size_t o = 0;
            for (const char *q = p + 6; q < e && o + 1 < sizeof token; q++) {
                int hi, lo;
                if (*q == '+') token[o++] = ' ';
                else if (*q == '%' && e - q > 2 && (hi = hexval(q[1])) >= 0 && (lo = hexval(q[2])) >= 0) {
                    token[o++] = (char)(hi * 16 + lo);
                    q += 2;
                } else token[o++] = *q;
            }
            token[o] = 0;
        }
        p = e + 1;
    }
    char tenant[PROTO_MAX_ID], err[ERR_LEN];
    bool admin = false;
    if (!token[0] || strlen(token) >= sizeof token - 1 || api_whoami(c->api, token, tenant, &admin, err)) {
        sodium_memzero(token, sizeof token);
        // one line per 5 s at most: a flood of bad logins cannot fill the disk
        if (now_s() - c->refused_logged >= 5) {
            log_warn("console: a login with an invalid token was refused (%llu so far)",
                     (unsigned long long)c->refused + 1);
            c->refused_logged = now_s();
        }
        c->refused++;
        return send_error(con, 401, "invalid token");
    }
    session_t *s = session_new(c, token, tenant, admin);
    sodium_memzero(token, sizeof token);
    if (admin) log_info("console: admin logged in (read-only)");
    else logt_info(tenant, NULL, "console: tenant %s logged in", tenant);
    char cookie[200];
    snprintf(cookie, sizeof cookie, COOKIE "=%s; HttpOnly; SameSite=Strict; Path=/; Max-Age=%d", s->id,
             CONSOLE_SESSION_S);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tenant", admin ? "" : s->tenant);
    cJSON_AddBoolToObject(o, "admin", admin);
    cJSON_AddStringToObject(o, "csrf", s->csrf);
    cJSON_AddNumberToObject(o, "expires", s->expires);
    return send_json(con, 200, o, cookie);
}

static enum MHD_Result h_me(struct MHD_Connection *con, const session_t *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tenant", s->admin ? "" : s->tenant);
    cJSON_AddBoolToObject(o, "admin", s->admin);
    cJSON_AddStringToObject(o, "csrf", s->csrf);
    cJSON_AddNumberToObject(o, "expires", s->expires);
    return send_json(con, 200, o, NULL);
}

static enum MHD_Result h_jobs(console_t *c, struct MHD_Connection *con, const session_t *s) {
    char err[ERR_LEN];
    proto_rep_t rep;
    if (call(c, s, "job_list", NULL, &rep, err, sizeof err)) return send_error(con, status_of(err), err);
    cJSON *jobs = result_parsed(&rep, "jobs");
    proto_rep_free(&rep);
    if (!cJSON_IsArray(jobs)) {
        cJSON_Delete(jobs);
        return send_error(con, 500, "job list unreadable");
    }
    double total = 0;
    int n = cJSON_GetArraySize(jobs);
    for (int i = 0; i < n && i < MAX_JOBS_SUMMED; i++) {
        cJSON *j = cJSON_GetArrayItem(jobs, i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
        if (!cJSON_IsString(id)) continue;
        // the latest entries only (11 steps and a few eval entries between them): the table's
        // cost per poll does not grow with a job's steps
        cJSON *m = job_metrics(c, s, id->valuestring, TABLE_ENTRIES, err, sizeof err);
        if (m) summarize(j, m);
        cJSON_Delete(m);
        total += num(j, "compute_s", 0);
    }
    // cost share: the job's compute seconds over those of every job in the table
    for (int i = 0; i < n && total > 0; i++) {
        cJSON *j = cJSON_GetArrayItem(jobs, i);
        if (cJSON_HasObjectItem(j, "compute_s")) cJSON_AddNumberToObject(j, "cost_share", num(j, "compute_s", 0) / total);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "jobs", jobs);
    return send_json(con, 200, o, NULL);
}

static enum MHD_Result h_job(console_t *c, struct MHD_Connection *con, const session_t *s, bool metrics_only) {
    const char *job = MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "id");
    if (!job) return send_error(con, 400, "id required");
    char err[ERR_LEN];
    cJSON *o = cJSON_CreateObject();
    if (!metrics_only) {
        proto_args_t a = {0};
        proto_args_str(&a, "job", job);
        proto_rep_t rep;
        if (call(c, s, "job_status", &a, &rep, err, sizeof err)) {
            cJSON_Delete(o);
            return send_error(con, status_of(err), err);
        }
        cJSON *st = result_parsed(&rep, "status");
        proto_rep_free(&rep);
        if (!st) st = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "job", st);
        // the adapter versions still kept (the trainer keeps the latest few): the API decided above
        // that this session may see the job
        cJSON *samples = cJSON_AddArrayToObject(o, "samples");
        char skey[KEY_LEN], e3[ERR_LEN];
        store_buf_t *items = NULL;
        int ni = 0;
        if (key_job_samples(c->st, skey, sizeof skey, job) && store_lrange(c->st, skey, 0, -1, &items, &ni, e3) == 0)
            for (int i = ni - 1; i >= 0; i--) {   // newest first
                cJSON *it = cJSON_Parse((const char *)items[i].data);
                if (it) cJSON_AddItemToArray(samples, it);
            }
        store_bufv_free(&items, ni);
        cJSON *vers = cJSON_AddArrayToObject(o, "adapters");
        double cur = num(st, "adapter_version", 0);
        for (double v = cur; v >= 0 && v > cur - MAX_ADAPTERS; v--) {
            char key[KEY_LEN], e2[ERR_LEN];
            if (key_adapter(c->st, key, sizeof key, job, (uint32_t)v) && store_exists(c->st, key, e2) == 0)
                cJSON_AddItemToArray(vers, cJSON_CreateNumber(v));
        }
    }
    cJSON *m = job_metrics(c, s, job, MAX_METRICS, err, sizeof err);
    if (!m) {
        cJSON_Delete(o);
        return send_error(con, status_of(err), err);
    }
    cJSON_AddItemToObject(o, "metrics", m);
    return send_json(con, 200, o, NULL);
}

static enum MHD_Result h_adapter(console_t *c, struct MHD_Connection *con, const session_t *s) {
    const char *job = MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "id");
    const char *ver = MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "version");
    const char *best = MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "best");
    if (!job) return send_error(con, 400, "id required");
    if (best && (strcmp(best, "1") != 0 || ver)) return send_error(con, 400, "best must be 1, without a version");
    proto_args_t a = {0};
    proto_args_str(&a, "job", job);
    if (best) proto_args_int(&a, "best", 1);
    if (ver) {
        char *end;
        long long v = strtoll(ver, &end, 10);
        if (!*ver || *end || v < 0 || v > UINT32_MAX) {
            proto_args_free(&a);
            return send_error(con, 400, "version must be an integer");
        }
        proto_args_int(&a, "version", v);
    }
    char err[ERR_LEN];
    proto_rep_t rep;
    if (call(c, s, "adapter_get", &a, &rep, err, sizeof err)) return send_error(con, status_of(err), err);
    const proto_val_t *b = proto_args_get(&rep.result, "blob");
    int64_t v = 0;
    proto_args_get_int(&rep.result, "version", &v);
    if (!b || b->kind != PROTO_VAL_BIN) {
        proto_rep_free(&rep);
        return send_error(con, 500, "no adapter in the reply");
    }
    // the job's PEFT adapter as `marlaas adapter pull` writes it, in one tar: job ids are j-N (the
    // API found it), safe in a folder name and a header
    char dir[PROTO_MAX_ID + 32], disp[2 * sizeof dir], e2[ERR_LEN];
    snprintf(dir, sizeof dir, "%s-v%lld", job, (long long)v);
    uint8_t *tar = NULL;
    size_t len = 0;
    int rc = peft_archive_tar(b->s, b->len, proto_args_get_str(&rep.result, "base_model"), dir, &tar, &len, e2);
    proto_rep_free(&rep);
    if (rc) {
        logj_error(job, "console: the adapter version %lld could not be packed: %s", (long long)v, e2);
        return send_error(con, 500, "the stored adapter could not be packed; see the scheduler's log");
    }
    snprintf(disp, sizeof disp, "attachment; filename=\"%s%s-peft.tar\"", dir, best ? "-best" : "");
    return send_buf(con, 200, tar, len, MHD_RESPMEM_MUST_FREE, "application/x-tar", NULL, disp);
}

static enum MHD_Result h_cancel(console_t *c, struct MHD_Connection *con, const session_t *s, const req_t *rq) {
    if (!csrf_ok(s, con)) return send_error(con, 403, "missing or wrong CSRF token");
    if (s->admin) return send_error(con, 403, "the admin's console is read-only");
    char job[PROTO_MAX_ID] = "";
    if (rq->len > 3 && !memcmp(rq->body, "id=", 3)) snprintf(job, sizeof job, "%.*s", (int)(rq->len - 3), rq->body + 3);
    if (!job[0]) return send_error(con, 400, "id required");
    proto_args_t a = {0};
    proto_args_str(&a, "job", job);
    char err[ERR_LEN];
    proto_rep_t rep;
    if (call(c, s, "job_cancel", &a, &rep, err, sizeof err)) return send_error(con, status_of(err), err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", proto_args_get_str(&rep.result, "status") ?: "");
    proto_rep_free(&rep);
    return send_json(con, 200, o, NULL);
}

// The services' heartbeats (svc:{name}:{id}, written every second with a TTL of 10 s): the
// operator's view, so the admin's only.
static enum MHD_Result h_cluster(console_t *c, struct MHD_Connection *con, const session_t *s) {
    if (!s->admin) return send_error(con, 403, "the cluster view is the admin's");
    char pat[KEY_LEN], err[ERR_LEN], **keys = NULL;
    int n = 0;
    if (!store_key(c->st, pat, sizeof pat, "svc:*") || store_scan(c->st, pat, MAX_SERVICES, &keys, &n, err))
        return send_error(con, 500, "cannot read the heartbeats");
    cJSON *arr = cJSON_CreateArray();
    double now = now_s();
    for (int i = 0; i < n; i++) {
        store_kv_t *kv = NULL;
        int nk = 0;
        if (store_hgetall(c->st, keys[i], &kv, &nk, err)) continue;
        cJSON *o = cJSON_CreateObject();
        const char *pre = store_prefix(c->st);
        const char *k = keys[i] + (pre && !strncmp(keys[i], pre, strlen(pre)) ? strlen(pre) : 0);
        cJSON_AddStringToObject(o, "key", k);
        for (int f = 0; f < nk; f++) {
            char *end;
            double d = strtod(kv[f].value, &end);
            if (kv[f].value[0] && !*end) cJSON_AddNumberToObject(o, kv[f].field, d);
            else cJSON_AddStringToObject(o, kv[f].field, kv[f].value);
            if (!strcmp(kv[f].field, "time")) cJSON_AddNumberToObject(o, "age_s", now - d);
        }
        store_kv_free(&kv, nk);
        cJSON_AddItemToArray(arr, o);
    }
    store_strv_free(&keys, n);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "services", arr);
    return send_json(con, 200, o, NULL);
}

static const char *type_of(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return "application/octet-stream";
    if (!strcmp(dot, ".html")) return "text/html; charset=utf-8";
    if (!strcmp(dot, ".js")) return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".css")) return "text/css; charset=utf-8";
    if (!strcmp(dot, ".svg")) return "image/svg+xml";
    return "application/octet-stream";
}

static enum MHD_Result h_asset(struct MHD_Connection *con, const char *url) {
    const char *name = !strcmp(url, "/") ? "index.html" : url + 1;
    for (size_t i = 0; i < console_n_assets; i++)
        if (!strcmp(console_assets[i].name, name))
            return send_buf(con, 200, console_assets[i].data, console_assets[i].len, MHD_RESPMEM_PERSISTENT,
                            type_of(name), NULL, NULL);
    return send_error(con, 404, "not found");
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    console_t *c = cls;
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (!post && strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return send_error(con, 405, "method not allowed");
    if (post) {
        req_t *rq = *state;
        if (!rq) {   // the headers: the body (if any) comes in the next calls
            *state = xcalloc(1, sizeof *rq);
            return MHD_YES;
        }
        if (*upload_size) {
            if (rq->len + *upload_size > CONSOLE_MAX_BODY) rq->too_big = true;
            else memcpy(rq->body + rq->len, upload, *upload_size), rq->len += *upload_size;
            *upload_size = 0;
            return MHD_YES;
        }
        if (rq->too_big) return send_error(con, 413, "request body too large");
        if (!strcmp(url, "/api/login")) return h_login(c, con, rq);
        session_t *s = session_of(c, con);
        if (!s) return send_error(con, 401, "not logged in");
        if (!strcmp(url, "/api/cancel")) return h_cancel(c, con, s, rq);
        if (!strcmp(url, "/api/logout")) {
            if (!csrf_ok(s, con)) return send_error(con, 403, "missing or wrong CSRF token");
            session_clear(s);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", true);
            return send_json(con, 200, o, COOKIE "=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
        }
        return send_error(con, 404, "not found");
    }
    if (strncmp(url, "/api/", 5)) return h_asset(con, url);
    session_t *s = session_of(c, con);
    if (!s) return send_error(con, 401, "not logged in");
    if (!strcmp(url, "/api/me")) return h_me(con, s);
    if (!strcmp(url, "/api/jobs")) return h_jobs(c, con, s);
    if (!strcmp(url, "/api/job")) return h_job(c, con, s, false);
    if (!strcmp(url, "/api/metrics")) return h_job(c, con, s, true);
    if (!strcmp(url, "/api/adapter")) return h_adapter(c, con, s);
    if (!strcmp(url, "/api/cluster")) return h_cluster(c, con, s);
    return send_error(con, 404, "not found");
}

static void done(void *cls, struct MHD_Connection *con, void **state, enum MHD_RequestTerminationCode why) {
    free(*state);
    *state = NULL;
}

console_t *console_start(const char *setting, api_t *api, store_t *st, char *err) {
    char host[256];
    int port = 0;
    err[0] = 0;
    int rc = http_parse_listen(setting ? setting : "off", host, sizeof host, &port, err);
    if (rc <= 0) {
        if (rc < 0) {
            char why[ERR_LEN];
            snprintf(why, sizeof why, "%s", err);
            err_set(err, "console setting (--set console / MARLAAS_CONSOLE): %s", why);
        }
        return NULL;
    }
    if (sodium_init() < 0) {
        err_set(err, "libsodium failed to initialise");
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int g = getaddrinfo(host, ports, &hints, &res);
    if (g) {
        err_set(err, "cannot resolve the console's host '%s': %s", host, gai_strerror(g));
        return NULL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 64) < 0) {
        err_set(err, "cannot serve the console on %s:%d: %s (set --set console=HOST:PORT / MARLAAS_CONSOLE to a free "
                "port, or off)", host, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return NULL;
    }
    freeaddrinfo(res);
    console_t *c = xcalloc(1, sizeof *c);
    c->api = api, c->st = st, c->port = port;
    // No thread: console_run serves from the scheduler's loop. Limits like the HTTP endpoint's:
    // bounded connections, per address, a silent one closed after 30 s, requests within 32 KiB.
    c->d = MHD_start_daemon(MHD_USE_EPOLL, 0, NULL, NULL, handle, c, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_LIMIT, 128u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 32u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768,
                            MHD_OPTION_NOTIFY_COMPLETED, done, c, MHD_OPTION_END);
    if (!c->d) {
        err_set(err, "cannot start the console on %s:%d (libmicrohttpd refused its settings)", host, port);
        close(fd);
        free(c);
        return NULL;
    }
    log_info("console at http://%s:%d/", strcmp(host, "0.0.0.0") ? host : "localhost", port);
    return c;
}

void console_run(console_t *c) {
    if (c) MHD_run(c->d);
}

int console_port(const console_t *c) { return c ? c->port : 0; }

void console_stop(console_t **pc) {
    console_t *c = *pc;
    if (!c) return;
    MHD_socket fd = MHD_quiesce_daemon(c->d);
    MHD_stop_daemon(c->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    sodium_memzero(c->s, sizeof c->s);
    free(c);
    *pc = NULL;
}

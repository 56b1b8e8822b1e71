// cmd_api.c - the `marlaas` commands that talk to the scheduler API: tenant create, submit,
// jobs, status, cancel, metrics, watch, adapter pull, generate.
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/rl/keys.h"
#include "cli/client.h"
#include "common/engine/lora.h"
#include "common/rl/rl.h"

// Common flags: --api, --token. Returns a connected client or NULL (message printed).
static client_t *connect_api(const char *api, const char *token, bool admin) {
    char err[ERR_LEN];
    const char *tok = admin ? client_admin_token(token) : client_token(token);
    if (!tok) {
        fprintf(stderr, "marlaas: no %s token: pass --token or set %s (`marlaas up` writes run/env)\n",
                admin ? "admin" : "tenant", admin ? "MARLAAS_ADMIN_TOKEN" : "MARLAAS_TOKEN");
        return NULL;
    }
    client_t *c = client_new(client_endpoint(api), tok, 10000, err);
    if (!c) fprintf(stderr, "marlaas: %s\n", err);
    return c;
}

static int call(client_t *c, const char *op, proto_args_t *args, proto_rep_t *rep) {
    char err[ERR_LEN] = "";
    if (client_call(c, op, args, rep, err)) {
        fprintf(stderr, "marlaas: %s\n", err);
        return -1;
    }
    return 0;
}

typedef struct {
    const char *api, *token;
} conn_t;

// --- tenant -------------------------------------------------------------------------------------

int cmd_tenant(int argc, char **argv) {
    conn_t cn = {0};
    long quota = 16, max_groups = -1, max_data_mb = -1;
    double weight = -1;
    static const char usage[] = "usage: marlaas tenant create NAME [--quota N] [--weight W] [--max-groups N] "
                                "[--max-data-mb N] [--token ADMIN_TOKEN] [--api ENDPOINT]\n";
    static struct option lo[] = {{"api", required_argument, 0, 'a'},        {"token", required_argument, 0, 't'},
                                 {"quota", required_argument, 0, 'q'},      {"weight", required_argument, 0, 'w'},
                                 {"max-groups", required_argument, 0, 'g'}, {"max-data-mb", required_argument, 0, 'd'},
                                 {"help", no_argument, 0, 'h'},             {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (o == 'a') cn.api = optarg;
        else if (o == 't') cn.token = optarg;
        else if (o == 'q') {
            if (cli_int("--quota", optarg, 1, 10000, &quota)) return 2;
        } else if (o == 'w') {
            if (cli_float("--weight", optarg, 0.01, 100, &weight)) return 2;
        } else if (o == 'g') {
            if (cli_int("--max-groups", optarg, 1, 1000000, &max_groups)) return 2;
        } else if (o == 'd') {
            if (cli_int("--max-data-mb", optarg, 0, 1 << 20, &max_data_mb)) return 2;
        } else {
            printf("%s", usage);
            printf("  --quota N         jobs queued or running at once (default 16)\n"
                   "  --weight W        share of the cluster against other tenants, 0.01..100 (default 1)\n"
                   "  --max-groups N    prompt groups its jobs hold in flight together (default %d)\n"
                   "  --max-data-mb N   MiB of uploaded datasets its queued and running jobs hold (default %lld)\n",
                   TENANT_DEFAULT_MAX_GROUPS, TENANT_DEFAULT_MAX_DATA >> 20);
            return o == 'h' ? 0 : 2;
        }
    }
    if (argc - optind != 2 || strcmp(argv[optind], "create")) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    client_t *c = connect_api(cn.api, cn.token, true);
    if (!c) return 1;
    proto_args_t a = {0};
    proto_args_str(&a, "name", argv[optind + 1]);
    proto_args_int(&a, "quota", quota);
    if (weight > 0) proto_args_float(&a, "weight", weight);
    if (max_groups > 0) proto_args_int(&a, "max_groups", max_groups);
    if (max_data_mb >= 0) proto_args_int(&a, "max_data_mb", max_data_mb);
    proto_rep_t rep;
    int rc = call(c, "tenant_create", &a, &rep);
    if (!rc) {
        printf("tenant %s\ntoken %s\n", proto_args_get_str(&rep.result, "tenant"), proto_args_get_str(&rep.result, "token"));
        fprintf(stderr, "keep the token: it is shown once (export MARLAAS_TOKEN=...)\n");
        proto_rep_free(&rep);
    }
    client_destroy(&c);
    return rc ? 1 : 0;
}

// --- submit -------------------------------------------------------------------------------------

int cmd_submit(int argc, char **argv) {
    conn_t cn = {0};
    const char *spec_file = NULL, *dataset = NULL;
    cJSON *spec = cJSON_CreateObject();
    static struct option lo[] = {
        {"api", required_argument, 0, 'a'},       {"token", required_argument, 0, 't'},
        {"spec", required_argument, 0, 's'},      {"dataset", required_argument, 0, 'd'},
        {"task", required_argument, 0, 'T'},      {"name", required_argument, 0, 'n'},
        {"steps", required_argument, 0, 'S'},     {"group", required_argument, 0, 'g'},
        {"prompts", required_argument, 0, 'p'},   {"lr", required_argument, 0, 'l'},
        {"rank", required_argument, 0, 'r'},      {"verifier", required_argument, 0, 'v'},
        {"target-accuracy", required_argument, 0, 'A'}, {"eval-every", required_argument, 0, 'E'},
        {"eval-n", required_argument, 0, 'N'},    {"temperature", required_argument, 0, 'k'},
        {"staleness", required_argument, 0, 'z'}, {"weight", required_argument, 0, 'w'},
        {"reward-endpoint", required_argument, 0, 'R'}, {"max-new", required_argument, 0, 'x'},
        {"max-turns", required_argument, 0, 'M'}, {"env-endpoint", required_argument, 0, 'V'},
        {"chat", no_argument, 0, 'c'},            {"system", required_argument, 0, 'y'},
        {"seed", required_argument, 0, 'e'},      {"help", no_argument, 0, 'h'},            {0}};
    int o, bad = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        double d;
        switch (o) {
        case 'a': cn.api = optarg; break;
        case 't': cn.token = optarg; break;
        case 's': spec_file = optarg; break;
        case 'd': dataset = optarg; break;
        case 'T': cJSON_AddStringToObject(spec, "task", optarg); break;
        case 'n': cJSON_AddStringToObject(spec, "name", optarg); break;
        case 'v': cJSON_AddStringToObject(spec, "verifier", optarg); break;
        case 'c': cJSON_AddBoolToObject(spec, "chat", true); break;
        case 'y': cJSON_AddStringToObject(spec, "system", optarg); break;
        case 'M': case 'V': {
            cJSON *env = cJSON_GetObjectItem(spec, "env");
            if (!env) env = cJSON_AddObjectToObject(spec, "env");
            if (o == 'V') cJSON_AddStringToObject(env, "endpoint", optarg);
            else if (cli_float("--max-turns", optarg, 1, 64, &d)) bad = 1;
            else cJSON_AddNumberToObject(env, "max_turns", d);
            break;
        }
        case 'R': cJSON_AddItemToObject(spec, "reward", cJSON_CreateObject());
                  cJSON_AddStringToObject(cJSON_GetObjectItem(spec, "reward"), "endpoint", optarg); break;
        case 'S': case 'g': case 'p': case 'l': case 'r': case 'A': case 'E': case 'N': case 'k': case 'z': case 'w': case 'x':
        case 'e': {
            static const char *keys[128] = {['S'] = "max_steps", ['g'] = "group", ['p'] = "prompts", ['l'] = "lr",
                                            ['r'] = "rank", ['A'] = "target_accuracy", ['E'] = "eval_every",
                                            ['N'] = "eval_n", ['k'] = "temperature", ['z'] = "staleness",
                                            ['w'] = "weight", ['x'] = "max_new", ['e'] = "seed"};
            if (cli_float(keys[o], optarg, -1e12, 1e12, &d)) bad = 1;
            else cJSON_AddNumberToObject(spec, keys[o], d);
            break;
        }
        case 'h':
            printf("usage: marlaas submit [--token TOKEN] [--api tcp://HOST:PORT]\n"
                   "                      (--task NAME | --dataset FILE.jsonl [--verifier exact|numeric[:tol]|math[:tol]|regex|choice] [--task NAME]\n"
                   "                       | --spec FILE.json)\n"
                   "                      [--name NAME] [--steps N] [--group G] [--prompts B] [--lr LR] [--rank R]\n"
                   "                      [--temperature T] [--staleness ETA] [--weight W] [--eval-every K] [--eval-n N]\n"
                   "                      [--target-accuracy A] [--max-new T] [--seed S] [--reward-endpoint tcp://...]\n"
                   "                      [--max-turns N] [--env-endpoint tcp://...] [--chat [--system TEXT]]\n"
                   "Submits a job and prints its id. Flags override the fields of --spec; the job spec reference\n"
                   "is in the README. A dataset (one {\"prompt\": ..., \"answer\": ...} or {\"messages\": [...],\n"
                   "\"answer\": ...} object per line) is checked here before it is sent; its job's task is named\n"
                   "after the file unless --task names it.\n"
                   "  --chat         prompts go through the model's chat template as user messages (spec.chat)\n"
                   "  --system TEXT  a system message before each prompt (spec.system; needs --chat)\n"
                   "  --token TOKEN  the tenant's token (default: $MARLAAS_TOKEN; `marlaas tenant create` prints it)\n"
                   "  --api ENDPOINT the scheduler's API (default: $MARLAAS_API, else tcp://127.0.0.1:7000)\n");
            cJSON_Delete(spec);
            return 0;
        default: bad = 1;
        }
    }
    if (bad || optind < argc) {
        cJSON_Delete(spec);
        fprintf(stderr, "marlaas submit: bad arguments (marlaas submit --help)\n");
        return 2;
    }
    char err[ERR_LEN];
    if (spec_file) {
        char *txt = util_read_file(spec_file, NULL, err);
        cJSON *base = txt ? cJSON_Parse(txt) : NULL;
        free(txt);
        if (!cJSON_IsObject(base)) {
            fprintf(stderr, "marlaas submit: %s\n", base ? "the spec file must hold a JSON object" : err[0] ? err : "bad JSON");
            cJSON_Delete(base), cJSON_Delete(spec);
            return 1;
        }
        cJSON *it;
        cJSON_ArrayForEach(it, spec) {
            if (cJSON_GetObjectItem(base, it->string))
                cJSON_ReplaceItemInObject(base, it->string, cJSON_Duplicate(it, true));
            else
                cJSON_AddItemToObject(base, it->string, cJSON_Duplicate(it, true));
        }
        cJSON_Delete(spec);
        spec = base;
    }
    if (dataset && !cJSON_GetObjectItem(spec, "dataset")) cJSON_AddBoolToObject(spec, "dataset", true);
    char task_name[64];
    if (dataset && !cJSON_GetObjectItem(spec, "task")) {
        cli_file_stem(dataset, task_name, sizeof task_name);
        cJSON_AddStringToObject(spec, "task", task_name);
    }
    size_t dlen = 0;
    char *data = dataset ? util_read_file(dataset, &dlen, err) : NULL;
    if (dataset && !data) {
        fprintf(stderr, "marlaas submit: %s\n", err);
        cJSON_Delete(spec);
        return 1;
    }
    // the dataset is checked here, so an error names the user's file and line; the scheduler
    // checks it again on arrival
    if (data) {
        const cJSON *vj = cJSON_GetObjectItem(spec, "verifier");
        verify_spec_t vs;
        dataset_t *ds = NULL;
        if (verify_spec_parse(&vs, cJSON_IsString(vj) ? vj->valuestring : "exact", err) == 0)
            ds = dataset_parse(dataset, data, dlen, &vs, err);
        long line = ds ? dataset_messages_line(ds) : 0;
        if (line && !cJSON_IsTrue(cJSON_GetObjectItem(spec, "chat"))) {
            snprintf(err, sizeof err, "%s:%ld: a record with \"messages\" needs a chat job: add --chat (the model's "
                     "chat template renders them)", dataset, line);
            dataset_destroy(&ds);
        }
        if (!ds) {
            fprintf(stderr, "marlaas submit: %s\n", err);
            cJSON_Delete(spec);
            free(data);
            return 1;
        }
        dataset_destroy(&ds);
    }
    char *spec_txt = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    client_t *c = connect_api(cn.api, cn.token, false);
    int rc = 1;
    if (c) {
        proto_args_t a = {0};
        proto_args_str(&a, "spec", spec_txt);
        if (data) proto_args_bin(&a, "dataset", data, dlen);
        proto_rep_t rep;
        if (!call(c, "job_submit", &a, &rep)) {
            printf("%s\n", proto_args_get_str(&rep.result, "job"));
            const char *notes = proto_args_get_str(&rep.result, "notes");
            if (notes) fprintf(stderr, "marlaas submit: note: %s\n", notes);
            proto_rep_free(&rep);
            rc = 0;
        }
        client_destroy(&c);
    }
    cJSON_free(spec_txt);
    free(data);
    return rc;
}

// --- jobs / status / cancel / metrics ------------------------------------------------------------

static int simple(int argc, char **argv, const char *op, const char *usage, int need_job, proto_rep_t *rep, conn_t *cn) {
    static struct option lo[] = {{"api", required_argument, 0, 'a'}, {"token", required_argument, 0, 't'},
                                 {"help", no_argument, 0, 'h'}, {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (o == 'a') cn->api = optarg;
        else if (o == 't') cn->token = optarg;
        else {
            printf("usage: %s\n", usage);
            return o == 'h' ? 0 : 2;
        }
    }
    if (argc - optind != need_job) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    client_t *c = connect_api(cn->api, cn->token, false);
    if (!c) return 1;
    proto_args_t a = {0};
    if (need_job) proto_args_str(&a, "job", argv[optind]);
    int rc = call(c, op, &a, rep);
    client_destroy(&c);
    return rc ? 1 : -1;   // -1: ok, rep filled
}

static double num(const cJSON *o, const char *k, double def) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void print_jobs(const cJSON *arr) {
    printf("%-8s %-16s %-10s %-10s %7s %9s %9s\n", "job", "name", "task", "status", "step", "acc0", "acc");
    const cJSON *j;
    cJSON_ArrayForEach(j, arr) {
        char st[32];
        snprintf(st, sizeof st, "%.0f/%.0f", num(j, "step", 0), num(j, "max_steps", 0));
        double a0 = num(j, "eval_acc0", -1), a = num(j, "eval_acc", -1);
        char s0[16] = "-", s1[16] = "-";
        if (a0 >= 0) snprintf(s0, sizeof s0, "%.1f%%", 100 * a0);
        if (a >= 0) snprintf(s1, sizeof s1, "%.1f%%", 100 * a);
        printf("%-8s %-16s %-10s %-10s %7s %9s %9s\n", str(j, "id"), str(j, "name"), str(j, "task"), str(j, "status"),
               st, s0, s1);
    }
}

int cmd_jobs(int argc, char **argv) {
    conn_t cn = {0};
    proto_rep_t rep;
    int rc = simple(argc, argv, "job_list", "marlaas jobs [--token T] [--api E]", 0, &rep, &cn);
    if (rc >= 0) return rc;
    cJSON *arr = cJSON_Parse(proto_args_get_text(&rep.result, "jobs"));
    print_jobs(arr);
    cJSON_Delete(arr);
    proto_rep_free(&rep);
    return 0;
}

int cmd_status(int argc, char **argv) {
    conn_t cn = {0};
    proto_rep_t rep;
    int rc = simple(argc, argv, "job_status", "marlaas status JOB [--token T] [--api E]", 1, &rep, &cn);
    if (rc >= 0) return rc;
    cJSON *o = cJSON_Parse(proto_args_get_text(&rep.result, "status"));
    char *txt = cJSON_Print(o);
    printf("%s\n", txt ? txt : "{}");
    cJSON_free(txt);
    cJSON_Delete(o);
    proto_rep_free(&rep);
    return 0;
}

int cmd_cancel(int argc, char **argv) {
    conn_t cn = {0};
    proto_rep_t rep;
    int rc = simple(argc, argv, "job_cancel", "marlaas cancel JOB [--token T] [--api E]", 1, &rep, &cn);
    if (rc >= 0) return rc;
    printf("%s\n", proto_args_get_text(&rep.result, "status"));
    proto_rep_free(&rep);
    return 0;
}

int cmd_metrics(int argc, char **argv) {
    conn_t cn = {0};
    proto_rep_t rep;
    int rc = simple(argc, argv, "job_metrics", "marlaas metrics JOB [--token T] [--api E]   (JSON lines)", 1, &rep, &cn);
    if (rc >= 0) return rc;
    cJSON *arr = cJSON_Parse(proto_args_get_text(&rep.result, "metrics")), *e;
    cJSON_ArrayForEach(e, arr) {
        char *t = cJSON_PrintUnformatted(e);
        printf("%s\n", t);
        cJSON_free(t);
    }
    cJSON_Delete(arr);
    proto_rep_free(&rep);
    return 0;
}

// --- watch ----------------------------------------------------------------------------------------

static void bar(char *out, size_t n, double frac, int width) {
    int k = (int)(frac * width + 0.5);
    if (k < 0) k = 0;
    if (k > width) k = width;
    size_t p = 0;
    for (int i = 0; i < width && p + 4 < n; i++) p += (size_t)snprintf(out + p, n - p, "%s", i < k ? "█" : "░");
}

int cmd_watch(int argc, char **argv) {
    conn_t cn = {0};
    int once = 0;
    long interval = 1;
    static struct option lo[] = {{"api", required_argument, 0, 'a'}, {"token", required_argument, 0, 't'},
                                 {"once", no_argument, 0, 'o'}, {"interval", required_argument, 0, 'i'},
                                 {"help", no_argument, 0, 'h'}, {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (o == 'a') cn.api = optarg;
        else if (o == 't') cn.token = optarg;
        else if (o == 'o') once = 1;
        else if (o == 'i') {
            if (cli_int("--interval", optarg, 1, 3600, &interval)) return 2;
        } else {
            printf("usage: marlaas watch [--once] [--interval S] [--token T]   (until every job has finished)\n");
            return o == 'h' ? 0 : 2;
        }
    }
    client_t *c = connect_api(cn.api, cn.token, false);
    if (!c) return 1;
    bool tty = isatty(1), first = true;
    int lines = 0;
    for (;;) {
        proto_rep_t rep;
        if (call(c, "job_list", NULL, &rep)) {
            client_destroy(&c);
            return 1;
        }
        cJSON *arr = cJSON_Parse(proto_args_get_text(&rep.result, "jobs")), *j;
        proto_rep_free(&rep);
        if (tty && !first) printf("\033[%dA", lines);
        first = false;
        lines = 0;
        int active = 0;
        cJSON_ArrayForEach(j, arr) {
            const char *id = str(j, "id");
            proto_args_t a = {0};
            proto_args_str(&a, "job", id);
            double reward = -1, stale = 0, eta = -1;
            if (!call(c, "job_metrics", &a, &rep)) {
                cJSON *m = cJSON_Parse(proto_args_get_text(&rep.result, "metrics")), *e, *last = NULL;
                double t_first = -1, s_first = 0;
                cJSON_ArrayForEach(e, m) {
                    if (cJSON_GetObjectItem(e, "reward")) {
                        if (t_first < 0) t_first = num(e, "time", 0), s_first = num(e, "step", 0);
                        last = e;
                    }
                }
                if (last) {
                    reward = num(last, "reward", -1);
                    stale = num(last, "staleness", 0);
                    double ds = num(last, "step", 0) - s_first, dt = num(last, "time", 0) - t_first;
                    if (ds > 0 && dt > 0) eta = (num(j, "max_steps", 0) - num(last, "step", 0)) * dt / ds;
                }
                cJSON_Delete(m);
                proto_rep_free(&rep);
            }
            double step = num(j, "step", 0), max = num(j, "max_steps", 1);
            const char *status = str(j, "status");
            active += !strcmp(status, "running") || !strcmp(status, "queued");
            char b[256], acc[48] = "-", rw[16] = "-", et[24] = "-";
            bar(b, sizeof b, step / (max > 0 ? max : 1), 24);
            if (num(j, "eval_acc", -1) >= 0)
                snprintf(acc, sizeof acc, "%.1f%% (from %.1f%%)", 100 * num(j, "eval_acc", 0), 100 * num(j, "eval_acc0", 0));
            if (reward >= 0) snprintf(rw, sizeof rw, "%.3f", reward);
            if (eta >= 0 && !strcmp(status, "running")) snprintf(et, sizeof et, "%.0fs", eta);
            printf("%-6s %-10s %s %4.0f/%-4.0f %-9s reward %-6s acc %-20s stale %.1f ETA %-6s\033[K\n", id,
                   str(j, "task"), b, step, max, status, rw, acc, stale, et);
            lines++;
        }
        cJSON_Delete(arr);
        fflush(stdout);
        if (once || active == 0) break;
        sleep((unsigned)interval);
    }
    client_destroy(&c);
    return 0;
}

// --- adapter pull / generate ---------------------------------------------------------------------

// Fetches a job's adapter (latest, version >= 0, or PULL_BEST: the best evaluated one) and writes
// it in PEFT layout to dir. The adapter_config.json names base_model (NULL: the base the scheduler
// names, i.e. config.json's _name_or_path or the scheduler's model folder).
#define PULL_BEST (-2)
static int pull(client_t *c, const char *job, long version, const char *dir, const char *base_model, bool verbose,
                char *err) {
    proto_args_t a = {0};
    proto_args_str(&a, "job", job);
    if (version >= 0) proto_args_int(&a, "version", version);
    if (version == PULL_BEST) proto_args_int(&a, "best", 1);
    proto_rep_t rep;
    if (client_call(c, "adapter_get", &a, &rep, err)) return -1;
    const proto_val_t *blob = proto_args_get(&rep.result, "blob");
    hf_config_t mc;
    int rc = -1;
    if (!blob || blob->kind != PROTO_VAL_BIN || hf_config_parse(&mc, proto_args_get_text(&rep.result, "model_config"), err)) {
        if (!err[0]) err_set(err, "malformed adapter reply");
        goto done;
    }
    lora_t *ad = lora_deserialize(blob->s, blob->len, &mc, kernels_cpu(), err);
    if (!base_model) base_model = proto_args_get_str(&rep.result, "base_model");
    if (ad && base_model && strlen(base_model) >= sizeof ad->cfg.base_model) {
        err_set(err, "base model name longer than %zu bytes", sizeof ad->cfg.base_model - 1);
        lora_destroy(&ad);
    }
    if (ad) {
        snprintf(ad->cfg.base_model, sizeof ad->cfg.base_model, "%s", base_model ? base_model : "");
        rc = lora_save(ad, dir, err);
        lora_destroy(&ad);
    }
    int64_t v = 0;
    proto_args_get_int(&rep.result, "version", &v);
    if (rc == 0 && verbose)
        fprintf(stderr, "adapter of %s, version %lld%s, written to %s (PEFT layout)\n", job, (long long)v,
                version == PULL_BEST ? " (the best evaluated)" : "", dir);
done:
    proto_rep_free(&rep);
    return rc;
}

int cmd_adapter(int argc, char **argv) {
    conn_t cn = {0};
    const char *out = NULL, *base = NULL;
    long version = -1;
    bool best = false;
    static struct option lo[] = {{"api", required_argument, 0, 'a'}, {"token", required_argument, 0, 't'},
                                 {"out", required_argument, 0, 'o'}, {"version", required_argument, 0, 'v'},
                                 {"base-model", required_argument, 0, 'b'}, {"best", no_argument, 0, 'B'},
                                 {"help", no_argument, 0, 'h'}, {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "o:", lo, NULL)) != -1) {
        if (o == 'a') cn.api = optarg;
        else if (o == 't') cn.token = optarg;
        else if (o == 'o') out = optarg;
        else if (o == 'b') base = optarg;
        else if (o == 'B') best = true;
        else if (o == 'v') {
            if (cli_int("--version", optarg, 0, 100000000, &version)) return 2;
        } else {
            printf("usage: marlaas adapter pull JOB -o DIR [--version V | --best] [--base-model NAME]\n"
                   "Writes the job's adapter in PEFT layout (adapter_config.json, adapter_model.safetensors).\n"
                   "  --version V        that version (the trainer keeps the latest few)\n"
                   "  --best             the best evaluated version (highest eval accuracy so far; `marlaas status`\n"
                   "                     shows it as best_version, best_step, best_acc [best_lo, best_hi])\n"
                   "  --base-model NAME  base_model_name_or_path in adapter_config.json (default: the base model's\n"
                   "                     _name_or_path from its config.json, else the scheduler's model folder)\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (argc - optind != 2 || strcmp(argv[optind], "pull") || !out || (best && version >= 0)) {
        fprintf(stderr, "usage: marlaas adapter pull JOB -o DIR [--version V | --best]\n");
        return 2;
    }
    if (best) version = PULL_BEST;
    client_t *c = connect_api(cn.api, cn.token, false);
    if (!c) return 1;
    char err[ERR_LEN] = "";
    int rc = pull(c, argv[optind + 1], version, out, base, true, err);
    if (rc) fprintf(stderr, "marlaas adapter pull: %s\n", err);
    client_destroy(&c);
    return rc ? 1 : 0;
}

int cmd_generate(int argc, char **argv) {
    conn_t cn = {0};
    const char *job = NULL, *model = NULL, *system = NULL;
    long max_new = 32;
    bool chat = false;
    static struct option lo[] = {{"api", required_argument, 0, 'a'},   {"token", required_argument, 0, 't'},
                                 {"job", required_argument, 0, 'j'},   {"model", required_argument, 0, 'm'},
                                 {"max-new", required_argument, 0, 'x'}, {"chat", no_argument, 0, 'c'},
                                 {"system", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (o == 'a') cn.api = optarg;
        else if (o == 't') cn.token = optarg;
        else if (o == 'j') job = optarg;
        else if (o == 'm') model = optarg;
        else if (o == 'c') chat = true;
        else if (o == 's') system = optarg;
        else if (o == 'x') {
            if (cli_int("--max-new", optarg, 1, 4096, &max_new)) return 2;
        } else {
            printf("usage: marlaas generate [--job JOB] [--model DIR] [--max-new N] [--chat [--system TEXT]] TEXT\n"
                   "Greedy generation with the job's latest adapter (or the base model without --job). The text is\n"
                   "continued and printed with its continuation up to the first newline; with --chat it is a user\n"
                   "message (after the --system message) rendered by the model's chat template with the generation\n"
                   "prompt, and the reply, up to the model's end-of-turn token, is printed.\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (argc - optind != 1 || (system && !chat)) {
        fprintf(stderr, "usage: marlaas generate [--job JOB] [--model DIR] [--chat [--system TEXT]] TEXT\n");
        return 2;
    }
    char err[ERR_LEN] = "", tmp[] = "/tmp/marlaas-adapter-XXXXXX";
    model = client_model(model);
    rl_runtime_t *rt = rl_runtime_open(model, NULL, err);
    if (!rt) {
        fprintf(stderr, "marlaas generate: %s\n", err);
        return 1;
    }
    int slot = -1, rc = 1;
    if (job) {
        client_t *c = connect_api(cn.api, cn.token, false);
        if (!c || !mkdtemp(tmp) || pull(c, job, -1, tmp, NULL, false, err)) {
            if (err[0]) fprintf(stderr, "marlaas generate: %s\n", err);
            client_destroy(&c);
            goto done;
        }
        client_destroy(&c);
        lora_t *a = lora_load(tmp, &rt->model->cfg, kernels_cpu(), err);
        char path[sizeof tmp + 64];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
        unlink(path);
        snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
        unlink(path);
        rmdir(tmp);
        if (!a || lora_pool_set(rt->pool, 0, &a, err)) {
            fprintf(stderr, "marlaas generate: %s\n", err);
            lora_destroy(&a);
            goto done;
        }
        slot = 0;
    }
    int32_t *ids = NULL;
    const char *text = argv[optind];
    // the prompt as a job's would be: the text itself, or the text as a user message rendered by
    // the chat template (rl_source_prompt of a one-example source)
    rl_source_t src = {0};
    task_example_t ex = {.prompt = (char *)text};
    char *prompt = NULL;
    if (chat && rl_source_set_chat(&src, rt->chat, rt->chat_error, system, NULL, err) == 0)
        prompt = rl_source_prompt(&src, &ex, 0, err);
    else if (!chat)
        prompt = xstrdup(text);
    int n = prompt ? tokenizer_encode(rt->tok, prompt, strlen(prompt), &ids, err) : -1;
    free(prompt);
    if (n < 0) {
        fprintf(stderr, "marlaas generate: %s\n", err);
        goto done;
    }
    if (max_new > rt->max_context - n) max_new = rt->max_context - n;
    if (max_new < 1) {
        fprintf(stderr, "marlaas generate: the prompt (%d tokens) fills the context (%d)\n", n, rt->max_context);
        free(ids);
        goto done;
    }
    const char *nl = "\n";
    gen_request_t rq = {.prompt = ids, .prompt_len = n, .slot = slot, .n_samples = 1, .max_new_tokens = (int)max_new,
                        .sp = {.temperature = 0, .top_p = 1}, .stop_ids = rt->eos_ids, .n_stop_ids = rt->n_eos,
                        .stop_strings = &nl, .n_stop_strings = chat ? 0 : 1};
    if (gen_submit(rt->gen, &rq, err) < 0 || gen_run(rt->gen, err)) {
        fprintf(stderr, "marlaas generate: %s\n", err);
        free(ids);
        goto done;
    }
    free(ids);
    gen_result_t *r = gen_take(rt->gen);
    printf("%s%s\n", chat ? "" : text, r->samples[0].text ? r->samples[0].text : "");
    gen_result_free(&r);
    rc = 0;
done:
    rl_runtime_close(&rt);
    return rc;
}

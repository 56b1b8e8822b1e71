// dataset.c - user JSONL datasets: validation while loading (all or nothing), train / eval
// split by prompt hash, and the exact / numeric / regex / choice verifiers.
#include "common/tasks/dataset.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util/log.h"
#include "common/util/rng.h"
#include "common/formats/tok_text.h"
#include "common/tasks/math_answer.h"
#include "common/util/strset.h"

typedef struct {
    char *prompt;     // the prompt, or the canonical text of the messages (dataset.h)
    char *messages;   // a "messages" record: the validated conversation as compact JSON; else NULL
    bool system;      // its conversation starts with a system message
    long line;        // line number in the file (1-based)
    char **answers;   // >= 1; answers[0] is canonical. VERIFY_REGEX: the pattern text
    int n_answers;
    double value;     // VERIFY_NUMERIC: answers[0] parsed; VERIFY_MATH: its math_answer
    regex_t *re;      // VERIFY_REGEX; heap-allocated because the record array moves
} record_t;

struct dataset {
    char *name;
    verify_spec_t spec;
    record_t *rec;
    int n, cap;
    int *split[2];    // record numbers, indexed by task_split_t
    int n_split[2];
};

// --- verifier specs ------------------------------------------------------------------------

// A number as a completion or answer may write it. Longer spans are refused: no sensible
// answer needs hundreds of characters, and this bounds the copy strtod needs.
#define NUMBER_MAX_LEN 256

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// -?(digits(.digits*)?|.digits)([eE][+-]?digits)?, finite. strtod alone would take hex,
// "inf", "nan" and leading spaces.
static int parse_number(const char *s, size_t n, double *out) {
    if (n == 0 || n > NUMBER_MAX_LEN) return -1;
    size_t i = 0, int_digits = 0, frac_digits = 0;
    if (s[i] == '-') i++;
    while (i < n && is_digit(s[i])) i++, int_digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && is_digit(s[i])) i++, frac_digits++;
    }
    if (int_digits + frac_digits == 0) return -1;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t exp_digits = 0;
        while (i < n && is_digit(s[i])) i++, exp_digits++;
        if (exp_digits == 0) return -1;
    }
    if (i != n) return -1;
    char buf[NUMBER_MAX_LEN + 1];
    memcpy(buf, s, n);
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    if (!isfinite(v)) return -1;
    *out = v;
    return 0;
}

int verify_spec_parse(verify_spec_t *v, const char *text, char *err) {
    if (!v || !text) return err_set(err, "no verifier given");
    v->tolerance = 0.0;
    if (strcmp(text, "exact") == 0) {
        v->kind = VERIFY_EXACT;
    } else if (strcmp(text, "regex") == 0) {
        v->kind = VERIFY_REGEX;
    } else if (strcmp(text, "choice") == 0) {
        v->kind = VERIFY_CHOICE;
    } else if (strcmp(text, "numeric") == 0) {
        v->kind = VERIFY_NUMERIC;
    } else if (strncmp(text, "numeric:", 8) == 0 || strncmp(text, "math:", 5) == 0) {
        bool math = text[0] == 'm';
        const char *tol = text + (math ? 5 : 8);
        double t;
        if (parse_number(tol, strlen(tol), &t) != 0 || t < 0)
            return err_set(err, "verifier '%s': the tolerance must be a number >= 0", text);
        v->kind = math ? VERIFY_MATH : VERIFY_NUMERIC;
        v->tolerance = t;
    } else if (strcmp(text, "math") == 0) {
        v->kind = VERIFY_MATH;
    } else {
        return err_set(err, "unknown verifier '%s' (expected exact, numeric, numeric:TOLERANCE, math, math:TOLERANCE, "
                       "regex or choice)", text);
    }
    return 0;
}

const char *verify_kind_name(verify_kind_t kind) {
    switch (kind) {
    case VERIFY_EXACT: return "exact";
    case VERIFY_NUMERIC: return "numeric";
    case VERIFY_REGEX: return "regex";
    case VERIFY_CHOICE: return "choice";
    case VERIFY_MATH: return "math";
    }
    return "?";
}

// --- records -------------------------------------------------------------------------------

static void record_free(record_t *r) {
    free(r->prompt);
    free(r->messages);
    for (int i = 0; i < r->n_answers; i++) free(r->answers[i]);
    free(r->answers);
    if (r->re) {
        regfree(r->re);
        free(r->re);
    }
    memset(r, 0, sizeof *r);
}

static bool is_pad(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// A copy of an answer string, checked for what would make it unmatchable. Plain answers are
// trimmed like completions; a regex is kept verbatim (trimming the pattern `a\ ` would leave a
// dangling backslash).
// is_regex: kept verbatim (not trimmed); multiline: a newline is allowed (math answers are
// worked solutions, read whole).
static int take_answer(const char *s, bool is_regex, bool multiline, char **out, char *msg, size_t msg_len) {
    size_t n = strlen(s), lead = 0, trail = n;
    while (lead < trail && is_pad(s[lead])) lead++;
    while (trail > lead && is_pad(s[trail - 1])) trail--;
    if (trail == lead) {
        snprintf(msg, msg_len, "empty \"answer\"");
        return -1;
    }
    if (!is_regex) {
        s += lead;
        n = trail - lead;
    }
    if (!is_regex && !multiline && memchr(s, '\n', n)) {
        snprintf(msg, msg_len, "\"answer\" contains a newline (completions are cut at the first one)");
        return -1;
    }
    char *c = xmalloc(n + 1);
    memcpy(c, s, n);
    c[n] = '\0';
    *out = c;
    return 0;
}

// Keys a record may carry that change nothing: metadata that datasets commonly include. Every
// other key is refused, so a field that would change the computation (a "system" or "tools"
// field, a misspelt "answer") is never silently ignored.
static const char *const metadata_keys[] = {"id", "uid", "idx", "index", "source", "meta", "metadata", "category",
                                            "subject", "topic", "type", "level", "difficulty", "tags", "split",
                                            "dataset", "url", "license", "unique_id"};

static bool is_metadata_key(const char *k) {
    for (size_t i = 0; i < sizeof metadata_keys / sizeof metadata_keys[0]; i++)
        if (!strcmp(k, metadata_keys[i])) return true;
    return false;
}

// A string value that must be well-formed UTF-8 (the tokenizer takes nothing else).
static int check_utf8(const char *what, const char *s, char *msg, size_t msg_len) {
    size_t bad = 0;
    if (tok_utf8_valid(s, strlen(s), &bad)) return 0;
    snprintf(msg, msg_len, "%s is not valid UTF-8 (byte %zu)", what, bad + 1);
    return -1;
}

// Validates an OpenAI-style conversation and fills r->messages (compact JSON, keys in the order
// role, content), r->system and r->prompt (the canonical text: the content of a lone user
// message, so that such a record and a "prompt" record with the same text are one prompt for
// splits and evals; otherwise the compact JSON).
static int take_messages(record_t *r, const cJSON *m, char *msg, size_t msg_len) {
    if (!cJSON_IsArray(m)) {
        snprintf(msg, msg_len, "\"messages\" must be an array of {\"role\", \"content\"} objects");
        return -1;
    }
    int n = cJSON_GetArraySize(m);
    if (n == 0 || n > DATASET_MAX_MESSAGES) {
        snprintf(msg, msg_len, "\"messages\" must hold 1..%d messages, not %d", DATASET_MAX_MESSAGES, n);
        return -1;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0, rc = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        i++;
        if (!cJSON_IsObject(e)) {
            snprintf(msg, msg_len, "messages[%d] is not an object", i - 1);
            goto done;
        }
        const cJSON *role = NULL, *content = NULL, *k;
        cJSON_ArrayForEach(k, e) {
            if (!strcmp(k->string, "role")) role = k;
            else if (!strcmp(k->string, "content")) content = k;
            else {
                // tool_calls, name, reasoning_content, ... would change what the template renders
                snprintf(msg, msg_len, "messages[%d]: unknown key \"%.40s\" (a message holds \"role\" and \"content\")",
                         i - 1, k->string);
                goto done;
            }
        }
        if (!cJSON_IsString(role) ||
            (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant"))) {
            snprintf(msg, msg_len, "messages[%d].role must be \"system\", \"user\" or \"assistant\"", i - 1);
            goto done;
        }
        if (!cJSON_IsString(content)) {
            snprintf(msg, msg_len, "messages[%d].content must be a string", i - 1);
            goto done;
        }
        char what[48];
        snprintf(what, sizeof what, "messages[%d].content", i - 1);
        if (check_utf8(what, content->valuestring, msg, msg_len)) goto done;
        bool system = !strcmp(role->valuestring, "system");
        if (!strcmp(role->valuestring, "user") && !content->valuestring[0]) {
            snprintf(msg, msg_len, "messages[%d]: empty user content", i - 1);
            goto done;
        }
        if (system && i > 1) {
            snprintf(msg, msg_len, "messages[%d]: a system message may only come first", i - 1);
            goto done;
        }
        if (i == n && strcmp(role->valuestring, "user")) {
            snprintf(msg, msg_len, "the last message must be the user's (the model writes the assistant's reply)");
            goto done;
        }
        r->system |= system;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "role", role->valuestring);
        cJSON_AddStringToObject(o, "content", content->valuestring);
        cJSON_AddItemToArray(out, o);
    }
    char *txt = cJSON_PrintUnformatted(out);
    if (!txt) {
        log_fatal("out of memory at %s:%d", __FILE__, __LINE__);
        abort();
    }
    r->messages = xstrdup(txt);
    cJSON_free(txt);
    r->prompt = xstrdup(n == 1 ? cJSON_GetArrayItem(cJSON_GetArrayItem(out, 0), 1)->valuestring : r->messages);
    rc = 0;
done:
    cJSON_Delete(out);
    return rc;
}

// Fills r from one parsed JSON value; on failure writes msg and leaves r for record_free.
static int record_from_json(record_t *r, const cJSON *j, const verify_spec_t *v, char *msg, size_t msg_len) {
    if (!cJSON_IsObject(j)) {
        snprintf(msg, msg_len, "the record is not a JSON object");
        return -1;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
    if (!p && !ms) {
        snprintf(msg, msg_len, "missing \"prompt\" (or \"messages\")");
        return -1;
    }
    if (p && ms) {
        snprintf(msg, msg_len, "give \"prompt\" or \"messages\", not both");
        return -1;
    }
    if (!a) {
        snprintf(msg, msg_len, "missing \"answer\"");
        return -1;
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        if (strcmp(k->string, "prompt") && strcmp(k->string, "messages") && strcmp(k->string, "answer") &&
            !is_metadata_key(k->string)) {
            snprintf(msg, msg_len, "unknown key \"%.40s\" (a record holds \"prompt\" or \"messages\", and \"answer\"; "
                     "metadata keys such as \"id\" are ignored)", k->string);
            return -1;
        }
    }
    if (ms) {
        if (take_messages(r, ms, msg, msg_len)) return -1;
    } else {
        if (!cJSON_IsString(p)) {
            snprintf(msg, msg_len, "\"prompt\" must be a string");
            return -1;
        }
        if (p->valuestring[0] == '\0') {
            snprintf(msg, msg_len, "empty \"prompt\"");
            return -1;
        }
        if (check_utf8("\"prompt\"", p->valuestring, msg, msg_len)) return -1;
        r->prompt = xstrdup(p->valuestring);
    }

    if (cJSON_IsArray(a)) {
        if (v->kind != VERIFY_CHOICE) {
            snprintf(msg, msg_len, "\"answer\" must be a string (arrays need the choice verifier)");
            return -1;
        }
        int n = cJSON_GetArraySize(a);
        if (n == 0) {
            snprintf(msg, msg_len, "\"answer\" is an empty array");
            return -1;
        }
        r->answers = xcalloc((size_t)n, sizeof *r->answers);
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            if (!cJSON_IsString(e)) {
                snprintf(msg, msg_len, "\"answer\" array item %d is not a string", r->n_answers + 1);
                return -1;
            }
            if (take_answer(e->valuestring, false, false, &r->answers[r->n_answers], msg, msg_len) != 0) return -1;
            r->n_answers++;
        }
        return 0;
    }
    if (!cJSON_IsString(a)) {
        snprintf(msg, msg_len, v->kind == VERIFY_CHOICE ? "\"answer\" must be a string or an array of strings"
                                                        : "\"answer\" must be a string");
        return -1;
    }
    r->answers = xcalloc(1, sizeof *r->answers);
    if (take_answer(a->valuestring, v->kind == VERIFY_REGEX, v->kind == VERIFY_MATH, &r->answers[0], msg, msg_len) != 0)
        return -1;
    r->n_answers = 1;

    if (v->kind == VERIFY_NUMERIC &&
        parse_number(r->answers[0], strlen(r->answers[0]), &r->value) != 0) {
        snprintf(msg, msg_len, "\"answer\" \"%.40s\" is not a number", r->answers[0]);
        return -1;
    }
    if (v->kind == VERIFY_MATH && math_answer(r->answers[0], strlen(r->answers[0]), &r->value) != 0) {
        snprintf(msg, msg_len, "\"answer\" \"%.40s\" holds no number (the math verifier needs one)", r->answers[0]);
        return -1;
    }
    if (v->kind == VERIFY_REGEX) {
        r->re = xmalloc(sizeof *r->re);
        int rc = regcomp(r->re, r->answers[0], REG_EXTENDED);
        if (rc != 0) {
            char why[128];
            regerror(rc, r->re, why, sizeof why);
            free(r->re);   // a failed regcomp leaves nothing to regfree
            r->re = NULL;
            snprintf(msg, msg_len, "regex \"%.40s\" does not compile: %s", r->answers[0], why);
            return -1;
        }
    }
    return 0;
}

// --- loading -------------------------------------------------------------------------------

void dataset_destroy(dataset_t **d) {
    if (!d || !*d) return;
    dataset_t *x = *d;
    for (int i = 0; i < x->n; i++) record_free(&x->rec[i]);
    free(x->rec);
    free(x->split[TASK_TRAIN]);
    free(x->split[TASK_EVAL]);
    free(x->name);
    free(x);
    *d = NULL;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_pad(s[i])) return false;
    return true;
}

// Fixed, so a dataset's train order is the same in every process and every run.
#define TRAIN_SHUFFLE_SEED 0x6461746173657431ull

static void make_splits(dataset_t *d) {
    int *tr = xmalloc((size_t)d->n * sizeof *tr), *ev = xmalloc((size_t)d->n * sizeof *ev);
    int nt = 0, ne = 0;
    for (int i = 0; i < d->n; i++) {
        if (task_prompt_split(d->rec[i].prompt) == TASK_EVAL)
            ev[ne++] = i;
        else
            tr[nt++] = i;
    }
    if (d->n < 10 || nt == 0 || ne == 0) {
        // Too small (or too uniform) to hold anything out: both splits see every record.
        for (int i = 0; i < d->n; i++) tr[i] = ev[i] = i;
        nt = ne = d->n;
    }
    // Eval examples are decoded greedily, so a repeated prompt adds nothing: the eval list keeps
    // the first record of each distinct prompt.
    strset_t seen = {0};
    int kept = 0;
    for (int i = 0; i < ne; i++)
        if (strset_add(&seen, d->rec[ev[i]].prompt)) ev[kept++] = ev[i];
    strset_free(&seen);
    ne = kept;
    rng_t r;
    rng_seed(&r, TRAIN_SHUFFLE_SEED);
    for (int i = nt - 1; i > 0; i--) {
        int j = (int)(rng_next(&r) % (uint64_t)(i + 1));
        int t = tr[i];
        tr[i] = tr[j];
        tr[j] = t;
    }
    d->split[TASK_TRAIN] = tr;
    d->split[TASK_EVAL] = ev;
    d->n_split[TASK_TRAIN] = nt;
    d->n_split[TASK_EVAL] = ne;
}

dataset_t *dataset_parse(const char *name, const char *buf, size_t len, const verify_spec_t *v, char *err) {
    static const verify_spec_t exact = {VERIFY_EXACT, 0.0};
    if (!v) v = &exact;
    if (!name) name = "dataset";
    if (!buf && len > 0) {
        err_set(err, "%s: no data", name);
        return NULL;
    }
    if (v->kind == VERIFY_NUMERIC && !(v->tolerance >= 0 && isfinite(v->tolerance))) {
        err_set(err, "%s: the numeric tolerance must be a finite number >= 0", name);
        return NULL;
    }
    dataset_t *d = xcalloc(1, sizeof *d);
    d->name = xstrdup(name);
    d->spec = *v;
    cJSON *json = NULL;
    char msg[200];
    size_t pos = 0;
    long line_no = 0;
    while (pos < len) {
        line_no++;
        const char *line = buf + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        if (n > 0 && line[n - 1] == '\r') n--;
        if (n > DATASET_MAX_LINE) {
            snprintf(msg, sizeof msg, "line longer than %d bytes", DATASET_MAX_LINE);
            goto fail;
        }
        if (is_blank(line, n)) continue;
        // cJSON would copy a string's bytes up to a raw NUL and silently cut it there.
        if (memchr(line, '\0', n)) {
            snprintf(msg, sizeof msg, "invalid JSON: NUL byte at column %zu",
                     (size_t)((const char *)memchr(line, '\0', n) - line) + 1);
            goto fail;
        }
        if (d->n == DATASET_MAX_RECORDS) {
            snprintf(msg, sizeof msg, "more than %d records", DATASET_MAX_RECORDS);
            goto fail;
        }
        const char *end = NULL;
        json = cJSON_ParseWithLengthOpts(line, n, &end, false);
        if (!json) {
            size_t col = end && end >= line && end <= line + n ? (size_t)(end - line) + 1 : 1;
            snprintf(msg, sizeof msg, "invalid JSON at column %zu", col);
            goto fail;
        }
        while (end < line + n && (is_pad(*end) || *end == '\n')) end++;
        if (end < line + n) {
            snprintf(msg, sizeof msg, "invalid JSON: text after the value at column %zu", (size_t)(end - line) + 1);
            goto fail;
        }
        if (d->n == d->cap) {
            d->cap = d->cap ? 2 * d->cap : 64;
            d->rec = xrealloc(d->rec, (size_t)d->cap * sizeof *d->rec);
        }
        record_t *r = &d->rec[d->n];
        memset(r, 0, sizeof *r);
        r->line = line_no;
        if (record_from_json(r, json, v, msg, sizeof msg) != 0) {
            record_free(r);
            goto fail;
        }
        d->n++;
        cJSON_Delete(json);
        json = NULL;
    }
    if (d->n == 0) {
        err_set(err, "%s: no records", name);
        dataset_destroy(&d);
        return NULL;
    }
    make_splits(d);
    return d;
fail:
    err_set(err, "%s:%ld: %s", name, line_no, msg);
    cJSON_Delete(json);
    dataset_destroy(&d);
    return NULL;
}

dataset_t *dataset_load(const char *path, const verify_spec_t *v, char *err) {
    size_t len;
    char *buf = util_read_file(path, &len, err);
    if (!buf) return NULL;
    dataset_t *d = dataset_parse(path, buf, len, v, err);
    free(buf);
    return d;
}

// --- access and verification ---------------------------------------------------------------

const char *dataset_name(const dataset_t *d) { return d->name; }
const verify_spec_t *dataset_spec(const dataset_t *d) { return &d->spec; }
int dataset_size(const dataset_t *d) { return d ? d->n : 0; }

const char *dataset_messages(const dataset_t *d, int record) {
    return d && record >= 0 && record < d->n ? d->rec[record].messages : NULL;
}

const char *dataset_record_prompt(const dataset_t *d, int record) {
    return d && record >= 0 && record < d->n ? d->rec[record].prompt : NULL;
}

long dataset_record_line(const dataset_t *d, int record) {
    return d && record >= 0 && record < d->n ? d->rec[record].line : 0;
}

long dataset_messages_line(const dataset_t *d) {
    for (int i = 0; d && i < d->n; i++)
        if (d->rec[i].messages) return d->rec[i].line;
    return 0;
}

long dataset_system_line(const dataset_t *d) {
    for (int i = 0; d && i < d->n; i++)
        if (d->rec[i].system) return d->rec[i].line;
    return 0;
}

int dataset_split_size(const dataset_t *d, task_split_t split) {
    return d ? d->n_split[split == TASK_EVAL ? TASK_EVAL : TASK_TRAIN] : 0;
}

int dataset_example(const dataset_t *d, task_split_t split, uint64_t index, task_example_t *ex) {
    ASSERT(d != NULL && ex != NULL);
    int s = split == TASK_EVAL ? TASK_EVAL : TASK_TRAIN;
    int rec = d->split[s][index % (uint64_t)d->n_split[s]];
    ex->prompt = xstrdup(d->rec[rec].prompt);
    ex->answer = xstrdup(d->rec[rec].answers[0]);
    return rec;
}

static float verify_regex(const regex_t *re, const char *s, size_t n) {
    // regexec needs a NUL-terminated subject; the span is usually a few bytes.
    char *subject = xmalloc(n + 1);
    memcpy(subject, s, n);
    subject[n] = '\0';
    regmatch_t m[1];
    // POSIX matching is leftmost-longest: if any match covers the whole subject, the match
    // found starts at 0 and is that long.
    bool whole = regexec(re, subject, 1, m, 0) == 0 && m[0].rm_so == 0 && (size_t)m[0].rm_eo == n;
    free(subject);
    return whole ? 1.0f : 0.0f;
}

// |x - y| <= tolerance, inclusive as written: a slack of a few ulps, so 3.15 is within 0.01 of
// 3.14 even though the doubles differ by 0.010000000000000231.
static float within(double x, double y, double tolerance) {
    double slack = 4 * DBL_EPSILON * fmax(fabs(x), fabs(y));
    return fabs(x - y) <= tolerance + slack ? 1.0f : 0.0f;
}

float dataset_verify(const dataset_t *d, int record, const char *completion) {
    if (!d || record < 0 || record >= d->n || !completion) return 0.0f;
    const record_t *r = &d->rec[record];
    if (d->spec.kind == VERIFY_MATH) {   // the whole worked solution, not its first line
        double x;
        return math_answer(completion, strlen(completion), &x) == 0 ? within(x, r->value, d->spec.tolerance) : 0.0f;
    }
    size_t n;
    const char *s = task_answer_span(completion, &n);
    switch (d->spec.kind) {
    case VERIFY_EXACT:
    case VERIFY_CHOICE:
        for (int i = 0; i < r->n_answers; i++)
            if (strlen(r->answers[i]) == n && memcmp(r->answers[i], s, n) == 0) return 1.0f;
        return 0.0f;
    case VERIFY_NUMERIC: {
        double x;
        if (parse_number(s, n, &x) != 0) return 0.0f;
        return within(x, r->value, d->spec.tolerance);
    }
    case VERIFY_REGEX: return verify_regex(r->re, s, n);
    case VERIFY_MATH: break;   // above
    }
    return 0.0f;
}

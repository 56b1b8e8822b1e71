// test_jinja.c - the Jinja interpreter and the chat-template renderer: byte equality with the
// reference renderer (Jinja2 as Hugging Face runs it, tests/chat/expected/, made by
// tests/chat/generate.sh) for every conversation with every model template and for every
// language piece; refusals with their position; limits; the chat API; mutated and hostile
// templates (no crash, no hang, an error).
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/chat.h"
#include "common/formats/jinja.h"

// --- helpers -----------------------------------------------------------------------------------
static char *slurp(const char *path, size_t *len) {
    char err[ERR_LEN];
    char *s = util_read_file(path, len, err);
    cr_assert_not_null(s, "%s", err);
    return s;
}

// strftime_now's clock in the fixtures (render_python.py): Friday 2025-03-14 15:09:26
static int fixed_clock(struct tm *tm, void *ud) {
    (void)ud;
    memset(tm, 0, sizeof *tm);
    tm->tm_year = 125;
    tm->tm_mon = 2;
    tm->tm_mday = 14;
    tm->tm_hour = 15;
    tm->tm_min = 9;
    tm->tm_sec = 26;
    tm->tm_wday = 5;
    tm->tm_yday = 72;
    return 0;
}

static jinja_limits_t test_limits(void) {
    jinja_limits_t l;
    jinja_limits_default(&l);
    l.now = fixed_clock;
    return l;
}

// A JSONL line {"id": "...", ..., "KEY": VALUE}: the id and the raw text of VALUE (the last member),
// kept as written so that 1.0 stays a float.
static void line_parts(const char *line, size_t len, const char *key, char *id, size_t idn, const char **val,
                       size_t *vlen) {
    cJSON *j = cJSON_ParseWithLength(line, len);
    cr_assert_not_null(j, "bad fixture line: %.80s", line);
    snprintf(id, idn, "%s", cJSON_GetObjectItem(j, "id")->valuestring);
    cJSON_Delete(j);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    cr_assert_not_null(p, "fixture line without %s: %.80s", key, line);
    *val = p + strlen(pat);
    const char *end = line + len;
    while (end > *val && end[-1] != '}') end--;
    *vlen = (size_t)(end - 1 - *val);
}

// Compares a render with an expected result ({"output": text} or {"error": msg, "raised": bool});
// returns 0 when they agree, else prints why.
static int check_result(const char *what, const cJSON *exp, const char *out, size_t n, const char *err) {
    const cJSON *o = cJSON_GetObjectItem(exp, "output");
    if (o) {
        if (!out) {
            fprintf(stderr, "%s: expected output, got error: %s\n", what, err);
            return 1;
        }
        size_t el = strlen(o->valuestring);
        if (n != el || memcmp(out, o->valuestring, n)) {
            size_t k = 0;
            while (k < n && k < el && out[k] == o->valuestring[k]) k++;
            fprintf(stderr, "%s: output differs at byte %zu (got %zu bytes, want %zu)\n  got:  ...%.60s\n  want: ...%.60s\n",
                    what, k, n, el, out + (k > 20 ? k - 20 : 0), o->valuestring + (k > 20 ? k - 20 : 0));
            return 1;
        }
        return 0;
    }
    if (out) {
        fprintf(stderr, "%s: expected an error (%s), got output: %.80s\n", what,
                cJSON_GetObjectItem(exp, "error")->valuestring, out);
        return 1;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItem(exp, "raised"))) {
        char want[ERR_LEN];
        snprintf(want, sizeof want, JINJA_RAISED_PREFIX "%s", cJSON_GetObjectItem(exp, "error")->valuestring);
        if (strcmp(want, err)) {
            fprintf(stderr, "%s: raise_exception message\n  got:  %s\n  want: %s\n", what, err, want);
            return 1;
        }
    }
    return 0;
}

// --- conformance -------------------------------------------------------------------------------
Test(jinja_conformance, chat_templates) {
    size_t len;
    char *exp_text = slurp("tests/chat/expected/chat.json", &len);
    cJSON *expected = cJSON_Parse(exp_text);
    cr_assert_not_null(expected);
    char *convs = slurp("tests/chat/conversations.jsonl", &len);
    const cJSON *templates = cJSON_GetObjectItem(expected, "templates");
    jinja_limits_t lim = test_limits();
    chat_opts_t opts = {.limits = &lim};
    int failures = 0, ntemplates = 0;
    const cJSON *tcases;
    cJSON_ArrayForEach(tcases, templates) {
        char path[256], err[ERR_LEN];
        snprintf(path, sizeof path, "tests/chat/templates/%s.json", tcases->string);
        size_t clen;
        char *cfg = slurp(path, &clen);
        chat_template_t *ct = chat_template_from_config(cfg, clen, NULL, err);
        cr_assert_not_null(ct, "%s: %s", path, err);
        int n = 0, same = 0, rendered = 0;
        for (const char *line = convs; *line;) {
            const char *eol = strchr(line, '\n');
            size_t ll = eol ? (size_t)(eol - line) : strlen(line);
            char id[128];
            const char *req;
            size_t rlen;
            line_parts(line, ll, "request", id, sizeof id, &req, &rlen);
            const cJSON *exp = cJSON_GetObjectItem(tcases, id);
            cr_assert_not_null(exp, "%s: no expected result for %s (run tests/chat/generate.sh)", tcases->string, id);
            size_t olen = 0;
            err[0] = 0;
            char *out = chat_render(ct, req, rlen, &opts, &olen, err);
            char what[200];
            snprintf(what, sizeof what, "%s/%s", tcases->string, id);
            int bad = check_result(what, exp, out, olen, err);
            failures += bad;
            same += !bad;
            rendered += out != NULL;
            n++;
            free(out);
            line = eol ? eol + 1 : line + ll;
        }
        fprintf(stderr, "chat conformance %-12s %d/%d conversations equal the reference (%d rendered, %d refused by the template)\n",
                tcases->string, same, n, rendered, n - rendered);
        cr_assert_eq(n, cJSON_GetArraySize(tcases), "%s: fixture and expected results differ in count", tcases->string);
        chat_template_destroy(&ct);
        free(cfg);
        ntemplates++;
    }
    cr_assert_geq(ntemplates, 7);
    cr_assert_eq(failures, 0, "%d conversations differ from the reference (details above)", failures);
    cJSON_Delete(expected);
    free(exp_text);
    free(convs);
}

Test(jinja_conformance, language_pieces) {
    size_t len;
    char *exp_text = slurp("tests/chat/expected/snippets.json", &len);
    cJSON *expected = cJSON_Parse(exp_text);
    cr_assert_not_null(expected);
    const cJSON *snip = cJSON_GetObjectItem(expected, "snippets");
    char *lines = slurp("tests/chat/snippets.jsonl", &len);
    jinja_limits_t lim = test_limits();
    int n = 0, failures = 0;
    for (const char *line = lines; *line;) {
        const char *eol = strchr(line, '\n');
        size_t ll = eol ? (size_t)(eol - line) : strlen(line);
        char id[128], err[ERR_LEN] = "";
        const char *vars_text;
        size_t vlen;
        line_parts(line, ll, "vars", id, sizeof id, &vars_text, &vlen);
        cJSON *j = cJSON_ParseWithLength(line, ll);
        const char *src = cJSON_GetObjectItem(j, "template")->valuestring;
        const cJSON *exp = cJSON_GetObjectItem(snip, id);
        cr_assert_not_null(exp, "no expected result for snippet %s (run tests/chat/generate.sh)", id);
        jinja_vars_t *vars = jinja_vars_new();
        cr_assert_eq(jinja_vars_update_json(vars, vars_text, vlen, NULL, err), 0, "%s: %s", id, err);
        jinja_tpl_t *t = jinja_parse(src, strlen(src), err);
        size_t olen = 0;
        char *out = t ? jinja_render(t, vars, &lim, &olen, err) : NULL;
        failures += check_result(id, exp, out, olen, err);
        free(out);
        jinja_destroy(&t);
        jinja_vars_destroy(&vars);
        cJSON_Delete(j);
        n++;
        line = eol ? eol + 1 : line + ll;
    }
    fprintf(stderr, "language pieces: %d/%d equal the reference\n", n - failures, n);
    cr_assert_eq(n, cJSON_GetArraySize(snip));
    cr_assert_eq(failures, 0, "%d language pieces differ from the reference (details above)", failures);
    cJSON_Delete(expected);
    free(exp_text);
    free(lines);
}

// --- direct checks -----------------------------------------------------------------------------
static char *render_lim(const char *src, const char *vars_json, const jinja_limits_t *lim, char *err) {
    jinja_tpl_t *t = jinja_parse(src, strlen(src), err);
    if (!t) return NULL;
    jinja_vars_t *v = jinja_vars_new();
    char *out = NULL;
    if (!vars_json || jinja_vars_update_json(v, vars_json, strlen(vars_json), NULL, err) == 0)
        out = jinja_render(t, v, lim, NULL, err);
    jinja_vars_destroy(&v);
    jinja_destroy(&t);
    return out;
}

static void expect_out(const char *src, const char *vars, const char *want) {
    char err[ERR_LEN] = "";
    jinja_limits_t lim = test_limits();
    char *out = render_lim(src, vars, &lim, err);
    cr_assert_not_null(out, "%s: %s", src, err);
    cr_assert_str_eq(out, want, "%s", src);
    free(out);
}

static void expect_err_lim(const char *src, const char *vars, const jinja_limits_t *lim, const char *want) {
    char err[ERR_LEN] = "";
    char *out = render_lim(src, vars, lim, err);
    cr_assert_null(out, "%.60s: rendered '%.60s' where an error was expected", src, out ? out : "");
    cr_assert_not_null(strstr(err, want), "%.60s: error '%s' lacks '%s'", src, err, want);
}

static void expect_err(const char *src, const char *vars, const char *want) {
    jinja_limits_t lim = test_limits();
    expect_err_lim(src, vars, &lim, want);
}

Test(jinja, refused_constructs_name_their_position) {
    expect_err("{% include 'x.j2' %}", NULL, "1:4: the 'include' statement is not supported");
    expect_err("a\n  {% extends 'base' %}", NULL, "2:6: the 'extends' statement is not supported");
    expect_err("{% import 'm' as m %}", NULL, "1:4: the 'import' statement is not supported");
    expect_err("{% call foo() %}x{% endcall %}", NULL, "1:4: the 'call' statement is not supported");
    expect_err("x\n{{ name|wordcount }}", NULL, "2:9: unsupported filter 'wordcount'");
    expect_err("{% if x is divisible %}{% endif %}", NULL, "1:12: unsupported test 'divisible'");
    expect_err("{% for x in y recursive %}{% endfor %}", NULL, "recursive loops are not supported");
    expect_err("{% macro m() %}{{ caller() }}{% endmacro %}", NULL, "1:4: macro 'm' uses 'caller'");
    expect_err("{{ f(*args) }}", NULL, "1:6: argument unpacking");
    expect_err("{{ d[1, 2] }}", NULL, "multiple subscripts");
    expect_err("{{ 'abc }}", NULL, "1:4: unterminated string literal");
    expect_err("{% for x in y %}\n{{ x }}", NULL, "1:4: missing {% endfor %} for this 'for'");
    expect_err("{% endif %}", NULL, "1:4: unexpected 'endif'");
    expect_err("{{ a ! b }}", NULL, "1:6: unexpected character '!'");
    expect_err("{% break %}", NULL, "'break' outside a for loop");
    expect_err("{{ x|a.b }}", NULL, "dotted filter names");
    expect_err("{# open comment", NULL, "missing end of comment tag");
    expect_err("{{ x ", NULL, "unexpected end of template");
    expect_err("{{ x }", NULL, "1:6: unexpected '}'");
    expect_err("{% frobnicate %}", NULL, "unknown statement 'frobnicate'");
    expect_err("{{ 'x\\N{DASH}' }}", NULL, "\\N{...} escapes are not supported");
    expect_err("{{ 99999999999999999999 }}", NULL, "integer literal too large");
    // refused when evaluated: a Python method this interpreter does not have, %-formatting,
    // non-string dict keys, mutation, loop.changed
    expect_err("\n  {{ 'x'.zfill(3) }}", NULL, "2:9: the string method 'zfill' is not supported");
    expect_err("{{ '%s' % 1 }}", NULL, "string formatting with '%' is not supported");
    expect_err("{{ {1: 2} }}", NULL, "dict keys other than strings are not supported");
    expect_err("{% set l = [] %}{{ l.append(1) }}", NULL, "the list method 'append' is not supported");
    expect_err("{% set d = {} %}{{ d.update({}) }}", NULL, "the dict method 'update' is not supported");
    expect_err("{% for x in [1] %}{{ loop.changed(x) }}{% endfor %}", NULL, "loop.changed is not supported");
    expect_err("{{ cycler(1, 2) }}", NULL, "the global function 'cycler' is not supported");
}

Test(jinja, raise_exception_is_the_message) {
    char err[ERR_LEN];
    jinja_limits_t lim = test_limits();
    char *out = render_lim("{% if messages|length > 1 %}{{ raise_exception('Only ' ~ 1 ~ ' message, got ' ~ messages|length) }}{% endif %}",
                           "{\"messages\": [1, 2]}", &lim, err);
    cr_assert_null(out);
    cr_assert_str_eq(err, JINJA_RAISED_PREFIX "Only 1 message, got 2");
}

Test(jinja, evaluation_errors_name_their_position) {
    expect_err("{{ x }}\n{{ missing.attr }}", NULL, "2:11: 'missing' is undefined");
    expect_err("{{ 1 +\n 'a' }}", NULL, "1:6: unsupported operand types for +: 'int' and 'str'");
    expect_err("{% for x in 3 %}{% endfor %}", NULL, "1:13: 'int' object is not iterable");
    expect_err("{{ n.strip() }}", "{\"n\": null}", "'NoneType object' has no attribute 'strip'");
}

Test(jinja, limits_end_hostile_templates) {
    jinja_limits_t lim = test_limits();
    // loops: the step budget
    lim.max_steps = 200000;
    expect_err_lim("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, &lim,
                   "evaluation steps (limit)");
    // output
    lim = test_limits();
    lim.max_output = 1000;
    expect_err_lim("{% for i in range(1000) %}xx{% endfor %}", NULL, &lim, "would exceed 1000 bytes");
    expect_err_lim("{{ 'ab' * 100000 }}", NULL, &lim, "string repetition larger than 1000 bytes");
    // memory: strings doubling in a namespace
    lim = test_limits();
    lim.max_memory = 1 << 20;
    expect_err_lim("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   NULL, &lim, "");
    lim.max_output = 16u << 20;
    expect_err_lim("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [ns.l, ns.l] %}{% endfor %}",
                   NULL, &lim, "");
    // recursion
    lim = test_limits();
    expect_err_lim("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, "macro calls nested deeper than 64");
    lim.max_depth = 3;
    expect_err_lim("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, "nested deeper than 3");
    // value nesting
    lim = test_limits();
    expect_err_lim("{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}", NULL,
                   &lim, "nested deeper than");
    // the sandbox's range limit
    expect_err("{{ range(100001)|length }}", NULL, "larger than the sandbox allows");
}

Test(jinja, large_values_cost_steps_and_large_dicts_are_indexed) {
    // comparing, slicing and copying large values is charged to the step budget: loops of them
    // end with the limit instead of running for hours (a small budget, to end sooner)
    jinja_limits_t small = test_limits();
    small.max_steps = 300000;
    expect_err_lim("{% set a = range(100000)|list %}{% set b = range(100000)|list %}"
                   "{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}",
                   NULL, &small, "evaluation steps (limit)");
    expect_err_lim("{% set s = '\u00e9' * 100000 %}{% for i in range(100000) %}{{ s[99999:] }}{% endfor %}", NULL,
                   &small, "evaluation steps (limit)");
    expect_err_lim("{% set l = range(100000)|list %}{% for i in range(100000) %}{{ l.count(5) }}{% endfor %}", NULL,
                   &small, "evaluation steps (limit)");
    static const char *const scans[] = {"s.count('b')", "'b' in s", "s.find('b')", "s.strip('a')", "s.split('b')",
                                        "s == t", "s < t", "s.endswith(t)", "s is lower", "s.isdigit()"};
    for (size_t i = 0; i < sizeof scans / sizeof scans[0]; i++) {
        char src[256];
        snprintf(src, sizeof src,
                 "{%% set s = 'a' * 1000000 %%}{%% set t = 'a' * 1000000 %%}{%% for i in range(100000) %%}{%% set x = %s %%}{%% endfor %%}",
                 scans[i]);
        expect_err_lim(src, NULL, &small, "evaluation steps (limit)");
    }
    // a dict of 20000 keys from the input: every key looked up once (a hash index, not a scan
    // per lookup), and sorted by tojson
    size_t n = 20000;
    char *json = malloc(n * 24 + 16), *p = json;
    p += sprintf(p, "{\"d\": {");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "%s\"k%zu\": %zu", i ? ", " : "", n - 1 - i, i % 7);
    strcpy(p, "}}");
    long sum = 0;
    for (size_t i = 0; i < n; i++) sum += (long)(i % 7);
    char want[64];
    snprintf(want, sizeof want, "%ld %zu {\"k0\": %zu", sum, n, (n - 1) % 7);
    char err[ERR_LEN];
    jinja_limits_t lim = test_limits();
    char *out = render_lim("{% set ns = namespace(s=0) %}{% for k in d %}{% set ns.s = ns.s + d[k] %}{% endfor %}"
                           "{{ ns.s }} {{ d|length }} {{ (d|tojson(sort_keys=true))[:8] }}",
                           json, &lim, err);
    cr_assert_not_null(out, "%s", err);
    cr_assert_str_eq(out, want);
    free(out);
    free(json);
}

Test(jinja, limits_of_the_parser) {
    char err[ERR_LEN];
    size_t n = 200000;
    char *s = malloc(3 * n + 16);
    // brackets
    strcpy(s, "{{ ");
    memset(s + 3, '(', n);
    strcpy(s + 3 + n, "1 }}");
    cr_assert_null(jinja_parse(s, strlen(s), err));
    cr_assert_not_null(strstr(err, "nested deeper"), "%s", err);
    // unary chains, not-chains
    strcpy(s, "{{ ");
    memset(s + 3, '-', n);
    strcpy(s + 3 + n, "1 }}");
    cr_assert_null(jinja_parse(s, strlen(s), err));
    char *p = s + sprintf(s, "{{ ");
    for (size_t i = 0; i < 50000; i++) p += sprintf(p, "not ");
    strcpy(p, "1 }}");
    cr_assert_null(jinja_parse(s, strlen(s), err));
    cr_assert_not_null(strstr(err, "nested deeper"), "%s", err);
    // chains built without recursion: attribute access, filters, additions
    p = s + sprintf(s, "{{ x");
    for (size_t i = 0; i < 50000; i++) p += sprintf(p, ".a");
    strcpy(p, " }}");
    cr_assert_null(jinja_parse(s, strlen(s), err));
    cr_assert_not_null(strstr(err, "nests deeper than"), "%s", err);
    p = s + sprintf(s, "{%% macro m() %%}{{ 1");
    for (size_t i = 0; i < 50000; i++) p += sprintf(p, "+1");
    strcpy(p, " }}{% endmacro %}");
    cr_assert_null(jinja_parse(s, strlen(s), err));
    cr_assert_not_null(strstr(err, "nests deeper than"), "%s", err);
    // blocks
    p = s;
    for (size_t i = 0; i < 20000; i++) p += sprintf(p, "{%% if x %%}");
    strcpy(p, "x");
    cr_assert_null(jinja_parse(s, strlen(s), err));
    cr_assert_not_null(strstr(err, "nested deeper"), "%s", err);
    free(s);
    // size, bytes
    char *big = malloc(JINJA_MAX_SOURCE + 2);
    memset(big, 'a', JINJA_MAX_SOURCE + 1);
    cr_assert_null(jinja_parse(big, JINJA_MAX_SOURCE + 1, err));
    cr_assert_not_null(strstr(err, "larger than the limit"));
    free(big);
    cr_assert_null(jinja_parse("a\xff", 2, err));
    cr_assert_not_null(strstr(err, "not valid UTF-8"));
    cr_assert_null(jinja_parse("a\0b", 3, err));
    cr_assert_not_null(strstr(err, "NUL"));
    // a moderately long chain is fine
    expect_out("{{ 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 }}", NULL, "10");
}

Test(jinja, deep_recursion_ends_at_the_stack_guard) {
    // macros recursing through deep expressions: with the call-depth limit lifted, only the stack
    // guard stands between this template and a stack overflow
    char *s = malloc(100000);
    char *p = s + sprintf(s, "{%% macro f(n) %%}{%% if n > 0 %%}{{ f(n - 1) ~ (n");
    for (int i = 0; i < 390; i++) p += sprintf(p, " + n");
    strcpy(p, ") }}{% endif %}{% endmacro %}{{ f(N)|length }}");
    jinja_limits_t lim = test_limits();
    lim.max_depth = 1000000;
    expect_err_lim(s, "{\"N\": 100000}", &lim, "the template nests too deeply (stack limit)");
    // within the default limits the same template renders (60 levels)
    expect_out(s, "{\"N\": 60}", "273");
    free(s);
}

Test(jinja, values_from_json_keep_their_types) {
    // 1.0 stays a float, integers stay exact, \u escapes decode, keys keep their order
    expect_out("{{ a }} {{ b }} {{ c }} {{ d|tojson }} {% for k in e %}{{ k }}{% endfor %}",
               "{\"a\": 1.0, \"b\": 9007199254740993, \"c\": 1e2, \"d\": \"\\u00e9\\ud83d\\ude00\", \"e\": {\"z\": 1, \"a\": 2}}",
               "1.0 9007199254740993 100.0 \"é😀\" za");
    char err[ERR_LEN];
    jinja_vars_t *v = jinja_vars_new();
    cr_assert_eq(jinja_vars_set_json(v, "x", "\"a\\u0000b\"", 10, err), -1);
    cr_assert_not_null(strstr(err, "\\u0000"));
    cr_assert_eq(jinja_vars_set_json(v, "x", "[1, 2", 5, err), -1);
    cr_assert_eq(jinja_vars_set_json(v, "x", "123456789012345678901", 21, err), -1);
    cr_assert_eq(jinja_vars_update_json(v, "[1]", 3, NULL, err), -1);
    // from a cJSON tree (no text): integral numbers are integers
    cJSON *j = cJSON_Parse("{\"n\": 3.0, \"f\": 0.5}");
    cr_assert_eq(jinja_vars_set_cjson(v, "o", j, err), 0);
    cJSON_Delete(j);
    jinja_tpl_t *t = jinja_parse("{{ o.n }} {{ o.f }}", 19, err);
    char *out = jinja_render(t, v, NULL, NULL, err);
    cr_assert_str_eq(out, "3 0.5");
    free(out);
    jinja_destroy(&t);
    jinja_vars_destroy(&v);
}

Test(jinja, template_renders_repeatedly_and_vars_rebind) {
    char err[ERR_LEN];
    const char *src = "{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}";
    jinja_tpl_t *t = jinja_parse(src, strlen(src), err);
    cr_assert_not_null(t, "%s", err);
    jinja_vars_t *v = jinja_vars_new();
    for (int i = 1; i <= 3; i++) {
        char json[64];
        snprintf(json, sizeof json, "[%d, %d]", i, 10 * i);
        cr_assert_eq(jinja_vars_set_json(v, "xs", json, strlen(json), err), 0);
        char *out = jinja_render(t, v, NULL, NULL, err);
        char want[16];
        snprintf(want, sizeof want, "%d", 11 * i);
        cr_assert_str_eq(out, want);
        free(out);
    }
    jinja_vars_destroy(&v);
    jinja_destroy(&t);
}

// --- chat API ----------------------------------------------------------------------------------
static chat_template_t *ct_from(const char *cfg, const char *jinja) {
    char err[ERR_LEN];
    chat_template_t *ct = chat_template_from_config(cfg, strlen(cfg), jinja, err);
    cr_assert_not_null(ct, "%s", err);
    return ct;
}

static char *chat(const chat_template_t *ct, const char *req, const chat_opts_t *o, char *err) {
    return chat_render(ct, req, strlen(req), o, NULL, err);
}

Test(chat, special_tokens_from_strings_and_added_tokens) {
    chat_template_t *ct = ct_from(
        "{\"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token is defined }}|"
        "{{ additional_special_tokens }}|{{ boi_token }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}\","
        "\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\", \"lstrip\": false},"
        "\"eos_token\": \"</s>\", \"unk_token\": null, \"pad_token\": \"\","
        "\"additional_special_tokens\": [\"<a>\", {\"content\": \"<b>\"}],"
        "\"extra_special_tokens\": {\"boi_token\": \"<img>\"}}",
        NULL);
    char err[ERR_LEN];
    char *out = chat(ct, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, err);
    cr_assert_str_eq(out, "<s>|</s>|False|False|['<a>', '<b>']|<img>|None|None|False");
    free(out);
    // the request's members override the special tokens and become variables
    chat_opts_t o = {.add_generation_prompt = true};
    out = chat(ct, "{\"messages\": [], \"bos_token\": \"B\", \"tools\": [1]}", &o, err);
    cr_assert_str_eq(out, "B|</s>|False|False|['<a>', '<b>']|<img>|[1]|None|True");
    free(out);
    chat_template_destroy(&ct);
}

Test(chat, named_templates_and_selection) {
    chat_template_t *ct = ct_from("{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"},"
                                  "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"},"
                                  "{\"name\": \"rag\", \"template\": \"{% include 'x' %}\"}]}",
                                  NULL);
    cr_assert_eq(chat_template_count(ct), 3);
    cr_assert_str_eq(chat_template_name(ct, 2), "rag");
    char err[ERR_LEN];
    char *out = chat(ct, "{\"messages\": []}", NULL, err);
    cr_assert_str_eq(out, "D");
    free(out);
    out = chat(ct, "{\"messages\": [], \"tools\": [{}, {}]}", NULL, err);
    cr_assert_str_eq(out, "T2");
    free(out);
    chat_opts_t o = {.template_name = "default"};
    out = chat(ct, "{\"messages\": [], \"tools\": [{}]}", &o, err);
    cr_assert_str_eq(out, "D");
    free(out);
    o.template_name = "nope";
    cr_assert_null(chat(ct, "[]", &o, err));
    cr_assert_not_null(strstr(err, "no chat template named 'nope' (it has: default, tool_use, rag)"), "%s", err);
    // a template the interpreter refuses is reported when chosen, with its position
    o.template_name = "rag";
    cr_assert_null(chat(ct, "[]", &o, err));
    cr_assert_str_eq(err, "chat template 'rag': 1:4: the 'include' statement is not supported");
    chat_template_destroy(&ct);
    // chat_template.jinja replaces the default
    ct = ct_from("{\"chat_template\": \"old\"}", "new {{ messages|length }}");
    out = chat(ct, "[{\"role\": \"user\", \"content\": \"x\"}]", NULL, err);
    cr_assert_str_eq(out, "new 1");
    free(out);
    chat_template_destroy(&ct);
}

Test(chat, bad_configs_and_requests) {
    char err[ERR_LEN];
    const char *bad[][2] = {
        {"[1]", "not a JSON object"},
        {"{}", "has no chat template"},
        {"{\"chat_template\": 5}", "must be a string or a list"},
        {"{\"chat_template\": [{\"name\": \"a\"}]}", "needs string \"name\" and \"template\""},
        {"{\"chat_template\": \"x\", \"bos_token\": 1}", "bos_token must be a string"},
        {"{\"chat_template\": [{\"name\": \"a\", \"template\": \"x\"}, {\"name\": \"a\", \"template\": \"y\"}]}",
         "appears twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_null(chat_template_from_config(bad[i][0], strlen(bad[i][0]), NULL, err), "%s", bad[i][0]);
        cr_assert_not_null(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    chat_template_t *ct = ct_from("{\"chat_template\": \"{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}>{% endif %}\"}", NULL);
    const char *badreq[][2] = {
        {"{", "not valid JSON"},
        {"5", "must be a JSON array"},
        {"{\"tools\": []}", "needs \"messages\""},
        {"[{\"content\": \"x\"}]", "messages[0] must be an object with a string \"role\""},
        {"[1]", "messages[0] must be an object"},
        {"{\"messages\": [], \"tools\": 3}", "\"tools\" must be a list"},
        {"{\"messages\": [], \"add_generation_prompt\": 1}", "must be true or false"},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}], \"add_generation_prompt\": true, "
         "\"continue_final_message\": true}",
         "not compatible"},
    };
    for (size_t i = 0; i < sizeof badreq / sizeof badreq[0]; i++) {
        cr_assert_null(chat(ct, badreq[i][0], NULL, err), "%s", badreq[i][0]);
        cr_assert_not_null(strstr(err, badreq[i][1]), "%s: %s", badreq[i][0], err);
    }
    // add_generation_prompt: the request's value, else the options'; a forced option conflicts
    chat_opts_t o = {.add_generation_prompt = true};
    char *out = chat(ct, "[{\"role\": \"user\", \"content\": \"x\"}]", &o, err);
    cr_assert_str_eq(out, "user:x;>");
    free(out);
    out = chat(ct, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": false}", &o, err);
    cr_assert_str_eq(out, "user:x;");
    free(out);
    o = (chat_opts_t){.add_generation_prompt = false, .force_generation_prompt = true};
    cr_assert_null(chat(ct, "{\"messages\": [], \"add_generation_prompt\": true}", &o, err));
    cr_assert_not_null(strstr(err, "sets add_generation_prompt to true"), "%s", err);
    // continue_final_message cuts after the last message's text
    out = chat(ct, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"abc \"}], \"continue_final_message\": true}",
               NULL, err);
    cr_assert_str_eq(out, "assistant:abc "); // HF keeps the message's own trailing space
    free(out);
    chat_template_destroy(&ct);
}

// --- robustness --------------------------------------------------------------------------------
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static const char *const PIECES[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", "(", ")", "[", "]", "{", "}",
                                     "|", ".", ",", ":", "'", "\"", "\\", " if ", " for x in ", " endfor ",
                                     " endif ", " else ", "loop.", "ns.", "not ", " in ", "*", "**", "~", "=",
                                     " is ", "\n", " ", "messages", "[::-1]", "|tojson", "\xc3\xa9", "\xff",
                                     "{% macro m(a=1) %}", "{% endmacro %}", "{{ m() }}", "range(99999)"};

static const char *REQUEST =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U {{ x }}\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    "\"arguments\": {\"a\": 1.5}}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"user\", \"content\": null}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"add_generation_prompt\": true}";

// Renders a damaged template text; whatever happens must end with text or an error.
static int try_template(const char *src, size_t len, const jinja_limits_t *lim, int *parsed) {
    char err[ERR_LEN];
    jinja_tpl_t *t = jinja_parse(src, len, err);
    if (!t) return 0;
    (*parsed)++;
    jinja_vars_t *v = jinja_vars_new();
    cr_assert_eq(jinja_vars_update_json(v, REQUEST, strlen(REQUEST), NULL, err), 0);
    jinja_vars_set_string(v, "bos_token", "<s>", err);
    char *out = jinja_render(t, v, lim, NULL, err);
    int ok = out != NULL;
    free(out);
    jinja_vars_destroy(&v);
    jinja_destroy(&t);
    return ok;
}

Test(jinja_robustness, mutated_real_templates) {
    static const char *const names[] = {"qwen3", "llama3", "llama3_1", "llama3_2", "gemma3", "deepseek_v3", "llama2"};
    jinja_limits_t lim = test_limits();
    lim.max_steps = 100000;
    lim.max_output = 1 << 20;
    lim.max_memory = 32u << 20;
    lim.max_depth = 16;
    int parsed = 0, rendered = 0, total = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[128], err[ERR_LEN];
        snprintf(path, sizeof path, "tests/chat/templates/%s.json", names[k]);
        size_t len;
        char *cfg = slurp(path, &len);
        cJSON *j = cJSON_Parse(cfg);
        const char *tpl = cJSON_GetObjectItem(j, "chat_template")->valuestring;
        size_t tl = strlen(tpl);
        // the template itself renders the request
        rendered += try_template(tpl, tl, &lim, &parsed);
        total++;
        char *buf = malloc(tl + 4096);
        for (int it = 0; it < 500; it++) {
            memcpy(buf, tpl, tl);
            size_t n = tl;
            int edits = 1 + (int)(rnd() % 3);
            for (int e = 0; e < edits; e++) {
                size_t at = n ? rnd() % n : 0;
                switch (rnd() % 4) {
                case 0: // replace a byte
                    if (n) buf[at] = (char)(rnd() % 2 ? PIECES[rnd() % 16][0] : (char)(rnd() % 256));
                    break;
                case 1: { // delete a span
                    size_t span = 1 + rnd() % 16;
                    if (at + span > n) span = n - at;
                    memmove(buf + at, buf + at + span, n - at - span);
                    n -= span;
                    break;
                }
                case 2: { // insert a piece
                    const char *p = PIECES[rnd() % (sizeof PIECES / sizeof PIECES[0])];
                    size_t pl = strlen(p);
                    if (n + pl > tl + 4000) break;
                    memmove(buf + at + pl, buf + at, n - at);
                    memcpy(buf + at, p, pl);
                    n += pl;
                    break;
                }
                default: { // duplicate a span
                    size_t span = 1 + rnd() % 64;
                    if (at + span > n) span = n - at;
                    if (n + span > tl + 4000) break;
                    memmove(buf + at + span, buf + at, n - at);
                    n += span;
                    break;
                }
                }
            }
            rendered += try_template(buf, n, &lim, &parsed);
            total++;
        }
        free(buf);
        cJSON_Delete(j);
        free(cfg);
        (void)err;
    }
    fprintf(stderr, "mutated templates: %d tried, %d parsed, %d rendered (the rest: an error)\n", total, parsed, rendered);
    // the damage is neither all fatal nor all harmless: both paths were exercised
    cr_assert_gt(parsed, total / 20);
    cr_assert_gt(rendered, 6);
    cr_assert_lt(parsed, total);
}

Test(jinja_robustness, random_templates) {
    jinja_limits_t lim = test_limits();
    lim.max_steps = 50000;
    lim.max_output = 1 << 18;
    lim.max_memory = 16u << 20;
    lim.max_depth = 16;
    char buf[600];
    int parsed = 0, rendered = 0;
    for (int it = 0; it < 3000; it++) {
        size_t n = 0, target = rnd() % 300;
        while (n < target) {
            if (rnd() % 3) {
                const char *p = PIECES[rnd() % (sizeof PIECES / sizeof PIECES[0])];
                size_t pl = strlen(p);
                if (n + pl >= sizeof buf) break;
                memcpy(buf + n, p, pl);
                n += pl;
            } else {
                buf[n++] = (char)(it % 2 ? 'a' + rnd() % 26 : rnd() % 256);
            }
        }
        rendered += try_template(buf, n, &lim, &parsed);
    }
    fprintf(stderr, "random templates: 3000 tried, %d parsed, %d rendered\n", parsed, rendered);
    cr_assert_gt(parsed, 0);
}

// escape turns text into markup once; markup passes through escape unchanged, forceescape escapes
// it again (Jinja2's semantics).
Test(jinja, escape_and_forceescape) {
    expect_out("{{ s | escape }}", "{\"s\": \"<a href='x'>&\\\"</a>\"}", "&lt;a href=&#39;x&#39;&gt;&amp;&#34;&lt;/a&gt;");
    expect_out("{{ s | escape | escape }}", "{\"s\": \"<b>\"}", "&lt;b&gt;");
    expect_out("{{ s | escape | forceescape }}", "{\"s\": \"<b>\"}", "&amp;lt;b&amp;gt;");
    expect_out("{{ 5 | escape }}", NULL, "5");
}

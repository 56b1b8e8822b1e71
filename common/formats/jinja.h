// jinja.h - a Jinja2 interpreter for the subset of the language that chat templates use.
//
// Models prompt through the `chat_template` of their tokenizer_config.json, a Jinja2 template
// that Hugging Face renders with a sandboxed Jinja2 environment (trim_blocks and lstrip_blocks
// on, the loopcontrols extension, `raise_exception`, `strftime_now` and a `tojson` that is
// json.dumps with ensure_ascii=False). This module renders such templates the same way, byte for
// byte: Python's semantics for values, printing (repr), scoping and whitespace control.
//
// Supported: {{ }}, {% %}, {# #}, the -/+ whitespace modifiers, {% raw %}; statements for (loop
// variables, else, `if` filter, tuple targets, break/continue), if/elif/else, set (plain, tuple,
// namespace attribute, block), macro (defaults, keyword arguments, varargs/kwargs, recursion),
// with, filter blocks, generation (HF's assistant-mask tag, rendered as its body); expressions
// with literals, attribute/item access, slices, arithmetic, ~, comparisons (chained), and/or/not,
// in/not in, conditional expressions; the common filters, tests, string/dict/list methods and the
// globals range, namespace, dict, raise_exception and strftime_now (see README "Chat templates").
// Refused, with line:column: anything else (extends, include, import, call blocks, recursive
// loops, unknown filters and tests at parse time; unknown methods, %-formatting and non-string
// dict keys when evaluated).
//
// Everything is bounded (template size, nesting, output size, live memory, evaluation steps,
// call depth, range length), so a hostile template ends with an error, never a hang or a crash.
// A parsed template is read-only while it renders: one template may render on several threads.
#ifndef MARLAAS_JINJA_H
#define MARLAAS_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/util/util.h"

// Largest template source jinja_parse accepts (bytes) and the deepest nesting of blocks and
// expressions in it.
#define JINJA_MAX_SOURCE (1u << 20)
#define JINJA_MAX_NESTING 100
#define JINJA_MAX_AST_DEPTH 400   // of the syntax tree (long chains such as a.b.c... or a + b + ...)

typedef struct {
    size_t max_output;   // bytes of rendered text (default 16 MiB)
    size_t max_memory;   // bytes of values alive during a render, input excluded (default 256 MiB)
    long max_steps;      // evaluation steps: nodes, loop iterations, copied elements (default 20M)
    int max_depth;       // macro call depth (default 64)
    // The clock of strftime_now: fills *tm with the current local time; NULL: localtime_r(time()).
    // Tests inject a fixed time.
    int (*now)(struct tm *tm, void *ud);
    void *now_ud;
} jinja_limits_t;

void jinja_limits_default(jinja_limits_t *l);

typedef struct jinja_tpl jinja_tpl_t;
typedef struct jinja_vars jinja_vars_t;

// Parses a template. NULL and err ("LINE:COL: what") on a syntax error, an unsupported construct
// or a limit.
jinja_tpl_t *jinja_parse(const char *src, size_t len, char *err);
void jinja_destroy(jinja_tpl_t **t);

// The variables of a render: name -> value. Values are JSON; from text, a number written with a
// fraction or exponent stays a float ("1.0" renders as 1.0, as json.loads gives), an integer
// stays an exact 64-bit integer; from a cJSON tree (no text), integral numbers become integers.
jinja_vars_t *jinja_vars_new(void);
void jinja_vars_destroy(jinja_vars_t **v);
int jinja_vars_set_json(jinja_vars_t *v, const char *name, const char *json, size_t len, char *err);
// Binds every member of a JSON object (text) as a variable, except the names in skip (a
// NULL-terminated list, or NULL).
int jinja_vars_update_json(jinja_vars_t *v, const char *json, size_t len, const char *const *skip, char *err);
int jinja_vars_set_cjson(jinja_vars_t *v, const char *name, const cJSON *value, char *err);
int jinja_vars_set_string(jinja_vars_t *v, const char *name, const char *s, char *err); // s: UTF-8
void jinja_vars_set_bool(jinja_vars_t *v, const char *name, bool b);
void jinja_vars_set_none(jinja_vars_t *v, const char *name);
bool jinja_vars_has(const jinja_vars_t *v, const char *name);

// Renders t with vars (may be NULL) under lim (NULL: the defaults). Returns the text (owned by
// the caller, NUL-terminated; *len_out its length when not NULL) or NULL with err: "LINE:COL:
// what" for an evaluation error, the message itself for raise_exception (prefixed by
// JINJA_RAISED_PREFIX so callers can tell the template's own refusal from a failure).
#define JINJA_RAISED_PREFIX "template error: "
char *jinja_render(const jinja_tpl_t *t, const jinja_vars_t *vars, const jinja_limits_t *lim, size_t *len_out,
                   char *err);

#endif

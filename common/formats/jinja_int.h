// jinja_int.h - internals of the Jinja interpreter (jinja.h): values, the syntax tree, the
// render context. Shared by jinja.c (lexer, parser, public API), jinja_value.c (values,
// printing, JSON), jinja_eval.c (the evaluator) and jinja_builtins.c (filters, tests, methods).
#ifndef MARLAAS_JINJA_INT_H
#define MARLAAS_JINJA_INT_H

#include <locale.h>
#include <stdint.h>

#include "common/formats/jinja.h"

// --- values ------------------------------------------------------------------------------------
// A value is a small struct passed by value; strings, lists, dicts, functions and loop objects
// live on the heap with a reference count. Values made while rendering belong to the render
// context (jctx_t): each is on its list of live objects and is charged to its memory budget, and
// whatever is still alive when the render ends (cycles through namespaces, an error unwinding the
// stack) is freed there. Template constants and input variables are immortal: no reference
// counting, never freed by a render, shared read-only between renders.
typedef enum {
    JV_UNDEF = 0, // Jinja's default Undefined: prints empty, falsy, iterates as empty; u.s: a hint
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,      // list, tuple, generator, dict view, range (jlist_t.kind)
    JV_DICT,      // dict or namespace (jdict_t.ns)
    JV_FUNC,      // macro, global function, bound method
    JV_LOOP,      // the `loop` object of a for loop
    JV_MISSING,   // an argument not given (never visible to templates)
    JV_ERROR,     // in a generator: the error its next item raises (u.s: the message)
} jv_type_t;

#define JV_MARKUP 1 // jv_t.fl: a Markup string (|safe, |escape): `+` escapes the other operand

typedef struct jobj {
    struct jobj *prev, *next; // the render's live list (immortal objects: not linked)
    int32_t rc;
    uint8_t type;             // jv_type_t of the value that points here
    uint8_t immortal;
    uint16_t depth;           // containers: 1 + the deepest element
    size_t charge;            // bytes charged to the render's memory budget
} jobj_t;

typedef struct jstr {
    jobj_t h;
    size_t len;               // bytes (valid UTF-8, no NUL inside)
    size_t nch;               // code points
    char p[];                 // NUL-terminated
} jstr_t;

typedef struct jv {
    uint8_t t;                // jv_type_t
    uint8_t fl;               // JV_MARKUP
    union {
        bool b;
        int64_t i;
        double f;
        jstr_t *s;            // JV_STR; JV_UNDEF's hint (may be NULL)
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
        struct jloop *lp;
        jobj_t *o;
    } u;
} jv_t;

typedef enum {
    JL_LIST,
    JL_TUPLE,
    JL_GEN,       // a generator (select, map, reverse, items...): single pass, no len, always truthy
    JL_ITEMS,     // dict.items(), dict.keys(), dict.values(): re-iterable, sized, not subscriptable
    JL_KEYS,
    JL_VALUES,
    JL_RANGE,     // range(...): a sequence that does not print
} jlist_kind_t;

typedef struct jlist {
    jobj_t h;
    uint8_t kind;
    size_t n, cap;
    size_t pos;               // JL_GEN: items before pos were consumed
    jv_t *v;
} jlist_t;

typedef struct jdict {
    jobj_t h;
    bool ns;                  // a namespace(): attributes assignable with {% set ns.x = %}
    size_t n, cap;
    jstr_t **k;               // insertion order, as Python's dict
    jv_t *v;
    uint32_t *ix;             // from 32 entries on: a hash index (slot: entry + 1, 0 empty)
    size_t ixcap;             // its slots, a power of two, 2 x cap
} jdict_t;

typedef enum { JF_GLOBAL, JF_METHOD, JF_MACRO, JF_CYCLE } jfunc_kind_t;

struct jnode;
struct jhandle;
typedef struct jfunc {
    jobj_t h;
    uint8_t kind;
    int id;                   // JF_GLOBAL / JF_METHOD: which one
    const char *name;
    jv_t self;                // JF_METHOD: the bound object; JF_CYCLE: the loop
    const struct jnode *macro;
    struct jhandle *closure;  // JF_MACRO: the scope it was defined in
} jfunc_t;

typedef struct jloop {
    jobj_t h;
    jlist_t *items;           // what the loop iterates (after its `if` filter)
    size_t i;                 // index0 of the current item
} jloop_t;

// --- syntax tree -------------------------------------------------------------------------------
typedef enum {
    // statements
    S_TEXT,       // val: the text
    S_OUT,        // a: expression
    S_IF,         // a: test, body, els (an elif is an S_IF alone in els)
    S_FOR,        // a: target (E_NAME or E_TUPLE of names), b: iterable, c: filter or NULL, body, els
    S_SET,        // a: target (E_NAME, E_TUPLE of names, or E_ATTR of an E_NAME), b: value
    S_SETBLOCK,   // a: target name, body; c: filter chain over E_CONST placeholder or NULL
    S_MACRO,      // name, params/defaults (np), body, flags: uses varargs/kwargs
    S_BREAK,
    S_CONTINUE,
    S_WITH,       // params/defaults: the assignments (np), body
    S_FILTER,     // c: filter chain over an E_CONST placeholder, body
    S_BLOCK,      // body rendered in place (the `generation` tag)
    // expressions
    E_CONST,      // val
    E_NAME,       // name
    E_ATTR,       // a.name
    E_ITEM,       // a[b]
    E_SLICE,      // a[b:c:d], each of b, c, d may be NULL
    E_CALL,       // a(args..., kwnames=kwargs...)
    E_FILTER,     // a | name(args...), id: filter
    E_TEST,       // a is name(args...), id: test
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,        // a op b, op: one of '+', '-', '*', '/', 'f' (//), '%', 'p' (**)
    E_CONCAT,     // args joined with ~
    E_AND,
    E_OR,
    E_CMP,        // a, then ops[i] args[i]...: 'e' ==, 'n' !=, '<', 'l' <=, '>', 'g' >=, 'i' in, 'x' not in
    E_COND,       // b if a else c (c may be NULL)
    E_LIST,       // args
    E_TUPLE,      // args
    E_DICT,       // args: keys, kwargs: values (nkw == nargs)
    E_HOLE,       // the value a filter block or set-block filter applies to
} jnode_kind_t;

#define JN_VARARGS 1 // S_MACRO flags
#define JN_KWARGS 2

typedef struct jnode {
    uint8_t k;
    uint8_t op;
    uint8_t flags;
    int id;
    int line, col;
    const char *name;
    jv_t val;
    struct jnode *a, *b, *c, *d;
    struct jnode **args;      // positional arguments, elements, comparison operands
    int nargs;
    const char **kwnames;     // keyword argument names (NULL for dict literals)
    struct jnode **kwargs;
    int nkw;
    char *ops;                // E_CMP
    struct jnode **body;      // statements
    int nbody;
    struct jnode **els;
    int nels;
    const char **params;      // S_MACRO, S_WITH
    struct jnode **defaults;  // NULL entries: no default
    int np;
} jnode_t;

// Allocations that live as long as the template (or the variable set): nodes, names, constants.
typedef struct jarena {
    struct jarena_blk *head;
} jarena_t;
void *jarena_alloc(jarena_t *a, size_t n);
char *jarena_strndup(jarena_t *a, const char *s, size_t n);
void jarena_free(jarena_t *a);

struct jinja_tpl {
    jarena_t arena;
    jnode_t **body;
    int nbody;
};

struct jinja_vars {
    jarena_t arena;
    int n, cap;
    char **names;
    jv_t *vals;
};

// --- render context ----------------------------------------------------------------------------
// A growing text buffer. Its storage is a live object of the render, so an error that unwinds
// past a buffer loses nothing (the end of the render frees it).
typedef struct jbuf {
    jobj_t *o;   // header followed by cap bytes; NULL until the first byte
    char *p;     // the bytes, NUL-terminated
    size_t len, cap;
} jbuf_t;

typedef struct jscope {
    struct jscope *parent;
    struct jhandle *handle;   // made when a macro is defined here; cleared when the scope ends
    int n, cap;
    const char **k;
    jv_t *v;
} jscope_t;

typedef struct jhandle {
    jobj_t h;
    jscope_t *scope;          // NULL once the scope has ended
} jhandle_t;

typedef struct jctx {
    jinja_limits_t lim;
    const jinja_vars_t *vars;
    char *err;
    bool failed;
    bool fatal;               // the error is a limit: nothing may catch it
    jobj_t live;              // sentinel of the live-object list
    size_t mem;
    long steps;
    int depth;                // macro calls in progress
    jscope_t *scope;          // the innermost scope
    jscope_t *scopes;         // every scope made (freed at the end)
    locale_t loc;             // C.UTF-8 for case mapping (0: ASCII only)
    locale_t cloc;            // "C" for strftime_now
    uintptr_t stack_base;     // frame address where the render started (stack-depth guard)
    jv_t hole;                // the value an E_HOLE stands for (filter blocks)
} jctx_t;

// Errors: sets the message (the first one wins), returns -1. A NULL node: no position.
int jerr(jctx_t *c, const jnode_t *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// A limit was reached: the same, and the render ends whatever catches errors.
int jfatal(jctx_t *c, const jnode_t *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int jstep(jctx_t *c, const jnode_t *at);
// Generators (select, map, ...) are lazy in Jinja: an item that fails is an error only when it is
// consumed. jcatch turns the current error into such an item (0), unless it is a limit (-1);
// jraise raises it when consumed.
int jcatch(jctx_t *c, jv_t *item);
int jraise(jctx_t *c, jv_t item);

// --- values (jinja_value.c) --------------------------------------------------------------------
extern const jv_t JV_UNDEFINED;
extern const jv_t JV_NONEV;
static inline jv_t jv_bool(bool b) { jv_t v = {.t = JV_BOOL}; v.u.b = b; return v; }
static inline jv_t jv_int(int64_t i) { jv_t v = {.t = JV_INT}; v.u.i = i; return v; }
static inline jv_t jv_float(double f) { jv_t v = {.t = JV_FLOAT}; v.u.f = f; return v; }
static inline bool jv_heap(jv_t v) {
    return (v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_FUNC || v.t == JV_LOOP ||
            v.t == JV_ERROR || (v.t == JV_UNDEF && v.u.s)) && v.u.o;
}
jv_t jv_ref(jv_t v);
void jv_unref(jctx_t *c, jv_t v);
void jobj_release(jctx_t *c, jobj_t *o);

// Heap objects of a render (c != NULL) or immortal ones (c == NULL, arena != NULL).
void *jobj_new(jctx_t *c, jarena_t *arena, size_t size, uint8_t type);
jstr_t *jstr_new(jctx_t *c, jarena_t *arena, const char *s, size_t len);
jv_t jv_str(jctx_t *c, const char *s, size_t len);          // t = JV_STR (u.s NULL after an error)
jv_t jv_strz(jctx_t *c, const char *s);
jv_t jv_undef_hint(jctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jlist_t *jlist_new(jctx_t *c, jarena_t *arena, uint8_t kind, size_t cap);
int jlist_push(jctx_t *c, jlist_t *l, jv_t v);             // takes ownership of v
jdict_t *jdict_new(jctx_t *c, jarena_t *arena, bool ns);
int jdict_set(jctx_t *c, jdict_t *d, jstr_t *k, jv_t v);   // takes ownership of v; refs k
jv_t *jdict_find(const jdict_t *d, const char *k, size_t len);
static inline jv_t jv_list(jlist_t *l) { jv_t v = {.t = JV_LIST}; v.u.l = l; return v; }
static inline jv_t jv_dict(jdict_t *d) { jv_t v = {.t = JV_DICT}; v.u.d = d; return v; }

// JSON -> immortal value in an arena. With text, floats are the numbers written with '.', 'e' or
// 'E' and integers are read exactly from the text.
int jv_from_cjson(jarena_t *a, const cJSON *j, const char *text, size_t len, jv_t *out, char *err);

const char *jv_type_name(jv_t v);
bool jv_truthy(jv_t v);
bool jv_is_str(jv_t v);
size_t jv_len_or(jv_t v, bool *ok);
int jv_eq(jctx_t *c, jv_t a, jv_t b);  // Python ==; charges its work to c->steps (c may be NULL)
int jv_cmp(jctx_t *c, const jnode_t *at, jv_t a, jv_t b, int *out); // <0 =0 >0, -1 on TypeError
void jbuf_init(jbuf_t *b);
int jbuf_put(jctx_t *c, jbuf_t *b, const char *s, size_t n);
int jbuf_putc(jctx_t *c, jbuf_t *b, char ch);
int jbuf_reserve(jctx_t *c, jbuf_t *b, size_t n);          // room for n more bytes (no realloc until then)
int jbuf_printf(jctx_t *c, jbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jbuf_free(jctx_t *c, jbuf_t *b);
jv_t jbuf_take_str(jctx_t *c, jbuf_t *b);                  // the buffer as a string value; frees b
// Ends a string built in b: rc != 0 (the building failed) frees b and returns -1; else *out is
// the string with flags fl, and the result is -1 when the context has failed.
int jbuf_finish(jctx_t *c, jbuf_t *b, int rc, uint8_t fl, jv_t *out);
int jv_to_str(jctx_t *c, const jnode_t *at, jv_t v, jbuf_t *b);   // Python str()
int jv_repr(jctx_t *c, const jnode_t *at, jv_t v, jbuf_t *b);     // Python repr()
int jv_stringify(jctx_t *c, const jnode_t *at, jv_t v, jv_t *out); // str() as a value (keeps strings)
void jfmt_float(double f, char *out, size_t n);            // Python repr(float)
typedef struct {
    const char *indent;   // NULL: one line
    const char *item_sep; // NULL: ", " (one line) or "," (indented)
    const char *key_sep;  // NULL: ": "
    bool ensure_ascii;
    bool sort_keys;
} jjson_opts_t;
int jv_tojson(jctx_t *c, const jnode_t *at, jv_t v, const jjson_opts_t *o, jbuf_t *b, int level);
// The items a value iterates (a list, shared or new; consumes a generator). TypeError for
// values that do not iterate.
int jv_iterate(jctx_t *c, const jnode_t *at, jv_t v, jlist_t **out);
// The same, except that a generator's pending error (jcatch) ends the items as their last one
// instead of being raised: a generator made from a generator raises it only when consumed.
int jv_iterate_lazy(jctx_t *c, const jnode_t *at, jv_t v, bool keep_errors, jlist_t **out);

// --- UTF-8 and Unicode helpers ------------------------------------------------------------------
size_t ju_count(const char *s, size_t len);                // code points
size_t ju_offset(const char *s, size_t len, size_t idx);   // byte offset of code point idx (clamped)
uint32_t ju_decode(const char *s, size_t len, size_t *i);  // advances *i
int ju_encode(uint32_t cp, char out[4]);
bool ju_valid(const char *s, size_t len);
bool ju_isspace(uint32_t cp);                              // Python str.isspace
uint32_t ju_upper(const jctx_t *c, uint32_t cp);
uint32_t ju_lower(const jctx_t *c, uint32_t cp);
bool ju_printable(uint32_t cp);                            // Python str.isprintable (approximate above U+00FF)

// --- evaluator (jinja_eval.c) ------------------------------------------------------------------
int jeval(jctx_t *c, const jnode_t *n, jv_t *out);
int jcall(jctx_t *c, const jnode_t *at, jv_t fn, jv_t *args, int nargs, const char **kwn, jv_t *kwv, int nkw,
          jv_t *out);
int jgetattr(jctx_t *c, const jnode_t *at, jv_t obj, const char *name, size_t len, jv_t *out);
int jgetitem(jctx_t *c, const jnode_t *at, jv_t obj, jv_t key, jv_t *out);
int jbinop(jctx_t *c, const jnode_t *at, int op, jv_t a, jv_t b, jv_t *out);

// --- builtins (jinja_builtins.c) ---------------------------------------------------------------
// MarkupSafe's escape of s[0..n) appended to b (& < > " ' as &amp; &lt; &gt; &#34; &#39;).
int jb_html_escape(jctx_t *c, const char *s, size_t n, jbuf_t *b);
int jb_filter_id(const char *name);                        // -1 when unknown
int jb_test_id(const char *name);
int jb_filter(jctx_t *c, const jnode_t *at, int id, jv_t self, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
              int nkw, jv_t *out);
int jb_test(jctx_t *c, const jnode_t *at, int id, jv_t self, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
            int nkw, bool *out);
// A method of a str, dict, list or loop: 1 and *out a bound method, 0 when the type has no such
// attribute (Jinja then tries an item), -1 on error (a Python method this interpreter refuses).
int jb_method(jctx_t *c, const jnode_t *at, jv_t self, const char *name, size_t len, jv_t *out);
int jb_call_method(jctx_t *c, const jnode_t *at, jfunc_t *f, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
                   int nkw, jv_t *out);
int jb_global_id(const char *name);                        // range, namespace, dict, raise_exception, strftime_now
int jb_call_global(jctx_t *c, const jnode_t *at, int id, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
                   int nkw, jv_t *out);
// Binds call arguments to a parameter list, Python style: out[i] is the argument or JV_MISSING.
int jb_bind(jctx_t *c, const jnode_t *at, const char *fname, const char *const *params, int np, jv_t *args,
            int nargs, const char **kwn, jv_t *kwv, int nkw, jv_t *out);

#endif

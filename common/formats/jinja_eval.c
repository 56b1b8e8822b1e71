// jinja_eval.c - the evaluator of the Jinja interpreter: scopes (Jinja's: a for loop, a macro
// call, a with/set/filter block each have their own; if does not), statements, expressions with
// Python's semantics, attribute and item lookup as Jinja's sandbox does it, macro calls, and
// jinja_render.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/jinja_int.h"

// The stack a render may use (its recursion is also bounded by nesting and call depth; this
// guard keeps a small thread stack safe).
#define JINJA_STACK_BUDGET (1u << 20)

// Statement results besides 0 / -1.
#define EX_BREAK 1
#define EX_CONTINUE 2

int jerr(jctx_t *c, const jnode_t *at, const char *fmt, ...) {
    if (c->failed) return -1;
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) err_set(c->err, "%d:%d: %s", at->line, at->col, msg);
    else err_set(c->err, "%s", msg);
    c->failed = true;
    return -1;
}

int jfatal(jctx_t *c, const jnode_t *at, const char *fmt, ...) {
    if (c->failed) {
        c->fatal = true;
        return -1;
    }
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jerr(c, at, "%s", msg);
    c->fatal = true;
    return -1;
}

int jstep(jctx_t *c, const jnode_t *at) {
    if (c->failed) return -1;
    if (++c->steps > c->lim.max_steps)
        return jfatal(c, at, "the template ran more than %ld evaluation steps (limit)", c->lim.max_steps);
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (c->stack_base > here && c->stack_base - here > JINJA_STACK_BUDGET)
        return jfatal(c, at, "the template nests too deeply (stack limit)");
    return 0;
}

int jcatch(jctx_t *c, jv_t *item) {
    if (!c->failed || c->fatal) return -1;
    c->failed = false;
    item->t = JV_ERROR;
    item->fl = 0;
    item->u.s = jstr_new(c, NULL, c->err, strlen(c->err));
    return c->failed ? -1 : 0;
}

int jraise(jctx_t *c, jv_t item) {
    if (c->failed) return -1;
    err_set(c->err, "%s", item.u.s->p);
    c->failed = true;
    return -1;
}

// --- scopes ------------------------------------------------------------------------------------
static jscope_t *scope_push(jctx_t *c, jscope_t *parent) {
    jscope_t *s = xcalloc(1, sizeof *s);
    s->parent = parent;
    c->mem += sizeof *s;
    return s;
}

static void scope_pop(jctx_t *c, jscope_t *s) {
    for (int i = 0; i < s->n; i++) jv_unref(c, s->v[i]);
    if (s->handle) {
        s->handle->scope = NULL;
        jobj_release(c, &s->handle->h);
    }
    c->mem -= sizeof *s + (size_t)s->cap * (sizeof *s->k + sizeof *s->v);
    free(s->k);
    free(s->v);
    free(s);
}

// Drops every binding of s (a loop's scope between iterations); a macro defined in it still
// sees the scope itself.
static void scope_clear(jctx_t *c, jscope_t *s) {
    for (int i = 0; i < s->n; i++) jv_unref(c, s->v[i]);
    s->n = 0;
}

// Binds name in s (takes ownership of v).
static void scope_set(jctx_t *c, jscope_t *s, const char *name, jv_t v) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->k[i], name)) {
            jv_t old = s->v[i];
            s->v[i] = v;
            jv_unref(c, old);
            return;
        }
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 8;
        s->k = xrealloc(s->k, (size_t)nc * sizeof *s->k);
        s->v = xrealloc(s->v, (size_t)nc * sizeof *s->v);
        c->mem += (size_t)(nc - s->cap) * (sizeof *s->k + sizeof *s->v);
        s->cap = nc;
    }
    s->k[s->n] = name;
    s->v[s->n++] = v;
}

// The value of a name (borrowed), or NULL: scopes innermost first, then the render's variables.
static const jv_t *lookup(jctx_t *c, const char *name) {
    for (jscope_t *s = c->scope; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (!strcmp(s->k[i], name)) return &s->v[i];
    if (c->vars)
        for (int i = 0; i < c->vars->n; i++)
            if (!strcmp(c->vars->names[i], name)) return &c->vars->vals[i];
    return NULL;
}

static jhandle_t *scope_handle(jctx_t *c, jscope_t *s) {
    if (!s->handle) {
        s->handle = jobj_new(c, NULL, sizeof(jhandle_t), JV_MISSING);
        s->handle->scope = s;
    }
    s->handle->h.rc++;
    return s->handle;
}

// --- attribute and item lookup -----------------------------------------------------------------
static int undefined_error(jctx_t *c, const jnode_t *at, jv_t u) {
    return jerr(c, at, "%s", u.u.s ? u.u.s->p : "an undefined value was used");
}

static int loop_attr(jctx_t *c, const jnode_t *at, jv_t obj, const char *name, jv_t *out) {
    jloop_t *lp = obj.u.lp;
    size_t n = lp->items->n, i = lp->i;
    if (!strcmp(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = jv_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = jv_int(1);
    else if (!strcmp(name, "depth0")) *out = jv_int(0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? jv_ref(lp->items->v[i - 1]) : jv_undef_hint(c, "there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? jv_ref(lp->items->v[i + 1]) : jv_undef_hint(c, "there is no next item");
    else if (!strcmp(name, "cycle")) {
        jfunc_t *f = jobj_new(c, NULL, sizeof(jfunc_t), JV_FUNC);
        f->kind = JF_CYCLE;
        f->name = "cycle";
        f->self = jv_ref(obj);
        out->t = JV_FUNC;
        out->fl = 0;
        out->u.fn = f;
    } else if (!strcmp(name, "changed")) {
        return jerr(c, at, "loop.changed is not supported");
    } else {
        *out = jv_undef_hint(c, "'LoopContext' object has no attribute '%s'", name);
    }
    return c->failed ? -1 : 0;
}

int jgetattr(jctx_t *c, const jnode_t *at, jv_t obj, const char *name, size_t len, jv_t *out) {
    switch (obj.t) {
    case JV_UNDEF: return undefined_error(c, at, obj);
    case JV_LOOP: return loop_attr(c, at, obj, name, out);
    case JV_DICT: {
        if (!obj.u.d->ns) {
            int m = jb_method(c, at, obj, name, len, out);
            if (m) return m < 0 ? -1 : 0;
        }
        jv_t *v = jdict_find(obj.u.d, name, len);
        if (v) {
            *out = jv_ref(*v);
            return 0;
        }
        *out = jv_undef_hint(c, "'%s' has no attribute '%s'", obj.u.d->ns ? "Namespace" : "dict object", name);
        return c->failed ? -1 : 0;
    }
    case JV_STR:
    case JV_LIST: {
        int m = jb_method(c, at, obj, name, len, out);
        if (m) return m < 0 ? -1 : 0;
        break;
    }
    default: break;
    }
    *out = jv_undef_hint(c, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
    return c->failed ? -1 : 0;
}

static bool as_index(jv_t k, int64_t *i) {
    if (k.t == JV_INT) *i = k.u.i;
    else if (k.t == JV_BOOL) *i = k.u.b;
    else return false;
    return true;
}

int jgetitem(jctx_t *c, const jnode_t *at, jv_t obj, jv_t key, jv_t *out) {
    int64_t i;
    switch (obj.t) {
    case JV_UNDEF: return undefined_error(c, at, obj);
    case JV_DICT:
        if (key.t == JV_STR && !obj.u.d->ns) {
            jv_t *v = jdict_find(obj.u.d, key.u.s->p, key.u.s->len);
            if (v) {
                *out = jv_ref(*v);
                return 0;
            }
        }
        break;
    case JV_LIST: {
        jlist_t *l = obj.u.l;
        if (l->kind == JL_GEN || l->kind == JL_ITEMS || l->kind == JL_KEYS || l->kind == JL_VALUES) break;
        if (as_index(key, &i)) {
            if (i < 0) i += (int64_t)l->n;
            if (i >= 0 && (size_t)i < l->n) {
                *out = jv_ref(l->v[i]);
                return 0;
            }
            *out = jv_undef_hint(c, "%s index %lld out of range", jv_type_name(obj), (long long)i);
            return c->failed ? -1 : 0;
        }
        break;
    }
    case JV_STR: {
        jstr_t *s = obj.u.s;
        if (as_index(key, &i)) {
            if (i < 0) i += (int64_t)s->nch;
            if (i >= 0 && (size_t)i < s->nch) {
                size_t a = s->nch == s->len ? (size_t)i : ju_offset(s->p, s->len, (size_t)i), b = a;
                c->steps += (long)(s->nch == s->len ? 0 : a >> 4);
                ju_decode(s->p, s->len, &b);
                *out = jv_str(c, s->p + a, b - a);
                out->fl = obj.fl;
                return c->failed ? -1 : 0;
            }
            *out = jv_undef_hint(c, "string index %lld out of range", (long long)i);
            return c->failed ? -1 : 0;
        }
        break;
    }
    default: break;
    }
    // Jinja: a failed subscript with a string tries the attribute of that name
    if (key.t == JV_STR) return jgetattr(c, at, obj, key.u.s->p, key.u.s->len, out);
    *out = jv_undef_hint(c, "'%s object' has no item of that key", jv_type_name(obj));
    return c->failed ? -1 : 0;
}

// Python's slice.indices, then the items.
static int do_slice(jctx_t *c, const jnode_t *at, jv_t obj, jv_t *se, jv_t *out) {
    if (obj.t == JV_UNDEF) return undefined_error(c, at, obj);
    bool seq = obj.t == JV_STR ||
               (obj.t == JV_LIST && (obj.u.l->kind == JL_LIST || obj.u.l->kind == JL_TUPLE || obj.u.l->kind == JL_RANGE));
    int64_t v[3];
    bool given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = se[k].t != JV_NONE;
        if (given[k] && !as_index(se[k], &v[k])) seq = false;
    }
    if (!seq) {
        *out = jv_undef_hint(c, "'%s object' cannot be sliced that way", jv_type_name(obj));
        return c->failed ? -1 : 0;
    }
    int64_t step = given[2] ? v[2] : 1;
    if (step == 0) return jerr(c, at, "slice step cannot be zero");
    int64_t len = obj.t == JV_STR ? (int64_t)obj.u.s->nch : (int64_t)obj.u.l->n;
    int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
    int64_t idx[2];
    for (int k = 0; k < 2; k++) {
        if (!given[k]) {
            idx[k] = (k == 0) == (step < 0) ? upper : lower;
            continue;
        }
        int64_t x = v[k];
        if (x < 0) {
            x += len;
            if (x < lower) x = lower;
        } else if (x > upper) {
            x = upper;
        }
        idx[k] = x;
    }
    int64_t start = idx[0], stop = idx[1];
    if (obj.t == JV_STR) {
        jstr_t *s = obj.u.s;
        jbuf_t b;
        jbuf_init(&b);
        int rc = 0;
        c->steps += (long)(s->len >> 2);
        if (s->nch == s->len) { // ASCII: characters are bytes
            for (int64_t k = start; !rc && (step > 0 ? k < stop : k > stop); k += step)
                rc = jbuf_put(c, &b, s->p + k, 1);
        } else {
            // code point offsets (charged as memory while they live), then the chosen ones
            size_t bytes = (s->nch + 1) * sizeof(size_t);
            c->mem += bytes;
            if (c->mem > c->lim.max_memory) {
                c->mem -= bytes;
                return jfatal(c, at, "the template needs more than %zu bytes of memory (limit)", c->lim.max_memory);
            }
            size_t *offs = xmalloc(bytes);
            size_t p = 0;
            for (size_t k = 0; k <= s->nch; k++) {
                offs[k] = p;
                if (p < s->len) ju_decode(s->p, s->len, &p);
            }
            for (int64_t k = start; !rc && (step > 0 ? k < stop : k > stop); k += step)
                rc = jbuf_put(c, &b, s->p + offs[k], offs[k + 1] - offs[k]);
            free(offs);
            c->mem -= bytes;
        }
        return jbuf_finish(c, &b, rc, obj.fl, out);
    }
    jlist_t *l = obj.u.l;
    jlist_t *r = jlist_new(c, NULL, l->kind, 0);
    c->steps += (long)(l->n >> 4);
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
        if (jlist_push(c, r, jv_ref(l->v[k]))) break;
    *out = jv_list(r);
    return c->failed ? -1 : 0;
}

// --- operators ---------------------------------------------------------------------------------
static bool is_num(jv_t v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double fnum(jv_t v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t inum(jv_t v) { return v.t == JV_INT ? v.u.i : (int64_t)v.u.b; }

static const char *op_name(int op) {
    switch (op) {
    case 'f': return "//";
    case 'p': return "**";
    case '+': return "+";
    case '-': return "-";
    case '*': return "*";
    case '/': return "/";
    default: return "%";
    }
}

static int repeat(jctx_t *c, const jnode_t *at, jv_t seq, int64_t n, jv_t *out) {
    if (n < 0) n = 0;
    if (seq.t == JV_STR) {
        if (n && seq.u.s->len && (uint64_t)n > c->lim.max_output / seq.u.s->len)
            return jfatal(c, at, "string repetition larger than %zu bytes (limit)", c->lim.max_output);
        jbuf_t b;
        jbuf_init(&b);
        size_t total = (size_t)n * seq.u.s->len;
        int rc = jbuf_reserve(c, &b, total);
        if (!rc && total) rc = jbuf_put(c, &b, seq.u.s->p, seq.u.s->len);
        while (!rc && b.len < total) { // doubling copies within the reserved buffer
            size_t k = b.len < total - b.len ? b.len : total - b.len;
            rc = jbuf_put(c, &b, b.p, k);
        }
        return jbuf_finish(c, &b, rc, seq.fl, out);
    }
    jlist_t *l = seq.u.l;
    if (n && l->n && (uint64_t)n > (uint64_t)c->lim.max_steps / l->n)
        return jfatal(c, at, "list repetition too large (limit)");
    jlist_t *r = jlist_new(c, NULL, l->kind, 0);
    for (int64_t k = 0; k < n; k++)
        for (size_t i = 0; i < l->n; i++)
            if (jlist_push(c, r, jv_ref(l->v[i]))) goto done;
done:
    *out = jv_list(r);
    return c->failed ? -1 : 0;
}

int jbinop(jctx_t *c, const jnode_t *at, int op, jv_t a, jv_t b, jv_t *out) {
    if (a.t == JV_UNDEF) return undefined_error(c, at, a);
    if (b.t == JV_UNDEF) return undefined_error(c, at, b);
    if (is_num(a) && is_num(b)) {
        bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
        int64_t x = ints ? inum(a) : 0, y = ints ? inum(b) : 0, r;
        double fx = fnum(a), fy = fnum(b);
        switch (op) {
        case '+':
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &r)) return jerr(c, at, "integer overflow");
            *out = jv_int(r);
            return 0;
        case '-':
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &r)) return jerr(c, at, "integer overflow");
            *out = jv_int(r);
            return 0;
        case '*':
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &r)) return jerr(c, at, "integer overflow");
            *out = jv_int(r);
            return 0;
        case '/':
            if (fy == 0) return jerr(c, at, "division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case 'f':
        case '%':
            if (ints) {
                if (y == 0) return jerr(c, at, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return jerr(c, at, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == 'f' ? q : m);
                return 0;
            }
            if (fy == 0) return jerr(c, at, "float division or modulo by zero");
            if (op == 'f') {
                *out = jv_float(floor(fx / fy));
            } else {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                else if (m == 0) m = copysign(0.0, fy);
                *out = jv_float(m);
            }
            return 0;
        case 'p':
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e > 0) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc)) return jerr(c, at, "integer overflow");
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) return jerr(c, at, "integer overflow");
                }
                *out = jv_int(acc);
                return 0;
            }
            if (fx == 0 && fy < 0) return jerr(c, at, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy)) return jerr(c, at, "a negative number raised to a fractional power is complex");
            *out = jv_float(pow(fx, fy));
            return 0;
        }
        switch (op) {
        case '+': *out = jv_float(fx + fy); return 0;
        case '-': *out = jv_float(fx - fy); return 0;
        case '*': *out = jv_float(fx * fy); return 0;
        }
    }
    if (op == '+' && a.t == JV_STR && b.t == JV_STR) {
        jbuf_t buf;
        jbuf_init(&buf);
        bool ma = a.fl & JV_MARKUP, mb = b.fl & JV_MARKUP;
        int rc = (ma || !mb) ? jbuf_put(c, &buf, a.u.s->p, a.u.s->len) : jb_html_escape(c, a.u.s->p, a.u.s->len, &buf);
        if (!rc) rc = (mb || !ma) ? jbuf_put(c, &buf, b.u.s->p, b.u.s->len) : jb_html_escape(c, b.u.s->p, b.u.s->len, &buf);
        return jbuf_finish(c, &buf, rc, (ma || mb) ? JV_MARKUP : 0, out);
    }
    if (op == '+' && a.t == JV_LIST && b.t == JV_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE)) {
        jlist_t *r = jlist_new(c, NULL, a.u.l->kind, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) r->v[r->n++] = jv_ref(a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) r->v[r->n++] = jv_ref(b.u.l->v[i]);
        uint16_t d = a.u.l->h.depth > b.u.l->h.depth ? a.u.l->h.depth : b.u.l->h.depth;
        r->h.depth = d;
        c->steps += (long)(r->n >> 4);
        *out = jv_list(r);
        return c->failed ? -1 : 0;
    }
    if (op == '*') {
        bool seq_a = a.t == JV_STR || (a.t == JV_LIST && (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE));
        bool seq_b = b.t == JV_STR || (b.t == JV_LIST && (b.u.l->kind == JL_LIST || b.u.l->kind == JL_TUPLE));
        if (seq_a && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(c, at, a, inum(b), out);
        if (seq_b && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(c, at, b, inum(a), out);
    }
    if (op == '%' && a.t == JV_STR) return jerr(c, at, "string formatting with '%%' is not supported");
    return jerr(c, at, "unsupported operand types for %s: '%s' and '%s'", op_name(op), jv_type_name(a),
                jv_type_name(b));
}

// `item in container`
static int contains(jctx_t *c, const jnode_t *at, jv_t item, jv_t cont, bool *out) {
    switch (cont.t) {
    case JV_UNDEF: *out = false; return 0;
    case JV_STR:
        if (item.t != JV_STR)
            return jerr(c, at, "'in <string>' requires a string as left operand, not '%s'", jv_type_name(item));
        c->steps += (long)(cont.u.s->len >> 6); // scanning is work
        *out = item.u.s->len == 0 || memmem(cont.u.s->p, cont.u.s->len, item.u.s->p, item.u.s->len) != NULL;
        return 0;
    case JV_LIST: {
        jlist_t *l = cont.u.l;
        size_t from = l->kind == JL_GEN ? l->pos : 0;
        for (size_t i = from; i < l->n; i++) {
            if (jstep(c, at)) return -1;
            if (l->v[i].t == JV_ERROR) {
                l->pos = i + 1;
                return jraise(c, l->v[i]);
            }
            if (jv_eq(c, l->v[i], item)) {
                if (l->kind == JL_GEN) l->pos = i + 1;
                *out = true;
                return 0;
            }
        }
        if (l->kind == JL_GEN) l->pos = l->n;
        *out = false;
        return 0;
    }
    case JV_DICT:
        if (cont.u.d->ns) break;
        if (item.t == JV_LIST || item.t == JV_DICT) return jerr(c, at, "unhashable type: '%s'", jv_type_name(item));
        *out = item.t == JV_STR && jdict_find(cont.u.d, item.u.s->p, item.u.s->len) != NULL;
        return 0;
    default: break;
    }
    return jerr(c, at, "argument of type '%s' is not iterable", jv_type_name(cont));
}

static int compare(jctx_t *c, const jnode_t *at, char op, jv_t a, jv_t b, bool *out) {
    int r;
    switch (op) {
    case 'e': *out = jv_eq(c, a, b); return 0;
    case 'n': *out = !jv_eq(c, a, b); return 0;
    case 'i': return contains(c, at, a, b, out);
    case 'x':
        if (contains(c, at, a, b, out)) return -1;
        *out = !*out;
        return 0;
    }
    if (jv_cmp(c, at, a, b, &r)) return -1;
    if (r == 2) *out = false;
    else if (op == '<') *out = r < 0;
    else if (op == 'l') *out = r <= 0;
    else if (op == '>') *out = r > 0;
    else *out = r >= 0;
    return 0;
}

// --- calls -------------------------------------------------------------------------------------
static int ex_body(jctx_t *c, jnode_t *const *body, int n, jbuf_t *out);

static int call_macro(jctx_t *c, const jnode_t *at, jfunc_t *f, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
                      int nkw, jv_t *out) {
    const jnode_t *m = f->macro;
    if (c->depth >= c->lim.max_depth)
        return jfatal(c, at, "macro calls nested deeper than %d (limit)", c->lim.max_depth);
    if (!f->closure->scope)
        return jerr(c, at, "macro '%s' is called after the block that defined it ended (not supported)", m->name);
    if (nargs > m->np && !(m->flags & JN_VARARGS))
        return jerr(c, at, "macro '%s' takes not more than %d argument(s)", m->name, m->np);
    for (int k = 0; k < nkw; k++) {
        int p = -1;
        for (int i = 0; i < m->np; i++)
            if (!strcmp(m->params[i], kwn[k])) p = i;
        if (p < 0 && !(m->flags & JN_KWARGS))
            return jerr(c, at, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
        if (p >= 0 && p < nargs) return jerr(c, at, "macro '%s' got multiple values for argument '%s'", m->name, kwn[k]);
    }
    jscope_t *saved = c->scope;
    jscope_t *s = scope_push(c, f->closure->scope);
    c->scope = s;
    c->depth++;
    int rc = 0;
    for (int i = 0; i < m->np && !rc; i++) {
        jv_t v = {.t = JV_MISSING};
        if (i < nargs) v = jv_ref(args[i]);
        for (int k = 0; k < nkw; k++)
            if (!strcmp(m->params[i], kwn[k])) v = jv_ref(kwv[k]);
        if (v.t == JV_MISSING) {
            if (m->defaults[i]) rc = jeval(c, m->defaults[i], &v);
            else v = jv_undef_hint(c, "parameter '%s' of macro '%s' was not given", m->params[i], m->name);
        }
        if (!rc) scope_set(c, s, m->params[i], v);
    }
    if (!rc && (m->flags & JN_VARARGS)) {
        jlist_t *va = jlist_new(c, NULL, JL_TUPLE, 0);
        for (int i = m->np; i < nargs; i++) jlist_push(c, va, jv_ref(args[i]));
        scope_set(c, s, "varargs", jv_list(va));
    }
    if (!rc && (m->flags & JN_KWARGS)) {
        jdict_t *kd = jdict_new(c, NULL, false);
        for (int k = 0; k < nkw; k++) {
            bool param = false;
            for (int i = 0; i < m->np; i++)
                if (!strcmp(m->params[i], kwn[k])) param = true;
            if (!param) {
                jstr_t *key = jstr_new(c, NULL, kwn[k], strlen(kwn[k]));
                jdict_set(c, kd, key, jv_ref(kwv[k]));
                jobj_release(c, &key->h);
            }
        }
        scope_set(c, s, "kwargs", jv_dict(kd));
    }
    jbuf_t b;
    jbuf_init(&b);
    if (!rc) rc = ex_body(c, m->body, m->nbody, &b);
    c->depth--;
    c->scope = saved;
    scope_pop(c, s);
    return jbuf_finish(c, &b, rc, 0, out);
}

int jcall(jctx_t *c, const jnode_t *at, jv_t fn, jv_t *args, int nargs, const char **kwn, jv_t *kwv, int nkw,
          jv_t *out) {
    if (fn.t == JV_UNDEF) return undefined_error(c, at, fn);
    if (fn.t != JV_FUNC) return jerr(c, at, "'%s' object is not callable", jv_type_name(fn));
    jfunc_t *f = fn.u.fn;
    switch (f->kind) {
    case JF_MACRO: return call_macro(c, at, f, args, nargs, kwn, kwv, nkw, out);
    case JF_GLOBAL: return jb_call_global(c, at, f->id, args, nargs, kwn, kwv, nkw, out);
    case JF_METHOD: return jb_call_method(c, at, f, args, nargs, kwn, kwv, nkw, out);
    case JF_CYCLE:
        if (nkw) return jerr(c, at, "loop.cycle takes no keyword arguments");
        if (!nargs) return jerr(c, at, "no items for cycling given");
        *out = jv_ref(args[f->self.u.lp->i % (size_t)nargs]);
        return 0;
    }
    return jerr(c, at, "not callable");
}

// Evaluates a node's positional and keyword arguments into arrays (owned by the caller).
static int eval_args(jctx_t *c, const jnode_t *n, jv_t *args, jv_t *kwv) {
    for (int i = 0; i < n->nargs; i++) args[i] = JV_UNDEFINED;
    for (int i = 0; i < n->nkw; i++) kwv[i] = JV_UNDEFINED;
    for (int i = 0; i < n->nargs; i++)
        if (jeval(c, n->args[i], &args[i])) return -1;
    for (int i = 0; i < n->nkw; i++)
        if (jeval(c, n->kwargs[i], &kwv[i])) return -1;
    return 0;
}

static void free_args(jctx_t *c, const jnode_t *n, jv_t *args, jv_t *kwv) {
    for (int i = 0; i < n->nargs; i++) jv_unref(c, args[i]);
    for (int i = 0; i < n->nkw; i++) jv_unref(c, kwv[i]);
}

// --- expressions -------------------------------------------------------------------------------
static int eval_cmp(jctx_t *c, const jnode_t *n, jv_t *out) {
    jv_t left;
    if (jeval(c, n->a, &left)) return -1;
    bool r = true;
    for (int i = 0; i < n->nargs && r; i++) {
        jv_t right;
        if (jeval(c, n->args[i], &right)) {
            jv_unref(c, left);
            return -1;
        }
        int rc = compare(c, n, n->ops[i], left, right, &r);
        jv_unref(c, left);
        left = right;
        if (rc) {
            jv_unref(c, left);
            return -1;
        }
    }
    jv_unref(c, left);
    *out = jv_bool(r);
    return 0;
}

// Calls, filters and tests, apart from jeval so that its frame (on every level of recursion)
// stays small.
static __attribute__((noinline)) int eval_call(jctx_t *c, const jnode_t *n, jv_t *out) {
    jv_t a, args[32], kwv[32];
    if (jeval(c, n->a, &a)) return -1;
    int rc = eval_args(c, n, args, kwv);
    if (!rc) {
        if (n->k == E_CALL) {
            rc = jcall(c, n, a, args, n->nargs, n->kwnames, kwv, n->nkw, out);
        } else if (n->k == E_FILTER) {
            rc = jb_filter(c, n, n->id, a, args, n->nargs, n->kwnames, kwv, n->nkw, out);
        } else {
            bool r = false;
            rc = jb_test(c, n, n->id, a, args, n->nargs, n->kwnames, kwv, n->nkw, &r);
            *out = jv_bool(r);
        }
    }
    free_args(c, n, args, kwv);
    jv_unref(c, a);
    return rc;
}

int jeval(jctx_t *c, const jnode_t *n, jv_t *out) {
    if (jstep(c, n)) return -1;
    jv_t a, b;
    int rc;
    switch (n->k) {
    case E_CONST: *out = jv_ref(n->val); return 0;
    case E_HOLE: *out = jv_ref(c->hole); return 0;
    case E_NAME: {
        const jv_t *v = lookup(c, n->name);
        if (v) {
            *out = jv_ref(*v);
            return 0;
        }
        int g = jb_global_id(n->name);
        if (g >= 0) {
            jfunc_t *f = jobj_new(c, NULL, sizeof(jfunc_t), JV_FUNC);
            f->kind = JF_GLOBAL;
            f->id = g;
            f->name = n->name;
            out->t = JV_FUNC;
            out->fl = 0;
            out->u.fn = f;
            return c->failed ? -1 : 0;
        }
        *out = jv_undef_hint(c, "'%s' is undefined", n->name);
        return c->failed ? -1 : 0;
    }
    case E_ATTR:
        if (jeval(c, n->a, &a)) return -1;
        rc = jgetattr(c, n, a, n->name, strlen(n->name), out);
        jv_unref(c, a);
        return rc;
    case E_ITEM:
        if (jeval(c, n->a, &a)) return -1;
        if (jeval(c, n->b, &b)) {
            jv_unref(c, a);
            return -1;
        }
        rc = jgetitem(c, n, a, b, out);
        jv_unref(c, a);
        jv_unref(c, b);
        return rc;
    case E_SLICE: {
        jv_t se[3] = {JV_NONEV, JV_NONEV, JV_NONEV};
        const jnode_t *parts[3] = {n->b, n->c, n->d};
        if (jeval(c, n->a, &a)) return -1;
        rc = 0;
        for (int k = 0; k < 3 && !rc; k++)
            if (parts[k]) rc = jeval(c, parts[k], &se[k]);
        if (!rc) rc = do_slice(c, n, a, se, out);
        for (int k = 0; k < 3; k++) jv_unref(c, se[k]);
        jv_unref(c, a);
        return rc;
    }
    case E_CALL:
    case E_FILTER:
    case E_TEST: return eval_call(c, n, out);
    case E_NOT:
        if (jeval(c, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(a));
        jv_unref(c, a);
        return 0;
    case E_NEG:
    case E_POS:
        if (jeval(c, n->a, &a)) return -1;
        if (a.t == JV_UNDEF) return undefined_error(c, n, a);
        if (!is_num(a)) {
            rc = jerr(c, n, "bad operand type for unary %c: '%s'", n->k == E_NEG ? '-' : '+', jv_type_name(a));
            jv_unref(c, a);
            return rc;
        }
        if (a.t == JV_FLOAT) *out = jv_float(n->k == E_NEG ? -a.u.f : a.u.f);
        else if (n->k == E_NEG && inum(a) == INT64_MIN) return jerr(c, n, "integer overflow");
        else *out = jv_int(n->k == E_NEG ? -inum(a) : inum(a));
        return 0;
    case E_BIN:
        if (jeval(c, n->a, &a)) return -1;
        if (jeval(c, n->b, &b)) {
            jv_unref(c, a);
            return -1;
        }
        rc = jbinop(c, n, n->op, a, b, out);
        jv_unref(c, a);
        jv_unref(c, b);
        return rc;
    case E_CONCAT: {
        jbuf_t buf;
        jbuf_init(&buf);
        for (int i = 0; i < n->nargs; i++) {
            if (jeval(c, n->args[i], &a)) {
                jbuf_free(c, &buf);
                return -1;
            }
            rc = jv_to_str(c, n, a, &buf);
            jv_unref(c, a);
            if (rc) {
                jbuf_free(c, &buf);
                return -1;
            }
        }
        *out = jbuf_take_str(c, &buf);
        return c->failed ? -1 : 0;
    }
    case E_AND:
    case E_OR:
        if (jeval(c, n->a, &a)) return -1;
        if (jv_truthy(a) == (n->k == E_OR)) {
            *out = a;
            return 0;
        }
        jv_unref(c, a);
        return jeval(c, n->b, out);
    case E_CMP: return eval_cmp(c, n, out);
    case E_COND:
        if (jeval(c, n->a, &a)) return -1;
        {
            bool t = jv_truthy(a);
            jv_unref(c, a);
            if (t) return jeval(c, n->b, out);
            if (n->c) return jeval(c, n->c, out);
            *out = jv_undef_hint(c, "the condition of an inline if was false and it has no else");
            return c->failed ? -1 : 0;
        }
    case E_LIST:
    case E_TUPLE: {
        jlist_t *l = jlist_new(c, NULL, n->k == E_LIST ? JL_LIST : JL_TUPLE, (size_t)n->nargs);
        *out = jv_list(l);
        for (int i = 0; i < n->nargs; i++) {
            if (jeval(c, n->args[i], &a)) return -1;
            if (jlist_push(c, l, a)) return -1;
        }
        return 0;
    }
    case E_DICT: {
        jdict_t *d = jdict_new(c, NULL, false);
        *out = jv_dict(d);
        for (int i = 0; i < n->nargs; i++) {
            if (jeval(c, n->args[i], &a)) return -1;
            if (a.t != JV_STR) {
                rc = jerr(c, n->args[i], "dict keys other than strings are not supported (got '%s')", jv_type_name(a));
                jv_unref(c, a);
                return rc;
            }
            if (jeval(c, n->kwargs[i], &b)) {
                jv_unref(c, a);
                return -1;
            }
            rc = jdict_set(c, d, a.u.s, b);
            jv_unref(c, a);
            if (rc) return -1;
        }
        return 0;
    }
    default: return jerr(c, n, "statement used as an expression");
    }
}

// --- statements --------------------------------------------------------------------------------
// Assigns v (owned) to a target: a name, or a tuple of names (unpacking).
static int assign(jctx_t *c, const jnode_t *target, jv_t v) {
    if (target->k == E_NAME) {
        scope_set(c, c->scope, target->name, v);
        return 0;
    }
    jlist_t *items;
    if (jv_iterate(c, target, v, &items)) {
        jv_unref(c, v);
        return -1;
    }
    jv_unref(c, v);
    int rc = 0;
    if (items->n != (size_t)target->nargs)
        rc = jerr(c, target, "%s values to unpack (expected %d, got %zu)",
                  items->n > (size_t)target->nargs ? "too many" : "not enough", target->nargs, items->n);
    for (int i = 0; !rc && i < target->nargs; i++) scope_set(c, c->scope, target->args[i]->name, jv_ref(items->v[i]));
    jobj_release(c, &items->h);
    return rc;
}

// Renders a body into its own buffer in a new scope (set blocks, filter blocks): the text, or -1.
static int capture(jctx_t *c, jnode_t *const *body, int n, jv_t *out) {
    jscope_t *s = scope_push(c, c->scope), *saved = c->scope;
    c->scope = s;
    jbuf_t b;
    jbuf_init(&b);
    int rc = ex_body(c, body, n, &b);
    c->scope = saved;
    scope_pop(c, s);
    return jbuf_finish(c, &b, rc, 0, out);
}

static int apply_hole(jctx_t *c, const jnode_t *chain, jv_t v, jv_t *out) {
    jv_t saved = c->hole;
    c->hole = v;
    int rc = jeval(c, chain, out);
    c->hole = saved;
    return rc;
}

static int ex_for(jctx_t *c, const jnode_t *n, jbuf_t *out) {
    jv_t seq;
    if (jeval(c, n->b, &seq)) return -1;
    jlist_t *items;
    int rc = jv_iterate(c, n->b, seq, &items);
    jv_unref(c, seq);
    if (rc) return -1;
    jscope_t *s = scope_push(c, c->scope), *saved = c->scope;
    c->scope = s;
    if (n->c) {
        // `for x in xs if cond`: the loop (its length, index, first/last) sees only what passes
        jlist_t *kept = jlist_new(c, NULL, JL_LIST, 0);
        for (size_t i = 0; !rc && i < items->n; i++) {
            jv_t t;
            if ((rc = assign(c, n->a, jv_ref(items->v[i])))) break;
            if ((rc = jeval(c, n->c, &t))) break;
            if (jv_truthy(t)) rc = jlist_push(c, kept, jv_ref(items->v[i]));
            jv_unref(c, t);
        }
        jobj_release(c, &items->h);
        items = kept;
    }
    if (!rc) {
        jloop_t *lp = jobj_new(c, NULL, sizeof(jloop_t), JV_LOOP);
        lp->items = items;
        if (!items->h.immortal) items->h.rc++;
        jv_t lv = {.t = JV_LOOP};
        lv.u.lp = lp;
        for (size_t i = 0; i < items->n; i++) {
            if ((rc = jstep(c, n))) break;
            // Jinja enters the loop's frame on every iteration: what the body set in the last one
            // is gone (names read before they are set again see the enclosing scope)
            scope_clear(c, s);
            lp->i = i;
            scope_set(c, s, "loop", jv_ref(lv));
            if ((rc = assign(c, n->a, jv_ref(items->v[i])))) break;
            rc = ex_body(c, n->body, n->nbody, out);
            if (rc == EX_CONTINUE) rc = 0;
            if (rc) break;
        }
        if (rc == EX_BREAK) rc = 0;
        jv_unref(c, lv);
    }
    bool empty = items->n == 0;
    jobj_release(c, &items->h);
    c->scope = saved;
    scope_pop(c, s);
    if (!rc && empty && n->els) {
        s = scope_push(c, c->scope);
        c->scope = s;
        rc = ex_body(c, n->els, n->nels, out);
        c->scope = saved;
        scope_pop(c, s);
    }
    return rc;
}

static int ex_stmt(jctx_t *c, const jnode_t *n, jbuf_t *out) {
    if (jstep(c, n)) return -1;
    jv_t v, r;
    int rc;
    switch (n->k) {
    case S_TEXT: return jbuf_put(c, out, n->val.u.s->p, n->val.u.s->len);
    case S_OUT:
        if (jeval(c, n->a, &v)) return -1;
        rc = jv_to_str(c, n->a, v, out);
        jv_unref(c, v);
        return rc;
    case S_IF:
        if (jeval(c, n->a, &v)) return -1;
        rc = jv_truthy(v);
        jv_unref(c, v);
        return rc ? ex_body(c, n->body, n->nbody, out) : ex_body(c, n->els, n->nels, out);
    case S_FOR: return ex_for(c, n, out);
    case S_SET:
        if (jeval(c, n->b, &v)) return -1;
        if (n->a->k == E_ATTR) {
            const jv_t *ns = lookup(c, n->a->a->name);
            if (!ns || ns->t != JV_DICT || !ns->u.d->ns) {
                jv_unref(c, v);
                return jerr(c, n, "cannot assign attribute on non-namespace object '%s'", n->a->a->name);
            }
            jstr_t *k = jstr_new(c, NULL, n->a->name, strlen(n->a->name));
            rc = jdict_set(c, ns->u.d, k, v);
            jobj_release(c, &k->h);
            return rc;
        }
        return assign(c, n->a, v);
    case S_SETBLOCK:
        if (capture(c, n->body, n->nbody, &v)) return -1;
        if (n->c) {
            rc = apply_hole(c, n->c, v, &r);
            jv_unref(c, v);
            if (rc) return -1;
            v = r;
        }
        scope_set(c, c->scope, n->a->name, v);
        return 0;
    case S_MACRO: {
        jfunc_t *f = jobj_new(c, NULL, sizeof(jfunc_t), JV_FUNC);
        f->kind = JF_MACRO;
        f->name = n->name;
        f->macro = n;
        f->closure = scope_handle(c, c->scope);
        jv_t fv = {.t = JV_FUNC};
        fv.u.fn = f;
        scope_set(c, c->scope, n->name, fv);
        return c->failed ? -1 : 0;
    }
    case S_BREAK: return EX_BREAK;
    case S_CONTINUE: return EX_CONTINUE;
    case S_WITH: {
        jv_t vals[64];
        if (n->np > 64) return jerr(c, n, "more than 64 assignments in a with statement");
        for (int i = 0; i < n->np; i++)
            if (jeval(c, n->defaults[i], &vals[i])) {
                for (int k = 0; k < i; k++) jv_unref(c, vals[k]);
                return -1;
            }
        jscope_t *s = scope_push(c, c->scope), *saved = c->scope;
        for (int i = 0; i < n->np; i++) scope_set(c, s, n->params[i], vals[i]);
        c->scope = s;
        rc = ex_body(c, n->body, n->nbody, out);
        c->scope = saved;
        scope_pop(c, s);
        return rc;
    }
    case S_FILTER:
        if (capture(c, n->body, n->nbody, &v)) return -1;
        rc = apply_hole(c, n->c, v, &r);
        jv_unref(c, v);
        if (rc) return -1;
        rc = jv_to_str(c, n, r, out);
        jv_unref(c, r);
        return rc;
    case S_BLOCK: {
        jscope_t *s = scope_push(c, c->scope), *saved = c->scope;
        c->scope = s;
        rc = ex_body(c, n->body, n->nbody, out);
        c->scope = saved;
        scope_pop(c, s);
        return rc;
    }
    default: return jerr(c, n, "expression used as a statement");
    }
}

static int ex_body(jctx_t *c, jnode_t *const *body, int n, jbuf_t *out) {
    for (int i = 0; i < n; i++) {
        int rc = ex_stmt(c, body[i], out);
        if (rc) return rc;
    }
    return 0;
}

// --- render ------------------------------------------------------------------------------------
// Frees what is still alive at the end of a render (cycles, values of an aborted evaluation)
// without following references: every object is on the live list exactly once.
static void sweep(jctx_t *c) {
    jobj_t *o = c->live.next;
    while (o != &c->live) {
        jobj_t *nx = o->next;
        if (o->type == JV_LIST) free(((jlist_t *)o)->v);
        else if (o->type == JV_DICT) {
            free(((jdict_t *)o)->k);
            free(((jdict_t *)o)->v);
            free(((jdict_t *)o)->ix);
        }
        free(o);
        o = nx;
    }
    c->live.next = c->live.prev = &c->live;
}

char *jinja_render(const jinja_tpl_t *t, const jinja_vars_t *vars, const jinja_limits_t *lim, size_t *len_out,
                   char *err) {
    jctx_t c;
    memset(&c, 0, sizeof c);
    if (lim) c.lim = *lim;
    else jinja_limits_default(&c.lim);
    c.vars = vars;
    c.err = err;
    c.live.next = c.live.prev = &c.live;
    c.stack_base = (uintptr_t)__builtin_frame_address(0);
    c.loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    c.cloc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    jscope_t *top = scope_push(&c, NULL);
    c.scope = top;
    jbuf_t out;
    jbuf_init(&out);
    int rc = ex_body(&c, t->body, t->nbody, &out);
    c.scope = NULL;
    scope_pop(&c, top);
    char *text = NULL;
    if (rc == 0 && !c.failed) {
        text = xmalloc(out.len + 1);
        if (out.len) memcpy(text, out.p, out.len);
        text[out.len] = 0;
        if (len_out) *len_out = out.len;
    } else if (!c.failed) {
        err_set(err, "break or continue outside a loop");
    }
    jbuf_free(&c, &out);
    sweep(&c);
    if (c.loc) freelocale(c.loc);
    if (c.cloc) freelocale(c.cloc);
    return text;
}

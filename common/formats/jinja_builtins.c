// jinja_builtins.c - the filters, tests, methods (str, dict, list) and globals of the Jinja
// interpreter, each with the semantics of Jinja 3.1 / Python 3 as Hugging Face's sandboxed
// chat-template environment has them (tojson = json.dumps(ensure_ascii=False), raise_exception,
// strftime_now, immutable lists and dicts).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/formats/jinja_int.h"

// range() larger than this is refused, as Jinja's sandbox does (MAX_RANGE).
#define JINJA_MAX_RANGE 100000

static bool given(jv_t v) { return v.t != JV_MISSING; }
static bool is_int(jv_t v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t ival(jv_t v) { return v.t == JV_INT ? v.u.i : (int64_t)v.u.b; }
static jv_t mkfunc_val(jfunc_t *f) {
    jv_t v = {.t = JV_FUNC};
    v.u.fn = f;
    return v;
}

int jb_bind(jctx_t *c, const jnode_t *at, const char *fname, const char *const *params, int np, jv_t *args,
            int nargs, const char **kwn, jv_t *kwv, int nkw, jv_t *out) {
    for (int i = 0; i < np; i++) out[i] = (jv_t){.t = JV_MISSING};
    if (nargs > np) return jerr(c, at, "%s() takes at most %d argument(s) (%d given)", fname, np, nargs);
    for (int i = 0; i < nargs; i++) out[i] = args[i];
    for (int k = 0; k < nkw; k++) {
        int p = -1;
        for (int i = 0; i < np; i++)
            if (!strcmp(params[i], kwn[k])) p = i;
        if (p < 0) return jerr(c, at, "%s() got an unexpected keyword argument '%s'", fname, kwn[k]);
        if (given(out[p])) return jerr(c, at, "%s() got multiple values for argument '%s'", fname, kwn[k]);
        out[p] = kwv[k];
    }
    return 0;
}

#define BIND(fname, ...)                                                                      \
    static const char *const params_[] = {__VA_ARGS__};                                       \
    jv_t a[sizeof params_ / sizeof *params_];                                                 \
    if (jb_bind(c, at, fname, params_, (int)(sizeof params_ / sizeof *params_), args, nargs, kwn, kwv, nkw, a)) \
        return -1

#define NOARGS(fname)                                                                         \
    if (nargs || nkw) return jerr(c, at, "%s() takes no arguments", fname)

static int want_str(jctx_t *c, const jnode_t *at, jv_t v, const char *what) {
    if (v.t == JV_STR) return 0;
    return jerr(c, at, "%s must be a string, not '%s'", what, jv_type_name(v));
}

// str(v), keeping a string (and its Markup flag) as it is
static int text_of(jctx_t *c, const jnode_t *at, jv_t v, jv_t *out) { return jv_stringify(c, at, v, out); }

static jv_t take(jctx_t *c, jbuf_t *b, uint8_t fl) {
    jv_t v = jbuf_take_str(c, b);
    v.fl = fl;
    return v;
}

int jb_html_escape(jctx_t *c, const char *s, size_t n, jbuf_t *b) {
    for (size_t i = 0; i < n; i++) {
        const char *r = NULL;
        switch (s[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        }
        if (r ? jbuf_put(c, b, r, strlen(r)) : jbuf_putc(c, b, s[i])) return -1;
    }
    return 0;
}

// MarkupSafe: a string argument of a Markup method is escaped first (unless it is Markup).
static int markup_arg(jctx_t *c, jv_t self, jv_t arg, jv_t *out) {
    if (!(self.fl & JV_MARKUP) || arg.t != JV_STR || (arg.fl & JV_MARKUP)) {
        *out = jv_ref(arg);
        return 0;
    }
    jbuf_t b;
    jbuf_init(&b);
    return jbuf_finish(c, &b, jb_html_escape(c, arg.u.s->p, arg.u.s->len, &b), JV_MARKUP, out);
}

// --- string helpers ----------------------------------------------------------------------------
static bool cased(const jctx_t *c, uint32_t cp) { return ju_upper(c, cp) != cp || ju_lower(c, cp) != cp; }

enum { CM_UPPER, CM_LOWER, CM_CAPITALIZE, CM_TITLE_PY, CM_TITLE_JINJA, CM_SWAP };

static bool jinja_title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp);
}

static int map_case(jctx_t *c, const jstr_t *s, int mode, jbuf_t *b) {
    uint32_t prev = 0;
    c->steps += (long)(s->len >> 2);
    bool first = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = ju_decode(s->p, s->len, &i), r = cp;
        switch (mode) {
        case CM_UPPER: r = ju_upper(c, cp); break;
        case CM_LOWER: r = ju_lower(c, cp); break;
        case CM_CAPITALIZE: r = first ? ju_upper(c, cp) : ju_lower(c, cp); break;
        case CM_TITLE_PY: r = (first || !cased(c, prev)) ? ju_upper(c, cp) : ju_lower(c, cp); break;
        case CM_TITLE_JINJA: r = (first || jinja_title_sep(prev)) ? ju_upper(c, cp) : ju_lower(c, cp); break;
        }
        char enc[4];
        if (jbuf_put(c, b, enc, (size_t)ju_encode(r, enc))) return -1;
        prev = cp;
        first = false;
    }
    return 0;
}

static int case_value(jctx_t *c, const jnode_t *at, jv_t self, int mode, bool keep_markup, jv_t *out) {
    jv_t t;
    if (text_of(c, at, self, &t)) return -1;
    jbuf_t b;
    jbuf_init(&b);
    int rc = map_case(c, t.u.s, mode, &b);
    uint8_t fl = keep_markup ? t.fl : 0;
    jv_unref(c, t);
    return jbuf_finish(c, &b, rc, fl, out);
}

static bool in_chars(const jstr_t *chars, uint32_t cp) {
    if (!chars) return ju_isspace(cp);
    for (size_t i = 0; i < chars->len;)
        if (ju_decode(chars->p, chars->len, &i) == cp) return true;
    return false;
}

// Python str.strip/lstrip/rstrip
static int strip(jctx_t *c, jv_t s, const jstr_t *chars, bool left, bool right, jv_t *out) {
    const char *p = s.u.s->p;
    size_t len = s.u.s->len, a = 0, e = len;
    // scanning is work (a loop of scans ends at max_steps): per character, times the set's size
    c->steps += (long)((len >> 2) * (chars && chars->nch > 1 ? chars->nch : 1));
    if (left)
        while (a < len) {
            size_t j = a;
            if (!in_chars(chars, ju_decode(p, len, &j))) break;
            a = j;
        }
    if (right)
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t j = st;
            if (!in_chars(chars, ju_decode(p, len, &j))) break;
            e = st;
        }
    *out = jv_str(c, p + a, e - a);
    out->fl = s.fl;
    return c->failed ? -1 : 0;
}

// Python str.replace
static int replace(jctx_t *c, const jstr_t *s, const jstr_t *old, const jstr_t *new, int64_t count, jbuf_t *b) {
    size_t i = 0;
    int64_t done = 0;
    if (old->len == 0) {
        for (;;) {
            if ((count < 0 || done < count)) {
                if (jbuf_put(c, b, new->p, new->len)) return -1;
                done++;
            }
            if (i >= s->len) break;
            size_t st = i;
            ju_decode(s->p, s->len, &i);
            if (jbuf_put(c, b, s->p + st, i - st)) return -1;
        }
        return 0;
    }
    while (i < s->len) {
        const char *f = (count < 0 || done < count) ? memmem(s->p + i, s->len - i, old->p, old->len) : NULL;
        if (!f) break;
        size_t at = (size_t)(f - s->p);
        if (jbuf_put(c, b, s->p + i, at - i) || jbuf_put(c, b, new->p, new->len)) return -1;
        i = at + old->len;
        done++;
    }
    return jbuf_put(c, b, s->p + i, s->len - i);
}

// Python str.split / rsplit (sep NULL: runs of whitespace)
static int split(jctx_t *c, const jnode_t *at, jv_t s, const jstr_t *sep, int64_t maxsplit, bool from_right,
                 jv_t *out) {
    const char *p = s.u.s->p;
    size_t len = s.u.s->len;
    jlist_t *l = jlist_new(c, NULL, JL_LIST, 0);
    *out = jv_list(l);
    if (sep && sep->len == 0) return jerr(c, at, "empty separator");
    c->steps += (long)(len >> (sep ? 6 : 2));
    // collect the pieces as [start, end) byte ranges, left to right
    size_t cap = 16, n = 0;
    size_t(*r)[2] = xmalloc(cap * sizeof *r);
#define ADD(x, y)                                    \
    do {                                             \
        if (n == cap) r = xrealloc(r, (cap *= 2) * sizeof *r); \
        r[n][0] = (x);                               \
        r[n++][1] = (y);                             \
    } while (0)
    if (!from_right) {
        if (sep) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *f = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, len - i, sep->p, sep->len) : NULL;
                if (!f) break;
                ADD(i, (size_t)(f - p));
                i = (size_t)(f - p) + sep->len;
                done++;
            }
            ADD(i, len);
        } else {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                while (i < len) { // skip whitespace
                    size_t j = i;
                    if (!ju_isspace(ju_decode(p, len, &j))) break;
                    i = j;
                }
                if (i >= len) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    ADD(i, len);
                    break;
                }
                size_t st = i;
                while (i < len) {
                    size_t j = i;
                    if (ju_isspace(ju_decode(p, len, &j))) break;
                    i = j;
                }
                ADD(st, i);
                done++;
            }
        }
    } else {
        // from the right: pieces found in reverse, then reversed
        if (sep) {
            size_t e = len;
            int64_t done = 0;
            for (;;) {
                const char *f = NULL;
                if (maxsplit < 0 || done < maxsplit)
                    for (size_t k = e >= sep->len ? e - sep->len + 1 : 0; k-- > 0;)
                        if (!memcmp(p + k, sep->p, sep->len)) {
                            f = p + k;
                            break;
                        }
                if (!f) break;
                ADD((size_t)(f - p) + sep->len, e);
                e = (size_t)(f - p);
                done++;
            }
            ADD(0, e);
        } else {
            size_t e = len;
            int64_t done = 0;
            for (;;) {
                while (e > 0) { // skip whitespace backwards
                    size_t st = e - 1;
                    while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
                    size_t j = st;
                    if (!ju_isspace(ju_decode(p, len, &j))) break;
                    e = st;
                }
                if (e == 0) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    ADD(0, e);
                    break;
                }
                size_t st = e;
                while (st > 0) {
                    size_t k = st - 1;
                    while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
                    size_t j = k;
                    if (ju_isspace(ju_decode(p, len, &j))) break;
                    st = k;
                }
                ADD(st, e);
                e = st;
                done++;
            }
        }
        for (size_t i = 0; i < n / 2; i++) {
            size_t t0 = r[i][0], t1 = r[i][1];
            r[i][0] = r[n - 1 - i][0];
            r[i][1] = r[n - 1 - i][1];
            r[n - 1 - i][0] = t0;
            r[n - 1 - i][1] = t1;
        }
    }
#undef ADD
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        jv_t piece = jv_str(c, p + r[i][0], r[i][1] - r[i][0]);
        piece.fl = s.fl;
        rc = jlist_push(c, l, piece);
    }
    free(r);
    return rc || c->failed ? -1 : 0;
}

static bool line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static int splitlines(jctx_t *c, jv_t s, jlist_t **out) {
    const char *p = s.u.s->p;
    size_t len = s.u.s->len, i = 0, st = 0;
    jlist_t *l = jlist_new(c, NULL, JL_LIST, 0);
    *out = l;
    c->steps += (long)(len >> 2);
    while (i < len) {
        size_t b = i;
        uint32_t cp = ju_decode(p, len, &i);
        if (!line_break(cp)) continue;
        jv_t piece = jv_str(c, p + st, b - st);
        piece.fl = s.fl;
        if (jlist_push(c, l, piece)) return -1;
        if (cp == '\r' && i < len && p[i] == '\n') i++;
        st = i;
    }
    if (st < len) {
        jv_t piece = jv_str(c, p + st, len - st);
        piece.fl = s.fl;
        if (jlist_push(c, l, piece)) return -1;
    }
    return c->failed ? -1 : 0;
}

// --- attribute getters (Jinja's make_attrgetter) -------------------------------------------------
// "a.b.0" -> item["a"]["b"][0]; with dflt given, an undefined result becomes dflt; lower: strings
// lowered (case-insensitive sorting and comparing).
static int attr_get(jctx_t *c, const jnode_t *at, jv_t item, jv_t attribute, jv_t dflt, bool lower, jv_t *out) {
    jv_t curv = jv_ref(item);
    if (given(attribute) && attribute.t != JV_NONE) {
        if (is_int(attribute)) {
            jv_t nx;
            if (jgetitem(c, at, curv, attribute, &nx)) return -1;
            jv_unref(c, curv);
            curv = nx;
        } else if (attribute.t == JV_STR) {
            const char *s = attribute.u.s->p;
            size_t len = attribute.u.s->len, i = 0;
            while (i <= len) {
                size_t e = i;
                while (e < len && s[e] != '.') e++;
                bool digits = e > i;
                for (size_t k = i; k < e; k++)
                    if (s[k] < '0' || s[k] > '9') digits = false;
                jv_t key = digits ? jv_int(strtoll(s + i, NULL, 10)) : jv_str(c, s + i, e - i);
                jv_t nx;
                int rc = jgetitem(c, at, curv, key, &nx);
                jv_unref(c, key);
                if (rc) return -1;
                jv_unref(c, curv);
                curv = nx;
                i = e + 1;
            }
        } else {
            return jerr(c, at, "an attribute name must be a string or an integer");
        }
    }
    if (given(dflt) && curv.t == JV_UNDEF) {
        jv_unref(c, curv);
        curv = jv_ref(dflt);
    }
    if (lower && curv.t == JV_STR) {
        jbuf_t b;
        jbuf_init(&b);
        if (map_case(c, curv.u.s, CM_LOWER, &b)) {
            jbuf_free(c, &b);
            return -1;
        }
        jv_unref(c, curv);
        curv = jbuf_take_str(c, &b);
    }
    *out = curv;
    return c->failed ? -1 : 0;
}

// --- sorting ------------------------------------------------------------------------------------
typedef struct {
    jv_t key, item;
} sitem_t;

// Stable merge sort on keys; reverse keeps equal items in their order, as Python's sort does.
static int sort_items(jctx_t *c, const jnode_t *at, sitem_t *v, size_t n, bool reverse) {
    if (n < 2) return 0;
    sitem_t *tmp = xmalloc(n * sizeof *tmp);
    int rc = 0;
    for (size_t w = 1; w < n && !rc; w *= 2) {
        for (size_t lo = 0; lo < n && !rc; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r;
                if ((rc = jstep(c, at))) break;
                // take from the right only when it is strictly before the left
                if ((rc = jv_cmp(c, at, v[j].key, v[i].key, &r))) break;
                bool right_first = reverse ? (r == 1) : (r == -1);
                tmp[k++] = right_first ? v[j++] : v[i++];
            }
            if (rc) break;
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
            memcpy(v + lo, tmp + lo, (hi - lo) * sizeof *v);
        }
    }
    free(tmp);
    return rc;
}

// --- filters -----------------------------------------------------------------------------------
typedef int (*filter_fn)(jctx_t *c, const jnode_t *at, jv_t self, jv_t *args, int nargs, const char **kwn,
                         jv_t *kwv, int nkw, jv_t *out);

#define FILTER(name)                                                                                          \
    static int f_##name(jctx_t *c, const jnode_t *at, jv_t self, jv_t *args, int nargs, const char **kwn, \
                        jv_t *kwv, int nkw, jv_t *out)

FILTER(abs) {
    NOARGS("abs");
    if (self.t == JV_FLOAT) *out = jv_float(fabs(self.u.f));
    else if (is_int(self)) {
        if (ival(self) == INT64_MIN) return jerr(c, at, "integer overflow");
        *out = jv_int(llabs(ival(self)));
    } else return jerr(c, at, "bad operand type for abs(): '%s'", jv_type_name(self));
    return 0;
}

FILTER(attr) {
    BIND("attr", "name");
    if (!given(a[0])) return jerr(c, at, "attr() needs the attribute name");
    jv_t name;
    if (text_of(c, at, a[0], &name)) return -1;
    int rc;
    if (self.t == JV_DICT && !self.u.d->ns) {
        int m = jb_method(c, at, self, name.u.s->p, name.u.s->len, out);
        rc = m < 0 ? -1 : 0;
        if (m == 0) *out = jv_undef_hint(c, "'dict object' has no attribute '%s'", name.u.s->p);
    } else {
        rc = jgetattr(c, at, self, name.u.s->p, name.u.s->len, out);
    }
    jv_unref(c, name);
    return rc;
}

FILTER(capitalize) {
    NOARGS("capitalize");
    return case_value(c, at, self, CM_CAPITALIZE, true, out);
}

FILTER(length) {
    NOARGS("length");
    bool ok;
    size_t n = jv_len_or(self, &ok);
    if (!ok) return jerr(c, at, "object of type '%s' has no len()", jv_type_name(self));
    *out = jv_int((int64_t)n);
    return 0;
}

FILTER(default) {
    BIND("default", "default_value", "boolean");
    bool use = self.t == JV_UNDEF || (given(a[1]) && jv_truthy(a[1]) && !jv_truthy(self));
    if (!use) *out = jv_ref(self);
    else if (given(a[0])) *out = jv_ref(a[0]);
    else *out = jv_str(c, "", 0);
    return c->failed ? -1 : 0;
}

FILTER(dictsort) {
    BIND("dictsort", "case_sensitive", "by", "reverse");
    if (self.t != JV_DICT || self.u.d->ns) return jerr(c, at, "dictsort expects a dict, not '%s'", jv_type_name(self));
    bool cs = given(a[0]) && jv_truthy(a[0]);
    int pos = 0;
    if (given(a[1])) {
        if (a[1].t == JV_STR && !strcmp(a[1].u.s->p, "value")) pos = 1;
        else if (!(a[1].t == JV_STR && !strcmp(a[1].u.s->p, "key")))
            return jerr(c, at, "You can only sort by either \"key\" or \"value\"");
    }
    jdict_t *d = self.u.d;
    sitem_t *v = xcalloc(d->n + 1, sizeof *v);
    int rc = 0;
    for (size_t i = 0; i < d->n && !rc; i++) {
        jlist_t *t = jlist_new(c, NULL, JL_TUPLE, 2);
        jv_t k = {.t = JV_STR};
        k.u.s = d->k[i];
        jlist_push(c, t, jv_ref(k));
        jlist_push(c, t, jv_ref(d->v[i]));
        v[i].item = jv_list(t);
        rc = attr_get(c, at, t->v[pos], (jv_t){.t = JV_MISSING}, (jv_t){.t = JV_MISSING}, !cs, &v[i].key);
    }
    if (!rc) rc = sort_items(c, at, v, d->n, given(a[2]) && jv_truthy(a[2]));
    jlist_t *l = jlist_new(c, NULL, JL_LIST, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (!rc) l->v[l->n++] = jv_ref(v[i].item);
        jv_unref(c, v[i].item);
        jv_unref(c, v[i].key);
    }
    free(v);
    *out = jv_list(l);
    return rc;
}

// self's text HTML-escaped, as markup (escape and forceescape).
static int escaped_markup(jctx_t *c, const jnode_t *at, jv_t self, jv_t *out) {
    jv_t t;
    if (text_of(c, at, self, &t)) return -1;
    jbuf_t b;
    jbuf_init(&b);
    int rc = jb_html_escape(c, t.u.s->p, t.u.s->len, &b);
    jv_unref(c, t);
    return jbuf_finish(c, &b, rc, JV_MARKUP, out);
}

FILTER(escape) {
    NOARGS("escape");
    if (self.t == JV_STR && (self.fl & JV_MARKUP)) {
        *out = jv_ref(self);
        return 0;
    }
    return escaped_markup(c, at, self, out);
}

FILTER(forceescape) {
    NOARGS("forceescape");
    return escaped_markup(c, at, self, out);
}

FILTER(first) {
    NOARGS("first");
    if (self.t == JV_LIST && self.u.l->kind == JL_GEN) {
        jlist_t *g = self.u.l;
        if (g->pos < g->n) {
            jv_t x = g->v[g->pos++];
            if (x.t == JV_ERROR) return jraise(c, x);
            *out = jv_ref(x);
            return 0;
        }
    } else {
        jlist_t *items;
        if (jv_iterate(c, at, self, &items)) return -1;
        bool any = items->n > 0;
        if (any) *out = jv_ref(items->v[0]);
        jobj_release(c, &items->h);
        if (any) return 0;
    }
    *out = jv_undef_hint(c, "No first item, sequence was empty.");
    return c->failed ? -1 : 0;
}

FILTER(last) {
    NOARGS("last");
    if (self.t == JV_LIST && self.u.l->kind == JL_GEN) return jerr(c, at, "'generator' object is not reversible");
    if (self.t == JV_UNDEF || self.t == JV_STR || self.t == JV_LIST || (self.t == JV_DICT && !self.u.d->ns)) {
        jlist_t *items;
        if (jv_iterate(c, at, self, &items)) return -1;
        bool any = items->n > 0;
        if (any) *out = jv_ref(items->v[items->n - 1]);
        jobj_release(c, &items->h);
        if (any) return 0;
        *out = jv_undef_hint(c, "No last item, sequence was empty.");
        return c->failed ? -1 : 0;
    }
    return jerr(c, at, "'%s' object is not reversible", jv_type_name(self));
}

// Python float() of a string: surrounding whitespace, underscores between digits, inf/nan
static bool parse_float(const char *s, size_t len, double *out) {
    char buf[128];
    size_t a = 0, e = len, n = 0;
    while (a < e && (s[a] == ' ' || (s[a] >= '\t' && s[a] <= '\r'))) a++;
    while (e > a && (s[e - 1] == ' ' || (s[e - 1] >= '\t' && s[e - 1] <= '\r'))) e--;
    if (e - a == 0 || e - a >= sizeof buf) return false;
    for (size_t i = a; i < e; i++) {
        if (s[i] == '_') {
            if (i == a || i + 1 == e || s[i - 1] < '0' || s[i - 1] > '9' || s[i + 1] < '0' || s[i + 1] > '9') return false;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", s[i])) return false;
        buf[n++] = s[i];
    }
    buf[n] = 0;
    char *end;
    const char *p = buf + (buf[0] == '+' || buf[0] == '-');
    bool word = strncasecmp(p, "inf", 3) == 0 || strncasecmp(p, "nan", 3) == 0;
    if (word && strcasecmp(p, "inf") && strcasecmp(p, "infinity") && strcasecmp(p, "nan")) return false;
    if (!word && (strchr(buf, 'x') || strchr(buf, 'X'))) return false;
    *out = strtod(buf, &end);
    return *end == 0;
}

// Python int(str, base)
static bool parse_int(const char *s, size_t len, int base, int64_t *out) {
    size_t a = 0, e = len;
    while (a < e && (s[a] == ' ' || (s[a] >= '\t' && s[a] <= '\r'))) a++;
    while (e > a && (s[e - 1] == ' ' || (s[e - 1] >= '\t' && s[e - 1] <= '\r'))) e--;
    bool neg = false;
    if (a < e && (s[a] == '+' || s[a] == '-')) neg = s[a++] == '-';
    if (a + 1 < e && s[a] == '0' && ((base == 16 && (s[a + 1] | 32) == 'x') || (base == 8 && (s[a + 1] | 32) == 'o') ||
                                     (base == 2 && (s[a + 1] | 32) == 'b'))) {
        a += 2;
        if (a < e && s[a] == '_') a++;
    }
    if (a >= e) return false;
    uint64_t v = 0;
    bool prev_digit = false;
    for (size_t i = a; i < e; i++) {
        if (s[i] == '_') {
            if (!prev_digit || i + 1 == e) return false;
            prev_digit = false;
            continue;
        }
        int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0' : (s[i] | 32) >= 'a' && (s[i] | 32) <= 'z' ? (s[i] | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_digit = true;
    }
    if (v > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

FILTER(float) {
    BIND("float", "default");
    jv_t dflt = given(a[0]) ? a[0] : jv_float(0.0);
    double d;
    if (self.t == JV_FLOAT) *out = self;
    else if (is_int(self)) *out = jv_float((double)ival(self));
    else if (self.t == JV_STR && parse_float(self.u.s->p, self.u.s->len, &d)) *out = jv_float(d);
    else *out = jv_ref(dflt);
    return 0;
}

FILTER(int) {
    BIND("int", "default", "base");
    jv_t dflt = given(a[0]) ? a[0] : jv_int(0);
    int64_t base = 10;
    if (given(a[1])) {
        if (!is_int(a[1])) return jerr(c, at, "int() base must be an integer");
        base = ival(a[1]);
    }
    int64_t v;
    double d;
    if (is_int(self)) {
        *out = jv_int(ival(self));
        return 0;
    }
    if (self.t == JV_FLOAT) {
        if (!isfinite(self.u.f)) return jerr(c, at, "cannot convert float %s to integer", isnan(self.u.f) ? "NaN" : "infinity");
        if (fabs(self.u.f) >= 9.2e18) return jerr(c, at, "integer overflow");
        *out = jv_int((int64_t)self.u.f);
        return 0;
    }
    if (self.t == JV_STR) {
        if (base >= 2 && base <= 36 && parse_int(self.u.s->p, self.u.s->len, (int)base, &v)) {
            *out = jv_int(v);
            return 0;
        }
        if (parse_float(self.u.s->p, self.u.s->len, &d) && isfinite(d)) {
            if (fabs(d) >= 9.2e18) return jerr(c, at, "integer overflow");
            *out = jv_int((int64_t)d);
            return 0;
        }
    }
    *out = jv_ref(dflt);
    return 0;
}

FILTER(indent) {
    BIND("indent", "width", "first", "blank");
    jv_t t;
    jbuf_t ind;
    jbuf_init(&ind);
    if (!given(a[0]) || is_int(a[0])) {
        int64_t w = given(a[0]) ? ival(a[0]) : 4;
        for (int64_t k = 0; k < w; k++)
            if (jbuf_putc(c, &ind, ' ')) return -1;
    } else if (a[0].t == JV_STR) {
        if (jbuf_put(c, &ind, a[0].u.s->p, a[0].u.s->len)) return -1;
    } else {
        return jerr(c, at, "indent width must be an integer or a string");
    }
    if (text_of(c, at, self, &t)) return -1;
    // s += "\n"; lines = s.splitlines(); ... (Jinja's do_indent)
    jv_t s2;
    jbuf_t tb;
    jbuf_init(&tb);
    if (jbuf_put(c, &tb, t.u.s->p, t.u.s->len) || jbuf_putc(c, &tb, '\n')) return -1;
    s2 = take(c, &tb, t.fl);
    jlist_t *lines;
    if (splitlines(c, s2, &lines)) return -1;
    bool first = given(a[1]) && jv_truthy(a[1]), blank = given(a[2]) && jv_truthy(a[2]);
    jbuf_t b;
    jbuf_init(&b);
    int rc = 0;
    if (first) rc = jbuf_put(c, &b, ind.p ? ind.p : "", ind.len);
    for (size_t i = 0; i < lines->n && !rc; i++) {
        jstr_t *ln = lines->v[i].u.s;
        if (i) {
            rc = jbuf_putc(c, &b, '\n');
            if (!rc && (blank || ln->len)) rc = jbuf_put(c, &b, ind.p ? ind.p : "", ind.len);
        }
        if (!rc) rc = jbuf_put(c, &b, ln->p, ln->len);
    }
    jobj_release(c, &lines->h);
    jv_unref(c, s2);
    uint8_t fl = t.fl;
    jv_unref(c, t);
    jbuf_free(c, &ind);
    return jbuf_finish(c, &b, rc, fl, out);
}

FILTER(items) {
    NOARGS("items");
    jlist_t *g = jlist_new(c, NULL, JL_GEN, 0);
    *out = jv_list(g);
    if (self.t == JV_UNDEF) return 0;
    if (self.t != JV_DICT || self.u.d->ns) return jerr(c, at, "Can only get item pairs from a mapping.");
    c->steps += (long)(self.u.d->n >> 4);
    for (size_t i = 0; i < self.u.d->n; i++) {
        jlist_t *t = jlist_new(c, NULL, JL_TUPLE, 2);
        jv_t k = {.t = JV_STR};
        k.u.s = self.u.d->k[i];
        jlist_push(c, t, jv_ref(k));
        jlist_push(c, t, jv_ref(self.u.d->v[i]));
        if (jlist_push(c, g, jv_list(t))) return -1;
    }
    return 0;
}

FILTER(join) {
    BIND("join", "d", "attribute");
    jv_t sep = given(a[0]) ? jv_ref(a[0]) : jv_str(c, "", 0);
    jv_t sept;
    int rc = text_of(c, at, sep, &sept);
    jv_unref(c, sep);
    if (rc) return -1;
    jlist_t *items;
    if (jv_iterate(c, at, self, &items)) {
        jv_unref(c, sept);
        return -1;
    }
    jbuf_t b;
    jbuf_init(&b);
    for (size_t i = 0; i < items->n && !rc; i++) {
        jv_t x;
        if ((rc = jstep(c, at))) break;
        if ((rc = attr_get(c, at, items->v[i], a[1], (jv_t){.t = JV_MISSING}, false, &x))) break;
        if (i) rc = jbuf_put(c, &b, sept.u.s->p, sept.u.s->len);
        if (!rc) rc = jv_to_str(c, at, x, &b);
        jv_unref(c, x);
    }
    jobj_release(c, &items->h);
    jv_unref(c, sept);
    return jbuf_finish(c, &b, rc, 0, out);
}

FILTER(list) {
    NOARGS("list");
    jlist_t *items;
    if (jv_iterate(c, at, self, &items)) return -1;
    jlist_t *l = jlist_new(c, NULL, JL_LIST, items->n);
    for (size_t i = 0; i < items->n; i++) l->v[l->n++] = jv_ref(items->v[i]);
    l->h.depth = items->h.depth;
    c->steps += (long)(items->n >> 4);
    jobj_release(c, &items->h);
    *out = jv_list(l);
    return c->failed ? -1 : 0;
}

FILTER(lower) {
    NOARGS("lower");
    return case_value(c, at, self, CM_LOWER, true, out);
}

FILTER(upper) {
    NOARGS("upper");
    return case_value(c, at, self, CM_UPPER, true, out);
}

FILTER(title) {
    NOARGS("title");
    return case_value(c, at, self, CM_TITLE_JINJA, false, out);
}

// select/reject/selectattr/rejectattr
static int select_filter(jctx_t *c, const jnode_t *at, jv_t self, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
                         int nkw, bool attr_mode, bool reject, jv_t *out) {
    int off = attr_mode ? 1 : 0;
    if (attr_mode && nargs < 1) return jerr(c, at, "Missing parameter for attribute name");
    int test = -1;
    if (nargs > off) {
        if (args[off].t != JV_STR) return jerr(c, at, "the test name must be a string");
        test = jb_test_id(args[off].u.s->p);
        if (test < 0) return jerr(c, at, "unsupported test '%s'", args[off].u.s->p);
    }
    jlist_t *items;
    if (jv_iterate_lazy(c, at, self, true, &items)) return -1;
    jlist_t *g = jlist_new(c, NULL, JL_GEN, 0);
    *out = jv_list(g);
    int rc = 0;
    for (size_t i = 0; i < items->n && !rc; i++) {
        jv_t v;
        if (items->v[i].t == JV_ERROR) { // the source's pending error stays pending
            rc = jlist_push(c, g, jv_ref(items->v[i]));
            break;
        }
        if ((rc = jstep(c, at))) break;
        if ((rc = attr_get(c, at, items->v[i], attr_mode ? args[0] : (jv_t){.t = JV_MISSING}, (jv_t){.t = JV_MISSING},
                           false, &v)))
            break;
        bool r = false;
        if (test >= 0) {
            int first = off + 1;
            rc = jb_test(c, at, test, v, args + first, nargs - first, kwn, kwv, nkw, &r);
        } else {
            r = jv_truthy(v);
        }
        jv_unref(c, v);
        if (!rc && r != reject) rc = jlist_push(c, g, jv_ref(items->v[i]));
        if (rc) break;
    }
    if (rc) {
        // the item that failed raises when the generator reaches it
        jv_t e;
        if (!jcatch(c, &e)) rc = jlist_push(c, g, e);
    }
    jobj_release(c, &items->h);
    return rc;
}

FILTER(select) { return select_filter(c, at, self, args, nargs, kwn, kwv, nkw, false, false, out); }
FILTER(reject) { return select_filter(c, at, self, args, nargs, kwn, kwv, nkw, false, true, out); }
FILTER(selectattr) { return select_filter(c, at, self, args, nargs, kwn, kwv, nkw, true, false, out); }
FILTER(rejectattr) { return select_filter(c, at, self, args, nargs, kwn, kwv, nkw, true, true, out); }

FILTER(map) {
    jv_t attribute = {.t = JV_MISSING}, dflt = {.t = JV_MISSING};
    int fid = -1;
    if (nargs == 0) {
        for (int k = 0; k < nkw; k++) {
            if (!strcmp(kwn[k], "attribute")) attribute = kwv[k];
            else if (!strcmp(kwn[k], "default")) dflt = kwv[k];
            else return jerr(c, at, "map(): unexpected keyword argument '%s'", kwn[k]);
        }
        if (!given(attribute)) return jerr(c, at, "map requires a filter argument");
    } else {
        if (args[0].t != JV_STR) return jerr(c, at, "map(): the filter name must be a string");
        fid = jb_filter_id(args[0].u.s->p);
        if (fid < 0) return jerr(c, at, "unsupported filter '%s'", args[0].u.s->p);
    }
    jlist_t *items;
    if (jv_iterate_lazy(c, at, self, true, &items)) return -1;
    jlist_t *g = jlist_new(c, NULL, JL_GEN, 0);
    *out = jv_list(g);
    int rc = 0;
    for (size_t i = 0; i < items->n && !rc; i++) {
        jv_t v;
        if (items->v[i].t == JV_ERROR) {
            rc = jlist_push(c, g, jv_ref(items->v[i]));
            break;
        }
        if ((rc = jstep(c, at))) break;
        if (fid >= 0) rc = jb_filter(c, at, fid, items->v[i], args + 1, nargs - 1, kwn, kwv, nkw, &v);
        else rc = attr_get(c, at, items->v[i], attribute, dflt, false, &v);
        if (!rc) rc = jlist_push(c, g, v);
    }
    if (rc) {
        jv_t e;
        if (!jcatch(c, &e)) rc = jlist_push(c, g, e);
    }
    jobj_release(c, &items->h);
    return rc;
}

static int minmax(jctx_t *c, const jnode_t *at, jv_t self, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
                  int nkw, bool is_max, jv_t *out) {
    BIND(is_max ? "max" : "min", "case_sensitive", "attribute");
    bool cs = given(a[0]) && jv_truthy(a[0]);
    jlist_t *items;
    if (jv_iterate(c, at, self, &items)) return -1;
    int rc = 0;
    jv_t best = {.t = JV_MISSING}, bestkey = {.t = JV_MISSING};
    for (size_t i = 0; i < items->n && !rc; i++) {
        jv_t k;
        if ((rc = jstep(c, at))) break;
        if ((rc = attr_get(c, at, items->v[i], a[1], (jv_t){.t = JV_MISSING}, !cs, &k))) break;
        int r = 0;
        if (given(best) && (rc = jv_cmp(c, at, k, bestkey, &r))) {
            jv_unref(c, k);
            break;
        }
        if (!given(best) || (is_max ? r == 1 : r == -1)) {
            jv_unref(c, bestkey);
            bestkey = k;
            best = items->v[i];
        } else {
            jv_unref(c, k);
        }
    }
    if (!rc) *out = given(best) ? jv_ref(best) : jv_undef_hint(c, "No aggregated item, sequence was empty.");
    if (given(bestkey)) jv_unref(c, bestkey);
    jobj_release(c, &items->h);
    return rc || c->failed ? -1 : 0;
}

FILTER(max) { return minmax(c, at, self, args, nargs, kwn, kwv, nkw, true, out); }
FILTER(min) { return minmax(c, at, self, args, nargs, kwn, kwv, nkw, false, out); }

FILTER(replace) {
    BIND("replace", "old", "new", "count");
    if (!given(a[0]) || !given(a[1])) return jerr(c, at, "replace() needs old and new");
    int64_t count = -1;
    if (given(a[2]) && a[2].t != JV_NONE) {
        if (!is_int(a[2])) return jerr(c, at, "replace() count must be an integer");
        count = ival(a[2]);
    }
    jv_t s, o, n;
    if (text_of(c, at, self, &s)) return -1;
    if (text_of(c, at, a[0], &o) || text_of(c, at, a[1], &n)) return -1;
    jbuf_t b;
    jbuf_init(&b);
    int rc = replace(c, s.u.s, o.u.s, n.u.s, count, &b);
    jv_unref(c, s);
    jv_unref(c, o);
    jv_unref(c, n);
    return jbuf_finish(c, &b, rc, 0, out);
}

FILTER(reverse) {
    NOARGS("reverse");
    if (self.t == JV_STR) {
        jlist_t *chars;
        if (jv_iterate(c, at, self, &chars)) return -1;
        jbuf_t b;
        jbuf_init(&b);
        int rc = 0;
        for (size_t i = chars->n; i-- > 0 && !rc;) rc = jbuf_put(c, &b, chars->v[i].u.s->p, chars->v[i].u.s->len);
        jobj_release(c, &chars->h);
        return jbuf_finish(c, &b, rc, self.fl, out);
    }
    bool gen = self.t == JV_LIST && self.u.l->kind == JL_GEN;
    if (!(self.t == JV_UNDEF || self.t == JV_LIST || (self.t == JV_DICT && !self.u.d->ns)))
        return jerr(c, at, "argument must be iterable");
    jlist_t *items;
    if (jv_iterate(c, at, self, &items)) return -1;
    // reversed() of a sequence is an iterator; a generator is not reversible, Jinja then makes a list
    jlist_t *r = jlist_new(c, NULL, gen ? JL_LIST : JL_GEN, items->n);
    for (size_t i = items->n; i-- > 0;) r->v[r->n++] = jv_ref(items->v[i]);
    r->h.depth = items->h.depth;
    jobj_release(c, &items->h);
    *out = jv_list(r);
    return c->failed ? -1 : 0;
}

FILTER(round) {
    BIND("round", "precision", "method");
    int64_t p = 0;
    if (given(a[0])) {
        if (!is_int(a[0])) return jerr(c, at, "round() precision must be an integer");
        p = ival(a[0]);
    }
    const char *method = "common";
    if (given(a[1])) {
        if (a[1].t != JV_STR) return jerr(c, at, "round() method must be a string");
        method = a[1].u.s->p;
    }
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jerr(c, at, "method must be common, ceil or floor");
    if (self.t != JV_FLOAT && !is_int(self)) return jerr(c, at, "round() of a '%s'", jv_type_name(self));
    if (p < 0 || p > 300) return jerr(c, at, "round() precision outside 0..300 is not supported");
    if (!strcmp(method, "common")) {
        if (is_int(self)) {
            *out = jv_int(ival(self));
            return 0;
        }
        if (!isfinite(self.u.f)) {
            *out = self;
            return 0;
        }
        // printf rounds the exact binary value half-to-even, as Python's round() does
        char *buf = xmalloc(700);
        snprintf(buf, 700, "%.*f", (int)p, self.u.f);
        *out = jv_float(strtod(buf, NULL));
        free(buf);
        return 0;
    }
    double scale = pow(10.0, (double)p), x = (self.t == JV_FLOAT ? self.u.f : (double)ival(self)) * scale;
    *out = jv_float((!strcmp(method, "ceil") ? ceil(x) : floor(x)) / scale);
    return 0;
}

FILTER(safe) {
    NOARGS("safe");
    if (text_of(c, at, self, out)) return -1;
    out->fl = JV_MARKUP;
    return 0;
}

FILTER(sort) {
    BIND("sort", "reverse", "case_sensitive", "attribute");
    bool cs = given(a[1]) && jv_truthy(a[1]);
    jlist_t *items;
    if (jv_iterate(c, at, self, &items)) return -1;
    sitem_t *v = xcalloc(items->n + 1, sizeof *v);
    int rc = 0;
    // "a,b": sort by several attributes
    jlist_t *attrs = NULL;
    if (given(a[2]) && a[2].t == JV_STR && memchr(a[2].u.s->p, ',', a[2].u.s->len)) {
        jv_t parts;
        jstr_t *sep = jstr_new(c, NULL, ",", 1);
        rc = split(c, at, a[2], sep, -1, false, &parts);
        jobj_release(c, &sep->h);
        attrs = parts.u.l;
    }
    for (size_t i = 0; i < items->n && !rc; i++) {
        v[i].item = jv_ref(items->v[i]);
        if (attrs) {
            jlist_t *k = jlist_new(c, NULL, JL_LIST, attrs->n);
            for (size_t j = 0; j < attrs->n && !rc; j++) {
                jv_t kv;
                jv_t an = attrs->v[j];
                if (!(rc = attr_get(c, at, items->v[i], an, (jv_t){.t = JV_MISSING}, !cs, &kv))) rc = jlist_push(c, k, kv);
            }
            v[i].key = jv_list(k);
        } else {
            rc = attr_get(c, at, items->v[i], a[2], (jv_t){.t = JV_MISSING}, !cs, &v[i].key);
        }
    }
    if (!rc) rc = sort_items(c, at, v, items->n, given(a[0]) && jv_truthy(a[0]));
    jlist_t *l = jlist_new(c, NULL, JL_LIST, items->n);
    for (size_t i = 0; i < items->n; i++) {
        if (!rc) l->v[l->n++] = jv_ref(v[i].item);
        jv_unref(c, v[i].item);
        jv_unref(c, v[i].key);
    }
    l->h.depth = items->h.depth;
    free(v);
    if (attrs) jobj_release(c, &attrs->h);
    jobj_release(c, &items->h);
    *out = jv_list(l);
    return rc || c->failed ? -1 : 0;
}

FILTER(string) {
    NOARGS("string");
    return text_of(c, at, self, out);
}

FILTER(sum) {
    BIND("sum", "attribute", "start");
    jv_t acc = given(a[1]) ? jv_ref(a[1]) : jv_int(0);
    jlist_t *items;
    if (jv_iterate(c, at, self, &items)) return -1;
    int rc = 0;
    for (size_t i = 0; i < items->n && !rc; i++) {
        jv_t x, nx;
        if ((rc = jstep(c, at))) break;
        if ((rc = attr_get(c, at, items->v[i], a[0], (jv_t){.t = JV_MISSING}, false, &x))) break;
        if (acc.t == JV_STR || x.t == JV_STR) rc = jerr(c, at, "sum() can't sum strings");
        else rc = jbinop(c, at, '+', acc, x, &nx);
        jv_unref(c, x);
        if (!rc) {
            jv_unref(c, acc);
            acc = nx;
        }
    }
    jobj_release(c, &items->h);
    *out = acc;
    return rc;
}

FILTER(tojson) {
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    jjson_opts_t o = {0};
    char ind[64];
    o.ensure_ascii = given(a[0]) && jv_truthy(a[0]);
    o.sort_keys = given(a[3]) && jv_truthy(a[3]);
    if (given(a[1]) && a[1].t != JV_NONE) {
        if (is_int(a[1])) {
            int64_t w = ival(a[1]);
            if (w > (int64_t)sizeof ind - 1) return jerr(c, at, "tojson indent larger than %d", (int)sizeof ind - 1);
            int k = 0;
            for (; k < w; k++) ind[k] = ' ';
            ind[k] = 0;
        } else if (a[1].t == JV_STR && a[1].u.s->len < sizeof ind) {
            memcpy(ind, a[1].u.s->p, a[1].u.s->len + 1);
        } else {
            return jerr(c, at, "tojson indent must be an integer or a short string");
        }
        o.indent = ind;
    }
    if (given(a[2]) && a[2].t != JV_NONE) {
        jv_t s = a[2];
        if (s.t != JV_LIST || (s.u.l->kind != JL_LIST && s.u.l->kind != JL_TUPLE) || s.u.l->n != 2 ||
            s.u.l->v[0].t != JV_STR || s.u.l->v[1].t != JV_STR)
            return jerr(c, at, "tojson separators must be two strings (item, key)");
        o.item_sep = s.u.l->v[0].u.s->p;
        o.key_sep = s.u.l->v[1].u.s->p;
    }
    jbuf_t b;
    jbuf_init(&b);
    if (jv_tojson(c, at, self, &o, &b, 0)) {
        jbuf_free(c, &b);
        return -1;
    }
    *out = jbuf_take_str(c, &b);
    return c->failed ? -1 : 0;
}

FILTER(trim) {
    BIND("trim", "chars");
    jv_t t, ch = {.t = JV_NONE};
    if (text_of(c, at, self, &t)) return -1;
    if (given(a[0]) && a[0].t != JV_NONE) {
        if (want_str(c, at, a[0], "trim chars") || markup_arg(c, t, a[0], &ch)) {
            jv_unref(c, t);
            return -1;
        }
    }
    int rc = strip(c, t, ch.t == JV_STR ? ch.u.s : NULL, true, true, out);
    jv_unref(c, ch);
    jv_unref(c, t);
    return rc;
}

FILTER(unique) {
    BIND("unique", "case_sensitive", "attribute");
    bool cs = given(a[0]) && jv_truthy(a[0]);
    jlist_t *items;
    if (jv_iterate_lazy(c, at, self, true, &items)) return -1;
    jlist_t *g = jlist_new(c, NULL, JL_GEN, 0), *seen = jlist_new(c, NULL, JL_LIST, 0);
    *out = jv_list(g);
    int rc = 0;
    for (size_t i = 0; i < items->n && !rc; i++) {
        jv_t k;
        if (items->v[i].t == JV_ERROR) {
            rc = jlist_push(c, g, jv_ref(items->v[i]));
            break;
        }
        if ((rc = attr_get(c, at, items->v[i], a[1], (jv_t){.t = JV_MISSING}, !cs, &k))) break;
        if (k.t == JV_LIST || (k.t == JV_DICT && !k.u.d->ns)) {
            rc = jerr(c, at, "unhashable type: '%s'", jv_type_name(k));
            jv_unref(c, k);
            break;
        }
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++) {
            if ((rc = jstep(c, at))) break;
            dup = jv_eq(c, seen->v[j], k);
        }
        if (!rc && !dup) {
            rc = jlist_push(c, seen, k);
            if (!rc) rc = jlist_push(c, g, jv_ref(items->v[i]));
        } else {
            jv_unref(c, k);
        }
    }
    if (rc) {
        jv_t e;
        if (!jcatch(c, &e)) rc = jlist_push(c, g, e);
    }
    jobj_release(c, &seen->h);
    jobj_release(c, &items->h);
    return rc;
}

static const struct {
    const char *name;
    filter_fn fn;
} FILTERS[] = {
    {"abs", f_abs},       {"attr", f_attr},         {"capitalize", f_capitalize}, {"count", f_length},
    {"d", f_default},     {"default", f_default},   {"dictsort", f_dictsort},     {"e", f_escape},
    {"escape", f_escape}, {"first", f_first},       {"float", f_float},           {"forceescape", f_forceescape},
    {"indent", f_indent}, {"int", f_int},           {"items", f_items},           {"join", f_join},
    {"last", f_last},     {"length", f_length},     {"list", f_list},             {"lower", f_lower},
    {"map", f_map},       {"max", f_max},           {"min", f_min},               {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
    {"safe", f_safe},     {"select", f_select},     {"selectattr", f_selectattr}, {"sort", f_sort},
    {"string", f_string}, {"sum", f_sum},           {"title", f_title},           {"tojson", f_tojson},
    {"trim", f_trim},     {"unique", f_unique},     {"upper", f_upper},
};
#define N_FILTERS (int)(sizeof FILTERS / sizeof FILTERS[0])

int jb_filter_id(const char *name) {
    for (int i = 0; i < N_FILTERS; i++)
        if (!strcmp(FILTERS[i].name, name)) return i;
    return -1;
}

int jb_filter(jctx_t *c, const jnode_t *at, int id, jv_t self, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
              int nkw, jv_t *out) {
    if (jstep(c, at)) return -1;
    return FILTERS[id].fn(c, at, self, args, nargs, kwn, kwv, nkw, out);
}

// --- tests -------------------------------------------------------------------------------------
enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_ESCAPED, T_EVEN, T_FALSE, T_FILTER, T_FLOAT, T_GE,
    T_GT, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS,
    T_SEQUENCE, T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER,
};

static const struct {
    const char *name;
    int id;
} TESTS[] = {
    {"boolean", T_BOOLEAN},   {"callable", T_CALLABLE}, {"defined", T_DEFINED}, {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ},             {"equalto", T_EQ},        {"==", T_EQ},           {"escaped", T_ESCAPED},
    {"even", T_EVEN},         {"false", T_FALSE},       {"filter", T_FILTER},   {"float", T_FLOAT},
    {"ge", T_GE},             {">=", T_GE},             {"gt", T_GT},           {"greaterthan", T_GT},
    {">", T_GT},              {"in", T_IN},             {"integer", T_INTEGER}, {"iterable", T_ITERABLE},
    {"le", T_LE},             {"<=", T_LE},             {"lower", T_LOWER},     {"lt", T_LT},
    {"lessthan", T_LT},       {"<", T_LT},              {"mapping", T_MAPPING}, {"ne", T_NE},
    {"!=", T_NE},             {"none", T_NONE},         {"number", T_NUMBER},   {"odd", T_ODD},
    {"sameas", T_SAMEAS},     {"sequence", T_SEQUENCE}, {"string", T_STRING},   {"test", T_TEST},
    {"true", T_TRUE},         {"undefined", T_UNDEFINED}, {"upper", T_UPPER},
};

int jb_test_id(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (!strcmp(TESTS[i].name, name)) return (int)i;
    return -1;
}

static int str_case_test(jctx_t *c, const jnode_t *at, jv_t v, bool want_lower, bool *out) {
    jv_t t;
    if (text_of(c, at, v, &t)) return -1;
    c->steps += (long)(t.u.s->len >> 2);
    bool any = false, ok = true;
    for (size_t i = 0; i < t.u.s->len;) {
        uint32_t cp = ju_decode(t.u.s->p, t.u.s->len, &i);
        if (!cased(c, cp)) continue;
        any = true;
        if (want_lower ? ju_upper(c, cp) == cp : ju_lower(c, cp) == cp) ok = false;
    }
    jv_unref(c, t);
    *out = any && ok;
    return 0;
}

int jb_test(jctx_t *c, const jnode_t *at, int id, jv_t self, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
            int nkw, bool *out) {
    if (jstep(c, at)) return -1;
    int t = TESTS[id].id;
    const char *name = TESTS[id].name;
    int need = (t == T_DIVISIBLEBY || t == T_EQ || t == T_GE || t == T_GT || t == T_IN || t == T_LE || t == T_LT ||
                t == T_NE || t == T_SAMEAS)
                   ? 1
                   : 0;
    static const char *const p_other[] = {"other"};
    jv_t a[1] = {{.t = JV_MISSING}};
    if (jb_bind(c, at, name, p_other, need, args, nargs, kwn, kwv, nkw, a)) return -1;
    if (need && !given(a[0])) return jerr(c, at, "test '%s' needs an argument", name);
    jv_t o = a[0];
    int r;
    switch (t) {
    case T_BOOLEAN: *out = self.t == JV_BOOL; return 0;
    case T_CALLABLE: *out = self.t == JV_FUNC || self.t == JV_UNDEF; return 0;
    case T_DEFINED: *out = self.t != JV_UNDEF; return 0;
    case T_UNDEFINED: *out = self.t == JV_UNDEF; return 0;
    case T_ESCAPED: *out = self.t == JV_STR && (self.fl & JV_MARKUP); return 0;
    case T_FALSE: *out = self.t == JV_BOOL && !self.u.b; return 0;
    case T_TRUE: *out = self.t == JV_BOOL && self.u.b; return 0;
    case T_NONE: *out = self.t == JV_NONE; return 0;
    case T_FLOAT: *out = self.t == JV_FLOAT; return 0;
    case T_INTEGER: *out = self.t == JV_INT; return 0;
    case T_NUMBER: *out = self.t == JV_INT || self.t == JV_FLOAT || self.t == JV_BOOL; return 0;
    case T_STRING: *out = self.t == JV_STR; return 0;
    case T_MAPPING: *out = self.t == JV_DICT && !self.u.d->ns; return 0;
    case T_ITERABLE:
        *out = self.t == JV_UNDEF || self.t == JV_STR || self.t == JV_LIST || (self.t == JV_DICT && !self.u.d->ns);
        return 0;
    case T_SEQUENCE:
        *out = self.t == JV_UNDEF || self.t == JV_STR || (self.t == JV_DICT && !self.u.d->ns) ||
               (self.t == JV_LIST && (self.u.l->kind == JL_LIST || self.u.l->kind == JL_TUPLE || self.u.l->kind == JL_RANGE));
        return 0;
    case T_FILTER: *out = self.t == JV_STR && jb_filter_id(self.u.s->p) >= 0; return 0;
    case T_TEST: *out = self.t == JV_STR && jb_test_id(self.u.s->p) >= 0; return 0;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        jv_t m;
        if (jbinop(c, at, '%', self, t == T_DIVISIBLEBY ? o : jv_int(2), &m)) return -1;
        bool zero = !jv_truthy(m);
        *out = t == T_ODD ? jv_eq(c, m, jv_int(1)) : zero;
        return 0;
    }
    case T_EQ: *out = jv_eq(c, self, o); return 0;
    case T_NE: *out = !jv_eq(c, self, o); return 0;
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE:
        if (jv_cmp(c, at, self, o, &r)) return -1;
        *out = r != 2 && (t == T_LT ? r < 0 : t == T_LE ? r <= 0 : t == T_GT ? r > 0 : r >= 0);
        return 0;
    case T_IN: {
        // `x is in seq` is `x in seq`
        if (o.t == JV_STR) {
            if (self.t != JV_STR) return jerr(c, at, "'in <string>' requires a string as left operand");
            c->steps += (long)(o.u.s->len >> 6);
            *out = memmem(o.u.s->p, o.u.s->len, self.u.s->p, self.u.s->len) != NULL || self.u.s->len == 0;
            return 0;
        }
        jlist_t *items;
        if (o.t == JV_DICT && !o.u.d->ns) {
            *out = self.t == JV_STR && jdict_find(o.u.d, self.u.s->p, self.u.s->len);
            return 0;
        }
        if (jv_iterate(c, at, o, &items)) return -1;
        *out = false;
        for (size_t i = 0; i < items->n && !*out; i++) *out = jv_eq(c, items->v[i], self);
        jobj_release(c, &items->h);
        return 0;
    }
    case T_LOWER: return str_case_test(c, at, self, true, out);
    case T_UPPER: return str_case_test(c, at, self, false, out);
    case T_SAMEAS:
        if (self.t != o.t) *out = false;
        else if (self.t == JV_NONE || self.t == JV_UNDEF) *out = true;
        else if (self.t == JV_BOOL) *out = self.u.b == o.u.b;
        else if (self.t == JV_INT) *out = self.u.i == o.u.i;
        else if (self.t == JV_FLOAT) *out = false;
        else *out = self.u.o == o.u.o;
        return 0;
    }
    return jerr(c, at, "unsupported test");
}

// --- methods -----------------------------------------------------------------------------------
enum {
    // str
    M_CAPITALIZE, M_COUNT, M_ENDSWITH, M_FIND, M_INDEX, M_ISALNUM, M_ISALPHA, M_ISDIGIT, M_ISLOWER, M_ISSPACE,
    M_ISUPPER, M_JOIN, M_LOWER, M_LSTRIP, M_REMOVEPREFIX, M_REMOVESUFFIX, M_REPLACE, M_RFIND, M_RSPLIT, M_RSTRIP,
    M_SPLIT, M_SPLITLINES, M_STARTSWITH, M_STRIP, M_TITLE, M_UPPER,
    // dict
    M_GET, M_ITEMS, M_KEYS, M_VALUES,
    // list
    M_LCOUNT, M_LINDEX,
};

static const struct {
    const char *name;
    int id;
} STR_METHODS[] = {
    {"capitalize", M_CAPITALIZE}, {"count", M_COUNT},       {"endswith", M_ENDSWITH},       {"find", M_FIND},
    {"index", M_INDEX},           {"isalnum", M_ISALNUM},   {"isalpha", M_ISALPHA},         {"isdigit", M_ISDIGIT},
    {"islower", M_ISLOWER},       {"isspace", M_ISSPACE},   {"isupper", M_ISUPPER},         {"join", M_JOIN},
    {"lower", M_LOWER},           {"lstrip", M_LSTRIP},     {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX}, {"replace", M_REPLACE}, {"rfind", M_RFIND},          {"rsplit", M_RSPLIT},
    {"rstrip", M_RSTRIP},         {"split", M_SPLIT},       {"splitlines", M_SPLITLINES},   {"startswith", M_STARTSWITH},
    {"strip", M_STRIP},           {"title", M_TITLE},       {"upper", M_UPPER},
};
static const char *const STR_REFUSED[] = {
    "casefold", "center", "encode", "expandtabs", "format", "format_map", "isascii", "isdecimal", "isidentifier",
    "isnumeric", "isprintable", "istitle", "ljust", "maketrans", "partition", "rindex", "rjust", "rpartition",
    "swapcase", "translate", "zfill",
};
static const char *const DICT_REFUSED[] = {"clear", "copy", "fromkeys", "pop", "popitem", "setdefault", "update"};
static const char *const LIST_REFUSED[] = {"append", "clear", "copy", "extend", "insert", "pop", "remove",
                                           "reverse", "sort"};

static bool name_is(const char *name, size_t len, const char *s) { return strlen(s) == len && !memcmp(name, s, len); }

static int bound(jctx_t *c, jv_t self, int id, const char *name, jv_t *out) {
    jfunc_t *f = jobj_new(c, NULL, sizeof(jfunc_t), JV_FUNC);
    f->kind = JF_METHOD;
    f->id = id;
    f->name = name;
    f->self = jv_ref(self);
    *out = mkfunc_val(f);
    return c->failed ? -1 : 1;
}

int jb_method(jctx_t *c, const jnode_t *at, jv_t self, const char *name, size_t len, jv_t *out) {
    if (self.t == JV_STR) {
        for (size_t i = 0; i < sizeof STR_METHODS / sizeof STR_METHODS[0]; i++)
            if (name_is(name, len, STR_METHODS[i].name)) return bound(c, self, STR_METHODS[i].id, STR_METHODS[i].name, out);
        for (size_t i = 0; i < sizeof STR_REFUSED / sizeof STR_REFUSED[0]; i++)
            if (name_is(name, len, STR_REFUSED[i])) return jerr(c, at, "the string method '%s' is not supported", STR_REFUSED[i]);
    } else if (self.t == JV_DICT && !self.u.d->ns) {
        static const char *const names[] = {"get", "items", "keys", "values"};
        for (int i = 0; i < 4; i++)
            if (name_is(name, len, names[i])) return bound(c, self, M_GET + i, names[i], out);
        for (size_t i = 0; i < sizeof DICT_REFUSED / sizeof DICT_REFUSED[0]; i++)
            if (name_is(name, len, DICT_REFUSED[i]))
                return jerr(c, at, "the dict method '%s' is not supported (the chat-template sandbox makes dicts immutable)",
                            DICT_REFUSED[i]);
    } else if (self.t == JV_LIST && (self.u.l->kind == JL_LIST || self.u.l->kind == JL_TUPLE)) {
        if (name_is(name, len, "count")) return bound(c, self, M_LCOUNT, "count", out);
        if (name_is(name, len, "index")) return bound(c, self, M_LINDEX, "index", out);
        for (size_t i = 0; i < sizeof LIST_REFUSED / sizeof LIST_REFUSED[0]; i++)
            if (name_is(name, len, LIST_REFUSED[i]))
                return jerr(c, at, "the list method '%s' is not supported (the chat-template sandbox makes lists immutable)",
                            LIST_REFUSED[i]);
    }
    return 0;
}

// a str argument, or a tuple of them (startswith/endswith)
static int affix_test(jctx_t *c, const jnode_t *at, jv_t self, jv_t arg, bool end, bool *out) {
    jstr_t *s = self.u.s;
    *out = false;
    if (arg.t == JV_STR) {
        jstr_t *x = arg.u.s;
        c->steps += (long)(x->len >> 6);
        *out = x->len <= s->len && !memcmp(end ? s->p + s->len - x->len : s->p, x->p, x->len);
        return 0;
    }
    if (arg.t == JV_LIST && arg.u.l->kind == JL_TUPLE) {
        for (size_t i = 0; i < arg.u.l->n && !*out; i++) {
            if (arg.u.l->v[i].t != JV_STR)
                return jerr(c, at, "a tuple for %s must contain only strings", end ? "endswith" : "startswith");
            if (affix_test(c, at, self, arg.u.l->v[i], end, out)) return -1;
        }
        return 0;
    }
    return jerr(c, at, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
                jv_type_name(arg));
}

static int find_sub(jctx_t *c, const jnode_t *at, jv_t self, jv_t sub, bool last, int64_t *out) {
    if (want_str(c, at, sub, "the substring")) return -1;
    jstr_t *s = self.u.s, *x = sub.u.s;
    *out = -1;
    c->steps += (long)(s->len >> 6);
    if (!last) {
        const char *f = x->len ? memmem(s->p, s->len, x->p, x->len) : s->p;
        if (f) *out = (int64_t)ju_count(s->p, (size_t)(f - s->p));
    } else {
        for (size_t k = s->len >= x->len ? s->len - x->len + 1 : 0; k-- > 0;)
            if (!memcmp(s->p + k, x->p, x->len)) {
                *out = (int64_t)ju_count(s->p, k);
                break;
            }
    }
    return 0;
}

static int str_pred(jctx_t *c, jstr_t *s, int id, bool *out) {
    c->steps += (long)(s->len >> 2);
    if (id == M_ISLOWER || id == M_ISUPPER) {
        bool any = false, ok = true;
        for (size_t i = 0; i < s->len;) {
            uint32_t cp = ju_decode(s->p, s->len, &i);
            if (!cased(c, cp)) continue;
            any = true;
            if (id == M_ISLOWER ? ju_upper(c, cp) == cp : ju_lower(c, cp) == cp) ok = false;
        }
        *out = any && ok;
        return 0;
    }
    *out = s->len > 0;
    for (size_t i = 0; i < s->len && *out;) {
        uint32_t cp = ju_decode(s->p, s->len, &i);
        bool digit = cp >= '0' && cp <= '9', alpha = (cp | 32) >= 'a' && (cp | 32) <= 'z';
        if (cp >= 0x80) alpha = cased(c, cp); // letters without case are not recognised
        if (id == M_ISDIGIT) *out = digit;
        else if (id == M_ISALPHA) *out = alpha;
        else if (id == M_ISALNUM) *out = digit || alpha;
        else *out = ju_isspace(cp);
    }
    return 0;
}

static int call_str_method(jctx_t *c, const jnode_t *at, jfunc_t *f, jv_t *args, int nargs, const char **kwn,
                           jv_t *kwv, int nkw, jv_t *out) {
    jv_t self = f->self;
    jstr_t *s = self.u.s;
    bool m = self.fl & JV_MARKUP;
    int64_t idx;
    bool b;
    int rc;
    switch (f->id) {
    case M_UPPER:
    case M_LOWER:
    case M_CAPITALIZE:
    case M_TITLE: {
        NOARGS(f->name);
        int mode = f->id == M_UPPER ? CM_UPPER : f->id == M_LOWER ? CM_LOWER : f->id == M_CAPITALIZE ? CM_CAPITALIZE : CM_TITLE_PY;
        return case_value(c, at, self, mode, true, out);
    }
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        BIND(f->name, "chars");
        jv_t ch = {.t = JV_NONE};
        if (given(a[0]) && a[0].t != JV_NONE &&
            (want_str(c, at, a[0], "the characters to strip") || markup_arg(c, self, a[0], &ch)))
            return -1;
        rc = strip(c, self, ch.t == JV_STR ? ch.u.s : NULL, f->id != M_RSTRIP, f->id != M_LSTRIP, out);
        jv_unref(c, ch);
        return rc;
    }
    case M_SPLIT:
    case M_RSPLIT: {
        BIND(f->name, "sep", "maxsplit");
        int64_t maxsplit = -1;
        if (given(a[1])) {
            if (!is_int(a[1])) return jerr(c, at, "maxsplit must be an integer");
            maxsplit = ival(a[1]);
        }
        jv_t sep = {.t = JV_NONE};
        if (given(a[0]) && a[0].t != JV_NONE && (want_str(c, at, a[0], "the separator") || markup_arg(c, self, a[0], &sep)))
            return -1;
        rc = split(c, at, self, sep.t == JV_STR ? sep.u.s : NULL, maxsplit, f->id == M_RSPLIT, out);
        jv_unref(c, sep);
        return rc;
    }
    case M_SPLITLINES: {
        BIND(f->name, "keepends");
        if (given(a[0]) && jv_truthy(a[0])) return jerr(c, at, "splitlines(keepends=True) is not supported");
        jlist_t *l;
        rc = splitlines(c, self, &l);
        *out = jv_list(l);
        return rc;
    }
    case M_REPLACE: {
        BIND(f->name, "old", "new", "count");
        if (!given(a[0]) || !given(a[1])) return jerr(c, at, "replace() needs old and new");
        if (want_str(c, at, a[0], "replace() old") || want_str(c, at, a[1], "replace() new")) return -1;
        int64_t count = -1;
        if (given(a[2])) {
            if (!is_int(a[2])) return jerr(c, at, "replace() count must be an integer");
            count = ival(a[2]);
        }
        jv_t o, n;
        if (markup_arg(c, self, a[0], &o) || markup_arg(c, self, a[1], &n)) return -1;
        jbuf_t buf;
        jbuf_init(&buf);
        rc = replace(c, s, o.u.s, n.u.s, count, &buf);
        jv_unref(c, o);
        jv_unref(c, n);
        return jbuf_finish(c, &buf, rc, m ? JV_MARKUP : 0, out);
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        BIND(f->name, "prefix");
        if (!given(a[0])) return jerr(c, at, "%s() takes at least 1 argument", f->name);
        if (affix_test(c, at, self, a[0], f->id == M_ENDSWITH, &b)) return -1;
        *out = jv_bool(b);
        return 0;
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        BIND(f->name, "affix");
        if (!given(a[0]) || want_str(c, at, a[0], "the affix")) return given(a[0]) ? -1 : jerr(c, at, "%s() takes 1 argument", f->name);
        if (affix_test(c, at, self, a[0], f->id == M_REMOVESUFFIX, &b)) return -1;
        size_t k = b ? a[0].u.s->len : 0;
        *out = f->id == M_REMOVEPREFIX ? jv_str(c, s->p + k, s->len - k) : jv_str(c, s->p, s->len - k);
        out->fl = self.fl;
        return c->failed ? -1 : 0;
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX: {
        BIND(f->name, "sub");
        if (!given(a[0])) return jerr(c, at, "%s() takes 1 argument", f->name);
        if (find_sub(c, at, self, a[0], f->id == M_RFIND, &idx)) return -1;
        if (f->id == M_INDEX && idx < 0) return jerr(c, at, "substring not found");
        *out = jv_int(idx);
        return 0;
    }
    case M_COUNT: {
        BIND(f->name, "sub");
        if (!given(a[0]) || want_str(c, at, a[0], "the substring")) return given(a[0]) ? -1 : jerr(c, at, "count() takes 1 argument");
        jstr_t *x = a[0].u.s;
        int64_t n = 0;
        c->steps += (long)(s->len >> 6);
        if (!x->len) n = (int64_t)s->nch + 1;
        else
            for (const char *p = s->p; (p = memmem(p, s->len - (size_t)(p - s->p), x->p, x->len)); p += x->len) n++;
        *out = jv_int(n);
        return 0;
    }
    case M_ISALNUM:
    case M_ISALPHA:
    case M_ISDIGIT:
    case M_ISLOWER:
    case M_ISSPACE:
    case M_ISUPPER:
        NOARGS(f->name);
        str_pred(c, s, f->id, &b);
        *out = jv_bool(b);
        return 0;
    case M_JOIN: {
        BIND(f->name, "iterable");
        if (!given(a[0])) return jerr(c, at, "join() takes 1 argument");
        jlist_t *items;
        if (jv_iterate(c, at, a[0], &items)) return -1;
        jbuf_t buf;
        jbuf_init(&buf);
        rc = 0;
        for (size_t i = 0; i < items->n && !rc; i++) {
            jv_t x = items->v[i];
            if (x.t != JV_STR) {
                rc = jerr(c, at, "sequence item %zu: expected str instance, %s found", i, jv_type_name(x));
                break;
            }
            if (i) rc = jbuf_put(c, &buf, s->p, s->len);
            if (!rc) rc = (m && !(x.fl & JV_MARKUP)) ? jb_html_escape(c, x.u.s->p, x.u.s->len, &buf)
                                                     : jbuf_put(c, &buf, x.u.s->p, x.u.s->len);
        }
        jobj_release(c, &items->h);
        return jbuf_finish(c, &buf, rc, m ? JV_MARKUP : 0, out);
    }
    }
    return jerr(c, at, "unsupported string method");
}

static int make_view(jctx_t *c, jdict_t *d, int kind, jv_t *out) {
    jlist_t *l = jlist_new(c, NULL, (uint8_t)kind, d->n);
    c->steps += (long)(d->n >> 4);
    for (size_t i = 0; i < d->n; i++) {
        jv_t k = {.t = JV_STR};
        k.u.s = d->k[i];
        if (kind == JL_KEYS) l->v[l->n++] = jv_ref(k);
        else if (kind == JL_VALUES) l->v[l->n++] = jv_ref(d->v[i]);
        else {
            jlist_t *t = jlist_new(c, NULL, JL_TUPLE, 2);
            jlist_push(c, t, jv_ref(k));
            jlist_push(c, t, jv_ref(d->v[i]));
            l->v[l->n++] = jv_list(t);
        }
    }
    l->h.depth = (uint16_t)(d->h.depth + 1);
    *out = jv_list(l);
    return c->failed ? -1 : 0;
}

int jb_call_method(jctx_t *c, const jnode_t *at, jfunc_t *f, jv_t *args, int nargs, const char **kwn, jv_t *kwv,
                   int nkw, jv_t *out) {
    if (f->self.t == JV_STR) return call_str_method(c, at, f, args, nargs, kwn, kwv, nkw, out);
    if (f->self.t == JV_DICT) {
        jdict_t *d = f->self.u.d;
        if (f->id == M_GET) {
            BIND("get", "key", "default");
            if (!given(a[0])) return jerr(c, at, "get() takes at least 1 argument");
            jv_t *v = a[0].t == JV_STR ? jdict_find(d, a[0].u.s->p, a[0].u.s->len) : NULL;
            if (a[0].t == JV_LIST || a[0].t == JV_DICT) return jerr(c, at, "unhashable type: '%s'", jv_type_name(a[0]));
            *out = v ? jv_ref(*v) : given(a[1]) ? jv_ref(a[1]) : JV_NONEV;
            return 0;
        }
        NOARGS(f->name);
        return make_view(c, d, f->id == M_ITEMS ? JL_ITEMS : f->id == M_KEYS ? JL_KEYS : JL_VALUES, out);
    }
    if (f->self.t == JV_LIST) {
        BIND(f->name, "value");
        if (!given(a[0])) return jerr(c, at, "%s() takes exactly one argument", f->name);
        jlist_t *l = f->self.u.l;
        int64_t n = 0, first = -1;
        c->steps += (long)l->n;
        for (size_t i = 0; i < l->n; i++)
            if (jv_eq(c, l->v[i], a[0])) {
                if (first < 0) first = (int64_t)i;
                n++;
            }
        if (f->id == M_LINDEX && first < 0) return jerr(c, at, "value is not in list");
        *out = jv_int(f->id == M_LCOUNT ? n : first);
        return 0;
    }
    return jerr(c, at, "unsupported method");
}

// --- globals -----------------------------------------------------------------------------------
enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_LIPSUM, G_CYCLER, G_JOINER };
static const char *const GLOBALS[] = {"range", "namespace", "dict", "raise_exception", "strftime_now",
                                      "lipsum", "cycler", "joiner"};

int jb_global_id(const char *name) {
    for (size_t i = 0; i < sizeof GLOBALS / sizeof GLOBALS[0]; i++)
        if (!strcmp(GLOBALS[i], name)) return (int)i;
    return -1;
}

static int make_dict(jctx_t *c, const jnode_t *at, const char *fname, bool ns, jv_t *args, int nargs, const char **kwn,
                     jv_t *kwv, int nkw, jv_t *out) {
    if (nargs > 1) return jerr(c, at, "%s() takes at most 1 positional argument", fname);
    jdict_t *d = jdict_new(c, NULL, ns);
    *out = jv_dict(d);
    if (nargs == 1) {
        jv_t src = args[0];
        if (src.t == JV_DICT && !src.u.d->ns) {
            for (size_t i = 0; i < src.u.d->n; i++)
                if (jdict_set(c, d, src.u.d->k[i], jv_ref(src.u.d->v[i]))) return -1;
        } else {
            jlist_t *items;
            if (jv_iterate(c, at, src, &items)) return -1;
            int rc = 0;
            for (size_t i = 0; i < items->n && !rc; i++) {
                jv_t p = items->v[i];
                if (p.t != JV_LIST || p.u.l->kind == JL_GEN || p.u.l->n != 2 || p.u.l->v[0].t != JV_STR)
                    rc = jerr(c, at, "%s(): element %zu is not a (string key, value) pair", fname, i);
                else rc = jdict_set(c, d, p.u.l->v[0].u.s, jv_ref(p.u.l->v[1]));
            }
            jobj_release(c, &items->h);
            if (rc) return -1;
        }
    }
    for (int k = 0; k < nkw; k++) {
        jstr_t *key = jstr_new(c, NULL, kwn[k], strlen(kwn[k]));
        int rc = jdict_set(c, d, key, jv_ref(kwv[k]));
        jobj_release(c, &key->h);
        if (rc) return -1;
    }
    return 0;
}

int jb_call_global(jctx_t *c, const jnode_t *at, int id, jv_t *args, int nargs, const char **kwn, jv_t *kwv, int nkw,
                   jv_t *out) {
    switch (id) {
    case G_RANGE: {
        if (nkw) return jerr(c, at, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3) return jerr(c, at, "range() takes 1 to 3 arguments");
        for (int i = 0; i < nargs; i++)
            if (!is_int(args[i])) return jerr(c, at, "range() arguments must be integers, not '%s'", jv_type_name(args[i]));
        int64_t start = nargs > 1 ? ival(args[0]) : 0, stop = nargs > 1 ? ival(args[1]) : ival(args[0]);
        int64_t step = nargs > 2 ? ival(args[2]) : 1;
        if (step == 0) return jerr(c, at, "range() arg 3 must not be zero");
        double n = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                            : ceil(((double)start - (double)stop) / (double)-step);
        if (n < 0) n = 0;
        if (n > JINJA_MAX_RANGE)
            return jerr(c, at, "range of %.0f items is larger than the sandbox allows (%d)", n, JINJA_MAX_RANGE);
        jlist_t *l = jlist_new(c, NULL, JL_RANGE, (size_t)n);
        for (int64_t k = 0; k < (int64_t)n; k++) l->v[l->n++] = jv_int(start + k * step);
        c->steps += (long)(l->n >> 4);
        *out = jv_list(l);
        return c->failed ? -1 : 0;
    }
    case G_NAMESPACE: return make_dict(c, at, "namespace", true, args, nargs, kwn, kwv, nkw, out);
    case G_DICT: return make_dict(c, at, "dict", false, args, nargs, kwn, kwv, nkw, out);
    case G_RAISE: {
        jbuf_t b;
        jbuf_init(&b);
        for (int i = 0; i < nargs; i++)
            if (jv_to_str(c, at, args[i], &b)) break;
        if (c->failed) {
            jbuf_free(c, &b);
            return -1;
        }
        err_set(c->err, JINJA_RAISED_PREFIX "%s", b.p ? b.p : "");
        c->failed = true;
        jbuf_free(c, &b);
        return -1;
    }
    case G_STRFTIME: {
        if (nargs != 1 || nkw || args[0].t != JV_STR) return jerr(c, at, "strftime_now() takes one format string");
        struct tm tm;
        memset(&tm, 0, sizeof tm);
        if (c->lim.now) {
            if (c->lim.now(&tm, c->lim.now_ud)) return jerr(c, at, "strftime_now: the clock failed");
        } else {
            time_t now = time(NULL);
            localtime_r(&now, &tm);
        }
        char buf[512];
        size_t n = c->cloc ? strftime_l(buf, sizeof buf, args[0].u.s->p, &tm, c->cloc)
                           : strftime(buf, sizeof buf, args[0].u.s->p, &tm);
        if (n == 0 && args[0].u.s->len) return jerr(c, at, "strftime_now: the formatted date is empty or too long");
        *out = jv_str(c, buf, n);
        return c->failed ? -1 : 0;
    }
    default: return jerr(c, at, "the global function '%s' is not supported", GLOBALS[id]);
    }
}

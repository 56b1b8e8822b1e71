// jinja_value.c - values of the Jinja interpreter: allocation and reference counting, JSON input,
// Python's str()/repr()/== /<, json.dumps, iteration, and the UTF-8 helpers.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#include "common/formats/jinja_int.h"

// Containers nest at most this deep (bounds the recursion of freeing, printing and comparing).
#define JV_MAX_DEPTH 1100

const jv_t JV_UNDEFINED = {.t = JV_UNDEF};
const jv_t JV_NONEV = {.t = JV_NONE};

// --- allocation --------------------------------------------------------------------------------
static void unlink_obj(jobj_t *o);
static void link_obj(jctx_t *c, jobj_t *o);
static void charge(jctx_t *c, size_t n) {
    c->mem += n;
    if (c->mem > c->lim.max_memory && !c->fatal)
        jfatal(c, NULL, "the template needs more than %zu bytes of memory (limit)", c->lim.max_memory);
}

void *jobj_new(jctx_t *c, jarena_t *arena, size_t size, uint8_t type) {
    jobj_t *o;
    if (c) {
        o = xcalloc(1, size);
        link_obj(c, o);
        o->charge = size;
        charge(c, size);
    } else {
        o = jarena_alloc(arena, size);
        o->immortal = 1;
    }
    o->rc = 1;
    o->type = type;
    return o;
}

jv_t jv_ref(jv_t v) {
    if (jv_heap(v) && !v.u.o->immortal) v.u.o->rc++;
    return v;
}

void jv_unref(jctx_t *c, jv_t v) {
    if (jv_heap(v)) jobj_release(c, v.u.o);
}

void jobj_release(jctx_t *c, jobj_t *o) {
    if (!o || o->immortal || --o->rc > 0) return;
    switch (o->type) {
    case JV_LIST: {
        jlist_t *l = (jlist_t *)o;
        for (size_t i = 0; i < l->n; i++) jv_unref(c, l->v[i]);
        c->mem -= l->cap * sizeof(jv_t);
        free(l->v);
        break;
    }
    case JV_DICT: {
        jdict_t *d = (jdict_t *)o;
        for (size_t i = 0; i < d->n; i++) {
            jobj_release(c, &d->k[i]->h);
            jv_unref(c, d->v[i]);
        }
        c->mem -= d->cap * (sizeof(jv_t) + sizeof(jstr_t *)) + d->ixcap * sizeof *d->ix;
        free(d->k);
        free(d->v);
        free(d->ix);
        break;
    }
    case JV_FUNC: {
        jfunc_t *f = (jfunc_t *)o;
        jv_unref(c, f->self);
        if (f->closure) jobj_release(c, &f->closure->h);
        break;
    }
    case JV_LOOP: {
        jloop_t *lp = (jloop_t *)o;
        if (lp->items) jobj_release(c, &lp->items->h);
        break;
    }
    default: break;
    }
    unlink_obj(o);
    c->mem -= o->charge;
    free(o);
}

jstr_t *jstr_new(jctx_t *c, jarena_t *arena, const char *s, size_t len) {
    if (c) c->steps += (long)(len >> 6); // copying is work: a loop of large copies ends at max_steps
    jstr_t *x = jobj_new(c, arena, sizeof(jstr_t) + len + 1, JV_STR);
    if (len) memcpy(x->p, s, len);
    x->p[len] = 0;
    x->len = len;
    x->nch = ju_count(s, len);
    return x;
}

jv_t jv_str(jctx_t *c, const char *s, size_t len) {
    jv_t v = {.t = JV_STR};
    v.u.s = jstr_new(c, NULL, s, len);
    return v;
}

jv_t jv_strz(jctx_t *c, const char *s) { return jv_str(c, s, strlen(s)); }

jv_t jv_undef_hint(jctx_t *c, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jv_t v = {.t = JV_UNDEF};
    v.u.s = jstr_new(c, NULL, msg, strlen(msg));
    return v;
}

jlist_t *jlist_new(jctx_t *c, jarena_t *arena, uint8_t kind, size_t cap) {
    jlist_t *l = jobj_new(c, arena, sizeof(jlist_t), JV_LIST);
    l->kind = kind;
    l->h.depth = 1;
    if (cap) {
        l->cap = cap;
        if (c) {
            l->v = xcalloc(cap, sizeof(jv_t));
            charge(c, cap * sizeof(jv_t));
        } else {
            l->v = jarena_alloc(arena, cap * sizeof(jv_t));
        }
    }
    return l;
}

static uint16_t depth_of(jv_t v) {
    return (v.t == JV_LIST || v.t == JV_DICT) ? v.u.o->depth : 0;
}

int jlist_push(jctx_t *c, jlist_t *l, jv_t v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 4;
        if (c) {
            l->v = xrealloc(l->v, nc * sizeof(jv_t));
            charge(c, (nc - l->cap) * sizeof(jv_t));
        } else {
            return -1; // immortal lists are made with their size
        }
        l->cap = nc;
    }
    l->v[l->n++] = v;
    uint16_t d = depth_of(v);
    if (d + 1 > l->h.depth) l->h.depth = (uint16_t)(d + 1 > JV_MAX_DEPTH ? JV_MAX_DEPTH + 1 : d + 1);
    if (l->h.depth > JV_MAX_DEPTH && c) return jfatal(c, NULL, "lists and dicts nested deeper than %d (limit)", JV_MAX_DEPTH);
    return c && c->failed ? -1 : 0;
}

jdict_t *jdict_new(jctx_t *c, jarena_t *arena, bool ns) {
    jdict_t *d = jobj_new(c, arena, sizeof(jdict_t), JV_DICT);
    d->ns = ns;
    d->h.depth = 1;
    return d;
}

static uint64_t key_hash(const char *k, size_t len) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return h;
}

static void index_put(jdict_t *d, size_t i) {
    size_t m = d->ixcap - 1, s = (size_t)key_hash(d->k[i]->p, d->k[i]->len) & m;
    while (d->ix[s]) s = (s + 1) & m;
    d->ix[s] = (uint32_t)(i + 1);
}

jv_t *jdict_find(const jdict_t *d, const char *k, size_t len) {
    if (d->ix) {
        size_t m = d->ixcap - 1;
        for (size_t s = (size_t)key_hash(k, len) & m; d->ix[s]; s = (s + 1) & m) {
            const jstr_t *x = d->k[d->ix[s] - 1];
            if (x->len == len && !memcmp(x->p, k, len)) return &d->v[d->ix[s] - 1];
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i]->len == len && !memcmp(d->k[i]->p, k, len)) return &d->v[i];
    return NULL;
}

// Arena-backed dicts (immortal) grow by copying into the arena. From 32 entries on the dict has a
// hash index, rebuilt at each growth, so that lookups stay O(1) in large inputs.
static void dict_grow(jctx_t *c, jarena_t *arena, jdict_t *d) {
    size_t nc = d->cap ? 2 * d->cap : 4;
    if (c) {
        d->k = xrealloc(d->k, nc * sizeof *d->k);
        d->v = xrealloc(d->v, nc * sizeof *d->v);
        charge(c, (nc - d->cap) * (sizeof(jv_t) + sizeof(jstr_t *)));
    } else {
        jstr_t **k = jarena_alloc(arena, nc * sizeof *k);
        jv_t *v = jarena_alloc(arena, nc * sizeof *v);
        if (d->n) {
            memcpy(k, d->k, d->n * sizeof *k);
            memcpy(v, d->v, d->n * sizeof *v);
        }
        d->k = k;
        d->v = v;
    }
    d->cap = nc;
    if (nc >= 32) {
        size_t ixcap = 2 * nc;
        if (c) {
            if (d->ix) c->mem -= d->ixcap * sizeof *d->ix;
            free(d->ix);
            d->ix = xcalloc(ixcap, sizeof *d->ix);
            charge(c, ixcap * sizeof *d->ix);
            c->steps += (long)(d->n >> 4);
        } else {
            d->ix = jarena_alloc(arena, ixcap * sizeof *d->ix);
        }
        d->ixcap = ixcap;
        for (size_t i = 0; i < d->n; i++) index_put(d, i);
    }
}

static int dict_set_in(jctx_t *c, jarena_t *arena, jdict_t *d, jstr_t *k, jv_t v) {
    jv_t *slot = jdict_find(d, k->p, k->len);
    if (slot) {
        jv_t old = *slot;
        *slot = v;
        if (c) jv_unref(c, old);
    } else {
        if (d->n == d->cap) dict_grow(c, arena, d);
        if (c && !k->h.immortal) k->h.rc++;
        d->k[d->n] = k;
        d->v[d->n++] = v;
        if (d->ix) index_put(d, d->n - 1);
    }
    uint16_t dp = depth_of(v);
    if (dp + 1 > d->h.depth) d->h.depth = (uint16_t)(dp + 1 > JV_MAX_DEPTH ? JV_MAX_DEPTH + 1 : dp + 1);
    if (d->h.depth > JV_MAX_DEPTH && c) return jfatal(c, NULL, "lists and dicts nested deeper than %d (limit)", JV_MAX_DEPTH);
    return c && c->failed ? -1 : 0;
}

int jdict_set(jctx_t *c, jdict_t *d, jstr_t *k, jv_t v) { return dict_set_in(c, NULL, d, k, v); }

// --- JSON input --------------------------------------------------------------------------------
// The numbers of a JSON text in document order (cJSON walks children in the same order): where
// each starts, and whether it was written as a float. Also rejects \u0000 in strings, which
// cJSON would cut the string at.
typedef struct {
    size_t *start;
    bool *is_float;
    size_t n, i;
} numscan_t;

static int scan_numbers(const char *s, size_t len, numscan_t *ns, char *err) {
    size_t cap = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (ch == '"') {
            for (i++; i < len && s[i] != '"'; i++) {
                if (s[i] == '\\') {
                    if (i + 5 < len && s[i + 1] == 'u' && !strncmp(s + i + 2, "0000", 4))
                        return err_set(err, "JSON strings with \\u0000 are not supported");
                    i++;
                }
            }
            continue;
        }
        if (ch == '-' || (ch >= '0' && ch <= '9')) {
            if (ns->n == cap) {
                cap = cap ? 2 * cap : 64;
                ns->start = xrealloc(ns->start, cap * sizeof *ns->start);
                ns->is_float = xrealloc(ns->is_float, cap * sizeof *ns->is_float);
            }
            ns->start[ns->n] = i;
            bool f = false;
            while (i < len && (s[i] == '-' || s[i] == '+' || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
                               (s[i] >= '0' && s[i] <= '9'))) {
                if (s[i] == '.' || s[i] == 'e' || s[i] == 'E') f = true;
                i++;
            }
            ns->is_float[ns->n++] = f;
            i--;
        }
    }
    return 0;
}

static int from_cjson(jarena_t *a, const cJSON *j, const char *text, numscan_t *ns, jv_t *out, int depth,
                      char *err) {
    if (depth > JV_MAX_DEPTH) return err_set(err, "JSON nested deeper than %d", JV_MAX_DEPTH);
    if (cJSON_IsNull(j)) {
        *out = JV_NONEV;
    } else if (cJSON_IsTrue(j)) {
        *out = jv_bool(true);
    } else if (cJSON_IsFalse(j)) {
        *out = jv_bool(false);
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (text) {
            if (ns->i >= ns->n) return err_set(err, "JSON numbers could not be matched to the text");
            size_t st = ns->start[ns->i];
            bool f = ns->is_float[ns->i++];
            if (f) {
                *out = jv_float(strtod(text + st, NULL));
            } else {
                errno = 0;
                long long v = strtoll(text + st, NULL, 10);
                if (errno == ERANGE) return err_set(err, "JSON integer %.30s... does not fit in 64 bits", text + st);
                *out = jv_int(v);
            }
        } else if (d == floor(d) && fabs(d) < 9.2e18) {
            *out = jv_int((int64_t)d);
        } else {
            *out = jv_float(d);
        }
    } else if (cJSON_IsString(j)) {
        size_t len = strlen(j->valuestring);
        if (!ju_valid(j->valuestring, len)) return err_set(err, "a JSON string is not valid UTF-8");
        out->t = JV_STR;
        out->fl = 0;
        out->u.s = jstr_new(NULL, a, j->valuestring, len);
    } else if (cJSON_IsArray(j)) {
        int n = cJSON_GetArraySize(j);
        jlist_t *l = jlist_new(NULL, a, JL_LIST, (size_t)n);
        uint16_t dmax = 0;
        for (const cJSON *x = j->child; x; x = x->next) {
            jv_t v;
            if (from_cjson(a, x, text, ns, &v, depth + 1, err)) return -1;
            l->v[l->n++] = v;
            if (depth_of(v) > dmax) dmax = depth_of(v);
        }
        l->h.depth = (uint16_t)(dmax + 1);
        *out = jv_list(l);
    } else if (cJSON_IsObject(j)) {
        jdict_t *d = jdict_new(NULL, a, false);
        for (const cJSON *x = j->child; x; x = x->next) {
            if (!ju_valid(x->string, strlen(x->string))) return err_set(err, "a JSON key is not valid UTF-8");
            jv_t v;
            if (from_cjson(a, x, text, ns, &v, depth + 1, err)) return -1;
            // a repeated key keeps the last value, in the first key's place (as json.loads)
            dict_set_in(NULL, a, d, jstr_new(NULL, a, x->string, strlen(x->string)), v);
        }
        uint16_t dmax = 0;
        for (size_t i = 0; i < d->n; i++)
            if (depth_of(d->v[i]) > dmax) dmax = depth_of(d->v[i]);
        d->h.depth = (uint16_t)(dmax + 1);
        *out = jv_dict(d);
    } else {
        return err_set(err, "unsupported JSON value");
    }
    return 0;
}

int jv_from_cjson(jarena_t *a, const cJSON *j, const char *text, size_t len, jv_t *out, char *err) {
    numscan_t ns = {0};
    int rc = text ? scan_numbers(text, len, &ns, err) : 0;
    if (!rc) rc = from_cjson(a, j, text, &ns, out, 0, err);
    if (!rc && text && ns.i != ns.n) rc = err_set(err, "JSON numbers could not be matched to the text");
    free(ns.start);
    free(ns.is_float);
    return rc;
}

// --- Python semantics --------------------------------------------------------------------------
const char *jv_type_name(jv_t v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v.fl & JV_MARKUP ? "Markup" : "str";
    case JV_LIST:
        switch (v.u.l->kind) {
        case JL_TUPLE: return "tuple";
        case JL_GEN: return "generator";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_RANGE: return "range";
        default: return "list";
        }
    case JV_DICT: return v.u.d->ns ? "Namespace" : "dict";
    case JV_FUNC: return v.u.fn->kind == JF_MACRO ? "Macro" : "function";
    case JV_LOOP: return "LoopContext";
    default: return "?";
    }
}

bool jv_is_str(jv_t v) { return v.t == JV_STR; }

bool jv_truthy(jv_t v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE:
    case JV_MISSING: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->len > 0;
    case JV_LIST: return v.u.l->kind == JL_GEN || v.u.l->n > 0;
    case JV_DICT: return v.u.d->ns || v.u.d->n > 0;
    default: return true;
    }
}

size_t jv_len_or(jv_t v, bool *ok) {
    *ok = true;
    switch (v.t) {
    case JV_UNDEF: return 0;
    case JV_STR: return v.u.s->nch;
    case JV_LIST:
        if (v.u.l->kind == JL_GEN) break;
        return v.u.l->n;
    case JV_DICT:
        if (v.u.d->ns) break;
        return v.u.d->n;
    default: break;
    }
    *ok = false;
    return 0;
}

static bool is_num(jv_t v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double num_f(jv_t v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t num_i(jv_t v) { return v.t == JV_INT ? v.u.i : (int64_t)v.u.b; }

// Compares numbers exactly (an int64 and a double, as Python does): <0, 0, >0; 2 when unordered.
static int num_cmp(jv_t a, jv_t b) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y;
    }
    double x = num_f(a), y = num_f(b);
    if (isnan(x) || isnan(y)) return 2;
    if (a.t != JV_FLOAT && fabs(y) < 9.2e18 && y == floor(y)) {
        int64_t yi = (int64_t)y, xi = num_i(a);
        return xi < yi ? -1 : xi > yi;
    }
    if (b.t != JV_FLOAT && fabs(x) < 9.2e18 && x == floor(x)) {
        int64_t xi = (int64_t)x, yi = num_i(b);
        return xi < yi ? -1 : xi > yi;
    }
    return x < y ? -1 : x > y;
}

int jv_eq(jctx_t *c, jv_t a, jv_t b) {
    if (is_num(a) && is_num(b)) return num_cmp(a, b) == 0;
    if (a.t != b.t) return 0;
    if (c) c->steps++; // comparing is work: a loop of large comparisons ends at max_steps
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR:
        if (c) c->steps += (long)(a.u.s->len >> 6);
        return a.u.s->len == b.u.s->len && !memcmp(a.u.s->p, b.u.s->p, a.u.s->len);
    case JV_LIST: {
        jlist_t *x = a.u.l, *y = b.u.l;
        if (x == y) return 1;
        if (x->kind != y->kind || x->kind == JL_GEN || x->n != y->n) return 0;
        if (c) c->steps += (long)x->n;
        for (size_t i = 0; i < x->n; i++)
            if (!jv_eq(c, x->v[i], y->v[i])) return 0;
        return 1;
    }
    case JV_DICT: {
        jdict_t *x = a.u.d, *y = b.u.d;
        if (x == y) return 1;
        if (x->ns || y->ns || x->n != y->n) return 0;
        if (c) c->steps += (long)x->n;
        for (size_t i = 0; i < x->n; i++) {
            jv_t *o = jdict_find(y, x->k[i]->p, x->k[i]->len);
            if (!o || !jv_eq(c, x->v[i], *o)) return 0;
        }
        return 1;
    }
    default: return a.u.o == b.u.o;
    }
}

int jv_cmp(jctx_t *c, const jnode_t *at, jv_t a, jv_t b, int *out) {
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jv_t u = a.t == JV_UNDEF ? a : b;
        return jerr(c, at, "%s", u.u.s ? u.u.s->p : "an undefined value cannot be compared");
    }
    if (is_num(a) && is_num(b)) {
        int r = num_cmp(a, b);
        *out = r == 2 ? 2 : r;
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        c->steps += (long)(n >> 6);
        int r = memcmp(a.u.s->p, b.u.s->p, n);
        *out = r ? (r < 0 ? -1 : 1) : (a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len);
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == JL_LIST || a.u.l->kind == JL_TUPLE)) {
        jlist_t *x = a.u.l, *y = b.u.l;
        for (size_t i = 0; i < x->n && i < y->n; i++) {
            if (jv_eq(c, x->v[i], y->v[i])) continue;
            return jv_cmp(c, at, x->v[i], y->v[i], out);
        }
        *out = x->n < y->n ? -1 : x->n > y->n;
        return 0;
    }
    return jerr(c, at, "'%s' and '%s' cannot be ordered", jv_type_name(a), jv_type_name(b));
}

// --- buffers -----------------------------------------------------------------------------------
void jbuf_init(jbuf_t *b) { memset(b, 0, sizeof *b); }

static void unlink_obj(jobj_t *o) {
    o->prev->next = o->next;
    o->next->prev = o->prev;
}

static void link_obj(jctx_t *c, jobj_t *o) {
    o->next = c->live.next;
    o->prev = &c->live;
    c->live.next->prev = o;
    c->live.next = o;
}

// Makes room for n more bytes (and the NUL): limits, charging, the live list.
static int grow(jctx_t *c, jbuf_t *b, size_t n) {
    if (c->failed) return -1;
    if (b->len + n > c->lim.max_output)
        return jfatal(c, NULL, "the output (or a string) would exceed %zu bytes (limit)", c->lim.max_output);
    if (b->len + n + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap : 240;
    while (nc < b->len + n + 1) nc *= 2;
    if (b->o) unlink_obj(b->o);
    jobj_t *o = xrealloc(b->o, sizeof(jobj_t) + nc);
    if (!b->o) {
        memset(o, 0, sizeof *o);
        o->rc = 1;
        o->type = JV_MISSING;
    }
    link_obj(c, o);
    o->charge = sizeof(jobj_t) + nc;
    charge(c, nc - b->cap + (b->o ? 0 : sizeof(jobj_t)));
    b->o = o;
    b->p = (char *)(o + 1);
    b->cap = nc;
    return c->failed ? -1 : 0;
}

int jbuf_put(jctx_t *c, jbuf_t *b, const char *s, size_t n) {
    if (grow(c, b, n)) return -1;
    memcpy(b->p + b->len, s, n);
    c->steps += (long)(n >> 6);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int jbuf_reserve(jctx_t *c, jbuf_t *b, size_t n) { return grow(c, b, n); }

int jbuf_putc(jctx_t *c, jbuf_t *b, char ch) { return jbuf_put(c, b, &ch, 1); }

int jbuf_printf(jctx_t *c, jbuf_t *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    return jbuf_put(c, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

void jbuf_free(jctx_t *c, jbuf_t *b) {
    if (b->o) {
        unlink_obj(b->o);
        c->mem -= b->o->charge;
        free(b->o);
    }
    jbuf_init(b);
}

jv_t jbuf_take_str(jctx_t *c, jbuf_t *b) {
    jv_t v = jv_str(c, b->p ? b->p : "", b->len);
    jbuf_free(c, b);
    return v;
}

int jbuf_finish(jctx_t *c, jbuf_t *b, int rc, uint8_t fl, jv_t *out) {
    if (rc) {
        jbuf_free(c, b);
        return -1;
    }
    *out = jbuf_take_str(c, b);
    out->fl = fl;
    return c->failed ? -1 : 0;
}

// --- printing ----------------------------------------------------------------------------------
void jfmt_float(double f, char *out, size_t n) {
    if (isnan(f)) {
        snprintf(out, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, n, f < 0 ? "-inf" : "inf");
        return;
    }
    // the shortest digits that read back as f (Python's repr), then Python's layout: positional
    // for exponents -4..15, scientific otherwise
    char buf[40];
    double a = fabs(f);
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, a);
        if (strtod(buf, NULL) == a) break;
    }
    char digits[24];
    int nd = 0;
    char *e = strchr(buf, 'e');
    for (char *p = buf; p < e; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp = atoi(e + 1);
    const char *sign = signbit(f) ? "-" : "";
    if (a == 0) {
        snprintf(out, n, "%s0.0", sign);
        return;
    }
    if (exp >= -4 && exp < 16) {
        char r[64];
        int o = 0;
        if (exp < 0) {
            r[o++] = '0';
            r[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) r[o++] = '0';
            for (int i = 0; i < nd; i++) r[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) r[o++] = i < nd ? digits[i] : '0';
            r[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) r[o++] = digits[i];
            else r[o++] = '0';
        }
        r[o] = 0;
        snprintf(out, n, "%s%s", sign, r);
    } else {
        char mant[32];
        if (nd == 1) snprintf(mant, sizeof mant, "%c", digits[0]);
        else snprintf(mant, sizeof mant, "%c.%s", digits[0], digits + 1);
        snprintf(out, n, "%s%se%c%02d", sign, mant, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static int repr_str(jctx_t *c, const jstr_t *s, jbuf_t *b) {
    bool has_sq = memchr(s->p, '\'', s->len) != NULL, has_dq = memchr(s->p, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    if (jbuf_putc(c, b, q)) return -1;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        uint32_t cp = ju_decode(s->p, s->len, &i);
        int rc;
        if (cp == (uint32_t)q || cp == '\\') {
            char e[2] = {'\\', (char)cp};
            rc = jbuf_put(c, b, e, 2);
        } else if (cp == '\t') rc = jbuf_put(c, b, "\\t", 2);
        else if (cp == '\n') rc = jbuf_put(c, b, "\\n", 2);
        else if (cp == '\r') rc = jbuf_put(c, b, "\\r", 2);
        else if (cp < 0x20 || cp == 0x7f) rc = jbuf_printf(c, b, "\\x%02x", cp);
        else if (cp < 0x7f || ju_printable(cp)) rc = jbuf_put(c, b, s->p + st, i - st);
        else if (cp < 0x100) rc = jbuf_printf(c, b, "\\x%02x", cp);
        else if (cp < 0x10000) rc = jbuf_printf(c, b, "\\u%04x", cp);
        else rc = jbuf_printf(c, b, "\\U%08x", cp);
        if (rc) return -1;
    }
    return jbuf_putc(c, b, q);
}

static int repr_seq(jctx_t *c, const jnode_t *at, const jlist_t *l, jbuf_t *b, const char *open, const char *close) {
    if (jbuf_put(c, b, open, strlen(open))) return -1;
    for (size_t i = 0; i < l->n; i++) {
        if (i && jbuf_put(c, b, ", ", 2)) return -1;
        if (jv_repr(c, at, l->v[i], b)) return -1;
    }
    if (l->kind == JL_TUPLE && l->n == 1 && jbuf_putc(c, b, ',')) return -1;
    return jbuf_put(c, b, close, strlen(close));
}

int jv_repr(jctx_t *c, const jnode_t *at, jv_t v, jbuf_t *b) {
    switch (v.t) {
    case JV_UNDEF: return jbuf_put(c, b, "Undefined", 9);
    case JV_STR:
        if (v.fl & JV_MARKUP) {
            if (jbuf_put(c, b, "Markup(", 7) || repr_str(c, v.u.s, b)) return -1;
            return jbuf_putc(c, b, ')');
        }
        return repr_str(c, v.u.s, b);
    case JV_LIST:
        switch (v.u.l->kind) {
        case JL_LIST: return repr_seq(c, at, v.u.l, b, "[", "]");
        case JL_TUPLE: return repr_seq(c, at, v.u.l, b, "(", ")");
        case JL_ITEMS: return repr_seq(c, at, v.u.l, b, "dict_items([", "])");
        case JL_KEYS: return repr_seq(c, at, v.u.l, b, "dict_keys([", "])");
        case JL_VALUES: return repr_seq(c, at, v.u.l, b, "dict_values([", "])");
        default: return jerr(c, at, "printing a %s is not supported (convert it with |list)", jv_type_name(v));
        }
    case JV_DICT: {
        jdict_t *d = v.u.d;
        if (d->ns && jbuf_put(c, b, "<Namespace ", 11)) return -1;
        if (jbuf_putc(c, b, '{')) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (i && jbuf_put(c, b, ", ", 2)) return -1;
            if (repr_str(c, d->k[i], b) || jbuf_put(c, b, ": ", 2) || jv_repr(c, at, d->v[i], b)) return -1;
        }
        if (jbuf_putc(c, b, '}')) return -1;
        return d->ns ? jbuf_putc(c, b, '>') : 0;
    }
    case JV_FUNC:
    case JV_LOOP: return jerr(c, at, "printing a %s is not supported", jv_type_name(v));
    default: return jv_to_str(c, at, v, b);
    }
}

int jv_to_str(jctx_t *c, const jnode_t *at, jv_t v, jbuf_t *b) {
    char num[40];
    switch (v.t) {
    case JV_UNDEF:
    case JV_MISSING: return 0;
    case JV_NONE: return jbuf_put(c, b, "None", 4);
    case JV_BOOL: return v.u.b ? jbuf_put(c, b, "True", 4) : jbuf_put(c, b, "False", 5);
    case JV_INT: return jbuf_printf(c, b, "%lld", (long long)v.u.i);
    case JV_FLOAT: jfmt_float(v.u.f, num, sizeof num); return jbuf_put(c, b, num, strlen(num));
    case JV_STR: return jbuf_put(c, b, v.u.s->p, v.u.s->len);
    default: return jv_repr(c, at, v, b);
    }
}

int jv_stringify(jctx_t *c, const jnode_t *at, jv_t v, jv_t *out) {
    if (v.t == JV_STR) {
        *out = jv_ref(v);
        return 0;
    }
    jbuf_t b;
    jbuf_init(&b);
    if (jv_to_str(c, at, v, &b)) {
        jbuf_free(c, &b);
        return -1;
    }
    *out = jbuf_take_str(c, &b);
    return 0;
}

// --- json.dumps --------------------------------------------------------------------------------
static int json_str(jctx_t *c, const jstr_t *s, bool ascii, jbuf_t *b) {
    if (jbuf_putc(c, b, '"')) return -1;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        uint32_t cp = ju_decode(s->p, s->len, &i);
        int rc;
        switch (cp) {
        case '"': rc = jbuf_put(c, b, "\\\"", 2); break;
        case '\\': rc = jbuf_put(c, b, "\\\\", 2); break;
        case '\n': rc = jbuf_put(c, b, "\\n", 2); break;
        case '\r': rc = jbuf_put(c, b, "\\r", 2); break;
        case '\t': rc = jbuf_put(c, b, "\\t", 2); break;
        case '\b': rc = jbuf_put(c, b, "\\b", 2); break;
        case '\f': rc = jbuf_put(c, b, "\\f", 2); break;
        default:
            if (cp < 0x20 || (ascii && cp == 0x7f)) rc = jbuf_printf(c, b, "\\u%04x", cp);
            else if (!ascii || cp < 0x80) rc = jbuf_put(c, b, s->p + st, i - st);
            else if (cp < 0x10000) rc = jbuf_printf(c, b, "\\u%04x", cp);
            else {
                uint32_t x = cp - 0x10000;
                rc = jbuf_printf(c, b, "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
            }
        }
        if (rc) return -1;
    }
    return jbuf_putc(c, b, '"');
}

static int json_newline(jctx_t *c, const jjson_opts_t *o, jbuf_t *b, int level) {
    if (jbuf_putc(c, b, '\n')) return -1;
    for (int i = 0; i < level; i++)
        if (jbuf_put(c, b, o->indent, strlen(o->indent))) return -1;
    return 0;
}

// Orders entry indexes by their keys (code point order, as sort_keys does).
static int cmp_keys(const void *x, const void *y, void *keys) {
    jstr_t *const *k = keys;
    const jstr_t *a = k[*(const size_t *)x], *b = k[*(const size_t *)y];
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->p, b->p, n);
    return r ? r : (a->len < b->len ? -1 : a->len > b->len);
}

int jv_tojson(jctx_t *c, const jnode_t *at, jv_t v, const jjson_opts_t *o, jbuf_t *b, int level) {
    const char *isep = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    char num[40];
    if (jstep(c, at)) return -1;
    switch (v.t) {
    case JV_NONE: return jbuf_put(c, b, "null", 4);
    case JV_BOOL: return v.u.b ? jbuf_put(c, b, "true", 4) : jbuf_put(c, b, "false", 5);
    case JV_INT: return jbuf_printf(c, b, "%lld", (long long)v.u.i);
    case JV_FLOAT:
        if (isnan(v.u.f)) return jbuf_put(c, b, "NaN", 3);
        if (isinf(v.u.f)) return v.u.f < 0 ? jbuf_put(c, b, "-Infinity", 9) : jbuf_put(c, b, "Infinity", 8);
        jfmt_float(v.u.f, num, sizeof num);
        return jbuf_put(c, b, num, strlen(num));
    case JV_STR: return json_str(c, v.u.s, o->ensure_ascii, b);
    case JV_LIST: {
        jlist_t *l = v.u.l;
        if (l->kind != JL_LIST && l->kind != JL_TUPLE)
            return jerr(c, at, "Object of type %s is not JSON serializable", jv_type_name(v));
        if (!l->n) return jbuf_put(c, b, "[]", 2);
        if (jbuf_putc(c, b, '[')) return -1;
        if (o->indent && json_newline(c, o, b, level + 1)) return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i) {
                if (jbuf_put(c, b, isep, strlen(isep))) return -1;
                if (o->indent && json_newline(c, o, b, level + 1)) return -1;
            }
            if (jv_tojson(c, at, l->v[i], o, b, level + 1)) return -1;
        }
        if (o->indent && json_newline(c, o, b, level)) return -1;
        return jbuf_putc(c, b, ']');
    }
    case JV_DICT: {
        jdict_t *d = v.u.d;
        if (d->ns) return jerr(c, at, "Object of type Namespace is not JSON serializable");
        if (!d->n) return jbuf_put(c, b, "{}", 2);
        size_t *order = xmalloc(d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) qsort_r(order, d->n, sizeof *order, cmp_keys, d->k);
        int rc = jbuf_putc(c, b, '{');
        if (!rc && o->indent) rc = json_newline(c, o, b, level + 1);
        for (size_t i = 0; !rc && i < d->n; i++) {
            if (i) {
                rc = jbuf_put(c, b, isep, strlen(isep));
                if (!rc && o->indent) rc = json_newline(c, o, b, level + 1);
            }
            if (!rc) rc = json_str(c, d->k[order[i]], o->ensure_ascii, b);
            if (!rc) rc = jbuf_put(c, b, ksep, strlen(ksep));
            if (!rc) rc = jv_tojson(c, at, d->v[order[i]], o, b, level + 1);
        }
        if (!rc && o->indent) rc = json_newline(c, o, b, level);
        if (!rc) rc = jbuf_putc(c, b, '}');
        free(order);
        return rc;
    }
    default: return jerr(c, at, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

// --- iteration ---------------------------------------------------------------------------------
int jv_iterate(jctx_t *c, const jnode_t *at, jv_t v, jlist_t **out) { return jv_iterate_lazy(c, at, v, false, out); }

int jv_iterate_lazy(jctx_t *c, const jnode_t *at, jv_t v, bool keep_errors, jlist_t **out) {
    switch (v.t) {
    case JV_UNDEF: *out = jlist_new(c, NULL, JL_LIST, 0); return 0;
    case JV_LIST:
        if (v.u.l->kind == JL_GEN) {
            jlist_t *g = v.u.l;
            jlist_t *l = jlist_new(c, NULL, JL_LIST, g->n - g->pos);
            *out = l;
            for (size_t i = g->pos; i < g->n; i++) {
                if (g->v[i].t == JV_ERROR) {
                    g->pos = i + 1;
                    if (!keep_errors) return jraise(c, g->v[i]);
                    l->v[l->n++] = jv_ref(g->v[i]);
                    return c->failed ? -1 : 0;
                }
                l->v[l->n++] = jv_ref(g->v[i]);
            }
            l->h.depth = g->h.depth;
            c->steps += (long)((g->n - g->pos) >> 4);
            g->pos = g->n;
            return c->failed ? -1 : 0;
        }
        jv_ref(v);
        *out = v.u.l;
        return 0;
    case JV_DICT: {
        if (v.u.d->ns) break;
        jlist_t *l = jlist_new(c, NULL, JL_LIST, v.u.d->n);
        c->steps += (long)(v.u.d->n >> 4);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jv_t k = {.t = JV_STR};
            k.u.s = v.u.d->k[i];
            l->v[l->n++] = jv_ref(k);
        }
        *out = l;
        return c->failed ? -1 : 0;
    }
    case JV_STR: {
        jstr_t *s = v.u.s;
        jlist_t *l = jlist_new(c, NULL, JL_LIST, s->nch);
        c->steps += (long)(s->nch >> 4);
        for (size_t i = 0; i < s->len && !c->failed;) {
            size_t st = i;
            ju_decode(s->p, s->len, &i);
            jv_t ch = jv_str(c, s->p + st, i - st);
            ch.fl = v.fl;
            l->v[l->n++] = ch;
        }
        *out = l;
        return c->failed ? -1 : 0;
    }
    default: break;
    }
    return jerr(c, at, "'%s' object is not iterable", jv_type_name(v));
}

// --- UTF-8 -------------------------------------------------------------------------------------
size_t ju_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

size_t ju_offset(const char *s, size_t len, size_t idx) {
    size_t i = 0;
    while (i < len && idx > 0) {
        i++;
        while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        idx--;
    }
    return i;
}

uint32_t ju_decode(const char *s, size_t len, size_t *i) {
    const unsigned char *p = (const unsigned char *)s;
    size_t k = *i;
    unsigned char b = p[k];
    int n = b < 0x80 ? 0 : (b & 0xE0) == 0xC0 ? 1 : (b & 0xF0) == 0xE0 ? 2 : (b & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0 || k + (size_t)n >= len + (n == 0)) {
        *i = k + 1;
        return n == 0 ? b : 0xFFFD;
    }
    uint32_t cp = n == 0 ? b : n == 1 ? (b & 0x1Fu) : n == 2 ? (b & 0x0Fu) : (b & 0x07u);
    for (int j = 1; j <= n; j++) {
        if ((p[k + (size_t)j] & 0xC0) != 0x80) {
            *i = k + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (p[k + (size_t)j] & 0x3Fu);
    }
    *i = k + (size_t)n + 1;
    return cp;
}

int ju_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool ju_valid(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned char b = p[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int n;
        uint32_t min;
        if ((b & 0xE0) == 0xC0) n = 1, min = 0x80;
        else if ((b & 0xF0) == 0xE0) n = 2, min = 0x800;
        else if ((b & 0xF8) == 0xF0) n = 3, min = 0x10000;
        else return false;
        if (i + (size_t)n >= len) return false;
        uint32_t cp = b & (n == 1 ? 0x1Fu : n == 2 ? 0x0Fu : 0x07u);
        for (int j = 1; j <= n; j++) {
            if ((p[i + (size_t)j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + (size_t)j] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += (size_t)n + 1;
    }
    return true;
}

bool ju_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

uint32_t ju_upper(const jctx_t *c, uint32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    return c && c->loc ? (uint32_t)towupper_l((wint_t)cp, c->loc) : cp;
}

uint32_t ju_lower(const jctx_t *c, uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    return c && c->loc ? (uint32_t)towlower_l((wint_t)cp, c->loc) : cp;
}

bool ju_printable(uint32_t cp) {
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
        (cp >= 0x205F && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF)
        return false;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x180E) return false;
    if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB) || (cp & 0xFFFE) == 0xFFFE) return false;
    if (cp >= 0xE0000) return false;
    return true;
}

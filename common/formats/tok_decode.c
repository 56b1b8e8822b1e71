// tok_decode.c - decoders (see tok_decode.h).
#include "common/formats/tok_decode.h"

#include <stdlib.h>
#include <string.h>

#include "common/formats/tok_pattern.h"

typedef enum {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_METASPACE,
    TOK_DEC_SEQ,
} tok_dec_kind_t;

struct tok_decoder {
    tok_dec_kind_t kind;
    tok_pattern_t *pattern;  // Replace
    char *content;           // Replace
    size_t content_len;
    uint32_t cp;             // Strip content, Metaspace replacement
    int64_t start, stop;     // Strip
    bool drop_first;         // Metaspace: prepend_scheme is not "never"
    tok_decoder_t **children;
    int n_children;
    tok_decoder_t **leaves;  // Sequence at the top: every non-Sequence decoder below, in order
    int n_leaves;
};

void tok_decoder_destroy(tok_decoder_t **dp) {
    if (!dp || !*dp) return;
    tok_decoder_t *d = *dp;
    for (int i = 0; i < d->n_children; i++) tok_decoder_destroy(&d->children[i]);
    free(d->children);
    free(d->leaves);
    tok_pattern_destroy(&d->pattern);
    free(d->content);
    free(d);
    *dp = NULL;
}

// A string holding exactly one character, as the Rust library's char fields.
static int tok_json_char(const cJSON *j, const char *key, uint32_t *cp, const char *where, const char *what,
                         char *err) {
    const char *s;
    if (tok_json_str(j, key, NULL, &s, where, err) != 0) return -1;
    size_t n = s ? strlen(s) : 0;
    bool ok = false;
    if (!n || tok_utf8_next((const uint8_t *)s, n, cp, &ok) != n || !ok)
        return err_set(err, "%s (%s) needs \"%s\", a single character", where, what, key);
    return 0;
}

static int tok_decoder_count_leaves(const tok_decoder_t *d) {
    if (d->kind != TOK_DEC_SEQ) return 1;
    int n = 0;
    for (int i = 0; i < d->n_children; i++) n += tok_decoder_count_leaves(d->children[i]);
    return n;
}

static void tok_decoder_collect_leaves(tok_decoder_t *root, tok_decoder_t *d) {
    if (d->kind != TOK_DEC_SEQ) {
        root->leaves[root->n_leaves++] = d;
        return;
    }
    for (int i = 0; i < d->n_children; i++) tok_decoder_collect_leaves(root, d->children[i]);
}

tok_decoder_t *tok_decoder_parse(const cJSON *j, const char *where, int depth, char *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsObject(j) || !cJSON_IsString(type)) {
        err_set(err, "%s must be null or an object with a string \"type\"", where);
        return NULL;
    }
    if (depth >= TOK_MAX_DEPTH) {
        err_set(err, "%s: decoders nested more than %d deep", where, TOK_MAX_DEPTH);
        return NULL;
    }
    const char *ty = type->valuestring;
    tok_decoder_t *d = xcalloc(1, sizeof *d);
    char sub[160];
    static const char *const k_type[] = {"type", NULL};
    if (!strcmp(ty, "ByteLevel")) {
        // Its options only concern offsets and the pre-tokenizer; decoding ignores them.
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        if (tok_json_keys(j, where, ty, k, err)) goto fail;
        d->kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(ty, "Replace")) {
        static const char *const k[] = {"type", "pattern", "content", NULL};
        const char *s;
        if (tok_json_keys(j, where, ty, k, err) || tok_json_str(j, "content", NULL, &s, where, err)) goto fail;
        if (!s || !tok_utf8_valid(s, strlen(s), NULL)) {
            err_set(err, "%s (Replace) needs a string \"content\" (UTF-8)", where);
            goto fail;
        }
        d->kind = TOK_DEC_REPLACE;
        d->content = xstrdup(s);
        d->content_len = strlen(s);
        d->pattern = tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                       tok_where(sub, sizeof sub, where, "pattern", 0), err);
        if (!d->pattern) goto fail;
    } else if (!strcmp(ty, "ByteFallback") || !strcmp(ty, "Fuse")) {
        if (tok_json_keys(j, where, ty, k_type, err)) goto fail;
        d->kind = ty[0] == 'B' ? TOK_DEC_BYTEFALLBACK : TOK_DEC_FUSE;
    } else if (!strcmp(ty, "Strip")) {
        static const char *const k[] = {"type", "content", "start", "stop", NULL};
        if (tok_json_keys(j, where, ty, k, err) || tok_json_char(j, "content", &d->cp, where, ty, err) ||
            tok_json_uint(j, "start", 0, 1 << 20, &d->start, where, err) ||
            tok_json_uint(j, "stop", 0, 1 << 20, &d->stop, where, err))
            goto fail;
        d->kind = TOK_DEC_STRIP;
    } else if (!strcmp(ty, "Metaspace")) {
        static const char *const k[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                        "str_rep", NULL};
        const char *scheme;
        bool aps, split;
        if (tok_json_keys(j, where, ty, k, err) || tok_json_char(j, "replacement", &d->cp, where, ty, err) ||
            tok_json_str(j, "prepend_scheme", NULL, &scheme, where, err) ||
            tok_json_bool(j, "add_prefix_space", true, &aps, where, err) ||
            tok_json_bool(j, "split", true, &split, where, err))
            goto fail;
        if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never")) {
            err_set(err, "%s.prepend_scheme %.20s is not always, first or never", where, scheme);
            goto fail;
        }
        if (!aps && scheme && strcmp(scheme, "never")) {
            err_set(err, "%s: add_prefix_space=false contradicts prepend_scheme %s", where, scheme);
            goto fail;
        }
        d->kind = TOK_DEC_METASPACE;
        d->drop_first = aps && !(scheme && !strcmp(scheme, "never"));
    } else if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "decoders", NULL};
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders"), *it;
        if (tok_json_keys(j, where, ty, k, err)) goto fail;
        if (!cJSON_IsArray(list)) {
            err_set(err, "%s (Sequence) needs a \"decoders\" array", where);
            goto fail;
        }
        d->kind = TOK_DEC_SEQ;
        d->children = xcalloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *d->children);
        char base[160];
        tok_where(base, sizeof base, where, "decoders", 0);
        cJSON_ArrayForEach(it, list) {
            d->children[d->n_children] =
                tok_decoder_parse(it, tok_where(sub, sizeof sub, base, NULL, d->n_children), depth + 1, err);
            if (!d->children[d->n_children]) goto fail;
            d->n_children++;
        }
    } else {
        err_set(err, "%s: decoder %.40s is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                     "Metaspace, Sequence)",
                where, ty);
        goto fail;
    }
    if (depth == 0 && d->kind == TOK_DEC_SEQ) {
        d->leaves = xcalloc((size_t)tok_decoder_count_leaves(d) + 1, sizeof *d->leaves);
        tok_decoder_collect_leaves(d, d);
    }
    return d;
fail:
    tok_decoder_destroy(&d);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Per-token rewriting

// Byte-level characters back to bytes; a token with any other character stays as it is.
static void tok_bytelevel_bytes(const char *s, size_t n, tok_buf_t *out) {
    size_t mark = out->n;
    tok_buf_reserve(out, n);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool ok;
        i += tok_utf8_next((const uint8_t *)s + i, n - i, &cp, &ok);
        int b = ok ? tok_cp_byte(cp) : -1;
        if (b < 0) {
            out->n = mark;
            tok_buf_add(out, s, n);
            return;
        }
        out->p[out->n++] = (char)b;
    }
}

// The byte of a "<0xNN>" token, or -1.
static int tok_fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

// Every `cp` in s becomes a space, or is dropped with drop.
static void tok_metaspace_text(const char *s, size_t n, uint32_t cp, bool drop, tok_buf_t *out) {
    for (size_t i = 0; i < n;) {
        uint32_t c;
        bool ok;
        size_t l = tok_utf8_next((const uint8_t *)s + i, n - i, &c, &ok);
        if (ok && c == cp) {
            if (!drop) tok_buf_addc(out, ' ');
        } else {
            tok_buf_add(out, s + i, l);
        }
        i += l;
    }
}

// Strip: up to start leading and stop trailing characters equal to cp.
static void tok_strip_text(const char *s, size_t n, uint32_t cp, int64_t start, int64_t stop, tok_buf_t *out) {
    size_t a = 0, b = n;
    for (int64_t k = 0; k < start && a < n; k++) {
        uint32_t c;
        bool ok;
        size_t l = tok_utf8_next((const uint8_t *)s + a, n - a, &c, &ok);
        if (c != cp) break;
        a += l;
    }
    for (int64_t k = 0; k < stop && b > 0; k++) {
        size_t at = tok_utf8_last(s, b);
        uint32_t c;
        bool ok;
        tok_utf8_next((const uint8_t *)s + at, b - at, &c, &ok);
        if (c != cp) break;
        b = at;
    }
    if (b > a) tok_buf_add(out, s + a, b - a);
}

// One leaf decoder's rewriting of one token, appended to out.
static int tok_decoder_leaf_token(const tok_decoder_t *d, const char *s, size_t n, tok_buf_t *out, tok_work_t *w,
                                  char *err) {
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL:
        tok_bytelevel_bytes(s, n, out);
        return 0;
    case TOK_DEC_REPLACE:
        return tok_pattern_replace(d->pattern, s, n, d->content, d->content_len, out, w, err);
    case TOK_DEC_BYTEFALLBACK: {
        int b = tok_fallback_byte(s, n);
        if (b >= 0)
            tok_buf_addc(out, (char)b);
        else
            tok_buf_add(out, s, n);
        return 0;
    }
    case TOK_DEC_METASPACE:
        tok_metaspace_text(s, n, d->cp, false, out);
        return 0;
    case TOK_DEC_FUSE:
    case TOK_DEC_STRIP:
    case TOK_DEC_SEQ:
        break;
    }
    tok_buf_add(out, s, n);
    return 0;
}

int tok_decoder_token(const tok_decoder_t *d, const char *s, size_t n, tok_buf_t *out, tok_work_t *w, char *err) {
    if (d->kind != TOK_DEC_SEQ) return tok_decoder_leaf_token(d, s, n, out, w, err);
    // The leaves in order, through two scratch buffers taken in turn.
    const char *src = s;
    size_t len = n;
    int k = 0;
    for (int i = 0; i < d->n_leaves; i++) {
        tok_buf_t *dst = (k++ & 1) ? &w->tmp2 : &w->tmp;
        dst->n = 0;
        if (tok_decoder_leaf_token(d->leaves[i], src, len, dst, w, err) != 0) return -1;
        src = dst->p;
        len = dst->n;
    }
    tok_buf_add(out, src, len);
    return 0;
}

// ---------------------------------------------------------------------------------------
// The chain

static int tok_decoder_step(const tok_decoder_t *d, tok_buf_t *arena, tok_pieces_t *in, tok_pieces_t *out,
                            tok_work_t *w, char *err) {
    out->n = 0;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL: {
        // All tokens' bytes, then one string with ill-formed UTF-8 replaced.
        w->tmp.n = 0;
        for (size_t i = 0; i < in->n; i++) tok_bytelevel_bytes(arena->p + in->v[i].off, in->v[i].len, &w->tmp);
        size_t start = arena->n;
        tok_buf_add_lossy(arena, w->tmp.p, w->tmp.n);
        tok_pieces_push(out, start, arena->n - start, false);
        return 0;
    }
    case TOK_DEC_FUSE: {
        size_t start = arena->n, total = 0;
        for (size_t i = 0; i < in->n; i++) total += in->v[i].len;
        tok_buf_reserve(arena, total);
        for (size_t i = 0; i < in->n; i++) tok_buf_add(arena, arena->p + in->v[i].off, in->v[i].len);
        tok_pieces_push(out, start, arena->n - start, false);
        return 0;
    }
    case TOK_DEC_BYTEFALLBACK: {
        w->tmp.n = 0;  // the pending run of bytes
        for (size_t i = 0; i <= in->n; i++) {
            int b = i < in->n ? tok_fallback_byte(arena->p + in->v[i].off, in->v[i].len) : -1;
            if (b >= 0) {
                tok_buf_addc(&w->tmp, (char)b);
                continue;
            }
            if (w->tmp.n) {
                // A run that is not UTF-8 gives one U+FFFD per byte, as the Rust library does.
                if (tok_utf8_valid(w->tmp.p, w->tmp.n, NULL)) {
                    size_t start = arena->n;
                    tok_buf_add(arena, w->tmp.p, w->tmp.n);
                    tok_pieces_push(out, start, w->tmp.n, false);
                } else {
                    for (size_t k = 0; k < w->tmp.n; k++) {
                        size_t start = arena->n;
                        tok_buf_add(arena, "\xEF\xBF\xBD", 3);
                        tok_pieces_push(out, start, 3, false);
                    }
                }
                w->tmp.n = 0;
            }
            if (i < in->n) tok_pieces_push(out, in->v[i].off, in->v[i].len, false);
        }
        return 0;
    }
    case TOK_DEC_REPLACE:
    case TOK_DEC_STRIP:
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            // The token is copied first: appending to the arena may move it.
            w->tmp.n = 0;
            tok_buf_add(&w->tmp, arena->p + in->v[i].off, in->v[i].len);
            size_t start = arena->n;
            if (d->kind == TOK_DEC_REPLACE) {
                if (tok_pattern_replace(d->pattern, w->tmp.p, w->tmp.n, d->content, d->content_len, arena, w, err))
                    return -1;
            } else if (d->kind == TOK_DEC_STRIP) {
                tok_strip_text(w->tmp.p, w->tmp.n, d->cp, d->start, d->stop, arena);
            } else {
                tok_metaspace_text(w->tmp.p, w->tmp.n, d->cp, i == 0 && d->drop_first, arena);
            }
            tok_pieces_push(out, start, arena->n - start, false);
        }
        return 0;
    case TOK_DEC_SEQ:
        break;
    }
    return err_set(err, "decoder: unexpected kind");
}

static int tok_decoder_chain(const tok_decoder_t *d, tok_buf_t *arena, tok_pieces_t *toks, tok_work_t *w,
                             char *err) {
    if (d->kind == TOK_DEC_SEQ) {
        for (int i = 0; i < d->n_children; i++)
            if (tok_decoder_chain(d->children[i], arena, toks, w, err) != 0) return -1;
        return 0;
    }
    if (tok_decoder_step(d, arena, toks, &w->pieces2, w, err) != 0) return -1;
    tok_pieces_t t = *toks;
    *toks = w->pieces2;
    w->pieces2 = t;
    return 0;
}

int tok_decoder_run(const tok_decoder_t *d, tok_buf_t *arena, tok_pieces_t *toks, tok_buf_t *out, tok_work_t *w,
                    char *err) {
    if (tok_decoder_chain(d, arena, toks, w, err) != 0) return -1;
    for (size_t i = 0; i < toks->n; i++) tok_buf_add(out, arena->p + toks->v[i].off, toks->v[i].len);
    return 0;
}

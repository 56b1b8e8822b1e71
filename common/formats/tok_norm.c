// tok_norm.c - normalizers (see tok_norm.h). Each rewrites a whole piece of text; Unicode
// normalization forms come from utf8proc, the rest follows the Rust library's code.
#include "common/formats/tok_norm.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/formats/tok_pattern.h"

typedef enum {
    TOK_NORM_UNICODE,  // utf8proc form in .form
    TOK_NORM_LOWER,
    TOK_NORM_STRIP,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
    TOK_NORM_SEQ,
} tok_norm_kind_t;

struct tok_norm {
    tok_norm_kind_t kind;
    int form;                 // utf8proc_option_t
    bool left, right;         // Strip
    char *str;                // Prepend text, Replace content
    size_t str_len;
    tok_pattern_t *pattern;   // Replace
    tok_norm_t **children;    // Sequence
    int n_children;
};

void tok_norm_destroy(tok_norm_t **np) {
    if (!np || !*np) return;
    tok_norm_t *n = *np;
    for (int i = 0; i < n->n_children; i++) tok_norm_destroy(&n->children[i]);
    free(n->children);
    free(n->str);
    tok_pattern_destroy(&n->pattern);
    free(n);
    *np = NULL;
}

tok_norm_t *tok_norm_parse(const cJSON *j, const char *where, int depth, char *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsObject(j) || !cJSON_IsString(type)) {
        err_set(err, "%s must be null or an object with a string \"type\"", where);
        return NULL;
    }
    if (depth >= TOK_MAX_DEPTH) {
        err_set(err, "%s: normalizers nested more than %d deep", where, TOK_MAX_DEPTH);
        return NULL;
    }
    const char *ty = type->valuestring;
    tok_norm_t *n = xcalloc(1, sizeof *n);
    char sub[160];
    static const char *const k_type[] = {"type", NULL};
    if (!strcmp(ty, "NFC") || !strcmp(ty, "NFD") || !strcmp(ty, "NFKC") || !strcmp(ty, "NFKD")) {
        if (tok_json_keys(j, where, ty, k_type, err) != 0) goto fail;
        n->kind = TOK_NORM_UNICODE;
        bool compat = ty[2] == 'K', compose = ty[strlen(ty) - 1] == 'C';
        n->form = UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) | (compat ? UTF8PROC_COMPAT : 0);
    } else if (!strcmp(ty, "Lowercase")) {
        if (tok_json_keys(j, where, ty, k_type, err) != 0) goto fail;
        n->kind = TOK_NORM_LOWER;
    } else if (!strcmp(ty, "Strip")) {
        static const char *const k[] = {"type", "strip_left", "strip_right", NULL};
        if (tok_json_keys(j, where, ty, k, err) != 0 ||
            tok_json_bool(j, "strip_left", false, &n->left, where, err) != 0 ||
            tok_json_bool(j, "strip_right", false, &n->right, where, err) != 0)
            goto fail;
        n->kind = TOK_NORM_STRIP;
    } else if (!strcmp(ty, "Prepend")) {
        static const char *const k[] = {"type", "prepend", NULL};
        const char *s;
        if (tok_json_keys(j, where, ty, k, err) != 0 || tok_json_str(j, "prepend", NULL, &s, where, err) != 0)
            goto fail;
        if (!s || !tok_utf8_valid(s, strlen(s), NULL)) {
            err_set(err, "%s (Prepend) needs \"prepend\", a UTF-8 string", where);
            goto fail;
        }
        n->kind = TOK_NORM_PREPEND;
        n->str = xstrdup(s);
        n->str_len = strlen(s);
    } else if (!strcmp(ty, "Replace")) {
        static const char *const k[] = {"type", "pattern", "content", NULL};
        const char *s;
        if (tok_json_keys(j, where, ty, k, err) != 0 || tok_json_str(j, "content", NULL, &s, where, err) != 0)
            goto fail;
        if (!s || !tok_utf8_valid(s, strlen(s), NULL)) {
            err_set(err, "%s (Replace) needs \"content\", a UTF-8 string", where);
            goto fail;
        }
        n->kind = TOK_NORM_REPLACE;
        n->str = xstrdup(s);
        n->str_len = strlen(s);
        n->pattern = tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                       tok_where(sub, sizeof sub, where, "pattern", 0), err);
        if (!n->pattern) goto fail;
    } else if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "normalizers", NULL};
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers"), *it;
        if (tok_json_keys(j, where, ty, k, err) != 0) goto fail;
        if (!cJSON_IsArray(list)) {
            err_set(err, "%s (Sequence) needs a \"normalizers\" array", where);
            goto fail;
        }
        n->kind = TOK_NORM_SEQ;
        n->children = xcalloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *n->children);
        char base[160];
        tok_where(base, sizeof base, where, "normalizers", 0);
        cJSON_ArrayForEach(it, list) {
            n->children[n->n_children] =
                tok_norm_parse(it, tok_where(sub, sizeof sub, base, NULL, n->n_children), depth + 1, err);
            if (!n->children[n->n_children]) goto fail;
            n->n_children++;
        }
    } else {
        err_set(err, "%s: normalizer %.40s is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                     "Prepend, Replace, Sequence)",
                where, ty);
        goto fail;
    }
    return n;
fail:
    tok_norm_destroy(&n);
    return NULL;
}

static bool tok_all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return false;
    return true;
}

int tok_norm_apply(const tok_norm_t *n, const char *s, size_t len, tok_buf_t *out, tok_work_t *w, char *err) {
    out->n = 0;
    switch (n->kind) {
    case TOK_NORM_UNICODE: {
        if (tok_all_ascii(s, len)) {  // every form leaves ASCII as it is
            tok_buf_add(out, s, len);
            return 0;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                          (utf8proc_option_t)n->form);
        if (r < 0) return err_set(err, "Unicode normalization failed: %s", utf8proc_errmsg(r));
        tok_buf_add(out, dst, (size_t)r);
        free(dst);
        return 0;
    }
    case TOK_NORM_LOWER:
        for (size_t i = 0; i < len;) {
            uint8_t c = (uint8_t)s[i];
            if (c < 0x80) {
                tok_buf_addc(out, (char)(c >= 'A' && c <= 'Z' ? c + 32 : c));
                i++;
                continue;
            }
            uint32_t cp;
            bool ok;
            i += tok_utf8_next((const uint8_t *)s + i, len - i, &cp, &ok);
            if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping
                tok_buf_add(out, "i\xCC\x87", 3);
                continue;
            }
            tok_buf_add_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        }
        return 0;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = len;
        while (n->left && a < b) {
            uint32_t cp;
            bool ok;
            size_t l = tok_utf8_next((const uint8_t *)s + a, b - a, &cp, &ok);
            if (!tok_is_whitespace(cp)) break;
            a += l;
        }
        while (n->right && b > a) {
            size_t at = a + tok_utf8_last(s + a, b - a);
            uint32_t cp;
            bool ok;
            tok_utf8_next((const uint8_t *)s + at, b - at, &cp, &ok);
            if (!tok_is_whitespace(cp)) break;
            b = at;
        }
        tok_buf_add(out, s + a, b - a);
        return 0;
    }
    case TOK_NORM_PREPEND:
        if (len) tok_buf_add(out, n->str, n->str_len);
        tok_buf_add(out, s, len);
        return 0;
    case TOK_NORM_REPLACE:
        return tok_pattern_replace(n->pattern, s, len, n->str, n->str_len, out, w, err);
    case TOK_NORM_SEQ: {
        tok_buf_t cur = {0};
        tok_buf_add(&cur, s, len);
        for (int i = 0; i < n->n_children; i++) {
            if (tok_norm_apply(n->children[i], cur.p, cur.n, out, w, err) != 0) {
                tok_buf_free(&cur);
                return -1;
            }
            tok_buf_t t = cur;
            cur = *out;
            *out = t;
        }
        tok_buf_t t = *out;
        *out = cur;
        tok_buf_free(&t);
        return 0;
    }
    }
    return err_set(err, "normalizer: unknown kind");
}

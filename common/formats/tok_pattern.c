// tok_pattern.c - String and Regex patterns of tokenizer.json, Regex run with PCRE2 (see
// tok_pattern.h for what is rewritten and what is refused).
#include "common/formats/tok_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tok_pattern {
    pcre2_code *re;  // NULL for a literal
    char *lit;
    size_t lit_len;
};

void tok_pattern_destroy(tok_pattern_t **pp) {
    if (!pp || !*pp) return;
    pcre2_code_free((*pp)->re);
    free((*pp)->lit);
    free(*pp);
    *pp = NULL;
}

// Oniguruma's (Unicode) classes spelled for PCRE2; *_IN go inside [...].
#define ONIG_WORD_IN "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define ONIG_HEX_IN "0-9A-Fa-f"

// Rewrites an Oniguruma pattern for PCRE2. Returns 0, or -1 naming what cannot be rewritten.
static int tok_regex_translate(const char *src, tok_buf_t *out, const char *where, char *err) {
    size_t n = strlen(src);
    bool in_class = false;
    size_t class_start = 0;  // position after '[' or "[^" (a ']' there is a literal)
    for (size_t i = 0; i < n;) {
        char c = src[i];
        if (c == '\\') {
            if (i + 1 >= n) return err_set(err, "%s: regex ends with a lone backslash", where);
            char e = src[i + 1];
            const char *rep = NULL;
            switch (e) {
            case 's': rep = "\\p{White_Space}"; break;
            case 'S': rep = "\\P{White_Space}"; break;
            case 'd': rep = "\\p{Nd}"; break;
            case 'D': rep = "\\P{Nd}"; break;
            case 'w': rep = in_class ? ONIG_WORD_IN : "[" ONIG_WORD_IN "]"; break;
            case 'h': rep = in_class ? ONIG_HEX_IN : "[" ONIG_HEX_IN "]"; break;
            case 'W':
            case 'H':
                if (in_class)
                    return err_set(err, "%s: regex: \\%c inside a character class is not supported", where, e);
                rep = e == 'W' ? "[^" ONIG_WORD_IN "]" : "[^" ONIG_HEX_IN "]";
                break;
            default: break;
            }
            if (rep) {
                tok_buf_add(out, rep, strlen(rep));
                i += 2;
                continue;
            }
            if (e == 'u') {
                size_t k = 0;
                while (k < 4 && i + 2 + k < n && strchr("0123456789abcdefABCDEF", src[i + 2 + k]) && src[i + 2 + k])
                    k++;
                if (k != 4) return err_set(err, "%s: regex: \\u must be followed by four hex digits", where);
                tok_buf_add(out, "\\x{", 3);
                tok_buf_add(out, src + i + 2, 4);
                tok_buf_addc(out, '}');
                i += 6;
                continue;
            }
            // Any other escape means the same in both; copy it with its whole character.
            size_t l = 1;
            while (i + 1 + l < n && ((uint8_t)src[i + 1 + l] & 0xC0) == 0x80) l++;
            tok_buf_add(out, src + i, 1 + l);
            i += 1 + l;
            continue;
        }
        if (in_class) {
            if (c == ']' && i > class_start) {
                in_class = false;
            } else if (c == '[') {
                if (i + 1 < n && src[i + 1] == ':') {
                    const char *end = strstr(src + i + 2, ":]");
                    if (!end) return err_set(err, "%s: regex: unterminated [: in a character class", where);
                    tok_buf_add(out, src + i, (size_t)(end + 2 - (src + i)));
                    i = (size_t)(end + 2 - src);
                    continue;
                }
                return err_set(err, "%s: regex: nested character classes are not supported", where);
            } else if (c == '&' && i + 1 < n && src[i + 1] == '&') {
                return err_set(err, "%s: regex: character-class intersection (&&) is not supported", where);
            }
        } else if (c == '[') {
            in_class = true;
            class_start = i + 1;
            if (class_start < n && src[class_start] == '^') class_start++;
            tok_buf_add(out, src + i, class_start - i);
            i = class_start;
            continue;
        }
        tok_buf_addc(out, c);
        i++;
    }
    if (in_class) return err_set(err, "%s: regex: unterminated character class", where);
    tok_buf_addc(out, 0);
    return 0;
}

tok_pattern_t *tok_pattern_regex(const char *src, const char *where, char *err) {
    tok_buf_t pat = {0};
    if (tok_regex_translate(src, &pat, where, err) != 0) {
        tok_buf_free(&pat);
        return NULL;
    }
    int code;
    PCRE2_SIZE at;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        tok_buf_free(&pat);
        err_set(err, "%s: out of memory compiling the regex", where);
        return NULL;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat.p, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &code, &at, cc);
    pcre2_compile_context_free(cc);
    tok_buf_free(&pat);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        err_set(err, "%s: regex does not compile: %s (near offset %zu of \"%.60s\")", where, (const char *)msg,
                (size_t)at, src);
        return NULL;
    }
    // JIT when the platform has it; PCRE2's interpreter otherwise (same results). The valgrind
    // build leaves it out: memcheck cannot follow JIT-compiled code and reports its reads.
#ifndef MARLAAS_NO_PCRE2_JIT
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
#endif
    tok_pattern_t *p = xcalloc(1, sizeof *p);
    p->re = re;
    return p;
}

tok_pattern_t *tok_pattern_parse(const cJSON *j, const char *where, char *err) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "Regex");
    if (!cJSON_IsObject(j) || cJSON_GetArraySize(j) != 1 || !(cJSON_IsString(s) || cJSON_IsString(r))) {
        err_set(err, "%s must be {\"String\": \"...\"} or {\"Regex\": \"...\"}", where);
        return NULL;
    }
    if (r) return tok_pattern_regex(r->valuestring, where, err);
    size_t len = strlen(s->valuestring);
    if (!tok_utf8_valid(s->valuestring, len, NULL)) {
        err_set(err, "%s: the String is not valid UTF-8", where);
        return NULL;
    }
    tok_pattern_t *p = xcalloc(1, sizeof *p);
    p->lit = xstrdup(s->valuestring);
    p->lit_len = len;
    return p;
}

// The next match at or after `from`: 1 with [*ms, *me), 0 when there is none, -1 on error.
static int tok_pattern_find(const tok_pattern_t *p, const char *s, size_t n, size_t from, size_t *ms, size_t *me,
                            tok_work_t *w, char *err) {
    if (!p->re) {
        if (!p->lit_len || from > n) return 0;
        const char *hit = memmem(s + from, n - from, p->lit, p->lit_len);
        if (!hit) return 0;
        *ms = (size_t)(hit - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    if (!w->match_data) {
        w->match_data = pcre2_match_data_create(1, NULL);
        if (!w->match_data) return err_set(err, "out of memory for regex match data");
    }
    pcre2_match_data *md = w->match_data;
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
        rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return err_set(err, "regex match failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > ov[1] || ov[1] > n) return err_set(err, "regex match failed: \\K gave a backwards match");
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

// Calls fn for each match in find_iter order; returns -1 on error.
typedef int (*tok_match_fn)(void *ctx, size_t ms, size_t me);

static int tok_pattern_each(const tok_pattern_t *p, const char *s, size_t n, tok_match_fn fn, void *ctx,
                            tok_work_t *w, char *err) {
    size_t from = 0;
    while (from <= n) {
        size_t ms, me;
        int rc = tok_pattern_find(p, s, n, from, &ms, &me, w, err);
        if (rc < 0) return -1;
        if (rc == 0) break;
        if (fn(ctx, ms, me) != 0) return -1;
        if (me > ms) {
            from = me;
        } else {
            // An empty match: step over one character so the scan moves on.
            if (ms >= n) break;
            uint32_t cp;
            bool ok;
            from = ms + tok_utf8_next((const uint8_t *)s + ms, n - ms, &cp, &ok);
        }
    }
    return 0;
}

typedef struct {
    tok_segs_t *segs;
    size_t prev;
    bool invert;
} tok_seg_ctx_t;

static int tok_seg_add(void *ctx, size_t ms, size_t me) {
    tok_seg_ctx_t *c = ctx;
    if (ms > c->prev) tok_segs_push(c->segs, c->prev, ms, c->invert);
    tok_segs_push(c->segs, ms, me, !c->invert);
    c->prev = me;
    return 0;
}

int tok_pattern_segments(const tok_pattern_t *p, const char *s, size_t n, bool invert, tok_segs_t *segs,
                         tok_work_t *w, char *err) {
    segs->n = 0;
    if (n == 0) {
        tok_segs_push(segs, 0, 0, invert);
        return 0;
    }
    tok_seg_ctx_t c = {segs, 0, invert};
    if (tok_pattern_each(p, s, n, tok_seg_add, &c, w, err) != 0) return -1;
    if (c.prev < n) tok_segs_push(segs, c.prev, n, invert);
    return 0;
}

typedef struct {
    const char *s, *with;
    size_t with_len, prev;
    tok_buf_t *out;
} tok_repl_ctx_t;

static int tok_repl_add(void *ctx, size_t ms, size_t me) {
    tok_repl_ctx_t *c = ctx;
    tok_buf_add(c->out, c->s + c->prev, ms - c->prev);
    tok_buf_add(c->out, c->with, c->with_len);
    c->prev = me;
    return 0;
}

int tok_pattern_replace(const tok_pattern_t *p, const char *s, size_t n, const char *with, size_t with_len,
                        tok_buf_t *out, tok_work_t *w, char *err) {
    tok_repl_ctx_t c = {s, with, with_len, 0, out};
    if (n && tok_pattern_each(p, s, n, tok_repl_add, &c, w, err) != 0) return -1;
    tok_buf_add(out, s + c.prev, n - c.prev);
    return 0;
}

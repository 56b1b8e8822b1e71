// tok_pretok.c - pre-tokenizers (see tok_pretok.h). Every splitting pre-tokenizer is a match
// list (tok_seg_t segments covering the piece) folded by a split behavior, as the Rust
// library's NormalizedString::split does.
#include "common/formats/tok_pretok.h"

#include <stdlib.h>
#include <string.h>

#include "common/formats/tok_pattern.h"

typedef enum {
    TOK_PRE_BYTELEVEL,
    TOK_PRE_SPLIT,
    TOK_PRE_METASPACE,
    TOK_PRE_DIGITS,
    TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT,
    TOK_PRE_SEQ,
} tok_pre_kind_t;

typedef enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_t;

typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_t;

struct tok_pretok {
    tok_pre_kind_t kind;
    tok_pattern_t *pattern;   // Split, Whitespace, ByteLevel with use_regex
    tok_split_t behavior;     // Split
    bool invert;              // Split
    bool add_prefix_space;    // ByteLevel
    bool individual;          // Digits
    uint32_t repl_cp;         // Metaspace replacement character
    char repl[4];
    size_t repl_len;
    tok_prepend_t prepend;
    bool split;               // Metaspace
    tok_pretok_t **children;  // Sequence
    int n_children;
};

// The Rust library's built-in patterns. GPT-2's (ByteLevel) is Oniguruma syntax; Whitespace's
// is the regex crate's \w+|[^\w\s]+, spelled with the Unicode properties it stands for.
#define TOK_GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define TOK_RE_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
#define TOK_WHITESPACE_REGEX "[" TOK_RE_WORD "]+|[^" TOK_RE_WORD "\\p{White_Space}]+"

void tok_pretok_destroy(tok_pretok_t **pp) {
    if (!pp || !*pp) return;
    tok_pretok_t *p = *pp;
    for (int i = 0; i < p->n_children; i++) tok_pretok_destroy(&p->children[i]);
    free(p->children);
    tok_pattern_destroy(&p->pattern);
    free(p);
    *pp = NULL;
}

static int tok_pretok_behavior(const cJSON *j, const char *where, tok_split_t *out, char *err) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!cJSON_IsString(b)) return err_set(err, "%s (Split) needs a string \"behavior\"", where);
    for (int i = 0; i < 5; i++)
        if (!strcmp(b->valuestring, names[i])) {
            *out = (tok_split_t)i;
            return 0;
        }
    return err_set(err, "%s.behavior %.40s is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                        "Contiguous",
                   where, b->valuestring);
}

static int tok_pretok_metaspace(tok_pretok_t *p, const cJSON *j, const char *where, char *err) {
    static const char *const k[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep",
                                    NULL};
    const char *repl, *scheme;
    bool has_aps = false, aps = false;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    if (tok_json_keys(j, where, "Metaspace", k, err) != 0 || tok_json_str(j, "replacement", NULL, &repl, where, err) ||
        tok_json_str(j, "prepend_scheme", NULL, &scheme, where, err) ||
        tok_json_bool(j, "split", true, &p->split, where, err) ||
        tok_json_bool(j, "add_prefix_space", true, &aps, where, err))
        return -1;
    has_aps = v && !cJSON_IsNull(v);
    uint32_t cp;
    bool ok;
    size_t rl = repl ? strlen(repl) : 0;
    if (!rl || tok_utf8_next((const uint8_t *)repl, rl, &cp, &ok) != rl || !ok)
        return err_set(err, "%s (Metaspace) needs \"replacement\", a single character", where);
    p->repl_cp = cp;
    memcpy(p->repl, repl, rl);
    p->repl_len = rl;
    // As the Rust library reads it: prepend_scheme when given (default "always"), and an older
    // add_prefix_space=false means "never" (it must not contradict a given scheme).
    p->prepend = TOK_PREPEND_ALWAYS;
    if (scheme) {
        if (!strcmp(scheme, "always")) p->prepend = TOK_PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first")) p->prepend = TOK_PREPEND_FIRST;
        else if (!strcmp(scheme, "never")) p->prepend = TOK_PREPEND_NEVER;
        else return err_set(err, "%s.prepend_scheme %.20s is not always, first or never", where, scheme);
    }
    if (has_aps && !aps) {
        if (scheme && p->prepend != TOK_PREPEND_NEVER)
            return err_set(err, "%s: add_prefix_space=false contradicts prepend_scheme %s", where, scheme);
        p->prepend = TOK_PREPEND_NEVER;
    }
    return 0;
}

tok_pretok_t *tok_pretok_parse(const cJSON *j, const char *where, int depth, char *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsObject(j) || !cJSON_IsString(type)) {
        err_set(err, "%s must be null or an object with a string \"type\"", where);
        return NULL;
    }
    if (depth >= TOK_MAX_DEPTH) {
        err_set(err, "%s: pre-tokenizers nested more than %d deep", where, TOK_MAX_DEPTH);
        return NULL;
    }
    const char *ty = type->valuestring;
    tok_pretok_t *p = xcalloc(1, sizeof *p);
    char sub[160];
    if (!strcmp(ty, "ByteLevel")) {
        // trim_offsets only moves offsets, which we do not report.
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        bool use_regex, trim;
        if (tok_json_keys(j, where, ty, k, err) || tok_json_bool(j, "add_prefix_space", true, &p->add_prefix_space, where, err) ||
            tok_json_bool(j, "use_regex", true, &use_regex, where, err) ||
            tok_json_bool(j, "trim_offsets", true, &trim, where, err))
            goto fail;
        p->kind = TOK_PRE_BYTELEVEL;
        if (use_regex && !(p->pattern = tok_pattern_regex(TOK_GPT2_REGEX, where, err))) goto fail;
    } else if (!strcmp(ty, "Split")) {
        static const char *const k[] = {"type", "pattern", "behavior", "invert", NULL};
        if (tok_json_keys(j, where, ty, k, err) || tok_pretok_behavior(j, where, &p->behavior, err) ||
            tok_json_bool(j, "invert", false, &p->invert, where, err))
            goto fail;
        p->kind = TOK_PRE_SPLIT;
        p->pattern = tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                       tok_where(sub, sizeof sub, where, "pattern", 0), err);
        if (!p->pattern) goto fail;
    } else if (!strcmp(ty, "Metaspace")) {
        p->kind = TOK_PRE_METASPACE;
        if (tok_pretok_metaspace(p, j, where, err) != 0) goto fail;
    } else if (!strcmp(ty, "Digits")) {
        static const char *const k[] = {"type", "individual_digits", NULL};
        if (tok_json_keys(j, where, ty, k, err) || tok_json_bool(j, "individual_digits", false, &p->individual, where, err))
            goto fail;
        p->kind = TOK_PRE_DIGITS;
    } else if (!strcmp(ty, "Whitespace") || !strcmp(ty, "WhitespaceSplit")) {
        static const char *const k[] = {"type", NULL};
        if (tok_json_keys(j, where, ty, k, err)) goto fail;
        p->kind = ty[10] ? TOK_PRE_WHITESPACE_SPLIT : TOK_PRE_WHITESPACE;
        if (p->kind == TOK_PRE_WHITESPACE && !(p->pattern = tok_pattern_regex(TOK_WHITESPACE_REGEX, where, err)))
            goto fail;
    } else if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "pretokenizers", NULL};
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers"), *it;
        if (tok_json_keys(j, where, ty, k, err)) goto fail;
        if (!cJSON_IsArray(list)) {
            err_set(err, "%s (Sequence) needs a \"pretokenizers\" array", where);
            goto fail;
        }
        p->kind = TOK_PRE_SEQ;
        p->children = xcalloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *p->children);
        char base[160];
        tok_where(base, sizeof base, where, "pretokenizers", 0);
        cJSON_ArrayForEach(it, list) {
            p->children[p->n_children] =
                tok_pretok_parse(it, tok_where(sub, sizeof sub, base, NULL, p->n_children), depth + 1, err);
            if (!p->children[p->n_children]) goto fail;
            p->n_children++;
        }
    } else {
        err_set(err, "%s: pre-tokenizer %.40s is not supported (supported: ByteLevel, Split, Metaspace, Digits, "
                     "Whitespace, WhitespaceSplit, Sequence)",
                where, ty);
        goto fail;
    }
    return p;
fail:
    tok_pretok_destroy(&p);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Splitting

// Segments of s where each character satisfying pred is a match of its own (the Rust
// library's Pattern for Fn(char) -> bool).
static void tok_char_segs(const char *s, size_t n, bool (*pred)(uint32_t, uint32_t), uint32_t arg, tok_segs_t *segs) {
    segs->n = 0;
    if (n == 0) {
        tok_segs_push(segs, 0, 0, false);
        return;
    }
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool ok;
        size_t l = tok_utf8_next((const uint8_t *)s + i, n - i, &cp, &ok);
        if (pred(cp, arg)) {
            if (last < i) tok_segs_push(segs, last, i, false);
            tok_segs_push(segs, i, i + l, true);
            last = i + l;
        }
        i += l;
    }
    if (last < n) tok_segs_push(segs, last, n, false);
}

static bool tok_pred_space(uint32_t cp, uint32_t arg) {
    (void)arg;
    return tok_is_whitespace(cp);
}

static bool tok_pred_numeric(uint32_t cp, uint32_t arg) {
    (void)arg;
    return tok_is_numeric(cp);
}

static bool tok_pred_equal(uint32_t cp, uint32_t arg) {
    return cp == arg;
}

// Folds the segments by the behavior and appends the non-empty pieces (offsets relative to
// base) to out.
static void tok_split_emit(tok_segs_t *segs, tok_split_t b, size_t base, bool at_start, tok_segs_t *acc,
                           tok_pieces_t *out) {
    acc->n = 0;
    bool prev = false;
    switch (b) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < segs->n; i++) tok_segs_push(acc, segs->v[i].start, segs->v[i].end, false);
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < segs->n; i++)
            if (!segs->v[i].match) tok_segs_push(acc, segs->v[i].start, segs->v[i].end, false);
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < segs->n; i++) {
            tok_seg_t s = segs->v[i];
            if (s.match == prev && acc->n)
                acc->v[acc->n - 1].end = s.end;
            else
                tok_segs_push(acc, s.start, s.end, false);
            prev = s.match;
        }
        break;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < segs->n; i++) {
            tok_seg_t s = segs->v[i];
            if (s.match && !prev && acc->n)
                acc->v[acc->n - 1].end = s.end;
            else
                tok_segs_push(acc, s.start, s.end, false);
            prev = s.match;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT:
        // Built back to front, so acc holds the pieces in reverse order.
        for (size_t i = segs->n; i-- > 0;) {
            tok_seg_t s = segs->v[i];
            if (s.match && !prev && acc->n)
                acc->v[acc->n - 1].start = s.start;
            else
                tok_segs_push(acc, s.start, s.end, false);
            prev = s.match;
        }
        for (size_t i = 0, j = acc->n; i < --j; i++) {
            tok_seg_t t = acc->v[i];
            acc->v[i] = acc->v[j];
            acc->v[j] = t;
        }
        break;
    }
    for (size_t i = 0; i < acc->n; i++)
        if (acc->v[i].end > acc->v[i].start)
            tok_pieces_push(out, base + acc->v[i].start, acc->v[i].end - acc->v[i].start,
                            at_start && acc->v[i].start == 0);
}

// ---------------------------------------------------------------------------------------
// Applying

static int tok_pretok_leaf(const tok_pretok_t *p, tok_buf_t *arena, const tok_piece_t *in, tok_pieces_t *out,
                           tok_work_t *w, char *err) {
    size_t off = in->off, len = in->len;
    switch (p->kind) {
    case TOK_PRE_SPLIT:
        if (tok_pattern_segments(p->pattern, arena->p + off, len, p->invert, &w->segs, w, err) != 0) return -1;
        tok_split_emit(&w->segs, p->behavior, off, in->at_start, &w->segs2, out);
        return 0;
    case TOK_PRE_WHITESPACE:
        if (tok_pattern_segments(p->pattern, arena->p + off, len, true, &w->segs, w, err) != 0) return -1;
        tok_split_emit(&w->segs, TOK_SPLIT_REMOVED, off, in->at_start, &w->segs2, out);
        return 0;
    case TOK_PRE_WHITESPACE_SPLIT:
        tok_char_segs(arena->p + off, len, tok_pred_space, 0, &w->segs);
        tok_split_emit(&w->segs, TOK_SPLIT_REMOVED, off, in->at_start, &w->segs2, out);
        return 0;
    case TOK_PRE_DIGITS:
        tok_char_segs(arena->p + off, len, tok_pred_numeric, 0, &w->segs);
        tok_split_emit(&w->segs, p->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, off, in->at_start,
                       &w->segs2, out);
        return 0;
    case TOK_PRE_METASPACE: {
        // Spaces become the replacement, then the replacement may be prepended; the rewritten
        // piece is appended to the arena.
        size_t start = arena->n;
        tok_buf_reserve(arena, (len + 1) * 4);  // arena->p stays put below
        const char *s = arena->p + off;
        // After the spaces are replaced, does the piece start with the replacement?
        bool starts = (len && s[0] == ' ') || (len >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0);
        if (!starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && in->at_start)))
            tok_buf_add(arena, p->repl, p->repl_len);
        for (size_t i = 0; i < len; i++) {
            if (s[i] == ' ')
                tok_buf_add(arena, p->repl, p->repl_len);
            else
                tok_buf_addc(arena, s[i]);
        }
        size_t n = arena->n - start;
        if (!p->split) {
            tok_pieces_push(out, start, n, in->at_start);
            return 0;
        }
        tok_char_segs(arena->p + start, n, tok_pred_equal, p->repl_cp, &w->segs);
        tok_split_emit(&w->segs, TOK_SPLIT_MERGED_NEXT, start, in->at_start, &w->segs2, out);
        return 0;
    }
    case TOK_PRE_BYTELEVEL: {
        if (p->add_prefix_space && (len == 0 || arena->p[off] != ' ')) {
            size_t start = arena->n;
            tok_buf_reserve(arena, len + 1);
            tok_buf_addc(arena, ' ');
            tok_buf_add(arena, arena->p + off, len);
            off = start;
            len += 1;
        }
        w->pieces2.n = 0;
        if (p->pattern) {
            if (tok_pattern_segments(p->pattern, arena->p + off, len, false, &w->segs, w, err) != 0) return -1;
            for (size_t i = 0; i < w->segs.n; i++)
                if (w->segs.v[i].end > w->segs.v[i].start)
                    tok_pieces_push(&w->pieces2, off + w->segs.v[i].start, w->segs.v[i].end - w->segs.v[i].start,
                                    in->at_start && w->segs.v[i].start == 0);
        } else if (len) {
            tok_pieces_push(&w->pieces2, off, len, in->at_start);
        }
        // Each byte becomes its character of the byte-level alphabet (one or two UTF-8 bytes).
        for (size_t i = 0; i < w->pieces2.n; i++) {
            tok_piece_t q = w->pieces2.v[i];
            size_t start = arena->n;
            tok_buf_reserve(arena, 2 * (size_t)q.len);
            const uint8_t *s = (const uint8_t *)arena->p + q.off;
            char *o = arena->p + arena->n;
            for (uint32_t k = 0; k < q.len; k++) {
                uint16_t cp = tok_byte_cp[s[k]];
                if (cp < 0x80) {
                    *o++ = (char)cp;
                } else {
                    *o++ = (char)(0xC0 | (cp >> 6));
                    *o++ = (char)(0x80 | (cp & 0x3F));
                }
            }
            arena->n = (size_t)(o - arena->p);
            tok_pieces_push(out, start, arena->n - start, q.at_start);
        }
        return 0;
    }
    case TOK_PRE_SEQ:
        break;
    }
    return err_set(err, "pre-tokenizer: unexpected kind");
}

int tok_pretok_apply(const tok_pretok_t *p, tok_buf_t *arena, tok_pieces_t *pieces, tok_work_t *w, char *err) {
    if (p->kind == TOK_PRE_SEQ) {
        for (int i = 0; i < p->n_children; i++)
            if (tok_pretok_apply(p->children[i], arena, pieces, w, err) != 0) return -1;
        return 0;
    }
    tok_pieces_t out = {0};
    // Output pieces go to a list of their own; ByteLevel also uses w->pieces2 internally.
    for (size_t i = 0; i < pieces->n; i++) {
        tok_piece_t in = pieces->v[i];
        if (tok_pretok_leaf(p, arena, &in, &out, w, err) != 0) {
            tok_pieces_free(&out);
            return -1;
        }
    }
    tok_pieces_free(pieces);
    *pieces = out;
    return 0;
}

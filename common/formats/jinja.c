// jinja.c - Jinja templates: the lexer and the parser (as Jinja2's, with Hugging Face's
// trim_blocks and lstrip_blocks), the variable sets, the public entry points (jinja.h).
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/jinja_int.h"

// --- arena -------------------------------------------------------------------------------------
typedef struct jarena_blk {
    struct jarena_blk *next;
    size_t used, cap;
    _Alignas(16) char data[];
} jarena_blk_t;

void *jarena_alloc(jarena_t *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    jarena_blk_t *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        b = xmalloc(sizeof *b + cap);
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strndup(jarena_t *a, const char *s, size_t n) {
    char *p = jarena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jarena_free(jarena_t *a) {
    for (jarena_blk_t *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    a->head = NULL;
}

// --- lexer -------------------------------------------------------------------------------------
typedef enum {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,       // op: the operator text (1 or 2 characters)
} tok_type_t;

typedef struct {
    uint8_t type;
    char op[3];
    int line, col;
    const char *s;   // T_DATA, T_NAME, T_STRING: the text (arena), s[len] == 0
    size_t len;
    int64_t i;
    double f;
} tok_t;

typedef struct {
    jarena_t *arena;
    const char *src;  // newlines normalized, one trailing newline dropped
    size_t n;
    size_t *line_starts;
    int nlines;
    tok_t *toks;
    int ntok, cap;
    char *err;
    size_t lc_pos;    // the last position turned into line:column, to count on from it
    int lc_line, lc_col;
} lexer_t;

static void pos_lc(lexer_t *L, size_t pos, int *line, int *col) {
    int lo = 0, hi = L->nlines - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (L->line_starts[mid] <= pos) lo = mid;
        else hi = mid - 1;
    }
    *line = lo + 1;
    // positions mostly grow: count the characters from the last one on the same line
    if (L->lc_line == lo + 1 && L->lc_pos <= pos)
        *col = L->lc_col + (int)ju_count(L->src + L->lc_pos, pos - L->lc_pos);
    else
        *col = (int)ju_count(L->src + L->line_starts[lo], pos - L->line_starts[lo]) + 1;
    L->lc_pos = pos;
    L->lc_line = *line;
    L->lc_col = *col;
}

static int lex_fail(lexer_t *L, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lex_fail(lexer_t *L, size_t pos, const char *fmt, ...) {
    int line, col;
    pos_lc(L, pos, &line, &col);
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(L->err, "%d:%d: %s", line, col, msg);
}

static tok_t *tok_push(lexer_t *L, uint8_t type, size_t pos) {
    if (L->ntok == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 256;
        L->toks = xrealloc(L->toks, (size_t)L->cap * sizeof *L->toks);
    }
    tok_t *t = &L->toks[L->ntok++];
    memset(t, 0, sizeof *t);
    t->type = type;
    pos_lc(L, pos, &t->line, &t->col);
    return t;
}

// Python's \s (Unicode whitespace) at s[i]: the byte length of the character, 0 when not space.
static size_t space_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t j = i;
    uint32_t cp = ju_decode(s, n, &j);
    return ju_isspace(cp) ? j - i : 0;
}

static size_t skip_spaces(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = space_at(s, n, i)) > 0) i += k;
    return i;
}

// Python str.rstrip(): the length of s[0..len) without trailing Unicode whitespace.
static size_t rstrip_len(const char *s, size_t len) {
    size_t end = len;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t j = st;
        if (!ju_isspace(ju_decode(s, len, &j))) break;
        end = st;
    }
    return end;
}

// Emits the text before a tag, with the tag's whitespace control applied: '-' strips all
// whitespace before it; otherwise lstrip_blocks removes spaces and tabs between the start of
// the line and a block or comment tag ('+' turns that off).
static void emit_data(lexer_t *L, size_t from, size_t to, char sign, bool lstrip, bool line_starting) {
    const char *t = L->src + from;
    size_t len = to - from;
    if (sign == '-') {
        len = rstrip_len(t, len);
    } else if (sign != '+' && lstrip) {
        size_t l_pos = len;
        while (l_pos > 0 && t[l_pos - 1] != '\n') l_pos--;
        if (l_pos > 0 || line_starting) {
            bool blank = true;
            for (size_t i = l_pos; i < len; i++)
                if (t[i] != ' ' && t[i] != '\t') blank = false;
            if (blank) len = l_pos;
        }
    }
    if (len == 0) return;
    tok_t *tk = tok_push(L, T_DATA, from);
    tk->s = jarena_strndup(L->arena, t, len);
    tk->len = len;
}

static bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_name_char(char ch) { return is_name_start(ch) || (ch >= '0' && ch <= '9'); }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

// A string literal's body with Python's escapes (Jinja decodes with "unicode-escape"): \n \t \r
// \\ \' \" \a \b \f \v, \xHH, \uHHHH, \UHHHHHHHH, octal \OOO, backslash-newline; an unknown escape
// stays as written.
static int lex_string(lexer_t *L, size_t start, size_t *pos_io) {
    const char *s = L->src;
    char q = s[start];
    size_t i = start + 1;
    size_t end = i;
    while (end < L->n && s[end] != q) {
        if (s[end] == '\\' && end + 1 < L->n) end++;
        end++;
    }
    if (end >= L->n) return lex_fail(L, start, "unterminated string literal");
    char *out = jarena_alloc(L->arena, end - i + 1);
    size_t o = 0;
    while (i < end) {
        if (s[i] != '\\') {
            out[o++] = s[i++];
            continue;
        }
        char e = s[i + 1];
        i += 2;
        uint32_t cp = 0;
        int nhex = 0;
        switch (e) {
        case 'n': out[o++] = '\n'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'r': out[o++] = '\r'; continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'v': out[o++] = '\v'; continue;
        case '\n': continue;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N': return lex_fail(L, i - 2, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < end && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                goto put_cp;
            }
            out[o++] = '\\';
            i--;   // the character after the backslash is kept as it is
            continue;
        }
        for (int k = 0; k < nhex; k++) {
            int h = i < end ? hexval(s[i]) : -1;
            if (h < 0) return lex_fail(L, i, "truncated \\%c escape in a string literal", e);
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
    put_cp:
        if (cp == 0) return lex_fail(L, i, "NUL characters in string literals are not supported");
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return lex_fail(L, i, "escape \\%c in a string literal is not a Unicode scalar value", e);
        o += (size_t)ju_encode(cp, out + o);
    }
    out[o] = 0;
    tok_t *t = tok_push(L, T_STRING, start);
    t->s = out;
    t->len = o;
    *pos_io = end + 1;
    return 0;
}

// Numbers as Jinja's lexer reads them: floats (digits with '.' and/or an exponent, underscores
// between digits), integers (decimal, 0b, 0o, 0x). A float is not lexed right after a '.', so
// that foo.0.1 is two subscripts.
static int lex_number(lexer_t *L, size_t start, size_t *pos_io) {
    const char *s = L->src;
    size_t n = L->n, i = start;
    char buf[128];
    size_t bl = 0;
#define DIGITS(pred)                                                                  \
    do {                                                                              \
        while (i < n && (pred(s[i]) || (s[i] == '_' && i + 1 < n && pred(s[i + 1])))) { \
            if (s[i] != '_' && bl < sizeof buf - 1) buf[bl++] = s[i];                 \
            i++;                                                                      \
        }                                                                             \
    } while (0)
    if (s[i] == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1])) {
        char b = (char)(s[i + 1] | 0x20);
        int base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        i += 2;
        int64_t v = 0;
        size_t nd = 0;
        while (i < n) {
            if (s[i] == '_') { i++; continue; }
            int d = hexval(s[i]);
            if (d < 0 || d >= base) break;
            if (v > (INT64_MAX - d) / base) return lex_fail(L, start, "integer literal too large");
            v = v * base + d;
            nd++;
            i++;
        }
        if (!nd) return lex_fail(L, start, "malformed number");
        tok_t *t = tok_push(L, T_INT, start);
        t->i = v;
        *pos_io = i;
        return 0;
    }
    DIGITS(is_digit);
    bool is_float = false;
    bool after_dot = start > 0 && s[start - 1] == '.';
    if (!after_dot) {
        size_t save_i = i, save_bl = bl;
        if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
            buf[bl++] = '.';
            i++;
            DIGITS(is_digit);
            is_float = true;
        }
        if (i < n && (s[i] == 'e' || s[i] == 'E')) {
            size_t j = i + 1;
            if (j < n && (s[j] == '+' || s[j] == '-')) j++;
            if (j < n && is_digit(s[j])) {
                buf[bl++] = 'e';
                if (s[i + 1] == '-') buf[bl++] = '-';
                i = j;
                DIGITS(is_digit);
                is_float = true;
            }
        }
        if (!is_float) {
            i = save_i;
            bl = save_bl;
        }
    }
    buf[bl] = 0;
    if (is_float) {
        tok_t *t = tok_push(L, T_FLOAT, start);
        t->f = strtod(buf, NULL);
    } else {
        // Jinja's integer rule: a leading zero is only "0" (or 0_0...): "007" is three integers.
        if (buf[0] == '0') {
            i = start + 1;
            while (i + 1 < n && s[i] == '_' && s[i + 1] == '0') i += 2;
            buf[1] = 0;
        }
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE) return lex_fail(L, start, "integer literal too large");
        tok_t *t = tok_push(L, T_INT, start);
        t->i = v;
    }
    *pos_io = i;
    return 0;
#undef DIGITS
}

static const char *const OPS2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

// Lexes the inside of {{ }} or {% %} from *pos_io; emits the end token.
static int lex_tag(lexer_t *L, size_t *pos_io, bool block, bool *line_starting) {
    const char *s = L->src;
    size_t n = L->n, i = *pos_io;
    char stack[JINJA_MAX_NESTING];
    int depth = 0;
    for (;;) {
        if (i >= n) return lex_fail(L, i, "unexpected end of template: missing '%s'", block ? "%}" : "}}");
        if (depth == 0) {
            if (block) {
                if (!strncmp(s + i, "+%}", 3)) {
                    tok_push(L, T_BLOCK_END, i);
                    i += 3;
                    *line_starting = false;
                    break;
                }
                if (!strncmp(s + i, "-%}", 3)) {
                    tok_push(L, T_BLOCK_END, i);
                    size_t j = skip_spaces(s, n, i + 3);
                    *line_starting = j > i + 3 && s[j - 1] == '\n';
                    i = j;
                    break;
                }
                if (!strncmp(s + i, "%}", 2)) {
                    tok_push(L, T_BLOCK_END, i);
                    i += 2;
                    *line_starting = false;
                    if (i < n && s[i] == '\n') {   // trim_blocks
                        i++;
                        *line_starting = true;
                    }
                    break;
                }
            } else {
                if (!strncmp(s + i, "-}}", 3)) {
                    tok_push(L, T_VAR_END, i);
                    size_t j = skip_spaces(s, n, i + 3);
                    *line_starting = j > i + 3 && s[j - 1] == '\n';
                    i = j;
                    break;
                }
                if (!strncmp(s + i, "}}", 2)) {
                    tok_push(L, T_VAR_END, i);
                    i += 2;
                    *line_starting = false;
                    break;
                }
            }
        }
        size_t k = space_at(s, n, i);
        if (k) {
            i += k;
            continue;
        }
        char ch = s[i];
        if (is_digit(ch)) {
            if (lex_number(L, i, &i)) return -1;
            continue;
        }
        if (is_name_start(ch)) {
            size_t st = i;
            while (i < n && is_name_char(s[i])) i++;
            tok_t *t = tok_push(L, T_NAME, st);
            t->s = jarena_strndup(L->arena, s + st, i - st);
            t->len = i - st;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            if (lex_string(L, i, &i)) return -1;
            continue;
        }
        int oplen = 0;
        for (size_t o = 0; o < sizeof OPS2 / sizeof OPS2[0]; o++)
            if (!strncmp(s + i, OPS2[o], 2)) oplen = 2;
        if (!oplen && ch && strchr(OPS1, ch)) oplen = 1;
        if (!oplen) {
            size_t j = i;
            uint32_t cp = ju_decode(s, n, &j);
            if (cp < 0x80) return lex_fail(L, i, "unexpected character '%c'", ch);
            return lex_fail(L, i, "unexpected character U+%04X (names are ASCII)", (unsigned)cp);
        }
        if (oplen == 1 && (ch == '(' || ch == '[' || ch == '{')) {
            if (depth == JINJA_MAX_NESTING) return lex_fail(L, i, "brackets nested deeper than %d", JINJA_MAX_NESTING);
            stack[depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
        } else if (oplen == 1 && (ch == ')' || ch == ']' || ch == '}')) {
            if (depth == 0 || stack[depth - 1] != ch) return lex_fail(L, i, "unexpected '%c'", ch);
            depth--;
        }
        tok_t *t = tok_push(L, T_OP, i);
        memcpy(t->op, s + i, (size_t)oplen);
        i += (size_t)oplen;
    }
    *pos_io = i;
    return 0;
}

// Matches "{%[-+]?\s*NAME\s*" at i; returns the position after it or 0.
static size_t match_tag_name(const char *s, size_t n, size_t i, const char *name, char *sign) {
    if (strncmp(s + i, "{%", 2)) return 0;
    i += 2;
    *sign = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) *sign = s[i++];
    i = skip_spaces(s, n, i);
    size_t nl = strlen(name);
    if (strncmp(s + i, name, nl) || (i + nl < n && is_name_char(s[i + nl]))) return 0;
    return skip_spaces(s, n, i + nl);
}

static int lex(lexer_t *L) {
    const char *s = L->src;
    size_t n = L->n, pos = 0;
    bool line_starting = true;
    while (pos < n) {
        // the next tag: {{, {%, {#
        size_t t = pos;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) {
            emit_data(L, pos, n, 0, false, false);
            break;
        }
        char kind = s[t + 1];
        char sign = (t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+')) ? s[t + 2] : 0;
        char raw_sign;
        size_t raw = kind == '%' ? match_tag_name(s, n, t, "raw", &raw_sign) : 0;
        if (raw) {
            // {% raw %}...{% endraw %}: the body is text
            bool strip_after = false;
            if (!strncmp(s + raw, "-%}", 3)) {
                raw += 3;
                strip_after = true;
            } else if (!strncmp(s + raw, "%}", 2)) {
                raw += 2;
            } else {
                return lex_fail(L, raw, "expected '%%}' after 'raw'");
            }
            emit_data(L, pos, t, raw_sign, true, line_starting);
            size_t body = strip_after ? skip_spaces(s, n, raw) : raw;
            size_t e = body, after = 0;
            char end_sign = 0;
            for (; e + 1 < n; e++)
                if (s[e] == '{' && s[e + 1] == '%' && (after = match_tag_name(s, n, e, "endraw", &end_sign))) break;
            if (!after) return lex_fail(L, t, "missing {%% endraw %%} for this {%% raw %%}");
            bool ls = strip_after ? body > raw && s[body - 1] == '\n' : false;
            emit_data(L, body, e, end_sign, true, ls);
            if (!strncmp(s + after, "+%}", 3)) {
                pos = after + 3;
                line_starting = false;
            } else if (!strncmp(s + after, "-%}", 3)) {
                pos = skip_spaces(s, n, after + 3);
                line_starting = pos > after + 3 && s[pos - 1] == '\n';
            } else if (!strncmp(s + after, "%}", 2)) {
                pos = after + 2;
                line_starting = false;
                if (pos < n && s[pos] == '\n') {
                    pos++;
                    line_starting = true;
                }
            } else {
                return lex_fail(L, after, "expected '%%}' after 'endraw'");
            }
            continue;
        }
        emit_data(L, pos, t, sign, kind != '{', line_starting);
        size_t body = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) return lex_fail(L, t, "missing end of comment tag '#}'");
            if (e > body && s[e - 1] == '-') {
                pos = skip_spaces(s, n, e + 2);
                line_starting = pos > e + 2 && s[pos - 1] == '\n';
            } else if (e > body && s[e - 1] == '+') {
                pos = e + 2;
                line_starting = false;
            } else {
                pos = e + 2;
                line_starting = false;
                if (pos < n && s[pos] == '\n') {
                    pos++;
                    line_starting = true;
                }
            }
            continue;
        }
        tok_push(L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, t);
        pos = body;
        if (lex_tag(L, &pos, kind == '%', &line_starting)) return -1;
    }
    tok_push(L, T_EOF, n);
    return 0;
}

// --- parser ------------------------------------------------------------------------------------
typedef struct {
    lexer_t *L;
    jarena_t *arena;
    int i;
    int depth;
    int loops;    // enclosing for loops (break/continue are allowed inside one)
    char *err;
} parser_t;

static tok_t *cur(parser_t *P) { return &P->L->toks[P->i]; }
static tok_t *peek(parser_t *P, int k) {
    int j = P->i + k;
    return &P->L->toks[j < P->L->ntok ? j : P->L->ntok - 1];
}
static void adv(parser_t *P) {
    if (P->i < P->L->ntok - 1) P->i++;
}

static const char *tok_desc(const tok_t *t, char *buf, size_t n) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: snprintf(buf, n, "'%.40s'", t->s); return buf;
    case T_STRING: return "a string";
    case T_INT: return "an integer";
    case T_FLOAT: return "a float";
    default: snprintf(buf, n, "'%s'", t->op); return buf;
    }
}

static void *fail_at(parser_t *P, const tok_t *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void *fail_at(parser_t *P, const tok_t *t, const char *fmt, ...) {
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set(P->err, "%d:%d: %s", t->line, t->col, msg);
    return NULL;
}

static void *expected(parser_t *P, const char *what) {
    char b[64];
    return fail_at(P, cur(P), "expected %s, got %s", what, tok_desc(cur(P), b, sizeof b));
}

static bool is_op(parser_t *P, const char *op) { return cur(P)->type == T_OP && !strcmp(cur(P)->op, op); }
static bool is_name(parser_t *P, const char *name) { return cur(P)->type == T_NAME && !strcmp(cur(P)->s, name); }
static bool skip_op(parser_t *P, const char *op) {
    if (!is_op(P, op)) return false;
    adv(P);
    return true;
}
static bool skip_name(parser_t *P, const char *name) {
    if (!is_name(P, name)) return false;
    adv(P);
    return true;
}
static bool expect_op(parser_t *P, const char *op) {
    if (skip_op(P, op)) return true;
    char w[16];
    snprintf(w, sizeof w, "'%s'", op);
    expected(P, w);
    return false;
}

static jnode_t *node(parser_t *P, uint8_t k, const tok_t *at) {
    jnode_t *n = jarena_alloc(P->arena, sizeof *n);
    n->k = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

// Growable node arrays, copied into the arena when complete.
typedef struct {
    jnode_t **v;
    int n, cap;
    const char **names;
} nvec_t;
static void nv_push(nvec_t *a, jnode_t *x, const char *name) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 8;
        a->v = xrealloc(a->v, (size_t)a->cap * sizeof *a->v);
        a->names = xrealloc(a->names, (size_t)a->cap * sizeof *a->names);
    }
    a->names[a->n] = name;
    a->v[a->n++] = x;
}
static jnode_t **nv_finish(parser_t *P, nvec_t *a, int *n, const char ***names) {
    jnode_t **out = a->n ? jarena_alloc(P->arena, (size_t)a->n * sizeof *out) : NULL;
    if (a->n) memcpy(out, a->v, (size_t)a->n * sizeof *out);
    if (names) {
        *names = a->n ? jarena_alloc(P->arena, (size_t)a->n * sizeof **names) : NULL;
        if (a->n) memcpy(*names, a->names, (size_t)a->n * sizeof **names);
    }
    *n = a->n;
    free(a->v);
    free(a->names);
    memset(a, 0, sizeof *a);
    return out;
}
static void nv_drop(nvec_t *a) {
    free(a->v);
    free(a->names);
    memset(a, 0, sizeof *a);
}

static bool enter(parser_t *P) {
    if (++P->depth > JINJA_MAX_NESTING) {
        fail_at(P, cur(P), "nested deeper than %d levels", JINJA_MAX_NESTING);
        return false;
    }
    return true;
}
static void leave(parser_t *P) { P->depth--; }

static jnode_t *parse_expression(parser_t *P, bool with_condexpr);
static jnode_t *parse_tuple(parser_t *P, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens);
static jnode_t *parse_unary(parser_t *P, bool with_filter);
static jnode_t *parse_primary(parser_t *P);
static jnode_t *parse_postfix(parser_t *P, jnode_t *n);

static jnode_t *const_node(parser_t *P, const tok_t *at, jv_t v) {
    jnode_t *n = node(P, E_CONST, at);
    n->val = v;
    return n;
}

// Call arguments "(a, b, k=v)": positional before keyword, no *args / **kwargs.
static bool parse_call_args(parser_t *P, jnode_t *n) {
    tok_t *open = cur(P);
    if (!expect_op(P, "(")) return false;
    nvec_t pos = {0}, kw = {0};
    bool need_comma = false;
    while (!is_op(P, ")")) {
        if (need_comma) {
            if (!expect_op(P, ",")) goto fail;
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**")) {
            fail_at(P, cur(P), "argument unpacking (*args, **kwargs) is not supported");
            goto fail;
        }
        if (cur(P)->type == T_NAME && peek(P, 1)->type == T_OP && !strcmp(peek(P, 1)->op, "=")) {
            const char *key = cur(P)->s;
            adv(P);
            adv(P);
            jnode_t *v = parse_expression(P, true);
            if (!v) goto fail;
            for (int i = 0; i < kw.n; i++)
                if (!strcmp(kw.names[i], key)) {
                    fail_at(P, open, "keyword argument '%s' repeated", key);
                    goto fail;
                }
            nv_push(&kw, v, key);
        } else {
            if (kw.n) {
                fail_at(P, cur(P), "a positional argument follows keyword arguments");
                goto fail;
            }
            jnode_t *v = parse_expression(P, true);
            if (!v) goto fail;
            nv_push(&pos, v, NULL);
        }
        if (pos.n + kw.n > 32) {
            fail_at(P, open, "more than 32 arguments");
            goto fail;
        }
        need_comma = true;
    }
    adv(P);
    n->args = nv_finish(P, &pos, &n->nargs, NULL);
    n->kwargs = nv_finish(P, &kw, &n->nkw, &n->kwnames);
    return true;
fail:
    nv_drop(&pos);
    nv_drop(&kw);
    return false;
}

// "|name(args)" chain; with start_inline the first filter has no pipe (filter blocks).
static jnode_t *parse_filter(parser_t *P, jnode_t *n, bool start_inline) {
    while (is_op(P, "|") || start_inline) {
        if (!start_inline) adv(P);
        start_inline = false;
        tok_t *t = cur(P);
        if (t->type != T_NAME) return expected(P, "a filter name");
        adv(P);
        if (is_op(P, ".")) return fail_at(P, t, "dotted filter names are not supported");
        int id = jb_filter_id(t->s);
        if (id < 0) return fail_at(P, t, "unsupported filter '%s'", t->s);
        jnode_t *f = node(P, E_FILTER, t);
        f->name = t->s;
        f->id = id;
        f->a = n;
        if (is_op(P, "(") && !parse_call_args(P, f)) return NULL;
        n = f;
    }
    return n;
}

static jnode_t *parse_test(parser_t *P, jnode_t *n) {
    tok_t *is = cur(P);
    adv(P);
    bool negated = skip_name(P, "not");
    tok_t *t = cur(P);
    if (t->type != T_NAME) return expected(P, "a test name");
    adv(P);
    if (is_op(P, ".")) return fail_at(P, t, "dotted test names are not supported");
    int id = jb_test_id(t->s);
    if (id < 0) return fail_at(P, t, "unsupported test '%s'", t->s);
    jnode_t *x = node(P, E_TEST, t);
    x->name = t->s;
    x->id = id;
    x->a = n;
    tok_t *c = cur(P);
    if (is_op(P, "(")) {
        if (!parse_call_args(P, x)) return NULL;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT || is_op(P, "[") ||
                is_op(P, "{")) &&
               !(c->type == T_NAME && (!strcmp(c->s, "else") || !strcmp(c->s, "or") || !strcmp(c->s, "and")))) {
        if (is_name(P, "is")) return fail_at(P, c, "tests cannot be chained with 'is'");
        jnode_t *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
        x->args = jarena_alloc(P->arena, sizeof *x->args);
        x->args[0] = arg;
        x->nargs = 1;
    }
    if (negated) {
        jnode_t *nn = node(P, E_NOT, is);
        nn->a = x;
        return nn;
    }
    return x;
}

static jnode_t *parse_filter_expr(parser_t *P, jnode_t *n) {
    for (;;) {
        if (!n) return NULL;
        if (is_op(P, "|")) n = parse_filter(P, n, false);
        else if (is_name(P, "is")) n = parse_test(P, n);
        else if (is_op(P, "(")) {
            jnode_t *c = node(P, E_CALL, cur(P));
            c->a = n;
            if (!parse_call_args(P, c)) return NULL;
            n = c;
        } else return n;
    }
}

// One subscript: an expression or a slice [start:stop:step].
static jnode_t *parse_subscribed(parser_t *P) {
    tok_t *at = cur(P);
    jnode_t *parts[3] = {0};
    if (is_op(P, ":")) {
        adv(P);
    } else {
        jnode_t *e = parse_expression(P, true);
        if (!e) return NULL;
        if (!is_op(P, ":")) return e;
        adv(P);
        parts[0] = e;
    }
    if (!is_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) {
        if (!(parts[1] = parse_expression(P, true))) return NULL;
    }
    if (is_op(P, ":")) {
        adv(P);
        if (!is_op(P, "]") && !is_op(P, ",")) {
            if (!(parts[2] = parse_expression(P, true))) return NULL;
        }
    }
    jnode_t *s = node(P, E_SLICE, at);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static jnode_t *parse_postfix(parser_t *P, jnode_t *n) {
    for (;;) {
        tok_t *t = cur(P);
        if (is_op(P, ".")) {
            adv(P);
            tok_t *a = cur(P);
            if (a->type == T_NAME) {
                jnode_t *g = node(P, E_ATTR, t);
                g->a = n;
                g->name = a->s;
                adv(P);
                n = g;
            } else if (a->type == T_INT) {
                jnode_t *g = node(P, E_ITEM, t);
                g->a = n;
                g->b = const_node(P, a, jv_int(a->i));
                adv(P);
                n = g;
            } else {
                return expected(P, "a name or a number after '.'");
            }
        } else if (is_op(P, "[")) {
            adv(P);
            if (!enter(P)) return NULL;
            jnode_t *sub = parse_subscribed(P);
            leave(P);
            if (!sub) return NULL;
            if (is_op(P, ",")) return fail_at(P, cur(P), "multiple subscripts (a[x, y]) are not supported");
            if (!expect_op(P, "]")) return NULL;
            if (sub->k == E_SLICE) {
                sub->a = n;
                n = sub;
            } else {
                jnode_t *g = node(P, E_ITEM, t);
                g->a = n;
                g->b = sub;
                n = g;
            }
        } else if (is_op(P, "(")) {
            jnode_t *c = node(P, E_CALL, t);
            c->a = n;
            if (!parse_call_args(P, c)) return NULL;
            n = c;
        } else {
            return n;
        }
    }
}

static jnode_t *parse_list_or_dict(parser_t *P, bool dict) {
    tok_t *open = cur(P);
    adv(P);
    const char *close = dict ? "}" : "]";
    nvec_t keys = {0}, vals = {0};
    while (!is_op(P, close)) {
        if (keys.n && !expect_op(P, ",")) goto fail;
        if (is_op(P, close)) break;
        jnode_t *k = parse_expression(P, true);
        if (!k) goto fail;
        nv_push(&keys, k, NULL);
        if (dict) {
            if (!expect_op(P, ":")) goto fail;
            jnode_t *v = parse_expression(P, true);
            if (!v) goto fail;
            nv_push(&vals, v, NULL);
        }
    }
    adv(P);
    jnode_t *n = node(P, dict ? E_DICT : E_LIST, open);
    n->args = nv_finish(P, &keys, &n->nargs, NULL);
    if (dict) n->kwargs = nv_finish(P, &vals, &n->nkw, NULL);
    return n;
fail:
    nv_drop(&keys);
    nv_drop(&vals);
    return NULL;
}

static jnode_t *parse_primary(parser_t *P) {
    tok_t *t = cur(P);
    if (!enter(P)) return NULL;
    jnode_t *n = NULL;
    switch (t->type) {
    case T_NAME:
        adv(P);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n = const_node(P, t, jv_bool(true));
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n = const_node(P, t, jv_bool(false));
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n = const_node(P, t, JV_NONEV);
        else {
            n = node(P, E_NAME, t);
            n->name = t->s;
        }
        break;
    case T_STRING: {
        adv(P);
        size_t len = t->len;
        int j = P->i;
        while (P->L->toks[j].type == T_STRING) len += P->L->toks[j++].len;
        char *buf = xmalloc(len + 1);
        memcpy(buf, t->s, t->len);
        size_t o = t->len;
        while (cur(P)->type == T_STRING) {
            memcpy(buf + o, cur(P)->s, cur(P)->len);
            o += cur(P)->len;
            adv(P);
        }
        jv_t v = {.t = JV_STR};
        v.u.s = jstr_new(NULL, P->arena, buf, len);
        free(buf);
        if (!ju_valid(v.u.s->p, v.u.s->len)) {
            leave(P);
            return fail_at(P, t, "a string literal is not valid UTF-8");
        }
        n = const_node(P, t, v);
        break;
    }
    case T_INT: adv(P); n = const_node(P, t, jv_int(t->i)); break;
    case T_FLOAT: adv(P); n = const_node(P, t, jv_float(t->f)); break;
    case T_OP:
        if (!strcmp(t->op, "(")) {
            adv(P);
            n = parse_tuple(P, false, true, NULL, true);
            if (n && !expect_op(P, ")")) n = NULL;
        } else if (!strcmp(t->op, "[")) {
            n = parse_list_or_dict(P, false);
        } else if (!strcmp(t->op, "{")) {
            n = parse_list_or_dict(P, true);
        } else {
            char b[64];
            n = fail_at(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
        }
        break;
    default: {
        char b[64];
        n = fail_at(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
    }
    }
    leave(P);
    return n;
}

static jnode_t *parse_unary(parser_t *P, bool with_filter) {
    tok_t *t = cur(P);
    jnode_t *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        adv(P);
        if (!enter(P)) return NULL;
        jnode_t *x = parse_unary(P, false);
        leave(P);
        if (!x) return NULL;
        n = node(P, t->op[0] == '-' ? E_NEG : E_POS, t);
        n->a = x;
    } else {
        n = parse_primary(P);
    }
    if (!n) return NULL;
    n = parse_postfix(P, n);
    if (n && with_filter) n = parse_filter_expr(P, n);
    return n;
}

static jnode_t *binop(parser_t *P, const tok_t *t, char op, jnode_t *a, jnode_t *b) {
    jnode_t *n = node(P, E_BIN, t);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode_t *parse_pow(parser_t *P) {
    jnode_t *l = parse_unary(P, true);
    while (l && is_op(P, "**")) {
        tok_t *t = cur(P);
        adv(P);
        jnode_t *r = parse_unary(P, true);
        l = r ? binop(P, t, 'p', l, r) : NULL;
    }
    return l;
}

static jnode_t *parse_math2(parser_t *P) {
    jnode_t *l = parse_pow(P);
    while (l && (is_op(P, "*") || is_op(P, "/") || is_op(P, "//") || is_op(P, "%"))) {
        tok_t *t = cur(P);
        char op = !strcmp(t->op, "//") ? 'f' : t->op[0];
        adv(P);
        jnode_t *r = parse_pow(P);
        l = r ? binop(P, t, op, l, r) : NULL;
    }
    return l;
}

static jnode_t *parse_concat(parser_t *P) {
    tok_t *t = cur(P);
    jnode_t *first = parse_math2(P);
    if (!first || !is_op(P, "~")) return first;
    nvec_t parts = {0};
    nv_push(&parts, first, NULL);
    while (skip_op(P, "~")) {
        jnode_t *x = parse_math2(P);
        if (!x) {
            nv_drop(&parts);
            return NULL;
        }
        nv_push(&parts, x, NULL);
    }
    jnode_t *n = node(P, E_CONCAT, t);
    n->args = nv_finish(P, &parts, &n->nargs, NULL);
    return n;
}

static jnode_t *parse_math1(parser_t *P) {
    jnode_t *l = parse_concat(P);
    while (l && (is_op(P, "+") || is_op(P, "-"))) {
        tok_t *t = cur(P);
        adv(P);
        jnode_t *r = parse_concat(P);
        l = r ? binop(P, t, t->op[0], l, r) : NULL;
    }
    return l;
}

static jnode_t *parse_compare(parser_t *P) {
    tok_t *t = cur(P);
    jnode_t *first = parse_math1(P);
    if (!first) return NULL;
    nvec_t rhs = {0};
    char ops[64];
    int nops = 0;
    for (;;) {
        char op = 0;
        if (is_op(P, "==")) op = 'e';
        else if (is_op(P, "!=")) op = 'n';
        else if (is_op(P, "<")) op = '<';
        else if (is_op(P, "<=")) op = 'l';
        else if (is_op(P, ">")) op = '>';
        else if (is_op(P, ">=")) op = 'g';
        else if (is_name(P, "in")) op = 'i';
        else if (is_name(P, "not") && peek(P, 1)->type == T_NAME && !strcmp(peek(P, 1)->s, "in")) {
            op = 'x';
            adv(P);
        }
        if (!op) break;
        adv(P);
        if (nops == (int)sizeof ops) {
            nv_drop(&rhs);
            return fail_at(P, t, "more than %d chained comparisons", (int)sizeof ops);
        }
        jnode_t *r = parse_math1(P);
        if (!r) {
            nv_drop(&rhs);
            return NULL;
        }
        ops[nops++] = op;
        nv_push(&rhs, r, NULL);
    }
    if (!nops) return first;
    jnode_t *n = node(P, E_CMP, t);
    n->a = first;
    n->args = nv_finish(P, &rhs, &n->nargs, NULL);
    n->ops = jarena_alloc(P->arena, (size_t)nops);
    memcpy(n->ops, ops, (size_t)nops);
    return n;
}

static jnode_t *parse_not(parser_t *P) {
    if (is_name(P, "not")) {
        tok_t *t = cur(P);
        adv(P);
        if (!enter(P)) return NULL;
        jnode_t *x = parse_not(P);
        leave(P);
        if (!x) return NULL;
        jnode_t *n = node(P, E_NOT, t);
        n->a = x;
        return n;
    }
    return parse_compare(P);
}

// operand (NAME operand)*, left-associative: `and` over `not` terms, `or` over `and` terms.
static jnode_t *parse_chain(parser_t *P, const char *name, int kind, jnode_t *(*operand)(parser_t *)) {
    jnode_t *l = operand(P);
    while (l && is_name(P, name)) {
        tok_t *t = cur(P);
        adv(P);
        jnode_t *r = operand(P);
        if (!r) return NULL;
        jnode_t *n = node(P, kind, t);
        n->a = l;
        n->b = r;
        l = n;
    }
    return l;
}

static jnode_t *parse_and(parser_t *P) { return parse_chain(P, "and", E_AND, parse_not); }
static jnode_t *parse_or(parser_t *P) { return parse_chain(P, "or", E_OR, parse_and); }

static jnode_t *parse_condexpr(parser_t *P) {
    tok_t *t = cur(P);
    jnode_t *e1 = parse_or(P);
    while (e1 && is_name(P, "if")) {
        adv(P);
        jnode_t *cond = parse_or(P);
        if (!cond) return NULL;
        jnode_t *e3 = NULL;
        if (skip_name(P, "else")) {
            if (!enter(P)) return NULL;
            e3 = parse_condexpr(P);
            leave(P);
            if (!e3) return NULL;
        }
        jnode_t *n = node(P, E_COND, t);
        n->a = cond;
        n->b = e1;
        n->c = e3;
        e1 = n;
        t = cur(P);
    }
    return e1;
}

static jnode_t *parse_expression(parser_t *P, bool with_condexpr) {
    if (!enter(P)) return NULL;
    jnode_t *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return n;
}

static bool is_tuple_end(parser_t *P, const char *extra_end) {
    tok_t *t = cur(P);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(P, ")")) return true;
    return extra_end && t->type == T_NAME && !strcmp(t->s, extra_end);
}

static jnode_t *parse_tuple(parser_t *P, bool simplified, bool with_condexpr, const char *extra_end,
                            bool explicit_parens) {
    tok_t *at = cur(P);
    nvec_t items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n && !expect_op(P, ",")) goto fail;
        if (is_tuple_end(P, extra_end)) break;
        jnode_t *x = simplified ? parse_primary(P) : parse_expression(P, with_condexpr);
        if (!x) goto fail;
        nv_push(&items, x, NULL);
        if (is_op(P, ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) {
            jnode_t *x = items.v[0];
            nv_drop(&items);
            return x;
        }
        if (!explicit_parens) {
            nv_drop(&items);
            return expected(P, "an expression");
        }
    }
    jnode_t *n = node(P, E_TUPLE, at);
    n->args = nv_finish(P, &items, &n->nargs, NULL);
    return n;
fail:
    nv_drop(&items);
    return NULL;
}

// An assignment target: a name, or a tuple of names (for loops, set).
static jnode_t *parse_assign_target(parser_t *P, const char *extra_end) {
    tok_t *at = cur(P);
    jnode_t *t = parse_tuple(P, true, false, extra_end, false);
    if (!t) return NULL;
    if (t->k == E_NAME) return t;
    if (t->k == E_TUPLE) {
        for (int i = 0; i < t->nargs; i++)
            if (t->args[i]->k != E_NAME) return fail_at(P, at, "only names can be assigned to");
        if (t->nargs == 0) return fail_at(P, at, "cannot assign to an empty tuple");
        return t;
    }
    return fail_at(P, at, "cannot assign to this expression (a name or names separated by commas)");
}

static bool expect_block_end(parser_t *P) {
    if (cur(P)->type == T_BLOCK_END) {
        adv(P);
        return true;
    }
    expected(P, "'%}'");
    return false;
}

static jnode_t *parse_statement(parser_t *P);

// Statements up to "{% NAME" where NAME is one of ends; leaves the position on NAME.
static jnode_t **parse_body(parser_t *P, const char *const *ends, int nends, int *n, const tok_t *opener) {
    nvec_t body = {0};
    for (;;) {
        tok_t *t = cur(P);
        if (t->type == T_EOF) {
            if (!nends) break;
            nv_drop(&body);
            char b[64];
            return fail_at(P, opener, "missing {%% %s %%} for this %s", ends[0], tok_desc(opener, b, sizeof b));
        }
        if (t->type == T_DATA) {
            jv_t v = {.t = JV_STR};
            v.u.s = jstr_new(NULL, P->arena, t->s, t->len);
            if (!ju_valid(t->s, t->len)) {
                nv_drop(&body);
                return fail_at(P, t, "template text is not valid UTF-8");
            }
            jnode_t *x = node(P, S_TEXT, t);
            x->val = v;
            nv_push(&body, x, NULL);
            adv(P);
        } else if (t->type == T_VAR_BEGIN) {
            adv(P);
            jnode_t *e = parse_tuple(P, false, true, NULL, false);
            if (!e) goto fail;
            if (cur(P)->type != T_VAR_END) {
                expected(P, "'}}'");
                goto fail;
            }
            adv(P);
            jnode_t *x = node(P, S_OUT, t);
            x->a = e;
            nv_push(&body, x, NULL);
        } else if (t->type == T_BLOCK_BEGIN) {
            tok_t *name = peek(P, 1);
            if (name->type == T_NAME)
                for (int i = 0; i < nends; i++)
                    if (!strcmp(name->s, ends[i])) {
                        adv(P);
                        goto done;
                    }
            adv(P);
            jnode_t *x = parse_statement(P);
            if (!x) goto fail;
            if (!expect_block_end(P)) goto fail;
            nv_push(&body, x, NULL);
        } else {
            char b[64];
            fail_at(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
            goto fail;
        }
    }
done:;
    jnode_t **out = nv_finish(P, &body, n, NULL);
    if (!out && !*n) return jarena_alloc(P->arena, sizeof *out); // empty body, non-NULL
    return out;
fail:
    nv_drop(&body);
    return NULL;
}

// "%}" then statements up to "{% END" (END consumed, position on what follows it).
static jnode_t **parse_block(parser_t *P, const char *const *ends, int nends, int *n, const tok_t *opener) {
    if (!expect_block_end(P)) return NULL;
    if (!enter(P)) return NULL;
    jnode_t **b = parse_body(P, ends, nends, n, opener);
    leave(P);
    return b;
}

static const char *const END_FOR[] = {"endfor", "else"};
static const char *const END_FOR_ELSE[] = {"endfor"};
static const char *const END_IF[] = {"endif", "elif", "else"};
static const char *const END_IF_ELSE[] = {"endif"};
static const char *const END_SET[] = {"endset"};
static const char *const END_MACRO[] = {"endmacro"};
static const char *const END_WITH[] = {"endwith"};
static const char *const END_FILTER[] = {"endfilter"};
static const char *const END_GENERATION[] = {"endgeneration"};

static jnode_t *parse_for(parser_t *P, tok_t *kw) {
    jnode_t *n = node(P, S_FOR, kw);
    if (!(n->a = parse_assign_target(P, "in"))) return NULL;
    if (!skip_name(P, "in")) return expected(P, "'in'");
    if (!(n->b = parse_tuple(P, false, false, "recursive", false))) return NULL;
    if (skip_name(P, "if") && !(n->c = parse_expression(P, true))) return NULL;
    if (is_name(P, "recursive")) return fail_at(P, cur(P), "recursive loops are not supported");
    P->loops++;
    n->body = parse_block(P, END_FOR, 2, &n->nbody, kw);
    P->loops--;
    if (!n->body) return NULL;
    if (is_name(P, "else")) {
        adv(P);
        if (!(n->els = parse_block(P, END_FOR_ELSE, 1, &n->nels, kw))) return NULL;
    }
    adv(P); // endfor
    return n;
}

static jnode_t *parse_if(parser_t *P, tok_t *kw) {
    jnode_t *n = node(P, S_IF, kw);
    if (!(n->a = parse_tuple(P, false, false, NULL, false))) return NULL;
    if (!(n->body = parse_block(P, END_IF, 3, &n->nbody, kw))) return NULL;
    if (is_name(P, "elif")) {
        tok_t *e = cur(P);
        adv(P);
        if (!enter(P)) return NULL;
        jnode_t *x = parse_if(P, e);
        leave(P);
        if (!x) return NULL;
        n->els = jarena_alloc(P->arena, sizeof *n->els);
        n->els[0] = x;
        n->nels = 1;
        return n; // the nested if consumed endif
    }
    if (is_name(P, "else")) {
        adv(P);
        if (!(n->els = parse_block(P, END_IF_ELSE, 1, &n->nels, kw))) return NULL;
    }
    adv(P); // endif
    return n;
}

static jnode_t *parse_set(parser_t *P, tok_t *kw) {
    tok_t *t = cur(P);
    jnode_t *target;
    if (t->type == T_NAME && peek(P, 1)->type == T_OP && !strcmp(peek(P, 1)->op, ".")) {
        // {% set ns.attr = value %}
        tok_t *attr = peek(P, 2);
        if (attr->type != T_NAME) {
            adv(P);
            adv(P);
            return expected(P, "an attribute name");
        }
        jnode_t *base = node(P, E_NAME, t);
        base->name = t->s;
        target = node(P, E_ATTR, t);
        target->a = base;
        target->name = attr->s;
        adv(P);
        adv(P);
        adv(P);
    } else {
        if (!(target = parse_assign_target(P, NULL))) return NULL;
    }
    if (skip_op(P, "=")) {
        jnode_t *n = node(P, S_SET, kw);
        n->a = target;
        if (!(n->b = parse_tuple(P, false, true, NULL, false))) return NULL;
        return n;
    }
    if (target->k != E_NAME) return fail_at(P, t, "a block set assigns one name");
    jnode_t *n = node(P, S_SETBLOCK, kw);
    n->a = target;
    if (is_op(P, "|")) {
        jnode_t *hole = node(P, E_HOLE, cur(P));
        if (!(n->c = parse_filter(P, hole, false))) return NULL;
    }
    int saved = P->loops;
    P->loops = 0;
    n->body = parse_block(P, END_SET, 1, &n->nbody, kw);
    P->loops = saved;
    if (!n->body) return NULL;
    adv(P);
    return n;
}

static bool uses_name(const jnode_t *n, const char *name, int d);
static bool uses_name_list(jnode_t *const *v, int n, const char *name, int d) {
    for (int i = 0; i < n; i++)
        if (uses_name(v[i], name, d)) return true;
    return false;
}
// Whether a macro body refers to varargs/kwargs/caller (as Jinja decides what a macro accepts).
// Nested macros have their own. A tree deeper than the limit is refused after parsing; the walk
// stops there.
static bool uses_name(const jnode_t *n, const char *name, int d) {
    if (!n || d > JINJA_MAX_AST_DEPTH) return false;
    if (n->k == E_NAME && !strcmp(n->name, name)) return true;
    if (n->k == S_MACRO) return false;
    d++;
    return uses_name(n->a, name, d) || uses_name(n->b, name, d) || uses_name(n->c, name, d) ||
           uses_name(n->d, name, d) || uses_name_list(n->args, n->nargs, name, d) ||
           uses_name_list(n->kwargs, n->nkw, name, d) || uses_name_list(n->body, n->nbody, name, d) ||
           uses_name_list(n->els, n->nels, name, d) || uses_name_list(n->defaults, n->np, name, d);
}

static jnode_t *parse_macro(parser_t *P, tok_t *kw) {
    tok_t *t = cur(P);
    if (t->type != T_NAME) return expected(P, "a macro name");
    adv(P);
    jnode_t *n = node(P, S_MACRO, kw);
    n->name = t->s;
    if (!expect_op(P, "(")) return NULL;
    nvec_t params = {0};
    const char **names = NULL;
    bool saw_default = false;
    while (!is_op(P, ")")) {
        if (params.n && !expect_op(P, ",")) goto fail;
        tok_t *p = cur(P);
        if (p->type != T_NAME) {
            expected(P, "a parameter name");
            goto fail;
        }
        adv(P);
        for (int i = 0; i < params.n; i++)
            if (!strcmp(params.names[i], p->s)) {
                fail_at(P, p, "parameter '%s' repeated", p->s);
                goto fail;
            }
        jnode_t *def = NULL;
        if (skip_op(P, "=")) {
            if (!(def = parse_expression(P, true))) goto fail;
            saw_default = true;
        } else if (saw_default) {
            fail_at(P, p, "non-default parameter '%s' follows a default parameter", p->s);
            goto fail;
        }
        nv_push(&params, def, p->s);
        if (params.n > 32) {
            fail_at(P, p, "more than 32 parameters");
            goto fail;
        }
    }
    adv(P);
    n->defaults = nv_finish(P, &params, &n->np, &names);
    n->params = names;
    int saved = P->loops;
    P->loops = 0;
    n->body = parse_block(P, END_MACRO, 1, &n->nbody, kw);
    P->loops = saved;
    if (!n->body) return NULL;
    adv(P);
    if (uses_name_list(n->body, n->nbody, "caller", 0))
        return fail_at(P, kw, "macro '%s' uses 'caller': call blocks are not supported", n->name);
    if (uses_name_list(n->body, n->nbody, "varargs", 0)) n->flags |= JN_VARARGS;
    if (uses_name_list(n->body, n->nbody, "kwargs", 0)) n->flags |= JN_KWARGS;
    return n;
fail:
    nv_drop(&params);
    return NULL;
}

static jnode_t *parse_with(parser_t *P, tok_t *kw) {
    jnode_t *n = node(P, S_WITH, kw);
    nvec_t vals = {0};
    const char **names = NULL;
    while (cur(P)->type != T_BLOCK_END) {
        if (vals.n && !expect_op(P, ",")) goto fail;
        tok_t *t = cur(P);
        if (t->type != T_NAME) {
            expected(P, "a name");
            goto fail;
        }
        adv(P);
        if (!expect_op(P, "=")) goto fail;
        jnode_t *v = parse_expression(P, true);
        if (!v) goto fail;
        nv_push(&vals, v, t->s);
    }
    n->defaults = nv_finish(P, &vals, &n->np, &names);
    n->params = names;
    if (!(n->body = parse_block(P, END_WITH, 1, &n->nbody, kw))) return NULL;
    adv(P);
    return n;
fail:
    nv_drop(&vals);
    return NULL;
}

static jnode_t *parse_statement(parser_t *P) {
    tok_t *kw = cur(P);
    if (kw->type != T_NAME) return expected(P, "a statement name after '{%'");
    adv(P);
    const char *s = kw->s;
    if (!enter(P)) return NULL;
    jnode_t *n = NULL;
    if (!strcmp(s, "for")) n = parse_for(P, kw);
    else if (!strcmp(s, "if")) n = parse_if(P, kw);
    else if (!strcmp(s, "set")) n = parse_set(P, kw);
    else if (!strcmp(s, "macro")) n = parse_macro(P, kw);
    else if (!strcmp(s, "with")) n = parse_with(P, kw);
    else if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        if (!P->loops) n = fail_at(P, kw, "'%s' outside a for loop", s);
        else n = node(P, s[0] == 'b' ? S_BREAK : S_CONTINUE, kw);
    } else if (!strcmp(s, "filter")) {
        n = node(P, S_FILTER, kw);
        jnode_t *hole = node(P, E_HOLE, kw);
        if (!(n->c = parse_filter(P, hole, true)) || !(n->body = parse_block(P, END_FILTER, 1, &n->nbody, kw))) n = NULL;
        else adv(P);
    } else if (!strcmp(s, "generation")) {
        // HF's assistant-mask tag: its body is a caller macro in Jinja, so break/continue cannot
        // reach through it
        n = node(P, S_BLOCK, kw);
        int saved = P->loops;
        P->loops = 0;
        if (!(n->body = parse_block(P, END_GENERATION, 1, &n->nbody, kw))) n = NULL;
        else adv(P);
        P->loops = saved;
    } else if (!strcmp(s, "extends") || !strcmp(s, "block") || !strcmp(s, "include") || !strcmp(s, "import") ||
               !strcmp(s, "from") || !strcmp(s, "call") || !strcmp(s, "autoescape") || !strcmp(s, "do") ||
               !strcmp(s, "trans") || !strcmp(s, "pluralize")) {
        n = fail_at(P, kw, "the '%s' statement is not supported", s);
    } else if (!strncmp(s, "end", 3) || !strcmp(s, "else") || !strcmp(s, "elif")) {
        n = fail_at(P, kw, "unexpected '%s' (no open block it could close)", s);
    } else {
        n = fail_at(P, kw, "unknown statement '%s'", s);
    }
    leave(P);
    return n;
}

// The first node deeper than JINJA_MAX_AST_DEPTH, or NULL. Chains the parser builds without
// recursing (a.b.c..., x|f|g..., a + b + c...) still nest in the tree; the evaluator recurses over
// the tree, so its depth is bounded here (the walk stops descending at the limit).
static const jnode_t *too_deep(const jnode_t *n, int d);
static const jnode_t *too_deep_list(jnode_t *const *v, int n, int d) {
    for (int i = 0; i < n; i++) {
        const jnode_t *x = too_deep(v[i], d);
        if (x) return x;
    }
    return NULL;
}
static const jnode_t *too_deep(const jnode_t *n, int d) {
    if (!n) return NULL;
    if (d > JINJA_MAX_AST_DEPTH) return n;
    const jnode_t *x;
    if ((x = too_deep(n->a, d + 1)) || (x = too_deep(n->b, d + 1)) || (x = too_deep(n->c, d + 1)) ||
        (x = too_deep(n->d, d + 1)) || (x = too_deep_list(n->args, n->nargs, d + 1)) ||
        (x = too_deep_list(n->kwargs, n->nkw, d + 1)) || (x = too_deep_list(n->body, n->nbody, d + 1)) ||
        (x = too_deep_list(n->els, n->nels, d + 1)) || (x = too_deep_list(n->defaults, n->np, d + 1)))
        return x;
    return NULL;
}

// --- public API --------------------------------------------------------------------------------
void jinja_limits_default(jinja_limits_t *l) {
    memset(l, 0, sizeof *l);
    l->max_output = 16u << 20;
    l->max_memory = 256u << 20;
    l->max_steps = 20000000;
    l->max_depth = 64;
}

jinja_tpl_t *jinja_parse(const char *src, size_t len, char *err) {
    if (len > JINJA_MAX_SOURCE) {
        err_set(err, "template of %zu bytes is larger than the limit of %u", len, JINJA_MAX_SOURCE);
        return NULL;
    }
    if (memchr(src, 0, len)) {
        err_set(err, "template contains a NUL byte");
        return NULL;
    }
    if (!ju_valid(src, len)) {
        err_set(err, "template is not valid UTF-8");
        return NULL;
    }
    jinja_tpl_t *t = xcalloc(1, sizeof *t);
    lexer_t L = {.arena = &t->arena, .err = err};
    // Newlines normalized (\r\n and \r to \n) and one trailing newline dropped, as Jinja does.
    char *s = xmalloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    L.src = s;
    L.n = n;
    L.line_starts = xmalloc((n + 2) * sizeof *L.line_starts);
    L.line_starts[L.nlines++] = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n') L.line_starts[L.nlines++] = i + 1;
    int rc = lex(&L);
    if (rc == 0) {
        parser_t P = {.L = &L, .arena = &t->arena, .err = err};
        t->body = parse_body(&P, NULL, 0, &t->nbody, NULL);
        if (!t->body) rc = -1;
        const jnode_t *deep = rc ? NULL : too_deep_list(t->body, t->nbody, 1);
        if (deep) rc = err_set(err, "%d:%d: the template nests deeper than %d levels", deep->line, deep->col, JINJA_MAX_AST_DEPTH);
    }
    free(L.toks);
    free(L.line_starts);
    free(s);
    if (rc) jinja_destroy(&t);
    return t;
}

void jinja_destroy(jinja_tpl_t **t) {
    if (!t || !*t) return;
    jarena_free(&(*t)->arena);
    free(*t);
    *t = NULL;
}

jinja_vars_t *jinja_vars_new(void) { return xcalloc(1, sizeof(jinja_vars_t)); }

void jinja_vars_destroy(jinja_vars_t **v) {
    if (!v || !*v) return;
    for (int i = 0; i < (*v)->n; i++) free((*v)->names[i]);
    free((*v)->names);
    free((*v)->vals);
    jarena_free(&(*v)->arena);
    free(*v);
    *v = NULL;
}

static void vars_bind(jinja_vars_t *v, const char *name, jv_t val) {
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->names[i], name)) {
            v->vals[i] = val;
            return;
        }
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 16;
        v->names = xrealloc(v->names, (size_t)v->cap * sizeof *v->names);
        v->vals = xrealloc(v->vals, (size_t)v->cap * sizeof *v->vals);
    }
    v->names[v->n] = xstrdup(name);
    v->vals[v->n++] = val;
}

bool jinja_vars_has(const jinja_vars_t *v, const char *name) {
    for (int i = 0; i < v->n; i++)
        if (!strcmp(v->names[i], name)) return true;
    return false;
}

// Parses JSON text that must hold one value and nothing else but whitespace.
static cJSON *parse_json(const char *json, size_t len, size_t *bad_at) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (j && end) {
        while (end < json + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
        if (end < json + len) {
            cJSON_Delete(j);
            j = NULL;
        }
    }
    if (!j) *bad_at = end ? (size_t)(end - json) : 0;
    return j;
}

int jinja_vars_set_json(jinja_vars_t *v, const char *name, const char *json, size_t len, char *err) {
    size_t bad = 0;
    cJSON *j = parse_json(json, len, &bad);
    if (!j) return err_set(err, "variable '%s': not valid JSON (near byte %zu)", name, bad);
    jv_t val;
    int rc = jv_from_cjson(&v->arena, j, json, len, &val, err);
    cJSON_Delete(j);
    if (rc) return -1;
    vars_bind(v, name, val);
    return 0;
}

int jinja_vars_update_json(jinja_vars_t *v, const char *json, size_t len, const char *const *skip, char *err) {
    size_t bad = 0;
    cJSON *j = parse_json(json, len, &bad);
    if (!j) return err_set(err, "not valid JSON (near byte %zu)", bad);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return err_set(err, "variables must be a JSON object");
    }
    jv_t val;
    int rc = jv_from_cjson(&v->arena, j, json, len, &val, err);
    cJSON_Delete(j);
    if (rc) return -1;
    for (size_t i = 0; i < val.u.d->n; i++) {
        bool skipped = false;
        for (int k = 0; skip && skip[k]; k++)
            if (!strcmp(skip[k], val.u.d->k[i]->p)) skipped = true;
        if (!skipped) vars_bind(v, val.u.d->k[i]->p, val.u.d->v[i]);
    }
    return 0;
}

int jinja_vars_set_cjson(jinja_vars_t *v, const char *name, const cJSON *value, char *err) {
    jv_t val;
    if (jv_from_cjson(&v->arena, value, NULL, 0, &val, err)) return -1;
    vars_bind(v, name, val);
    return 0;
}

int jinja_vars_set_string(jinja_vars_t *v, const char *name, const char *s, char *err) {
    if (!ju_valid(s, strlen(s))) return err_set(err, "variable '%s': not valid UTF-8", name);
    jv_t val = {.t = JV_STR};
    val.u.s = jstr_new(NULL, &v->arena, s, strlen(s));
    vars_bind(v, name, val);
    return 0;
}

void jinja_vars_set_bool(jinja_vars_t *v, const char *name, bool b) { vars_bind(v, name, jv_bool(b)); }
void jinja_vars_set_none(jinja_vars_t *v, const char *name) { vars_bind(v, name, JV_NONEV); }

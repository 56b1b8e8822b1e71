// tokenizer.c - Hugging Face tokenizer.json with a BPE model: parse, build, save, encode, decode.
//
// Encoding is a pipeline of separate stages, as in the tokenizers library:
//
//   tokenizer_split_added   added tokens (longest literal match) cut the text into pieces
//   tokenizer_pretokenize   each remaining piece becomes words (identity today)
//   tokenizer_bpe_word      each word becomes symbols and is merged by lowest merge rank
//
// Tokens live in one array indexed by id. Two open-addressing hash tables (power-of-two
// capacity, load <= 1/2, linear probing) give string -> id and (left id, right id) ->
// (rank, merged id); both are sized once up front, so a 150k vocabulary costs a few MB and
// no rehashing. The merge loop keeps a linked list of symbols and a min-heap of candidate
// pairs, like the reference implementation, so long words cost O(n log n).
//
// Only what we can honour is accepted: a normalizer, a pre-tokenizer, a continuing subword
// prefix or an end-of-word suffix would make our ids differ from the reference ones, and a
// decoder other than ByteFallback/Fuse our text, so such files are rejected with a message
// saying what is missing rather than silently handled differently.
#include "common/formats/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Far beyond any real vocabulary (the largest are ~260k), and small enough that a file with
// one absurd id cannot make us allocate gigabytes for the id-indexed token array.
#define TOKENIZER_MAX_IDS (1 << 22)
#define TOKENIZER_DECODER_DEPTH 8

enum {
    TOKENIZER_F_VOCAB = 1,        // in the model vocabulary (BPE may produce it)
    TOKENIZER_F_ADDED = 2,        // an added token (matched literally before BPE)
    TOKENIZER_F_SPECIAL = 4,
    TOKENIZER_F_LSTRIP = 8,
    TOKENIZER_F_RSTRIP = 16,
    TOKENIZER_F_NORMALIZED = 32,
};

typedef struct {
    char *text;         // NUL-terminated; NULL for an id no token uses
    uint32_t len;
    uint32_t hash;
    uint8_t flags;
    int16_t byte;       // 0..255 for a vocabulary token "<0xNN>", else -1
    char byte_text[2];  // that byte as a string, returned when byte tokens decode to bytes
} tokenizer_token_t;

typedef struct {
    uint64_t key;       // left id << 32 | right id; TOKENIZER_PAIR_EMPTY when unused
    int32_t rank;
    int32_t id;         // the merged token
} tokenizer_pair_slot_t;

#define TOKENIZER_PAIR_EMPTY UINT64_MAX

typedef struct {
    int32_t left, right;
} tokenizer_merge_t;

struct tokenizer {
    tokenizer_token_t *tok;
    int32_t n_ids;
    int32_t *str_slots;               // token ids, -1 when empty
    uint32_t str_mask;
    tokenizer_pair_slot_t *pair_slots;
    uint32_t pair_mask;
    // By rank as given, duplicates included: a repeated pair takes the later rank (as the
    // reference implementation's map does), and save writes only the rank that is in force.
    tokenizer_merge_t *merges;
    int32_t n_merges;
    int32_t unk_id;                   // -1 when the model has no unk_token
    bool byte_fallback, fuse_unk, ignore_merges;
    bool decode_bytes;                // "<0xNN>" tokens decode to the raw byte
    int32_t byte_id[256];             // id of "<0xNN>" in the vocabulary, or -1
    // Added tokens grouped by (pass, first byte), longest first within a group, so the first
    // hit while scanning a group is the longest match. Pass 0 holds tokens with
    // normalized=false, pass 1 those with normalized=true (matched after, as in the
    // reference, where they are matched against normalized text).
    int32_t *added_order;
    uint32_t added_start[2 * 256 + 1];
    // Kept verbatim so that save writes back what the file had; encoding ignores them.
    cJSON *decoder, *post_processor;
};

// ---------------------------------------------------------------------------------------
// Small helpers

static uint32_t tokenizer_hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static uint64_t tokenizer_hash_pair(uint64_t x) {
    // splitmix64 finalizer: consecutive ids must spread over the whole table.
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint32_t tokenizer_table_cap(size_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

// A token for an error message: control bytes escaped, long ones shortened.
static const char *tokenizer_show(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        bool esc = c < 0x20 || c == 0x7f || c == '\\';
        if (o + (esc ? 4 : 1) + 4 > cap) {  // keep room for "..." and the NUL
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (esc)
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

// Length of the UTF-8 character at s (1..4), or 1 for a byte that does not start a
// well-formed character, so that any byte string can be split. *cp receives the code point
// (or the byte).
static size_t tokenizer_utf8_char(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    *cp = c;
    if (c < 0x80) return 1;
    size_t need;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) {
        need = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 1;
    }
    if (need > n) return 1;
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80) return 1;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    return need;
}

static bool tokenizer_is_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

typedef struct {
    int32_t *v;
    size_t n, cap;
} tokenizer_ids_t;

static void tokenizer_ids_push(tokenizer_ids_t *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

// ---------------------------------------------------------------------------------------
// Token table and hash maps

static tokenizer_t *tokenizer_alloc(int32_t n_ids, int32_t n_merges) {
    tokenizer_t *t = xcalloc(1, sizeof *t);
    t->n_ids = n_ids;
    t->tok = xcalloc((size_t)n_ids, sizeof *t->tok);
    for (int32_t i = 0; i < n_ids; i++) t->tok[i].byte = -1;
    uint32_t cap = tokenizer_table_cap((size_t)n_ids);
    t->str_mask = cap - 1;
    t->str_slots = xmalloc(cap * sizeof *t->str_slots);
    memset(t->str_slots, 0xff, cap * sizeof *t->str_slots);
    cap = tokenizer_table_cap((size_t)n_merges);
    t->pair_mask = cap - 1;
    t->pair_slots = xmalloc(cap * sizeof *t->pair_slots);
    for (uint32_t i = 0; i < cap; i++) t->pair_slots[i].key = TOKENIZER_PAIR_EMPTY;
    t->merges = xmalloc((size_t)n_merges * sizeof *t->merges);
    t->unk_id = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    return t;
}

void tokenizer_destroy(tokenizer_t **tp) {
    if (!tp || !*tp) return;
    tokenizer_t *t = *tp;
    for (int32_t i = 0; i < t->n_ids; i++) free(t->tok[i].text);
    free(t->tok);
    free(t->str_slots);
    free(t->pair_slots);
    free(t->merges);
    free(t->added_order);
    cJSON_Delete(t->decoder);
    cJSON_Delete(t->post_processor);
    free(t);
    *tp = NULL;
}

static int32_t tokenizer_find(const tokenizer_t *t, const char *s, size_t n) {
    uint32_t h = tokenizer_hash_str(s, n);
    for (uint32_t i = h & t->str_mask;; i = (i + 1) & t->str_mask) {
        int32_t id = t->str_slots[i];
        if (id < 0) return -1;
        const tokenizer_token_t *k = &t->tok[id];
        if (k->hash == h && k->len == n && memcmp(k->text, s, n) == 0) return id;
    }
}

// Only tokens of the model vocabulary take part in BPE (added-only tokens never do).
static int32_t tokenizer_find_vocab(const tokenizer_t *t, const char *s, size_t n) {
    int32_t id = tokenizer_find(t, s, n);
    return id >= 0 && (t->tok[id].flags & TOKENIZER_F_VOCAB) ? id : -1;
}

static const tokenizer_pair_slot_t *tokenizer_find_pair(const tokenizer_t *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = (uint32_t)tokenizer_hash_pair(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const tokenizer_pair_slot_t *s = &t->pair_slots[i];
        if (s->key == key) return s;
        if (s->key == TOKENIZER_PAIR_EMPTY) return NULL;
    }
}

// Registers a token at id. A string may appear both in the vocabulary and among the added
// tokens (common for <unk>, <s>, ...) when both give the same id; then the flags combine.
static int tokenizer_set_token(tokenizer_t *t, int64_t id, const char *s, size_t n, uint8_t flags, char *err) {
    char a[64], b[64];
    if (id < 0 || id >= t->n_ids)
        return err_set(err, "token '%s': id %lld out of range (0..%d)", tokenizer_show(s, n, a, sizeof a),
                       (long long)id, t->n_ids - 1);
    int32_t have = tokenizer_find(t, s, n);
    if (have >= 0) {
        tokenizer_token_t *k = &t->tok[have];
        uint8_t both = k->flags & flags;
        if (both & TOKENIZER_F_VOCAB)
            return err_set(err, "token '%s' appears twice in the vocab", tokenizer_show(s, n, a, sizeof a));
        if (both & TOKENIZER_F_ADDED)
            return err_set(err, "added token '%s' appears twice", tokenizer_show(s, n, a, sizeof a));
        if (have != id)
            return err_set(err, "token '%s' has id %d in the vocab and id %lld as an added token",
                           tokenizer_show(s, n, a, sizeof a), have, (long long)id);
        k->flags |= flags;
        return 0;
    }
    tokenizer_token_t *k = &t->tok[id];
    if (k->text)
        return err_set(err, "duplicate id %lld: used by '%s' and '%s'", (long long)id,
                       tokenizer_show(k->text, k->len, a, sizeof a), tokenizer_show(s, n, b, sizeof b));
    if (n > UINT32_MAX) return err_set(err, "token of %zu bytes is too long", n);
    k->text = xmalloc(n + 1);
    memcpy(k->text, s, n);
    k->text[n] = 0;
    k->len = (uint32_t)n;
    k->hash = tokenizer_hash_str(s, n);
    k->flags = flags;
    uint32_t i = k->hash & t->str_mask;
    while (t->str_slots[i] >= 0) i = (i + 1) & t->str_mask;
    t->str_slots[i] = (int32_t)id;
    return 0;
}

// Adds the merge "a b" at rank (ranks must be added in increasing order).
static int tokenizer_add_merge(tokenizer_t *t, const char *a, size_t an, const char *b, size_t bn, int32_t rank,
                               char *err) {
    char sa[64], sb[64];
    int32_t ia = tokenizer_find_vocab(t, a, an), ib = tokenizer_find_vocab(t, b, bn);
    if (ia < 0 || ib < 0)
        return err_set(err, "merge %d ('%s' '%s'): token '%s' is not in the vocab", rank,
                       tokenizer_show(a, an, sa, sizeof sa), tokenizer_show(b, bn, sb, sizeof sb),
                       ia < 0 ? sa : sb);
    char *cat = xmalloc(an + bn + 1);
    memcpy(cat, a, an);
    memcpy(cat + an, b, bn);
    int32_t im = tokenizer_find_vocab(t, cat, an + bn);
    if (im < 0) {
        char sm[64];
        err_set(err, "merge %d ('%s' '%s'): result '%s' is not in the vocab", rank,
                tokenizer_show(a, an, sa, sizeof sa), tokenizer_show(b, bn, sb, sizeof sb),
                tokenizer_show(cat, an + bn, sm, sizeof sm));
        free(cat);
        return -1;
    }
    free(cat);
    t->merges[rank] = (tokenizer_merge_t){ia, ib};
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint32_t i = (uint32_t)tokenizer_hash_pair(key) & t->pair_mask;
    while (t->pair_slots[i].key != TOKENIZER_PAIR_EMPTY && t->pair_slots[i].key != key) i = (i + 1) & t->pair_mask;
    t->pair_slots[i] = (tokenizer_pair_slot_t){key, rank, im};
    return 0;
}

// Splits the merge string "a b" at *split. A single space is the separator, as in the
// reference format; with several spaces (a merge involving the token " ") the one split
// whose halves and concatenation are all vocabulary tokens is taken.
static int tokenizer_split_merge(const tokenizer_t *t, const char *m, size_t *split, char *err) {
    char sm[64];
    size_t n = strlen(m), spaces = 0, at = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i] == ' ') spaces++, at = i;
    if (spaces == 1 && at > 0 && at + 1 < n) {
        *split = at;
        return 0;
    }
    size_t found = 0;
    for (size_t i = 1; spaces > 1 && i + 1 < n; i++) {
        if (m[i] != ' ') continue;
        if (tokenizer_find_vocab(t, m, i) < 0 || tokenizer_find_vocab(t, m + i + 1, n - i - 1) < 0) continue;
        char *cat = xmalloc(n);
        memcpy(cat, m, i);
        memcpy(cat + i, m + i + 1, n - i - 1);
        bool ok = tokenizer_find_vocab(t, cat, n - 1) >= 0;
        free(cat);
        if (!ok) continue;
        if (found) return err_set(err, "merge '%s' is ambiguous", tokenizer_show(m, n, sm, sizeof sm));
        found = i;
    }
    if (!found)
        return err_set(err, "merge '%s' is not two vocab tokens separated by a space",
                       tokenizer_show(m, n, sm, sizeof sm));
    *split = found;
    return 0;
}

static int tokenizer_added_cmp(const void *pa, const void *pb) {
    const int64_t *a = pa, *b = pb;  // {group, -len, id}
    for (int i = 0; i < 3; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

// Derived tables, once every token and merge is in.
static int tokenizer_finish(tokenizer_t *t, char *err) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int32_t id = tokenizer_find_vocab(t, name, 6);
        t->byte_id[b] = id;
        if (id >= 0) {
            t->tok[id].byte = (int16_t)b;
            t->tok[id].byte_text[0] = (char)b;
        }
    }
    size_t n_added = 0;
    for (int32_t i = 0; i < t->n_ids; i++)
        if (t->tok[i].flags & TOKENIZER_F_ADDED) n_added++;
    int64_t(*keys)[3] = xmalloc((n_added ? n_added : 1) * sizeof *keys);
    size_t k = 0;
    for (int32_t i = 0; i < t->n_ids; i++) {
        const tokenizer_token_t *tk = &t->tok[i];
        if (!(tk->flags & TOKENIZER_F_ADDED)) continue;
        int pass = (tk->flags & TOKENIZER_F_NORMALIZED) ? 1 : 0;
        keys[k][0] = pass * 256 + (uint8_t)tk->text[0];
        keys[k][1] = -(int64_t)tk->len;
        keys[k][2] = i;
        k++;
    }
    qsort(keys, n_added, sizeof *keys, tokenizer_added_cmp);
    t->added_order = xmalloc((n_added ? n_added : 1) * sizeof *t->added_order);
    memset(t->added_start, 0, sizeof t->added_start);
    for (size_t i = 0; i < n_added; i++) {
        t->added_order[i] = (int32_t)keys[i][2];
        t->added_start[keys[i][0] + 1]++;
    }
    for (int g = 0; g < 2 * 256; g++) t->added_start[g + 1] += t->added_start[g];
    free(keys);
    bool any = false;
    for (int32_t i = 0; i < t->n_ids && !any; i++) any = t->tok[i].text != NULL;
    if (!any) return err_set(err, "tokenizer has no tokens");
    return 0;
}

// ---------------------------------------------------------------------------------------
// Encoding pipeline

typedef struct {
    size_t off, len;
    int32_t id;  // the added token, or -1 for text still to encode
} tokenizer_span_t;

typedef struct {
    tokenizer_span_t *v;
    size_t n, cap;
} tokenizer_spans_t;

static void tokenizer_spans_push(tokenizer_spans_t *a, size_t off, size_t len, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 16;
        a->v = xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = (tokenizer_span_t){off, len, id};
}

// Stage 1: cuts text[off, off+len) at the added tokens of one pass, leftmost match first,
// longest match at that position. lstrip/rstrip tokens swallow the whitespace beside them.
static void tokenizer_split_added(const tokenizer_t *t, const char *text, size_t off, size_t len, int pass,
                                  tokenizer_spans_t *out) {
    size_t end = off + len, start = off, i = off;
    if (t->added_start[pass * 256] == t->added_start[pass * 256 + 256]) {
        if (len) tokenizer_spans_push(out, off, len, -1);
        return;
    }
    while (i < end) {
        uint32_t g = (uint32_t)pass * 256 + (uint8_t)text[i];
        int32_t hit = -1;
        for (uint32_t j = t->added_start[g]; j < t->added_start[g + 1]; j++) {
            const tokenizer_token_t *k = &t->tok[t->added_order[j]];
            if (k->len <= end - i && memcmp(text + i, k->text, k->len) == 0) {
                hit = t->added_order[j];
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        const tokenizer_token_t *k = &t->tok[hit];
        size_t ms = i, me = i + k->len;
        if (k->flags & TOKENIZER_F_LSTRIP)
            while (ms > start && tokenizer_is_space((uint8_t)text[ms - 1])) ms--;
        if (k->flags & TOKENIZER_F_RSTRIP)
            while (me < end && tokenizer_is_space((uint8_t)text[me])) me++;
        if (ms > start) tokenizer_spans_push(out, start, ms - start, -1);
        tokenizer_spans_push(out, ms, me - ms, hit);
        start = i = me;
    }
    if (start < end) tokenizer_spans_push(out, start, end - start, -1);
}

// Stage 2: the pre-tokenizer splits a piece into words that BPE encodes independently.
// Identity today (the whole piece is one word). A ByteLevel pre-tokenizer plugs in here:
// split with the GPT-2 regex, then map each byte of a word to its printable code point
// (bytes_to_unicode) before BPE, and map back in decode.
static void tokenizer_pretokenize(const tokenizer_t *t, const char *text, size_t off, size_t len,
                                  tokenizer_spans_t *words) {
    (void)t;
    (void)text;
    words->n = 0;
    if (len) tokenizer_spans_push(words, off, len, -1);
}

typedef struct {
    int32_t id;  // -1 once merged into the symbol on its left
    int32_t prev, next;
} tokenizer_sym_t;

typedef struct {
    int32_t rank, pos;
} tokenizer_cand_t;

typedef struct {
    tokenizer_sym_t *sym;
    size_t n_sym, cap_sym;
    tokenizer_cand_t *heap;
    size_t n_heap, cap_heap;
} tokenizer_work_t;

static void tokenizer_sym_push(tokenizer_work_t *w, int32_t id) {
    if (w->n_sym == w->cap_sym) {
        w->cap_sym = w->cap_sym ? 2 * w->cap_sym : 64;
        w->sym = xrealloc(w->sym, w->cap_sym * sizeof *w->sym);
    }
    w->sym[w->n_sym++] = (tokenizer_sym_t){id, -1, -1};
}

// Lowest rank first; among equal ranks (the same pair twice) the leftmost.
static bool tokenizer_cand_less(tokenizer_cand_t a, tokenizer_cand_t b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void tokenizer_heap_push(tokenizer_work_t *w, int32_t rank, int32_t pos) {
    if (w->n_heap == w->cap_heap) {
        w->cap_heap = w->cap_heap ? 2 * w->cap_heap : 64;
        w->heap = xrealloc(w->heap, w->cap_heap * sizeof *w->heap);
    }
    tokenizer_cand_t c = {rank, pos};
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tokenizer_cand_less(c, w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static tokenizer_cand_t tokenizer_heap_pop(tokenizer_work_t *w) {
    tokenizer_cand_t top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tokenizer_cand_less(w->heap[c + 1], w->heap[c])) c++;
        if (!tokenizer_cand_less(w->heap[c], last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void tokenizer_push_pair(const tokenizer_t *t, tokenizer_work_t *w, int32_t pos) {
    int32_t nx = w->sym[pos].next;
    if (nx < 0) return;
    const tokenizer_pair_slot_t *p = tokenizer_find_pair(t, w->sym[pos].id, w->sym[nx].id);
    if (p) tokenizer_heap_push(w, p->rank, pos);
}

// Stage 3: BPE on one word text[off, off+len), appending ids to out.
static int tokenizer_bpe_word(const tokenizer_t *t, const char *text, size_t off, size_t len, tokenizer_work_t *w,
                              tokenizer_ids_t *out, char *err) {
    const char *word = text + off;
    if (t->ignore_merges) {
        int32_t id = tokenizer_find_vocab(t, word, len);
        if (id >= 0) {
            tokenizer_ids_push(out, id);
            return 0;
        }
    }
    if (len > INT32_MAX / 2) return err_set(err, "word of %zu bytes is too long to encode", len);
    w->n_sym = 0;
    w->n_heap = 0;
    bool last_unk = false;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t cl = tokenizer_utf8_char((const uint8_t *)word + i, len - i, &cp);
        int32_t id = tokenizer_find_vocab(t, word + i, cl);
        if (id >= 0) {
            tokenizer_sym_push(w, id);
            last_unk = false;
            i += cl;
            continue;
        }
        bool bytes_ok = t->byte_fallback;
        for (size_t k = 0; k < cl && bytes_ok; k++) bytes_ok = t->byte_id[(uint8_t)word[i + k]] >= 0;
        if (bytes_ok) {
            for (size_t k = 0; k < cl; k++) tokenizer_sym_push(w, t->byte_id[(uint8_t)word[i + k]]);
            last_unk = false;
        } else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && last_unk)) tokenizer_sym_push(w, t->unk_id);
            last_unk = true;
        } else {
            char what[64];
            if (cl == 1 && cp >= 0x80)
                snprintf(what, sizeof what, "byte \\x%02X (not valid UTF-8)", cp);
            else if (cp >= 0x20 && cp < 0x7f)
                snprintf(what, sizeof what, "'%c' (U+%04X)", (char)cp, cp);
            else
                snprintf(what, sizeof what, "U+%04X", cp);
            return err_set(err, "cannot encode character %s at byte %zu: not in the vocab, and the model has %s",
                           what, off + i,
                           t->byte_fallback ? "no byte_fallback token for it and no unk_token"
                                            : "neither byte_fallback nor an unk_token");
        }
        i += cl;
    }
    int32_t n = (int32_t)w->n_sym;
    for (int32_t i = 0; i < n; i++) {
        w->sym[i].prev = i - 1;
        w->sym[i].next = i + 1 < n ? i + 1 : -1;
    }
    for (int32_t i = 0; i + 1 < n; i++) tokenizer_push_pair(t, w, i);
    while (w->n_heap) {
        tokenizer_cand_t c = tokenizer_heap_pop(w);
        tokenizer_sym_t *s = &w->sym[c.pos];
        if (s->id < 0 || s->next < 0) continue;
        // Entries go stale when a neighbour merged first; the pair now at pos decides.
        // A rank names exactly one pair, so a matching rank means the same merge.
        const tokenizer_pair_slot_t *p = tokenizer_find_pair(t, s->id, w->sym[s->next].id);
        if (!p || p->rank != c.rank) continue;
        int32_t gone = s->next;
        s->id = p->id;
        s->next = w->sym[gone].next;
        w->sym[gone].id = -1;
        if (s->next >= 0) w->sym[s->next].prev = c.pos;
        if (s->prev >= 0) tokenizer_push_pair(t, w, s->prev);
        tokenizer_push_pair(t, w, c.pos);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->sym[i].next) tokenizer_ids_push(out, w->sym[i].id);
    return 0;
}

int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int32_t **ids, char *err) {
    if (ids) *ids = NULL;
    if (!t || !ids || (!text && len)) return err_set(err, "tokenizer_encode: bad arguments");
    int rc = -1;
    tokenizer_spans_t pieces = {0}, pieces2 = {0}, words = {0};
    tokenizer_work_t work = {0};
    tokenizer_ids_t out = {0};
    tokenizer_split_added(t, text, 0, len, 0, &pieces);
    for (size_t i = 0; i < pieces.n; i++) {
        if (pieces.v[i].id >= 0)
            tokenizer_spans_push(&pieces2, pieces.v[i].off, pieces.v[i].len, pieces.v[i].id);
        else
            tokenizer_split_added(t, text, pieces.v[i].off, pieces.v[i].len, 1, &pieces2);
    }
    for (size_t i = 0; i < pieces2.n; i++) {
        const tokenizer_span_t *p = &pieces2.v[i];
        if (p->id >= 0) {
            tokenizer_ids_push(&out, p->id);
            continue;
        }
        tokenizer_pretokenize(t, text, p->off, p->len, &words);
        for (size_t j = 0; j < words.n; j++)
            if (tokenizer_bpe_word(t, text, words.v[j].off, words.v[j].len, &work, &out, err) != 0) goto fail;
    }
    if (out.n > INT32_MAX) {
        err_set(err, "text encodes to more than %d tokens", INT32_MAX);
        goto fail;
    }
    rc = (int)out.n;
    *ids = out.v ? out.v : xmalloc(sizeof **ids);
    out.v = NULL;
fail:
    free(out.v);
    free(pieces.v);
    free(pieces2.v);
    free(words.v);
    free(work.sym);
    free(work.heap);
    return rc;
}

// ---------------------------------------------------------------------------------------
// Decoding and queries

const char *tokenizer_token_text(const tokenizer_t *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_ids) return NULL;
    const tokenizer_token_t *k = &t->tok[id];
    return t->decode_bytes && k->byte >= 0 ? k->byte_text : k->text;
}

char *tokenizer_decode(const tokenizer_t *t, const int32_t *ids, int n, bool skip_special, char *err) {
    if (!t || n < 0 || (n > 0 && !ids)) {
        err_set(err, "tokenizer_decode: bad arguments");
        return NULL;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->tok[ids[i]].text) {
            err_set(err, "cannot decode id %d at position %d: not a token (vocab size %d)", ids[i], i, t->n_ids);
            return NULL;
        }
        const tokenizer_token_t *k = &t->tok[ids[i]];
        total += t->decode_bytes && k->byte >= 0 ? 1 : k->len;
    }
    char *s = xmalloc(total + 1), *o = s;
    for (int i = 0; i < n; i++) {
        const tokenizer_token_t *k = &t->tok[ids[i]];
        if (skip_special && (k->flags & TOKENIZER_F_SPECIAL)) continue;
        if (t->decode_bytes && k->byte >= 0) {
            *o++ = (char)k->byte;
        } else {
            memcpy(o, k->text, k->len);
            o += k->len;
        }
    }
    *o = 0;
    return s;
}

int tokenizer_vocab_size(const tokenizer_t *t) {
    return t ? t->n_ids : 0;
}

int32_t tokenizer_token_id(const tokenizer_t *t, const char *token) {
    if (!t || !token) return -1;
    return tokenizer_find(t, token, strlen(token));
}

bool tokenizer_is_special(const tokenizer_t *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && (t->tok[id].flags & TOKENIZER_F_SPECIAL);
}

// ---------------------------------------------------------------------------------------
// Parsing tokenizer.json

static int tokenizer_json_bool(const cJSON *obj, const char *key, bool dflt, bool *out, const char *where,
                               char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return err_set(err, "%s.%s must be true or false", where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int tokenizer_json_id(const cJSON *v, const char *what, const char *name, int64_t *out, char *err) {
    char sn[64];
    tokenizer_show(name, strlen(name), sn, sizeof sn);
    if (!cJSON_IsNumber(v)) return err_set(err, "%s '%s': id is not a number", what, sn);
    double d = v->valuedouble;
    if (!(d >= 0 && d < TOKENIZER_MAX_IDS))
        return err_set(err, "%s '%s': id %g out of range (0..%d)", what, sn, d, TOKENIZER_MAX_IDS - 1);
    if (d != (double)(int64_t)d) return err_set(err, "%s '%s': id %g is not an integer", what, sn, d);
    *out = (int64_t)d;
    return 0;
}

// A component we do not implement must be absent or null.
static int tokenizer_json_unsupported(const cJSON *root, const char *key, char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (cJSON_IsObject(v) && cJSON_IsString(type))
        return err_set(err, "%s %s not supported yet", key, type->valuestring);
    return err_set(err, "%s must be null or an object with a string \"type\"", key);
}

static int tokenizer_json_decoder(const cJSON *d, int depth, bool *byte_fallback, char *err) {
    if (!d || cJSON_IsNull(d)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(d, "type");
    if (!cJSON_IsObject(d) || !cJSON_IsString(type))
        return err_set(err, "decoder must be null or an object with a string \"type\"");
    const char *ty = type->valuestring;
    if (strcmp(ty, "ByteFallback") == 0) {
        *byte_fallback = true;
        return 0;
    }
    if (strcmp(ty, "Fuse") == 0) return 0;
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders"), *it;
        if (!cJSON_IsArray(list)) return err_set(err, "decoder Sequence needs a \"decoders\" array");
        if (depth >= TOKENIZER_DECODER_DEPTH) return err_set(err, "decoder Sequence nested too deeply");
        cJSON_ArrayForEach(it, list) {
            if (tokenizer_json_decoder(it, depth + 1, byte_fallback, err) != 0) return -1;
        }
        return 0;
    }
    return err_set(err, "decoder %s not supported yet", ty);
}

static int tokenizer_json_affix(const cJSON *model, const char *key, char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    if (!v || cJSON_IsNull(v) || (cJSON_IsString(v) && v->valuestring[0] == 0)) return 0;
    return err_set(err, "model.%s is not supported yet (must be null)", key);
}

tokenizer_t *tokenizer_parse(const char *json, size_t len, char *err) {
    cJSON *root = NULL;
    tokenizer_t *t = NULL;
    if (!json) {
        err_set(err, "tokenizer_parse: no input");
        return NULL;
    }
    // The parse-end pointer, unlike cJSON_GetErrorPtr, is not a global, so parsing stays
    // safe from several threads.
    const char *at = NULL;
    root = cJSON_ParseWithLengthOpts(json, len, &at, false);
    if (!root) {
        if (at && at >= json && at <= json + len)
            err_set(err, "invalid JSON near byte %zu", (size_t)(at - json));
        else
            err_set(err, "invalid JSON");
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        err_set(err, "tokenizer.json must be a JSON object");
        goto fail;
    }
    if (tokenizer_json_unsupported(root, "normalizer", err) != 0) goto fail;
    if (tokenizer_json_unsupported(root, "pre_tokenizer", err) != 0) goto fail;
    bool decoder_bytes = false;
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (tokenizer_json_decoder(decoder, 0, &decoder_bytes, err) != 0) goto fail;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        err_set(err, "missing \"model\" object");
        goto fail;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    // Older files leave the type out; a model with merges can only be BPE.
    if (type && !cJSON_IsNull(type)) {
        if (!cJSON_IsString(type)) {
            err_set(err, "model.type must be a string");
            goto fail;
        }
        if (strcmp(type->valuestring, "BPE") != 0) {
            err_set(err, "model type %s not supported (only BPE)", type->valuestring);
            goto fail;
        }
    } else if (!merges) {
        err_set(err, "model has no type and no merges; only BPE is supported");
        goto fail;
    }
    if (!cJSON_IsObject(vocab)) {
        err_set(err, "model.vocab must be an object {token: id}");
        goto fail;
    }
    if (merges && !cJSON_IsNull(merges) && !cJSON_IsArray(merges)) {
        err_set(err, "model.merges must be an array");
        goto fail;
    }
    if (tokenizer_json_affix(model, "continuing_subword_prefix", err) != 0) goto fail;
    if (tokenizer_json_affix(model, "end_of_word_suffix", err) != 0) goto fail;
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0)) {
        err_set(err, "model.dropout is not supported (must be null)");
        goto fail;
    }
    bool byte_fallback, fuse_unk, ignore_merges;
    if (tokenizer_json_bool(model, "byte_fallback", false, &byte_fallback, "model", err) != 0 ||
        tokenizer_json_bool(model, "fuse_unk", false, &fuse_unk, "model", err) != 0 ||
        tokenizer_json_bool(model, "ignore_merges", false, &ignore_merges, "model", err) != 0)
        goto fail;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (unk && !cJSON_IsNull(unk) && !cJSON_IsString(unk)) {
        err_set(err, "model.unk_token must be a string or null");
        goto fail;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) {
        err_set(err, "added_tokens must be an array");
        goto fail;
    }

    // First pass: validate ids and find the largest, so the token array is sized once.
    int64_t max_id = -1, id;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (tokenizer_json_id(it, "vocab token", it->string, &id, err) != 0) goto fail;
        if (id > max_id) max_id = id;
    }
    int idx = 0;
    cJSON_ArrayForEach(it, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsObject(it) || !cJSON_IsString(content) || content->valuestring[0] == 0) {
            err_set(err, "added_tokens[%d] must be an object with a non-empty string \"content\"", idx);
            goto fail;
        }
        if (tokenizer_json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), "added token", content->valuestring, &id,
                              err) != 0)
            goto fail;
        if (id > max_id) max_id = id;
        idx++;
    }
    int n_merges = cJSON_GetArraySize(merges);
    t = tokenizer_alloc((int32_t)(max_id + 1), n_merges);
    t->byte_fallback = byte_fallback;
    t->fuse_unk = fuse_unk;
    t->ignore_merges = ignore_merges;
    t->decode_bytes = byte_fallback || decoder_bytes;

    cJSON_ArrayForEach(it, vocab) {
        tokenizer_json_id(it, "vocab token", it->string, &id, err);
        if (tokenizer_set_token(t, id, it->string, strlen(it->string), TOKENIZER_F_VOCAB, err) != 0) goto fail;
    }
    idx = 0;
    cJSON_ArrayForEach(it, added) {
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        tokenizer_json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), "added token", content, &id, err);
        bool special, lstrip, rstrip, single_word, normalized;
        char where[32];
        snprintf(where, sizeof where, "added_tokens[%d]", idx++);
        if (tokenizer_json_bool(it, "special", false, &special, where, err) != 0 ||
            tokenizer_json_bool(it, "lstrip", false, &lstrip, where, err) != 0 ||
            tokenizer_json_bool(it, "rstrip", false, &rstrip, where, err) != 0 ||
            tokenizer_json_bool(it, "single_word", false, &single_word, where, err) != 0 ||
            tokenizer_json_bool(it, "normalized", !special, &normalized, where, err) != 0)
            goto fail;
        if (single_word) {
            char sc[64];
            err_set(err, "added token '%s': single_word is not supported yet",
                    tokenizer_show(content, strlen(content), sc, sizeof sc));
            goto fail;
        }
        uint8_t flags = TOKENIZER_F_ADDED | (special ? TOKENIZER_F_SPECIAL : 0) | (lstrip ? TOKENIZER_F_LSTRIP : 0) |
                        (rstrip ? TOKENIZER_F_RSTRIP : 0) | (normalized ? TOKENIZER_F_NORMALIZED : 0);
        if (tokenizer_set_token(t, id, content, strlen(content), flags, err) != 0) goto fail;
    }
    idx = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t an, bn;
        if (cJSON_IsString(it)) {
            size_t split;
            if (tokenizer_split_merge(t, it->valuestring, &split, err) != 0) goto fail;
            a = it->valuestring, an = split;
            b = it->valuestring + split + 1, bn = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring, an = strlen(a);
            b = cJSON_GetArrayItem(it, 1)->valuestring, bn = strlen(b);
        } else {
            err_set(err, "merges[%d] must be \"a b\" or [\"a\", \"b\"]", idx);
            goto fail;
        }
        if (tokenizer_add_merge(t, a, an, b, bn, idx, err) != 0) goto fail;
        idx++;
    }
    t->n_merges = idx;
    if (unk && cJSON_IsString(unk)) {
        t->unk_id = tokenizer_find(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0) {
            char su[64];
            err_set(err, "unk_token '%s' is not a token",
                    tokenizer_show(unk->valuestring, strlen(unk->valuestring), su, sizeof su));
            goto fail;
        }
    }
    if (tokenizer_finish(t, err) != 0) goto fail;
    if (decoder && !cJSON_IsNull(decoder)) t->decoder = cJSON_Duplicate(decoder, true);
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (post && !cJSON_IsNull(post)) t->post_processor = cJSON_Duplicate(post, true);
    if ((decoder && !cJSON_IsNull(decoder) && !t->decoder) || (post && !cJSON_IsNull(post) && !t->post_processor)) {
        err_set(err, "out of memory copying decoder/post_processor");
        goto fail;
    }
    cJSON_Delete(root);
    return t;
fail:
    cJSON_Delete(root);
    tokenizer_destroy(&t);
    return NULL;
}

tokenizer_t *tokenizer_load(const char *path, char *err) {
    size_t len;
    char *json = util_read_file(path, &len, err);
    if (!json) return NULL;
    char inner[ERR_LEN] = "";
    tokenizer_t *t = tokenizer_parse(json, len, inner);
    free(json);
    if (!t) err_set(err, "%s: %s", path, inner);
    return t;
}

tokenizer_t *tokenizer_build(const char *const *vocab, int n_vocab, const char *const *merges, int n_merges,
                             const char *const *specials, int n_specials, char *err) {
    if (n_vocab < 0 || n_merges < 0 || n_specials < 0 || (n_vocab && !vocab) || (n_merges && !merges) ||
        (n_specials && !specials)) {
        err_set(err, "tokenizer_build: bad arguments");
        return NULL;
    }
    if ((int64_t)n_vocab + n_specials > TOKENIZER_MAX_IDS) {
        err_set(err, "tokenizer_build: %lld tokens exceed the limit of %d", (long long)n_vocab + n_specials,
                TOKENIZER_MAX_IDS);
        return NULL;
    }
    tokenizer_t *t = tokenizer_alloc(n_vocab + n_specials, n_merges);
    for (int i = 0; i < n_vocab; i++) {
        if (!vocab[i]) {
            err_set(err, "vocab[%d] is NULL", i);
            goto fail;
        }
        if (tokenizer_set_token(t, i, vocab[i], strlen(vocab[i]), TOKENIZER_F_VOCAB, err) != 0) goto fail;
    }
    for (int i = 0; i < n_specials; i++) {
        if (!specials[i] || !specials[i][0]) {
            err_set(err, "special token %d is NULL or empty", i);
            goto fail;
        }
        if (tokenizer_set_token(t, n_vocab + i, specials[i], strlen(specials[i]),
                                TOKENIZER_F_ADDED | TOKENIZER_F_SPECIAL, err) != 0)
            goto fail;
    }
    for (int i = 0; i < n_merges; i++) {
        size_t split;
        if (!merges[i]) {
            err_set(err, "merges[%d] is NULL", i);
            goto fail;
        }
        if (tokenizer_split_merge(t, merges[i], &split, err) != 0) goto fail;
        const char *b = merges[i] + split + 1;
        if (tokenizer_add_merge(t, merges[i], split, b, strlen(b), i, err) != 0) goto fail;
    }
    t->n_merges = n_merges;
    if (tokenizer_finish(t, err) != 0) goto fail;
    // A Fuse decoder makes Hugging Face's libraries join tokens without spaces, as ours does
    // (with no decoder they join with " ").
    t->decoder = cJSON_CreateObject();
    if (!t->decoder || !cJSON_AddStringToObject(t->decoder, "type", "Fuse")) {
        err_set(err, "out of memory building the decoder");
        goto fail;
    }
    return t;
fail:
    tokenizer_destroy(&t);
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Writing tokenizer.json

static bool tokenizer_add_bool(cJSON *o, const char *key, bool v) {
    return cJSON_AddBoolToObject(o, key, v) != NULL;
}

static bool tokenizer_add_copy(cJSON *o, const char *key, const cJSON *v) {
    cJSON *c = v ? cJSON_Duplicate(v, true) : cJSON_CreateNull();
    if (!c) return false;
    if (!cJSON_AddItemToObject(o, key, c)) {
        cJSON_Delete(c);
        return false;
    }
    return true;
}

static cJSON *tokenizer_to_json(const tokenizer_t *t) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    bool ok = cJSON_AddStringToObject(root, "version", "1.0") && cJSON_AddNullToObject(root, "truncation") &&
              cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    ok = ok && added;
    for (int32_t i = 0; ok && i < t->n_ids; i++) {
        const tokenizer_token_t *k = &t->tok[i];
        if (!(k->flags & TOKENIZER_F_ADDED)) continue;
        cJSON *a = cJSON_CreateObject();
        ok = a && cJSON_AddItemToArray(added, a);
        if (!ok) {
            cJSON_Delete(a);
            break;
        }
        ok = cJSON_AddNumberToObject(a, "id", i) && cJSON_AddStringToObject(a, "content", k->text) &&
             tokenizer_add_bool(a, "single_word", false) &&
             tokenizer_add_bool(a, "lstrip", k->flags & TOKENIZER_F_LSTRIP) &&
             tokenizer_add_bool(a, "rstrip", k->flags & TOKENIZER_F_RSTRIP) &&
             tokenizer_add_bool(a, "normalized", k->flags & TOKENIZER_F_NORMALIZED) &&
             tokenizer_add_bool(a, "special", k->flags & TOKENIZER_F_SPECIAL);
    }
    ok = ok && cJSON_AddNullToObject(root, "normalizer") && cJSON_AddNullToObject(root, "pre_tokenizer") &&
         tokenizer_add_copy(root, "post_processor", t->post_processor) &&
         tokenizer_add_copy(root, "decoder", t->decoder);
    cJSON *model = ok ? cJSON_AddObjectToObject(root, "model") : NULL;
    ok = ok && model && cJSON_AddStringToObject(model, "type", "BPE") && cJSON_AddNullToObject(model, "dropout");
    if (ok && t->unk_id >= 0)
        ok = cJSON_AddStringToObject(model, "unk_token", t->tok[t->unk_id].text) != NULL;
    else if (ok)
        ok = cJSON_AddNullToObject(model, "unk_token") != NULL;
    ok = ok && cJSON_AddNullToObject(model, "continuing_subword_prefix") &&
         cJSON_AddNullToObject(model, "end_of_word_suffix") && tokenizer_add_bool(model, "fuse_unk", t->fuse_unk) &&
         tokenizer_add_bool(model, "byte_fallback", t->byte_fallback) &&
         tokenizer_add_bool(model, "ignore_merges", t->ignore_merges);
    cJSON *vocab = ok ? cJSON_AddObjectToObject(model, "vocab") : NULL;
    ok = ok && vocab;
    for (int32_t i = 0; ok && i < t->n_ids; i++)
        if (t->tok[i].flags & TOKENIZER_F_VOCAB) ok = cJSON_AddNumberToObject(vocab, t->tok[i].text, i) != NULL;
    cJSON *merges = ok ? cJSON_AddArrayToObject(model, "merges") : NULL;
    ok = ok && merges;
    for (int32_t r = 0; ok && r < t->n_merges; r++) {
        const tokenizer_merge_t *m = &t->merges[r];
        const tokenizer_pair_slot_t *p = tokenizer_find_pair(t, m->left, m->right);
        if (!p || p->rank != r) continue;  // overridden by a later duplicate
        const char *pair[2] = {t->tok[m->left].text, t->tok[m->right].text};
        cJSON *a = cJSON_CreateStringArray(pair, 2);
        ok = a && cJSON_AddItemToArray(merges, a);
        if (!ok) cJSON_Delete(a);
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

int tokenizer_save(const tokenizer_t *t, const char *path, char *err) {
    if (!t || !path) return err_set(err, "tokenizer_save: bad arguments");
    cJSON *root = tokenizer_to_json(t);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return err_set(err, "cannot write %s: out of memory building JSON", path);
    int rc = util_write_file(path, text, strlen(text), err);
    cJSON_free(text);
    return rc;
}

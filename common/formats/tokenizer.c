// tokenizer.c - Hugging Face tokenizer.json with a BPE model: parse, build, save, encode, decode.
//
// This file holds the model and drives the stages (tokenizer.h lists them); normalizers,
// pre-tokenizers and decoders live in tok_norm.c, tok_pretok.c and tok_decode.c.
//
// Tokens live in one array indexed by id, their strings in one arena. Two open-addressing hash
// tables (power-of-two capacity, load <= 1/2, linear probing) give string -> id and (left id,
// right id) -> (rank, merged id); both are sized once up front, so a 250k vocabulary costs a
// few MB and no rehashing. The merge loop keeps a linked list of symbols and a min-heap of
// candidate pairs, like the reference implementation, so long words cost O(n log n). A word's
// ids are kept in a small direct-mapped cache (most text repeats its words), and characters
// below U+0800, which is every character of a byte-level vocabulary, find their token through
// a table instead of the hash.
#include "common/formats/tokenizer.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/tok_decode.h"
#include "common/formats/tok_norm.h"
#include "common/formats/tok_pretok.h"
#include "common/formats/tok_text.h"

// Far beyond any real vocabulary (the largest are ~260k), and small enough that a file with
// one absurd id cannot make us allocate gigabytes for the id-indexed token array.
#define TOKENIZER_MAX_IDS (1 << 22)
#define TOKENIZER_MAX_TEXT (256 << 20)
#define TOKENIZER_CP_TABLE 0x800
#define TOKENIZER_CACHE_SLOTS 8192
#define TOKENIZER_CACHE_KEY 30
#define TOKENIZER_CACHE_IDS 7

enum {
    TOKENIZER_F_USED = 1,
    TOKENIZER_F_VOCAB = 2,        // in the model vocabulary (BPE may produce it)
    TOKENIZER_F_ADDED = 4,        // an added token (matched literally before BPE)
    TOKENIZER_F_SPECIAL = 8,
    TOKENIZER_F_LSTRIP = 16,
    TOKENIZER_F_RSTRIP = 32,
    TOKENIZER_F_NORMALIZED = 64,
    TOKENIZER_F_SINGLE_WORD = 128,
};

typedef struct {
    uint32_t off, len;  // in the text arena (NUL-terminated)
    uint32_t hash;
    uint8_t flags;
} tokenizer_token_t;

// The hash, length and place of the string are kept beside the id: a probe reads only the slot
// and, when it may match, the string (loading a 150k vocabulary is bound by these misses).
typedef struct {
    int32_t id;
    uint32_t hash;
} tokenizer_str_slot_t;

typedef struct {
    uint64_t key;       // left id << 32 | right id; TOKENIZER_PAIR_EMPTY when unused
    int32_t rank;
    int32_t id;         // the merged token
} tokenizer_pair_slot_t;

#define TOKENIZER_PAIR_EMPTY UINT64_MAX

typedef struct {
    int32_t left, right, id;  // left + right -> id
} tokenizer_merge_t;

// One TemplateProcessing: items in order, each the text itself or special token ids.
typedef struct {
    int32_t *ids;
    int n;
    bool text;
} tokenizer_item_t;

typedef struct {
    tokenizer_item_t *items;
    int n;
} tokenizer_template_t;

typedef struct {
    uint32_t hash;
    uint8_t klen;       // 0: empty slot
    uint8_t nids;
    char key[TOKENIZER_CACHE_KEY];
    int32_t ids[TOKENIZER_CACHE_IDS];
} tokenizer_cache_slot_t;

typedef struct {
    pthread_mutex_t lock;
    tokenizer_cache_slot_t slot[TOKENIZER_CACHE_SLOTS];
} tokenizer_cache_t;

struct tokenizer {
    tokenizer_token_t *tok;
    int32_t n_ids;
    tok_buf_t text;                   // token strings
    tokenizer_str_slot_t *str_slots;  // id -1 when empty
    uint32_t str_mask;
    tokenizer_pair_slot_t *pair_slots;
    uint32_t pair_mask;
    // By rank as given, duplicates included: a repeated pair takes the later rank (as the
    // reference implementation's map does), and save writes only the rank that is in force.
    tokenizer_merge_t *merges;
    int32_t n_merges;
    int32_t unk_id;                   // -1 when the model has no unk_token
    bool byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix;            // continuing_subword_prefix, end_of_word_suffix; NULL when unset
    size_t prefix_len, suffix_len;
    int32_t byte_id[256];             // id of "<0xNN>" in the vocabulary, or -1
    int32_t *cp_id;                   // vocabulary id of each single character below U+0800, or -1
    // Added tokens by pass (0: normalized=false, matched on the raw text; 1: normalized=true,
    // matched on normalized text) and first byte: the distinct lengths, longest first, so the
    // first length that hits is the longest match.
    bool added_first[2][256];
    uint32_t *added_len;
    uint32_t added_start[2 * 256 + 1];
    tok_norm_t *normalizer;
    tok_pretok_t *pretok;
    tok_decoder_t *decoder;
    tokenizer_template_t *post;       // applied in order when special tokens are added
    int n_post;
    int32_t bos_id, eos_id;
    tok_buf_t dtext;                  // tokenizer_token_text of each id, NUL-terminated
    uint32_t *dtext_off;              // (n_ids + 1) offsets into dtext
    tokenizer_cache_t *cache;
    // The components as the file had them, written back by save.
    cJSON *j_normalizer, *j_pretok, *j_post, *j_decoder;
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

static const char *tokenizer_text(const tokenizer_t *t, int32_t id) {
    return t->text.p + t->tok[id].off;
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
    uint32_t cap = tokenizer_table_cap((size_t)n_ids);
    t->str_mask = cap - 1;
    t->str_slots = xmalloc(cap * sizeof *t->str_slots);
    memset(t->str_slots, 0xff, cap * sizeof *t->str_slots);
    cap = tokenizer_table_cap((size_t)n_merges);
    t->pair_mask = cap - 1;
    t->pair_slots = xmalloc(cap * sizeof *t->pair_slots);
    for (uint32_t i = 0; i < cap; i++) t->pair_slots[i].key = TOKENIZER_PAIR_EMPTY;
    t->merges = xmalloc(((size_t)n_merges + 1) * sizeof *t->merges);
    t->unk_id = -1;
    t->bos_id = t->eos_id = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    return t;
}

void tokenizer_destroy(tokenizer_t **tp) {
    if (!tp || !*tp) return;
    tokenizer_t *t = *tp;
    free(t->tok);
    tok_buf_free(&t->text);
    free(t->str_slots);
    free(t->pair_slots);
    free(t->merges);
    free(t->prefix);
    free(t->suffix);
    free(t->cp_id);
    free(t->added_len);
    tok_norm_destroy(&t->normalizer);
    tok_pretok_destroy(&t->pretok);
    tok_decoder_destroy(&t->decoder);
    for (int i = 0; i < t->n_post; i++) {
        for (int k = 0; k < t->post[i].n; k++) free(t->post[i].items[k].ids);
        free(t->post[i].items);
    }
    free(t->post);
    tok_buf_free(&t->dtext);
    free(t->dtext_off);
    if (t->cache) {
        pthread_mutex_destroy(&t->cache->lock);
        free(t->cache);
    }
    cJSON_Delete(t->j_normalizer);
    cJSON_Delete(t->j_pretok);
    cJSON_Delete(t->j_post);
    cJSON_Delete(t->j_decoder);
    free(t);
    *tp = NULL;
}

static int32_t tokenizer_find(const tokenizer_t *t, const char *s, size_t n) {
    uint32_t h = tokenizer_hash_str(s, n);
    for (uint32_t i = h & t->str_mask;; i = (i + 1) & t->str_mask) {
        const tokenizer_str_slot_t *sl = &t->str_slots[i];
        if (sl->id < 0) return -1;
        if (sl->hash == h && t->tok[sl->id].len == n && memcmp(t->text.p + t->tok[sl->id].off, s, n) == 0)
            return sl->id;
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
    size_t bad;
    if (!tok_utf8_valid(s, n, &bad))
        return err_set(err, "token '%s' (id %lld) is not valid UTF-8 at byte %zu", tokenizer_show(s, n, a, sizeof a),
                       (long long)id, bad);
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
    if (k->flags & TOKENIZER_F_USED)
        return err_set(err, "duplicate id %lld: used by '%s' and '%s'", (long long)id,
                       tokenizer_show(tokenizer_text(t, (int32_t)id), k->len, a, sizeof a),
                       tokenizer_show(s, n, b, sizeof b));
    if (n >= UINT32_MAX || t->text.n + n + 1 >= UINT32_MAX) return err_set(err, "tokens too long (over 4 GB)");
    k->off = (uint32_t)t->text.n;
    tok_buf_add(&t->text, s, n);
    tok_buf_addc(&t->text, 0);
    k->len = (uint32_t)n;
    k->hash = tokenizer_hash_str(s, n);
    k->flags = flags | TOKENIZER_F_USED;
    uint32_t i = k->hash & t->str_mask;
    while (t->str_slots[i].id >= 0) i = (i + 1) & t->str_mask;
    t->str_slots[i] = (tokenizer_str_slot_t){(int32_t)id, k->hash};
    return 0;
}

// Adds the merge "a b" at rank (ranks must be added in increasing order). The merged token is
// a followed by b without its continuing_subword_prefix, as in the Rust library.
static int tokenizer_add_merge(tokenizer_t *t, const char *a, size_t an, const char *b, size_t bn, int32_t rank,
                               char *err) {
    char sa[64], sb[64];
    int32_t ia = tokenizer_find_vocab(t, a, an), ib = tokenizer_find_vocab(t, b, bn);
    if (ia < 0 || ib < 0)
        return err_set(err, "merge %d ('%s' '%s'): token '%s' is not in the vocab", rank,
                       tokenizer_show(a, an, sa, sizeof sa), tokenizer_show(b, bn, sb, sizeof sb),
                       ia < 0 ? sa : sb);
    if (bn < t->prefix_len)
        return err_set(err, "merge %d: '%s' is shorter than the continuing_subword_prefix", rank,
                       tokenizer_show(b, bn, sb, sizeof sb));
    char stack[128], *cat = an + bn <= sizeof stack ? stack : xmalloc(an + bn);
    memcpy(cat, a, an);
    memcpy(cat + an, b + t->prefix_len, bn - t->prefix_len);
    size_t cn = an + bn - t->prefix_len;
    int32_t im = tokenizer_find_vocab(t, cat, cn);
    if (im < 0) {
        char sm[64];
        err_set(err, "merge %d ('%s' '%s'): result '%s' is not in the vocab", rank,
                tokenizer_show(a, an, sa, sizeof sa), tokenizer_show(b, bn, sb, sizeof sb),
                tokenizer_show(cat, cn, sm, sizeof sm));
        if (cat != stack) free(cat);
        return -1;
    }
    if (cat != stack) free(cat);
    t->merges[rank] = (tokenizer_merge_t){ia, ib, im};
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
        if (n - i - 1 < t->prefix_len) continue;
        char *cat = xmalloc(n);
        memcpy(cat, m, i);
        memcpy(cat + i, m + i + 1 + t->prefix_len, n - i - 1 - t->prefix_len);
        bool ok = tokenizer_find_vocab(t, cat, n - 1 - t->prefix_len) >= 0;
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

static int tokenizer_len_cmp(const void *pa, const void *pb) {
    const uint32_t *a = pa, *b = pb;  // {group, len}: group up, length down
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return a[1] > b[1] ? -1 : a[1] < b[1];
}

// Derived tables, once every token and merge is in: byte-fallback ids, the character table,
// the added-token lengths, each token's decoded text, the word cache.
static int tokenizer_finish(tokenizer_t *t, char *err) {
    bool any = false;
    for (int32_t i = 0; i < t->n_ids && !any; i++) any = t->tok[i].flags & TOKENIZER_F_USED;
    if (!any) return err_set(err, "tokenizer has no tokens");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tokenizer_find_vocab(t, name, 6);
    }
    t->cp_id = xmalloc(TOKENIZER_CP_TABLE * sizeof *t->cp_id);
    for (uint32_t cp = 0; cp < TOKENIZER_CP_TABLE; cp++) {
        char s[2] = {(char)cp, 0};
        size_t n = 1;
        if (cp >= 0x80) {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
            n = 2;
        }
        t->cp_id[cp] = tokenizer_find_vocab(t, s, n);
    }

    size_t n_added = 0;
    for (int32_t i = 0; i < t->n_ids; i++)
        if (t->tok[i].flags & TOKENIZER_F_ADDED) n_added++;
    uint32_t(*keys)[2] = xmalloc((n_added ? n_added : 1) * sizeof *keys);
    size_t k = 0;
    for (int32_t i = 0; i < t->n_ids; i++) {
        const tokenizer_token_t *tk = &t->tok[i];
        if (!(tk->flags & TOKENIZER_F_ADDED)) continue;
        int pass = (tk->flags & TOKENIZER_F_NORMALIZED) ? 1 : 0;
        uint8_t first = (uint8_t)tokenizer_text(t, i)[0];
        keys[k][0] = (uint32_t)pass * 256 + first;
        keys[k][1] = tk->len;
        t->added_first[pass][first] = true;
        k++;
    }
    qsort(keys, n_added, sizeof *keys, tokenizer_len_cmp);
    t->added_len = xmalloc((n_added ? n_added : 1) * sizeof *t->added_len);
    memset(t->added_start, 0, sizeof t->added_start);
    size_t m = 0;
    for (size_t i = 0; i < n_added; i++) {
        if (i > 0 && keys[i][0] == keys[i - 1][0] && keys[i][1] == keys[i - 1][1]) continue;
        t->added_len[m++] = keys[i][1];
        t->added_start[keys[i][0] + 1]++;
    }
    for (int g = 0; g < 2 * 256; g++) t->added_start[g + 1] += t->added_start[g];
    free(keys);

    t->dtext_off = xmalloc(((size_t)t->n_ids + 1) * sizeof *t->dtext_off);
    tok_work_t w = {0};
    for (int32_t i = 0; i < t->n_ids; i++) {
        t->dtext_off[i] = (uint32_t)t->dtext.n;
        if (!(t->tok[i].flags & TOKENIZER_F_USED)) continue;
        if (!t->decoder) {
            tok_buf_add(&t->dtext, tokenizer_text(t, i), t->tok[i].len);
        } else if (tok_decoder_token(t->decoder, tokenizer_text(t, i), t->tok[i].len, &t->dtext, &w, err) != 0) {
            tok_work_free(&w);
            return -1;
        }
        tok_buf_addc(&t->dtext, 0);
        if (t->dtext.n >= UINT32_MAX) {
            tok_work_free(&w);
            return err_set(err, "decoded tokens too long (over 4 GB)");
        }
    }
    t->dtext_off[t->n_ids] = (uint32_t)t->dtext.n;
    tok_work_free(&w);

    t->cache = xcalloc(1, sizeof *t->cache);
    pthread_mutex_init(&t->cache->lock, NULL);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Added tokens

// The longest added token of `pass` starting at text[i] (end bounds it): its id and length.
static int32_t tokenizer_added_at(const tokenizer_t *t, int pass, const char *text, size_t i, size_t end,
                                  size_t *len) {
    uint32_t g = (uint32_t)pass * 256 + (uint8_t)text[i];
    for (uint32_t j = t->added_start[g]; j < t->added_start[g + 1]; j++) {
        uint32_t l = t->added_len[j];
        if (l > end - i) continue;
        int32_t id = tokenizer_find(t, text + i, l);
        if (id < 0) continue;
        uint8_t f = t->tok[id].flags;
        if ((f & TOKENIZER_F_ADDED) && ((f & TOKENIZER_F_NORMALIZED) ? 1 : 0) == pass) {
            *len = l;
            return id;
        }
    }
    return -1;
}

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

static uint32_t tokenizer_cp_at(const char *s, size_t n) {
    uint32_t cp;
    bool ok;
    tok_utf8_next((const uint8_t *)s, n, &cp, &ok);
    return cp;
}

// Cuts text[off, off+len) at the added tokens of one pass, as the Rust library does: leftmost
// match, longest there; a single_word token only between non-word characters (else skipped);
// lstrip / rstrip tokens take the whitespace beside them.
static void tokenizer_split_added(const tokenizer_t *t, const char *text, size_t off, size_t len, int pass,
                                  tokenizer_spans_t *out) {
    size_t end = off + len, done = off, i = off;
    if (t->added_start[pass * 256] == t->added_start[pass * 256 + 256]) {
        if (len) tokenizer_spans_push(out, off, len, -1);
        return;
    }
    while (i < end) {
        if (!t->added_first[pass][(uint8_t)text[i]]) {
            i++;
            continue;
        }
        size_t l;
        int32_t id = tokenizer_added_at(t, pass, text, i, end, &l);
        if (id < 0) {
            i++;
            continue;
        }
        uint8_t f = t->tok[id].flags;
        size_t ms = i, me = i + l;
        if (f & TOKENIZER_F_SINGLE_WORD) {
            size_t at = ms > off ? off + tok_utf8_last(text + off, ms - off) : off;
            bool left_ok = ms == off || !tok_is_word(tokenizer_cp_at(text + at, ms - at));
            bool right_ok = me == end || !tok_is_word(tokenizer_cp_at(text + me, end - me));
            if (!left_ok || !right_ok) {
                i = me;
                continue;
            }
        }
        if (f & TOKENIZER_F_LSTRIP)
            while (ms > done) {
                size_t at = off + tok_utf8_last(text + off, ms - off);
                if (!tok_is_whitespace(tokenizer_cp_at(text + at, ms - at))) break;
                ms = at;
            }
        if (f & TOKENIZER_F_RSTRIP)
            while (me < end) {
                uint32_t cp;
                bool ok;
                size_t cl = tok_utf8_next((const uint8_t *)text + me, end - me, &cp, &ok);
                if (!tok_is_whitespace(cp)) break;
                me += cl;
            }
        if (ms > done) tokenizer_spans_push(out, done, ms - done, -1);
        tokenizer_spans_push(out, ms, me - ms, id);
        done = i = me;
    }
    if (done < end) tokenizer_spans_push(out, done, end - done, -1);
}

// ---------------------------------------------------------------------------------------
// BPE

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
    tok_buf_t affixed;  // a character with continuing_subword_prefix / end_of_word_suffix
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

static bool tokenizer_cache_get(const tokenizer_t *t, const char *word, size_t len, uint32_t h, tokenizer_ids_t *out) {
    tokenizer_cache_t *c = t->cache;
    if (len > TOKENIZER_CACHE_KEY || pthread_mutex_trylock(&c->lock) != 0) return false;
    const tokenizer_cache_slot_t *s = &c->slot[h & (TOKENIZER_CACHE_SLOTS - 1)];
    bool hit = s->klen == len && s->hash == h && memcmp(s->key, word, len) == 0;
    int32_t ids[TOKENIZER_CACHE_IDS];
    uint8_t n = s->nids;
    if (hit) memcpy(ids, s->ids, n * sizeof *ids);
    pthread_mutex_unlock(&c->lock);
    for (uint8_t i = 0; hit && i < n; i++) tokenizer_ids_push(out, ids[i]);
    return hit;
}

static void tokenizer_cache_put(const tokenizer_t *t, const char *word, size_t len, uint32_t h, const int32_t *ids,
                                size_t n) {
    tokenizer_cache_t *c = t->cache;
    if (len > TOKENIZER_CACHE_KEY || n > TOKENIZER_CACHE_IDS || pthread_mutex_trylock(&c->lock) != 0) return;
    tokenizer_cache_slot_t *s = &c->slot[h & (TOKENIZER_CACHE_SLOTS - 1)];
    s->hash = h;
    s->klen = (uint8_t)len;
    s->nids = (uint8_t)n;
    memcpy(s->key, word, len);
    memcpy(s->ids, ids, n * sizeof *ids);
    pthread_mutex_unlock(&c->lock);
}

// The vocabulary id of the character word[i, i+cl), with the affixes the model asks for.
static int32_t tokenizer_char_id(const tokenizer_t *t, tokenizer_work_t *w, const char *word, size_t i, size_t cl,
                                 uint32_t cp, bool first, bool last, const char **s, size_t *sn) {
    *s = word + i;
    *sn = cl;
    bool pre = t->prefix && !first, suf = t->suffix && last;
    if (!pre && !suf) return cp < TOKENIZER_CP_TABLE ? t->cp_id[cp] : tokenizer_find_vocab(t, word + i, cl);
    w->affixed.n = 0;
    if (pre) tok_buf_add(&w->affixed, t->prefix, t->prefix_len);
    tok_buf_add(&w->affixed, word + i, cl);
    if (suf) tok_buf_add(&w->affixed, t->suffix, t->suffix_len);
    *s = w->affixed.p;
    *sn = w->affixed.n;
    return tokenizer_find_vocab(t, w->affixed.p, w->affixed.n);
}

// BPE on one word (well-formed UTF-8), appending its ids to out.
static int tokenizer_bpe_word(const tokenizer_t *t, const char *word, size_t len, tokenizer_work_t *w,
                              tokenizer_ids_t *out, char *err) {
    if (!len) return 0;
    if (t->ignore_merges) {
        int32_t id = tokenizer_find_vocab(t, word, len);
        if (id >= 0) {
            tokenizer_ids_push(out, id);
            return 0;
        }
    }
    uint32_t h = tokenizer_hash_str(word, len);
    if (tokenizer_cache_get(t, word, len, h, out)) return 0;
    if (len > INT32_MAX / 2) return err_set(err, "word of %zu bytes is too long to encode", len);
    w->n_sym = 0;
    w->n_heap = 0;
    bool unk_pending = false;  // as in the Rust library, an unknown character waits to be fused
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        bool ok;
        size_t cl = tok_utf8_next((const uint8_t *)word + i, len - i, &cp, &ok);
        const char *s;
        size_t sn;
        int32_t id = tokenizer_char_id(t, w, word, i, cl, cp, i == 0, i + cl == len, &s, &sn);
        if (id >= 0) {
            if (unk_pending) tokenizer_sym_push(w, t->unk_id);
            unk_pending = false;
            tokenizer_sym_push(w, id);
            i += cl;
            continue;
        }
        bool bytes_ok = t->byte_fallback;
        for (size_t k = 0; k < sn && bytes_ok; k++) bytes_ok = t->byte_id[(uint8_t)s[k]] >= 0;
        if (bytes_ok) {
            for (size_t k = 0; k < sn; k++) tokenizer_sym_push(w, t->byte_id[(uint8_t)s[k]]);
        } else if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) tokenizer_sym_push(w, t->unk_id);
            unk_pending = true;
        } else {
            char what[64];
            if (cp >= 0x20 && cp < 0x7f)
                snprintf(what, sizeof what, "'%c' (U+%04X)", (char)cp, cp);
            else
                snprintf(what, sizeof what, "U+%04X", cp);
            return err_set(err, "cannot encode character %s of the word at byte %zu: not in the vocab, and the model "
                                "has %s",
                           what, i,
                           t->byte_fallback ? "no byte_fallback token for it and no unk_token"
                                            : "neither byte_fallback nor an unk_token");
        }
        i += cl;
    }
    if (unk_pending) tokenizer_sym_push(w, t->unk_id);
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
        // Entries go stale when a neighbour merged first: the candidate holds only while the
        // pair at pos is still the pair of its rank (a rank names exactly one pair).
        const tokenizer_merge_t *m = &t->merges[c.rank];
        if (m->left != s->id || m->right != w->sym[s->next].id) continue;
        int32_t gone = s->next;
        s->id = m->id;
        s->next = w->sym[gone].next;
        w->sym[gone].id = -1;
        if (s->next >= 0) w->sym[s->next].prev = c.pos;
        if (s->prev >= 0) tokenizer_push_pair(t, w, s->prev);
        tokenizer_push_pair(t, w, c.pos);
    }
    size_t first = out->n;
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->sym[i].next) tokenizer_ids_push(out, w->sym[i].id);
    tokenizer_cache_put(t, word, len, h, out->v + first, out->n - first);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Encoding

static void tokenizer_post_process(const tokenizer_t *t, tokenizer_ids_t *ids) {
    for (int p = 0; p < t->n_post; p++) {
        tokenizer_ids_t next = {0};
        for (int k = 0; k < t->post[p].n; k++) {
            const tokenizer_item_t *it = &t->post[p].items[k];
            if (it->text)
                for (size_t i = 0; i < ids->n; i++) tokenizer_ids_push(&next, ids->v[i]);
            else
                for (int i = 0; i < it->n; i++) tokenizer_ids_push(&next, it->ids[i]);
        }
        free(ids->v);
        *ids = next;
    }
}

int tokenizer_encode_special(const tokenizer_t *t, const char *text, size_t len, bool add_special_tokens,
                             int32_t **ids, char *err) {
    if (ids) *ids = NULL;
    if (!t || !ids || (!text && len)) return err_set(err, "tokenizer_encode: bad arguments");
    // Pieces address their text with 32-bit offsets, and pre-tokenizers may quadruple it.
    if (len > TOKENIZER_MAX_TEXT)
        return err_set(err, "text of %zu bytes is too long to encode at once (limit %d MiB)", len,
                       TOKENIZER_MAX_TEXT >> 20);
    size_t bad;
    if (!tok_utf8_valid(text, len, &bad))
        return err_set(err, "text is not valid UTF-8: byte 0x%02X at offset %zu", (uint8_t)text[bad], bad);
    int rc = -1;
    tokenizer_spans_t raw = {0}, norm_spans = {0};
    tokenizer_work_t bw = {0};
    tokenizer_ids_t out = {0};
    tok_work_t w = {0};
    tok_buf_t norm = {0}, arena = {0};
    tok_pieces_t pieces = {0};
    tokenizer_split_added(t, text, 0, len, 0, &raw);
    for (size_t i = 0; i < raw.n; i++) {
        const tokenizer_span_t *r = &raw.v[i];
        if (r->id >= 0) {
            tokenizer_ids_push(&out, r->id);
            continue;
        }
        const char *s = text + r->off;
        size_t n = r->len;
        if (t->normalizer) {
            if (tok_norm_apply(t->normalizer, s, n, &norm, &w, err) != 0) goto fail;
            s = norm.p;
            n = norm.n;
        }
        norm_spans.n = 0;
        tokenizer_split_added(t, s, 0, n, 1, &norm_spans);
        for (size_t j = 0; j < norm_spans.n; j++) {
            const tokenizer_span_t *q = &norm_spans.v[j];
            if (q->id >= 0) {
                tokenizer_ids_push(&out, q->id);
                continue;
            }
            arena.n = 0;
            tok_buf_add(&arena, s + q->off, q->len);
            pieces.n = 0;
            tok_pieces_push(&pieces, 0, q->len, r->off == 0 && q->off == 0);
            if (t->pretok && tok_pretok_apply(t->pretok, &arena, &pieces, &w, err) != 0) goto fail;
            for (size_t k = 0; k < pieces.n; k++)
                if (tokenizer_bpe_word(t, arena.p + pieces.v[k].off, pieces.v[k].len, &bw, &out, err) != 0) goto fail;
        }
    }
    if (add_special_tokens) tokenizer_post_process(t, &out);
    if (out.n > INT32_MAX) {
        err_set(err, "text encodes to more than %d tokens", INT32_MAX);
        goto fail;
    }
    rc = (int)out.n;
    *ids = out.v ? out.v : xmalloc(sizeof **ids);
    out.v = NULL;
fail:
    free(out.v);
    free(raw.v);
    free(norm_spans.v);
    free(bw.sym);
    free(bw.heap);
    tok_buf_free(&bw.affixed);
    tok_work_free(&w);
    tok_buf_free(&norm);
    tok_buf_free(&arena);
    tok_pieces_free(&pieces);
    return rc;
}

int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int32_t **ids, char *err) {
    return tokenizer_encode_special(t, text, len, false, ids, err);
}

// ---------------------------------------------------------------------------------------
// Decoding and queries

const char *tokenizer_token_bytes(const tokenizer_t *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_ids || !(t->tok[id].flags & TOKENIZER_F_USED)) return NULL;
    if (len) *len = t->dtext_off[id + 1] - t->dtext_off[id] - 1;
    return t->dtext.p + t->dtext_off[id];
}

const char *tokenizer_token_text(const tokenizer_t *t, int32_t id) {
    return tokenizer_token_bytes(t, id, NULL);
}

char *tokenizer_decode(const tokenizer_t *t, const int32_t *ids, int n, bool skip_special, char *err) {
    if (!t || n < 0 || (n > 0 && !ids)) {
        err_set(err, "tokenizer_decode: bad arguments");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_ids || !(t->tok[ids[i]].flags & TOKENIZER_F_USED)) {
            err_set(err, "cannot decode id %d at position %d: not a token (vocab size %d)", ids[i], i, t->n_ids);
            return NULL;
        }
    tok_buf_t out = {0}, arena = {0};
    tok_pieces_t toks = {0};
    tok_work_t w = {0};
    for (int i = 0; i < n; i++) {
        const tokenizer_token_t *k = &t->tok[ids[i]];
        if (skip_special && (k->flags & TOKENIZER_F_SPECIAL)) continue;
        tok_pieces_push(&toks, arena.n, k->len, false);
        tok_buf_add(&arena, tokenizer_text(t, ids[i]), k->len);
    }
    char *res = NULL;
    if (t->decoder) {
        if (tok_decoder_run(t->decoder, &arena, &toks, &out, &w, err) != 0) goto done;
    } else {
        for (size_t i = 0; i < toks.n; i++) {
            if (i) tok_buf_addc(&out, ' ');
            tok_buf_add(&out, arena.p + toks.v[i].off, toks.v[i].len);
        }
    }
    tok_buf_addc(&out, 0);
    res = out.p;
    out.p = NULL;
done:
    tok_buf_free(&out);
    tok_buf_free(&arena);
    tok_pieces_free(&toks);
    tok_work_free(&w);
    return res;
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

int32_t tokenizer_bos_id(const tokenizer_t *t) {
    return t ? t->bos_id : -1;
}

int32_t tokenizer_eos_id(const tokenizer_t *t) {
    return t ? t->eos_id : -1;
}

// ---------------------------------------------------------------------------------------
// Parsing tokenizer.json

static int tokenizer_json_id(const cJSON *v, const char *what, const char *name, int64_t *out, char *err) {
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (d >= 0 && d < TOKENIZER_MAX_IDS && d == (double)(int64_t)d) {
        *out = (int64_t)d;
        return 0;
    }
    char sn[64];
    tokenizer_show(name, strlen(name), sn, sizeof sn);
    if (!cJSON_IsNumber(v)) return err_set(err, "%s '%s': id is not a number", what, sn);
    d = v->valuedouble;
    if (!(d >= 0 && d < TOKENIZER_MAX_IDS))
        return err_set(err, "%s '%s': id %g out of range (0..%d)", what, sn, d, TOKENIZER_MAX_IDS - 1);
    return err_set(err, "%s '%s': id %g is not an integer", what, sn, d);
}

// One template item: {"SpecialToken": {"id", "type_id"}} or {"Sequence": {"id", "type_id"}}.
static int tokenizer_parse_item(tokenizer_t *t, const cJSON *it, const cJSON *specials, const char *where,
                                bool single, tokenizer_item_t *out, char *err) {
    static const char *const k_item[] = {"SpecialToken", "Sequence", NULL};
    static const char *const k_ref[] = {"id", "type_id", NULL};
    if (!cJSON_IsObject(it) || cJSON_GetArraySize(it) != 1)
        return err_set(err, "%s must be {\"SpecialToken\": ...} or {\"Sequence\": ...}", where);
    if (tok_json_keys(it, where, "template item", k_item, err) != 0) return -1;
    const cJSON *ref = it->child;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(ref, "id");
    if (!cJSON_IsObject(ref) || !cJSON_IsString(id))
        return err_set(err, "%s.%s must be an object with a string \"id\" (and \"type_id\")", where, ref->string);
    if (tok_json_keys(ref, where, ref->string, k_ref, err) != 0) return -1;
    if (!strcmp(ref->string, "Sequence")) {
        if (strcmp(id->valuestring, "A") && strcmp(id->valuestring, "B"))
            return err_set(err, "%s: Sequence id must be A or B", where);
        if (single && strcmp(id->valuestring, "A"))
            return err_set(err, "%s: the single template refers to the second sequence B", where);
        out->text = true;
        return 0;
    }
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(specials, id->valuestring);
    if (!sp) return err_set(err, "%s: special token \"%.40s\" is not in special_tokens", where, id->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids"), *v;
    if (!cJSON_IsArray(ids))
        return err_set(err, "%s: special_tokens[\"%.40s\"] needs an \"ids\" array", where, id->valuestring);
    out->ids = xcalloc((size_t)cJSON_GetArraySize(ids) + 1, sizeof *out->ids);
    cJSON_ArrayForEach(v, ids) {
        int64_t x;
        if (tokenizer_json_id(v, "special token", id->valuestring, &x, err) != 0) return -1;
        if (x >= t->n_ids || !(t->tok[x].flags & TOKENIZER_F_USED))
            return err_set(err, "%s: special token \"%.40s\" has id %lld, which is no token", where, id->valuestring,
                           (long long)x);
        out->ids[out->n++] = (int32_t)x;
    }
    return 0;
}

static int tokenizer_parse_template(tokenizer_t *t, const cJSON *j, const char *where, char *err) {
    static const char *const k[] = {"type", "single", "pair", "special_tokens", NULL};
    static const char *const k_sp[] = {"id", "ids", "tokens", NULL};
    if (tok_json_keys(j, where, "TemplateProcessing", k, err) != 0) return -1;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *pair = cJSON_GetObjectItemCaseSensitive(j, "pair");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens"), *it;
    if (!cJSON_IsArray(single))
        return err_set(err, "%s (TemplateProcessing) needs a \"single\" array of items", where);
    if (pair && !cJSON_IsNull(pair) && !cJSON_IsArray(pair))
        return err_set(err, "%s (TemplateProcessing): \"pair\" must be an array of items", where);
    if (specials && !cJSON_IsNull(specials) && !cJSON_IsObject(specials))
        return err_set(err, "%s (TemplateProcessing): \"special_tokens\" must be an object", where);
    char sub[200];
    cJSON_ArrayForEach(it, specials) {
        tok_where(sub, sizeof sub, where, "special_tokens", 0);
        if (!cJSON_IsObject(it) || tok_json_keys(it, sub, it->string, k_sp, err) != 0)
            return err_set(err, "%s.special_tokens[\"%.40s\"] must be {\"id\", \"ids\", \"tokens\"}", where,
                           it->string);
    }
    t->post = xrealloc(t->post, ((size_t)t->n_post + 1) * sizeof *t->post);
    tokenizer_template_t *tp = &t->post[t->n_post++];
    *tp = (tokenizer_template_t){xcalloc((size_t)cJSON_GetArraySize(single) + 1, sizeof *tp->items), 0};
    char base[160];
    tok_where(base, sizeof base, where, "single", 0);
    cJSON_ArrayForEach(it, single) {
        tokenizer_item_t *item = &tp->items[tp->n++];
        if (tokenizer_parse_item(t, it, specials, tok_where(sub, sizeof sub, base, NULL, tp->n - 1), true, item, err))
            return -1;
    }
    // The pair template is not used (one text at a time), but must be well-formed.
    tok_where(base, sizeof base, where, "pair", 0);
    int idx = 0;
    cJSON_ArrayForEach(it, pair) {
        tokenizer_item_t item = {0};
        int rc = tokenizer_parse_item(t, it, specials, tok_where(sub, sizeof sub, base, NULL, idx++), false, &item, err);
        free(item.ids);
        if (rc) return -1;
    }
    // The first token added before the text, and the first after it.
    if (t->n_post == 1) {
        bool after = false;
        for (int i = 0; i < tp->n; i++) {
            if (tp->items[i].text) {
                after = true;
            } else if (tp->items[i].n > 0) {
                int32_t *slot = after ? &t->eos_id : &t->bos_id;
                if (*slot < 0) *slot = tp->items[i].ids[0];
            }
        }
    }
    return 0;
}

static int tokenizer_parse_post(tokenizer_t *t, const cJSON *j, const char *where, int depth, char *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsObject(j) || !cJSON_IsString(type))
        return err_set(err, "%s must be null or an object with a string \"type\"", where);
    if (depth >= TOK_MAX_DEPTH) return err_set(err, "%s: post-processors nested more than %d deep", where, TOK_MAX_DEPTH);
    const char *ty = type->valuestring;
    if (!strcmp(ty, "TemplateProcessing")) return tokenizer_parse_template(t, j, where, err);
    if (!strcmp(ty, "ByteLevel")) {
        // It only trims offsets, which we do not report: the ids are untouched.
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        return tok_json_keys(j, where, ty, k, err);
    }
    if (!strcmp(ty, "Sequence")) {
        static const char *const k[] = {"type", "processors", NULL};
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "processors"), *it;
        if (tok_json_keys(j, where, ty, k, err) != 0) return -1;
        if (!cJSON_IsArray(list)) return err_set(err, "%s (Sequence) needs a \"processors\" array", where);
        char base[160], sub[200];
        tok_where(base, sizeof base, where, "processors", 0);
        int i = 0;
        cJSON_ArrayForEach(it, list) {
            if (tokenizer_parse_post(t, it, tok_where(sub, sizeof sub, base, NULL, i++), depth + 1, err) != 0)
                return -1;
        }
        return 0;
    }
    return err_set(err, "%s: post-processor %.40s is not supported (supported: TemplateProcessing, ByteLevel, "
                        "Sequence)",
                   where, ty);
}

static int tokenizer_json_affix(const cJSON *model, const char *key, char **out, size_t *len, char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return err_set(err, "model.%s must be a string or null", key);
    size_t n = strlen(v->valuestring);
    if (!tok_utf8_valid(v->valuestring, n, NULL)) return err_set(err, "model.%s is not valid UTF-8", key);
    if (n) {
        *out = xstrdup(v->valuestring);
        *len = n;
    }
    return 0;
}

// A component as the file has it: NULL when absent or null, else a copy kept for save.
static int tokenizer_keep(const cJSON *root, const char *key, cJSON **out, char *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    *out = cJSON_Duplicate(v, true);
    if (!*out) return err_set(err, "out of memory copying %s", key);
    return 0;
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
    static const char *const k_root[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                         "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    if (tok_json_keys(root, "tokenizer.json", "top level", k_root, err) != 0) goto fail;
    // Truncation and padding change the ids HF's encode returns; we do neither.
    for (int i = 0; i < 2; i++) {
        const char *key = i ? "padding" : "truncation";
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
        if (v && !cJSON_IsNull(v)) {
            err_set(err, "%s is not supported (must be null): it would change the ids of encode", key);
            goto fail;
        }
    }

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
            err_set(err, "model: model type %.40s is not supported (only BPE)", type->valuestring);
            goto fail;
        }
    } else if (!merges) {
        err_set(err, "model has no type and no merges; only BPE is supported");
        goto fail;
    }
    static const char *const k_model[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                          "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                          "vocab", "merges", NULL};
    if (tok_json_keys(model, "model", "BPE", k_model, err) != 0) goto fail;
    if (!cJSON_IsObject(vocab)) {
        err_set(err, "model.vocab must be an object {token: id}");
        goto fail;
    }
    if (merges && !cJSON_IsNull(merges) && !cJSON_IsArray(merges)) {
        err_set(err, "model.merges must be an array");
        goto fail;
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout)) {
        err_set(err, "model.dropout is not supported (must be null): it makes encoding random");
        goto fail;
    }
    bool byte_fallback, fuse_unk, ignore_merges;
    if (tok_json_bool(model, "byte_fallback", false, &byte_fallback, "model", err) != 0 ||
        tok_json_bool(model, "fuse_unk", false, &fuse_unk, "model", err) != 0 ||
        tok_json_bool(model, "ignore_merges", false, &ignore_merges, "model", err) != 0)
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
    // The token strings cannot be longer than the file: one reservation, no copying as it grows
    // (pages never written are never touched).
    tok_buf_reserve(&t->text, len + 1);
    t->byte_fallback = byte_fallback;
    t->fuse_unk = fuse_unk;
    t->ignore_merges = ignore_merges;
    if (tokenizer_json_affix(model, "continuing_subword_prefix", &t->prefix, &t->prefix_len, err) != 0 ||
        tokenizer_json_affix(model, "end_of_word_suffix", &t->suffix, &t->suffix_len, err) != 0)
        goto fail;

    cJSON_ArrayForEach(it, vocab) {
        tokenizer_json_id(it, "vocab token", it->string, &id, err);
        if (tokenizer_set_token(t, id, it->string, strlen(it->string), TOKENIZER_F_VOCAB, err) != 0) goto fail;
    }
    idx = 0;
    cJSON_ArrayForEach(it, added) {
        static const char *const k_added[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized",
                                              "special", NULL};
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        tokenizer_json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), "added token", content, &id, err);
        bool special, lstrip, rstrip, single_word, normalized;
        char where[32];
        snprintf(where, sizeof where, "added_tokens[%d]", idx++);
        if (tok_json_keys(it, where, "added token", k_added, err) != 0 ||
            tok_json_bool(it, "special", false, &special, where, err) != 0 ||
            tok_json_bool(it, "lstrip", false, &lstrip, where, err) != 0 ||
            tok_json_bool(it, "rstrip", false, &rstrip, where, err) != 0 ||
            tok_json_bool(it, "single_word", false, &single_word, where, err) != 0 ||
            tok_json_bool(it, "normalized", !special, &normalized, where, err) != 0)
            goto fail;
        uint8_t flags = TOKENIZER_F_ADDED | (special ? TOKENIZER_F_SPECIAL : 0) | (lstrip ? TOKENIZER_F_LSTRIP : 0) |
                        (rstrip ? TOKENIZER_F_RSTRIP : 0) | (normalized ? TOKENIZER_F_NORMALIZED : 0) |
                        (single_word ? TOKENIZER_F_SINGLE_WORD : 0);
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
        } else if (cJSON_IsArray(it) && cJSON_IsString(it->child) && cJSON_IsString(it->child->next) &&
                   !it->child->next->next) {
            a = it->child->valuestring, an = strlen(a);
            b = it->child->next->valuestring, bn = strlen(b);
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

    const cJSON *c;
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "normalizer")) && !cJSON_IsNull(c) &&
        !(t->normalizer = tok_norm_parse(c, "normalizer", 0, err)))
        goto fail;
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")) && !cJSON_IsNull(c) &&
        !(t->pretok = tok_pretok_parse(c, "pre_tokenizer", 0, err)))
        goto fail;
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "decoder")) && !cJSON_IsNull(c) &&
        !(t->decoder = tok_decoder_parse(c, "decoder", 0, err)))
        goto fail;
    if ((c = cJSON_GetObjectItemCaseSensitive(root, "post_processor")) && !cJSON_IsNull(c) &&
        tokenizer_parse_post(t, c, "post_processor", 0, err) != 0)
        goto fail;
    if (tokenizer_keep(root, "normalizer", &t->j_normalizer, err) || tokenizer_keep(root, "pre_tokenizer", &t->j_pretok, err) ||
        tokenizer_keep(root, "post_processor", &t->j_post, err) || tokenizer_keep(root, "decoder", &t->j_decoder, err))
        goto fail;
    if (tokenizer_finish(t, err) != 0) goto fail;
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
    // A Fuse decoder: HF's libraries then join tokens without spaces (with no decoder they
    // join with " ").
    t->j_decoder = cJSON_CreateObject();
    if (!t->j_decoder || !cJSON_AddStringToObject(t->j_decoder, "type", "Fuse")) {
        err_set(err, "out of memory building the decoder");
        goto fail;
    }
    if (!(t->decoder = tok_decoder_parse(t->j_decoder, "decoder", 0, err))) goto fail;
    if (tokenizer_finish(t, err) != 0) goto fail;
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

static bool tokenizer_add_str_or_null(cJSON *o, const char *key, const char *s) {
    return s ? cJSON_AddStringToObject(o, key, s) != NULL : cJSON_AddNullToObject(o, key) != NULL;
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
        ok = cJSON_AddNumberToObject(a, "id", i) && cJSON_AddStringToObject(a, "content", tokenizer_text(t, i)) &&
             tokenizer_add_bool(a, "single_word", k->flags & TOKENIZER_F_SINGLE_WORD) &&
             tokenizer_add_bool(a, "lstrip", k->flags & TOKENIZER_F_LSTRIP) &&
             tokenizer_add_bool(a, "rstrip", k->flags & TOKENIZER_F_RSTRIP) &&
             tokenizer_add_bool(a, "normalized", k->flags & TOKENIZER_F_NORMALIZED) &&
             tokenizer_add_bool(a, "special", k->flags & TOKENIZER_F_SPECIAL);
    }
    ok = ok && tokenizer_add_copy(root, "normalizer", t->j_normalizer) &&
         tokenizer_add_copy(root, "pre_tokenizer", t->j_pretok) &&
         tokenizer_add_copy(root, "post_processor", t->j_post) && tokenizer_add_copy(root, "decoder", t->j_decoder);
    cJSON *model = ok ? cJSON_AddObjectToObject(root, "model") : NULL;
    ok = ok && model && cJSON_AddStringToObject(model, "type", "BPE") && cJSON_AddNullToObject(model, "dropout") &&
         tokenizer_add_str_or_null(model, "unk_token", t->unk_id >= 0 ? tokenizer_text(t, t->unk_id) : NULL) &&
         tokenizer_add_str_or_null(model, "continuing_subword_prefix", t->prefix) &&
         tokenizer_add_str_or_null(model, "end_of_word_suffix", t->suffix) &&
         tokenizer_add_bool(model, "fuse_unk", t->fuse_unk) &&
         tokenizer_add_bool(model, "byte_fallback", t->byte_fallback) &&
         tokenizer_add_bool(model, "ignore_merges", t->ignore_merges);
    cJSON *vocab = ok ? cJSON_AddObjectToObject(model, "vocab") : NULL;
    ok = ok && vocab;
    for (int32_t i = 0; ok && i < t->n_ids; i++)
        if (t->tok[i].flags & TOKENIZER_F_VOCAB) ok = cJSON_AddNumberToObject(vocab, tokenizer_text(t, i), i) != NULL;
    cJSON *merges = ok ? cJSON_AddArrayToObject(model, "merges") : NULL;
    ok = ok && merges;
    for (int32_t r = 0; ok && r < t->n_merges; r++) {
        const tokenizer_merge_t *m = &t->merges[r];
        const tokenizer_pair_slot_t *p = tokenizer_find_pair(t, m->left, m->right);
        if (!p || p->rank != r) continue;  // overridden by a later duplicate
        const char *pair[2] = {tokenizer_text(t, m->left), tokenizer_text(t, m->right)};
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

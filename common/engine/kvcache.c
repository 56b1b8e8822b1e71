// kvcache.c - paged KV cache: a block pool with reference counts, per-sequence block tables,
// copy on write for blocks shared between forked sequences.
//
// Invariants kept by every function:
//   - a sequence's table covers [0, n_table * block_size) positions and len <= that capacity;
//   - refs[b] equals the number of table entries (over all live sequences) naming block b, and
//     b is on the free stack exactly when refs[b] == 0;
//   - a shared block (refs > 1) only ever holds positions below the len of each sequence that
//     names it, because fork shares only the blocks holding data and truncate drops every block
//     past the new length. So a write (always at positions >= len) into a shared block is the
//     first write after a fork and must copy.
#include "kvcache.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool live;
    int len;
    int *table;          // block ids in position order
    int n_table;
    int cap_table;
} kv_seq_t;

struct kvcache {
    const kernels_t *k;   // backend holding the pools
    bool host_pools;      // pools from pool_alloc (CPU backend), else from k->alloc
    int n_layers, kv_dim, block_size, n_blocks, max_seqs;
    size_t layer_floats;  // block_size * kv_dim: one layer of one block
    size_t block_floats;  // n_layers * layer_floats: one block, all layers
    float *k_pool, *v_pool;   // backend memory
    int *refs;            // (n_blocks)
    int *free_blocks;     // stack of free block ids
    int n_free;
    kv_seq_t *seqs;       // (max_seqs)
    int *free_seqs;       // stack of free sequence ids
    int n_free_seqs;
};

static bool mul_fits(size_t a, size_t b, size_t limit, size_t *out) {
    if (a != 0 && b > limit / a) return false;
    *out = a * b;
    return true;
}

// The pool may be many GiB and its size comes from configuration, so running out of memory
// here is a reportable error rather than an abort.
static float *pool_alloc(size_t n_floats) {
    // Zeroed (kernels_host_alloc): the pages are committed now, so an oversized pool fails at
    // start-up instead of at some later page fault, and never-written rows read as zeros rather
    // than garbage.
    if (n_floats > SIZE_MAX / sizeof(float)) return NULL;
    return kernels_host_alloc(n_floats * sizeof(float));
}

kvcache_t *kvcache_new(int n_layers, int kv_dim, int block_size, int n_blocks, int max_seqs, char *err) {
    return kvcache_new_on(kernels_cpu(), n_layers, kv_dim, block_size, n_blocks, max_seqs, err);
}

static kvcache_t *cache_new(const kernels_t *k, int n_layers, int kv_dim, int block_size, int n_blocks, int max_seqs,
                            bool pools, char *err);

kvcache_t *kvcache_new_on(const kernels_t *k, int n_layers, int kv_dim, int block_size, int n_blocks, int max_seqs,
                          char *err) {
    return cache_new(k, n_layers, kv_dim, block_size, n_blocks, max_seqs, true, err);
}

kvcache_t *kvcache_new_virtual(const kernels_t *k, int n_layers, int kv_dim, int block_size, int n_blocks,
                               int max_seqs, char *err) {
    return cache_new(k, n_layers, kv_dim, block_size, n_blocks, max_seqs, false, err);
}

static kvcache_t *cache_new(const kernels_t *k, int n_layers, int kv_dim, int block_size, int n_blocks, int max_seqs,
                            bool pools, char *err) {
    if (!k) {
        err_set(err, "kvcache: no backend given");
        return NULL;
    }
    if (n_layers <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0 || max_seqs <= 0) {
        err_set(err,
                "kvcache: invalid arguments (n_layers=%d kv_dim=%d block_size=%d n_blocks=%d max_seqs=%d), "
                "all must be > 0",
                n_layers, kv_dim, block_size, n_blocks, max_seqs);
        return NULL;
    }
    // Room for the 64-byte round-up and the byte count of one pool.
    const size_t float_limit = (SIZE_MAX - 64) / sizeof(float);
    size_t layer_floats, block_floats, pool_floats, positions;
    if (!mul_fits((size_t)block_size, (size_t)kv_dim, float_limit, &layer_floats) ||
        !mul_fits(layer_floats, (size_t)n_layers, float_limit, &block_floats) ||
        !mul_fits(block_floats, (size_t)n_blocks, float_limit, &pool_floats)) {
        err_set(err, "kvcache: pool size overflows (n_layers=%d kv_dim=%d block_size=%d n_blocks=%d)", n_layers,
                kv_dim, block_size, n_blocks);
        return NULL;
    }
    // Positions are ints throughout the engine; one sequence may own the whole pool.
    if (!mul_fits((size_t)block_size, (size_t)n_blocks, (size_t)INT_MAX, &positions)) {
        err_set(err, "kvcache: block_size * n_blocks = %zu * %d positions exceeds INT_MAX", (size_t)block_size,
                n_blocks);
        return NULL;
    }
    // Host memory is the CPU backend's memory (its alloc is aligned_alloc, its free is free), so
    // for it the pools come from pool_alloc, whose failure is reportable. Another backend's alloc
    // aborts with its own message when the device is out of memory.
    bool host = k == kernels_cpu();
    float *k_pool = NULL, *v_pool = NULL;
    if (!pools) {
        host = false;
    } else if (host) {
        k_pool = pool_alloc(pool_floats);
        v_pool = k_pool ? pool_alloc(pool_floats) : NULL;
        if (!k_pool || !v_pool) {
            free(k_pool);
            err_set(err, "kvcache: cannot allocate %zu MiB for the K and V pools",
                    (pool_floats / (1024 * 1024)) * 2 * sizeof(float));
            return NULL;
        }
    } else {
        k_pool = k->alloc(pool_floats * sizeof(float));
        v_pool = k->alloc(pool_floats * sizeof(float));
    }

    kvcache_t *kc = xcalloc(1, sizeof(*kc));
    kc->k = k;
    kc->host_pools = host;
    kc->n_layers = n_layers;
    kc->kv_dim = kv_dim;
    kc->block_size = block_size;
    kc->n_blocks = n_blocks;
    kc->max_seqs = max_seqs;
    kc->layer_floats = layer_floats;
    kc->block_floats = block_floats;
    kc->k_pool = k_pool;
    kc->v_pool = v_pool;
    kc->refs = xcalloc((size_t)n_blocks, sizeof(int));
    kc->free_blocks = xmalloc((size_t)n_blocks * sizeof(int));
    // Stacks are filled in reverse so ids are handed out 0, 1, 2, ...: reproducible layouts.
    for (int i = 0; i < n_blocks; i++) kc->free_blocks[i] = n_blocks - 1 - i;
    kc->n_free = n_blocks;
    kc->seqs = xcalloc((size_t)max_seqs, sizeof(kv_seq_t));
    kc->free_seqs = xmalloc((size_t)max_seqs * sizeof(int));
    for (int i = 0; i < max_seqs; i++) kc->free_seqs[i] = max_seqs - 1 - i;
    kc->n_free_seqs = max_seqs;
    return kc;
}

void kvcache_destroy(kvcache_t **kcp) {
    if (!kcp || !*kcp) return;
    kvcache_t *kc = *kcp;
    for (int i = 0; i < kc->max_seqs; i++) free(kc->seqs[i].table);
    free(kc->seqs);
    free(kc->free_seqs);
    free(kc->refs);
    free(kc->free_blocks);
    if (kc->host_pools) {
        free(kc->k_pool);
        free(kc->v_pool);
    } else if (kc->k_pool) {
        kc->k->free(kc->k_pool);
        kc->k->free(kc->v_pool);
    }
    free(kc);
    *kcp = NULL;
}

static kv_seq_t *seq_get(const kvcache_t *kc, int seq) {
    ASSERT(kc != NULL);
    ASSERT(seq >= 0 && seq < kc->max_seqs && kc->seqs[seq].live);
    return &kc->seqs[seq];
}

static int block_take(kvcache_t *kc) {
    ASSERT(kc->n_free > 0);
    int b = kc->free_blocks[--kc->n_free];
    kc->refs[b] = 1;
    return b;
}

static void block_release(kvcache_t *kc, int b) {
    ASSERT(kc->refs[b] > 0);
    if (--kc->refs[b] == 0) kc->free_blocks[kc->n_free++] = b;
}

static void table_grow(kv_seq_t *s, int n) {
    if (n <= s->cap_table) return;
    int cap = s->cap_table < 4 ? 4 : s->cap_table;
    while (cap < n) cap = cap > INT_MAX / 2 ? n : cap * 2;
    s->table = xrealloc(s->table, (size_t)cap * sizeof(int));
    s->cap_table = cap;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int kvcache_seq_new(kvcache_t *kc, char *err) {
    ASSERT(kc != NULL);
    if (kc->n_free_seqs == 0) return err_set(err, "too many sequences (max %d)", kc->max_seqs);
    int id = kc->free_seqs[--kc->n_free_seqs];
    kv_seq_t *s = &kc->seqs[id];
    s->live = true;
    s->len = 0;
    s->n_table = 0;
    return id;
}

int kvcache_seq_fork(kvcache_t *kc, int src, char *err) {
    const kv_seq_t *from = seq_get(kc, src);
    int id = kvcache_seq_new(kc, err);
    if (id < 0) return -1;
    kv_seq_t *to = &kc->seqs[id];
    // Reserved-but-unfilled capacity of src stays with src: the fork gets only the blocks
    // holding data, which keeps every shared block below the len of all its owners.
    int n = (int)ceil_div(from->len, kc->block_size);
    table_grow(to, n);
    for (int i = 0; i < n; i++) {
        to->table[i] = from->table[i];
        kc->refs[from->table[i]]++;
    }
    to->n_table = n;
    to->len = from->len;
    return id;
}

void kvcache_seq_free(kvcache_t *kc, int seq) {
    if (!kc || seq < 0 || seq >= kc->max_seqs || !kc->seqs[seq].live) return;
    kv_seq_t *s = &kc->seqs[seq];
    for (int i = 0; i < s->n_table; i++) block_release(kc, s->table[i]);
    s->n_table = 0;
    s->len = 0;
    s->live = false;
    // The table allocation is kept for the next sequence that gets this slot.
    kc->free_seqs[kc->n_free_seqs++] = seq;
}

int kvcache_seq_len(const kvcache_t *kc, int seq) { return seq_get(kc, seq)->len; }

void kvcache_seq_truncate(kvcache_t *kc, int seq, int new_len) {
    kv_seq_t *s = seq_get(kc, seq);
    ASSERT(new_len >= 0 && new_len <= s->len);
    int keep = (int)ceil_div(new_len, kc->block_size);
    for (int i = keep; i < s->n_table; i++) block_release(kc, s->table[i]);
    if (keep < s->n_table) s->n_table = keep;
    s->len = new_len;
}

// Blocks a reserve of n_new positions takes: fresh blocks past the table's end plus one copy
// for every shared block the new positions fall into.
static int64_t reserve_cost(const kvcache_t *kc, const kv_seq_t *s, int n_new) {
    if (n_new == 0) return 0;
    int64_t end_block = ceil_div((int64_t)s->len + n_new, kc->block_size);
    int64_t fresh = end_block > s->n_table ? end_block - s->n_table : 0;
    int64_t last = end_block < s->n_table ? end_block : s->n_table;
    int64_t copies = 0;
    for (int64_t b = s->len / kc->block_size; b < last; b++)
        if (kc->refs[s->table[b]] > 1) copies++;
    return fresh + copies;
}

int kvcache_blocks_needed(const kvcache_t *kc, int seq, int n_new) {
    const kv_seq_t *s = seq_get(kc, seq);
    ASSERT(n_new >= 0);
    int64_t need = reserve_cost(kc, s, n_new);
    return need > INT_MAX ? INT_MAX : (int)need;
}

int kvcache_reserve(kvcache_t *kc, int seq, int n_new, char *err) {
    kv_seq_t *s = seq_get(kc, seq);
    ASSERT(n_new >= 0);
    int64_t need = reserve_cost(kc, s, n_new);
    if (need > kc->n_free)
        return err_set(err, "KV cache full: need %lld blocks, %d free", (long long)need, kc->n_free);
    if (n_new == 0) return 0;

    int64_t end_block = ceil_div((int64_t)s->len + n_new, kc->block_size);
    int64_t last = end_block < s->n_table ? end_block : s->n_table;
    for (int64_t b = s->len / kc->block_size; b < last; b++) {
        int old = s->table[b];
        if (kc->refs[old] <= 1) continue;
        int nb = block_take(kc);
        // Whole block, all layers: the other owners keep the old one untouched, and the rows
        // below len (the shared prefix) must come along.
        size_t src_off = (size_t)old * kc->block_floats, dst_off = (size_t)nb * kc->block_floats;
        // Backend memory: the backend's device-to-device copy (memcpy on the CPU backend).
        if (kc->k_pool) {
            kc->k->copy(kc->k_pool + dst_off, kc->k_pool + src_off, kc->block_floats * sizeof(float));
            kc->k->copy(kc->v_pool + dst_off, kc->v_pool + src_off, kc->block_floats * sizeof(float));
        }
        block_release(kc, old);
        s->table[b] = nb;
    }
    if (end_block > s->n_table) {
        table_grow(s, (int)end_block);
        while (s->n_table < end_block) s->table[s->n_table++] = block_take(kc);
    }
    return 0;
}

void kvcache_advance(kvcache_t *kc, int seq, int n) {
    kv_seq_t *s = seq_get(kc, seq);
    ASSERT(n >= 0 && (int64_t)s->len + n <= (int64_t)s->n_table * kc->block_size);
    s->len += n;
}

static float *row_ptr(const kvcache_t *kc, float *pool, int seq, int layer, int pos) {
    const kv_seq_t *s = seq_get(kc, seq);
    ASSERT(layer >= 0 && layer < kc->n_layers);
    ASSERT(pos >= 0 && (int64_t)pos < (int64_t)s->n_table * kc->block_size);
    size_t block = (size_t)s->table[pos / kc->block_size];
    return pool + (block * (size_t)kc->n_layers + (size_t)layer) * kc->layer_floats +
           (size_t)(pos % kc->block_size) * (size_t)kc->kv_dim;
}

float *kvcache_k(kvcache_t *kc, int seq, int layer, int pos) { return row_ptr(kc, kc->k_pool, seq, layer, pos); }

size_t kvcache_row_offset(kvcache_t *kc, int seq, int layer, int pos) {
    return (size_t)(row_ptr(kc, kc->k_pool, seq, layer, pos) - kc->k_pool);
}

float *kvcache_pool(kvcache_t *kc, bool values) { return values ? kc->v_pool : kc->k_pool; }

float *kvcache_v(kvcache_t *kc, int seq, int layer, int pos) { return row_ptr(kc, kc->v_pool, seq, layer, pos); }

kvcache_view_t kvcache_layer_view(const kvcache_t *kc, int seq, int layer) {
    const kv_seq_t *s = seq_get(kc, seq);
    ASSERT(layer >= 0 && layer < kc->n_layers);
    kvcache_view_t v;
    v.k = kc->k_pool + (size_t)layer * kc->layer_floats;
    v.v = kc->v_pool + (size_t)layer * kc->layer_floats;
    v.block_stride = kc->block_floats;
    v.table = s->table;
    v.block_size = kc->block_size;
    return v;
}

int kvcache_free_blocks(const kvcache_t *kc) { return kc->n_free; }

const kernels_t *kvcache_backend(const kvcache_t *kc) { return kc->k; }

int kvcache_total_blocks(const kvcache_t *kc) { return kc->n_blocks; }

int kvcache_block_size(const kvcache_t *kc) { return kc->block_size; }

int kvcache_live_seqs(const kvcache_t *kc) { return kc->max_seqs - kc->n_free_seqs; }
int kvcache_max_seqs(const kvcache_t *kc) { return kc->max_seqs; }


int kvcache_block_refs(const kvcache_t *kc, int seq, int pos) {
    const kv_seq_t *s = seq_get(kc, seq);
    ASSERT(pos >= 0 && (int64_t)pos < (int64_t)s->n_table * kc->block_size);
    return kc->refs[s->table[pos / kc->block_size]];
}

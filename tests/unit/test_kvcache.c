// test_kvcache.c - paged KV cache: block accounting, fork / copy on write, all-or-nothing
// reserve, truncate, addressing of rows and layer views.
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/engine/kvcache.h"

#define L 3
#define D 4
#define BS 4

static kvcache_t *make(int n_blocks, int max_seqs) {
    char err[ERR_LEN] = "";
    kvcache_t *kc = kvcache_new(L, D, BS, n_blocks, max_seqs, err);
    cr_assert_not_null(kc, "kvcache_new: %s", err);
    return kc;
}

// Row contents are a function of (tag, layer, dim) so every row of every sequence is distinct
// and checkable; V rows are the negation so K/V mix-ups show too.
static float cell(int tag, int layer, int d) { return (float)(tag * 100 + layer * 10 + d + 1); }

static void write_row(kvcache_t *kc, int seq, int pos, int tag) {
    for (int l = 0; l < L; l++) {
        float *k = kvcache_k(kc, seq, l, pos), *v = kvcache_v(kc, seq, l, pos);
        for (int d = 0; d < D; d++) {
            k[d] = cell(tag, l, d);
            v[d] = -cell(tag, l, d);
        }
    }
}

static bool row_is(kvcache_t *kc, int seq, int pos, int tag) {
    for (int l = 0; l < L; l++) {
        const float *k = kvcache_k(kc, seq, l, pos), *v = kvcache_v(kc, seq, l, pos);
        for (int d = 0; d < D; d++)
            if (k[d] != cell(tag, l, d) || v[d] != -cell(tag, l, d)) return false;
    }
    return true;
}

// Reserves, writes rows tagged tag0, tag0+1, ... and advances.
static void append(kvcache_t *kc, int seq, int n, int tag0) {
    char err[ERR_LEN] = "";
    int len = kvcache_seq_len(kc, seq);
    cr_assert_eq(kvcache_reserve(kc, seq, n, err), 0, "reserve: %s", err);
    for (int i = 0; i < n; i++) write_row(kc, seq, len + i, tag0 + i);
    kvcache_advance(kc, seq, n);
}

Test(kvcache, new_rejects_bad_arguments) {
    char err[ERR_LEN] = "";
    cr_assert_null(kvcache_new(0, D, BS, 8, 4, err));
    cr_assert(strstr(err, "invalid") != NULL, "err: %s", err);
    cr_assert_null(kvcache_new(L, -1, BS, 8, 4, err));
    cr_assert_null(kvcache_new(L, D, 0, 8, 4, err));
    cr_assert_null(kvcache_new(L, D, BS, 0, 4, err));
    cr_assert_null(kvcache_new(L, D, BS, 8, 0, err));
    err[0] = 0;
    // 2^31 * 2^31 * ... floats cannot be addressed.
    cr_assert_null(kvcache_new(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 1, err));
    cr_assert(strstr(err, "overflow") != NULL, "err: %s", err);
    err[0] = 0;
    cr_assert_null(kvcache_new(1, 1, 1 << 16, 1 << 16, 1, err));
    cr_assert(strstr(err, "INT_MAX") != NULL, "err: %s", err);
}

Test(kvcache, destroy_accepts_null_and_clears) {
    kvcache_destroy(NULL);
    kvcache_t *kc = NULL;
    kvcache_destroy(&kc);
    kc = make(4, 2);
    kvcache_destroy(&kc);
    cr_assert_null(kc);
}

Test(kvcache, alloc_free_accounting) {
    kvcache_t *kc = make(16, 4);
    cr_assert_eq(kvcache_total_blocks(kc), 16);
    cr_assert_eq(kvcache_block_size(kc), BS);
    int a = kvcache_seq_new(kc, NULL), b = kvcache_seq_new(kc, NULL);
    cr_assert(a >= 0 && b >= 0 && a != b);
    cr_assert_eq(kvcache_live_seqs(kc), 2);
    append(kc, a, 9, 0);   // 3 blocks
    append(kc, b, 4, 50);  // 1 block
    cr_assert_eq(kvcache_free_blocks(kc), 12);
    cr_assert_eq(kvcache_seq_len(kc, a), 9);
    kvcache_seq_free(kc, a);
    cr_assert_eq(kvcache_free_blocks(kc), 15);
    kvcache_seq_free(kc, a);     // already free: ignored
    kvcache_seq_free(kc, -1);    // unknown: ignored
    kvcache_seq_free(kc, 1000);
    cr_assert_eq(kvcache_live_seqs(kc), 1);
    kvcache_seq_free(kc, b);
    cr_assert_eq(kvcache_free_blocks(kc), 16);
    cr_assert_eq(kvcache_live_seqs(kc), 0);
    kvcache_destroy(&kc);
}

Test(kvcache, too_many_seqs) {
    kvcache_t *kc = make(4, 2);
    char err[ERR_LEN] = "";
    int a = kvcache_seq_new(kc, err), b = kvcache_seq_new(kc, err);
    cr_assert(a >= 0 && b >= 0);
    cr_assert_eq(kvcache_seq_new(kc, err), -1);
    cr_assert(strstr(err, "too many sequences (max 2)") != NULL, "err: %s", err);
    err[0] = 0;
    cr_assert_eq(kvcache_seq_fork(kc, a, err), -1);
    cr_assert(strstr(err, "too many sequences") != NULL, "err: %s", err);
    cr_assert_eq(kvcache_live_seqs(kc), 2);
    kvcache_seq_free(kc, b);
    cr_assert_geq(kvcache_seq_new(kc, err), 0);
    kvcache_destroy(&kc);
}

Test(kvcache, fork_shares_and_copies_partial_block_on_write) {
    kvcache_t *kc = make(16, 4);
    int src = kvcache_seq_new(kc, NULL);
    append(kc, src, 6, 0);  // block 0 full, block 1 holds positions 4, 5
    int free0 = kvcache_free_blocks(kc);
    int fk = kvcache_seq_fork(kc, src, NULL);
    cr_assert_geq(fk, 0);
    cr_assert_eq(kvcache_seq_len(kc, fk), 6);
    cr_assert_eq(kvcache_free_blocks(kc), free0, "fork must not take blocks");
    for (int pos = 0; pos < 6; pos++) {
        cr_assert_eq(kvcache_block_refs(kc, src, pos), 2);
        cr_assert_eq(kvcache_k(kc, src, 1, pos), kvcache_k(kc, fk, 1, pos));
    }

    // Writing position 6 of the fork lands in the shared partial block: exactly one copy.
    cr_assert_eq(kvcache_blocks_needed(kc, fk, 1), 1);
    append(kc, fk, 1, 77);
    cr_assert_eq(kvcache_free_blocks(kc), free0 - 1);
    cr_assert_eq(kvcache_block_refs(kc, fk, 4), 1);
    cr_assert_eq(kvcache_block_refs(kc, src, 4), 1);
    cr_assert_eq(kvcache_block_refs(kc, src, 0), 2, "full block stays shared");
    cr_assert_eq(kvcache_k(kc, src, 0, 0), kvcache_k(kc, fk, 0, 0));
    cr_assert_neq(kvcache_k(kc, src, 0, 4), kvcache_k(kc, fk, 0, 4));
    // Fork: old prefix plus its new row. Source: untouched.
    for (int pos = 0; pos < 6; pos++) {
        cr_assert(row_is(kc, fk, pos, pos), "fork row %d", pos);
        cr_assert(row_is(kc, src, pos, pos), "source row %d", pos);
    }
    cr_assert(row_is(kc, fk, 6, 77));

    // The source writing its own position 6 afterwards no longer shares that block.
    cr_assert_eq(kvcache_blocks_needed(kc, src, 1), 0);
    append(kc, src, 1, 88);
    cr_assert(row_is(kc, fk, 6, 77));
    cr_assert(row_is(kc, src, 6, 88));

    kvcache_seq_free(kc, src);
    kvcache_seq_free(kc, fk);
    cr_assert_eq(kvcache_free_blocks(kc), 16);
    kvcache_destroy(&kc);
}

Test(kvcache, full_blocks_stay_shared_after_fork_and_reserve) {
    kvcache_t *kc = make(16, 8);
    int src = kvcache_seq_new(kc, NULL);
    append(kc, src, 8, 0);  // exactly two full blocks
    int free0 = kvcache_free_blocks(kc);
    int forks[3];
    for (int i = 0; i < 3; i++) forks[i] = kvcache_seq_fork(kc, src, NULL);
    cr_assert_eq(kvcache_block_refs(kc, src, 0), 4);
    for (int i = 0; i < 3; i++) {
        // Next position starts a new block: no copy, one fresh block.
        cr_assert_eq(kvcache_blocks_needed(kc, forks[i], 1), 1);
        append(kc, forks[i], 1, 100 + i);
    }
    cr_assert_eq(kvcache_free_blocks(kc), free0 - 3);
    for (int pos = 0; pos < 8; pos++) {
        cr_assert_eq(kvcache_block_refs(kc, src, pos), 4);
        for (int i = 0; i < 3; i++) cr_assert_eq(kvcache_v(kc, forks[i], 2, pos), kvcache_v(kc, src, 2, pos));
    }
    for (int i = 0; i < 3; i++) cr_assert(row_is(kc, forks[i], 8, 100 + i));
    kvcache_destroy(&kc);
}

Test(kvcache, reserve_twice_before_advance) {
    kvcache_t *kc = make(16, 4);
    char err[ERR_LEN] = "";
    int s = kvcache_seq_new(kc, NULL);
    append(kc, s, 3, 0);
    cr_assert_eq(kvcache_reserve(kc, s, 2, err), 0);  // positions 3, 4: one more block
    cr_assert_eq(kvcache_free_blocks(kc), 14);
    cr_assert_eq(kvcache_blocks_needed(kc, s, 2), 0, "capacity already there");
    cr_assert_eq(kvcache_reserve(kc, s, 2, err), 0);
    cr_assert_eq(kvcache_free_blocks(kc), 14);
    cr_assert_eq(kvcache_blocks_needed(kc, s, 6), 1);  // up to position 8
    cr_assert_eq(kvcache_reserve(kc, s, 6, err), 0);
    cr_assert_eq(kvcache_free_blocks(kc), 13);
    write_row(kc, s, 3, 3);
    write_row(kc, s, 8, 8);  // reserved capacity is addressable
    kvcache_advance(kc, s, 1);
    cr_assert_eq(kvcache_seq_len(kc, s), 4);

    // A fork gets the data blocks only; the source keeps its reserved capacity.
    int f = kvcache_seq_fork(kc, s, NULL);
    cr_assert_eq(kvcache_block_refs(kc, s, 0), 2);
    cr_assert_eq(kvcache_block_refs(kc, s, 4), 1);
    cr_assert_eq(kvcache_blocks_needed(kc, f, 1), 1);
    cr_assert_eq(kvcache_blocks_needed(kc, s, 5), 0);
    kvcache_destroy(&kc);
}

Test(kvcache, capacity_exhaustion_changes_nothing) {
    kvcache_t *kc = make(4, 4);
    char err[ERR_LEN] = "";
    int a = kvcache_seq_new(kc, NULL);
    append(kc, a, 6, 0);  // 2 blocks
    int b = kvcache_seq_fork(kc, a, NULL);
    int free0 = kvcache_free_blocks(kc);
    cr_assert_eq(free0, 2);
    // Needs the copy of block 1 plus 2 fresh blocks = 3 > 2.
    cr_assert_eq(kvcache_blocks_needed(kc, b, 7), 3);
    cr_assert_eq(kvcache_reserve(kc, b, 7, err), -1);
    cr_assert(strstr(err, "KV cache full") != NULL, "err: %s", err);
    cr_assert(strstr(err, "need 3 blocks, 2 free") != NULL, "err: %s", err);
    cr_assert_eq(kvcache_free_blocks(kc), free0);
    cr_assert_eq(kvcache_seq_len(kc, a), 6);
    cr_assert_eq(kvcache_seq_len(kc, b), 6);
    cr_assert_eq(kvcache_block_refs(kc, b, 4), 2, "no copy made by a failed reserve");
    cr_assert_eq(kvcache_k(kc, a, 0, 4), kvcache_k(kc, b, 0, 4));
    for (int pos = 0; pos < 6; pos++) cr_assert(row_is(kc, b, pos, pos));
    // Exactly what fits still works.
    cr_assert_eq(kvcache_reserve(kc, b, 6, err), 0, "reserve: %s", err);
    cr_assert_eq(kvcache_free_blocks(kc), 0);
    cr_assert_eq(kvcache_reserve(kc, a, 3, err), -1);
    kvcache_destroy(&kc);
}

Test(kvcache, truncate_releases_blocks) {
    kvcache_t *kc = make(8, 4);
    int s = kvcache_seq_new(kc, NULL);
    append(kc, s, 10, 0);  // 3 blocks
    cr_assert_eq(kvcache_free_blocks(kc), 5);
    kvcache_seq_truncate(kc, s, 8);  // 2 blocks
    cr_assert_eq(kvcache_seq_len(kc, s), 8);
    cr_assert_eq(kvcache_free_blocks(kc), 6);
    kvcache_seq_truncate(kc, s, 5);  // still 2 blocks
    cr_assert_eq(kvcache_free_blocks(kc), 6);
    for (int pos = 0; pos < 5; pos++) cr_assert(row_is(kc, s, pos, pos));
    // Re-growing rewrites position 5 onward in place.
    append(kc, s, 2, 40);
    cr_assert_eq(kvcache_free_blocks(kc), 6);
    cr_assert(row_is(kc, s, 4, 4));
    cr_assert(row_is(kc, s, 5, 40));
    // Reserved capacity past len is released too.
    cr_assert_eq(kvcache_reserve(kc, s, 9, NULL), 0);
    cr_assert_eq(kvcache_free_blocks(kc), 4);
    kvcache_seq_truncate(kc, s, kvcache_seq_len(kc, s));
    cr_assert_eq(kvcache_free_blocks(kc), 6);
    kvcache_seq_truncate(kc, s, 0);
    cr_assert_eq(kvcache_free_blocks(kc), 8);
    cr_assert_eq(kvcache_seq_len(kc, s), 0);

    // Truncating a fork into a shared block, then writing, copies it.
    int a = kvcache_seq_new(kc, NULL);
    append(kc, a, 8, 0);
    int f = kvcache_seq_fork(kc, a, NULL);
    kvcache_seq_truncate(kc, f, 6);
    cr_assert_eq(kvcache_block_refs(kc, a, 4), 2);
    cr_assert_eq(kvcache_blocks_needed(kc, f, 1), 1);
    append(kc, f, 1, 90);
    cr_assert(row_is(kc, a, 6, 6), "source block untouched");
    cr_assert(row_is(kc, f, 6, 90));
    cr_assert(row_is(kc, f, 5, 5));
    kvcache_destroy(&kc);
}

Test(kvcache, layer_view_addressing) {
    kvcache_t *kc = make(12, 4);
    int a = kvcache_seq_new(kc, NULL), b = kvcache_seq_new(kc, NULL);
    // Interleave so the tables are not contiguous runs of ids.
    for (int i = 0; i < 4; i++) {
        append(kc, a, 3, 10 * i);
        append(kc, b, 2, 500 + 10 * i);
    }
    int f = kvcache_seq_fork(kc, a, NULL);
    append(kc, f, 2, 900);
    const int seqs[3] = {a, b, f};
    for (int si = 0; si < 3; si++) {
        int seq = seqs[si];
        for (int l = 0; l < L; l++) {
            kvcache_view_t v = kvcache_layer_view(kc, seq, l);
            cr_assert_eq(v.block_size, BS);
            cr_assert_eq(v.block_stride, (size_t)L * BS * D);
            for (int pos = 0; pos < kvcache_seq_len(kc, seq); pos++) {
                size_t off = (size_t)v.table[pos / BS] * v.block_stride + (size_t)(pos % BS) * D;
                cr_assert_eq(v.k + off, kvcache_k(kc, seq, l, pos), "seq %d layer %d pos %d", seq, l, pos);
                cr_assert_eq(v.v + off, kvcache_v(kc, seq, l, pos), "seq %d layer %d pos %d", seq, l, pos);
            }
        }
    }
    // Header formula from the base of the pool (layer 0 view).
    const float *k0 = kvcache_layer_view(kc, b, 0).k;
    const int *tb = kvcache_layer_view(kc, b, 0).table;
    for (int l = 0; l < L; l++)
        for (int pos = 0; pos < kvcache_seq_len(kc, b); pos++)
            cr_assert_eq(k0 + ((size_t)tb[pos / BS] * L + l) * BS * D + (size_t)(pos % BS) * D,
                         kvcache_k(kc, b, l, pos));
    kvcache_destroy(&kc);
}

// --- randomised model check ----------------------------------------------------------------

#define RM_BLOCKS 24
#define RM_SEQS 6
#define RM_MAXLEN (RM_BLOCKS * BS)

typedef struct {
    bool live;
    int len;
    int cap;               // positions covered by the table (model of the cache's contract)
    int tags[RM_MAXLEN];   // expected row tag per position
} model_seq_t;

static uint64_t rm_state = 0x2545F4914F6CDD1DULL;
static int rnd(int n) {
    rm_state ^= rm_state << 13;
    rm_state ^= rm_state >> 7;
    rm_state ^= rm_state << 17;
    return (int)(rm_state % (uint64_t)n);
}

static int ceil_blocks(int positions) { return (positions + BS - 1) / BS; }

static void check_invariants(kvcache_t *kc, const model_seq_t *m) {
    int occurrences[RM_BLOCKS] = {0};
    int distinct = 0, live = 0;
    for (int s = 0; s < RM_SEQS; s++) {
        if (!m[s].live) continue;
        live++;
        cr_assert_eq(kvcache_seq_len(kc, s), m[s].len);
        const int *table = kvcache_layer_view(kc, s, 0).table;
        for (int b = 0; b < ceil_blocks(m[s].cap); b++) {
            cr_assert(table[b] >= 0 && table[b] < RM_BLOCKS);
            if (occurrences[table[b]]++ == 0) distinct++;
        }
        for (int pos = 0; pos < m[s].len; pos++) cr_assert(row_is(kc, s, pos, m[s].tags[pos]), "seq %d pos %d", s, pos);
    }
    // Sum of refcounts over used blocks equals the sum of table lengths, block by block.
    for (int s = 0; s < RM_SEQS; s++) {
        if (!m[s].live) continue;
        const int *table = kvcache_layer_view(kc, s, 0).table;
        for (int b = 0; b < ceil_blocks(m[s].cap); b++)
            cr_assert_eq(kvcache_block_refs(kc, s, b * BS), occurrences[table[b]], "seq %d block %d", s, b);
    }
    cr_assert_eq(kvcache_free_blocks(kc) + distinct, RM_BLOCKS);
    cr_assert_eq(kvcache_live_seqs(kc), live);
}

Test(kvcache, random_ops_keep_accounting_and_data) {
    kvcache_t *kc = make(RM_BLOCKS, RM_SEQS);
    static model_seq_t m[RM_SEQS];
    memset(m, 0, sizeof(m));
    char err[ERR_LEN];
    int tag = 1, fulls = 0, copies_seen = 0;
    for (int step = 0; step < 4000; step++) {
        int op = rnd(10), s = rnd(RM_SEQS);
        if (op == 0) {
            int id = kvcache_seq_new(kc, err);
            if (id < 0) continue;
            cr_assert(!m[id].live);
            m[id].live = true;
            m[id].len = m[id].cap = 0;
        } else if (op == 1) {
            if (!m[s].live) continue;
            int id = kvcache_seq_fork(kc, s, err);
            if (id < 0) continue;
            m[id] = m[s];
            m[id].cap = m[s].len;
        } else if (op == 2) {
            kvcache_seq_free(kc, s);  // also exercises ignored ids
            m[s].live = false;
        } else if (op == 3) {
            if (!m[s].live) continue;
            int nl = rnd(m[s].len + 1);
            kvcache_seq_truncate(kc, s, nl);
            m[s].len = m[s].cap = nl;
        } else {
            if (!m[s].live) continue;
            int n = 1 + rnd(2 * BS + 2);
            int before = kvcache_free_blocks(kc);
            int need = kvcache_blocks_needed(kc, s, n);
            int have = ceil_blocks(m[s].cap), want = ceil_blocks(m[s].len + n);
            int fresh = want > have ? want - have : 0;
            int shared = m[s].len / BS < have && kvcache_block_refs(kc, s, m[s].len) > 1;
            if (shared) cr_assert_neq(m[s].len % BS, 0, "only a partial block can be shared and written");
            cr_assert_eq(need, fresh + shared, "seq %d len %d cap %d n %d", s, m[s].len, m[s].cap, n);
            if (kvcache_reserve(kc, s, n, err) < 0) {
                cr_assert_gt(need, before);
                cr_assert(strstr(err, "KV cache full") != NULL);
                cr_assert_eq(kvcache_free_blocks(kc), before);
                fulls++;
                check_invariants(kc, m);
                continue;
            }
            cr_assert_eq(before - kvcache_free_blocks(kc), need, "blocks_needed vs reserve");
            copies_seen += shared;
            if (m[s].len + n > m[s].cap) m[s].cap = m[s].len + n;
            // Sometimes leave reserved capacity unfilled (reserve again later).
            int fill = op == 9 ? rnd(n + 1) : n;
            for (int i = 0; i < fill; i++) {
                write_row(kc, s, m[s].len + i, tag);
                m[s].tags[m[s].len + i] = tag++;
            }
            kvcache_advance(kc, s, fill);
            m[s].len += fill;
        }
        check_invariants(kc, m);
    }
    cr_assert_gt(fulls, 0, "the walk should hit a full cache");
    cr_assert_gt(copies_seen, 0, "the walk should copy shared blocks");
    for (int s = 0; s < RM_SEQS; s++) kvcache_seq_free(kc, s);
    cr_assert_eq(kvcache_free_blocks(kc), RM_BLOCKS);
    cr_assert_eq(kvcache_live_seqs(kc), 0);
    kvcache_destroy(&kc);
}

// A backend that is the CPU one under another name, counting its memory calls: a cache made for
// it takes its pools from its alloc, copies shared blocks with its copy and frees with its free.
static int fake_allocs, fake_frees, fake_copies;
static void *fake_alloc(size_t n) {
    fake_allocs++;
    return kernels_cpu()->alloc(n);
}
static void fake_free(void *p) {
    fake_frees++;
    kernels_cpu()->free(p);
}
static void fake_copy(void *dst, const void *src, size_t n) {
    fake_copies++;
    kernels_cpu()->copy(dst, src, n);
}

Test(kvcache, pools_live_in_the_given_backend) {
    kernels_t fake = *kernels_cpu();
    fake.name = "fake";
    fake.alloc = fake_alloc;
    fake.free = fake_free;
    fake.copy = fake_copy;
    char err[ERR_LEN] = "";
    cr_assert_null(kvcache_new_on(NULL, L, D, BS, 8, 4, err));
    kvcache_t *kc = kvcache_new_on(&fake, L, D, BS, 16, 4, err);
    cr_assert_not_null(kc, "%s", err);
    cr_assert_eq(kvcache_backend(kc), &fake);
    cr_assert_eq(fake_allocs, 2, "K and V pools from the backend's alloc");
    int src = kvcache_seq_new(kc, err);
    append(kc, src, 6, 0);
    int fk = kvcache_seq_fork(kc, src, err);
    cr_assert_eq(fake_copies, 0);
    append(kc, fk, 1, 50);   // lands in the shared partial block: copy on write
    cr_assert_eq(fake_copies, 2, "the shared block's K and V copied with the backend's copy");
    for (int pos = 0; pos < 6; pos++) cr_assert(row_is(kc, fk, pos, pos) && row_is(kc, src, pos, pos));
    cr_assert(row_is(kc, fk, 6, 50));
    kvcache_destroy(&kc);
    cr_assert_eq(fake_frees, 2);
    kvcache_t *host = kvcache_new(L, D, BS, 4, 2, err);
    cr_assert_eq(kvcache_backend(host), kernels_cpu());
    kvcache_destroy(&host);
}

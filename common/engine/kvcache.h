// kvcache.h - paged key/value cache shared by all sequences of a rollout process.
//
// Memory is a pool of fixed-size blocks; each block holds `block_size` token positions of
// keys and values for every layer. A sequence owns a block table (block ids in position
// order) and a length. Blocks carry reference counts so that a forked sequence (the G samples
// of a GRPO group) shares its prompt's blocks; the first write into a shared block (only the
// last, partially filled block can be written again) copies it first (copy on write).
//
// Pool layout (floats): k_pool[block][layer][slot][kv_dim], same for v_pool. So the K row of
// (layer l, position p) of a sequence is
//   k_pool + (table[p / block_size] * n_layers + l) * block_size * kv_dim + (p % block_size) * kv_dim
// which kvcache_layer_view() hands to attention kernels as (base, block_stride).
//
// Memory: the K and V pools are BACKEND memory of the kernels table the cache was made for
// (kvcache_new: the CPU backend, i.e. host memory; kvcache_new_on: any backend, e.g. the CUDA
// one). Row pointers (kvcache_k / kvcache_v / kvcache_layer_view) point into them and may only
// be handed to that backend's ops (copy, attention, ...), never dereferenced on the host unless
// the backend is the CPU one. The bookkeeping (block tables, reference counts, lengths) is host
// memory; the block tables are what paged attention takes as its host index arrays. The engine
// refuses a cache made for another backend than its model's.
#ifndef MARLAAS_KVCACHE_H
#define MARLAAS_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/util/util.h"
#include "kernels/kernels.h"

typedef struct kvcache kvcache_t;

// KV blocks of block_size positions a group of G samples of one P-token prompt may need at
// most, each sample drawing up to max_new tokens: the prompt's blocks, shared, and each sample's
// own plus one for the prompt's last, partly filled block (generate.c admits by this bound).
static inline int kvcache_group_blocks(int block_size, int P, int G, int max_new) {
    return (P + block_size - 1) / block_size + G * ((max_new + block_size - 1) / block_size + 1);
}

// Creates a pool of n_blocks blocks for at most max_seqs live sequences. Validates arguments
// (all > 0) and returns NULL + err on a bad argument. Memory: 2 * n_blocks * n_layers *
// block_size * kv_dim floats. The pools are host memory (the CPU backend); running out of
// memory is reported (NULL + err).
kvcache_t *kvcache_new(int n_layers, int kv_dim, int block_size, int n_blocks, int max_seqs, char *err);
// The same with the pools in backend memory of k (k->alloc: zero-filled). For the CPU backend this
// is kvcache_new; another backend's alloc aborts with its message when the device lacks memory.
kvcache_t *kvcache_new_on(const kernels_t *k, int n_layers, int kv_dim, int block_size, int n_blocks, int max_seqs,
                          char *err);
// A cache of block and sequence bookkeeping only, with no pools (kvcache_pool gives NULL; rows,
// offsets and layer views do not exist and must not be asked for): the simulated backend's (common/sim/sim.h), whose n_blocks come
// from the modelled device memory. Its backend is k.
kvcache_t *kvcache_new_virtual(const kernels_t *k, int n_layers, int kv_dim, int block_size, int n_blocks,
                               int max_seqs, char *err);
// The backend whose memory holds the pools.
const kernels_t *kvcache_backend(const kvcache_t *kc);
void kvcache_destroy(kvcache_t **kc);

// New empty sequence; returns its id (>= 0), or -1 + err ("too many sequences (max N)").
int kvcache_seq_new(kvcache_t *kc, char *err);
// New sequence sharing every block of src (same length; refcounts incremented). -1 + err.
int kvcache_seq_fork(kvcache_t *kc, int src, char *err);
// Frees a sequence, dropping its block references. Unknown / already free ids are ignored.
void kvcache_seq_free(kvcache_t *kc, int seq);
int kvcache_seq_len(const kvcache_t *kc, int seq);
// Drops positions >= new_len (new_len <= len); blocks no longer needed are released.
void kvcache_seq_truncate(kvcache_t *kc, int seq, int new_len);

// Makes positions len .. len+n_new-1 of seq writable: allocates new blocks and copies the
// last block first (with the backend's copy) if it is shared and will be written into. All or nothing: when the pool
// lacks blocks it changes nothing and returns -1 + err ("KV cache full: need N blocks, M
// free"). Returns 0.
int kvcache_reserve(kvcache_t *kc, int seq, int n_new, char *err);
// Number of extra blocks kvcache_reserve(kc, seq, n_new) would take (for admission control).
int kvcache_blocks_needed(const kvcache_t *kc, int seq, int n_new);
// Marks n positions (already reserved and written) as filled: len += n.
void kvcache_advance(kvcache_t *kc, int seq, int n);

// Row pointers for (layer, pos) of seq; pos must be < len + reserved capacity. Backend memory
// (see the top of this file).
float *kvcache_k(kvcache_t *kc, int seq, int layer, int pos);
float *kvcache_v(kvcache_t *kc, int seq, int layer, int pos);

// View for attention kernels: base pointers of the layer inside block 0, the stride between
// consecutive blocks (floats), the block table of seq (owned by the cache; valid until the
// next reserve/free/truncate of that seq).
typedef struct {
    const float *k, *v;           // k_pool + l * block_size * kv_dim (same for v); backend memory

    size_t block_stride;          // n_layers * block_size * kv_dim
    const int *table;             // block ids in position order (host memory)
    int block_size;
} kvcache_view_t;
kvcache_view_t kvcache_layer_view(const kvcache_t *kc, int seq, int layer);
// Offset in floats of position pos of seq in layer from the start of its pool: the same in the K
// and the V pool (kvcache_k / kvcache_v = pool + this offset).
size_t kvcache_row_offset(kvcache_t *kc, int seq, int layer, int pos);
// The pools (backend memory): K, or V when values is set.
float *kvcache_pool(kvcache_t *kc, bool values);

int kvcache_free_blocks(const kvcache_t *kc);
int kvcache_total_blocks(const kvcache_t *kc);
int kvcache_block_size(const kvcache_t *kc);
int kvcache_live_seqs(const kvcache_t *kc);
int kvcache_max_seqs(const kvcache_t *kc);
// Reference count of the block holding position pos of seq (tests and stats).
int kvcache_block_refs(const kvcache_t *kc, int seq, int pos);

#endif

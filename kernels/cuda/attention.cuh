// attention.cuh - the CUDA backend's attention kernels: paged decode attention over the KV cache,
// and the packed training attention (forward with log-sum-exp, backward for q, k and v). Part of
// kernels/cuda/cuda.cu's translation unit (included there, after the backend state and device
// helpers it uses); not a header of its own.

// --- attention --------------------------------------------------------------------------------------
//
// All attention kernels use blocks of ATTN_THREADS = 4 warps. A (query row, head) pair or a key
// row is handled by one block; inside it, warp w takes the keys (or queries) w, w+4, w+8, ... and
// lane l holds the head dimensions l, l+32, ..., l+224 in registers, hence head_dim <= 256
// (ATTN_MAX_HD; larger aborts). The warps' partial results are combined through shared memory
// (4 * 256 floats) in warp order, so results are deterministic. No limit on the context length:
// the forward pass uses an online (running max) softmax.
#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ATTN_MAX_HD 256
#define ATTN_PER_LANE (ATTN_MAX_HD / 32)

// K/V row offset (floats from k/v base, kv head included) of context position p.
struct paged_loc_t {
    const int *tab;
    size_t block_stride;
    int bs, kvd, koff;
    __device__ size_t operator()(int p) const {
        return (size_t)tab[p / bs] * block_stride + (size_t)(p % bs) * kvd + koff;
    }
};

struct packed_loc_t {
    int np, pre_start, start, kvd, koff;
    __device__ size_t operator()(int p) const {
        int row = p < np ? pre_start + p : start + (p - np);
        return (size_t)row * kvd + koff;
    }
};

// One query row of one head against ctx >= 1 keys: out (hd) and, when lse is not NULL, *lse =
// log-sum-exp of the scaled scores. Called by all ATTN_THREADS threads of the block.
template <class Loc>
__device__ void attn_fwd_row(float *out, float *lse, const float *qh, const float *kb, const float *vb, int ctx,
                             int hd, float scale, const Loc &loc) {
    __shared__ float s_acc[ATTN_WARPS][ATTN_MAX_HD];
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float qr[ATTN_PER_LANE], acc[ATTN_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATTN_PER_LANE; c++) {
        int d = lane + 32 * c;
        qr[c] = d < hd ? qh[d] : 0.0f;
        acc[c] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = w; p < ctx; p += ATTN_WARPS) {
        size_t off = loc(p);
        const float *kp = kb + off, *vp = vb + off;
        float part = 0.0f;
#pragma unroll
        for (int c = 0; c < ATTN_PER_LANE; c++) {
            int d = lane + 32 * c;
            if (d < hd) part += qr[c] * kp[d];
        }
        float s = warp_sum(part) * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn);   // m = -inf (first key of this warp): 0
        float e = expf(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int c = 0; c < ATTN_PER_LANE; c++) {
            int d = lane + 32 * c;
            if (d < hd) acc[c] = acc[c] * corr + e * vp[d];
        }
        m = mn;
    }
    if (lane == 0) {
        s_m[w] = m;
        s_l[w] = l;
    }
#pragma unroll
    for (int c = 0; c < ATTN_PER_LANE; c++) {
        int d = lane + 32 * c;
        if (d < hd) s_acc[w][d] = acc[c];
    }
    __syncthreads();
    // Combine: a warp that saw no key (ctx < 4) has m = -inf and is left out.
    float M = -INFINITY;
    for (int ww = 0; ww < ATTN_WARPS; ww++) M = fmaxf(M, s_m[ww]);
    float L = 0.0f;
    for (int ww = 0; ww < ATTN_WARPS; ww++)
        if (s_m[ww] != -INFINITY) L += s_l[ww] * expf(s_m[ww] - M);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int ww = 0; ww < ATTN_WARPS; ww++)
            if (s_m[ww] != -INFINITY) o += s_acc[ww][d] * expf(s_m[ww] - M);
        out[d] = o / L;
    }
    if (lse && threadIdx.x == 0) *lse = M + logf(L);
}

// Paged attention: grid (n_tokens, n_heads), ATTN_THREADS threads. Token i's sequence's block
// table is tab_flat + tab_off[seq_of[i]] (the host tables, flattened and uploaded).
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_paged(float *out, const float *q, const float *kb,
                                                             const float *vb, size_t block_stride, int bs,
                                                             const int *tab_flat, const int *tab_off,
                                                             const int *seq_of, const int *pos, int H, int grp,
                                                             int hd, int kvd, float scale) {
    int i = blockIdx.x, h = blockIdx.y, kh = h / grp;
    paged_loc_t loc{tab_flat + tab_off[seq_of[i]], block_stride, bs, kvd, kh * hd};
    size_t qo = ((size_t)i * H + h) * hd;
    attn_fwd_row(out + qo, (float *)nullptr, q + qo, kb, vb, pos[i] + 1, hd, scale, loc);
}

static void check_heads(const char *op, int n_heads, int n_kv_heads, int head_dim) {
    if (head_dim < 1 || head_dim > ATTN_MAX_HD)
        die_size(op, "head_dim %d outside the supported range 1..%d", head_dim, ATTN_MAX_HD);
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
        die_size(op, "n_heads %d is not a positive multiple of n_kv_heads %d", n_heads, n_kv_heads);
    if (n_heads > 65535) die_size(op, "n_heads %d > 65535 (grid y)", n_heads);
}

static void cuda_attn_paged(float *out, const float *q, const kern_paged_attn_t *a) {
    if (a->n_tokens <= 0) return;
    check_heads("attn_paged", a->n_heads, a->n_kv_heads, a->head_dim);
    if (a->block_size < 1) die_size("attn_paged", "block_size %d < 1", a->block_size);
    int n = a->n_tokens, bs = a->block_size;
    // Blocks each sequence needs: up to its tokens' largest position.
    int n_seqs = 0;
    for (int i = 0; i < n; i++) {
        if (a->seq_of[i] < 0) die_size("attn_paged", "seq_of[%d] = %d is negative", i, a->seq_of[i]);
        if (a->pos[i] < 0) die_size("attn_paged", "pos[%d] = %d is negative", i, (int)a->pos[i]);
        n_seqs = std::max(n_seqs, a->seq_of[i] + 1);
    }
    std::vector<int> need(n_seqs, 0);
    for (int i = 0; i < n; i++) need[a->seq_of[i]] = std::max(need[a->seq_of[i]], (int)(a->pos[i] / bs) + 1);
    std::vector<int> off(n_seqs, 0), flat;
    for (int s = 0; s < n_seqs; s++) {
        off[s] = (int)flat.size();
        for (int b = 0; b < need[s]; b++) {
            int blk = a->tables[s][b];
            if (blk < 0) die_size("attn_paged", "tables[%d][%d] = %d is negative", s, b, blk);
            flat.push_back(blk);
        }
    }
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_flat = up.put(flat), o_off = up.put(off), o_seq = up.put(a->seq_of, sizeof(int) * n),
           o_pos = up.put(a->pos, sizeof(int32_t) * n);
    unsigned char *d = up.commit();
    int kvd = a->n_kv_heads * a->head_dim;
    LAUNCH(k_attn_paged, dim3((unsigned)n, (unsigned)a->n_heads), ATTN_THREADS, out, q, a->k_base, a->v_base,
           a->block_stride, bs, at<int>(d, o_flat), at<int>(d, o_off), at<int>(d, o_seq), at<int>(d, o_pos),
           a->n_heads, a->n_heads / a->n_kv_heads, a->head_dim, kvd, 1.0f / sqrtf((float)a->head_dim));
}

// Packed-attention metadata on the device: per sequence start, len, pre_start, pre_len (zeros
// without prefixes) and the list of query items (sequence, t) of every sequence row.
struct packed_meta_t {
    const int *start, *len, *pre_start, *pre_len;
    const int2 *items;   // (s, t): row start[s] + t
    int n_items;
    // attn_bwd only: CSR of the (s, t_from) entries that attend to each key row (see below).
    const int *ent_off;   // (n_tokens + 1)
    const int2 *ent;
};

// The same, built on the host (validated: rows in range) before anything touches the device.
struct packed_host_t {
    std::vector<int> ps, pl, ent_off;
    std::vector<int2> items, ent;
    bool with_ent;
};

// Validates the packed arguments and builds the metadata; with with_ent also the per-key-row
// entries the backward pass needs.
static packed_host_t packed_build(const char *op, const kern_packed_attn_t *a, bool with_ent) {
    check_heads(op, a->n_heads, a->n_kv_heads, a->head_dim);
    int S = a->n_seqs, N = a->n_tokens;
    bool pre = a->pre_start && a->pre_len;
    packed_host_t hm;
    hm.with_ent = with_ent;
    std::vector<int> &ps = hm.ps, &pl = hm.pl;
    ps.assign(S, 0);
    pl.assign(S, 0);
    std::vector<int2> &items = hm.items;
    for (int s = 0; s < S; s++) {
        if (a->start[s] < 0 || a->len[s] < 0 || (long)a->start[s] + a->len[s] > N)
            die_size(op, "sequence %d: rows [%d, %ld) outside [0, %d)", s, a->start[s], (long)a->start[s] + a->len[s], N);
        if (pre) {
            ps[s] = a->pre_start[s];
            pl[s] = a->pre_len[s];
            if (pl[s] < 0 || (pl[s] > 0 && (ps[s] < 0 || (long)ps[s] + pl[s] > N)))
                die_size(op, "sequence %d: prefix rows [%d, %ld) outside [0, %d)", s, ps[s], (long)ps[s] + pl[s], N);
        }
        for (int t = 0; t < a->len[s]; t++) items.push_back(make_int2(s, t));
    }
    std::vector<int> &ent_off = hm.ent_off;
    std::vector<int2> &ent = hm.ent;
    if (with_ent) {
        // Entries of key row r: (s, t_from) = queries t_from .. len[s]-1 of sequence s attend to r.
        // Own row j of s: (s, j); prefix row of s: (s, 0). Ordered by s (CPU summation order).
        ent_off.assign(N + 1, 0);
        for (int s = 0; s < S; s++) {
            for (int p = 0; p < pl[s]; p++) ent_off[ps[s] + p + 1]++;
            for (int j = 0; j < a->len[s]; j++) ent_off[a->start[s] + j + 1]++;
        }
        for (int r = 0; r < N; r++) ent_off[r + 1] += ent_off[r];
        ent.resize(ent_off[N]);
        std::vector<int> cur(ent_off.begin(), ent_off.end() - 1);
        for (int s = 0; s < S; s++) {
            for (int p = 0; p < pl[s]; p++) ent[cur[ps[s] + p]++] = make_int2(s, 0);
            for (int j = 0; j < a->len[s]; j++) ent[cur[a->start[s] + j]++] = make_int2(s, j);
        }
    }
    return hm;
}

// Uploads what packed_build made. Caller holds g.mu.
static packed_meta_t packed_upload(const kern_packed_attn_t *a, const packed_host_t &hm) {
    int S = a->n_seqs;
    bool with_ent = hm.with_ent;
    upload_t up;
    size_t o_start = up.put(a->start, sizeof(int) * S), o_len = up.put(a->len, sizeof(int) * S),
           o_ps = up.put(hm.ps), o_pl = up.put(hm.pl), o_items = up.put(hm.items), o_eoff = up.put(hm.ent_off),
           o_ent = up.put(hm.ent);
    unsigned char *d = up.commit();
    packed_meta_t m;
    m.start = at<int>(d, o_start);
    m.len = at<int>(d, o_len);
    m.pre_start = at<int>(d, o_ps);
    m.pre_len = at<int>(d, o_pl);
    m.items = at<int2>(d, o_items);
    m.n_items = (int)hm.items.size();
    m.ent_off = with_ent ? at<int>(d, o_eoff) : nullptr;
    m.ent = with_ent ? at<int2>(d, o_ent) : nullptr;
    return m;
}

// Packed attention forward: grid (query items, n_heads), ATTN_THREADS threads; item b = (s, t)
// is row i = start[s] + t with context pre_len[s] + t + 1.
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_fwd(float *out, float *lse, const float *q, const float *k,
                                                           const float *v, packed_meta_t m, int H, int grp, int hd,
                                                           int kvd, float scale) {
    int2 it = m.items[blockIdx.x];
    int s = it.x, t = it.y, h = blockIdx.y, kh = h / grp;
    int np = m.pre_len[s];
    packed_loc_t loc{np, m.pre_start[s], m.start[s], kvd, kh * hd};
    size_t i = (size_t)m.start[s] + t;
    size_t qo = (i * H + h) * hd;
    attn_fwd_row(out + qo, lse + i * H + h, q + qo, k, v, np + t + 1, hd, scale, loc);
}

static void cuda_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                          const kern_packed_attn_t *a) {
    if (a->n_seqs <= 0 || a->n_tokens <= 0) return;
    packed_host_t hm = packed_build("attn_fwd", a, false);
    if (hm.items.empty()) return;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    packed_meta_t m = packed_upload(a, hm);
    LAUNCH(k_attn_fwd, dim3((unsigned)m.n_items, (unsigned)a->n_heads), ATTN_THREADS, out, lse, q, k, v, m,
           a->n_heads, a->n_heads / a->n_kv_heads, a->head_dim, a->n_kv_heads * a->head_dim,
           1.0f / sqrtf((float)a->head_dim));
}

// Backward, as in the CPU backend, with P recomputed from lse:
//   P_tj = exp(s_tj - lse_t), dP_tj = dout_t . v_j, D_t = dout_t . out_t,
//   dS_tj = P_tj (dP_tj - D_t) scale, dq_t = sum_j dS_tj k_j, dk_j = sum_t dS_tj q_t, dv_j = sum_t P_tj dout_t.
// Three kernels, no atomics: D per (row, head); dq per (query row, head) over its keys; dk/dv per
// (key row, kv head) over the queries that attend to it (the entries built by packed_build: a
// prefix row shared by several sequences gathers the queries of all of them).

// D: grid (query items, n_heads), one warp (32 threads) per block. Dd is (n_tokens, H).
__global__ void __launch_bounds__(32) k_attn_bwd_D(float *Dd, const float *dout, const float *out, packed_meta_t m,
                                                  int H, int hd) {
    int2 it = m.items[blockIdx.x];
    int h = blockIdx.y;
    size_t i = (size_t)m.start[it.x] + it.y;
    size_t o = (i * H + h) * hd;
    float part = 0.0f;
    for (int d = threadIdx.x; d < hd; d += 32) part += dout[o + d] * out[o + d];
    part = warp_sum(part);
    if (threadIdx.x == 0) Dd[i * H + h] = part;
}

// dq: grid (query items, n_heads), ATTN_THREADS threads; warp w takes context keys w, w+4, ...
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_bwd_dq(float *dq, const float *dout, const float *lse,
                                                              const float *Dd, const float *q, const float *k,
                                                              const float *v, packed_meta_t m, int H, int grp,
                                                              int hd, int kvd, float scale) {
    __shared__ float s_acc[ATTN_WARPS][ATTN_MAX_HD];
    int2 it = m.items[blockIdx.x];
    int s = it.x, t = it.y, h = blockIdx.y, kh = h / grp;
    int np = m.pre_len[s];
    packed_loc_t loc{np, m.pre_start[s], m.start[s], kvd, kh * hd};
    size_t i = (size_t)m.start[s] + t;
    size_t qo = (i * H + h) * hd;
    float L = lse[i * H + h], D = Dd[i * H + h];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float qr[ATTN_PER_LANE], dor[ATTN_PER_LANE], acc[ATTN_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATTN_PER_LANE; c++) {
        int d = lane + 32 * c;
        qr[c] = d < hd ? q[qo + d] : 0.0f;
        dor[c] = d < hd ? dout[qo + d] : 0.0f;
        acc[c] = 0.0f;
    }
    int ctx = np + t + 1;
    for (int p = w; p < ctx; p += ATTN_WARPS) {
        size_t off = loc(p);
        float kr[ATTN_PER_LANE], ps = 0.0f, pd = 0.0f;
#pragma unroll
        for (int c = 0; c < ATTN_PER_LANE; c++) {
            int d = lane + 32 * c;
            kr[c] = d < hd ? k[off + d] : 0.0f;
            ps += qr[c] * kr[c];
            pd += d < hd ? dor[c] * v[off + d] : 0.0f;
        }
        float P = expf(warp_sum(ps) * scale - L);
        float dS = P * (warp_sum(pd) - D) * scale;
#pragma unroll
        for (int c = 0; c < ATTN_PER_LANE; c++) acc[c] += dS * kr[c];
    }
#pragma unroll
    for (int c = 0; c < ATTN_PER_LANE; c++) {
        int d = lane + 32 * c;
        if (d < hd) s_acc[w][d] = acc[c];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int ww = 0; ww < ATTN_WARPS; ww++) o += s_acc[ww][d];
        dq[qo + d] = o;
    }
}

// dk, dv: grid (n_tokens, n_kv_heads), ATTN_THREADS threads; block (r, kh) goes over key row r's
// entries (s, t_from) and, for each, over the grp * (len[s] - t_from) (head, query) pairs, warp w
// taking pairs w, w+4, ... Writes dk/dv of (r, kh) (zeros for a row nobody attends to).
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_bwd_dkdv(float *dk, float *dv, const float *dout,
                                                                const float *lse, const float *Dd, const float *q,
                                                                const float *k, const float *v, packed_meta_t m,
                                                                int H, int grp, int hd, int kvd, float scale) {
    __shared__ float s_acc[ATTN_WARPS][ATTN_MAX_HD];
    int r = blockIdx.x, kh = blockIdx.y;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    size_t ko = (size_t)r * kvd + (size_t)kh * hd;
    float kr[ATTN_PER_LANE], vr[ATTN_PER_LANE], adk[ATTN_PER_LANE], adv[ATTN_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATTN_PER_LANE; c++) {
        int d = lane + 32 * c;
        kr[c] = d < hd ? k[ko + d] : 0.0f;
        vr[c] = d < hd ? v[ko + d] : 0.0f;
        adk[c] = adv[c] = 0.0f;
    }
    for (int e = m.ent_off[r]; e < m.ent_off[r + 1]; e++) {
        int2 en = m.ent[e];
        int s = en.x, t0 = en.y, nt = m.len[s] - t0;
        int cnt = grp * nt;
        for (int it = w; it < cnt; it += ATTN_WARPS) {
            int gi = it / nt, t = t0 + it % nt;
            int h = kh * grp + gi;
            size_t i = (size_t)m.start[s] + t;
            size_t qo = (i * H + h) * hd;
            float qr[ATTN_PER_LANE], dor[ATTN_PER_LANE], ps = 0.0f, pd = 0.0f;
#pragma unroll
            for (int c = 0; c < ATTN_PER_LANE; c++) {
                int d = lane + 32 * c;
                qr[c] = d < hd ? q[qo + d] : 0.0f;
                dor[c] = d < hd ? dout[qo + d] : 0.0f;
                ps += qr[c] * kr[c];
                pd += dor[c] * vr[c];
            }
            float P = expf(warp_sum(ps) * scale - lse[i * H + h]);
            float dS = P * (warp_sum(pd) - Dd[i * H + h]) * scale;
#pragma unroll
            for (int c = 0; c < ATTN_PER_LANE; c++) {
                adk[c] += dS * qr[c];
                adv[c] += P * dor[c];
            }
        }
    }
    // dk, then dv, through the same shared buffer.
    for (int pass = 0; pass < 2; pass++) {
        float *dst = pass == 0 ? dk : dv;
#pragma unroll
        for (int c = 0; c < ATTN_PER_LANE; c++) {
            int d = lane + 32 * c;
            if (d < hd) s_acc[w][d] = pass == 0 ? adk[c] : adv[c];
        }
        __syncthreads();
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
            for (int ww = 0; ww < ATTN_WARPS; ww++) o += s_acc[ww][d];
            dst[ko + d] = o;
        }
        __syncthreads();   // before the buffer is refilled
    }
}

static void cuda_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          const float *q, const float *k, const float *v, const kern_packed_attn_t *a) {
    if (a->n_tokens <= 0) return;
    int N = a->n_tokens, H = a->n_heads, KV = a->n_kv_heads, hd = a->head_dim, kvd = KV * hd;
    packed_host_t hm = packed_build("attn_bwd", a, true);
    ensure_init();
    // Overwrite semantics: rows outside every sequence come out zero, as on the CPU.
    CK(cudaMemsetAsync(dq, 0, sizeof(float) * (size_t)N * H * hd, g.stream));
    CK(cudaMemsetAsync(dk, 0, sizeof(float) * (size_t)N * kvd, g.stream));
    CK(cudaMemsetAsync(dv, 0, sizeof(float) * (size_t)N * kvd, g.stream));
    if (hm.items.empty()) return;
    std::lock_guard<std::mutex> lk(g.mu);
    packed_meta_t m = packed_upload(a, hm);
    float *Dd = (float *)grow(g.fscratch, sizeof(float) * (size_t)N * H);
    int grp = H / KV;
    float scale = 1.0f / sqrtf((float)hd);
    dim3 qgrid((unsigned)m.n_items, (unsigned)H);
    LAUNCH(k_attn_bwd_D, qgrid, 32, Dd, dout, out, m, H, hd);
    LAUNCH(k_attn_bwd_dq, qgrid, ATTN_THREADS, dq, dout, lse, Dd, q, k, v, m, H, grp, hd, kvd, scale);
    LAUNCH(k_attn_bwd_dkdv, dim3((unsigned)N, (unsigned)KV), ATTN_THREADS, dk, dv, dout, lse, Dd, q, k, v, m, H,
           grp, hd, kvd, scale);
}

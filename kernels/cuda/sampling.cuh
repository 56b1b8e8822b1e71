// sampling.cuh - the CUDA backend's sample op: the semantics of common/engine/sampler.c, one row
// per block. Part of kernels/cuda/cuda.cu's translation unit (included there, after the backend
// state and device helpers it uses); not a header of its own.

// --- sampling ------------------------------------------------------------------------------------------
// sample: the semantics of common/engine/sampler.c's sampler_sample (see kernels.h), one row per
// block.
//
// Launch: grid = the rows of one launch, SAMPLE_THREADS threads; the rows are processed in
// launches of at most SAMPLE_SCRATCH_BYTES / (4 V) rows (the float weights of a launch's rows live
// in a grow-only scratch of at most that size, 64 MiB; at least one row per launch).
// Supported sizes: 1 <= V <= SAMPLE_MAX_V (2^24); a row with temperature > 0 and 0 < top_k < V
// needs top_k <= SAMPLE_CAP (4096: the heap lives in shared memory) and 0 <= u < 1; anything else
// aborts before the first CUDA call. Any n; top_p any float.
//
// Per row (T = temperature, T <= 0: greedy):
//   1. zmax, then the log-sum-exp of z/T in double (block sums in a fixed order) and, unless
//      greedy, the float weights w_j = (float)exp(z_j/T - zmax/T) into the scratch, as on the CPU.
//      w of the largest logit is exactly 1.
//   2. greedy: argmax (block tree, NaN loses, lowest id on ties).
//   3. otherwise a candidate is ordered by its 64-bit key (bits(w) << 32 | ~id): higher weight,
//      then lower id, exactly the sampler's order; then
//      - no top-k, no top-p: inverse CDF over ids in order: each thread sums a contiguous
//        segment, thread 0 scans the segment sums, the segment holding u * mass is walked;
//      - top-k: the sampler's heap (worst at the root) is rebuilt in shared memory in exactly
//        its order: elements 0..k-1 heapified by thread 0, then the rest in chunks of
//        SAMPLE_THREADS, each thread testing its element against the root (the root only gets
//        better, so an element that fails never enters), thread 0 inserting the chunk's passes in
//        id order. The same heap layout means the same draw order and the same double sums:
//        without top-p, thread 0 draws over the heap array as the sampler does; with top-p the k
//        keys are sorted (bitonic, shared memory) and thread 0 takes the nucleus best first and
//        draws worst first, as the sampler's heap pops do;
//      - top-p alone: the tokens with w >= thr hold all of the nucleus when the weights below
//        thr sum to at most half of the mass top-p leaves out (thr = that half / V, or the
//        largest power of two for which it holds, found in 7 passes). When there are at most
//        SAMPLE_CAP of them (a peaked distribution, the usual case), they are compacted into
//        shared memory, sorted and walked by thread 0 as above. More (a flat distribution, top_p
//        near 1): bisections over the weight bits with block sums find the nucleus cut-off and
//        then the drawn token (about 64 passes over the row: slow but general).
// Differences from the CPU that remain: the sums over a whole row (its mass and log-sum-exp, the
// no-truncation walk, the bisections' sums) are formed in another order, and CUDA's exp may
// differ from glibc's by an ulp, which can move a float weight by an ulp; both change a token
// only when u * mass or the top-p target falls within ~1e-12 (relative) of a cumulative
// boundary, or when two weights at the top-k boundary are within an ulp. The sorted and top-k
// paths otherwise repeat the sampler's double additions in its order. Log-probs agree to ~1e-7.
// Deterministic: no atomics, fixed summation orders. Non-greedy rows with NaN or infinite logits
// (a NaN mass) get token 0 and a NaN log-prob.
#define SAMPLE_THREADS 256   // a power of two (the tree reductions)
#define SAMPLE_CAP 4096
#define SAMPLE_MAX_V (1 << 24)
#define SAMPLE_SCRATCH_BYTES ((size_t)64 << 20)

struct sample_row_t {
    float temp;
    int top_k;
    float top_p;
    float u;
};

struct sample_out_t {
    int tok;
    float lp;
};

typedef unsigned long long skey_t;

struct sample_smem_t {
    skey_t keys[SAMPLE_CAP];   // the top-k heap, the candidates to sort
    double d[SAMPLE_THREADS];  // per-thread segment sums
    float f[SAMPLE_THREADS];   // per-thread values (argmax)
    int i[SAMPLE_THREADS];     // per-thread counts, flags, ids
    double dred[32];           // block_sum scratch
    float fred[32];            // block_max scratch
    int ired[32];              // block_sum<int> scratch
    double mass;               // values thread 0 hands to the block
    int tok, cnt, found;
};

__device__ __forceinline__ skey_t skey(float w, int j) {
    return ((skey_t)__float_as_uint(w) << 32) | (skey_t)(0xffffffffu - (unsigned)j);
}
__device__ __forceinline__ int skey_id(skey_t k) { return (int)(0xffffffffu - (unsigned)(k & 0xffffffffull)); }
__device__ __forceinline__ float skey_w(skey_t k) { return __uint_as_float((unsigned)(k >> 32)); }
// Keys of weight bits b: [skey_lo(b), skey_hi(b)].
__device__ __forceinline__ skey_t skey_lo(unsigned long long b) { return b << 32; }
__device__ __forceinline__ skey_t skey_hi(unsigned long long b) { return (b << 32) | 0xffffffffull; }

// This thread's contiguous segment [lo, hi) of 0..V-1 (segments in thread order).
__device__ __forceinline__ void seg_range(int V, int *lo, int *hi) {
    int L = (V + (int)blockDim.x - 1) / (int)blockDim.x;
    int a = (int)threadIdx.x * L;
    *lo = a < V ? a : V;
    *hi = a + L < V ? a + L : V;
}

// Exclusive scan of one int per thread in thread order (reverse: from the last thread down), by
// thread 0; returns this thread's offset, *total the sum. Resets sm->found to -1. All threads.
__device__ int scan_int(int c, bool reverse, int *total, sample_smem_t *sm) {
    int t = threadIdx.x, nt = blockDim.x;
    sm->i[t] = c;
    __syncthreads();
    if (t == 0) {
        int run = 0;
        for (int k = 0; k < nt; k++) {
            int q = reverse ? nt - 1 - k : k;
            int v = sm->i[q];
            sm->i[q] = run;
            run += v;
        }
        sm->cnt = run;
        sm->found = -1;
    }
    __syncthreads();
    int off = sm->i[t];
    *total = sm->cnt;
    __syncthreads();   // sm->i and sm->cnt may be reused right after
    return off;
}

__device__ int block_max_int(int v, sample_smem_t *sm) {
    int t = threadIdx.x;
    sm->i[t] = v;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (t < st && sm->i[t + st] > sm->i[t]) sm->i[t] = sm->i[t + st];
        __syncthreads();
    }
    int r = sm->i[0];
    __syncthreads();
    return r;
}

// Greedy order: a number beats NaN, then the larger value, then the lower id.
__device__ __forceinline__ bool greedy_better(float va, int ia, float vb, int ib) {
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

__device__ int sample_argmax(const float *z, int V, sample_smem_t *sm) {
    int t = threadIdx.x;
    float bv = 0.0f;
    int bi = -1;
    for (int j = t; j < V; j += blockDim.x)
        if (bi < 0 || greedy_better(z[j], j, bv, bi)) {
            bv = z[j];
            bi = j;
        }
    sm->f[t] = bv;
    sm->i[t] = bi;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (t < st) {
            int o = t + st;
            if (sm->i[o] >= 0 && (sm->i[t] < 0 || greedy_better(sm->f[o], sm->i[o], sm->f[t], sm->i[t]))) {
                sm->f[t] = sm->f[o];
                sm->i[t] = sm->i[o];
            }
        }
        __syncthreads();
    }
    int r = sm->i[0];
    __syncthreads();
    return r;
}

// Sum of w over the positions whose key lies in [klo, khi], in a fixed order (strided per thread,
// then block_sum); every thread gets it. Monotone in the key range (non-negative terms).
__device__ double wsum_keys(const float *w, int V, skey_t klo, skey_t khi, sample_smem_t *sm) {
    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        skey_t k = skey(w[j], j);
        if (k >= klo && k <= khi) s += (double)w[j];
    }
    return block_sum(s, sm->dred);
}

__device__ int wcount_keys(const float *w, int V, skey_t klo, skey_t khi, sample_smem_t *sm) {
    int c = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        skey_t k = skey(w[j], j);
        c += k >= klo && k <= khi;
    }
    return block_sum(c, sm->ired);
}

// The q-th (1-based) position, by increasing id (from_top: decreasing), among those whose key lies
// in [klo, khi]; -1 when there are fewer. All threads.
__device__ int nth_keys(const float *w, int V, skey_t klo, skey_t khi, int q, bool from_top, sample_smem_t *sm) {
    int lo, hi, c = 0, total;
    seg_range(V, &lo, &hi);
    for (int j = lo; j < hi; j++) {
        skey_t k = skey(w[j], j);
        c += k >= klo && k <= khi;
    }
    int off = scan_int(c, from_top, &total, sm);
    if (off < q && q <= off + c) {
        int need = q - off;
        for (int a = 0; a < hi - lo; a++) {
            int j = from_top ? hi - 1 - a : lo + a;
            skey_t k = skey(w[j], j);
            if (k >= klo && k <= khi && --need == 0) {
                sm->found = j;
                break;
            }
        }
    }
    __syncthreads();
    int r = sm->found;
    __syncthreads();
    return r;
}

// Sorts keys[0..n) (n <= SAMPLE_CAP) in decreasing order: bitonic over the next power of two,
// padded with 0 (below every key: an id < 2^24 keeps the low half non-zero). All threads.
__device__ void sort_keys_desc(skey_t *keys, int n) {
    int P = 1;
    while (P < n) P <<= 1;
    for (int i = n + threadIdx.x; i < P; i += blockDim.x) keys[i] = 0;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                int l = i ^ stride;
                if (l > i) {
                    skey_t a = keys[i], b = keys[l];
                    if ((i & size) == 0 ? a < b : a > b) {
                        keys[i] = b;
                        keys[l] = a;
                    }
                }
            }
            __syncthreads();
        }
}

// Thread 0 only: the sampler's top-p and draw on n candidates sorted best first, mass their
// total as the sampler has it: the nucleus is the shortest prefix whose running sum reaches
// top_p * mass (all n if none does), drawn worst first with u.
__device__ int nucleus_draw(const skey_t *keys, int n, double mass, float top_p, float u) {
    double target = (double)top_p * mass, cum = 0.0;
    int c = n - 1;
    for (int i = 0; i < n; i++) {
        cum += (double)skey_w(keys[i]);
        if (cum >= target) {
            c = i;
            break;
        }
    }
    double t2 = (double)u * cum, cum2 = 0.0;
    int last = -1;
    for (int i = c; i >= 0; i--) {
        float x = skey_w(keys[i]);
        if (!(x > 0)) continue;
        cum2 += (double)x;
        last = skey_id(keys[i]);
        if (cum2 > t2) return last;
    }
    return last >= 0 ? last : skey_id(keys[c]);
}

// The sampler's sift_down on its worst-root heap: the smaller key nearer the root.
__device__ void heap_sift_min(skey_t *h, int n, int i) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (!(h[c] < h[i])) return;
        skey_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

// No truncation: inverse CDF over ids 0..V-1 in order.
__device__ int draw_all(const float *w, int V, float u, sample_smem_t *sm) {
    int t = threadIdx.x, lo, hi, last = -1;
    seg_range(V, &lo, &hi);
    double seg = 0.0;
    for (int j = lo; j < hi; j++)
        if (w[j] > 0) {
            seg += (double)w[j];
            last = j;
        }
    sm->d[t] = seg;
    __syncthreads();
    if (t == 0) {
        double run = 0.0;
        for (int q = 0; q < (int)blockDim.x; q++) {
            double v = sm->d[q];
            sm->d[q] = run;
            run += v;
        }
        sm->mass = run;
        sm->tok = -1;
    }
    __syncthreads();
    double off = sm->d[t], target = (double)u * sm->mass;
    // [off, off + seg) are disjoint (thread 0 formed each next offset as off + seg): one thread.
    if (off <= target && off + seg > target) {
        double cum = off;
        int tok = last;
        for (int j = lo; j < hi; j++) {
            if (!(w[j] > 0)) continue;
            cum += (double)w[j];
            if (cum > target) {
                tok = j;
                break;
            }
        }
        sm->tok = tok;
    }
    int last_all = block_max_int(last, sm);   // its barriers publish sm->tok
    int tok = sm->tok;
    __syncthreads();
    return tok >= 0 ? tok : (last_all >= 0 ? last_all : 0);
}

// top-k (0 < k < V, k <= SAMPLE_CAP), then top-p when top_p < 1.
__device__ int draw_top_k(const float *w, int V, int k, float top_p, float u, sample_smem_t *sm) {
    skey_t *h = sm->keys;
    int t = threadIdx.x;
    if (t == 0) {
        for (int j = 0; j < k; j++) h[j] = skey(w[j], j);
        for (int i = k / 2 - 1; i >= 0; i--) heap_sift_min(h, k, i);
    }
    __syncthreads();
    for (int base = k; base < V; base += blockDim.x) {
        int j = base + t;
        int pass = j < V && skey(w[j], j) > h[0];
        sm->i[t] = pass;
        if (__syncthreads_or(pass)) {   // uniform
            if (t == 0)
                for (int q = 0; q < (int)blockDim.x; q++)
                    if (sm->i[q]) {
                        skey_t kk = skey(w[base + q], base + q);
                        if (kk > h[0]) {
                            h[0] = kk;
                            heap_sift_min(h, k, 0);
                        }
                    }
            __syncthreads();
        }
    }
    if (t == 0) {
        double mass = 0.0;   // in heap order, as the sampler sums it
        for (int i = 0; i < k; i++) mass += (double)skey_w(h[i]);
        sm->mass = mass;
        if (!(top_p < 1.0f)) {
            double target = (double)u * mass, cum = 0.0;
            int last = -1, tok = -1;
            for (int i = 0; i < k; i++) {
                float x = skey_w(h[i]);
                if (!(x > 0)) continue;
                cum += (double)x;
                last = skey_id(h[i]);
                if (cum > target) {
                    tok = last;
                    break;
                }
            }
            sm->tok = tok >= 0 ? tok : (last >= 0 ? last : skey_id(h[0]));
        }
    }
    __syncthreads();
    if (!(top_p < 1.0f)) return sm->tok;
    double mass = sm->mass;
    sort_keys_desc(h, k);
    if (t == 0) sm->tok = nucleus_draw(h, k, mass, top_p, u);
    __syncthreads();
    return sm->tok;
}

// Sum of the weights below thr (double), in a fixed order; every thread gets it.
__device__ double wsum_below(const float *w, int V, double thr, sample_smem_t *sm) {
    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if ((double)w[j] < thr) s += (double)w[j];
    return block_sum(s, sm->dred);
}

// top-p over the whole row (no top-k); mass = the row's weight sum.
__device__ int draw_top_p(const float *w, int V, float top_p, float u, double mass, sample_smem_t *sm) {
    int t = threadIdx.x, lo, hi, total;
    // Candidates: w >= thr, where the weights below thr sum to at most budget, half of the mass
    // top-p leaves out, so that the nucleus lies among them with a margin far above rounding.
    // First thr = budget / V (no pass needed); when that leaves more than SAMPLE_CAP candidates,
    // the largest power of two whose weights below sum to at most budget (bisection over the
    // exponent: 7 passes), which keeps far fewer for a peaked distribution.
    double budget = 0.5 * (1.0 - (double)top_p) * mass;
    double thr = budget / V;
    if (!(thr <= 1.0)) thr = 1.0;   // top_p far below 0: the largest weight (1) still qualifies
    seg_range(V, &lo, &hi);
    int c = 0;
    for (int j = lo; j < hi; j++) c += (double)w[j] >= thr;
    int off = scan_int(c, false, &total, sm);
    if (total > SAMPLE_CAP) {
        int elo = 0, ehi = 128;   // exponent field e: thr(e) = 2^(e - 127), thr(0) = 0
        while (ehi - elo > 1) {
            int mid = (elo + ehi) / 2;
            if (wsum_below(w, V, ldexp(1.0, mid - 127), sm) <= budget)
                elo = mid;
            else
                ehi = mid;
        }
        double thr2 = elo > 0 ? ldexp(1.0, elo - 127) : 0.0;
        if (thr2 > thr) {
            thr = thr2;
            c = 0;
            for (int j = lo; j < hi; j++) c += (double)w[j] >= thr;
            off = scan_int(c, false, &total, sm);
        }
    }
    if (total <= SAMPLE_CAP) {
        for (int j = lo; j < hi; j++)
            if ((double)w[j] >= thr) sm->keys[off++] = skey(w[j], j);
        __syncthreads();
        if (total == 0) return 0;   // not reached: the largest weight is 1
        sort_keys_desc(sm->keys, total);
        if (t == 0) sm->tok = nucleus_draw(sm->keys, total, mass, top_p, u);
        __syncthreads();
        return sm->tok;
    }

    // A large nucleus: bisections. S(b) = sum of the weights with bits >= b (b = 0: all, equal to
    // mass: the same additions in the same order); the cut-off weight bits b* = the largest b with
    // S(b) >= target.
    const skey_t KMAX = ~0ull;
    double target = (double)top_p * mass;
    float wmax = 0.0f;
    for (int j = t; j < V; j += blockDim.x) wmax = fmaxf(wmax, w[j]);
    wmax = block_max(wmax, sm->fred);
    long long bmax = (long long)__float_as_uint(wmax), blo = 0, bhi = bmax + 1;
    while (bhi - blo > 1) {
        long long mid = (blo + bhi) / 2;
        if (wsum_keys(w, V, skey_lo(mid), KMAX, sm) >= target)
            blo = mid;
        else
            bhi = mid;
    }
    unsigned long long bs = (unsigned long long)blo;
    float ws = __uint_as_float((unsigned)bs);
    double above = wsum_keys(w, V, skey_lo(bs + 1), KMAX, sm);
    int n_eq = wcount_keys(w, V, skey_lo(bs), skey_hi(bs), sm);
    // Ties at the cut-off come best first, i.e. by increasing id: the nucleus takes the r first.
    if (t == 0) {
        double cum = above;
        int r = 0;
        while (r < n_eq) {
            cum += (double)ws;
            r++;
            if (cum >= target) break;
        }
        sm->mass = cum;
        sm->tok = r;
    }
    __syncthreads();
    double nmass = sm->mass;
    int r = sm->tok;
    __syncthreads();
    int id_cut = nth_keys(w, V, skey_lo(bs), skey_hi(bs), r > 0 ? r : 1, false, sm);
    skey_t K1 = id_cut >= 0 ? skey(ws, id_cut) : skey_lo(bs);   // the nucleus: keys >= K1

    // The draw walks the nucleus worst first: G(b) = sum of its weights with bits <= b; the drawn
    // token's weight bits b2 = the smallest b with G(b) > u * nucleus mass.
    double t2 = (double)u * nmass;
    if (!(wsum_keys(w, V, K1, KMAX, sm) > t2))   // rounding: the walk ends on the best token
        return nth_keys(w, V, skey_lo(bmax), skey_hi(bmax), 1, false, sm);
    long long glo = (long long)bs - 1, ghi = bmax;
    while (ghi - glo > 1) {
        long long mid = (glo + ghi) / 2;
        if (wsum_keys(w, V, K1, skey_hi(mid), sm) > t2)
            ghi = mid;
        else
            glo = mid;
    }
    unsigned long long b2 = (unsigned long long)ghi;
    double before = b2 > bs ? wsum_keys(w, V, K1, skey_hi(b2 - 1), sm) : 0.0;
    skey_t g_lo = skey_lo(b2) > K1 ? skey_lo(b2) : K1;
    int n_g = wcount_keys(w, V, g_lo, skey_hi(b2), sm);
    // Within the group (equal weights) the walk goes by decreasing id.
    if (t == 0) {
        float wb = __uint_as_float((unsigned)b2);
        double cum = before;
        int q = 0;
        while (q < n_g) {
            cum += (double)wb;
            q++;
            if (cum > t2) break;
        }
        sm->tok = q;
    }
    __syncthreads();
    int q = sm->tok;
    __syncthreads();
    int tok = nth_keys(w, V, g_lo, skey_hi(b2), q > 0 ? q : 1, true, sm);
    return tok >= 0 ? tok : 0;
}

__global__ void __launch_bounds__(SAMPLE_THREADS) k_sample(sample_out_t *out, const float *logits, int V,
                                                           const sample_row_t *rows, int row0, float *wbuf) {
    __shared__ sample_smem_t sm;
    size_t row = (size_t)row0 + blockIdx.x;
    const sample_row_t p = rows[row];
    const float *z = logits + row * V;
    float *w = wbuf ? wbuf + (size_t)blockIdx.x * V : nullptr;
    int t = threadIdx.x;
    bool greedy = !(p.temp > 0.0f);
    double temp = greedy ? 1.0 : (double)p.temp;
    float zmax = -INFINITY;
    for (int j = t; j < V; j += blockDim.x) zmax = fmaxf(zmax, z[j]);
    zmax = block_max(zmax, sm.fred);
    double m = (double)zmax / temp, se = 0.0, sw = 0.0;
    for (int j = t; j < V; j += blockDim.x) {
        double e = exp((double)z[j] / temp - m);
        se += e;
        if (!greedy) {
            float wf = (float)e;
            w[j] = wf;
            sw += (double)wf;
        }
    }
    se = block_sum(se, sm.dred);
    sw = block_sum(sw, sm.dred);   // its barriers also publish w to the block
    double lse = m + log(se);
    int tok;
    if (greedy)
        tok = sample_argmax(z, V, &sm);
    else if (!(sw > 0.0 && sw <= (double)V))   // NaN or infinite logits
        tok = 0;
    else if (p.top_k > 0 && p.top_k < V)
        tok = draw_top_k(w, V, p.top_k, p.top_p, p.u, &sm);
    else if (p.top_p < 1.0f)
        tok = draw_top_p(w, V, p.top_p, p.u, sw, &sm);
    else
        tok = draw_all(w, V, p.u, &sm);
    if (t == 0) {
        if (tok < 0 || tok >= V) tok = 0;   // defensive: never an id outside the row
        out[row].tok = tok;
        out[row].lp = (float)((double)z[tok] / temp - lse);
    }
}

static void cuda_sample(int32_t *tokens, float *logprobs, const float *logits, int n, int V, const float *temperature,
                        const int *top_k, const float *top_p, const float *u) {
    if (n <= 0) return;
    if (V < 1 || V > SAMPLE_MAX_V) die_size("sample", "V %d outside the supported range 1..%d", V, SAMPLE_MAX_V);
    if (!tokens || !logits || !temperature || !top_k || !top_p || !u)
        die_size("sample", "tokens, logits, temperature, top_k, top_p and u must not be NULL");
    std::vector<sample_row_t> rows(n);
    bool any_drawn = false;
    for (int r = 0; r < n; r++) {
        rows[r] = sample_row_t{temperature[r], top_k[r], top_p[r], u[r]};
        if (!(temperature[r] > 0.0f)) continue;
        any_drawn = true;
        if (top_k[r] > SAMPLE_CAP && top_k[r] < V)
            die_size("sample", "row %d: top_k %d > %d (supported: 0 or >= V = off, 1..%d)", r, top_k[r], SAMPLE_CAP,
                     SAMPLE_CAP);
        if (!(u[r] >= 0.0f && u[r] < 1.0f)) die_size("sample", "row %d: u = %g outside [0, 1)", r, (double)u[r]);
    }
    int per = (int)std::min((size_t)n, std::max((size_t)1, SAMPLE_SCRATCH_BYTES / (sizeof(float) * (size_t)V)));
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_rows = up.put(rows);
    unsigned char *d = up.commit();
    sample_out_t *dout = (sample_out_t *)grow(g.sres, sizeof(sample_out_t) * (size_t)n);
    float *wbuf = any_drawn ? (float *)grow(g.wscratch, sizeof(float) * (size_t)per * V) : nullptr;
    for (int row0 = 0; row0 < n; row0 += per)
        LAUNCH(k_sample, (unsigned)std::min(per, n - row0), SAMPLE_THREADS, dout, logits, V,
               at<const sample_row_t>(d, o_rows), row0, wbuf);
    size_t bytes = sizeof(sample_out_t) * (size_t)n;
    if (g.down_cap < bytes) {
        if (g.down) CK(cudaFreeHost(g.down));   // not in use: every use ends with a synchronisation
        g.down = nullptr;
        g.down_cap = 0;
        size_t cap = std::max(bytes, (size_t)4096);
        CK(cudaHostAlloc((void **)&g.down, cap, cudaHostAllocDefault));
        g.down_cap = cap;
    }
    CK(cudaMemcpyAsync(g.down, dout, bytes, cudaMemcpyDeviceToHost, g.stream));
    CK(cudaStreamSynchronize(g.stream));
    const sample_out_t *res = (const sample_out_t *)(void *)g.down;
    for (int r = 0; r < n; r++) {
        tokens[r] = res[r].tok;
        if (logprobs) logprobs[r] = res[r].lp;
    }
}

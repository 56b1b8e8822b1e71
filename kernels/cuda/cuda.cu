// cuda.cu - the CUDA compute backend: cuBLAS SGEMM for dense products, simple CUDA kernels for
// everything else, all on one stream. The memory contract (float tensors on the device, index
// and metadata arrays on the host) and the error policy are described in kernels/cuda/cuda.h.
//
// The CPU backend (kernels/cpu/cpu.c) is the reference: every op here replicates its semantics
// (what is accumulated with += and what is overwritten, temperature handling, double-precision
// log-sum-exp, the lse layout, inverse RoPE, shared-prefix attention). Correctness first: the
// kernels are deliberately plain, and deterministic (no floating-point atomics; every sum has a
// fixed order for a given launch), so that a run can be reproduced.
//
// Conventions used by every kernel below:
//   * a zero-sized op returns before launching anything (a launch with an empty grid is an error);
//   * element-wise kernels use grid-stride loops with size_t indices (any n);
//   * "block per row" kernels put the row index in blockIdx.x (up to 2^31 - 1 rows) and loop
//     over the row's columns with the block's threads (any row length);
//   * sizes a kernel cannot handle abort with "marlaas cuda: <op> failed: <reason>"; ops check
//     their arguments on the host BEFORE their first CUDA call (so a bad call aborts with that
//     message even in a process that cannot use CUDA, e.g. a fork() child in the tests).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/cuda/cuda.h"

// --- errors ----------------------------------------------------------------------------------

[[noreturn]] static void die(const char *call, const char *reason) {
    fprintf(stderr, "marlaas cuda: %s failed: %s\n", call, reason);
    fflush(stderr);
    abort();
}

// An op called with sizes this backend does not support.
[[noreturn]] __attribute__((format(printf, 2, 3))) static void die_size(const char *op, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    die(op, buf);
}

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t ck_e_ = (x);                                                \
        if (ck_e_ != cudaSuccess) die(#x, cudaGetErrorString(ck_e_));           \
    } while (0)

#define CKB(x)                                                                  \
    do {                                                                        \
        cublasStatus_t ck_s_ = (x);                                             \
        if (ck_s_ != CUBLAS_STATUS_SUCCESS) die(#x, cublasGetStatusString(ck_s_)); \
    } while (0)

// --- backend state -----------------------------------------------------------------------------

// A grow-only device buffer (scratch owned by the backend, never freed).
struct dev_buf_t {
    void *p = nullptr;
    size_t cap = 0;
};

// Pinned staging slots of the metadata upload (see upload_t), used in turn.
#define N_STAGE 4
struct stage_t {
    unsigned char *host = nullptr;   // pinned (cudaHostAlloc)
    size_t cap = 0;
    cudaEvent_t copied = nullptr;    // recorded after the copy that reads this slot
    bool pending = false;
};

#define RED_BLOCK 256        // threads of the reduction kernels (sumsq, all_finite)
#define RED_MAX_BLOCKS 1024  // partial sums of sumsq's first pass

static struct {
    std::once_flag once;
    std::mutex mu;             // serialises the use of the scratch buffers below
    int device = -1;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    bool sync_each = false;    // MARLAAS_CUDA_SYNC=1: synchronise after every launch
    double *red = nullptr;     // RED_MAX_BLOCKS + 1 doubles (sumsq partials, result)
    int *flag = nullptr;       // all_finite's "found a non-finite value" flag
    dev_buf_t meta;            // uploaded host metadata (ints, segment structs)
    dev_buf_t fscratch;        // float scratch (attention backward's D = dout . out)
    dev_buf_t bscratch;        // gemm_bf16w's bf16 copy of X
    dev_buf_t wscratch;        // sample's float weights (rows of one launch)
    dev_buf_t sres;            // sample's results
    unsigned char *down = nullptr;   // pinned buffer sample's results are copied back through
    size_t down_cap = 0;
    std::vector<unsigned char> host;   // where an op assembles its metadata
    stage_t stage[N_STAGE];            // pinned copies of it, being uploaded
    int stage_next = 0;
} g;

static void init_once(void) {
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 1) die("cudaGetDeviceCount", "no CUDA device visible");
    CK(cudaGetDevice(&g.device));
    // A blocking stream: it also orders with any work others put on the legacy default stream.
    CK(cudaStreamCreate(&g.stream));
    CKB(cublasCreate(&g.blas));
    CKB(cublasSetStream(g.blas, g.stream));
    // Full fp32 (CUBLAS_COMPUTE_32F): no TF32 tensor-op math.
    CKB(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH));
    CKB(cublasSetPointerMode(g.blas, CUBLAS_POINTER_MODE_HOST));
    CK(cudaMalloc((void **)&g.red, sizeof(double) * (RED_MAX_BLOCKS + 1)));
    CK(cudaMalloc((void **)&g.flag, sizeof(int)));
    for (int i = 0; i < N_STAGE; i++) CK(cudaEventCreateWithFlags(&g.stage[i].copied, cudaEventDisableTiming));
    const char *s = getenv("MARLAAS_CUDA_SYNC");
    g.sync_each = s && *s && strcmp(s, "0") != 0;
}

static void ensure_init(void) { std::call_once(g.once, init_once); }

// Checks a launch (bad configurations are reported at once); with MARLAAS_CUDA_SYNC=1 also waits
// for the kernel, so that a fault is reported against the kernel that caused it.
static void after_launch(const char *name) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) die(name, cudaGetErrorString(e));
    if (g.sync_each) {
        e = cudaStreamSynchronize(g.stream);
        if (e != cudaSuccess) die(name, cudaGetErrorString(e));
    }
}

#define LAUNCH(kernel, grid, block, ...)                                        \
    do {                                                                        \
        kernel<<<(grid), (block), 0, g.stream>>>(__VA_ARGS__);                  \
        after_launch("launch of " #kernel);                                     \
    } while (0)

static void *grow(dev_buf_t &b, size_t bytes) {
    if (bytes > b.cap) {
        size_t cap = std::max(bytes, std::max(2 * b.cap, (size_t)4096));
        if (b.p) {
            // Kernels queued earlier may still read the old buffer.
            CK(cudaStreamSynchronize(g.stream));
            CK(cudaFree(b.p));
            b.p = nullptr;
            b.cap = 0;
        }
        CK(cudaMalloc(&b.p, cap));
        b.cap = cap;
    }
    return b.p;
}

// Metadata upload: an op appends its host arrays with put() (each at a 16-byte aligned offset)
// into g.host, then commit() copies them all at once into the device buffer g.meta and returns
// its address; the device address of an array is base + the offset put() returned.
//
// Why it is safe without synchronising the stream:
//   * device side: the copy is queued on the backend's one stream, so it runs only after every
//     kernel queued before it, the ones reading the previous contents of g.meta included;
//   * host side: the asynchronous copy reads a pinned staging slot (g.stage, N_STAGE of them in
//     turn), which is refilled only after the event recorded behind its previous copy has
//     completed. (An asynchronous copy from pageable memory is not documented to have consumed
//     its source when it returns, so pageable memory is never the source.)
// The caller's arrays are copied into g.host during the call: they may change right after it.
struct upload_t {
    size_t used = 0;
    upload_t() { g.host.clear(); }
    size_t put(const void *src, size_t bytes) {
        size_t off = (used + 15) & ~(size_t)15;
        if (g.host.size() < off + bytes) g.host.resize(off + bytes);
        if (bytes) memcpy(g.host.data() + off, src, bytes);
        used = off + bytes;
        return off;
    }
    template <class T> size_t put(const std::vector<T> &v) { return put(v.data(), sizeof(T) * v.size()); }
    unsigned char *commit() {
        if (used == 0) return nullptr;
        stage_t &st = g.stage[g.stage_next];
        g.stage_next = (g.stage_next + 1) % N_STAGE;
        if (st.pending) CK(cudaEventSynchronize(st.copied));   // its last copy has read it
        st.pending = false;
        if (st.cap < used) {
            size_t cap = std::max(used, std::max(2 * st.cap, (size_t)4096));
            if (st.host) CK(cudaFreeHost(st.host));
            st.host = nullptr;
            st.cap = 0;
            CK(cudaHostAlloc((void **)&st.host, cap, cudaHostAllocDefault));
            st.cap = cap;
        }
        memcpy(st.host, g.host.data(), used);
        unsigned char *d = (unsigned char *)grow(g.meta, used);
        CK(cudaMemcpyAsync(d, st.host, used, cudaMemcpyHostToDevice, g.stream));
        CK(cudaEventRecord(st.copied, g.stream));
        st.pending = true;
        return d;
    }
};

template <class T> static T *at(unsigned char *base, size_t off) { return (T *)(void *)(base + off); }

// --- device helpers ------------------------------------------------------------------------------

template <class T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// sm: 32 elements of shared memory. Every thread of the block must call it.
template <class T> __device__ T block_sum(T v, T *sm) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sm[w] = v;
    __syncthreads();
    if (w == 0) {
        T r = lane < nw ? sm[lane] : (T)0;
        r = warp_sum(r);
        if (lane == 0) sm[0] = r;
    }
    __syncthreads();
    T r = sm[0];
    __syncthreads();   // sm may be reused right after
    return r;
}

__device__ float block_max(float v, float *sm) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) sm[w] = v;
    __syncthreads();
    if (w == 0) {
        float r = lane < nw ? sm[lane] : -INFINITY;
        r = warp_max(r);
        if (lane == 0) sm[0] = r;
    }
    __syncthreads();
    float r = sm[0];
    __syncthreads();
    return r;
}

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// Element-wise kernels: EW_BLOCK threads, ew_grid(n) blocks (at most EW_MAX_GRID; the grid-stride
// loop covers any n).
#define EW_BLOCK 256
#define EW_MAX_GRID 65535
static unsigned ew_grid(size_t n) {
    size_t b = (n + EW_BLOCK - 1) / EW_BLOCK;
    return (unsigned)std::min(b, (size_t)EW_MAX_GRID);
}

// Block size of the "block per row" kernels (rmsnorm, losses, embed, lora_expand).
#define ROW_BLOCK 256

// --- memory -------------------------------------------------------------------------------------

static void *cuda_alloc(size_t bytes) {
    ensure_init();
    size_t n = bytes ? bytes : 256;
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s (allocating %zu bytes)", cudaGetErrorString(e), bytes);
        die("cudaMalloc", msg);
    }
    CK(cudaMemsetAsync(p, 0, n, g.stream));
    return p;
}

static void cuda_free(void *p) {
    if (!p) return;
    ensure_init();
    CK(cudaStreamSynchronize(g.stream));   // queued kernels may still use p
    CK(cudaFree(p));
}

static void cuda_to_dev(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    ensure_init();
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream));
    CK(cudaStreamSynchronize(g.stream));   // complete on return, whatever kind of memory src is
}

static void cuda_to_host(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    ensure_init();
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream));
    CK(cudaStreamSynchronize(g.stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (dst == src || !bytes) return;
    ensure_init();
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream));
}

static void cuda_zero(void *p, size_t bytes) {
    if (!bytes) return;
    ensure_init();
    CK(cudaMemsetAsync(p, 0, bytes, g.stream));
}

// --- dense ----------------------------------------------------------------------------------------

// gemm with K = 0: C = beta * C (0 when beta = 0, as in the CPU backend). Element-wise over M*N
// (EW_BLOCK threads, ew_grid(M*N) blocks, grid-stride); any M, N, ldc >= N.
__global__ void k_gemm_k0(float *C, int M, int N, int ldc, float beta) {
    GRID_STRIDE(e, (size_t)M * N) {
        size_t i = e / N, j = e % N;
        float *c = C + i * ldc + j;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

// Row-major C (M,N) = alpha op(A) op(B) + beta C is, read column-major, C^T = op(B)^T op(A)^T:
// cuBLAS gets (B, A) swapped with the same transpose flags and the dimensions (N, M, K).
static void cuda_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    ensure_init();
    if (K <= 0) {
        LAUNCH(k_gemm_k0, ew_grid((size_t)M * N), EW_BLOCK, C, M, N, ldc, beta);
        return;
    }
    std::lock_guard<std::mutex> lk(g.mu);   // the handle is shared
    CKB(cublasSgemm(g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                    A, lda, &beta, C, ldc));
    after_launch("cublasSgemm");
}

// --- bf16 ------------------------------------------------------------------------------------------
// bf16 values are uint16_t bit patterns (the upper half of an fp32), converted with the same
// integer operations as the CPU backend: round to nearest even, overflow to inf, NaN kept (quiet).

__device__ __forceinline__ uint16_t bf16_from_f32(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((unsigned)h << 16); }

// to_bf16, from_bf16: element-wise, EW_BLOCK threads, ew_grid(n) blocks, grid-stride; any n.
__global__ void k_to_bf16(uint16_t *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = bf16_from_f32(src[i]);
}

__global__ void k_from_bf16(float *dst, const uint16_t *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = bf16_to_f32(src[i]);
}

static void cuda_to_bf16(uint16_t *dst, const float *src, size_t n) {
    if (!n) return;
    ensure_init();
    LAUNCH(k_to_bf16, ew_grid(n), EW_BLOCK, dst, src, n);
}

static void cuda_from_bf16(float *dst, const uint16_t *src, size_t n) {
    if (!n) return;
    ensure_init();
    LAUNCH(k_from_bf16, ew_grid(n), EW_BLOCK, dst, src, n);
}

// X (M,K) with row stride ldx -> bf16 (M,K) contiguous: element-wise over M*K (EW_BLOCK threads,
// ew_grid(M*K) blocks, grid-stride); any sizes.
__global__ void k_rows_to_bf16(uint16_t *dst, const float *X, int ldx, int K, size_t total) {
    GRID_STRIDE(e, total) dst[e] = bf16_from_f32(X[(e / K) * ldx + e % K]);
}

// trans_w: C (M,N) = alpha X W^T + beta C with W (N,K) bf16; !trans_w: C = alpha X W + beta C
// with W (K,N) bf16. X is rounded to bf16 into a grow-only scratch (M*K*2 bytes), then
// cublasGemmEx with bf16 A and B, fp32 C and CUBLAS_COMPUTE_32F (fp32 accumulation; tensor cores
// where cuBLAS picks them). Row-major to column-major as in cuda_gemm: C^T (N,M) = op(W) X^T with
// X^T as is (ldb = K); a row-major W (N,K) is a column-major (K,N), read transposed (CUBLAS_OP_T,
// lda = ldw); a row-major W (K,N) is a column-major (N,K), read as is (CUBLAS_OP_N, lda = ldw).
// Any M, N, K; ldx >= K, ldw >= K (trans_w) or >= N (!trans_w), ldc >= N (checked); K = 0 gives
// beta * C.
static void cuda_gemm_bf16w(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx,
                            const uint16_t *W, int ldw, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K > 0 && ldx < K) die_size("gemm_bf16w", "ldx %d must be >= K %d", ldx, K);
    if (K > 0 && trans_w && ldw < K) die_size("gemm_bf16w", "ldw %d must be >= K %d (trans_w)", ldw, K);
    if (K > 0 && !trans_w && ldw < N) die_size("gemm_bf16w", "ldw %d must be >= N %d (W not transposed)", ldw, N);
    if (ldc < N) die_size("gemm_bf16w", "ldc %d < N %d", ldc, N);
    ensure_init();
    if (K <= 0) {
        LAUNCH(k_gemm_k0, ew_grid((size_t)M * N), EW_BLOCK, C, M, N, ldc, beta);
        return;
    }
    std::lock_guard<std::mutex> lk(g.mu);   // the handle and the scratch are shared
    size_t total = (size_t)M * K;
    uint16_t *Xb = (uint16_t *)grow(g.bscratch, sizeof(uint16_t) * total);
    LAUNCH(k_rows_to_bf16, ew_grid(total), EW_BLOCK, Xb, X, ldx, K, total);
    CKB(cublasGemmEx(g.blas, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha, W, CUDA_R_16BF, ldw,
                     Xb, CUDA_R_16BF, K, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    after_launch("cublasGemmEx");
}

// axpy, scale: element-wise, EW_BLOCK threads, ew_grid(n) blocks, grid-stride; any n.
__global__ void k_axpy(size_t n, float alpha, const float *x, float *y) {
    GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

__global__ void k_scale(size_t n, float alpha, float *x) {
    GRID_STRIDE(i, n) x[i] *= alpha;
}

static void cuda_axpy(size_t n, float alpha, const float *x, float *y) {
    if (!n) return;
    ensure_init();
    LAUNCH(k_axpy, ew_grid(n), EW_BLOCK, n, alpha, x, y);
}

static void cuda_scale(size_t n, float alpha, float *x) {
    if (!n) return;
    ensure_init();
    LAUNCH(k_scale, ew_grid(n), EW_BLOCK, n, alpha, x);
}

// sumsq, pass 1: RED_BLOCK threads, min(ceil(n / RED_BLOCK), RED_MAX_BLOCKS) blocks; each block
// writes the double sum of its grid-stride share to part[blockIdx.x]. Pass 2: one block of
// RED_BLOCK threads sums the partials. Fixed order for a given n: deterministic.
__global__ void __launch_bounds__(RED_BLOCK) k_sumsq_part(size_t n, const float *x, double *part) {
    __shared__ double sm[32];
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)x[i];
        s += v * v;
    }
    s = block_sum(s, sm);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(RED_BLOCK) k_sum_parts(int nb, const double *part, double *out) {
    __shared__ double sm[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum(s, sm);
    if (threadIdx.x == 0) *out = s;
}

static double cuda_sumsq(size_t n, const float *x) {
    if (!n) return 0.0;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    unsigned nb = (unsigned)std::min((n + RED_BLOCK - 1) / RED_BLOCK, (size_t)RED_MAX_BLOCKS);
    LAUNCH(k_sumsq_part, nb, RED_BLOCK, n, x, g.red);
    LAUNCH(k_sum_parts, 1, RED_BLOCK, (int)nb, g.red, g.red + RED_MAX_BLOCKS);
    double s = 0.0;
    CK(cudaMemcpyAsync(&s, g.red + RED_MAX_BLOCKS, sizeof s, cudaMemcpyDeviceToHost, g.stream));
    CK(cudaStreamSynchronize(g.stream));
    return s;
}

__device__ __forceinline__ bool finite_bits(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;   // exponent all ones: inf or nan
}

// RED_BLOCK threads, ew_grid-like grid (at most RED_MAX_BLOCKS blocks, grid-stride); sets *bad
// to 1 when a block saw a non-finite value (every writer writes 1: no race on the outcome).
__global__ void __launch_bounds__(RED_BLOCK) k_all_finite(size_t n, const float *x, int *bad) {
    int b = 0;
    GRID_STRIDE(i, n) b |= !finite_bits(x[i]);
    if (__syncthreads_or(b) && threadIdx.x == 0) *bad = 1;
}

static bool cuda_all_finite(size_t n, const float *x) {
    if (!n) return true;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    unsigned nb = (unsigned)std::min((n + RED_BLOCK - 1) / RED_BLOCK, (size_t)RED_MAX_BLOCKS);
    CK(cudaMemsetAsync(g.flag, 0, sizeof(int), g.stream));
    LAUNCH(k_all_finite, nb, RED_BLOCK, n, x, g.flag);
    int bad = 0;
    CK(cudaMemcpyAsync(&bad, g.flag, sizeof bad, cudaMemcpyDeviceToHost, g.stream));
    CK(cudaStreamSynchronize(g.stream));
    return !bad;
}

// --- transformer pieces -----------------------------------------------------------------------------

// embed: one block of ROW_BLOCK threads per row (grid n), threads over the dim columns.
__global__ void __launch_bounds__(ROW_BLOCK) k_embed(float *out, const float *table, const int *tok, int dim) {
    size_t i = blockIdx.x;
    const float *src = table + (size_t)tok[i] * dim;
    float *dst = out + i * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

// scatter_rows: one block of ROW_BLOCK threads per row (grid n), threads over the row's columns;
// any row length (a block loops), n up to 2^31 - 1. The offsets are uploaded with the call.
__global__ void __launch_bounds__(ROW_BLOCK) k_scatter_rows(float *dst, const size_t *off, const float *src,
                                                            int row_len) {
    size_t r = blockIdx.x;
    float *d = dst + off[r];
    const float *x = src + r * (size_t)row_len;
    for (int j = threadIdx.x; j < row_len; j += blockDim.x) d[j] = x[j];
}

static void cuda_scatter_rows(float *dst, const size_t *off, const float *src, int n, int row_len) {
    if (n <= 0 || row_len <= 0) return;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_off = up.put(off, sizeof(size_t) * (size_t)n);
    unsigned char *d = up.commit();
    LAUNCH(k_scatter_rows, (unsigned)n, ROW_BLOCK, dst, at<size_t>(d, o_off), src, row_len);
}

static void check_tokens(const char *op, const int32_t *tok, int n) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0) die_size(op, "token %d at row %d is negative", (int)tok[i], i);
}

static void cuda_embed(float *out, const float *table, const int32_t *tokens, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    check_tokens("embed", tokens, n);
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_tok = up.put(tokens, sizeof(int32_t) * n);
    unsigned char *d = up.commit();
    LAUNCH(k_embed, (unsigned)n, ROW_BLOCK, out, table, at<int>(d, o_tok), dim);
}

// embed_bwd: the rows are grouped by token on the host (rows of a group in increasing order), one
// block of ROW_BLOCK threads per distinct token (grid = number of distinct tokens), threads over
// dim; each thread adds its column of the group's rows in row order, exactly the CPU's order, so
// repeated tokens need no atomics.
__global__ void __launch_bounds__(ROW_BLOCK) k_embed_bwd(float *dtable, const float *dout, const int *rows,
                                                         const int *gtok, const int *goff, int dim) {
    int gi = blockIdx.x;
    float *d = dtable + (size_t)gtok[gi] * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float acc = d[j];
        for (int k = goff[gi]; k < goff[gi + 1]; k++) acc += dout[(size_t)rows[k] * dim + j];
        d[j] = acc;
    }
}

static void cuda_embed_bwd(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    check_tokens("embed_bwd", tokens, n);
    std::vector<int> rows(n);
    for (int i = 0; i < n; i++) rows[i] = i;
    std::stable_sort(rows.begin(), rows.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
    std::vector<int> gtok, goff;
    for (int k = 0; k < n; k++) {
        if (k == 0 || tokens[rows[k]] != tokens[rows[k - 1]]) {
            gtok.push_back(tokens[rows[k]]);
            goff.push_back(k);
        }
    }
    goff.push_back(n);
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_rows = up.put(rows), o_gtok = up.put(gtok), o_goff = up.put(goff);
    unsigned char *d = up.commit();
    LAUNCH(k_embed_bwd, (unsigned)gtok.size(), ROW_BLOCK, dtable, dout, at<int>(d, o_rows), at<int>(d, o_gtok),
           at<int>(d, o_goff), dim);
}

// rmsnorm: one block of ROW_BLOCK threads per row (grid n), any dim. out may alias x (every x of
// the row is read before the first write, behind block_sum's barrier).
__global__ void __launch_bounds__(ROW_BLOCK) k_rmsnorm(float *out, float *rstd, const float *x, const float *w,
                                                       int dim, float eps) {
    __shared__ float sm[32];
    size_t i = blockIdx.x;
    const float *xi = x + i * dim;
    float *oi = out + i * dim;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xi[j] * xi[j];
    ss = block_sum(ss, sm);
    float r = 1.0f / sqrtf(ss / dim + eps);
    if (rstd && threadIdx.x == 0) rstd[i] = r;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = xi[j] * r * w[j];
}

static void cuda_rmsnorm(float *out, float *rstd, const float *x, const float *w, int n, int dim, float eps) {
    if (n <= 0 || dim <= 0) return;
    ensure_init();
    LAUNCH(k_rmsnorm, (unsigned)n, ROW_BLOCK, out, rstd, x, w, dim, eps);
}

// rmsnorm_bwd, dx: one block of ROW_BLOCK threads per row (grid n), any dim:
//   dx += r * (dy*w) - x * r^3 / dim * sum(dy*w*x)
__global__ void __launch_bounds__(ROW_BLOCK) k_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x,
                                                              const float *w, const float *rstd, int dim) {
    __shared__ float sm[32];
    size_t i = blockIdx.x;
    const float *xi = x + i * dim, *gi = dout + i * dim;
    float *di = dx + i * dim;
    float r = rstd[i];
    float gwx = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) gwx += gi[j] * w[j] * xi[j];
    gwx = block_sum(gwx, sm);
    float c = gwx * r * r * r / dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) di[j] += r * gi[j] * w[j] - c * xi[j];
}

// Column sums, dw[j] += sum_i dy[i,j] * x[i,j] * rstd[i] (x, rstd NULL: dw[j] += sum_i dy[i,j]):
// one thread per column (ROW_BLOCK threads, ceil(dim / ROW_BLOCK) blocks), rows added in order,
// as in the CPU backend. Any n and dim. (Simple rather than fast: the parallelism is dim.)
__global__ void __launch_bounds__(ROW_BLOCK) k_colsum(float *dw, const float *dy, const float *x, const float *rstd,
                                                      int n, int dim) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    float acc = dw[j];
    if (x) {
        for (int i = 0; i < n; i++) acc += dy[(size_t)i * dim + j] * x[(size_t)i * dim + j] * rstd[i];
    } else {
        for (int i = 0; i < n; i++) acc += dy[(size_t)i * dim + j];
    }
    dw[j] = acc;
}

static unsigned col_grid(int dim) { return (unsigned)((dim + ROW_BLOCK - 1) / ROW_BLOCK); }

static void cuda_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                             const float *rstd, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    ensure_init();
    LAUNCH(k_rmsnorm_bwd_dx, (unsigned)n, ROW_BLOCK, dx, dout, x, w, rstd, dim);
    if (dw) LAUNCH(k_colsum, col_grid(dim), ROW_BLOCK, dw, dout, x, rstd, n, dim);
}

// add_bias: element-wise over n*dim (EW_BLOCK threads, ew_grid(n*dim) blocks, grid-stride); any sizes.
__global__ void k_add_bias(float *x, const float *b, size_t total, int dim) {
    GRID_STRIDE(e, total) x[e] += b[e % (size_t)dim];
}

static void cuda_add_bias(float *x, const float *b, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    ensure_init();
    size_t total = (size_t)n * dim;
    LAUNCH(k_add_bias, ew_grid(total), EW_BLOCK, x, b, total, dim);
}

static void cuda_bias_bwd(float *db, const float *dy, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    ensure_init();
    LAUNCH(k_colsum, col_grid(dim), ROW_BLOCK, db, dy, (const float *)nullptr, (const float *)nullptr, n, dim);
}

// rope: element-wise over the n * n_heads * (head_dim/2) pairs (EW_BLOCK threads, grid-stride);
// each thread rotates one (j, j + half) pair in place. Odd head_dim: the last dimension is left
// alone, as in the CPU backend. Any sizes; pos must be >= 0 (checked on the host) and < the
// tables' max_pos (the caller's contract, as on the CPU).
__global__ void k_rope(float *x, const int *pos, size_t total, int n_heads, int head_dim, int half,
                       const float *cos_t, const float *sin_t, float sgn) {
    GRID_STRIDE(e, total) {
        int j = (int)(e % half);
        size_t rest = e / half;
        size_t h = rest % n_heads, i = rest / n_heads;
        size_t p = (size_t)pos[i] * half + j;
        float c = cos_t[p], sj = sgn * sin_t[p];
        float *v = x + (i * n_heads + h) * head_dim;
        float a = v[j], b = v[j + half];
        v[j] = a * c - b * sj;
        v[j + half] = b * c + a * sj;
    }
}

static void cuda_rope(float *x, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
                      const float *sin_t, bool inverse) {
    int half = head_dim / 2;
    if (n <= 0 || n_heads <= 0 || half <= 0) return;
    for (int i = 0; i < n; i++)
        if (pos[i] < 0) die_size("rope", "pos[%d] = %d is negative", i, (int)pos[i]);
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_pos = up.put(pos, sizeof(int32_t) * n);
    unsigned char *d = up.commit();
    size_t total = (size_t)n * n_heads * half;
    LAUNCH(k_rope, ew_grid(total), EW_BLOCK, x, at<int>(d, o_pos), total, n_heads, head_dim, half, cos_t, sin_t,
           inverse ? -1.0f : 1.0f);
}

// glu, glu_bwd: element-wise, EW_BLOCK threads, ew_grid(n) blocks, grid-stride; any n. The
// activations are the CPU backend's expressions (kernels.h kern_act_t), with CUDA's expf, erff
// and tanhf (a few ulp each).
#define GELU_ALPHA 0.70710678118654752440f    // 1/sqrt(2)
#define GELU_BETA 0.39894228040143267794f     // 1/sqrt(2 pi)
#define GELU_TANH_BETA 0.79788456080286535588f   // sqrt(2/pi)
#define GELU_TANH_KAPPA 0.044715f

__device__ __forceinline__ float act_fwd(float x, int act) {
    if (act == KERN_ACT_GELU) return x * 0.5f * (1.0f + erff(x * GELU_ALPHA));
    if (act == KERN_ACT_GELU_TANH) {
        float inner = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * (x * x * x));
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    return x / (1.0f + expf(-x));
}

__global__ void k_glu(float *h, const float *gg, const float *u, size_t n, int act) {
    GRID_STRIDE(i, n) h[i] = act_fwd(gg[i], act) * u[i];
}

__global__ void k_glu_bwd(float *dg, float *du, const float *dh, const float *gg, const float *u, size_t n, int act) {
    GRID_STRIDE(i, n) {
        float x = gg[i], d = dh[i];
        if (act == KERN_ACT_GELU) {
            float cdf = 0.5f * (1.0f + erff(x * GELU_ALPHA)), pdf = GELU_BETA * expf(x * x * -0.5f);
            du[i] = d * (x * cdf);
            dg[i] = d * u[i] * (cdf + x * pdf);
        } else if (act == KERN_ACT_GELU_TANH) {
            float x2 = x * x;
            float z = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * (x2 * x)), t = tanhf(z), c = coshf(z);
            float sech2 = 1.0f / (c * c);   // 1 - t^2 without cancellation near t = +-1, as on the CPU
            du[i] = d * (0.5f * x * (1.0f + t));
            float dact = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_TANH_BETA * (1.0f + 3.0f * GELU_TANH_KAPPA * x2);
            dg[i] = d * u[i] * dact;
        } else {
            float s = 1.0f / (1.0f + expf(-x));
            float sg = x * s;
            du[i] = d * sg;
            dg[i] = d * u[i] * (s + sg * (1.0f - s));
        }
    }
}

static void check_act(const char *op, kern_act_t act) {
    if ((unsigned)act > KERN_ACT_GELU_TANH) die_size(op, "unknown activation %d", (int)act);
}

static void cuda_glu(float *h, const float *gg, const float *u, size_t n, kern_act_t act) {
    check_act("glu", act);
    if (!n) return;
    ensure_init();
    LAUNCH(k_glu, ew_grid(n), EW_BLOCK, h, gg, u, n, (int)act);
}

static void cuda_glu_bwd(float *dg, float *du, const float *dh, const float *gg, const float *u, size_t n,
                         kern_act_t act) {
    check_act("glu_bwd", act);
    if (!n) return;
    ensure_init();
    LAUNCH(k_glu_bwd, ew_grid(n), EW_BLOCK, dg, du, dh, gg, u, n, (int)act);
}

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

// --- multi-LoRA (SGMV) ------------------------------------------------------------------------------
// One launch over all segments: the host lists the (segment, row) pairs of every segment, and
// block b handles pair b (segment index per block). Any number of segments, rows, ranks (a
// segment with rank 0 or no rows does nothing), in and out sizes; rank <= ldt is required.

struct lora_item_t {
    int seg, row;
};

// shrink: grid (rows of all segments), ATTN_THREADS (4 warps); warp w computes T[r, j] for
// j = w, w+4, ... < rank as a dot product of X[r] and A[j] over in (lanes stride, warp sum).
__global__ void __launch_bounds__(ATTN_THREADS) k_lora_shrink(float *T, int ldt, const float *X, int in,
                                                              const kern_lora_seg_t *segs, const lora_item_t *items) {
    lora_item_t it = items[blockIdx.x];
    const kern_lora_seg_t sg = segs[it.seg];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *xr = X + (size_t)it.row * in;
    for (int j = w; j < sg.rank; j += ATTN_WARPS) {
        const float *aj = sg.A + (size_t)j * in;
        float part = 0.0f;
        for (int d = lane; d < in; d += 32) part += xr[d] * aj[d];
        part = warp_sum(part);
        if (lane == 0) T[(size_t)it.row * ldt + j] = part;
    }
}

// expand: grid (rows of all segments), ROW_BLOCK threads over out: Y[r, o] += scale * sum_j T[r, j] B[j, o].
__global__ void __launch_bounds__(ROW_BLOCK) k_lora_expand(float *Y, int out, const float *T, int ldt,
                                                           const kern_lora_seg_t *segs, const lora_item_t *items) {
    lora_item_t it = items[blockIdx.x];
    const kern_lora_seg_t sg = segs[it.seg];
    const float *tr = T + (size_t)it.row * ldt;
    float *yr = Y + (size_t)it.row * out;
    for (int o = threadIdx.x; o < out; o += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < sg.rank; j++) acc += tr[j] * sg.B[(size_t)j * out + o];
        yr[o] += sg.scale * acc;
    }
}

// Validates the segments and lists their (segment, row) pairs (host only).
static std::vector<lora_item_t> lora_items(const char *op, int ldt, const kern_lora_seg_t *seg, int n_seg) {
    std::vector<lora_item_t> items;
    for (int s = 0; s < n_seg; s++) {
        const kern_lora_seg_t *sg = &seg[s];
        if (sg->n_rows <= 0 || sg->rank <= 0) continue;
        if (sg->row0 < 0) die_size(op, "segment %d: row0 %d is negative", s, sg->row0);
        if (sg->rank > ldt) die_size(op, "segment %d: rank %d > ldt %d", s, sg->rank, ldt);
        if (!sg->A || !sg->B) die_size(op, "segment %d: A or B is NULL", s);
        for (int r = 0; r < sg->n_rows; r++) items.push_back(lora_item_t{s, sg->row0 + r});
    }
    return items;
}

// Uploads the segments and the pair list. Caller holds g.mu.
static void lora_upload(const kern_lora_seg_t *seg, int n_seg, const std::vector<lora_item_t> &items,
                        const kern_lora_seg_t **dsegs, const lora_item_t **ditems) {
    upload_t up;
    size_t o_seg = up.put(seg, sizeof(kern_lora_seg_t) * n_seg), o_items = up.put(items);
    unsigned char *d = up.commit();
    *dsegs = at<const kern_lora_seg_t>(d, o_seg);
    *ditems = at<const lora_item_t>(d, o_items);
}

static void cuda_lora_shrink(float *T, int ldt, const float *X, int in, const kern_lora_seg_t *seg, int n_seg) {
    if (n_seg <= 0) return;
    std::vector<lora_item_t> items = lora_items("lora_shrink", ldt, seg, n_seg);
    if (items.empty()) return;
    if (in < 0) die_size("lora_shrink", "in %d < 0", in);   // in = 0: T = 0, as on the CPU
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    const kern_lora_seg_t *ds = nullptr;
    const lora_item_t *di = nullptr;
    lora_upload(seg, n_seg, items, &ds, &di);
    LAUNCH(k_lora_shrink, (unsigned)items.size(), ATTN_THREADS, T, ldt, X, in, ds, di);
}

static void cuda_lora_expand(float *Y, int out, const float *T, int ldt, const kern_lora_seg_t *seg, int n_seg) {
    if (n_seg <= 0 || out <= 0) return;
    std::vector<lora_item_t> items = lora_items("lora_expand", ldt, seg, n_seg);
    if (items.empty()) return;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    const kern_lora_seg_t *ds = nullptr;
    const lora_item_t *di = nullptr;
    lora_upload(seg, n_seg, items, &ds, &di);
    LAUNCH(k_lora_expand, (unsigned)items.size(), ROW_BLOCK, Y, out, T, ldt, ds, di);
}

// --- losses ------------------------------------------------------------------------------------------
// One block of ROW_BLOCK threads per row (grid n), any V. The scaled logit z*invT - mx is formed
// with explicitly rounded operations (__fmul_rn, __fsub_rn: never fused into an FMA) so that it
// is the same float as on the CPU; the sums are in double, as there.

static void check_targets(const char *op, const int32_t *target, int n, int V) {
    for (int r = 0; r < n; r++)
        if (target[r] < 0 || target[r] >= V) die_size(op, "target[%d] = %d outside 0..%d", r, (int)target[r], V - 1);
}

// token_logprobs: grid n (one block of ROW_BLOCK threads per row), any V; thread 0 writes logp[r]
// and entropy[r].
__global__ void __launch_bounds__(ROW_BLOCK) k_token_logprobs(float *logp, float *entropy, const float *logits,
                                                              const int *target, int V, float invT) {
    __shared__ float smf[32];
    __shared__ double smd[32];
    size_t r = blockIdx.x;
    const float *z = logits + r * V;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, __fmul_rn(z[j], invT));
    mx = block_max(mx, smf);
    double sum = 0.0, sz = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        double dz = (double)__fsub_rn(__fmul_rn(z[j], invT), mx);
        double e = exp(dz);
        sum = __dadd_rn(sum, e);
        sz = __dadd_rn(sz, __dmul_rn(e, dz));
    }
    sum = block_sum(sum, smd);
    sz = block_sum(sz, smd);
    if (threadIdx.x == 0) {
        double lse = (double)mx + log(sum);
        logp[r] = (float)((double)__fmul_rn(z[target[r]], invT) - lse);
        if (entropy) entropy[r] = (float)(log(sum) - sz / sum);
    }
}

static void cuda_token_logprobs(float *logp, float *entropy, const float *logits, const int32_t *target, int n,
                                int V, float T) {
    if (n <= 0) return;
    if (V <= 0) die_size("token_logprobs", "V %d < 1", V);
    check_targets("token_logprobs", target, n, V);
    if (T <= 0.0f) T = 1.0f;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_t = up.put(target, sizeof(int32_t) * n);
    unsigned char *d = up.commit();
    LAUNCH(k_token_logprobs, (unsigned)n, ROW_BLOCK, logp, entropy, logits, at<int>(d, o_t), V, 1.0f / T);
}

// logprob_bwd: grid n (one block of ROW_BLOCK threads per row), any V. In place: every read of
// the row (max, sum) happens before block_sum's final barrier, the writes after it; the target's
// += after a further barrier, by thread 0.
__global__ void __launch_bounds__(ROW_BLOCK) k_logprob_bwd(float *logits, const float *dlogp, const int *target,
                                                           int V, float invT) {
    __shared__ float smf[32];
    __shared__ double smd[32];
    size_t r = blockIdx.x;
    float *z = logits + r * V;
    float gr = dlogp[r];   // the same value for the whole block: uniform branch
    if (gr == 0.0f) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) z[j] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, __fmul_rn(z[j], invT));
    mx = block_max(mx, smf);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum = __dadd_rn(sum, exp((double)__fsub_rn(__fmul_rn(z[j], invT), mx)));
    sum = block_sum(sum, smd);
    float inv = (float)(1.0 / sum);
    float ng = __fmul_rn(-gr, invT);
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        z[j] = __fmul_rn(__fmul_rn(ng, expf(__fsub_rn(__fmul_rn(z[j], invT), mx))), inv);
    __syncthreads();
    if (threadIdx.x == 0) z[target[r]] = __fadd_rn(z[target[r]], __fmul_rn(gr, invT));
}

static void cuda_logprob_bwd(float *logits, const float *dlogp, const int32_t *target, int n, int V, float T) {
    if (n <= 0) return;
    if (V <= 0) die_size("logprob_bwd", "V %d < 1", V);
    check_targets("logprob_bwd", target, n, V);
    if (T <= 0.0f) T = 1.0f;
    ensure_init();
    std::lock_guard<std::mutex> lk(g.mu);
    upload_t up;
    size_t o_t = up.put(target, sizeof(int32_t) * n);
    unsigned char *d = up.commit();
    LAUNCH(k_logprob_bwd, (unsigned)n, ROW_BLOCK, logits, dlogp, at<int>(d, o_t), V, 1.0f / T);
}

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

// --- optimizer -----------------------------------------------------------------------------------------

// adamw: element-wise, EW_BLOCK threads, ew_grid(n) blocks, grid-stride; any n.
__global__ void k_adamw(float *p, const float *gr, float *m, float *v, size_t n, float lr, float b1, float b2,
                        float eps, float wd, float bc1, float bc2, float gscale) {
    GRID_STRIDE(i, n) {
        float gi = gr[i] * gscale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

static void cuda_adamw(float *p, const float *gr, float *m, float *v, size_t n, float lr, float b1, float b2,
                       float eps, float wd, float bc1, float bc2, float gscale) {
    if (!n) return;
    ensure_init();
    LAUNCH(k_adamw, ew_grid(n), EW_BLOCK, p, gr, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gscale);
}

// --- table and availability -----------------------------------------------------------------------------

// Filled field by field (designated initialisers are C++20; nvcc builds C++17 here).
static kernels_t make_table(void) {
    kernels_t k;
    memset(&k, 0, sizeof k);
    k.name = "cuda";
    k.alloc = cuda_alloc;
    k.free = cuda_free;
    k.to_dev = cuda_to_dev;
    k.to_host = cuda_to_host;
    k.copy = cuda_copy;
    k.zero = cuda_zero;
    k.gemm = cuda_gemm;
    k.gemm_bf16w = cuda_gemm_bf16w;
    k.to_bf16 = cuda_to_bf16;
    k.from_bf16 = cuda_from_bf16;
    k.axpy = cuda_axpy;
    k.scale = cuda_scale;
    k.sumsq = cuda_sumsq;
    k.all_finite = cuda_all_finite;
    k.scatter_rows = cuda_scatter_rows;
    k.embed = cuda_embed;
    k.embed_bwd = cuda_embed_bwd;
    k.rmsnorm = cuda_rmsnorm;
    k.rmsnorm_bwd = cuda_rmsnorm_bwd;
    k.add_bias = cuda_add_bias;
    k.bias_bwd = cuda_bias_bwd;
    k.rope = cuda_rope;
    k.glu = cuda_glu;
    k.glu_bwd = cuda_glu_bwd;
    k.attn_paged = cuda_attn_paged;
    k.attn_fwd = cuda_attn_fwd;
    k.attn_bwd = cuda_attn_bwd;
    k.lora_shrink = cuda_lora_shrink;
    k.lora_expand = cuda_lora_expand;
    k.token_logprobs = cuda_token_logprobs;
    k.logprob_bwd = cuda_logprob_bwd;
    k.sample = cuda_sample;
    k.adamw = cuda_adamw;
    return k;
}

extern "C" const kernels_t *kernels_cuda(void) {
    static const kernels_t table = make_table();   // initialised once, thread-safe (C++11)
    return &table;
}

// A trivial kernel whose attributes tell whether this build has an image for the device.
__global__ void k_probe(int *x) {
    if (x) *x = 0;
}

extern "C" int kernels_cuda_available(char *why, size_t n) {
    char tmp[8];
    if (!why || n == 0) {
        why = tmp;
        n = sizeof tmp;
    }
    why[0] = '\0';
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, n, "no CUDA device visible (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 0;
    }
    if (count < 1) {
        snprintf(why, n, "no CUDA device visible (cudaGetDeviceCount: 0 devices)");
        return 0;
    }
    int dev = 0;
    e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        snprintf(why, n, "no usable CUDA device (cudaGetDevice: %s)", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 0;
    }
    cudaFuncAttributes fa;
    e = cudaFuncGetAttributes(&fa, k_probe);
    if (e != cudaSuccess) {
        int major = 0, minor = 0;
        (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        snprintf(why, n, "CUDA device %d (compute capability %d.%d) is not usable with this build (sm_80, sm_90): %s",
                 dev, major, minor, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 0;
    }
    return 1;
}

extern "C" int kernels_cuda_devices(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

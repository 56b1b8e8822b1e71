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
// One translation unit in three files: this one (state, helpers, memory, dense and element-wise
// ops, transformer pieces, multi-LoRA, losses, the optimiser, the ops table), attention.cuh and
// sampling.cuh, included where their sections stood, so that the kernels share the backend's
// state and helpers without separate device linking.
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

// --- attention: attention.cuh ---------------------------------------------------------------------
#include "kernels/cuda/attention.cuh"

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

// --- sampling: sampling.cuh -----------------------------------------------------------------------
#include "kernels/cuda/sampling.cuh"

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

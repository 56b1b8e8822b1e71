// emu_rt.h - a CPU emulation of the part of the CUDA runtime and cuBLAS that kernels/cuda/cuda.cu
// uses, so that the GPU tests can run on a machine without a GPU (tests/gpu/emu/run.sh).
//
// Every CUDA thread of a block is a fiber (ucontext) on one OS thread; blocks run one after the
// other; __syncthreads, __syncthreads_or and __shfl_xor_sync are barriers of the block's or the
// warp's fibers (a barrier reached by some threads only, or by threads of a warp at different
// shuffles, is reported as a deadlock). __shared__ variables are static: shared by the threads of
// the block that is running. Device memory is malloc'd, tracked (memcpy directions are checked)
// and filled with 0xff (NaN) by cudaMalloc. cuBLAS SGEMM is a plain column-major loop.
//
// What it checks: the kernels' indexing and semantics against the CPU backend, uniform use of
// barriers and shuffles, out-of-bounds accesses (with the ASan build), that every pointer
// argument of a kernel launch and of SGEMM is device memory (a host buffer handed to a kernel
// aborts with the kernel's name). What it cannot check: the memory model (races between threads
// that a real GPU would expose), performance, real CUDA or cuBLAS behaviour. It is a development
// aid, not a substitute for tests/gpu/run.sh on a GPU.
//
// STRICT HOST/DEVICE SEPARATION (emu_rt.cc compiled with -DEMU_STRICT=1): device memory then lives
// in one mmap'ed arena (EMU_ARENA_GB GiB of address space, default 16, reserved without backing)
// carved by a first-fit allocator (free ranges coalesced, 256-byte alignment). The arena is
// PROT_NONE except while an emulated kernel launch, SGEMM, memcpy, memset, cudaMalloc or cudaFree
// runs (they open it read-write for their duration), so any direct host dereference of device
// memory (host code reading a weight, a logits row, a gradient) dies with SIGSEGV; a SIGSEGV
// handler first prints "EMU strict: the host touched emulated DEVICE memory at ..." with the
// allocation it falls in and a backtrace (link with -rdynamic for function names). Freed device
// memory is filled with 0xfe bytes, so a kernel reading it after a free sees garbage. Launches
// must come from one thread at a time in this mode (the protection is process-wide).
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct int2 {
    int x, y;
};
static inline int2 make_int2(int x, int y) { return int2{x, y}; }

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

// --- runtime ---------------------------------------------------------------------------------------
typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 } cudaError_t;
typedef enum {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
} cudaMemcpyKind;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct {
    int unused;
} cudaFuncAttributes;
typedef enum { cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor } cudaDeviceAttr;
#define cudaEventDisableTiming 2u
#define cudaHostAllocDefault 0u

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
template <class T> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, T *) {
    a->unused = 0;
    return cudaSuccess;
}

// --- cuBLAS ------------------------------------------------------------------------------------------
typedef struct emu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH } cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST } cublasPointerMode_t;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m);
const char *cublasGetStatusString(cublasStatus_t s);
typedef enum { CUDA_R_32F, CUDA_R_16BF } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT } cublasGemmAlgo_t;
// Only what gemm_bf16w uses: A and B bf16 (A, the weight, read transposed or as is; B as is), C
// fp32, fp32 compute (products of bf16 values are exact in fp32; accumulated in fp32 in k order).
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t ctype, cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc);

// --- device intrinsics ------------------------------------------------------------------------------
void emu_syncthreads(void);
int emu_syncthreads_or(int v);
double emu_shfl_xor(double v, int lane_mask);
static inline void __syncthreads(void) { emu_syncthreads(); }
static inline int __syncthreads_or(int v) { return emu_syncthreads_or(v); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m) { return (T)emu_shfl_xor((double)v, m); }
// The _rn intrinsics are never fused into an FMA on the GPU: volatile keeps the host compiler
// from contracting them too.
static inline float __fmul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}
static inline float __fadd_rn(float a, float b) {
    volatile float r = a + b;
    return r;
}
static inline float __fsub_rn(float a, float b) {
    volatile float r = a - b;
    return r;
}
static inline double __dadd_rn(double a, double b) {
    volatile double r = a + b;
    return r;
}
static inline double __dmul_rn(double a, double b) {
    volatile double r = a * b;
    return r;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// kernel<<<grid, block, 0, stream>>>(args) becomes
//   emu_launch_args(grid, block, [&] { kernel(args); }, "kernel", args)
// which checks that every pointer argument is NULL or device memory, then runs emu_launch.
void emu_launch(dim3 grid, dim3 block, std::function<void()> body);
bool emu_is_dev(const void *p);
[[noreturn]] void emu_fail_arg(const char *kernel, int index, const void *p);
template <class T> static inline void emu_check_arg(const char *, int, const T &) {}
template <class T> static inline void emu_check_arg(const char *kernel, int index, T *const &p) {
    if (p && !emu_is_dev((const void *)p)) emu_fail_arg(kernel, index, (const void *)p);
}
template <class... A>
static inline void emu_launch_args(dim3 grid, dim3 block, std::function<void()> body, const char *kernel,
                                   const A &...args) {
    int i = 0;
    (emu_check_arg(kernel, i++, args), ...);
    emu_launch(grid, block, std::move(body));
}

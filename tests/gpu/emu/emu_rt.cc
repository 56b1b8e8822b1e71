// emu_rt.cc - the CPU emulation of the CUDA runtime and cuBLAS declared in emu_rt.h.
#include "emu_rt.h"

#include <ucontext.h>

#include <map>
#include <vector>

#ifdef EMU_STRICT
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

[[noreturn]] static void fail(const char *what) {
    fprintf(stderr, "EMU: %s\n", what);
    fflush(stderr);
    abort();
}

// --- memory: device allocations tracked, filled with 0xff (NaN) ---------------------------------------

static std::map<uintptr_t, size_t> allocs;

static bool is_dev(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}

bool emu_is_dev(const void *p) { return is_dev(p, 1); }

void emu_fail_arg(const char *kernel, int index, const void *p) {
    char msg[256];
    snprintf(msg, sizeof msg, "launch of %s: pointer argument %d (%p) is not device memory", kernel, index, p);
    fail(msg);
}

#ifdef EMU_STRICT
// --- strict host/device separation (see emu_rt.h) ------------------------------------------------------
// One arena of address space; device memory is readable only inside an open scope (dev_scope),
// which every emulated operation on device memory holds for its duration.

static char *arena;
static size_t arena_cap;                        // bytes reserved
static size_t arena_top;                        // bump pointer (bytes used from the start)
static size_t arena_prot;                       // page-rounded prefix whose protection is toggled
static std::map<size_t, size_t> free_ranges;    // offset -> bytes, coalesced, below arena_top
static int open_depth;
static struct sigaction old_segv;
static const size_t ALIGN = 256;

static void set_prot(size_t from, size_t to, int prot) {
    if (to > from && mprotect(arena + from, to - from, prot) != 0) fail("mprotect of the device arena failed");
}

static void on_segv(int sig, siginfo_t *si, void *uctx) {
    (void)sig, (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr, base = (uintptr_t)arena;
    if (arena && a >= base && a < base + arena_cap) {
        char buf[512];
        uintptr_t ab = 0;
        size_t an = 0;
        auto it = allocs.upper_bound(a);
        if (it != allocs.begin()) {
            --it;
            if (a < it->first + it->second) ab = it->first, an = it->second;
        }
        int n = ab ? snprintf(buf, sizeof buf,
                              "EMU strict: the host touched emulated DEVICE memory at %p (byte %zu of the %zu-byte "
                              "cudaMalloc block at %p) outside any kernel, SGEMM or memcpy: host code must go "
                              "through the backend's to_host / to_dev / copy. Backtrace:\n",
                              (void *)a, (size_t)(a - ab), an, (void *)ab)
                   : snprintf(buf, sizeof buf,
                              "EMU strict: the host touched emulated DEVICE memory at %p (not inside a live "
                              "allocation: freed or never allocated) outside any kernel, SGEMM or memcpy. "
                              "Backtrace:\n",
                              (void *)a);
        if (n < 0) n = 0;
        if ((size_t)n >= sizeof buf) n = (int)sizeof buf - 1;
        ssize_t w = write(2, buf, (size_t)n);
        (void)w;
        void *bt[64];
        int k = backtrace(bt, 64);
        backtrace_symbols_fd(bt, k, 2);
    }
    // Back to the previous disposition: returning re-runs the faulting access, which now takes it
    // (the default: the process dies of SIGSEGV, which the test runner reports as a crash).
    sigaction(SIGSEGV, &old_segv, nullptr);
}

static void arena_init(void) {
    if (arena) return;
    const char *e = getenv("EMU_ARENA_GB");
    size_t gb = e && atol(e) > 0 ? (size_t)atol(e) : 16;
    arena_cap = gb << 30;
    void *p = mmap(nullptr, arena_cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("mmap of the device arena failed (set EMU_ARENA_GB lower)");
    arena = (char *)p;
    void *bt[2];
    backtrace(bt, 2);   // loads libgcc now, not inside the signal handler
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
}

struct dev_scope {
    dev_scope() {
        if (open_depth++ == 0) set_prot(0, arena_prot, PROT_READ | PROT_WRITE);
    }
    ~dev_scope() {
        if (--open_depth == 0) set_prot(0, arena_prot, PROT_NONE);
    }
};

static void *arena_alloc(size_t n) {
    arena_init();
    n = (n + ALIGN - 1) & ~(ALIGN - 1);
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it)
        if (it->second >= n) {   // first fit
            size_t off = it->first, left = it->second - n;
            free_ranges.erase(it);
            if (left) free_ranges[off + n] = left;
            return arena + off;
        }
    if (arena_top + n > arena_cap) fail("out of emulated device memory (raise EMU_ARENA_GB)");
    size_t off = arena_top;
    arena_top += n;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), prot = (arena_top + page - 1) & ~(page - 1);
    if (prot > arena_prot) {
        if (open_depth > 0) set_prot(arena_prot, prot, PROT_READ | PROT_WRITE);
        arena_prot = prot;
    }
    return arena + off;
}

static void arena_free(void *p, size_t n) {
    size_t off = (size_t)((char *)p - arena);
    n = (n + ALIGN - 1) & ~(ALIGN - 1);
    auto next = free_ranges.lower_bound(off);
    if (next != free_ranges.end() && off + n == next->first) {   // merge with the following range
        n += next->second;
        next = free_ranges.erase(next);
    }
    if (next != free_ranges.begin()) {                           // merge with the preceding range
        auto prev = std::prev(next);
        if (prev->first + prev->second == off) {
            prev->second += n;
            return;
        }
    }
    free_ranges[off] = n;
}
#else
struct dev_scope {
    dev_scope() {}   // user-provided: no unused-variable warning where it is declared
};
#endif

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
    *v = 9;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = (cudaStream_t)0x1;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = (cudaEvent_t)0x2;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t n) {
    if (n == 0) fail("cudaMalloc of 0 bytes");
#ifdef EMU_STRICT
    *p = arena_alloc(n);
#else
    *p = malloc(n);
    if (!*p) fail("out of memory");
#endif
    dev_scope open;
    memset(*p, 0xff, n);
    allocs[(uintptr_t)*p] = n;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) fail("cudaFree of a pointer cudaMalloc did not return");
#ifdef EMU_STRICT
    {
        dev_scope open;
        memset(p, 0xfe, it->second);
    }
    arena_free(p, it->second);
#else
    free(p);
#endif
    allocs.erase(it);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) {
    *p = malloc(n);
    if (!*p) fail("out of memory");
    memset(*p, 0xee, n);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
    bool dd = is_dev(dst, n), sd = is_dev(src, n);
    if (kind == cudaMemcpyHostToDevice && (!dd || sd)) fail("host-to-device copy between the wrong kinds of memory");
    if (kind == cudaMemcpyDeviceToHost && (dd || !sd)) fail("device-to-host copy between the wrong kinds of memory");
    if (kind == cudaMemcpyDeviceToDevice && (!dd || !sd)) fail("device-to-device copy of non-device memory");
    dev_scope open;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    if (!is_dev(p, n)) fail("memset of non-device memory");
    dev_scope open;
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated error" : "no error"; }

// --- cuBLAS --------------------------------------------------------------------------------------------

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = (cublasHandle_t)0x1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) { return s ? "CUBLAS_STATUS_INVALID_VALUE" : "success"; }

// Column-major SGEMM with cuBLAS's argument checks (leading dimensions at least the rows).
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!is_dev(C, sizeof(float))) fail("cublasSgemm: C is not device memory");
    if (k > 0 && (!is_dev(A, sizeof(float)) || !is_dev(B, sizeof(float))))
        fail("cublasSgemm: A or B is not device memory");
    dev_scope open;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda];
                float b = tb == CUBLAS_OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb];
                s += a * b;
            }
            float *c = &C[i + (size_t)j * ldc];
            *c = *beta == 0.0f ? *alpha * s : *alpha * s + *beta * *c;
        }
    return CUBLAS_STATUS_SUCCESS;
}

static float emu_bf16(const void *p, size_t i) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t, cublasGemmAlgo_t) {
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F) fail("cublasGemmEx: unemulated types");
    if (!is_dev(C, sizeof(float)) || !is_dev(A, 2) || !is_dev(B, 2))
        fail("cublasGemmEx: A, B or C is not device memory");
    float al = *(const float *)alpha, be = *(const float *)beta;
    float *Cf = (float *)C;
    dev_scope open;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                float a = emu_bf16(A, ta == CUBLAS_OP_N ? i + (size_t)p * lda : p + (size_t)i * lda);
                float b = emu_bf16(B, tb == CUBLAS_OP_N ? p + (size_t)j * ldb : j + (size_t)p * ldb);
                s += a * b;
            }
            float *c = &Cf[i + (size_t)j * ldc];
            *c = be == 0.0f ? al * s : al * s + be * *c;
        }
    return CUBLAS_STATUS_SUCCESS;
}

// --- fibers -----------------------------------------------------------------------------------------------

enum { RUN, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

struct fiber_t {
    ucontext_t ctx;
    int state;
    char *stack;
};

#define FIBER_STACK (256 * 1024)
static std::vector<fiber_t> fibers;
static ucontext_t scheduler;
static int cur;
static std::function<void()> *body;
static double shfl_in[1024], shfl_out[1024];
static int or_acc, or_res;

static void fiber_main(void) {
    (*body)();
    fibers[cur].state = DONE;
    swapcontext(&fibers[cur].ctx, &scheduler);
}

static void yield_as(int state) {
    fibers[cur].state = state;
    swapcontext(&fibers[cur].ctx, &scheduler);
}

void emu_syncthreads(void) { yield_as(AT_BLOCK_BARRIER); }

int emu_syncthreads_or(int v) {
    or_acc |= v != 0;
    yield_as(AT_BLOCK_BARRIER);
    return or_res;
}

// All 32 lanes of the warp must arrive; lane l then gets lane (l ^ m)'s value.
double emu_shfl_xor(double v, int m) {
    int t = cur;
    shfl_in[t] = v;
    yield_as(AT_WARP_BARRIER);
    return shfl_out[(t & ~31) | ((t & 31) ^ m)];
}

static void run_block(int nt, std::function<void()> &f) {
    if ((int)fibers.size() < nt) {
        size_t old = fibers.size();
        fibers.resize(nt);
        for (size_t i = old; i < fibers.size(); i++) fibers[i].stack = (char *)malloc(FIBER_STACK);
    }
    body = &f;
    for (int i = 0; i < nt; i++) {
        getcontext(&fibers[i].ctx);
        fibers[i].ctx.uc_stack.ss_sp = fibers[i].stack;
        fibers[i].ctx.uc_stack.ss_size = FIBER_STACK;
        fibers[i].ctx.uc_link = &scheduler;
        makecontext(&fibers[i].ctx, fiber_main, 0);
        fibers[i].state = RUN;
    }
    or_acc = 0;
    for (;;) {
        bool ran = false;
        for (int i = 0; i < nt; i++)
            if (fibers[i].state == RUN) {   // runs until it finishes or reaches a barrier
                cur = i;
                threadIdx = dim3(i);
                swapcontext(&scheduler, &fibers[i].ctx);
                ran = true;
            }
        int done = 0, at_bar = 0;
        for (int i = 0; i < nt; i++) {
            done += fibers[i].state == DONE;
            at_bar += fibers[i].state == AT_BLOCK_BARRIER;
        }
        if (done == nt) return;
        bool released = false;
        for (int w = 0; w * 32 < nt; w++) {
            int at = 0;
            for (int l = 0; l < 32; l++) at += fibers[w * 32 + l].state == AT_WARP_BARRIER;
            if (at == 32) {
                for (int l = 0; l < 32; l++) {
                    shfl_out[w * 32 + l] = shfl_in[w * 32 + l];
                    fibers[w * 32 + l].state = RUN;
                }
                released = true;
            }
        }
        if (!released && at_bar > 0 && at_bar + done == nt) {
            if (done > 0) fail("__syncthreads reached after some threads of the block returned");
            or_res = or_acc;
            or_acc = 0;
            for (int i = 0; i < nt; i++) fibers[i].state = RUN;
            released = true;
        }
        if (!released && !ran)
            fail("deadlock: the threads of a block wait at different barriers (divergent __syncthreads or shuffle)");
    }
}

void emu_launch(dim3 grid, dim3 block, std::function<void()> f) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) fail("launch with an empty grid");
    if (grid.y > 65535 || grid.z > 65535) fail("grid y or z > 65535");
    if (block.y != 1 || block.z != 1) fail("the emulator runs 1-D blocks only");
    int nt = (int)block.x;
    if (nt < 32 || nt > 1024 || nt % 32) fail("block size not a multiple of 32 in 32..1024");
    blockDim = block;
    gridDim = grid;
    dev_scope open;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                run_block(nt, f);
            }
}

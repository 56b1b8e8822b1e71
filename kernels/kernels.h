// kernels.h - the compute backend interface: a table of function pointers.
//
// Every op works on backend memory (host memory for `cpu`, device memory for `cuda`) obtained
// from the table's alloc. Row-major everywhere; shapes are given in the comments as (rows, cols).
// The CPU backend (kernels/cpu) is the reference every other backend is tested against.
// This header knows nothing of the rest of the project: kernels use nothing of ours.
//
// Host and device memory (what a GPU backend such as `cuda` expects): every float tensor argument
// (and every bf16 tensor: gemm_bf16w's W, to_bf16, from_bf16) is backend memory from alloc; the
// small index and metadata arrays are HOST memory, since the engine builds them on the host every
// step: int32 tokens / targets / pos, the paged arguments' seq_of, pos, tables (the pointer array
// and every table), the packed arguments' start, len, pre_start, pre_len, the kern_lora_seg_t
// array itself (its A and B point to backend memory), and sample's per-row parameters
// (temperature, top_k, top_p, u). A GPU backend copies them to the device itself during the call;
// the caller may reuse them as soon as the call returns. sample's outputs (tokens, logprobs) are
// HOST arrays too, filled when the call returns. Details: kernels/cuda/cuda.h.
#ifndef MARLAAS_KERNELS_H
#define MARLAAS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Paged attention arguments for one batch step (inference path).
// Query token i belongs to sequence seq_of[i] and sits at position pos[i]; it attends to
// positions 0..pos[i] of that sequence, whose K/V rows live in the paged pool:
//   row(p) = k_base + tables[seq][p / block_size] * block_stride + (p % block_size) * kv_dim
typedef struct {
    const float *k_base, *v_base;   // pool base for this layer
    size_t block_stride;            // floats between consecutive blocks
    int block_size;
    const int *const *tables;       // (n_seqs) block tables
    const int *seq_of;              // (n_tokens)
    const int32_t *pos;             // (n_tokens)
    int n_tokens, n_heads, n_kv_heads, head_dim;
    int max_ctx;                    // max(pos) + 1 over the batch (scratch sizing)
} kern_paged_attn_t;

// Packed causal attention (training path): sequence s occupies rows start[s] .. start[s]+len[s]-1
// of q (N, H*hd), k and v (N, KV*hd); token t of a sequence attends to tokens 0..t of it.
//
// Shared prefixes (pre_start and pre_len both given; NULL = none): sequence s's queries first
// attend to the pre_len[s] K/V rows pre_start[s] .. pre_start[s]+pre_len[s]-1 (positions
// 0..pre_len[s]-1), then causally to its own rows; its own row t sits at position pre_len[s]+t.
// pre_len[s] = 0 means no prefix for s. Prefix rows may be rows of any sequence of the batch
// (usually the first rows of a sequence without a prefix), and many sequences may share them: the
// backward then sums their contributions into the prefix rows' dk/dv.
// Sizes: len[s] >= 1, pre_len[s] >= 0, every row index < n_tokens, any head_dim, n_heads a
// multiple of n_kv_heads. max_len is the longest context, max over s of pre_len[s] + len[s].
typedef struct {
    const int *start, *len;
    const int *pre_start, *pre_len;
    int n_seqs, n_tokens, n_heads, n_kv_heads, head_dim;
    int max_len;
} kern_packed_attn_t;

// One product of gemm_parts: C (M, N) = X W^T + beta C with an fp32 W or a bf16 W16 (N, K),
// exactly one of the two set; W and C contiguous.
typedef struct {
    const float *W;
    const uint16_t *W16;
    int N;
    float beta;
    float *C;
} kern_part_t;
#define KERN_PARTS_MAX 4

// One segment of a multi-LoRA (SGMV) product: rows row0 .. row0+n_rows-1 use adapter matrices
// A (rank, in) and B (rank, out) (lora_B transposed) with the given scale. A16 and B16, when not
// NULL, are the same matrices rounded to bf16 (backend memory): a backend may compute a segment
// from them instead (the CPU backend does for its segments of fewer than 8 rows, the decode
// steps of many adapters, where reading the adapters is the cost); the others ignore them.
typedef struct {
    int row0, n_rows, rank;
    const float *A, *B;
    float scale;
    const uint16_t *A16, *B16;
} kern_lora_seg_t;

// Gate activation of the gated MLP (glu, glu_bwd). Kernels know nothing of the model config; the
// engine maps hidden_act onto these.
//   SILU       g / (1 + exp(-g))
//   GELU       g * 0.5 * (1 + erf(g / sqrt(2)))                                  (exact)
//   GELU_TANH  0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))            (tanh approximation)
// (the expressions of PyTorch's kernels, in its order of operations)
typedef enum { KERN_ACT_SILU = 0, KERN_ACT_GELU = 1, KERN_ACT_GELU_TANH = 2 } kern_act_t;

typedef struct kernels {
    const char *name;

    // --- memory -------------------------------------------------------------------------
    void *(*alloc)(size_t bytes);                       // zero-filled; aborts on OOM
    void (*free)(void *p);
    void (*to_dev)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);   // device to device
    void (*zero)(void *p, size_t bytes);
    // Row scatter: dst + off[r] (in floats; off is a HOST array) receives src row r (row_len
    // floats, src (n, row_len) contiguous), for r < n. Destination rows must not overlap. One call
    // appends a step's K (or V) rows of a layer to the paged cache, instead of a copy per row.
    void (*scatter_rows)(float *dst, const size_t *off, const float *src, int n, int row_len);

    // --- dense ----------------------------------------------------------------------------
    // C (M,N) = alpha * op(A) op(B) + beta * C; op(A) is (M,K), op(B) is (K,N).
    void (*gemm)(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
    // bf16 weights, fp32 activations: with trans_w, C (M,N) = alpha * X W^T + beta * C, W (N,K)
    // with row stride ldw >= K (a forward Y = X W^T of a weight W (out, in)); without trans_w,
    // C (M,N) = alpha * X W + beta * C, W (K,N) with row stride ldw >= N (that weight's backward
    // dX = dY W). X (M,K) fp32 with row stride ldx >= K, C with row stride ldc >= N; W holds bf16
    // bit patterns (uint16_t, see to_bf16); fp32 accumulation. X, W, C are backend memory.
    // beta = 0 overwrites C (NaN in C is not propagated); K = 0 gives beta * C.
    // Precision: fp32 accumulation always. The CPU backend's avx512, avx2 and scalar variants
    // use X exactly. Its avx512-bf16 and amx variants round X to bf16 (nearest even) once per
    // call and multiply pairs with vdpbf16ps or AMX tiles (tdpbf16ps: the same arithmetic; exact
    // bf16 products, fp32 sums; bf16 subnormals of X or W count as zero, a sum below 2^-126
    // becomes zero) in every product but those without trans_w of up to 8 rows (which use X
    // exactly), as the cuda backend rounds X for every shape (kernels/cuda/cuda.h): relative to X
    // exact, each product moves by at most 2^-8 of |x w|.
    void (*gemm_bf16w)(bool trans_w, int M, int N, int K, float alpha, const float *X, int ldx, const uint16_t *W,
                       int ldw, float beta, float *C, int ldc);
    // Optional (NULL: the caller makes the separate calls). The products of one X (M, K),
    // contiguous, with n_parts <= KERN_PARTS_MAX matrices (the projections that share an input:
    // q, k, v; gate, up), each computed bit for bit as its own call computes it: gemm(false, true,
    // M, N, K, 1, X, K, W, K, beta, C, N) for an fp32 part, gemm_bf16w(true, M, N, K, 1, X, K, W16,
    // K, beta, C, N) for a bf16 one. The CPU backend runs the few-rows products (decode steps) of
    // all parts as one parallel loop: one hand-off between its threads instead of one per matrix.
    void (*gemm_parts)(int M, int K, const float *X, const kern_part_t *parts, int n_parts);
    // dst (n) = bf16(src): round to nearest, ties to even; overflow gives +-inf, NaN stays NaN
    // (quiet, sign and upper payload kept), subnormals rounded like normals (no flush to zero).
    void (*to_bf16)(uint16_t *dst, const float *src, size_t n);
    // dst (n) = the fp32 value of src (exact).
    void (*from_bf16)(float *dst, const uint16_t *src, size_t n);
    // y += alpha * x (n)
    void (*axpy)(size_t n, float alpha, const float *x, float *y);
    void (*scale)(size_t n, float alpha, float *x);
    // Sum of squares in double (grad-norm).
    double (*sumsq)(size_t n, const float *x);
    // Returns true when every element is finite.
    bool (*all_finite)(size_t n, const float *x);

    // --- transformer pieces ---------------------------------------------------------------
    // out (n, dim) = table[tokens[i]]
    void (*embed)(float *out, const float *table, const int32_t *tokens, int n, int dim);
    // dtable[tokens[i]] += dout[i]
    void (*embed_bwd)(float *dtable, const float *dout, const int32_t *tokens, int n, int dim);
    // out = x / sqrt(mean(x^2) + eps) * w ; rstd (n) saved for backward (may be NULL).
    void (*rmsnorm)(float *out, float *rstd, const float *x, const float *w, int n, int dim, float eps);
    // dx += d/dx, dw += d/dw (dw may be NULL: frozen).
    void (*rmsnorm_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                        int n, int dim);
    // x (n, dim) += b (dim) ; db (dim) += sum_rows dy
    void (*add_bias)(float *x, const float *b, int n, int dim);
    void (*bias_bwd)(float *db, const float *dy, int n, int dim);
    // Rotary embedding in place on x (n, n_heads*head_dim), rotate_half convention: dimension i
    // pairs with i + head_dim/2. cos/sin tables are (max_pos, head_dim/2). inverse rotates by
    // -angle (the backward of the forward rotation).
    void (*rope)(float *x, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
                 const float *sin_t, bool inverse);
    // Gated MLP activation: h = act(g) * u (n); act SILU is SwiGLU.
    void (*glu)(float *h, const float *g, const float *u, size_t n, kern_act_t act);
    // dg = dh * u * act'(g), du = dh * act(g)   (overwrite)
    void (*glu_bwd)(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n, kern_act_t act);
    // Paged causal attention: out (n_tokens, H*hd) from q (n_tokens, H*hd).
    void (*attn_paged)(float *out, const float *q, const kern_paged_attn_t *a);
    // Packed causal attention forward; lse (N, H) saved for backward.
    void (*attn_fwd)(float *out, float *lse, const float *q, const float *k, const float *v,
                     const kern_packed_attn_t *a);
    // Backward: dq, dk, dv (overwrite) from dout.
    void (*attn_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                     const float *q, const float *k, const float *v, const kern_packed_attn_t *a);

    // Multi-LoRA over all segments in one call (SGMV): shrink T[r, 0:rank] = X[r] A^T, and
    // expand Y[r] += scale * T[r, 0:rank] B. T has row stride ldt; X is (N, in), Y is (N, out).
    void (*lora_shrink)(float *T, int ldt, const float *X, int in, const kern_lora_seg_t *seg, int n_seg);
    // Optional (NULL: lora_shrink then lora_expand): both in one call, T receiving the shrink
    // outputs as lora_shrink writes them; the same results, element for element, as the two calls.
    void (*lora_apply)(float *Y, int out, float *T, int ldt, const float *X, int in, const kern_lora_seg_t *seg,
                       int n_seg);
    void (*lora_expand)(float *Y, int out, const float *T, int ldt, const kern_lora_seg_t *seg, int n_seg);

    // --- losses -----------------------------------------------------------------------------
    // For each row r of logits (n, V): logp[r] = log softmax(logits[r] / T)[target[r]] and
    // entropy[r] (nats) of that distribution (entropy may be NULL). Log-sum-exp in double.
    void (*token_logprobs)(float *logp, float *entropy, const float *logits, const int32_t *target, int n, int V,
                           float T);
    // In place: logits[r] <- dlogp[r] * (onehot(target[r]) - softmax(logits[r]/T)) / T,
    // i.e. the gradient of sum_r dlogp[r] * logp[r] with respect to the logits.
    void (*logprob_bwd)(float *logits, const float *dlogp, const int32_t *target, int n, int V, float T);

    // --- sampling -----------------------------------------------------------------------------
    // For each row r of logits (n, V) (backend memory), exactly what common/engine/sampler.c's
    // sampler_sample does with params {temperature[r], top_k[r], top_p[r]}: tokens[r] = the
    // sampled id, logprobs[r] = its log-prob under softmax(logits[r] / T) over the full vocabulary
    // (T = 1 for greedy rows; log-sum-exp in double). temperature <= 0 (or NaN): greedy, the
    // lowest id among the largest non-NaN logits. Otherwise temperature, then top-k (<= 0 or
    // >= V: off), then top-p (>= 1 or NaN: off; relative to what top-k kept), renormalised, drawn by
    // inverse CDF with u[r] in the sampler's candidate order.
    // RNG: sampler_sample draws exactly one rng_uniform per non-greedy sample and none for a
    // greedy one; the caller draws it (u[r] = rng_uniform(&rng_of_row_r) for rows with
    // temperature > 0; u[r] is ignored otherwise), so the RNG and its determinism stay on the
    // host and the stream of draws is the one sampler_sample would make. Must be in [0, 1).
    // temperature, top_k, top_p, u (n) are HOST arrays; tokens and logprobs (n) are HOST outputs
    // (logprobs may be NULL), written before the call returns (a GPU backend synchronises).
    // Rows with NaN or +inf logits, or only -inf ones, get an unspecified token in 0..V-1 and a
    // NaN log-prob. The CPU backend performs the sampler's very operations; a GPU backend may
    // pick another token in threshold cases only (u * mass within rounding of a boundary: see
    // kernels/cuda/cuda.h).
    void (*sample)(int32_t *tokens, float *logprobs, const float *logits, int n, int V, const float *temperature,
                   const int *top_k, const float *top_p, const float *u);

    // --- optimizer ------------------------------------------------------------------------
    // AdamW with decoupled weight decay on n parameters:
    //   m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2
    //   p -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * p)
    // bc1 = 1 - b1^t, bc2 = 1 - b2^t; g is multiplied by gscale first (grad clipping).
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                  float wd, float bc1, float bc2, float gscale);
} kernels_t;

// The CPU backend (always present): the variant of its ops chosen for this CPU, the same table
// for the whole process (kernels/cpu/cpu_host.c). Variants: "avx512-bf16" (AVX-512 with
// AVX512_BF16), "avx512" (x86-64-v4), "avx2" (x86-64-v3), "scalar" (any x86-64), best first; the
// best the CPU runs, or the one the environment variable MARLAAS_CPU_ISA names. A MARLAAS_CPU_ISA
// that names no variant, or one this CPU cannot run, ends the process at the first call with exit
// status 2 and a message naming the valid values and the CPU's best. The variants compute the same
// ops with sums in different orders (vector widths), so results agree to rounding, not bit for bit.
const kernels_t *kernels_cpu(void);
// The name of kernels_cpu()'s variant ("avx512-bf16", "avx512", "avx2", "scalar"), for reports.
const char *kernels_cpu_isa(void);
// The table of the variant named isa, NULL when there is none of that name or this CPU cannot run
// it; kernels_cpu_variant(kernels_cpu_isa()) is kernels_cpu(). For tests that compare the
// variants' ops: the engine takes the CPU backend to be kernels_cpu() (host memory, pointer
// comparison), so models are built on kernels_cpu().
const kernels_t *kernels_cpu_variant(const char *isa);
// Host memory for the CPU backend's buffers and the KV cache's pools: zero-filled, 64-byte aligned,
// NULL when out of memory; release with free(). Blocks of 4 MiB and more are 2 MiB aligned and
// advised as transparent huge pages (madvise MADV_HUGEPAGE, what the kernel's default "madvise"
// mode honours): one page fault per 2 MiB instead of 512, where a fault costs some 10 us on a
// paravirtualised VM (a training pass's first touch of its activations took 0.2 s on
// models/micro).
void *kernels_host_alloc(size_t bytes);
// The backend called name: "cpu" (always), "cuda" (a CUDA build with a usable GPU). NULL with the
// reason in why (n bytes) otherwise.
const kernels_t *kernels_by_name(const char *name, char *why, size_t n);
// The simulated backend's table ("sim:DEVICE" above; common/sim/sim.h): the CPU ops, named "sim".
const kernels_t *kernels_sim(void);
// The precision of a base model's matrices on backend k for a weights setting: "fp32" 0, "bf16"
// 1, "auto" bf16 on every backend but the CPU. -1 with the reason for any other value.
int kernels_weights_bf16(const kernels_t *k, const char *weights, char *why, size_t n);
// OpenBLAS's kernel set in use, and how it was chosen (see kernels/cpu/cpu.c), for reports.
const char *kernels_cpu_blas_core(void);
// One row of the CPU backend's sample op, with the caller's scratch (w: V floats, idx: V ints):
// the host sampler of the engine (common/engine/sampler.c) is this function, so the op and the
// sampler cannot drift apart. Returns the token; *logprob as the op defines it.
int32_t kernels_cpu_sample_row(const float *logits, int V, float temperature, int top_k, float top_p, float u,
                               float *w, int *idx, float *logprob);
// log sum_j exp(logits[j] / T) in double (max-shifted); with w, also w[j] = exp(logits[j]/T - max)
// as floats and *wsum their sum. The sampler's log-probs and the sample op use this one function,
// so a sampled token's log-prob equals a separate sampler_logprob of it bit for bit.
double kernels_cpu_tempered_lse(const float *logits, int V, double temperature, float *w, double *wsum);

#endif

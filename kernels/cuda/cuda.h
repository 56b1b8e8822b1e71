// cuda.h - the CUDA compute backend (kernels/cuda): the kernels_t table of kernels/kernels.h on
// one NVIDIA GPU. Built only with `make CUDA=1` (which also defines MARLAAS_CUDA=1 for C code).
//
// MEMORY CONTRACT
//   * Every float tensor argument (activations, weights, gradients, logits, rope tables, K/V pools,
//     the A/B matrices a kern_lora_seg_t points to, dlogp, ...) is DEVICE memory obtained from the
//     table's alloc (cudaMalloc, then zero-filled; alloc aborts with a message on failure).
//   * The small index and metadata arrays are HOST memory, because the engine builds them on the
//     host every step:
//       - int32 tokens (embed, embed_bwd), pos (rope), target (token_logprobs, logprob_bwd);
//       - kern_paged_attn_t: seq_of, pos, the `tables` pointer array and every table it points to
//         (k_base/v_base are device memory);
//       - kern_packed_attn_t: start, len, pre_start, pre_len;
//       - the kern_lora_seg_t array itself (its A and B members point to device memory);
//       - sample's per-row parameters temperature, top_k, top_p and u (its logits are device
//         memory; its outputs tokens and logprobs are host arrays, see below).
//     bf16 tensors (gemm_bf16w's W, to_bf16's dst, from_bf16's src: uint16_t) are device memory.
//     Each op validates them on the host (a negative index, a row or target out of range aborts
//     with a message), copies what it needs of them into a pinned staging slot and from there,
//     asynchronously on the backend's stream, into a grow-only device scratch buffer (both owned
//     by the backend, grown as needed, never freed). The host arrays may be changed or freed as
//     soon as the call returns.
//   * to_dev / to_host return when the copy is complete; copy (device to device), zero and every
//     compute op are asynchronous on the backend's one CUDA stream, so they are ordered with each
//     other; sumsq, all_finite and sample synchronise (they return values to the host: sample
//     copies its n results back through a pinned buffer into tokens / logprobs before it
//     returns), and free waits for the queued work before releasing the memory.
//   * The device is the one current when the backend is first used (device 0 unless the caller
//     picked another, e.g. with CUDA_VISIBLE_DEVICES). Ops may be called from several host
//     threads (a mutex serialises their use of the backend's scratch), but every thread must have
//     that device current.
//
// ERRORS
//   Every CUDA and cuBLAS call is checked; a failure prints
//     marlaas cuda: <call> failed: <reason>
//   to stderr and aborts. So does an unsupported size (see each kernel's comment in cuda.cu, e.g.
//   head_dim > 256 in attention, top_k > 4096 or V > 2^24 in sample). A kernel never continues
//   silently. Kernel faults are reported by the next call that synchronises; with
//   MARLAAS_CUDA_SYNC=1 in the environment every launch is followed by a synchronisation, so the
//   failing kernel is named (debugging, tests).
//
// PRECISION
//   fp32 throughout; gemm is cuBLAS SGEMM with CUBLAS_DEFAULT_MATH (CUBLAS_COMPUTE_32F, no TF32);
//   sumsq and the log-sum-exp of the loss ops accumulate in double like the CPU reference.
//   gemm_bf16w (both trans_w cases) rounds X to bf16 (nearest even) and multiplies with
//   cublasGemmEx (bf16 inputs, fp32 output, CUBLAS_COMPUTE_32F: exact products, fp32
//   accumulation, tensor cores allowed; W read with CUBLAS_OP_T for trans_w, CUBLAS_OP_N without);
//   the CPU backend keeps X in fp32 (but on its avx512-bf16 variant's few-rows path, which rounds
//   X as this backend does: kernels.h), so the two differ by at most 2^-8 |alpha| sum_k |x_k w_k|
//   (plus fp32 accumulation error) per element. to_bf16 / from_bf16 are bit-identical to the CPU.
//   sample returns the CPU backend's tokens except in threshold cases (u * mass or the top-p
//   target within ~1e-12 relative of a cumulative boundary: sums in another order, CUDA's exp)
//   and log-probs within ~1e-7; see the sampling section of cuda.cu for its design and sizes.
#ifndef MARLAAS_KERNELS_CUDA_H
#define MARLAAS_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels.h"

// The CUDA backend's table. Touches no GPU until its first op: check kernels_cuda_available()
// first; an op on a machine without a usable GPU aborts with a message.
const kernels_t *kernels_cuda(void);

// 1 when a usable GPU is visible (a device exists and this build has a kernel image for it),
// else 0 with a human reason written to why (n bytes, may be NULL), for example
// "no CUDA device visible (cudaGetDeviceCount: ...)". Initialises the CUDA runtime: a process
// that forks afterwards must not use CUDA in the child.
int kernels_cuda_available(char *why, size_t n);
// The number of visible CUDA devices (0 when none or on error). Initialises the CUDA runtime too.
int kernels_cuda_devices(void);

#ifdef __cplusplus
}
#endif

#endif

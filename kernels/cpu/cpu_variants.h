// cpu_variants.h - the CPU backend's kernel variants: cpu.c compiled once per instruction set
// (the Makefile's CPU_ISAS), each compilation defining its own tables; cpu_host.c picks one at
// run time (kernels_cpu). Internal to kernels/cpu.
//
//   KERN_CPU_ISA  compiled with                     tables
//   avx512        -march=x86-64-v4                  kernels_cpu_avx512, kernels_cpu_avx512_bf16,
//                                                   kernels_cpu_amx
//   avx2          -march=x86-64-v3                  kernels_cpu_avx2
//   scalar        -march=x86-64 (the SSE2 baseline) kernels_cpu_scalar
//
// The three avx512 tables differ in gemm_bf16w only: avx512-bf16 multiplies with vdpbf16ps
// (AVX512_BF16, functions compiled for it alone, used only when the CPU has it), few rows and
// many; amx takes that path for few rows and AMX tiles (AMX-TILE, AMX-BF16) for more.
#ifndef MARLAAS_KERNELS_CPU_VARIANTS_H
#define MARLAAS_KERNELS_CPU_VARIANTS_H

#include "kernels/kernels.h"

#define KERN_CPU_ISA_SCALAR 0
#define KERN_CPU_ISA_AVX2 1
#define KERN_CPU_ISA_AVX512 2

// Defined by the variants the build compiled (all three on x86-64, scalar elsewhere).
extern const kernels_t kernels_cpu_amx, kernels_cpu_avx512_bf16, kernels_cpu_avx512, kernels_cpu_avx2,
    kernels_cpu_scalar;

// y[i] = expf(x[i]) as each variant computes it for softmax and activations (cpu.c, "exp"): the
// vector variants bit for bit what the C library's expf gives; for tests. Defined by the variants
// the build compiled.
void kern_cpu_exp_avx512(float *y, const float *x, int n);
void kern_cpu_exp_avx2(float *y, const float *x, int n);
void kern_cpu_exp_scalar(float *y, const float *x, int n);

#endif

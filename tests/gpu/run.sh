#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check, for a machine with an NVIDIA GPU (A100 / H100 / H200 class:
# the build targets sm_80 and sm_90):
#   1. builds everything with the CUDA backend (make CUDA=1, into build/cuda),
#   2. runs build/cuda/bin/marlaas-gpu-tests: every op of the CUDA kernel table against the CPU
#      backend on random inputs,
#   3. prints the GPUs (nvidia-smi -L),
#   4. runs the engine benchmark on the CUDA backend with a model of Qwen2.5-0.5B's shapes (random
#      weights, matrices in bf16 as the services load them on cuda): decode tokens/s at batch
#      1/64/256 with 1 vs 32 adapters, prefill, train step, achieved GFLOP/s beside cuBLAS SGEMM's.
# Exits non-zero when the build or a test fails, or when a GPU is visible to the driver but the
# tests could not use it. Without a GPU it prints one SKIPPED line and exits 0.
#
# Usage: bash tests/gpu/run.sh            (from anywhere; works in the repository root)
#        JOBS=8 bash tests/gpu/run.sh     (make -j and test parallelism; default: nproc, at most 8)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

say() { echo "tests/gpu/run.sh: $*"; }

jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
[ "$jobs" -gt 8 ] && jobs=8

# Does the driver see a GPU? (nvidia-smi may be missing in a container that still has a GPU, so
# the device files count too; the test binary's own probe has the last word.)
smi_out=$(nvidia-smi -L 2>&1)
smi_rc=$?
driver_gpu=0
if [ $smi_rc -eq 0 ] && echo "$smi_out" | grep -q '^GPU '; then driver_gpu=1; fi
dev_files=0
if compgen -G '/dev/nvidia[0-9]*' >/dev/null || [ -e /dev/dxg ]; then dev_files=1; fi

if [ $driver_gpu -eq 0 ] && [ $dev_files -eq 0 ]; then
    reason=$([ $smi_rc -eq 127 ] && echo "nvidia-smi not found" || echo "nvidia-smi -L: $(echo "$smi_out" | head -1)")
    say "SKIPPED: no GPU visible ($reason; no /dev/nvidia* device); nothing was built or tested"
    exit 0
fi

nvcc_path=$(command -v nvcc || { [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"; })
if [ -z "$nvcc_path" ]; then
    say "FAILED: a GPU is visible but nvcc is not installed (looked on PATH and in ${CUDA_HOME:-/usr/local/cuda}/bin)"
    exit 1
fi

say "building with CUDA=1 (nvcc: $nvcc_path)"
if ! make CUDA=1 -j"$jobs"; then
    say "FAILED: make CUDA=1"
    exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
say "running build/cuda/bin/marlaas-gpu-tests"
build/cuda/bin/marlaas-gpu-tests --jobs "$jobs" --verbose 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

if grep -q '^marlaas-gpu-tests: SKIPPED:' "$log"; then
    why=$(sed -n 's/^marlaas-gpu-tests: SKIPPED: //p' "$log" | head -1)
    if [ $driver_gpu -eq 1 ]; then
        echo "$smi_out"
        say "FAILED: nvidia-smi sees a GPU but the CUDA backend cannot use it: $why"
        exit 1
    fi
    say "SKIPPED: no usable GPU ($why)"
    exit 0
fi

echo "--- GPUs (nvidia-smi -L)"
if [ $smi_rc -eq 0 ]; then echo "$smi_out"; else echo "(nvidia-smi unavailable: $(echo "$smi_out" | head -1))"; fi

tests_ok=1
if [ "$rc" -ne 0 ]; then
    say "FAILED: marlaas-gpu-tests exited with status $rc"
    tests_ok=0
fi
summary=$(grep '^marlaas-gpu-tests: [0-9]* tests:' "$log" | tail -1)
skipped=$(echo "$summary" | sed -n 's/.* \([0-9]*\) skipped$/\1/p')
# the two-rank NCCL tests need two GPUs; on a one-GPU machine they are the only skips allowed
two_gpu_skips=$(grep -c 'needs 2 GPUs' "$log" || true)
if ! echo "$summary" | grep -q ' 0 failed, 0 crashed, ' || [ "${skipped:-1}" -gt "$two_gpu_skips" ]; then
    say "FAILED: not every test passed: ${summary:-no summary line} (skips allowed: $two_gpu_skips two-GPU tests)"
    tests_ok=0
fi

# The engine on a model with Qwen2.5-0.5B's shapes (random weights, bf16 matrices: --weights auto
# on cuda): decode at batch 1/64/256 with 1 vs 32 adapters, prefill, train step, achieved GFLOP/s
# beside cuBLAS SGEMM's (fp32; the bf16 products run on GemmEx).
say "engine benchmark: Qwen2.5-0.5B shapes, random weights (marlaas init-model --shape qwen2.5-0.5b), bf16 base weights (--weights bf16)"
model=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$model"' EXIT
bench_ok=1
if ! build/cuda/bin/marlaas init-model --shape qwen2.5-0.5b --out "$model/qwen" >/dev/null; then
    say "FAILED: marlaas init-model --shape qwen2.5-0.5b"
    bench_ok=0
elif ! timeout 360 build/cuda/bin/marlaas-bench-engine --backend cuda --weights bf16 --model "$model/qwen" --batches 1,64,256 --prompt 64; then
    say "FAILED: the engine benchmark (exit status $?)"
    bench_ok=0
fi

[ $tests_ok = 1 ] && [ $bench_ok = 1 ] || exit 1
say "PASSED: ${summary#marlaas-gpu-tests: }; benchmark above"
exit 0

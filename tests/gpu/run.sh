#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check, for a machine with an NVIDIA GPU (A100 / H100 / H200 class:
# the build targets sm_80 and sm_90):
#   1. builds everything with the CUDA backend (make CUDA=1, into build/cuda),
#   2. runs build/cuda/bin/marlaas-gpu-tests: every op of the CUDA kernel table against the CPU
#      backend on random inputs,
#   3. prints the GPUs (nvidia-smi -L).
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
build/cuda/bin/marlaas-gpu-tests --jobs "$jobs" 2>&1 | tee "$log"
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
say "engine-level GPU benchmarks: not yet (the engine does not run on the CUDA backend yet); no numbers reported"

if [ "$rc" -ne 0 ]; then
    say "FAILED: marlaas-gpu-tests exited with status $rc"
    exit "$rc"
fi
summary=$(grep '^marlaas-gpu-tests: [0-9]* tests:' "$log" | tail -1)
if ! echo "$summary" | grep -q ' 0 failed, 0 crashed, 0 skipped$'; then
    say "FAILED: not every test passed: ${summary:-no summary line}"
    exit 1
fi
say "PASSED: ${summary#marlaas-gpu-tests: }"
exit 0

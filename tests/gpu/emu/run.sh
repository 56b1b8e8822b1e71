#!/usr/bin/env bash
# tests/gpu/emu/run.sh - runs the GPU tests (tests/gpu/test_kernels.c) on a machine WITHOUT a GPU,
# against a CPU emulation of the CUDA backend: kernels/cuda/cuda.cu compiled as host C++ with the
# stand-in headers of this directory (emu_rt.h says what is emulated and what cannot be checked).
# A development aid for the kernels' logic; the real check is tests/gpu/run.sh on a GPU.
#
# Three builds, each running every test:
#   exact     the kernels as written (no FMA contraction on the host);
#   gpu-like  FMA contraction allowed and expf/logf/exp/log moved by up to 2 ulp at random
#             (perturb.h), under a few EMU_SEED values: checks the tests' tolerances;
#   asan      AddressSanitizer + UBSan: out-of-bounds accesses of the kernels and host code.
# Objects in build/gpu-emu/. Needs g++ and sed; links the CPU library build/lib/libmarlaas.a
# (built here with make if missing). Exits non-zero when any run fails.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=build/gpu-emu
mkdir -p "$out"
make -s build/lib/libmarlaas.a

# kernel<<<grid, block, 0, stream>>>(args) -> emu_launch(grid, block, [&] { kernel(args); })
launch='kernel<<<(grid), (block), 0, g\.stream>>>(__VA_ARGS__);'
sed "s/$launch/emu_launch((grid), (block), [\&]() { kernel(__VA_ARGS__); });/" kernels/cuda/cuda.cu >"$out/cuda_emu.cc"
if ! grep -q 'emu_launch((grid), (block)' "$out/cuda_emu.cc" || grep -q '<<<' "$out/cuda_emu.cc"; then
    echo "tests/gpu/emu/run.sh: the LAUNCH macro of kernels/cuda/cuda.cu changed; update the sed above" >&2
    exit 1
fi
sed '/^#include "kernels\/cuda\/cuda.h"$/a #include "tests/gpu/emu/perturb.h"' "$out/cuda_emu.cc" >"$out/cuda_emu_gpulike.cc"
grep -q 'perturb.h' "$out/cuda_emu_gpulike.cc" || { echo "tests/gpu/emu/run.sh: could not insert perturb.h" >&2; exit 1; }

inc="-I. -Itests/gpu/emu/include -Itests/gpu/emu"
libs="build/lib/libmarlaas.a -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -fopenmp -lm -lpthread -lcriterion"
cxx="g++ -std=c++17 -g -Wall -Wno-unknown-pragmas"
cc="gcc -std=c11 -D_GNU_SOURCE -g -Wall -Wextra -Wno-unused-parameter -I."
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

echo "tests/gpu/emu/run.sh: building the emulated CUDA backend in $out"
$cc -O1 -c tests/gpu/test_kernels.c -o "$out/test_kernels.o"
$cxx -O1 -ffp-contract=off -c tests/gpu/emu/emu_rt.cc -o "$out/emu_rt.o"
$cxx -O1 -ffp-contract=off $inc -c "$out/cuda_emu.cc" -o "$out/cuda_emu.o"
g++ "$out/test_kernels.o" "$out/cuda_emu.o" "$out/emu_rt.o" $libs -o "$out/tests-exact"
$cxx -O2 -march=native -ffp-contract=fast $inc -c "$out/cuda_emu_gpulike.cc" -o "$out/cuda_emu_gpulike.o"
g++ "$out/test_kernels.o" "$out/cuda_emu_gpulike.o" "$out/emu_rt.o" $libs -o "$out/tests-gpulike"
$cc -O1 $san -c tests/gpu/test_kernels.c -o "$out/test_kernels_san.o"
$cxx -O1 -ffp-contract=off $san -c tests/gpu/emu/emu_rt.cc -o "$out/emu_rt_san.o"
$cxx -O1 -ffp-contract=off $san $inc -c "$out/cuda_emu.cc" -o "$out/cuda_emu_san.o"
g++ $san "$out/test_kernels_san.o" "$out/cuda_emu_san.o" "$out/emu_rt_san.o" $libs -o "$out/tests-asan"

fails=0
run() {
    local name=$1
    shift
    echo "--- $name"
    local rc=0
    "$@" --jobs 2 >"$out/last.log" 2>&1 || rc=$?
    grep -v "ASan doesn't fully support makecontext\|False positive error reports may follow\|For details see" "$out/last.log" || true
    if [ $rc -ne 0 ]; then
        echo "(exit status $rc)"
        fails=$((fails + 1))
    fi
}
run exact "$out/tests-exact"
for s in 1 2 3; do run "gpu-like numerics, EMU_SEED=$s" env EMU_SEED=$s "$out/tests-gpulike"; done
# The fibers switch stacks: ASan's stack-use-after-return and leak checks do not apply.
run "asan+ubsan" env ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0 "$out/tests-asan"
if [ $fails -ne 0 ]; then
    echo "tests/gpu/emu/run.sh: FAILED ($fails runs)"
    exit 1
fi
echo "tests/gpu/emu/run.sh: PASSED (emulation only: run tests/gpu/run.sh on a GPU for the real check)"

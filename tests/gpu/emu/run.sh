#!/usr/bin/env bash
# tests/gpu/emu/run.sh - runs the GPU tests (tests/gpu/test_kernels.c: every op; tests/gpu/test_engine.c:
# the engine on models/micro; tests/gpu/test_dp.c: data-parallel passes with host sums) on a
# machine WITHOUT a GPU, against a CPU emulation of the CUDA backend:
# kernels/cuda/cuda.cu compiled as host C++ with the stand-in headers of this directory (emu_rt.h
# says what is emulated and what cannot be checked). A development aid for the kernels' logic and
# the engine's use of device memory; the real check is tests/gpu/run.sh on a GPU.
#
# Builds (every kernel launch checks that its pointer arguments are device memory):
#   exact     the kernels as written (no FMA contraction on the host): kernel and engine tests;
#   gpu-like  FMA contraction allowed and expf/logf/exp/log moved by up to 2 ulp at random
#             (perturb.h), under a few EMU_SEED values: checks the tests' tolerances (kernel tests
#             under three seeds, engine tests under one);
#   asan      AddressSanitizer + UBSan: out-of-bounds accesses of the kernels and host code
#             (kernel tests);
#   strict    strict host/device separation (emu_rt.cc with -DEMU_STRICT=1): device memory is
#             PROT_NONE outside emulated device operations, so any host dereference of device
#             memory (engine, backend host code, tests) crashes with a message naming the address
#             and a backtrace: engine and kernel tests.
# Objects in build/gpu-emu/. Needs g++ and sed; links the CPU library build/lib/libmarlaas.a
# (built here with make if missing). About 7 minutes on 2 cores. Exits non-zero when any run fails.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=build/gpu-emu
mkdir -p "$out"
make -s build/lib/libmarlaas.a

# kernel<<<grid, block, 0, stream>>>(args) -> emu_launch_args(grid, block, [&] { kernel(args); }, "kernel", args)
# (emu_launch_args checks that every pointer argument is device memory, then runs the launch)
launch='kernel<<<(grid), (block), 0, g\.stream>>>(__VA_ARGS__);'
sed "s/$launch/emu_launch_args((grid), (block), [\&]() { kernel(__VA_ARGS__); }, #kernel, __VA_ARGS__);/" \
    kernels/cuda/cuda.cu >"$out/cuda_emu.cc"
if ! grep -q 'emu_launch_args((grid), (block)' "$out/cuda_emu.cc" || grep -q '<<<' "$out/cuda_emu.cc"; then
    echo "tests/gpu/emu/run.sh: the LAUNCH macro of kernels/cuda/cuda.cu changed; update the sed above" >&2
    exit 1
fi
sed '/^#include "kernels\/cuda\/cuda.h"$/a #include "tests/gpu/emu/perturb.h"' "$out/cuda_emu.cc" >"$out/cuda_emu_gpulike.cc"
grep -q 'perturb.h' "$out/cuda_emu_gpulike.cc" || { echo "tests/gpu/emu/run.sh: could not insert perturb.h" >&2; exit 1; }

inc="-I. -Itests/gpu/emu/include -Itests/gpu/emu"
# the libraries the Makefile links (one list: a library the project adds is linked here too)
ldlibs=$(make -s print-LDLIBS | tail -n 1)
libs="build/lib/libmarlaas.a $ldlibs -lcriterion"
cxx="g++ -std=c++17 -g -Wall -Wno-unknown-pragmas"
cc="gcc -std=c11 -D_GNU_SOURCE -g -Wall -Wextra -Wno-unused-parameter -I."
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

echo "tests/gpu/emu/run.sh: building the emulated CUDA backend in $out"
$cc -O1 -c tests/gpu/test_kernels.c -o "$out/test_kernels.o"
$cc -O1 -c tests/gpu/test_engine.c -o "$out/test_engine.o"
$cc -O1 -c tests/gpu/test_dp.c -o "$out/test_dp.o"
$cxx -O1 -ffp-contract=off -c tests/gpu/emu/emu_rt.cc -o "$out/emu_rt.o"
$cxx -O1 -ffp-contract=off -DEMU_STRICT=1 -c tests/gpu/emu/emu_rt.cc -o "$out/emu_rt_strict.o"
$cxx -O1 -ffp-contract=off $inc -c "$out/cuda_emu.cc" -o "$out/cuda_emu.o"
g++ "$out/test_kernels.o" "$out/cuda_emu.o" "$out/emu_rt.o" $libs -o "$out/tests-exact"
g++ "$out/test_engine.o" "$out/cuda_emu.o" "$out/emu_rt.o" $libs -o "$out/engine-exact"
g++ "$out/test_dp.o" "$out/cuda_emu.o" "$out/emu_rt.o" $libs -o "$out/dp-exact"
# -rdynamic: the strict mode's SIGSEGV report names the functions of its backtrace
g++ -rdynamic "$out/test_kernels.o" "$out/cuda_emu.o" "$out/emu_rt_strict.o" $libs -o "$out/tests-strict"
g++ -rdynamic "$out/test_engine.o" "$out/cuda_emu.o" "$out/emu_rt_strict.o" $libs -o "$out/engine-strict"
g++ -rdynamic "$out/test_dp.o" "$out/cuda_emu.o" "$out/emu_rt_strict.o" $libs -o "$out/dp-strict"
$cc -O1 -c tests/gpu/emu/strict_check.c -o "$out/strict_check.o"
g++ -rdynamic "$out/strict_check.o" "$out/cuda_emu.o" "$out/emu_rt_strict.o" $libs -o "$out/strict-check"
$cxx -O2 -march=native -ffp-contract=fast $inc -c "$out/cuda_emu_gpulike.cc" -o "$out/cuda_emu_gpulike.o"
g++ "$out/test_kernels.o" "$out/cuda_emu_gpulike.o" "$out/emu_rt.o" $libs -o "$out/tests-gpulike"
g++ "$out/test_engine.o" "$out/cuda_emu_gpulike.o" "$out/emu_rt.o" $libs -o "$out/engine-gpulike"
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
# The engine tests also run the CPU backend (the reference): one OpenMP thread per test process.
export MARLAAS_THREADS=1
run exact "$out/tests-exact"
run "engine, exact" "$out/engine-exact"
run "data-parallel passes, exact (host sums)" "$out/dp-exact"
for s in 1 2 3; do run "gpu-like numerics, EMU_SEED=$s" env EMU_SEED=$s "$out/tests-gpulike"; done
run "engine, gpu-like numerics, EMU_SEED=1" env EMU_SEED=1 "$out/engine-gpulike"
# The fibers switch stacks: ASan's stack-use-after-return and leak checks do not apply.
run "asan+ubsan" env ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0 "$out/tests-asan"
# The strict mode is live: a host read of device memory dies of SIGSEGV with the emulator's report.
echo "--- strict mode self-check (a host read of device memory must crash)"
rc=0
"$out/strict-check" >"$out/last.log" 2>&1 || rc=$?
if [ $rc -eq 139 ] && grep -q "EMU strict: the host touched emulated DEVICE memory" "$out/last.log"; then
    grep "EMU strict" "$out/last.log"
else
    cat "$out/last.log"
    echo "(exit status $rc: expected death by SIGSEGV with the strict mode's report)"
    fails=$((fails + 1))
fi
run "strict host/device separation" "$out/tests-strict"
run "engine, strict host/device separation" "$out/engine-strict"
run "data-parallel passes, strict host/device separation" "$out/dp-strict"
if [ $fails -ne 0 ]; then
    echo "tests/gpu/emu/run.sh: FAILED ($fails runs)"
    exit 1
fi
echo "tests/gpu/emu/run.sh: PASSED (emulation only: run tests/gpu/run.sh on a GPU for the real check)"

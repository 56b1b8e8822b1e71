#!/usr/bin/env bash
# The layering of docs/ARCHITECTURE.md holds in the sources and in the binaries:
#   - every #include "..." of kernels/, common/*, services/*, cli/, bench/, examples/, tools/
#     keeps its directory's rule (tests/integration/check_layers.py);
#   - the verifier and the scheduler, which run no model, link neither the engine nor the compute
#     libraries: their ELF DT_NEEDED lists have no OpenBLAS, OpenMP or CUDA library, and they
#     define none of the engine's or the CPU backend's functions.
# Self-checks, so that the checks can fail: an include of the engine added to a copy of
# common/tasks is reported with its file and line, and the rollout (which does compute) fails
# the verifier's binary check.
set -uo pipefail
BIN=${MARLAAS_BIN:-build/bin}
for tool in python3 readelf nm; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
for b in marlaas-verifier marlaas-scheduler marlaas-rollout; do
    [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run make"; exit 1; }
done
fail=0
bad() { echo "FAILED: $*"; fail=1; }

out=$(python3 tests/integration/check_layers.py .) || bad "include rules broken:"$'\n'"$out"
summary=$(echo "$out" | tail -n 1)

# No compute in a binary: the libraries it needs and the symbols it defines.
no_compute() {
    local b=$1 why=""
    local needed
    needed=$(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    for lib in libopenblas libgomp libcublas libcudart libnccl; do
        grep -q "^$lib" <<< "$needed" && why+=" needs $lib;"
    done
    local defined
    defined=$(nm --defined-only "$b" 2>/dev/null | awk '{print $NF}')
    for sym in engine_new model_load kernels_cpu gen_new kvcache_new_on; do
        grep -qx "$sym" <<< "$defined" && why+=" defines $sym;"
    done
    echo "$why"
}
for b in marlaas-verifier marlaas-scheduler; do
    why=$(no_compute "$BIN/$b")
    [ -z "$why" ] || bad "$b links compute:$why"
done

# self-checks
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/common" "$tmp/kernels"
cp -r common/tasks common/engine common/formats common/util "$tmp/common/"
cp kernels/kernels.h "$tmp/kernels/"
sed -i 's|^#include "common/tasks/tasks_internal.h"$|&\n#include "common/engine/model.h"|' "$tmp/common/tasks/tasks.c"
grep -q 'common/engine/model.h' "$tmp/common/tasks/tasks.c" || bad "self-check: could not plant an include in tasks.c"
planted=$(python3 tests/integration/check_layers.py "$tmp")
if [ $? -eq 0 ] || ! grep -q '^common/tasks/tasks.c:[0-9]*: includes common/engine/model.h' <<< "$planted"; then
    bad "self-check: an engine include in common/tasks was not reported: $planted"
fi
why_rollout=$(no_compute "$BIN/marlaas-rollout")
[ -n "$why_rollout" ] || bad "self-check: the binary check finds no compute in marlaas-rollout"

[ $fail = 0 ] || exit 1
echo "layers: ${summary#layers: }; marlaas-verifier and marlaas-scheduler link no engine, OpenBLAS or OpenMP; self-checks: a planted include reported, the rollout's compute found (${why_rollout# })"

#!/usr/bin/env bash
# Runs every tests/integration/test_*.sh from the repository root; each prints what it measured
# and exits non-zero on failure. Ends with the summary line "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
pass=0
fail=0
failed=()
# One thread per process: the tests start several processes on a small machine, and OpenMP
# threads that spin while another process holds the core slow everything down many times.
export MARLAAS_THREADS=${MARLAAS_THREADS:-1}
for t in tests/integration/test_*.sh; do
    name=$(basename "$t" .sh)
    start=$(date +%s)
    if bash "$t" > "build/integration-$name.log" 2>&1; then
        pass=$((pass + 1))
        echo "[PASS] $name ($(( $(date +%s) - start ))s): $(tail -n 1 "build/integration-$name.log")"
    else
        fail=$((fail + 1))
        failed+=("$name")
        echo "[FAIL] $name ($(( $(date +%s) - start ))s); last lines of build/integration-$name.log:"
        tail -n 15 "build/integration-$name.log" | sed 's/^/    /'
    fi
done
echo "integration: $pass passed, $fail failed"
[ "$fail" -eq 0 ]

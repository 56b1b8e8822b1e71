#!/usr/bin/env bash
# Runs every tests/integration/test_*.sh from the repository root; each prints what it measured
# and exits non-zero on failure, or 77 when it cannot run here (it says why). Ends with the
# summary line "N passed, N failed, N skipped". A failed test leaves its services' logs in
# build/integration-NAME-logs/.
set -u
cd "$(dirname "$0")/../.."
pass=0
fail=0
skip=0
failed=()
# One thread per process: the tests start several processes on a small machine, and OpenMP
# threads that spin while another process holds the core slow everything down many times.
export MARLAAS_THREADS=${MARLAAS_THREADS:-1}
for t in tests/integration/test_*.sh; do
    name=$(basename "$t" .sh)
    start=$(date +%s)
    logs="build/integration-$name-logs"
    rm -rf "$logs"
    KEEP_LOGS=$logs bash "$t" > "build/integration-$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1))
        rm -rf "$logs"
        echo "[PASS] $name ($(( $(date +%s) - start ))s): $(tail -n 1 "build/integration-$name.log")"
    elif [ $rc -eq 77 ]; then
        skip=$((skip + 1))
        rm -rf "$logs"
        echo "[SKIP] $name: $(tail -n 1 "build/integration-$name.log")"
    else
        fail=$((fail + 1))
        failed+=("$name")
        echo "[FAIL] $name ($(( $(date +%s) - start ))s); last lines of build/integration-$name.log:"
        tail -n 15 "build/integration-$name.log" | sed 's/^/    /'
        [ -d "$logs" ] && echo "    services' logs: $logs/"
    fi
done
echo "integration: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]

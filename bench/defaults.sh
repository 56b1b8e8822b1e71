#!/usr/bin/env bash
# defaults.sh - the job spec's default hyper-parameters on every built-in task: one job per task
# (`marlaas tasks`), each submitted with its task alone (every other setting the spec's default:
# 200 steps of 32 prompts x 8 samples, lr 1e-3, greedy eval of 200 prompts every 25 steps), all
# at once on one local cluster of MODEL (default models/tiny) under the async policy. Then, per
# task, its eval before training and at the end, its best evaluated version, and the check that
# no task ends below its start by more than the eval's 95 % half-width (bench/defaults.py).
#
#   bench/defaults.sh OUT_DIR          (about 45 minutes on 2 cores with models/tiny)
#
# Writes OUT_DIR/defaults.md and OUT_DIR/defaults.csv; the run's files (bench/e2e.sh's, the
# services' logs) go to WORK (default build/bench-defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench/defaults.sh OUT_DIR}
: "${MODEL:=models/tiny}" "${TENANTS:=4}" "${WORK:=build/bench-defaults}"
make -s all >/dev/null
mkdir -p "$OUT" "$WORK"
TASKS=$(build/bin/marlaas tasks | awk 'NR > 1 && NF >= 3 {print $1}' | tr '\n' ' ')
read -r -a TL <<< "$TASKS"
N=${#TL[@]}
EVAL_N=200   # the job spec's default eval_n (jobspec_defaults in common/rl/jobspec.c)
T0=$(date +%s)
echo "[defaults] $N tasks on $MODEL, async, the job spec's defaults" >&2
DEFAULTS=1 MODEL=$MODEL TENANTS=$TENANTS TASKS="$TASKS" LABEL=defaults THREADS=1 \
    bash bench/e2e.sh async "$N" "$WORK" > "$WORK/e2e.log" 2>&1 || {
    tail -n 5 "$WORK/e2e.log" >&2
    exit 1
}
fail=0
{
    python3 bench/defaults.py "$WORK/defaults-n$N/jobs.csv" "$EVAL_N" "$OUT/defaults.csv" || fail=1
    echo
    echo "Setup: $N jobs, one per built-in task, on \`$MODEL\`, each submitted with \`--task\` alone (the spec's defaults),"
    echo "all at once under the async policy on one local cluster (bench/e2e.sh, one compute thread per service, $TENANTS tenants);"
    echo "$(( $(date +%s) - T0 )) s. Machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores;" \
        "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes');" \
        "$(date -u '+%Y-%m-%d %H:%M UTC'). Reproduce: \`bash bench/defaults.sh OUT_DIR\`."
} > "$OUT/defaults.md"
cat "$OUT/defaults.md"
exit $fail

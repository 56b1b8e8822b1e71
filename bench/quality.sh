#!/usr/bin/env bash
# quality.sh - quality that means something: the same N jobs (a fixed subset of tasks) under sync
# and async, each with SEEDS seeds, then the paired comparison with its 95 % interval and the
# "never worse than start" checks (bench/quality.py states the statistics).
#
#   bench/quality.sh OUT_DIR
#
# Settings from the environment (bench/run.sh exports its own): MODEL, STEPS, PROMPTS, GROUP,
# TEMP, LR, EVAL_N, TENANTS as for bench/e2e.sh; QUALITY_TASKS (the subset, default the first 8
# of bench/run.sh's list), SEEDS (default 3). Writes OUT_DIR/quality/POLICY-sSEED-nN/ (e2e.sh's
# files), OUT_DIR/quality.md and OUT_DIR/quality/quality_stats.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench/quality.sh OUT_DIR}
: "${MODEL:=models/micro}" "${STEPS:=200}" "${PROMPTS:=16}" "${GROUP:=8}" "${TEMP:=1.3}" "${LR:=0.003}"
: "${EVAL_N:=400}" "${TENANTS:=4}" "${SEEDS:=3}"
: "${QUALITY_TASKS:=vowels wrap rep csort pad len add1 sub1}"
read -r -a QT <<< "$QUALITY_TASKS"
N=${#QT[@]}
[ "$N" -ge 8 ] || { echo "quality: at least 8 tasks (QUALITY_TASKS has $N)" >&2; exit 2; }
[ "$SEEDS" -ge 3 ] || { echo "quality: at least 3 seeds (SEEDS=$SEEDS)" >&2; exit 2; }
export MODEL STEPS PROMPTS GROUP TEMP LR EVAL_N TENANTS
Q="$OUT/quality"
mkdir -p "$Q"
fail=0
for seed in $(seq 1 "$SEEDS"); do
    for pol in sync async; do
        echo "[quality] $pol, seed $seed, $N jobs" >&2
        TASKS="$QUALITY_TASKS" SEED=$seed LABEL="$pol-s$seed" THREADS=1 bench/e2e.sh "$pol" "$N" "$Q" \
            > "$Q/$pol-s$seed.out" 2>&1 || { tail -n 5 "$Q/$pol-s$seed.out" >&2; fail=1; }
    done
done
{
    python3 bench/quality.py "$Q" "$EVAL_N"
    echo
    echo "Setup: $N jobs (tasks $QUALITY_TASKS) on \`$MODEL\`, each $STEPS steps of $PROMPTS prompts x $GROUP samples,"
    echo "temperature $TEMP, lr $LR, greedy eval on $EVAL_N held-out prompts before and after, $TENANTS tenants; per seed one"
    echo "sync and one async run (bench/e2e.sh, one compute thread per service), the jobs' seed = the run's seed."
    echo "Machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores;" \
        "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes');" \
        "$(date -u '+%Y-%m-%d %H:%M UTC')."
} > "$OUT/quality.md"
cat "$OUT/quality.md"
exit $fail

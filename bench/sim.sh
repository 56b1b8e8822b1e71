#!/usr/bin/env bash
# sim.sh - the simulated-cluster benchmark (docs/SIMULATOR.md): the paper's table on simulated
# H100s, where the design breaks (sweeps), the calibration of the simulator against real CPU runs,
# and the control plane's limits. Writes docs/benchmark/sim.md (tables with PASS/FAIL) and the
# CSVs beside it (sim_*.csv); the runs' files go to build/bench-sim/.
#
#   bench/sim.sh [paper] [scale] [sweeps] [calibration] [control]     (default: all five)
#
# Environment: OUT (docs/benchmark), WORK (build/bench-sim), STEPS (10, paper and sweeps),
# PAPER_N ("1 4 8 16 32"), SCALE (60), CHECK_SCALE (15: the scale part runs the paper's N = 1 sync
# and N = 32 async again at this scale, and the report gives how far the modelled times at SCALE
# are from them: the host's real time, which the scale magnifies), CONTROL_CONFIGS (sim_control.sh's;
# default "1000 200 64 16"; add "250 50 16 4" or "2000 400 128 16", the largest configuration
# measured, another 1 and 3 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/benchmark}
WORK=${WORK:-build/bench-sim}
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(paper scale sweeps calibration control)
mkdir -p "$OUT" "$WORK"
make -s all >/dev/null
: "${STEPS:=10}" "${PAPER_N:=1 4 8 16 32}" "${SCALE:=60}" "${CHECK_SCALE:=15}"
export STEPS SCALE
T_START=$(date +%s)
machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
run() {   # run POLICY N LABEL [VAR=VALUE...]: one simulated run, its row appended to $CSV
    local pol=$1 n=$2 label=$3
    shift 3
    if env "$@" LABEL="$label" bash bench/sim_run.sh "$pol" "$n" "$WORK" > "$WORK/$label-n$n.log" 2>&1; then
        tail -n 1 "$WORK/$label-n$n/run.csv" >> "$CSV"
    else
        echo "sim.sh: run $label N=$n failed (see $WORK/$label-n$n.log)" >&2
        tail -n 5 "$WORK/$label-n$n.log" >&2
        return 1
    fi
}
# the configuration of the paper's async N = 32 under another sweep's label: its row when the paper
# part ran in this invocation (the same run: 8 rollouts, 8 trainer devices, staleness 1), else a run
same_as_paper() {
    local label=$1 row
    row=$(awk -F, '$1 == "async" && $3 == 32' "$OUT/sim_paper.csv" 2>/dev/null | tail -n 1)
    if has paper && [ -n "$row" ]; then echo "$label,${row#*,}" >> "$CSV"; else run async 32 "$label"; fi
}
HDR="label,policy,n,device,rollouts,train_devices,scale,wall_s,modelled_s,roll_busy,train_busy,device_busy,tokens,tokens_per_s,steps,acc0,acc,done"
has() { local p; for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

if has paper; then
    CSV=$OUT/sim_paper.csv
    echo "$HDR" > "$CSV"
    for n in $PAPER_N; do
        run sync "$n" sync
        run async "$n" async
    done
    echo "paper: done ($(( $(date +%s) - T_START )) s)" >&2
fi
if has scale; then
    CSV=$OUT/sim_scale.csv
    echo "$HDR" > "$CSV"
    run sync 1 "sync-scale$CHECK_SCALE" SCALE="$CHECK_SCALE"
    run async 32 "async-scale$CHECK_SCALE" SCALE="$CHECK_SCALE"
    echo "scale: done ($(( $(date +%s) - T_START )) s)" >&2
fi
if has sweeps; then
    CSV=$OUT/sim_sweeps.csv
    echo "$HDR" > "$CSV"
    # rollout:trainer devices out of 16, N = 32 async
    # (8:8, staleness 1 and 8 trainer devices are the paper's async N = 32: that row, once run)
    for r in 4 8 12 14; do
        if [ "$r" = 8 ]; then same_as_paper "ratio-8:8"; else run async 32 "ratio-$r:$((16 - r))" ROLLOUTS=$r TRAIN_DEVICES=$((16 - r)); fi
    done
    # staleness 0 (on-policy, still multi-tenant), 1, 2, 4
    for s in 0 1 2 4; do
        if [ "$s" = 1 ]; then same_as_paper "staleness-1"; else run async 32 "staleness-$s" STALENESS=$s; fi
    done
    # completion length tails: the same median, sigma 0 (no tail), 0.5, 0.9, 1.3; sync and async, N = 4
    for sg in 0.0 0.5 0.9 1.3; do
        run sync 4 "tail-$sg-sync" LENGTHS="lognormal:400,$sg"
        run async 4 "tail-$sg-async" LENGTHS="lognormal:400,$sg"
    done
    # the trainer as one device (a single lane) against 8 data-parallel devices, 8 rollouts
    run async 32 "trainer-1" TRAIN_DEVICES=1
    same_as_paper "trainer-8"
    echo "sweeps: done ($(( $(date +%s) - T_START )) s)" >&2
fi
if has calibration; then bash bench/sim_calibrate.sh "$OUT" "$WORK"; echo "calibration: done ($(( $(date +%s) - T_START )) s)" >&2; fi
if has control; then CONTROL_CONFIGS=${CONTROL_CONFIGS:-1000 200 64 16} bash bench/sim_control.sh "$OUT" "$WORK"; fi
ALL=""
[ ${#PARTS[@]} = 5 ] && ALL=$(( $(date +%s) - T_START ))   # the whole run's time, when it ran every part
python3 bench/sim_report.py "$OUT" "$machine" "$STEPS" "$SCALE" $ALL
echo "sim.sh: $(( $(date +%s) - T_START )) s; report in $OUT/sim.md" >&2

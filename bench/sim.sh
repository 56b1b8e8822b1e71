#!/usr/bin/env bash
# sim.sh - the simulated-cluster benchmark (docs/SIMULATOR.md): the paper's table on simulated
# H100s, where the design breaks (sweeps), the calibration of the simulator against real CPU runs,
# and the control plane's limits. Writes docs/benchmark/sim.md (tables with PASS/FAIL) and the
# CSVs beside it (sim_*.csv); the runs' files go to build/bench-sim/.
#
#   bench/sim.sh [paper] [sweeps] [calibration] [control]     (default: all four)
#
# Environment: OUT (docs/benchmark), WORK (build/bench-sim), STEPS (10, paper and sweeps),
# PAPER_N ("1 4 8 16 32"), SCALE (60), CONTROL_CONFIGS (sim_control.sh's; default "250 50 16 4,
# 1000 200 64 16", which keeps the whole run near 13 minutes here; add "2000 400 128 16" for the
# largest configuration measured, another 3 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/benchmark}
WORK=${WORK:-build/bench-sim}
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(paper sweeps calibration control)
mkdir -p "$OUT" "$WORK"
make -s all >/dev/null
: "${STEPS:=10}" "${PAPER_N:=1 4 8 16 32}" "${SCALE:=60}"
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
if has sweeps; then
    CSV=$OUT/sim_sweeps.csv
    echo "$HDR" > "$CSV"
    # rollout:trainer devices out of 16, N = 32 async
    for r in 4 8 12 14; do run async 32 "ratio-$r:$((16 - r))" ROLLOUTS=$r TRAIN_DEVICES=$((16 - r)); done
    # staleness 0 (on-policy, still multi-tenant), 1, 2, 4
    for s in 0 1 2 4; do run async 32 "staleness-$s" STALENESS=$s; done
    # completion length tails: the same median, sigma 0 (no tail), 0.5, 0.9, 1.3; sync and async, N = 8
    for sg in 0.0 0.5 0.9 1.3; do
        run sync 8 "tail-$sg-sync" LENGTHS="lognormal:400,$sg"
        run async 8 "tail-$sg-async" LENGTHS="lognormal:400,$sg"
    done
    # the trainer as one device (a single lane) against 8 data-parallel devices, 8 rollouts
    run async 32 "trainer-1" TRAIN_DEVICES=1
    run async 32 "trainer-8" TRAIN_DEVICES=8
    echo "sweeps: done ($(( $(date +%s) - T_START )) s)" >&2
fi
if has calibration; then bash bench/sim_calibrate.sh "$OUT" "$WORK"; fi
if has control; then CONTROL_CONFIGS=${CONTROL_CONFIGS:-250 50 16 4,1000 200 64 16} bash bench/sim_control.sh "$OUT" "$WORK"; fi
python3 bench/sim_report.py "$OUT" "$machine" "$STEPS" "$SCALE"
echo "sim.sh: $(( $(date +%s) - T_START )) s; report in $OUT/sim.md" >&2

#!/usr/bin/env bash
# sim_calibrate.sh OUT WORK - the simulator against the real system on this CPU (bench/sim.sh's
# calibration part). Measures this machine as a simulated device (marlaas-sim-calibrate: sgemm
# and read bandwidth of one thread, the engine's overheads fitted to measured steps of
# models/micro), then runs the benchmark's jobs on models/micro twice for each N in CAL_N
# (default "1 8 32"; 400 / N steps per job, at least CAL_STEPS = 25), async: once computed on the CPU, once simulated with that device at time
# scale 1 (every real overhead the same in both), completions drawn from a lognormal with the
# real run's mean completion length and variance (from the trainer's per-step token counts;
# CAL_SIGMA sets the lognormal's sigma instead); CAL_REPEAT (2) pairs of runs
# per N, in turn, and the means of each side (a run's time moves by up to 25 % from one to the
# next on this machine). The machine's speed moves too (the fit's own shapes, measured ten seconds
# apart, by a fifth): the probe (a third of a second of four of the fit's shapes, modelled /
# measured) is measured just before and just after each computed run, and the simulated run gets
# the fitted device at the median speed of every probe so far (the column speed: the mean of those
# medians over the runs of N, 1 = the fit's). Writes OUT/sim_calibration.csv (measured
# and predicted end-to-end time and busy fractions) and OUT/sim_calibration_device.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1 WORK=$2
: "${CAL_N:=1 8 32}" "${CAL_STEPS:=25}" "${CAL_REPEAT:=2}"
D=$WORK/calibration
rm -rf "$D"
mkdir -p "$D"
MARLAAS_THREADS=1 build/bin/marlaas-sim-calibrate models/micro "$D/cpu_params.json" | tee "$D/device.log" >&2
# the machine's speed now against the fit's (marlaas-sim-calibrate --probe), once the last run's
# processes have gone (at most 3 s until no other task is runnable: /proc/loadavg)
speed() {
    local i
    for i in $(seq 30); do
        [ "$(awk '{split($4, r, "/"); print r[1]}' /proc/loadavg)" -le 1 ] && break
        sleep 0.1
    done
    MARLAAS_THREADS=1 build/bin/marlaas-sim-calibrate --probe models/micro "$D/cpu_params.json" | tee -a "$D/probe.log" | awk '$1 == "speed" {print $2}'
}
python3 - "$D/cpu_params.json" > "$OUT/sim_calibration_device.csv" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))["devices"]["cpu-measured"]
print("key,value")
for k in ("flops", "bandwidth", "launch_us", "step_overhead_us", "gemm_half_rows", "attention_efficiency"):
    print(f"{k},{d[k]:.4g}")
EOF
# the benchmark's jobs (bench/run.sh), fewer steps
export MODEL=models/micro STEPS=$CAL_STEPS PROMPTS=16 GROUP=8 TEMP=1.3 LR=0.003 EVAL_N=100 TENANTS=4
export TASKS="vowels wrap rep csort pad len add1 sub1 mul1 inc pal cmp parity issort count mod xor words max min paren upper rev mul21 second sub2 dsum dedup calc twice spread add2"
echo "n,policy,real_s,pred_s,real_roll,pred_roll,real_train,pred_train,mean_len,speed" > "$OUT/sim_calibration.csv"
probes="$(speed) $(speed)"   # two just after the fit
field() { awk -F, -v c="$2" 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == c) k = i} NR == 2 {print $k}' "$1"; }
# the mean of a field over the runs LABEL-r1 .. LABEL-rR (each run's run.csv)
mean_of() {
    local label=$1 col=$2 r v t=0
    for r in $(seq 1 "$CAL_REPEAT"); do
        v=$(field "$D/$label-r$r/run.csv" "$col")
        t=$(awk -v a="$t" -v b="$v" 'BEGIN {printf "%.6f", a + b}')
    done
    awk -v a="$t" -v n="$CAL_REPEAT" 'BEGIN {printf "%.4f", a / n}'
}
for n in $CAL_N; do
    # about the same work per run: 400 / N steps per job, at least CAL_STEPS
    STEPS=$(( 400 / n > CAL_STEPS ? 400 / n : CAL_STEPS ))
    export STEPS
    speeds=""
    for rep in $(seq 1 "$CAL_REPEAT"); do
        # computed, then simulated, in turn: a slow spell of the machine falls on both
        # one trainer lane, as the simulated trainer models it (marlaas up gives a CPU trainer one
        # per core)
        s0=$(speed)
        LANES=1 LABEL=real-n$n-r$rep bash bench/e2e.sh async "$n" "$D" > "$D/real-n$n-r$rep.log" 2>&1
        mv "$D/real-n$n-r$rep-n$n" "$D/real-n$n-r$rep"
        s1=$(speed)
        probes="$probes $s0 $s1"
        # the fitted device at the machine's speed: every rate times it, every overhead over it; the
        # speed is the median of every probe so far (one probe moves by a tenth, now and then by a
        # quarter: 0.3 s of a VM that a neighbour slows)
        sp=$(python3 - "$D/cpu_params.json" "$D/cpu_params-n$n-r$rep.json" $probes <<'EOF'
import json, statistics, sys
p = json.load(open(sys.argv[1]))
s = statistics.median(float(x) for x in sys.argv[3:])
d = p["devices"]["cpu-measured"]
d["flops"] *= s
d["bandwidth"] *= s
d["launch_us"] /= s
d["step_overhead_us"] /= s
d["source"] += f"; at the machine's speed probed so far (median), {s:.4f} of the fit's"
json.dump(p, open(sys.argv[2], "w"), indent=1)
print(f"{s:.4f}")
EOF
)
        speeds="$speeds $sp"
        # the real completions' length distribution, from the trainer's step lines (gen_tokens of
        # PROMPTS x GROUP samples): the mean, and the variance of one sample (within a job, the
        # variance of a step's sum over its samples, plus the variance of the jobs' means); the
        # lognormal of that mean and variance (its sigma: CAL_SIGMA when set)
        read -r m med sg < <(grep -h " step=" "$D/real-n$n-r$rep/logs/trainer.log" |
            sed -n 's/.* job=\([^ ]*\) .* gen_tokens=\([0-9]*\).*/\1 \2/p' |
            python3 -c '
import math, sys
S, fixed = int(sys.argv[1]), sys.argv[2]
per = {}
for line in sys.stdin:
    j, t = line.split()
    per.setdefault(j, []).append(int(t) / S)
means = {j: sum(v) / len(v) for j, v in per.items()}
m = sum(sum(v) for v in per.values()) / sum(len(v) for v in per.values())
within = sum(sum((x - means[j]) ** 2 for x in v) * S for j, v in per.items()) / sum(len(v) for v in per.values())
between = sum(len(per[j]) * (means[j] - m) ** 2 for j in per) / sum(len(v) for v in per.values())
sg = float(fixed) if fixed else min(4.0, math.sqrt(math.log(1 + (within + between) / (m * m))))
print(f"{m:.3f} {max(1.0, m / math.exp(sg * sg / 2)):.3f} {sg:.3f}")' $((PROMPTS * GROUP)) "${CAL_SIGMA:-}")
        echo "N=$n run $rep: completions of mean $m tokens, lognormal median $med sigma $sg; speed $s0 before, $s1 after" >&2
        MARLAAS_BACKEND=sim:cpu-measured MARLAAS_SIM_PARAMS="$(realpath "$D/cpu_params-n$n-r$rep.json")" MARLAAS_SIM_SCALE=1 \
            MARLAAS_SIM_LENGTHS="lognormal:$med,$sg" LABEL=sim-n$n-r$rep bash bench/e2e.sh async "$n" "$D" > "$D/sim-n$n-r$rep.log" 2>&1
        mv "$D/sim-n$n-r$rep-n$n" "$D/sim-n$n-r$rep"
    done
    echo "$n,async,$(mean_of real-n$n wall_s),$(mean_of sim-n$n wall_s),$(mean_of real-n$n roll_busy),$(mean_of sim-n$n roll_busy),$(mean_of real-n$n train_busy),$(mean_of sim-n$n train_busy),$m,$(echo "$speeds" | awk '{t = 0; for (i = 1; i <= NF; i++) t += $i; printf "%.4f", t / NF}')" >> "$OUT/sim_calibration.csv"
    tail -n 1 "$OUT/sim_calibration.csv" >&2
done

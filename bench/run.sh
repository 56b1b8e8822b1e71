#!/usr/bin/env bash
# run.sh - the benchmark suite: N concurrent jobs asynchronous vs one by one, rollout and trainer
# throughput, memory per tenant; writes bench/results/<date>-<host>/ (report.md, CSV, SVG plots).
#
#   bench/run.sh [--quick] [--out DIR]
#   bench/run.sh --sim [--out DIR]
#   bench/run.sh --defaults [--out DIR]
#
#   --quick   N in {1, 32} (at 32 the two policies only) and shorter micro-benchmarks (under 10
#             minutes on 2 cores): the N = 32 targets against sync and the work-conserving bound
#   full      N in {1, 4, 8, 16, 32} (under 45 minutes on 2 cores)
#   --sim     the simulated cluster (bench/sim.sh, docs/SIMULATOR.md): the paper's table on
#             simulated H100s, sweeps, calibration against this CPU, control-plane limits
#             (13 minutes on a 2-core Xeon, 29 on a 2-core EPYC VM); OUT defaults to docs/benchmark
#   --defaults the job spec's default hyper-parameters on every built-in task on models/tiny,
#             each task's final eval against its start (bench/defaults.sh; about 50 minutes);
#             OUT defaults to docs/benchmark
#
# Every run starts a fresh local cluster (redis-server + the four services on loopback) with
# the same settings per job under both policies; see bench/e2e.sh for one run and
# bench/report.sh for the report. Runs one thing at a time: on a small machine a second
# CPU-heavy process would distort every figure.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
SIM=0
DEFAULTS=0
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --sim) SIM=1 ;;
        --defaults) DEFAULTS=1 ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ $SIM = 1 ]; then
    OUT=${OUT:-docs/benchmark} exec bash bench/sim.sh
fi
if [ $DEFAULTS = 1 ]; then
    exec bash bench/defaults.sh "${OUT:-docs/benchmark}"
fi
[ -n "$OUT" ] || OUT="bench/results/$(date -u +%Y-%m-%d)-$(hostname -s)$([ $QUICK = 1 ] && echo -quick || true)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
make -s all >/dev/null
BIN=build/bin
T_START=$(date +%s)
log() { printf '[bench %4ds] %s\n' $(( $(date +%s) - T_START )) "$*" >&2; }

# --- settings ---------------------------------------------------------------------------------
# Every job: the same steps, batch (prompts) and group size, one task per job. The 32 tasks are
# those of models/micro whose greedy accuracy lies between 2 % and 95 % (see models/micro/README.md),
# so a job can both rise and be measured rising.
export MODEL=models/micro STEPS=200 PROMPTS=16 GROUP=8 TEMP=1.3 LR=0.003 EVAL_N=400 TENANTS=4
export TASKS="vowels wrap rep csort pad len add1 sub1 mul1 inc pal cmp parity issort count mod xor words max min paren upper rev mul21 second sub2 dsum dedup calc twice spread add2"
if [ $QUICK = 1 ]; then NS=(1 32); else NS=(1 4 8 16 32); fi

{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host=$(hostname -s)"
    echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
    echo "cores=$(nproc)"
    echo "mem_gib=$(awk '/MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)"
    echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes')"
    echo "mode=$([ $QUICK = 1 ] && echo quick || echo full)"
    echo "ns=${NS[*]}"
    for v in MODEL STEPS PROMPTS GROUP TEMP LR EVAL_N TENANTS; do echo "$(echo $v | tr 'A-Z' 'a-z')=${!v}"; done
} > "$OUT/meta.txt"

log "sgemm reference"
{
    MARLAAS_THREADS=1 "$BIN/marlaas-bench-tenancy" sgemm
    MARLAAS_THREADS=2 "$BIN/marlaas-bench-tenancy" sgemm | tail -n 1
} > "$OUT/sgemm.csv"

# --- 1. end to end --------------------------------------------------------------------------
E2E="$OUT/e2e"
rm -rf "$E2E"
mkdir -p "$E2E"
header_done=0
for N in "${NS[@]}"; do
    # Both policies with the same threads: one per service (marlaas up's default).
    runs=("sync 1 sync" "async 1 async")
    # The one-by-one baseline also with every core for every service (--threads 0): it runs one
    # stage at a time, so each stage could have both cores (the pool's threads sleep when idle).
    if [ "$N" = 1 ] || [ "$N" = 8 ]; then runs+=("sync 0 sync-all"); fi
    # A second sync run of the largest N: how far two runs of the same policy differ per job
    # (GRPO samples differ), the yardstick for the async - sync quality differences.
    if [ "$N" = "${NS[-1]}" ] && [ $QUICK = 0 ]; then runs+=("sync 1 sync-repeat"); fi
    # The cost of authenticated, encrypted links: the largest N asynchronously with plain links
    # (--insecure) beside the default CURVE run.
    if [ "$N" = "${NS[-1]}" ] && [ $QUICK = 0 ]; then runs+=("async 1 async-plain"); fi
    for r in "${runs[@]}"; do
        read -r pol th label <<< "$r"
        log "end to end: $label, $N jobs"
        ins=$([ "$label" = async-plain ] && echo 1 || echo 0)
        INSECURE=$ins THREADS=$th LABEL=$label bench/e2e.sh "$pol" "$N" "$E2E" > "$E2E/$label-n$N.out" 2>&1 ||
            { tail -n 20 "$E2E/$label-n$N.out" >&2; log "FAILED: $label N=$N (see $E2E/$label-n$N.out)"; }
        f="$E2E/$label-n$N/run.csv"
        if [ -f "$f" ]; then
            [ $header_done = 1 ] || { head -n 1 "$f" > "$OUT/e2e.csv"; header_done=1; }
            tail -n 1 "$f" >> "$OUT/e2e.csv"
            log "  $(tail -n 1 "$f" | cut -d, -f1-3) s"
        fi
    done
done

# --- 2b. quality over seeds (full run only): 8 tasks x 3 seeds per policy, paired --------------
if [ $QUICK = 0 ]; then
    log "quality over seeds (bench/quality.sh: 8 tasks, 3 seeds, sync and async)"
    bash bench/quality.sh "$OUT" > "$OUT/quality.log" 2>&1 || log "quality: a run failed (see $OUT/quality.log)"
fi

# --- 3. rollout: throughput and memory --------------------------------------------------------
Q=()
[ $QUICK = 1 ] && Q=(--quick)
log "rollout throughput (models/tiny, 1 thread as in the service)"
MARLAAS_THREADS=1 "$BIN/marlaas-bench-tenancy" rollout --model models/tiny "${Q[@]}" > "$OUT/rollout.csv" 2> "$OUT/rollout.log"
log "rollout memory"
{
    MARLAAS_THREADS=1 "$BIN/marlaas-bench-tenancy" memory --model models/tiny
    MARLAAS_THREADS=1 "$BIN/marlaas-bench-tenancy" memory --shape 25m | tail -n +2
    [ $QUICK = 1 ] || MARLAAS_THREADS=1 "$BIN/marlaas-bench-tenancy" memory --shape 100m | tail -n +2
} > "$OUT/memory.csv" 2> "$OUT/memory.log"

# --- 4. trainer -----------------------------------------------------------------------------
: > "$OUT/trainer.csv"
for m in micro tiny; do
    log "trainer steps/s (models/$m, 1 thread)"
    MARLAAS_THREADS=1 "$BIN/marlaas-bench-tenancy" trainer --model "models/$m" "${Q[@]}" 2>> "$OUT/trainer.log" |
        awk -v m="$m" -F, 'NR == 1 {if (!h) print "model," $0; next} {print m "," $0}' h="$([ -s "$OUT/trainer.csv" ] && echo 1)" \
        >> "$OUT/trainer.csv"
done

# --- 5. data-parallel trainer ---------------------------------------------------------------------
: > "$OUT/dp.csv"
for m in micro tiny; do
    log "data-parallel trainer (models/$m: 1 process x 2 threads vs 2 ranks x 1 thread)"
    "$BIN/marlaas-bench-tenancy" dp --model "models/$m" --ranks 2 "${Q[@]}" 2>> "$OUT/dp.log" |
        awk -v m="$m" -F, 'NR == 1 {if (!h) print "model," $0; next} {print m "," $0}' h="$([ -s "$OUT/dp.csv" ] && echo 1)" \
        >> "$OUT/dp.csv"
done

# --- engine (full run only) -------------------------------------------------------------------
if [ $QUICK = 0 ]; then
    log "engine benchmark"
    "$BIN/marlaas-bench-engine" > "$OUT/engine.txt" 2>&1 || true
fi

# --- tokenizer beside Hugging Face's (full run only; needs the npm registry once) ------------------
if [ $QUICK = 0 ]; then
    log "tokenizer benchmark"
    bash bench/tokenizer.sh > "$OUT/tokenizer.md" 2>&1 || log "tokenizer benchmark skipped or failed: $(tail -n 1 "$OUT/tokenizer.md")"
fi

log "report"
bench/report.sh "$OUT"
log "done: $OUT/report.md"

#!/usr/bin/env bash
# e2e.sh - one end-to-end run of the benchmark: N jobs on N distinct tasks under one policy, on
# a fresh local cluster (real redis-server and the four services on loopback).
#
#   bench/e2e.sh POLICY N OUT_DIR
#
# Settings come from the environment (bench/run.sh sets them): MODEL, STEPS, PROMPTS, GROUP,
# TEMP, LR, EVAL_N, MAX_NEW, TASKS (space-separated, at least N), TENANTS, THREADS, LANES, SEED (the jobs' seed;
# unset: the spec's default); DEFAULTS=1 submits each job with its task alone (every other setting
# the job spec's default: bench/defaults.sh).
#
# Writes into OUT_DIR/LABEL-nN/:
#   timeline.csv  t, rollout busy_s / up_s / cpu_s, trainer busy_s / up_s / cpu_s, tokens, steps
#                 (sampled every second from the services' heartbeats in Redis and /proc)
#   jobs.csv      job, task, status, eval accuracy before / after, first / last step time, steps,
#                 the best evaluated version's accuracy, the prompts an eval covers
#   steps.csv     t, job, task, step, reward, staleness (from the trainer's step log lines)
#   run.csv       one summary row (see HEADER below; svc_cpu_s: CPU-seconds of the four services;
#                 roll_busy .. train_cpu: busy and CPU seconds over the run's time, *_steady: over
#                 the steady span)
#   logs/         the services' logs
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/integration/lib.sh

POLICY=$1 N=$2 OUT=$3
: "${MODEL:=models/micro}" "${STEPS:=60}" "${PROMPTS:=4}" "${GROUP:=8}" "${TEMP:=1.3}" "${LR:=0.003}"
: "${EVAL_N:=200}" "${MAX_NEW:=0}" "${TENANTS:=4}" "${THREADS:=1}" "${LABEL:=$POLICY}"
read -r -a TASK_LIST <<< "${TASKS:?TASKS must list the tasks}"
[ "${#TASK_LIST[@]}" -ge "$N" ] || { echo "e2e: $N jobs need $N tasks, TASKS has ${#TASK_LIST[@]}" >&2; exit 2; }
D="$OUT/$LABEL-n$N"
rm -rf "$D"
mkdir -p "$D"
HEADER="policy,n,wall_s,steady_s,roll_busy,roll_cpu,train_busy,train_cpu,roll_busy_steady,roll_cpu_steady,train_busy_steady,train_cpu_steady,tokens,tokens_per_s,steps,steps_per_s,acc0_mean,acc_mean,done,svc_cpu_s"

# INSECURE=1: plain links (the cost of CURVE is the difference)
UP_FLAGS=()
[ "${INSECURE:-0}" = 1 ] && UP_FLAGS=(--insecure)
# LANES: the trainer's lanes (marlaas up --lanes; unset: its default, one per core)
[ -n "${LANES:-}" ] && UP_FLAGS+=(--lanes "$LANES")
cluster_up --model "$MODEL" --policy "$POLICY" --threads "$THREADS" "${UP_FLAGS[@]}" > "$D/up.log" 2>&1
REDIS_PORT=$(sed -n 's/^MARLAAS_REDIS=.*:\([0-9]*\)$/\1/p' "$RUN/env")
REDISCLI_AUTH=$(sed -n 's/^MARLAAS_REDIS_PASSWORD=//p' "$RUN/env")   # redis-cli's password
export REDISCLI_AUTH
ROLL_PID=$(svc_pid rollout)
TRAIN_PID=$(svc_pid trainer)
HZ=$(getconf CLK_TCK)

cpu() { awk -v hz="$HZ" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo ""; }

T0=$EPOCHREALTIME
# the timeline: one process with one Redis connection (bench/sample.py), so that sampling takes
# next to nothing from the run it measures
python3 bench/sample.py "$D/timeline.csv" "$REDIS_PORT" "$ROLL_PID" "$TRAIN_PID" "$T0" &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null || true; cluster_down' EXIT

declare -a TOKS JOBS
for t in $(seq 1 "$TENANTS"); do TOKS+=("$(mk_tenant "tenant$t")"); done
SPEC=(--steps "$STEPS" --prompts "$PROMPTS" --group "$GROUP" --temperature "$TEMP" --lr "$LR"
      --eval-every "$STEPS" --eval-n "$EVAL_N")
[ "$MAX_NEW" -gt 0 ] && SPEC+=(--max-new "$MAX_NEW")
[ -n "${SEED:-}" ] && SPEC+=(--seed "$SEED")
[ "${DEFAULTS:-0}" = 1 ] && SPEC=()   # every setting the job spec's default
for i in $(seq 0 $((N - 1))); do
    JOBS+=("$(submit "${TOKS[$((i % TENANTS))]}" --task "${TASK_LIST[$i]}" --name "${TASK_LIST[$i]}" "${SPEC[@]}")")
done
ok=1
for t in $(seq 1 "$TENANTS"); do
    [ "$t" -le "$N" ] || break
    # the end is read from the scheduler's log below, so the job list is polled only every 2 s
    WAIT_POLL=2 wait_jobs "${TOKS[$((t - 1))]}" 7200 > "$D/wait.log" || ok=0
done
WALL=$(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}')
sleep 1.2   # one more heartbeat with the final counters
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
# the compute the run cost: CPU-seconds (user + system) of the four services, start to end
SVC_CPU=0
for s in rollout trainer verifier scheduler; do
    SVC_CPU=$(awk -v a="$SVC_CPU" -v b="$(cpu "$(svc_pid "$s")")" 'BEGIN {printf "%.2f", a + b}')
done

# Log lines start with an ISO-8601 UTC time; logt prints it in seconds since T0.
LOGT='function logt(ts,   d, c, e, cmd) {
        split(ts, d, "T"); split(d[2], c, ":"); sub("Z", "", c[3])
        if (!(d[1] in day)) {cmd = "date -u -d " d[1] " +%s"; cmd | getline e; close(cmd); day[d[1]] = e}
        return day[d[1]] + c[1] * 3600 + c[2] * 60 + c[3] - t0
    }'
# per-step lines of the trainer: time, job, step, reward, staleness
awk -v t0="$T0" "$LOGT"' / step=[0-9]/ {
        job = ""; step = ""; rew = ""; st = ""
        for (i = 2; i <= NF; i++) {
            if ($i ~ /^job=/) job = substr($i, 5)
            else if ($i ~ /^step=/) step = substr($i, 6)
            else if ($i ~ /^reward=/) rew = substr($i, 8)
            else if ($i ~ /^staleness=/) st = substr($i, 11)
        }
        printf "%.3f,%s,%s,%s,%s\n", logt($1), job, step, rew, st
    }' "$RUN/logs/trainer.log" > "$D/steps.raw"
# the end: the scheduler's last "status done" (the job list is polled only once a second)
WALL=$(awk -v t0="$T0" -v w="$WALL" "$LOGT"' / status (done|failed|cancelled)/ {e = logt($1)} END {printf "%.3f", (e ? e : w)}' \
       "$RUN/logs/scheduler.log")

echo "job,task,status,acc0,acc,first_step_t,last_step_t,steps,best_acc,eval_n" > "$D/jobs.csv"
for i in $(seq 0 $((N - 1))); do
    tok=${TOKS[$((i % TENANTS))]} job=${JOBS[$i]}
    st=$(job_field "$tok" "$job" status)
    a0=$(job_field "$tok" "$job" eval_acc0)
    a1=$(job_field "$tok" "$job" eval_acc)
    ab=$(job_field "$tok" "$job" best_acc)
    en=$(job_field "$tok" "$job" eval_n)   # the prompts an eval covers (a small task's held-out set: fewer than asked)
    [ "$st" = done ] || ok=0
    awk -F, -v j="$job" -v task="${TASK_LIST[$i]}" -v st="$st" -v a0="$a0" -v a1="$a1" -v ab="$ab" -v en="$en" '
        $2 == j {if (f == "") f = $1; l = $1; n++}
        END {printf "%s,%s,%s,%s,%s,%s,%s,%d,%s,%s\n", j, task, st, a0, a1, f, l, n, ab, en}' "$D/steps.raw" >> "$D/jobs.csv"
done
echo "t,job,task,step,reward,staleness" > "$D/steps.csv"
awk -F, 'NR == FNR {if (FNR > 1) task[$1] = $2; next} {print $1 "," $2 "," task[$2] "," $3 "," $4 "," $5}' \
    "$D/jobs.csv" "$D/steps.raw" >> "$D/steps.csv"
rm -f "$D/steps.raw"
cp -r "$RUN/logs" "$D/logs"

# The whole run's busy and CPU fractions: the services' busy (CPU) seconds over the run's time
# (submission to the last job done, from the scheduler's log). Not over the span the samples
# cover: the last sample comes up to 3 s after the end (the job list is polled every 2 s, one more
# heartbeat after that), idle time that moved a 5-second run's fractions by up to two fifths.
# Steady state: async, the span in which every job is training (from the last job's first step
# to the first job's last step); sync runs one job at a time, so its steady state is the whole
# span from the first step to the last. Busy fractions over a span come from the differences of
# the counters at the samples bracketing it.
read -r S0 S1 < <(awk -F, -v pol="$POLICY" 'NR > 1 {
        if (pol == "async") {if ($6 > a || a == "") a = $6; if ($7 < b || b == "") b = $7}
        else {if ($6 < a || a == "") a = $6; if ($7 > b || b == "") b = $7}
    } END {print a + 0, b + 0}' "$D/jobs.csv")
STEPS_DONE=$(($(wc -l < "$D/steps.csv") - 1))
awk -F, -v pol="$LABEL" -v n="$N" -v wall="$WALL" -v nsteps="$STEPS_DONE" -v s0="$S0" -v s1="$S1" -v ok="$ok" -v hdr="$HEADER" \
    -v svc="$SVC_CPU" '
    function frac(db, du) {return du > 0 ? db / du : 0}
    FILENAME ~ /timeline/ && FNR > 1 && $2 != "" && $7 != "" {
        k++; t[k] = $1; rb[k] = $2; ru[k] = $3; tok[k] = $4; rc[k] = $5; tb[k] = $6; tu[k] = $7; st[k] = $8; tc[k] = $9
    }
    FILENAME ~ /jobs/ && FNR > 1 {m++; a0 += $4; a1 += $5}
    END {
        if (k < 2) {print hdr; printf "%s,%d,%.2f,,,,,,,,,,,,,,,,%d,%.2f\n", pol, n, wall, ok, svc; exit}
        # samples bracketing the steady span
        i0 = 1; for (i = 1; i <= k; i++) if (t[i] <= s0) i0 = i
        i1 = k; for (i = k; i >= 1; i--) if (t[i] >= s1) i1 = i
        dt = t[i1] - t[i0]
        print hdr
        # a steady span shorter than ~3 heartbeats (1 s apart) cannot be measured: left empty
        if (i1 - i0 < 3) sst = ",,,"
        else sst = sprintf("%.4f,%.4f,%.4f,%.4f", frac(rb[i1] - rb[i0], ru[i1] - ru[i0]), frac(rc[i1] - rc[i0], dt),
                          frac(tb[i1] - tb[i0], tu[i1] - tu[i0]), frac(tc[i1] - tc[i0], dt))
        printf "%s,%d,%.2f,%.2f,%.4f,%.4f,%.4f,%.4f,%s,%d,%.1f,%d,%.3f,%.4f,%.4f,%d,%.2f\n",
            pol, n, wall, s1 - s0,
            frac(rb[k] - rb[1], wall), frac(rc[k] - rc[1], wall), frac(tb[k] - tb[1], wall), frac(tc[k] - tc[1], wall), sst,
            tok[k], tok[k] / wall, nsteps, nsteps / wall, (m ? a0 / m : 0), (m ? a1 / m : 0), ok, svc
    }' "$D/timeline.csv" "$D/jobs.csv" > "$D/run.csv"
cat "$D/run.csv" | tail -n 1
[ "$ok" = 1 ] || { echo "e2e: $POLICY N=$N: not every job finished (see $D/jobs.csv, $D/logs)" >&2; exit 1; }

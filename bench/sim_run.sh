#!/usr/bin/env bash
# sim_run.sh - one run of a simulated cluster (docs/SIMULATOR.md): N jobs under one policy on a
# fresh local cluster whose rollouts and trainer are simulated devices (--backend sim:DEVICE),
# everything else real (redis-server, scheduler, verifier, ZeroMQ).
#
#   bench/sim_run.sh POLICY N OUT_DIR
#
# Settings from the environment: DEVICE (h100), MODEL (models/sim/qwen3-8b), ROLLOUTS (rollout
# replicas = rollout devices, 8), TRAIN_DEVICES (the trainer's data-parallel devices, 8), SCALE
# (modelled seconds per wall second, 60), LENGTHS (completion lengths, lognormal:400,0.9), STEPS
# (20), PROMPTS (8), GROUP (8), MAX_NEW (2048), STALENESS (1), EVAL_N (32), TASKS (cycled over the
# jobs: sim-easy sim-medium sim-hard), TENANTS (4), LABEL (POLICY), SIM_PARAMS (a parameter file,
# exported as MARLAAS_SIM_PARAMS).
#
# Writes OUT_DIR/LABEL-nN/run.csv, one row (HEADER below): wall and modelled end-to-end seconds,
# the rollout devices' and the trainer's busy fractions, the busy fraction of all devices
# together, modelled tokens per second, steps, mean eval accuracy before and after, and whether
# every job finished; jobs.csv (per job), logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/integration/lib.sh

POLICY=$1 N=$2 OUT=$3
: "${DEVICE:=h100}" "${MODEL:=models/sim/qwen3-8b}" "${ROLLOUTS:=8}" "${TRAIN_DEVICES:=8}" "${SCALE:=60}"
: "${LENGTHS:=lognormal:400,0.9}" "${STEPS:=20}" "${PROMPTS:=8}" "${GROUP:=8}" "${MAX_NEW:=2048}" "${STALENESS:=1}"
: "${EVAL_N:=32}" "${TASKS:=sim-easy sim-medium sim-hard}" "${TENANTS:=4}" "${LABEL:=$POLICY}"
read -r -a TASK_LIST <<< "$TASKS"
D="$OUT/$LABEL-n$N"
rm -rf "$D"
mkdir -p "$D"
HEADER="label,policy,n,device,rollouts,train_devices,scale,wall_s,modelled_s,roll_busy,train_busy,device_busy,tokens,tokens_per_s,steps,acc0,acc,done"

# one prompt per rollout task, so one job's step spreads over every rollout device
export MARLAAS_SIM_SCALE=$SCALE MARLAAS_SIM_LENGTHS=$LENGTHS MARLAAS_CHUNK=${CHUNK:-1} MARLAAS_MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-4096}
[ -n "${SIM_PARAMS:-}" ] && export MARLAAS_SIM_PARAMS=$SIM_PARAMS
# the trainer's devices: its own setting (the other services ignore it)
export MARLAAS_SIM_DEVICES=$TRAIN_DEVICES
cluster_up --model "$MODEL" --policy "$POLICY" --backend "sim:$DEVICE" --rollouts "$ROLLOUTS" > "$D/up.log" 2>&1
REDIS_PORT=$(sed -n 's/^MARLAAS_REDIS=.*:\([0-9]*\)$/\1/p' "$RUN/env")
REDISCLI_AUTH=$(sed -n 's/^MARLAAS_REDIS_PASSWORD=//p' "$RUN/env")
export REDISCLI_AUTH
# busy_s and up_s summed over every heartbeat of a service, and a counter field
beats() {
    local key
    redis-cli -p "$REDIS_PORT" --scan --pattern "*svc:$1:*" | while read -r key; do
        redis-cli -p "$REDIS_PORT" --raw hmget "$key" busy_s up_s "$2" | paste -sd,
    done | awk -F, '{b += $1; u += $2; c += $3; n++} END {printf "%.3f %.3f %d %d\n", b, u, c, n}'
}
# wait until every rollout replica has a heartbeat
wait_for 30 bash -c "[ \$(redis-cli -p $REDIS_PORT --scan --pattern '*svc:rollout:*' | wc -l) -ge $ROLLOUTS ]"
read -r RB0 RU0 _ _ < <(beats rollout tokens)
read -r TB0 TU0 _ _ < <(beats trainer steps)
T0=$EPOCHREALTIME

declare -a TOKS JOBS
for t in $(seq 1 "$TENANTS"); do TOKS+=("$(mk_tenant "tenant$t")"); done
SPEC=(--steps "$STEPS" --prompts "$PROMPTS" --group "$GROUP" --max-new "$MAX_NEW" --staleness "$STALENESS"
      --eval-every "$STEPS" --eval-n "$EVAL_N")
for i in $(seq 0 $((N - 1))); do
    task=${TASK_LIST[$((i % ${#TASK_LIST[@]}))]}
    JOBS+=("$(submit "${TOKS[$((i % TENANTS))]}" --task "$task" --name "$task" "${SPEC[@]}")")
done
ok=1
for t in $(seq 1 "$TENANTS"); do
    [ "$t" -le "$N" ] || break
    WAIT_POLL=0.5 wait_jobs "${TOKS[$((t - 1))]}" 7200 > "$D/wait.log" || ok=0
done
# the end: the scheduler's last "status done" (wait_jobs polls once a second, which at scale 60
# would be a minute of modelled time); its log lines start with an ISO-8601 UTC time
WALL=$(log_end "$T0" "$RUN/logs/scheduler.log")
# one more heartbeat (every second) with the final counters: 1.2 s after the end
sleep "$(awk -v t0="$T0" -v w="$WALL" -v now="$EPOCHREALTIME" 'BEGIN {s = t0 + w + 1.2 - now; printf "%.3f", (s > 0 ? s : 0)}')"
read -r RB1 RU1 TOK _ < <(beats rollout tokens)
read -r TB1 TU1 STEPS_DONE _ < <(beats trainer steps)

echo "job,task,status,acc0,acc" > "$D/jobs.csv"
# every tenant's job list at once (one call per tenant, not three per job): status and the evals
# before and after, in percent ("-": none)
declare -A ROW
for t in $(seq 1 "$TENANTS"); do
    [ "$t" -le "$N" ] || break
    while read -r job st a0 a1; do ROW[$job]="$st,$a0,$a1"; done < <("$M" jobs --token "${TOKS[$((t - 1))]}" |
        awk 'NR > 1 {a0 = $6; a1 = $7; sub("%", "", a0); sub("%", "", a1)
                     printf "%s %s %s %s\n", $1, $4, (a0 == "-" ? "" : a0 / 100), (a1 == "-" ? "" : a1 / 100)}')
done
for i in $(seq 0 $((N - 1))); do
    job=${JOBS[$i]}
    IFS=, read -r st a0 a1 <<< "${ROW[$job]:-missing,,}"
    [ "$st" = done ] || ok=0
    echo "$job,${TASK_LIST[$((i % ${#TASK_LIST[@]}))]},$st,$a0,$a1" >> "$D/jobs.csv"
done
cp -r "$RUN/logs" "$D/logs"
{
    echo "$HEADER"
    awk -F, -v label="$LABEL" -v pol="$POLICY" -v n="$N" -v dev="$DEVICE" -v r="$ROLLOUTS" -v td="$TRAIN_DEVICES" \
        -v sc="$SCALE" -v wall="$WALL" -v rb="$(awk -v a="$RB0" -v b="$RB1" 'BEGIN {print b - a}')" \
        -v ru="$(awk -v a="$RU0" -v b="$RU1" 'BEGIN {print b - a}')" -v tb="$(awk -v a="$TB0" -v b="$TB1" 'BEGIN {print b - a}')" \
        -v tu="$(awk -v a="$TU0" -v b="$TU1" 'BEGIN {print b - a}')" -v tok="$TOK" -v steps="$STEPS_DONE" -v ok="$ok" '
        NR > 1 {m++; a0 += $4; a1 += $5}
        END {
            # busy seconds over the wall time of the run (the heartbeats before the first job and after
            # the last bracket it; the services are idle outside it)
            rf = wall > 0 ? rb / (r * wall) : 0; tf = wall > 0 ? tb / wall : 0
            printf "%s,%s,%d,%s,%d,%d,%g,%.2f,%.1f,%.4f,%.4f,%.4f,%d,%.1f,%d,%.4f,%.4f,%d\n", label, pol, n, dev, r, td, sc,
                wall, wall * sc, rf, tf, (r * rf + td * tf) / (r + td), tok, tok / (wall * sc), steps,
                (m ? a0 / m : 0), (m ? a1 / m : 0), ok
        }' "$D/jobs.csv"
} > "$D/run.csv"
tail -n 1 "$D/run.csv"
[ "$ok" = 1 ] || { echo "sim_run: $POLICY N=$N: not every job finished (see $D/jobs.csv, $D/logs)" >&2; exit 1; }

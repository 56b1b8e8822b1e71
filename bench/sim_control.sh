#!/usr/bin/env bash
# sim_control.sh OUT WORK - the control plane's limits (bench/sim.sh's control part): simulated
# compute at a time scale that makes it nearly free, so that what is measured is the scheduler,
# Redis, the API and the sockets. For each configuration of CONTROL_CONFIGS ("JOBS TENANTS
# ROLLOUTS VERIFIERS", comma-separated; default 250 50 16 4, 500 100 32 8, 1000 200 64 16): a fresh
# simulated cluster, `marlaas bench-api` creates the tenants, submits the jobs (timed) and
# queries the API at 50 calls/s while they run (timed); the rollouts' task counters give tasks
# per second, Redis's own counters commands per second and memory per job, the services' CPU
# seconds what saturates (a fifth field bounds the jobs the scheduler runs at once: --set
# max_running; without it the bound is the trainer's job slots, which the scheduler reads from its
# heartbeat); then as many long jobs again are submitted (running) and the scheduler
# is restarted with all of them in Redis: the time until it is ready again. Writes OUT/sim_control.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1 WORK=$2
source tests/integration/lib.sh
: "${CONTROL_CONFIGS:=250 50 16 4,500 100 32 8,1000 200 64 16}"
D=$WORK/control
export KEEP_LOGS=$D/logs   # each cluster's logs (lib.sh cluster_down)
rm -rf "$D"
mkdir -p "$D"
HZ=$(getconf CLK_TCK)
echo "jobs,tenants,rollouts,verifiers,max_running,tasks_per_s,p50_ms,p99_ms,submit_p99_ms,redis_cmds_per_s,redis_bytes_per_job,restart_s,restored,end_s,trainer_full,saturated" > "$OUT/sim_control.csv"
cpu_of() {   # CPU-seconds of every process of a service (one pass over their /proc stat files)
    awk -v n="$1" '$1 == n {print "/proc/" $2 "/stat"}' "$RUN/pids" | xargs cat 2>/dev/null |
        awk -v hz="$HZ" '{s += ($14 + $15) / hz} END {printf "%.3f", s}'
}
redis_info() { redis-cli -p "$REDIS_PORT" info "$1" | tr -d '\r' | awk -F: -v k="$2" '$1 == k {print $2}'; }
IFS=, read -r -a CONFIGS <<< "$CONTROL_CONFIGS"
for cfg in "${CONFIGS[@]}"; do
    read -r JOBS TENANTS R V MAXRUN <<< "$cfg"
    export MARLAAS_SIM_SCALE=1000 MARLAAS_SIM_LENGTHS=fixed:16 MARLAAS_CHUNK=2 MARLAAS_MAX_RUNNING=${MAXRUN:-0}
    cluster_up --model models/sim/qwen3-8b --backend sim:h100 --rollouts "$R" --verifiers "$V" > "$D/up-$JOBS.log" 2>&1
    REDIS_PORT=$(sed -n 's/^MARLAAS_REDIS=.*:\([0-9]*\)$/\1/p' "$RUN/env")
    REDISCLI_AUTH=$(sed -n 's/^MARLAAS_REDIS_PASSWORD=//p' "$RUN/env")
    export REDISCLI_AUTH
    wait_for 60 bash -c "[ \$(redis-cli -p $REDIS_PORT --scan --pattern '*svc:rollout:*' | wc -l) -ge $R ]"
    mem0=$(redis_info memory used_memory) cmd0=$(redis_info stats total_commands_processed)
    declare -A C0
    for s in scheduler redis verifier trainer rollout; do C0[$s]=$(cpu_of "$s"); done
    t0=$EPOCHREALTIME
    # every second: the time since t0, Redis's command count, each kind of process's CPU-seconds
    (
        while :; do
            line="$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}') $(redis_info stats total_commands_processed)"
            for s in scheduler redis verifier trainer rollout; do line="$line $(cpu_of "$s")"; done
            echo "$line"
            sleep 1
        done
    ) > "$D/samples-$JOBS.txt" 2>/dev/null &
    SAMPLER=$!
    spec='{"task": "sim-easy", "max_steps": 3, "prompts": 2, "group": 4, "max_new": 32, "eval_every": 3, "eval_n": 4}'
    "$M" bench-api --jobs "$JOBS" --tenants "$TENANTS" --rate 50 --timeout 1200 --spec "$spec" > "$D/api-$JOBS.csv" 2> "$D/api-$JOBS.log" || true
    kill "$SAMPLER" 2>/dev/null || true
    wait "$SAMPLER" 2>/dev/null || true
    mem1=$(redis_info memory used_memory)
    sleep 1.2
    tasks=0
    for k in $(redis-cli -p "$REDIS_PORT" --scan --pattern '*svc:rollout:*'); do
        tasks=$((tasks + $(redis-cli -p "$REDIS_PORT" --raw hget "$k" tasks || echo 0)))
    done
    # the scheduler restarted with every job in Redis, as many again running (long jobs, submitted
    # now): until it is ready again
    long='{"task": "sim-easy", "max_steps": 100000, "prompts": 2, "group": 4, "max_new": 32, "eval_every": 0}'
    # (setting up, not measured: Redis fsyncs once a second instead of at every write while they
    # are submitted, three times faster here; the restart reads what Redis holds either way)
    redis-cli -p "$REDIS_PORT" config set appendfsync everysec > /dev/null
    "$M" bench-api --jobs "$JOBS" --tenants "$TENANTS" --prefix long --timeout 1 --spec "$long" > /dev/null 2>&1 || true
    svc_stop scheduler
    r0=$EPOCHREALTIME
    svc_start scheduler
    restart=$(awk -v a="$r0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')
    restored=$(grep -ho "[0-9]* jobs restored" "$SVC_LOG" | head -n 1)
    restored_n=${restored%% *}
    cluster_down
    # the end of the measured jobs: the scheduler's last "status done" before the long jobs came
    # (bench-api sees each end only when its round of queries reaches the job)
    slog=$(ls -td "$KEEP_LOGS"/* | head -n 1)/scheduler.log
    refused=$(grep -c "batch not used: trainer holds" "$(dirname "$slog")/trainer.log" || true)
    # the bound on the jobs running at once the scheduler applied (the trainers' job slots it read
    # from their heartbeats, or max_running when lower)
    bound=$(grep -o "async admission: at most [0-9]*" "$slog" | head -n 1 | awk '{print $NF}')
    end=$(log_end "$t0" "$slog" "$JOBS")
    # rates while the jobs ran: from the last sample at or before their end (one exists after 1 s)
    read -r ts cmd1 c_sch c_red c_ver c_tra c_rol < <(awk -v e="$end" '$1 <= e || NR == 1 {l = $0} END {print l}' "$D/samples-$JOBS.txt")
    declare -A C1=([scheduler]=$c_sch [redis]=$c_red [verifier]=$c_ver [trainer]=$c_tra [rollout]=$c_rol)
    # CPU cores each kind of process used while the jobs ran (its CPU-seconds over that time)
    sat=""
    for s in scheduler redis verifier trainer rollout; do
        sat="$sat $s=$(awk -v a="${C0[$s]}" -v b="${C1[$s]}" -v t="$ts" 'BEGIN {printf "%.3f", (b - a) / t}')"
    done
    sat=$(echo "$sat" | tr ' ' '\n' | sed '/^$/d' | sort -t= -k2 -gr | head -n 3 | paste -sd' ')
    tail -n 1 "$D/api-$JOBS.csv" | awk -F, -v j="$JOBS" -v t="$TENANTS" -v r="$R" -v v="$V" -v tasks="$tasks" \
        -v c0="$cmd0" -v c1="$cmd1" -v m0="$mem0" -v m1="$mem1" -v rs="$restart" -v sat="$sat" -v rn="${restored_n:-0}" \
        -v end="$end" -v full="${refused:-0}" -v mr="${bound:-${MAXRUN:-0}}" -v ts="$ts" '
        NF >= 10 {printf "%d,%d,%d,%d,%d,%.1f,%.3f,%.3f,%.3f,%.0f,%.0f,%s,%s,%.1f,%s,%s\n", j, t, r, v, mr, tasks / end, $5, $6, $4,
                  (c1 - c0) / ts, (m1 - m0) / j, rs, rn, end, full, sat}' >> "$OUT/sim_control.csv"
    echo "control $cfg: $(tail -n 1 "$OUT/sim_control.csv") ($restored)" >&2
done

#!/usr/bin/env bash
# Failure handling on a real local cluster (models/micro), with real signals:
#   a. the rollout is SIGKILLed mid-run (stopped first, so that it dies holding tasks) and a new
#      one started: expired leases issue the lost prompts again;
#   b. the trainer is SIGKILLed mid-run and a new one started: it resumes every job from Redis
#      (adapter version, step, optimizer state) and says so in its log;
#   c. the scheduler is SIGTERMed mid-run and a new one started: it restores every job from
#      Redis, `marlaas jobs` still lists them all;
#   d. redis-server is SIGKILLed mid-run and started again on its files: nothing is lost (the
#      earlier tenants and their jobs, every step once), and no job id is used twice.
# Each scenario runs 3 jobs of its own tenant. Every job must finish (status done, accuracy
# before and after training, adapter version = max_steps) and its metrics stream must hold the
# steps 1..max_steps exactly once each: a duplicate is a step applied twice, a gap a step lost. The scheduler runs with lease_s=3 and train_lease_s=5
# (defaults 60 s) so that lost work comes back within seconds.
set -euo pipefail
source tests/integration/lib.sh

STEPS=80
SPEC="--steps $STEPS --prompts 16 --eval-every 40 --eval-n 100 --lr 0.003"
TASKS="vowels pad rep"
LEASES=(--set lease_s=3 --set train_lease_s=5)
KILL_AFTER=10       # a failure hits once some job has passed this step
T_ALL=$EPOCHREALTIME
fail=0
summary=()

bad() {
    echo "FAIL: $*" >&2
    fail=1
}

secs_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

# highest step among a tenant's jobs (the step column reads N/MAX; the name column may be empty)
max_step() {
    { "$M" jobs --token "$1" || true; } |
        awk 'NR > 1 {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\/[0-9]+$/) {split($i, s, "/"); if (s[1] + 0 > m) m = s[1] + 0}}
             END {print m + 0}'
}

wait_progress() {
    local tok=$1 s
    for _ in $(seq 1 600); do
        s=$(max_step "$tok")
        if [ "$s" -gt "$KILL_AFTER" ]; then
            echo "$s"
            return 0
        fi
        sleep 0.1
    done
    echo "no job passed step $KILL_AFTER within 60 s" >&2
    "$M" jobs --token "$tok" >&2 || true
    return 1
}

# Step numbers of a job's metrics stream, one a line. Through the API (`marlaas metrics`); once
# that has failed (reported, a failure of the test), from Redis directly, so the step check still
# says what happened without a client timeout per job.
METRICS_API=1
job_steps() {
    local tok=$1 job=$2 out hp
    if [ "$METRICS_API" = 1 ]; then
        if out=$("$M" metrics --token "$tok" "$job" 2> "$RUN/metrics.err"); then
            printf '%s\n' "$out" | grep -o '[{,]"step":[0-9]*' | cut -d: -f2
            return 0
        fi
        bad "$job: marlaas metrics failed: $(cat "$RUN/metrics.err"); steps read from Redis from now on"
        METRICS_API=0
    fi
    hp=$(sed -n 's/^MARLAAS_REDIS=//p' "$RUN/env")
    REDISCLI_AUTH=$(sed -n 's/^MARLAAS_REDIS_PASSWORD=//p' "$RUN/env") redis-cli -h "${hp%:*}" -p "${hp##*:}" --raw XRANGE "marlaas:metrics:$job" - + |
        awk 'prev == "step" {print} {prev = $0}'
}

# Prints nothing when the steps are exactly 1..n once each, else what is wrong.
step_problems() {
    awk -v n="$1" '{c[$1]++; t++}
        END {
            for (i = 1; i <= n; i++) if (!(i in c)) miss = miss " " i
            for (k in c) {
                if (c[k] > 1) dup = dup " " k "(x" c[k] ")"
                if (k + 0 < 1 || k + 0 > n) extra = extra " " k
            }
            if (miss != "") printf "missing steps:%s; ", miss
            if (dup != "") printf "steps applied more than once:%s; ", dup
            if (extra != "") printf "steps out of range:%s; ", extra
            if (miss dup extra != "") printf "%d entries for %d steps\n", t, n
        }'
}

TOKENS=()
ALL_JOBS=()
start_jobs() {
    [ -n "${TOK:-}" ] && TOKENS+=("$TOK")
    TOK=$(mk_tenant "$1")
    JOBS=()
    for task in $TASKS; do JOBS+=("$(submit "$TOK" --task "$task" $SPEC)"); done
    ALL_JOBS+=("${JOBS[@]}")
}

# every job done with an accuracy before and after training, steps 1..STEPS once each
check_jobs() {
    local label=$1 j st v a0 a1 probs accs=""
    for j in "${JOBS[@]}"; do
        st=$(job_field "$TOK" "$j" status)
        [ "$st" = done ] || bad "$label: $j ended with status '$st' ($(job_field "$TOK" "$j" error))"
        # one adapter version per step: a step applied twice or lost shows here as well
        v=$(job_field "$TOK" "$j" adapter_version)
        [ "$v" = "$STEPS" ] || bad "$label: $j ends at adapter version '$v', not $STEPS"
        a0=$(job_field "$TOK" "$j" eval_acc0)
        a1=$(job_field "$TOK" "$j" eval_acc)
        [ -n "$a0" ] && [ -n "$a1" ] || bad "$label: $j has no eval accuracy before ('$a0') or after ('$a1') training"
        job_steps "$TOK" "$j" > "$RUN/steps"
        probs=$(step_problems "$STEPS" < "$RUN/steps")
        [ -z "$probs" ] || bad "$label: $j: $probs"
        accs="$accs $j $a0->$a1"
    done
    echo "$label: statuses and steps checked;$accs"
}

count_in_logs() { cat "$RUN"/logs/scheduler*.log | grep -c -- "$1" || true; }

cluster_up --model models/micro --port-base "$(low_port_base)"
# `marlaas up` starts the scheduler with the default leases of 60 s
svc_restart scheduler "${LEASES[@]}"
# The rollout reconnects to the new scheduler's work socket within about 100 ms; tasks issued
# before that are not sent, and a job submitted then would lose its eval before training.
wait_for 10 tcp_connected "$(svc_pid rollout)" "$(env_port MARLAAS_WORK)" ||
    bad "the rollout did not connect to the restarted scheduler's work socket within 10 s"

# --- a. rollout crash ---------------------------------------------------------------------------
start_jobs crash-rollout
reissued0=$(count_in_logs "issuing its")
at=$(wait_progress "$TOK")
t0=$EPOCHREALTIME
# micro generates faster than the trainer consumes, so the rollout is often idle; stopped first,
# it receives tasks it never finishes and dies holding them: it is killed once a task's worth of
# bytes waits unread in its work socket (more than the ZMTP heartbeats it also misses: a few bytes
# a second, until the scheduler gives up on it after 5 s)
rpid=$(svc_pid rollout)
kill -STOP "$rpid"
t_stop=$EPOCHREALTIME
wait_for 10 tcp_unread "$rpid" "$(env_port MARLAAS_WORK)" 200 ||
    bad "a: the stopped rollout was sent no task within 10 s"
held=$(tcp_conns "$rpid" "$(env_port MARLAAS_WORK)" | awk '{s += $1} END {print s + 0}')
svc_stop rollout KILL
svc_start rollout
echo "a: rollout SIGSTOPped at step $at, SIGKILLed $(secs_since "$t_stop") s later holding $held unread bytes of tasks, new rollout started"
wait_jobs "$TOK" 120 || bad "a: jobs did not finish after the rollout crash"
dt=$(secs_since "$t0")
reissued=$(( $(count_in_logs "issuing its") - reissued0 ))
check_jobs a
[ "$reissued" -gt 0 ] || bad "a: no lease expired although the rollout died holding tasks"
summary+=("rollout SIGKILLed at step $at: $reissued tasks re-issued, done ${dt}s later")

# --- b. trainer crash ---------------------------------------------------------------------------
start_jobs crash-trainer
lost0=$(count_in_logs "counting them as lost")
at=$(wait_progress "$TOK")
t0=$EPOCHREALTIME
svc_stop trainer KILL
svc_start trainer
tlog=$SVC_LOG
echo "b: trainer SIGKILLed at step $at, new trainer started ($tlog)"
wait_jobs "$TOK" 120 || bad "b: jobs did not finish after the trainer crash"
dt=$(secs_since "$t0")
lost=$(( $(count_in_logs "counting them as lost") - lost0 ))
check_jobs b
resumed=0
for j in "${JOBS[@]}"; do
    line=$(grep "job=$j resumed: adapter version" "$tlog" || true)
    if [ -n "$line" ]; then
        resumed=$((resumed + 1))
        echo "b: ${line#* job=}"
    else
        bad "b: the new trainer did not resume $j from Redis (no 'resumed: adapter version' in $tlog)"
    fi
done
summary+=("trainer SIGKILLed at step $at: $resumed/${#JOBS[@]} jobs resumed, $lost buffers counted lost, done ${dt}s later")

# --- c. scheduler restart -----------------------------------------------------------------------
start_jobs restart-scheduler
at=$(wait_progress "$TOK")
t0=$EPOCHREALTIME
svc_restart scheduler "${LEASES[@]}"
slog=$SVC_LOG
echo "c: scheduler SIGTERMed at step $at and restarted ($(grep -o 'ready: .*' "$slog"))"
listed=$("$M" jobs --token "$TOK" 2>&1) || bad "c: marlaas jobs failed after the scheduler restart"
echo "$listed"
seen=0
for j in "${JOBS[@]}"; do
    if printf '%s\n' "$listed" | awk -v j="$j" '$1 == j {found = 1} END {exit !found}'; then
        seen=$((seen + 1))
    else
        bad "c: $j is not listed after the scheduler restart"
    fi
    grep -q "job=$j restored: status running" "$slog" || bad "c: the new scheduler did not restore $j as running"
done
wait_jobs "$TOK" 120 || bad "c: jobs did not finish after the scheduler restart"
dt=$(secs_since "$t0")
check_jobs c
summary+=("scheduler SIGTERMed and restarted at step $at: $seen/${#JOBS[@]} jobs listed, done ${dt}s later")

# --- d. Redis crash -----------------------------------------------------------------------------
# The local cluster's Redis keeps an append-only file fsynced at every write: SIGKILLed and
# started again on the same files, it has lost nothing. The jobs finish with every step once,
# the tenants' tokens still work, and the id counter goes on (no job id is used twice).
start_jobs crash-redis
at=$(wait_progress "$TOK")
t0=$EPOCHREALTIME
rpid=$(svc_pid redis)
kill -KILL "$rpid"
wait_for 10 bash -c "! kill -0 $rpid 2> /dev/null" || bad "d: redis-server $rpid survived SIGKILL"
setsid redis-server "$RUN/redis/redis.conf" >> "$RUN/logs/redis.log" 2>&1 < /dev/null &
npid=$!
sed -i "s/^redis $rpid\$/redis $npid/" "$RUN/pids"
echo "d: redis-server SIGKILLed at step $at, started again on its files (pid $npid)"
wait_jobs "$TOK" 180 || bad "d: jobs did not finish after the Redis crash"
dt=$(secs_since "$t0")
check_jobs d
# the tenants of the earlier scenarios and their jobs are still there
for t in "${TOKENS[@]}"; do
    n=$("$M" jobs --token "$t" 2>/dev/null | awk 'NR > 1' | wc -l)
    [ "$n" = 3 ] || bad "d: a tenant created before the crash lists $n jobs, not 3"
done
newj=$(submit "$TOK" --task pad --steps 1 --prompts 4 --eval-every 1 --eval-n 4)
for j in "${ALL_JOBS[@]}"; do [ "$j" != "$newj" ] && continue; bad "d: job id $newj used twice"; done
"$M" cancel "$newj" --token "$TOK" > /dev/null 2>&1 || true
summary+=("redis-server SIGKILLed at step $at: done ${dt}s later, ${#TOKENS[@]} earlier tenants intact, next job id $newj (new)")

verdict=ok
[ "$fail" -eq 0 ] || verdict=FAILED
line="failures:"
for part in "${summary[@]}"; do line="$line $part;"; done
echo "$line steps 1..$STEPS checked in $((4 * $(wc -w <<< "$TASKS"))) jobs; $verdict in $(secs_since "$T_ALL")s"
exit $fail

#!/usr/bin/env bash
# External reward services. Phase 1: a vowels job scored by examples/reward_service.c (training
# and evals) trains beside a job on the built-in verifier; both finish and the first raises its
# eval accuracy. Phase 2: against an endpoint where nothing listens, a job with
# reward.on_failure "fail" fails with a message naming the reward service, a job with "zero"
# keeps training on reward 0 while its reward_errors count up, and a built-in job submitted at
# the same time finishes as if nothing happened. Phase 3: while a job's batches wait on a slow
# service, batches of hundreds of unknown jobs reach the verifier; it keeps running and the
# waiting job's batches are still scored.
set -euo pipefail
source tests/integration/lib.sh
t0=$(date +%s)
tmp=$(mktemp -d)
RS_PIDS=()
cleanup() {
    for p in "${RS_PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    cluster_down
    rm -rf "$tmp"
}
trap cleanup EXIT

# start_reward_service LOG [flags]: starts the example service, sets SVC_PORT and SVC_PID. A port
# taken between the check and the bind makes it exit, so a few ports are tried.
start_reward_service() {
    local log=$1
    shift
    for _ in 1 2 3 4 5; do
        SVC_PORT=$(free_low_port)
        "$BIN/reward_service" --bind "tcp://127.0.0.1:$SVC_PORT" "$@" 2> "$log" &
        SVC_PID=$!
        RS_PIDS+=("$SVC_PID")
        for _ in $(seq 1 50); do
            grep -q "listening on" "$log" 2>/dev/null && return 0
            proc_alive "$SVC_PID" || break
            sleep 0.1
        done
        kill "$SVC_PID" 2>/dev/null || true
        wait "$SVC_PID" 2>/dev/null || true
    done
    echo "the example reward service did not start:"
    cat "$log"
    return 1
}

# Waits until JOB has left queued/running (TIMEOUT_S at most).
wait_job() {
    local tok=$1 job=$2 timeout=$3 start st
    start=$(date +%s)
    while [ $(( $(date +%s) - start )) -lt "$timeout" ]; do
        st=$(job_field "$tok" "$job" status)
        if [ "$st" != queued ] && [ "$st" != running ]; then return 0; fi
        sleep 0.5
    done
    echo "$job still $st after ${timeout}s"
    return 1
}

num() { [ -n "$1" ] && echo "$1" || echo 0; }

# True while PID runs; a crashed service whose parent has exited stays a zombie until pid 1
# reaps it, and kill -0 would still call it alive.
proc_alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

start_reward_service "$tmp/reward.log"
RPORT=$SVC_PORT RS_PID=$SVC_PID
up_rc=0
cluster_up --model models/micro || up_rc=$?
trap cleanup EXIT   # cluster_up installed its own
[ "$up_rc" -eq 0 ] || { echo "reward service: marlaas up failed"; exit 1; }
T=$(mk_tenant rewards)
small='--steps 60 --prompts 16 --eval-every 60 --eval-n 100 --lr 0.003'
fail=0

# --- phase 1: the example service scores a job; a built-in job runs beside it ----------------
jA=$(submit "$T" --task vowels $small --name vowels-external --reward-endpoint "tcp://127.0.0.1:$RPORT")
jB=$(submit "$T" --task pad $small)
wait_jobs "$T" 60 || fail=1
stA=$(job_field "$T" "$jA" status)
stB=$(job_field "$T" "$jB" status)
a0=$(job_field "$T" "$jA" eval_acc0)
a1=$(job_field "$T" "$jA" eval_acc)
errA=$(num "$(job_field "$T" "$jA" reward_errors)")
# the service logs one line per request: G completions for training, 1 for an eval example
train_req=$(grep -c "job $jA: 8 completions, mean reward" "$tmp/reward.log" || true)
eval_req=$(grep -c "job $jA: 1 completion, mean reward" "$tmp/reward.log" || true)
other_req=$(grep -c "job $jB:" "$tmp/reward.log" || true)
echo "phase 1: $jA (external) $stA, eval $a0 -> $a1, reward_errors $errA, requests: $train_req train, $eval_req eval"
echo "phase 1: $jB (built-in) $stB, requests to the service: $other_req"
[ "$stA" = done ] || { echo "FAIL: $jA is $stA, not done"; fail=1; }
[ "$stB" = done ] || { echo "FAIL: $jB is $stB, not done"; fail=1; }
awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(a != "" && b != "" && b + 0 > a + 0) }' ||
    { echo "FAIL: $jA did not raise its eval accuracy ($a0 -> $a1)"; fail=1; }
[ "$errA" -eq 0 ] || { echo "FAIL: $jA counted $errA reward errors with the service up"; fail=1; }
[ "$train_req" -ge 960 ] || { echo "FAIL: only $train_req training requests for 60 steps x 16 prompts"; fail=1; }
[ "$eval_req" -ge 200 ] || { echo "FAIL: only $eval_req eval requests for 2 evals x 100 examples"; fail=1; }
[ "$other_req" -eq 0 ] || { echo "FAIL: the built-in job $jB reached the reward service"; fail=1; }
proc_alive "$RS_PID" || { echo "FAIL: the reward service died"; fail=1; }

# --- phase 2: a dead endpoint --------------------------------------------------------------
dead="tcp://127.0.0.1:$(free_low_port)"
cat > "$tmp/fail.json" <<EOF
{"task": "vowels", "name": "dead-fail", "max_steps": 60, "prompts": 16, "eval_every": 60, "eval_n": 100,
 "reward": {"endpoint": "$dead", "timeout_ms": 200, "retries": 0, "on_failure": "fail"}}
EOF
cat > "$tmp/zero.json" <<EOF
{"task": "vowels", "name": "dead-zero", "max_steps": 100000, "prompts": 16, "eval_every": 0, "eval_n": 32,
 "reward": {"endpoint": "$dead", "timeout_ms": 200, "retries": 0, "on_failure": "zero"}}
EOF
jC=$(submit "$T" --spec "$tmp/fail.json")
jE=$(submit "$T" --spec "$tmp/zero.json")
jD=$(submit "$T" --task rep $small)
wait_job "$T" "$jC" 30 || fail=1
wait_job "$T" "$jD" 60 || fail=1
stC=$(job_field "$T" "$jC" status)
errC=$("$M" status --token "$T" "$jC" | grep '"error"' || true)
stD=$(job_field "$T" "$jD" status)
echo "phase 2: $jC (on_failure fail) $stC: ${errC#"${errC%%[![:space:]]*}"}"
echo "phase 2: $jD (built-in, beside it) $stD"
[ "$stC" = failed ] || { echo "FAIL: $jC is $stC, not failed"; fail=1; }
echo "$errC" | grep -q "reward service" || { echo "FAIL: $jC's error does not mention the reward service"; fail=1; }
[ "$stD" = done ] || { echo "FAIL: $jD is $stD, not done"; fail=1; }

# E keeps stepping on reward 0; its reward_errors must keep growing
e1=$(num "$(job_field "$T" "$jE" reward_errors)")
s1=$(num "$(job_field "$T" "$jE" step)")
e2=$e1
for _ in $(seq 1 40); do
    e2=$(num "$(job_field "$T" "$jE" reward_errors)")
    [ "$e2" -gt "$e1" ] && break
    sleep 0.5
done
stE=$(job_field "$T" "$jE" status)
s2=$(num "$(job_field "$T" "$jE" step)")
# every step's reward, from the job's metrics, once there are more steps than fit one small
# reply (a job's metrics grow by a line per step)
for _ in $(seq 1 40); do
    [ "$(num "$(job_field "$T" "$jE" step)")" -ge 40 ] && break
    sleep 0.5
done
if "$M" metrics --token "$T" "$jE" > "$tmp/metrics.jsonl" 2> "$tmp/metrics.err"; then
    steps=$(grep -c '"reward":' "$tmp/metrics.jsonl" || true)
    nonzero=$(grep -o '"reward":[^,}]*' "$tmp/metrics.jsonl" | awk -F: '$2 + 0 != 0' | wc -l)
    [ "$steps" -gt 0 ] || { echo "FAIL: no step metrics for $jE"; fail=1; }
else
    steps=0
    nonzero=unknown
    echo "FAIL: marlaas metrics $jE: $(cat "$tmp/metrics.err")"
    fail=1
fi
echo "phase 2: $jE (on_failure zero) $stE, step $s1 -> $s2, reward_errors $e1 -> $e2, steps with reward > 0: $nonzero of $steps"
[ "$stE" = running ] || { echo "FAIL: $jE is $stE, not running"; fail=1; }
[ "$e1" -gt 0 ] && [ "$e2" -gt "$e1" ] || { echo "FAIL: $jE's reward_errors did not count up ($e1 -> $e2)"; fail=1; }
[ "$s2" -gt 0 ] || { echo "FAIL: $jE made no step"; fail=1; }
[ "$nonzero" = 0 ] || [ "$nonzero" = unknown ] || { echo "FAIL: $jE trained on a non-zero reward from a dead service"; fail=1; }
"$M" cancel --token "$T" "$jE" > /dev/null || { echo "FAIL: cancel $jE"; fail=1; }
stE=$(job_field "$T" "$jE" status)
[ "$stE" = cancelled ] || { echo "FAIL: $jE is $stE after cancel"; fail=1; }
proc_alive "$RS_PID" || { echo "FAIL: the reward service died"; fail=1; }

# --- phase 3: batches of unknown jobs while a job waits on a slow service -------------------
# The verifier keeps the specs of recent jobs (256 of them); batches of hundreds of other jobs
# must not take away the spec of a job whose batches still wait for their rewards.
start_reward_service "$tmp/slow.log" --sleep-ms 100
cat > "$tmp/slow.json" <<EOF
{"task": "vowels", "name": "slow-service", "max_steps": 100000, "prompts": 16, "eval_every": 0, "eval_n": 32,
 "reward": {"endpoint": "tcp://127.0.0.1:$SVC_PORT", "timeout_ms": 30000, "retries": 0, "on_failure": "zero"}}
EOF
jF=$(submit "$T" --spec "$tmp/slow.json")
# the slow job is being scored (its requests are at the slow service) before the flood
wait_for 60 grep -q "reward_service: id " "$tmp/slow.log" || { echo "FAIL: the slow job sent no reward request"; fail=1; }
"$BIN/marlaas-fuzz-send" --endpoint "$(sed -n 's/^MARLAAS_VERIFIERS=//p' "$RUN/env")" --type push --count 1200 \
    --seed 7 --only valid --message done --keys "$RUN/keys" --as rollout --server verifier > "$tmp/flood.out" || { echo "FAIL: $(cat "$tmp/flood.out")"; fail=1; }
sF=0
for _ in $(seq 1 60); do
    sF=$(num "$(job_field "$T" "$jF" step)")
    [ "$sF" -ge 2 ] && break
    proc_alive "$(svc_pid verifier)" || break
    [ "$(job_field "$T" "$jF" status)" = running ] || break
    sleep 0.5
done
stF=$(job_field "$T" "$jF" status)
aF=$(job_field "$T" "$jF" eval_acc0)
errF=$(num "$(job_field "$T" "$jF" reward_errors)")
echo "phase 3: $jF (slow service) $stF at step $sF, eval $aF, reward_errors $errF, $(grep -c "job $jF:" "$tmp/slow.log") requests;" \
     "flood: $(cat "$tmp/flood.out")"
if ! proc_alive "$(svc_pid verifier)"; then
    echo "FAIL: the verifier died; last lines of its log:"
    tail -n 25 "$RUN/logs/verifier.log" | sed 's/^/    /'
    fail=1
fi
[ "$stF" = running ] || { echo "FAIL: $jF is $stF: $("$M" status --token "$T" "$jF" | grep '"error"' || true)"; fail=1; }
[ "$sF" -ge 2 ] || { echo "FAIL: $jF made $sF steps"; fail=1; }
[ -n "$aF" ] || { echo "FAIL: $jF has no initial eval"; fail=1; }
[ "$errF" -eq 0 ] || { echo "FAIL: $jF counted $errF reward errors with a slow but working service"; fail=1; }
"$M" cancel --token "$T" "$jF" > /dev/null || true

for svc in scheduler verifier trainer rollout; do
    proc_alive "$(svc_pid "$svc")" || { echo "FAIL: $svc is not running"; fail=1; }
done

if [ "$fail" -ne 0 ]; then
    echo "reward service: FAILED (the FAIL lines above say what); $(( $(date +%s) - t0 ))s"
    exit 1
fi
echo "reward service: external vowels eval $a0 -> $a1 ($train_req train + $eval_req eval requests) beside built-in $stB;" \
     "dead endpoint: on_failure=fail -> $stC, on_failure=zero -> $e2 reward errors at step $s2 (cancelled), built-in beside -> $stD;" \
     "1200 batches of unknown jobs while one waits on a slow service -> it trains on ($stF, step $sF); $(( $(date +%s) - t0 ))s"

#!/usr/bin/env bash
# Tenants' reward services against a live `marlaas up` cluster (called by test_security.sh; also
# runs alone: `bash tests/integration/security_reward.sh` from the repository root after `make`).
#   B7 spoofing    tenant A's reward service answers every request with reward 0 and sprays
#                  replies with the ids next to its requests' and random ids; tenant B's
#                  service always answers 1. No reply of A's reaches B's job: B's mean reward at
#                  the verifier stays exactly 1, its reward errors 0, and the verifier counts
#                  A's sprayed replies as refused (marlaas_verifier_replies_refused_total)
#   B8 exhaustion  tenant C runs 40 short-lived jobs, each with a dead reward endpoint of its own
#                  (on_failure "fail"); all fail naming the reward service, the verifier never
#                  holds more than its per-tenant limit of C's sockets, and a job of C's with a
#                  live endpoint submitted afterwards is scored with 0 reward errors
#   allow-list     jobs whose reward endpoint is Redis's port or the scheduler's report port
#                  are refused at submission with a message naming the rule
# The last line prints the measured figures.
set -uo pipefail   # every outcome is checked below
source tests/integration/lib.sh
export MARLAAS_THREADS=1
t0=$(date +%s)
make_tmp
fail=0
STUB="$BIN/marlaas-reward-stub"
STUB_PIDS=()
num() { [[ "${1:-}" =~ ^[0-9]+([.][0-9]+)?$ ]] && echo "$1" || echo 0; }
vmetric() { metric "$(svc_http verifier)" "$@"; }
# scrape: the verifier's metrics at one instant into $tmp/metrics; mval NAME [JOB] reads them
scrape() { curl -sf --max-time 5 "http://$(svc_http verifier)/metrics" > "$tmp/metrics" || : > "$tmp/metrics"; }
mval() {
    local n=$1
    [ -n "${2:-}" ] && n="$1{job_id=\"$2\"}"
    num "$(awk -v n="$n" '$1==n{print $2}' "$tmp/metrics")"
}
# mean_reward JOB: reward sum / samples of the job at the verifier, from one scrape
mean_reward() { awk -v s="$(mval marlaas_verifier_job_reward_sum_total "$1")" -v n="$(mval marlaas_verifier_job_samples_total "$1")" \
    'BEGIN { printf "%.4f", (n > 0 ? s / n : 0) }'; }
cleanup() {
    for p in "${STUB_PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    cluster_down
    rm -rf "$tmp"
}

# start_stub LOG [flags]: a reward service stub on a free port; sets STUB_PORT and STUB_PID
start_stub() {
    local log=$1
    shift
    for _ in 1 2 3 4 5; do
        STUB_PORT=$(free_low_port)
        "$STUB" --bind "tcp://127.0.0.1:$STUB_PORT" "$@" 2> "$log" &
        STUB_PID=$!
        STUB_PIDS+=("$STUB_PID")
        wait_for 5 grep -q "listening on" "$log" 2>/dev/null && return 0
        kill "$STUB_PID" 2>/dev/null || true
        wait "$STUB_PID" 2>/dev/null || true
    done
    echo "the reward stub did not start: $(cat "$log")"
    return 1
}

# job_done TOKEN JOB: true once the job left queued/running
job_done() {
    local st
    st=$(job_field "$1" "$2" status)
    [ -n "$st" ] && [ "$st" != queued ] && [ "$st" != running ]
}
job_error() { "$M" status --token "$1" "$2" | sed -n 's/^[[:space:]]*"error":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p'; }

start_stub "$tmp/stub-a.log" --reward 0 --spray 16 --random 16 || exit 1
PA=$STUB_PORT PID_A=$STUB_PID
start_stub "$tmp/stub-b.log" --reward 1 || exit 1
PB=$STUB_PORT
# the live service of C's job after the dead ones: an endpoint the verifier has not seen before
start_stub "$tmp/stub-l.log" --reward 1 || exit 1
PL=$STUB_PORT
up_rc=0
cluster_up --model models/micro --threads 1 || up_rc=$?
trap cleanup EXIT   # cluster_up installed its own
[ "$up_rc" -eq 0 ] || { echo "security_reward: marlaas up failed"; exit 1; }
A=$(mk_tenant attacker)
B=$(mk_tenant victim)
C=$("$M" tenant create churner --quota 64 | awk '/^token/{print $2}')
[ -n "$A" ] && [ -n "$B" ] && [ -n "$C" ] || { echo "FAILED: tenants not created"; exit 1; }

# --- B7: A sprays replies while A's and B's jobs train side by side ---------------------------
small='--task vowels --steps 12 --prompts 8 --eval-every 0 --eval-n 16'
jA=$(submit "$A" $small --name spoofer --reward-endpoint "tcp://127.0.0.1:$PA")
jB=$(submit "$B" $small --name victim --reward-endpoint "tcp://127.0.0.1:$PB")

# --- allow-list: endpoints on the cluster's own ports -----------------------------------------
redis_port=$(envv MARLAAS_REDIS | sed 's/.*://')
reports_port=$(env_port MARLAAS_REPORTS)
for p in "$redis_port" "$reports_port"; do
    cat > "$tmp/own-$p.json" <<EOF
{"task": "vowels", "max_steps": 5, "prompts": 2, "eval_every": 0, "eval_n": 2,
 "reward": {"endpoint": "tcp://127.0.0.1:$p", "timeout_ms": 500, "retries": 0, "on_failure": "zero"}}
EOF
done
# refused at submission, by the rules the verifier applies (it refuses them too: test_score.c)
erR=$("$M" submit --token "$B" --spec "$tmp/own-$redis_port.json" 2>&1 >/dev/null) && stR=accepted || stR=refused
erP=$("$M" submit --token "$B" --spec "$tmp/own-$reports_port.json" 2>&1 >/dev/null) && stP=accepted || stP=refused

# --- B8: 40 short-lived jobs of C with dead endpoints, one each -------------------------------
dead_jobs=()
ports=" $PA $PB $PL "
for i in $(seq 1 40); do
    p=$(free_low_port)
    while [[ "$ports" == *" $p "* ]]; do p=$(free_low_port); done
    ports+="$p "
    cat > "$tmp/dead-$i.json" <<EOF
{"task": "vowels", "name": "dead-$i", "max_steps": 50, "prompts": 1, "group": 2, "eval_every": 0, "eval_n": 1,
 "reward": {"endpoint": "tcp://127.0.0.1:$p", "timeout_ms": 1000, "retries": 0, "on_failure": "fail"}}
EOF
    dead_jobs+=("$(submit "$C" --spec "$tmp/dead-$i.json")")
done
# the verifier's sockets while they run: never more of C's than its limit (8) beside A's and B's
peak=0
for _ in $(seq 1 120); do
    s=$(num "$(vmetric marlaas_verifier_service_sockets | cut -d. -f1)")
    [ "$s" -gt "$peak" ] && peak=$s
    left=0
    for j in "${dead_jobs[@]}"; do job_done "$C" "$j" || { left=1; break; }; done
    [ "$left" -eq 0 ] && break
    sleep 0.5
done
dead_failed=0 dead_msg=0 dead_cap=0 cap_msg=
for j in "${dead_jobs[@]}"; do
    [ "$(job_field "$C" "$j" status)" = failed ] && dead_failed=$((dead_failed + 1))
    e=$(job_error "$C" "$j")
    grep -q "reward service" <<< "$e" && dead_msg=$((dead_msg + 1))
    grep -q "max_tenant_endpoints" <<< "$e" && dead_cap=$((dead_cap + 1)) && cap_msg=$e
done
echo "B8: $dead_failed of 40 dead-endpoint jobs failed ($dead_msg naming the reward service, $dead_cap at C's socket" \
     "limit); peak verifier sockets $peak"
[ -n "$cap_msg" ] && echo "B8: e.g. \"$cap_msg\""
[ "$dead_failed" -eq 40 ] || { echo "FAILED: only $dead_failed of the 40 dead-endpoint jobs failed"; fail=1; }
[ "$dead_msg" -eq 40 ] || { echo "FAILED: only $dead_msg of the failed jobs name the reward service"; fail=1; }
[ "$peak" -le 10 ] || { echo "FAILED: the verifier held $peak service sockets (C's limit 8, plus A's and B's)"; fail=1; }

# then C's job with a live endpoint of its own (a stub: reward 1) is scored
jL=$(submit "$C" --task vowels --steps 3 --prompts 4 --eval-every 0 --eval-n 8 --name live \
    --reward-endpoint "tcp://127.0.0.1:$PL")
live_ok() { [ "$(num "$(vmetric marlaas_verifier_job_samples_total "$jL" | cut -d. -f1)")" -ge 32 ]; }
wait_for 60 live_ok || { echo "FAILED: $jL (live endpoint after 40 dead ones) got no rewards"; fail=1; }
wait_for 60 job_done "$C" "$jL" || fail=1
stL=$(job_field "$C" "$jL" status)
scrape
nL=$(mval marlaas_verifier_job_samples_total "$jL")
eL=$(mval marlaas_verifier_job_errors_total "$jL")
mL=$(mean_reward "$jL")
echo "B8: $jL (live endpoint) $stL: $nL samples scored, mean reward $mL, reward errors $eL"
[ "$stL" = done ] || { echo "FAILED: $jL is $stL"; fail=1; }
[ "${eL%.*}" -eq 0 ] || { echo "FAILED: $jL counted $eL reward errors"; fail=1; }
[ "$mL" = 1.0000 ] || { echo "FAILED: $jL's mean reward is $mL, not its service's 1"; fail=1; }

# --- allow-list results -----------------------------------------------------------------------
echo "allow-list: Redis port $redis_port -> $stR: $erR"
echo "allow-list: report port $reports_port -> $stP: $erP"
[ "$stR" = refused ] && grep -q "spec.reward.endpoint: port .* is the cluster.s Redis" <<< "$erR" ||
    { echo "FAILED: a reward endpoint on Redis's port not refused by rule"; fail=1; }
[ "$stP" = refused ] && grep -q "spec.reward.endpoint: port .* is the scheduler.s report port" <<< "$erP" ||
    { echo "FAILED: a reward endpoint on the report port not refused by rule"; fail=1; }

# --- B7 results -------------------------------------------------------------------------------
wait_for 120 job_done "$A" "$jA" || fail=1
wait_for 120 job_done "$B" "$jB" || fail=1
stA=$(job_field "$A" "$jA" status) stB=$(job_field "$B" "$jB" status)
sleep 1.5   # the counters reach /metrics once a second
scrape
nB=$(mval marlaas_verifier_job_samples_total "$jB")
eB=$(mval marlaas_verifier_job_errors_total "$jB")
nA=$(mval marlaas_verifier_job_samples_total "$jA")
mB=$(mean_reward "$jB")
mA=$(mean_reward "$jA")
refused=$(mval marlaas_verifier_replies_refused_total)
refused=${refused%.*}
kill "$PID_A" 2>/dev/null
wait "$PID_A" 2>/dev/null
sprayed=$(sed -n 's/^reward-stub: .* \([0-9]*\) sprayed$/\1/p' "$tmp/stub-a.log")
echo "B7: $jB (victim) $stB: $nB samples, mean reward $mB, reward errors $eB; $jA (spoofer) $stA: $nA samples, mean $mA"
echo "B7: the spoofer sprayed ${sprayed:-?} replies; the verifier refused $refused"
[ "$stB" = done ] || { echo "FAILED: $jB is $stB"; fail=1; }
[ "$stA" = done ] || { echo "FAILED: $jA is $stA"; fail=1; }
[ "${nB%.*}" -gt 0 ] && [ "$mB" = 1.0000 ] || { echo "FAILED: B's mean reward $mB over $nB samples: not only its own service's 1"; fail=1; }
[ "${eB%.*}" -eq 0 ] || { echo "FAILED: B counted $eB reward errors"; fail=1; }
[ "$mA" = 0.0000 ] || { echo "FAILED: A's mean reward $mA, not its own service's 0"; fail=1; }
[ "$refused" -gt 0 ] || { echo "FAILED: the verifier refused no reply of the spoofer"; fail=1; }
grep -q "unmatched reward reply" "$RUN/logs/verifier.log" || { echo "FAILED: no refusal logged by the verifier"; fail=1; }
lines=$(grep -c "unmatched reward reply" "$RUN/logs/verifier.log")
grep -q "from tcp://127.0.0.1:$PB" "$RUN/logs/verifier.log" && { echo "FAILED: the verifier blamed B's service"; fail=1; }

for svc in scheduler verifier trainer rollout; do
    svc_alive "$(svc_pid "$svc")" || { echo "FAILED: $svc is not running"; fail=1; }
done
dt=$(( $(date +%s) - t0 ))
if [ "$fail" -ne 0 ]; then
    echo "security_reward: FAILED (see above); ${dt}s"
    exit 1
fi
echo "security_reward: B7 victim mean reward $mB over $nB samples (0 errors), spoofer's ${sprayed:-?} sprayed replies ->" \
     "$refused refused, 0 applied ($lines log lines); B8 40/40 dead-endpoint jobs failed ($dead_cap at the per-tenant limit), peak $peak sockets, live job" \
     "after them $nL samples with 0 errors; allow-list: Redis and report ports refused; ${dt}s"

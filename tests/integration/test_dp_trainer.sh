#!/usr/bin/env bash
# A data-parallel trainer (common/rl/dp.h) in a real cluster: the cluster's trainer is replaced by
# a group of two processes started by the container image's entry point (MARLAAS_TRAINER_GPUS=2),
# rank 0 (the trainer service) and rank 1 (a worker that holds replicas of the adapters and trains
# its share of every pass), joined over ZeroMQ on loopback; CPU backend, gradients summed over the
# group. Two jobs on models/micro train to the end and raise
# their greedy eval accuracy; the worker trained a share of the passes (its own count of passes
# and sequences at its stop, which follows rank 0's). Then a new group, and the worker is killed
# with SIGKILL while jobs train: rank 0 must stop within its deadline with an error naming rank 1
# and the entry point exit with an error (the group fails loudly and restarts as a whole instead
# of hanging or training on half the data).
set -euo pipefail
source tests/integration/lib.sh
fail=0

cluster_up --model models/micro
svc_stop trainer TERM

# start_group NAME TIMEOUT: the container image's entry point starts the group (MARLAAS_TRAINER_GPUS=2:
# rank 1 and rank 0 as its children, stopped together); ready once rank 0 has formed the group
start_group() {
    DP_PORT=$(free_low_port)
    G_LOG="$RUN/logs/trainer-group-$1.log"
    (
        set -a
        . "$RUN/env"
        set +a
        export MARLAAS_THREADS=1 MARLAAS_HTTP="127.0.0.1:$(free_low_port)" MARLAAS_BIN_DIR="$BIN" \
            MARLAAS_TRAINER_GPUS=2 MARLAAS_DP_PORT="$DP_PORT"
        exec bash deploy/docker/entrypoint.sh trainer --set "dp_timeout=$2"
    ) > "$G_LOG" 2>&1 < /dev/null &
    G_PID=$!
    echo "trainer-group $G_PID" >> "$RUN/pids"
    for _ in $(seq 1 300); do
        grep -q "data-parallel ranks 2" "$G_LOG" && break
        kill -0 "$G_PID" 2>/dev/null || break
        sleep 0.1
    done
    R0_PID=$(pgrep -P "$G_PID" -f 'dp_rank=0' || true)
    W_PID=$(pgrep -P "$G_PID" -f 'dp_rank=1' || true)
    if [ -z "$R0_PID" ] || [ -z "$W_PID" ]; then
        echo "the trainer group did not start; $G_LOG:"
        cat "$G_LOG"
        exit 1
    fi
}

start_group a 30
check "rank 1 joined" grep -q "ready: data-parallel rank 1 of 2" "$G_LOG"
check "rank 0 formed the group" grep -q "data-parallel ranks 2" "$G_LOG"
T=$(mk_tenant dp)
spec='--steps 200 --prompts 32 --group 8 --eval-every 100 --eval-n 400 --lr 0.003'
j1=$(submit "$T" --task vowels $spec)
j2=$(submit "$T" --task wrap $spec)
start=$(date +%s)
wait_jobs "$T" 600
took=$(( $(date +%s) - start ))
summary=""
for pair in "$j1 vowels" "$j2 wrap"; do
    set -- $pair
    st=$(job_field "$T" "$1" status)
    step=$(job_field "$T" "$1" step)
    a0=$(job_field "$T" "$1" eval_acc0)
    a1=$(job_field "$T" "$1" eval_acc)
    echo "$1 ($2): status $st, step $step, eval accuracy $a0 -> $a1"
    summary="$summary $2 ${a0:-?}->${a1:-?}"
    check "$1 finished" [ "$st" = done ]
    check "$1 reached step 200" [ "$step" = 200 ]
    check "$1 raised its accuracy by 2 points" awk -v a="${a0:-1}" -v b="${a1:-0}" 'BEGIN {exit !(100 * (b - a) >= 2)}'
done
check "no job failed in the trainer" sh -c "! grep -q 'job failed' '$G_LOG'"
# SIGTERM to the group (what Kubernetes sends): both ranks stop, rank 1 reports its share
kill -TERM "$G_PID"
g_rc=0
wait "$G_PID" || g_rc=$?
check "the group stopped cleanly on SIGTERM (status $g_rc)" [ "$g_rc" = 0 ]
check "rank 1 stopped" sh -c "! kill -0 $W_PID 2>/dev/null"
passes=$(sed -n 's/.*trained its share of \([0-9]*\) passes (\([0-9]*\) sequences).*/\1/p' "$G_LOG" | tail -n 1)
seqs=$(sed -n 's/.*trained its share of \([0-9]*\) passes (\([0-9]*\) sequences).*/\2/p' "$G_LOG" | tail -n 1)
echo "rank 1 trained its share of ${passes:-?} passes (${seqs:-?} sequences)"
# every optimiser step of the two jobs came from a pass both ranks trained
check "rank 1 trained shares of the passes" awk -v p="${passes:-0}" -v s="${seqs:-0}" 'BEGIN {exit !(p >= 200 && s >= 200 * 32)}'
check "the group logged no error" sh -c "! grep -q ERROR '$G_LOG'"

# a worker started by hand on rank 0's host, with no HTTP setting: it serves no HTTP endpoint (so
# it cannot collide with rank 0's default port 9503, held here) and fails only because no rank 0
# answers, saying so
python3 -c 'import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", 9503)); s.listen(1)
except OSError:
    pass
time.sleep(20)' &
HOLD=$!
wait_for 10 bash -c "echo > /dev/tcp/127.0.0.1/9503" 2>/dev/null || true   # the port is held (by us or another)
w_rc=0
w_out=$(env -u MARLAAS_HTTP MARLAAS_THREADS=1 "$BIN/marlaas-trainer" --insecure --model models/micro --set dp_world=2 --set dp_rank=1 \
    --set "dp_endpoint=tcp://127.0.0.1:$(free_low_port)" --set dp_timeout=1 2>&1) || w_rc=$?
kill "$HOLD" 2>/dev/null || true
check "a lone worker exits 1 (status $w_rc)" [ "$w_rc" = 1 ]
check "a lone worker names the missing rank 0" grep -q "could not join the group" <<< "$w_out"
check "a worker takes no HTTP port by default" sh -c "! grep -qi 'http' <<'EOF'
$w_out
EOF"

# a worker killed mid-run: rank 0 fails loudly within its deadline (5 s) and exits
start_group b 5
j3=$(submit "$T" --task vowels --steps 2000 --prompts 32 --group 8 --eval-every 0 --eval-n 64)
for _ in $(seq 1 300); do
    [ "$(job_field "$T" "$j3" step)" -ge 5 ] 2>/dev/null && break
    sleep 0.1
done
kill -KILL "$W_PID"
killed=$(date +%s)
g_rc=0
wait "$G_PID" || g_rc=$?
gone=$(( $(date +%s) - killed ))
check "the group exited with an error after rank 1 died (status $g_rc)" [ "$g_rc" != 0 ]
check "rank 0 is gone" sh -c "! kill -0 $R0_PID 2>/dev/null"
check "the group stopped within 20 s (deadline 5 s): ${gone}s" [ "$gone" -le 20 ]
check "rank 0 names the dead rank" grep -q "ERROR.*data parallelism: .*ranks 1 did not take part" "$G_LOG"
check "the entry point says why it stopped the group" grep -q "trainer group: a rank exited" "$G_LOG"
grep "ERROR" "$G_LOG" | tail -n 1
echo "data-parallel trainer (2 ranks, CPU): 2 jobs of 200 steps in ${took}s, eval accuracy:$summary; rank 1 trained ${passes:-?} pass shares; killed rank 1 -> rank 0 exited in ${gone}s"
exit $fail

#!/usr/bin/env bash
# Multi-turn episodes through the real services (models/micro, one cluster):
#   1. Two single-turn jobs (vowels, len) run alone; their wall time is the baseline.
#   2. The same two jobs again, now beside a multi-turn job whose external environment
#      (examples/env_service.c) sleeps SLEEP_MS per step and keeps every episode going for
#      MIN_TURNS turns. Every job finishes; the multi-turn job's metrics show episodes of
#      MIN_TURNS turns with observation tokens (which carry no loss); the single-turn jobs take
#      at most BOUND times their baseline + SLACK_S (a slow environment holds only its own job:
#      its batches wait in the verifier while everything else flows), while the slow job's own
#      steps take far longer than theirs.
#   3. On models/tiny (pretrained on tool traces), a job with the task's built-in calculator
#      (tcalc, max 4 turns) finishes, its eval included, and its episodes called the tool.
set -euo pipefail
source tests/integration/lib.sh

SLEEP_MS=150
MIN_TURNS=2
BOUND=1.5
SLACK_S=2
SINGLE="--steps 300 --prompts 16 --group 8 --eval-every 300 --eval-n 40 --temperature 1.3"
t0=$(date +%s)
tmp=$(mktemp -d)
ENV_PID=""
cleanup() {
    [ -n "$ENV_PID" ] && { kill "$ENV_PID" 2>/dev/null || true; wait "$ENV_PID" 2>/dev/null || true; }
    cluster_down
    rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
bad() {
    echo "FAIL: $*" >&2
    fail=1
}

# Waits until every given job of TOKEN has left queued/running; prints the seconds it took.
wait_all() {
    local tok=$1 timeout=$2 start st j busy
    shift 2
    start=$EPOCHREALTIME
    for _ in $(seq 1 $((timeout * 5))); do
        busy=0
        for j in "$@"; do
            st=$(job_field "$tok" "$j" status)
            if [ "$st" = queued ] || [ "$st" = running ]; then busy=1; break; fi
        done
        if [ $busy = 0 ]; then
            awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'
            return 0
        fi
        sleep 0.2
    done
    echo "timeout"
    return 1
}

# the mean of a metrics field over a job's step entries
metric_mean() {
    "$M" metrics --token "$1" "$2" | awk -v f="\"$3\"" '{
        if (index($0, "\"step\"") == 0) next
        i = index($0, f ":"); if (i == 0) next
        v = substr($0, i + length(f) + 1); gsub(/^"/, "", v); sub(/[",}].*/, "", v); s += v; n++
    } END {if (n) printf "%.3f", s / n; else print ""}'
}

cluster_up --model models/micro >/dev/null
trap cleanup EXIT   # cluster_up installed its own
TOK=$(mk_tenant mt)

# --- 1. baseline --------------------------------------------------------------------------------
a=$(submit "$TOK" --task vowels $SINGLE)
b=$(submit "$TOK" --task len $SINGLE)
T0=$(wait_all "$TOK" 300 "$a" "$b") || bad "baseline jobs did not finish ($T0)"

# --- 2. beside a slow multi-turn job -------------------------------------------------------------
for _ in 1 2 3 4 5; do
    EP=$(free_low_port)
    "$BIN/env_service" --bind "tcp://127.0.0.1:$EP" --sleep-ms "$SLEEP_MS" --min-turns "$MIN_TURNS" 2> "$tmp/env.log" &
    ENV_PID=$!
    for _ in $(seq 1 50); do grep -q "listening on" "$tmp/env.log" 2>/dev/null && break; sleep 0.1; done
    grep -q "listening on" "$tmp/env.log" && break
    kill "$ENV_PID" 2>/dev/null || true
    wait "$ENV_PID" 2>/dev/null || true
    ENV_PID=""
done
[ -n "$ENV_PID" ] || { echo "env_service did not start"; cat "$tmp/env.log"; exit 1; }
m=$(submit "$TOK" --task tcalc --steps 8 --prompts 2 --group 2 --eval-every 8 --eval-n 4 --max-turns 3 \
        --env-endpoint "tcp://127.0.0.1:$EP")
# the slow job's first batches are at the environment when the others start
wait_for 60 grep -q "env_service: id " "$tmp/env.log" || bad "the slow job sent no request to its environment"
a2=$(submit "$TOK" --task vowels $SINGLE)
b2=$(submit "$TOK" --task len $SINGLE)
T1=$(wait_all "$TOK" 300 "$a2" "$b2") || bad "single-turn jobs beside the slow one did not finish ($T1)"
wait_all "$TOK" 300 "$m" > /dev/null || bad "the multi-turn job did not finish"
# the slow job's own duration, from its record (whole seconds)
TM=$(( $(job_field "$TOK" "$m" updated) - $(job_field "$TOK" "$m" created) ))
for j in "$a" "$b" "$a2" "$b2" "$m"; do
    st=$(job_field "$TOK" "$j" status)
    [ "$st" = done ] || bad "$j ended '$st' ($(job_field "$TOK" "$j" error))"
done
turns=$(metric_mean "$TOK" "$m" turns)
envtok=$(metric_mean "$TOK" "$m" env_tokens)
steps_m=$(job_field "$TOK" "$m" step)
requests=$(grep -c "env_service: id" "$tmp/env.log" || true)
awk -v t="$turns" -v k="$MIN_TURNS" 'BEGIN {exit !(t != "" && t + 0 >= k)}' ||
    bad "multi-turn job: mean turns per episode '$turns', expected >= $MIN_TURNS"
awk -v e="$envtok" 'BEGIN {exit !(e != "" && e + 0 > 0)}' || bad "multi-turn job: no observation tokens in its steps ('$envtok')"
awk -v a="$T0" -v b="$T1" -v f="$BOUND" -v s="$SLACK_S" 'BEGIN {exit !(b <= a * f + s)}' ||
    bad "single-turn jobs took ${T1}s beside the slow environment vs ${T0}s alone (bound ${BOUND}x + ${SLACK_S}s)"
# the slow job paid for its environment: every episode step waited SLEEP_MS at a one-at-a-time service
awk -v r="$requests" -v ms="$SLEEP_MS" 'BEGIN {exit !(r * ms / 1000 > 0.5)}' ||
    bad "the environment served only $requests requests"

# --- 3. the task's own calculator (models/tiny writes tool calls) -------------------------------
kill "$ENV_PID" 2>/dev/null || true
wait "$ENV_PID" 2>/dev/null || true
ENV_PID=""
cluster_down
cluster_up --model models/tiny >/dev/null
trap cleanup EXIT
TOK=$(mk_tenant mt2)
c=$(submit "$TOK" --task tcalc --steps 4 --prompts 4 --group 4 --eval-every 4 --eval-n 20 --max-turns 4)
TC=$(wait_all "$TOK" 300 "$c") || bad "built-in calculator job did not finish"
st=$(job_field "$TOK" "$c" status)
[ "$st" = done ] || bad "built-in calculator job ended '$st' ($(job_field "$TOK" "$c" error))"
acc=$(job_field "$TOK" "$c" eval_acc)
[ -n "$acc" ] || bad "built-in calculator job has no eval accuracy"
cturns=$(metric_mean "$TOK" "$c" turns)
cenv=$(metric_mean "$TOK" "$c" env_tokens)
awk -v t="$cturns" -v e="$cenv" 'BEGIN {exit !(t + 0 > 1 && e + 0 > 0)}' ||
    bad "built-in calculator job: no tool calls answered (turns '$cturns', observation tokens '$cenv')"

printf 'multi-turn: single-turn jobs (2 x 300 steps) %.1fs alone, %.1fs beside a %d ms/step environment (bound %sx + %ss); slow job %s steps in about %ss, %s env requests, %s turns/episode, %s observation tokens/step; built-in calculator (tiny) %s turns/episode, %s observation tokens/step, eval %s; %ds\n' \
    "$T0" "$T1" "$SLEEP_MS" "$BOUND" "$SLACK_S" "$steps_m" "$TM" "$requests" "$turns" "$envtok" "$cturns" "$cenv" "$acc" $(( $(date +%s) - t0 ))
exit $fail

#!/usr/bin/env bash
# Hostile input. While a job trains, every bound socket of the cluster (scheduler API, scheduler
# reports, verifier, trainer) takes a few hundred malformed frames from marlaas-fuzz-send,
# oversized ones included; afterwards every process is alive, the scheduler answers, the frames
# were seen and dropped, and the job finishes. Then the API refuses bad requests precisely:
# invalid specs name the field and the rule, a wrong token is refused, and one tenant can
# neither see, cancel nor download another tenant's job.
set -euo pipefail
source tests/integration/lib.sh
t0=$(date +%s)
FUZZ="$BIN/marlaas-fuzz-send"
make_tmp
up_rc=0
cluster_up --model models/micro || up_rc=$?
make_tmp   # cluster_up installed its own trap
[ "$up_rc" -eq 0 ] || { echo "bad input: marlaas up failed"; exit 1; }
# True while PID runs; a crashed service whose parent has exited stays a zombie until pid 1
# reaps it, and kill -0 would still call it alive.
proc_alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
A=$(mk_tenant alice)
B=$(mk_tenant bob)
fail=0

# --- fuzz every bound socket while a job runs -------------------------------------------------
job=$(submit "$A" --task vowels --steps 300 --prompts 16 --eval-every 300 --eval-n 100 --lr 0.003)
jb=$(submit "$B" --task pad --steps 5 --prompts 8 --eval-every 5 --eval-n 20)
st0=$(job_field "$A" "$job" status)
COUNT=${FUZZ_COUNT:-300}
# name type endpoint: the API is a ROUTER (a dealer reaches it, and reads its replies); the
# others are PULL sockets. The API fuzz carries alice's token, so valid requests reach the
# operations (invalid specs, unknown jobs) and not only the token check.
targets="api:dealer:$(envv MARLAAS_API) reports:push:$(envv MARLAAS_REPORTS)"
targets+=" verifier:push:$(envv MARLAAS_VERIFIERS) trainer:push:$(envv MARLAAS_TRAINER)"
pids=()
seed=1
tf=$(date +%s.%N)
for t in $targets; do
    name=${t%%:*} rest=${t#*:}
    type=${rest%%:*} ep=${rest#*:}
    # the links are CURVE: the fuzzer holds the API's public key, and for the internal sockets a
    # cluster member's key (an insider with a stolen key), so its frames reach the decoders
    case $name in
        api) extra=(--token "$A" --server-key "$RUN/keys/scheduler.key") ;;
        reports) extra=(--keys "$RUN/keys" --as rollout --server scheduler) ;;
        verifier) extra=(--keys "$RUN/keys" --as rollout --server verifier) ;;
        trainer) extra=(--keys "$RUN/keys" --as verifier --server trainer) ;;
    esac
    "$FUZZ" --endpoint "$ep" --type "$type" --count "$COUNT" --seed "$seed" --oversize "${extra[@]}" \
        > "$tmp/fuzz-$name.out" 2> "$tmp/fuzz-$name.err" &
    pids+=($!)
    seed=$((seed + 1))
done
i=0
for t in $targets; do
    name=${t%%:*}
    if ! wait "${pids[$i]}"; then
        echo "FAIL: marlaas-fuzz-send to the $name socket: $(cat "$tmp/fuzz-$name.out" "$tmp/fuzz-$name.err")"
        fail=1
    fi
    echo "$name: $(tail -n 1 "$tmp/fuzz-$name.out")"
    i=$((i + 1))
done
fuzz_s=$(awk -v a="$tf" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
st1=$(job_field "$A" "$job" status)
step1=$(job_field "$A" "$job" step)
echo "job $job: $st0 before the fuzzing, $st1 at step ${step1:-0} after it (${fuzz_s}s of fuzzing)"
overlap="the job ran throughout"
if [ "$st1" != running ]; then
    overlap="the job was $st1 before the fuzzing ended"
    echo "note: $overlap (it overlapped only part of the run)"
fi

# the scheduler answered the API fuzz, with well-formed replies only
api_replies=$(sed -n 's/.*; replies \([0-9]*\) to .*/\1/p' "$tmp/fuzz-api.out")
[ "${api_replies:-0}" -gt 0 ] || { echo "FAIL: the scheduler answered none of the fuzzed API requests"; fail=1; }

# every process is still there
for svc in redis scheduler verifier trainer rollout; do
    pid=$(svc_pid "$svc")
    if [ -z "$pid" ] || ! proc_alive "$pid"; then
        echo "FAIL: $svc (pid ${pid:-?}) is gone; last lines of its log:"
        tail -n 20 "$RUN/logs/$svc.log" 2>/dev/null | sed 's/^/    /'
        fail=1
    fi
done

# the frames arrived and were dropped one by one (not silently lost)
count_in() { grep -c "$2" "$RUN/logs/$1.log" 2>/dev/null || true; }
d_api=$(count_in scheduler "api: malformed request")
d_rep=$(count_in scheduler "dropped a malformed report")
d_ver=$(count_in verifier "dropped a malformed rollout batch")
d_tra=$(count_in trainer "dropped a malformed scored batch")
echo "dropped as malformed: api $d_api, reports $d_rep, verifier $d_ver, trainer $d_tra"
for n in "api:$d_api" "reports:$d_rep" "verifier:$d_ver" "trainer:$d_tra"; do
    [ "${n#*:}" -gt 0 ] || { echo "FAIL: the ${n%%:*} socket logged no malformed frame"; fail=1; }
done

# the scheduler still answers and the job finishes normally
if ! "$M" jobs --token "$A" > "$tmp/jobs.txt" 2>&1 || ! grep -q "$job" "$tmp/jobs.txt"; then
    echo "FAIL: marlaas jobs after the fuzzing: $(cat "$tmp/jobs.txt")"
    fail=1
fi
wait_jobs "$A" 90 || fail=1
wait_jobs "$B" 30 || fail=1
st=$(job_field "$A" "$job" status)
a0=$(job_field "$A" "$job" eval_acc0)
a1=$(job_field "$A" "$job" eval_acc)
echo "job $job: $st, eval $a0 -> $a1"
[ "$st" = done ] || { echo "FAIL: $job ended $st, not done: $("$M" status --token "$A" "$job" | grep '"error"' || true)"; fail=1; }

# --- API errors ---------------------------------------------------------------------------------
# expect_error WHAT PATTERN COMMAND...: the command must fail and say PATTERN on stderr.
expect_error() {
    local what=$1 pattern=$2 out rc=0
    shift 2
    out=$("$@" 2>&1 >/dev/null) || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "FAIL: $what: accepted"
        fail=1
    elif ! grep -qF -- "$pattern" <<< "$out"; then
        echo "FAIL: $what: error '$out' does not say '$pattern'"
        fail=1
    else
        api_checks=$((api_checks + 1))
    fi
}
api_checks=0
expect_error "group 1" "spec.group must be an integer in 2..256" "$M" submit --token "$A" --task vowels --group 1
expect_error "group 257" "spec.group must be an integer in 2..256" "$M" submit --token "$A" --task vowels --group 257
expect_error "unknown task" "spec.task: unknown task 'no-such-task'" "$M" submit --token "$A" --task no-such-task
echo '{"task": "vowels", "max_stepz": 10}' > "$tmp/typo.json"
expect_error "unknown field" "spec: unknown field 'max_stepz'" "$M" submit --token "$A" --spec "$tmp/typo.json"
echo '{"task": "vowels", "reward": {"endpoint": "tcp://127.0.0.1:9", "on_failure": "retry"}}' > "$tmp/onfail.json"
expect_error "reward.on_failure" 'spec.reward.on_failure must be "zero" or "fail"' \
    "$M" submit --token "$A" --spec "$tmp/onfail.json"
echo '{"task": "vowels", "reward": {"endpoint": "http://example.com"}}' > "$tmp/ep.json"
expect_error "reward.endpoint" "spec.reward.endpoint must start with tcp:// or ipc://" \
    "$M" submit --token "$A" --spec "$tmp/ep.json"
expect_error "wrong token (jobs)" "invalid token" "$M" jobs --token mt_0000000000000000000000000000000000000000
expect_error "wrong token (submit)" "invalid token" "$M" submit --token mt_wrong --task vowels
expect_error "tenant token creating tenants" "tenant_create needs the admin token" "$M" tenant create eve --token "$A"
# alice and bob's job
expect_error "status of another tenant's job" "no such job" "$M" status --token "$A" "$jb"
expect_error "cancel of another tenant's job" "no such job" "$M" cancel --token "$A" "$jb"
expect_error "adapter pull of another tenant's job" "no such job" "$M" adapter pull "$jb" -o "$tmp/stolen" --token "$A"
[ ! -e "$tmp/stolen/adapter_model.safetensors" ] || { echo "FAIL: alice downloaded bob's adapter"; fail=1; }
if "$M" jobs --token "$A" | grep -q "$jb"; then echo "FAIL: bob's job $jb is listed for alice"; fail=1; fi
stb=$(job_field "$B" "$jb" status)
[ "$stb" = done ] || { echo "FAIL: bob's job $jb is $stb, not done (touched by alice?)"; fail=1; }
# bob can download his own adapter: the refusal above is about ownership, not a broken pull
if ! "$M" adapter pull "$jb" -o "$tmp/own" --token "$B" > /dev/null 2>&1 || [ ! -s "$tmp/own/adapter_model.safetensors" ]; then
    echo "FAIL: bob cannot pull his own adapter"
    fail=1
fi
# specs against the model (micro: 128 positions) and the tenant's quotas
expect_error "max_new beyond the context" "with spec.max_new 127 it exceeds the context of 128 positions" \
    "$M" submit --token "$A" --task vowels --max-new 127
echo '{"task": "vowels", "env": {"max_context": 200}}' > "$tmp/ctx.json"
expect_error "env.max_context beyond the model" "spec.env.max_context 200 exceeds the 128 positions the rollouts serve" \
    "$M" submit --token "$A" --spec "$tmp/ctx.json"
{ echo '{"prompt": "1+1=", "answer": "2"}'; printf '{"prompt": "%0200d", "answer": "0"}\n' 0; } > "$tmp/long.jsonl"
expect_error "a dataset prompt beyond the context" "uploaded dataset:2: the prompt has" \
    "$M" submit --token "$A" --dataset "$tmp/long.jsonl" --verifier numeric
C=$("$M" tenant create carol --max-data-mb 0 --max-groups 8 | awk '/^token/{print $2}')
head -n 1 "$tmp/long.jsonl" > "$tmp/short.jsonl"
expect_error "dataset bytes over the tenant's quota" "dataset quota reached" \
    "$M" submit --token "$C" --dataset "$tmp/short.jsonl" --verifier numeric --prompts 8
expect_error "prompts over the tenant's in-flight groups" "spec.prompts 16 exceeds the tenant's max_groups 8" \
    "$M" submit --token "$C" --task vowels --prompts 16
echo "API refusals checked: $api_checks of 17"

secs=$(( $(date +%s) - t0 ))
if [ "$fail" -ne 0 ]; then
    echo "bad input: FAILED (the FAIL lines above say what); ${secs}s"
    exit 1
fi
echo "bad input: $((4 * COUNT)) fuzzed frames (oversized included) into 4 sockets in ${fuzz_s}s ($overlap) -> all 5 processes up," \
     "dropped api/reports/verifier/trainer $d_api/$d_rep/$d_ver/$d_tra, $api_replies API error replies, job $st" \
     "(eval $a0 -> $a1); $api_checks API refusals precise; ${secs}s"

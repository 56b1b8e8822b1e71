#!/usr/bin/env bash
# The trainer on a live local cluster (models/micro) when one tenant's data is hostile and when
# one tenant runs many jobs. Tenant A runs 8 small jobs, tenant B one; all train at once.
#   B9         a broken or compromised producer pushes scored batches for A's job a1 whose
#              completions hold a token outside the vocabulary, as a1's first data, which the
#              trainer would train in its next pass beside B's job and every other ready one. On
#              a secured cluster a batch of a task the scheduler did not issue is refused for its
#              missing tag before anything else (test_security.sh shows it), and a compromised
#              verifier can still alter the results of a real task; to reach the checks of the
#              data itself this cluster runs on plain links (--insecure), where the forged task
#              passes for a real one. Each batch is refused naming job, task, group, sample and field,
#              and counted (marlaas_trainer_job_invalid_batches_total); no job fails, not B's, not
#              a1 (which then trains on its own data). Before the trainer checked batches, the
#              pass holding it failed, and with it every job in it: all nine.
#   fairness   while all 9 jobs train, B's one job gets at least 45 % of the optimiser steps
#              (the trainer's passes are fair per tenant first, then per job; before, every
#              ready job stepped in every pass and B got 11 %).
# Standalone: `bash tests/integration/security_trainer.sh` from the repository root after
# `make`. Sourced (test_security.sh): call security_trainer, which returns 0 or 1 and leaves the
# caller's variables alone. Its last line states the measured figures. WINDOW (seconds over which
# the steps are counted, default 30), TASK, PROMPTS and GROUP (the jobs) may be set.
source tests/integration/lib.sh

sectr_num() { [[ "${1:-}" =~ ^[0-9]+$ ]] && echo "$1" || echo 0; }
# a job's last step and invalid batches as the trainer exports them (once a second)
sectr_step() { sectr_num "$(metric "$(svc_http trainer)" marlaas_trainer_job_step "$1" | cut -d. -f1)"; }
sectr_invalid() {
    sectr_num "$(metric "$(svc_http trainer)" marlaas_trainer_job_invalid_batches_total "$1" | cut -d. -f1)"
}
sectr_stepped() {   # sectr_stepped MIN JOB...: each job at step MIN or beyond
    local min=$1 j
    shift
    for j in "$@"; do [ "$(sectr_step "$j")" -ge "$min" ] || return 1; done
}
sectr_steps() {   # the sum of the jobs' steps
    local s=0 j
    for j in "$@"; do s=$((s + $(sectr_step "$j"))); done
    echo "$s"
}
sectr_invalid_at_least() { [ "$(sectr_invalid "$1")" -ge "$2" ]; }

# One "scored" batch (common/net/proto.c) of a job's shape (prompts groups of group samples) at
# adapter version 0, well-formed on the wire; every completion holds token 500 (models/micro has
# 98 tokens). sectr_forge JOB PROMPTS GROUP TASK_ID FILE
sectr_forge() {
    python3 - "$@" <<'PY'
import struct, sys
sys.path.insert(0, "tests/integration")
from msgpack_enc import enc
job, prompts, group, task, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sample = lambda k: {"tok": [40, 500, 10], "lp": struct.pack('<3f', -1.0, -1.0, -1.0), "text": "x", "fin": 1,
                    "r": float(k % 2), "fail": False}
groups = [{"i": 900000 + g, "p": [3, 4, 5, 6, 7, 8, 9], "s": [sample(k) for k in range(group)]}
          for g in range(prompts)]
msg = {"t": "scored", "v": 1, "task": task, "job": job, "ver": 0, "kind": 0, "temp": 1.0, "worker": "forged",
       "gen_s": 0.0, "groups": groups}
open(out, 'wb').write(enc(msg))
PY
}

security_trainer() {
    local fail=0 window=${WINDOW:-30} prompts=${PROMPTS:-4} group=${GROUP:-8} t0=$EPOCHREALTIME
    local A B BJ a1 j st da db a0 b0 share n_bad failed=0 secs task=$(((1 << 62) + 17))
    local -a spec AJ=()
    cluster_up --model models/micro --insecure > /dev/null 2>&1 || { echo "FAILED: marlaas up"; return 1; }
    make_tmp   # cluster_up installed its own trap
    A=$(mk_tenant alice 2> /dev/null)
    B=$(mk_tenant bob 2> /dev/null)
    # small jobs (all nine fit one pass of 2048 rows) that run longer than the test (cancelled at
    # its end): A's a2..a8 and B's job first
    spec=(--task "${TASK:-vowels}" --steps 10000 --prompts "$prompts" --group "$group" --staleness 2 --eval-every 10000
        --eval-n 8)
    for _ in 2 3 4 5 6 7 8; do AJ+=("$(submit "$A" "${spec[@]}")"); done
    BJ=$(submit "$B" "${spec[@]}")
    check "every job has stepped" wait_for 90 sectr_stepped 1 "${AJ[@]}" "$BJ"

    # --- B9 ------------------------------------------------------------------------------------
    # a1 joins and the producer pushes a1's first data at once. a1's reward service
    # does not answer (each of a1's real batches waits 2 x 2 s at the verifier, then is scored 0),
    # so the pushed batch is the first the trainer has of a1.
    a1=$(submit "$A" "${spec[@]}" --reward-endpoint "tcp://127.0.0.1:$(free_low_port)")
    AJ=("$a1" "${AJ[@]}")
    sectr_forge "$a1" "$prompts" "$group" "$task" "$tmp/bad.msgpack"
    b0=$(sectr_step "$BJ")
    "$BIN/marlaas-fuzz-send" --endpoint "$(envv MARLAAS_TRAINER)" --type push --count 3 --file "$tmp/bad.msgpack" \
        --wait-ms 500 > "$tmp/fuzz.out" 2>&1 ||
        { echo "FAILED: the push: $(cat "$tmp/fuzz.out")"; fail=1; }
    check "the trainer refused the 3 invalid batches of $a1 and counted them" wait_for 10 sectr_invalid_at_least "$a1" 3
    n_bad=$(sectr_invalid "$a1")
    check "the refusal names the job, task, group, sample and field" grep -q \
        "invalid data: job $a1 task $task group 0 sample 0: completion token tok\[1\] = 500 is outside the vocabulary" \
        "$RUN/logs/trainer.log"
    check "B's job goes on stepping after the attack" wait_for 60 sectr_stepped $((b0 + 3)) "$BJ"
    check "a1 trains on its own data" wait_for 60 sectr_stepped 1 "$a1"

    # --- fairness: each tenant's steps over a window while all 9 jobs train ---------------------
    a0=$(sectr_steps "${AJ[@]}") b0=$(sectr_step "$BJ")
    sleep "$window"
    da=$(($(sectr_steps "${AJ[@]}") - a0)) db=$(($(sectr_step "$BJ") - b0))
    share=$(awk -v a="$da" -v b="$db" 'BEGIN {printf "%.1f", (a + b > 0 ? 100 * b / (a + b) : 0)}')
    check "tenant B's one job got $share % of the steps (A's 8 jobs $da, B's $db in $window s); at least 45 %" \
        awk -v s="$share" 'BEGIN {exit !(s >= 45)}'
    check "steps were taken in the window ($da + $db)" [ $((da + db)) -ge 20 ]

    # no job failed: none of A's, not B's
    for j in "${AJ[@]}" "$BJ"; do
        st=$(job_field "$([ "$j" = "$BJ" ] && echo "$B" || echo "$A")" "$j" status)
        if [ "$st" != running ]; then
            echo "FAILED: job $j ($([ "$j" = "$BJ" ] && echo B || echo A)) is '$st'"
            failed=$((failed + 1)) fail=1
        fi
    done
    for j in "${AJ[@]}"; do "$M" cancel "$j" --token "$A" > /dev/null; done
    "$M" cancel "$BJ" --token "$B" > /dev/null
    secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.0f", b - a}')
    cluster_down
    RUN=
    [ $fail = 0 ] && echo "security_trainer: B9: $n_bad invalid batches of A's job refused and counted, $failed jobs" \
        "failed; fairness: tenant B's 1 job got $share % of the steps beside tenant A's 8 jobs ($db vs $da in" \
        "$window s); ${secs} s"
    return $fail
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -uo pipefail   # every outcome is checked
    security_trainer
    exit $?
fi

#!/usr/bin/env bash
# Attacks from the network on a live local cluster, by a process that holds none of the
# cluster's keys. The same attacks run twice: against a default `marlaas up` (CURVE on every
# link), where each must fail, and against `marlaas up --insecure`, where each must succeed (so
# that the test can fail). Meanwhile a tenant's job trains; it must finish in both.
#   steal      a PULL socket on the work port takes the tasks meant for the rollouts (B6)
#   listen     SUB sockets on the job and adapter event ports read every tenant's events (B6)
#   forge      frames pushed to the scheduler's reports, the verifiers' and the trainer's ports
#              reach their decoders (B4, B5; counted by marlaas_messages_rejected_total)
#   stranger   the same pushes with a CURVE keypair of the attacker's own, holding the real
#              public keys of the servers (public keys are not secret)
#   junk       for 6 s, ten TCP connections a second write 2 KB of random bytes to the work port
#              and close (B1): the job keeps stepping meanwhile ("junk_stall" 0)
#   plain API  a client without CURVE asks the API for the tenant's jobs
#   slow HTTP  64 connections trickle bytes into the services' HTTP ports (B2): /healthz of
#              every service answers within 1 s all the same
# and those of an insider holding the cluster's keys (a compromised pod), where the receivers'
# own state must refuse what the keys let through:
#   insider    well-formed scored batches for the tenant's job, with made-up task ids and the
#              job's current version, pushed to the trainer with the verifier's key (B4): the
#              trainer takes none of them (no task tag); plain links take them all
#   fake_step  a step report claiming step and version 1,000,000 for the job, pushed to the
#              scheduler with the trainer's key (B5): refused, the store holds no such version
# The refused frames of the insecure run also show that rejections are logged a few lines per
# reason, not one line per frame.
set -uo pipefail   # every outcome is checked below; an attack tool that fails is an outcome
source tests/integration/lib.sh
FUZZ="$BIN/marlaas-fuzz-send"
make_tmp
fail=0
num() { [[ "${1:-}" =~ ^[0-9]+$ ]] && echo "$1" || echo 0; }
rejected() { num "$(metric "$(svc_http "$1")" marlaas_messages_rejected_total | cut -d. -f1)"; }
stepped() { [ "$(num "$(job_field "$A" "$J" step)")" -ge 1 ]; }
received() { sed -n 's/^received \([0-9]*\) frames.*/\1/p' <<< "$1"; }

# attack MODE: runs every attack against the cluster in $RUN; prints one line per attack
# "NAME N" with N the frames, events or replies the attacker got through
attack() {
    local w e te rp vf tr r0 r1 out
    w=$(envv MARLAAS_WORK) e=$(envv MARLAAS_EVENTS) te=$(envv MARLAAS_TRAINER_EVENTS)
    rp=$(envv MARLAAS_REPORTS) vf=$(envv MARLAAS_VERIFIERS) tr=$(envv MARLAAS_TRAINER)
    # listening first: a thief on the work port stalls the job until its leases run out
    "$FUZZ" --endpoint "$e" --type sub --wait-ms 4000 > "$tmp/sub-events" &
    out=$("$FUZZ" --endpoint "$te" --type sub --wait-ms 4000)
    wait
    echo "listen $(( $(received "$out") + $(received "$(cat "$tmp/sub-events")") ))"
    out=$("$FUZZ" --endpoint "$w" --type pull --wait-ms 4000)
    echo "steal $(received "$out")"
    # forged frames: the sum of what the three receivers counted as refused input
    local total=0
    for t in "scheduler $rp" "verifier $vf" "trainer $tr"; do
        set -- $t
        r0=$(rejected "$1")
        "$FUZZ" --endpoint "$2" --type push --count 100 --seed 3 --wait-ms 500 --send-timeout-ms 50 > /dev/null
        sleep 1.5   # the counters are exported once a second
        r1=$(rejected "$1")
        total=$((total + r1 - r0))
    done
    echo "forge $total"
    # a keypair of the attacker's own with the servers' real public keys
    rm -rf "$tmp/att"
    "$M" keys generate "$tmp/att" > /dev/null
    cp "$RUN/keys/scheduler.key" "$RUN/keys/verifier.key" "$RUN/keys/trainer.key" "$tmp/att/" 2>/dev/null || true
    total=0
    for t in "scheduler $rp" "verifier $vf" "trainer $tr"; do
        set -- $t
        r0=$(rejected "$1")
        "$FUZZ" --endpoint "$2" --type push --count 100 --seed 4 --wait-ms 500 --send-timeout-ms 50 --keys "$tmp/att" --as rollout \
            --server "$1" > /dev/null
        sleep 1.5
        r1=$(rejected "$1")
        total=$((total + r1 - r0))
    done
    echo "stranger $total"
    # junk on the work port: the job must keep stepping while it lasts
    local j0 j1
    j0=$(num "$(job_field "$A" "$J" step)")
    python3 - "$w" <<'PY' 2> /dev/null
import os, socket, sys, time
host, port = sys.argv[1].rsplit("/", 1)[-1].rsplit(":", 1)
end = time.time() + 6
while time.time() < end:
    for _ in range(10):
        try:
            c = socket.create_connection((host, int(port)), timeout=1)
            c.sendall(os.urandom(2048))
            c.close()
        except OSError:
            pass
    time.sleep(1)
PY
    j1=$(num "$(job_field "$A" "$J" step)")
    echo "junk_stall $([ "$j1" -gt "$j0" ] && echo 0 || echo 1)"
    # a client without CURVE: no key, told plain
    if MARLAAS_RUN_DIR=/nonexistent MARLAAS_API="$(envv MARLAAS_API)" MARLAAS_INSECURE=1 \
        "$M" jobs --token "$A" > "$tmp/plain.out" 2>&1; then
        echo "plain_api 1"
    else
        echo "plain_api 0"
    fi
    # slow HTTP clients: 64 connections trickle header bytes; every probe still answers in 1 s
    # (one process holds the 64 connections: the attacker's own CPU use stays small beside the
    # services')
    local pid port slow=0
    python3 - $(awk '{print $2}' "$RUN/http" | cut -d: -f2) <<'PY' 2> /dev/null &
import socket, sys, time
conns = []
for port in sys.argv[1:]:
    for _ in range(16):
        try: conns.append(socket.create_connection(("127.0.0.1", int(port)), timeout=2))
        except OSError: pass
for _ in range(20):
    for c in conns:
        try: c.send(b"X")
        except OSError: pass
    time.sleep(0.5)
PY
    pid=$!
    sleep 2
    for port in $(awk '{print $2}' "$RUN/http" | cut -d: -f2); do
        curl -sf --max-time 1 "http://127.0.0.1:$port/healthz" > /dev/null || slow=$((slow + 1))
    done
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    echo "slow_http $slow"
    # an insider: the cluster's own keys (secure) or none (plain links)
    local as_ver=() as_tr=() ver n
    if [ "$mode" = secure ]; then
        as_ver=(--keys "$RUN/keys" --as verifier --server trainer)
        as_tr=(--keys "$RUN/keys" --as trainer --server scheduler)
    fi
    ver=$(num "$(job_field "$A" "$J" adapter_version)")
    forge_frames "$J" "$ver" "$tmp/forged"
    r0=$(rejected trainer)
    n=0
    for f in "$tmp"/forged/batch-*.msgpack; do
        "$FUZZ" --endpoint "$tr" --type push --count 1 --file "$f" --wait-ms 200 --send-timeout-ms 200 "${as_ver[@]}" \
            > /dev/null && n=$((n + 1))
    done
    sleep 1.5
    r1=$(rejected trainer)
    echo "insider $((n - (r1 - r0)))"
    r0=$(rejected scheduler)
    "$FUZZ" --endpoint "$rp" --type push --count 1 --file "$tmp/forged/step.msgpack" --wait-ms 200 \
        --send-timeout-ms 200 "${as_tr[@]}" > /dev/null
    sleep 1.5
    r1=$(rejected scheduler)
    local v2
    v2=$(num "$(job_field "$A" "$J" adapter_version)")
    echo "fake_step $([ "$v2" -ge 1000000 ] && echo 1 || echo 0)"
    echo "fake_step_refused $((r1 - r0))"
}

# forge_frames JOB VERSION DIR: well-formed frames an insider could build (common/net/proto.c's
# layout): 6 "scored" batches of one group each for JOB at VERSION (tokens inside the micro
# model's vocabulary, log-probs < 0, rewards 1, made-up task ids, no tag), and a "report" of a
# step 1,000,000 at version 1,000,000.
forge_frames() {
    mkdir -p "$3"
    python3 - "$@" <<'PY'
import struct, sys
sys.path.insert(0, "tests/integration")
from msgpack_enc import enc
job, ver, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sample = {"tok": [40, 41, 42], "lp": struct.pack('<3f', -0.5, -0.5, -0.5), "text": "abc", "fin": 1, "r": 1.0,
          "fail": False}
for b in range(6):
    msg = {"t": "scored", "v": 1, "task": (1 << 61) + 1000 * b + 7, "job": job, "ver": ver, "kind": 0, "temp": 1.0,
           "worker": "insider", "gen_s": 0.0,
           "groups": [{"i": 700000 + b, "p": [3, 4, 5, 6, 7], "s": [sample] * 8}]}
    open(f"{out}/batch-{b}.msgpack", "wb").write(enc(msg))
rep = {"t": "report", "v": 1, "kind": 2, "job": job, "src": "insider", "task": 0, "tk": 0, "n": 0, "rsum": 0.0,
       "correct": 0, "errors": 0, "step": 1000000, "ver": 1000000, "error": None}
open(f"{out}/step.msgpack", "wb").write(enc(rep))
PY
}

run_mode() {   # run_mode secure|insecure
    local mode=$1 flags=()
    [ "$mode" = insecure ] && flags=(--insecure)
    cluster_up --model models/micro "${flags[@]}" > "$tmp/up-$mode.log" 2>&1 || { cat "$tmp/up-$mode.log"; return 1; }
    make_tmp   # cluster_up installed its own trap
    A=$(mk_tenant alice)
    # J keeps work in flight during the attacks (cancelled after them; at ~100 steps/s 100,000
    # steps outlast the test); K must finish
    J=$(submit "$A" --task vowels --steps 100000 --prompts 8 --eval-every 100000 --eval-n 16)
    K=$(submit "$A" --task pad --steps 15 --prompts 8 --eval-every 15 --eval-n 16)
    wait_for 60 stepped || echo "(job $J had not stepped before the attacks)"
    # J's step rate over 10 s before the attacks, while they run and 10 s after them (a job's
    # rate drifts as it learns: the attacks are judged against the rates on either side)
    local s0 s1 s2 s3 t0 t1 t2 t3
    s0=$(num "$(job_field "$A" "$J" step)") t0=$(date +%s.%N)
    sleep 10
    s1=$(num "$(job_field "$A" "$J" step)") t1=$(date +%s.%N)
    attack > "$tmp/$mode.txt"
    s2=$(num "$(job_field "$A" "$J" step)") t2=$(date +%s.%N)
    sleep 10
    s3=$(num "$(job_field "$A" "$J" step)") t3=$(date +%s.%N)
    awk -v a="$((s1 - s0))" -v b="$((s2 - s1))" -v c="$((s3 - s2))" -v w="$t0" -v x="$t1" -v y="$t2" -v z="$t3" \
        'BEGIN{printf "rate_before %.3f\nrate_during %.3f\nrate_after %.3f\n", a / (x - w), b / (y - x), c / (z - y)}' \
        >> "$tmp/$mode.txt"
    "$M" cancel "$J" --token "$A" > /dev/null
    wait_jobs "$A" 600 || true
    echo "job $(job_field "$A" "$K" status)" >> "$tmp/$mode.txt"
    # a flood of refused frames costs a few log lines, not one per frame
    echo "log_lines $(cat "$RUN"/logs/{scheduler,verifier,trainer}.log | grep -c 'dropped a malformed')" >> "$tmp/$mode.txt"
    cluster_down
    RUN=
}

run_mode secure
run_mode insecure
# tenants' attacks through their own reward services (B7 spoofing, B8 endpoint exhaustion, the
# endpoint rules) on a cluster of their own
bash tests/integration/security_reward.sh > "$tmp/reward.txt" 2>&1
reward_rc=$?
# the trainer: one tenant's invalid data (B9) and per-tenant fairness of its passes
bash tests/integration/security_trainer.sh > "$tmp/trainer.txt" 2>&1
trainer_rc=$?
got() { awk -v k="$2" '$1==k{print $2}' "$tmp/$1.txt"; }
printf '%-9s %8s %8s\n' attack secure insecure
for a in steal listen forge stranger junk_stall plain_api slow_http insider fake_step; do
    printf '%-9s %8s %8s\n' "$a" "$(got secure $a)" "$(got insecure $a)"
    check "secure cluster: $a got nothing through ($(got secure $a))" [ "$(got secure $a)" = 0 ]
done
# the attacks succeed on plain links (the test can fail); the stranger's key is not even needed there
for a in steal listen forge plain_api insider; do
    check "insecure cluster: $a gets through ($(got insecure $a))" [ "$(num "$(got insecure $a)")" -gt 0 ]
done
check "the forged step report was refused on both clusters ($(got secure fake_step_refused), $(got insecure fake_step_refused))" \
    [ "$(num "$(got secure fake_step_refused)")" -ge 1 -a "$(num "$(got insecure fake_step_refused)")" -ge 1 ]
rb=$(got secure rate_before) rd=$(got secure rate_during) ra=$(got secure rate_after)
# The attackers run on the same two cores as the cluster, so the job loses the CPU they take:
# measured during / before 0.68-0.88 over six runs (the same at the start of this check's
# history, where a slow spell after the attacks hid it behind "the lower of the others"). A
# flood that stalled the job (a loop on refused frames, a queue that fills) falls far below.
check "the tenant's job kept its step rate under the attacks on the secure cluster ($rb, $rd, $ra steps/s before, during, after; during >= 60 % of the lower of the others)" \
    awk -v b="$rb" -v d="$rd" -v a="$ra" 'BEGIN{m = a < b ? a : b; exit !(m > 0 && d >= 0.60 * m)}'
check "the tenant's job finished on the secure cluster ($(got secure job))" [ "$(got secure job)" = done ]
check "the tenant's job finished on the insecure cluster ($(got insecure job))" [ "$(got insecure job)" = done ]
check "$(got insecure forge) refused frames logged in at most 30 lines ($(got insecure log_lines))" \
    [ "$(num "$(got insecure log_lines)")" -le 30 ]
grep -E '^(B7|B8|allow-list|FAILED)' "$tmp/reward.txt"
check "tenants' reward services: $(tail -n 1 "$tmp/reward.txt")" [ "$reward_rc" = 0 ]
grep -E '^(FAILED|FAIL)' "$tmp/trainer.txt"
check "the trainer: $(tail -n 1 "$tmp/trainer.txt")" [ "$trainer_rc" = 0 ]
[ $fail = 0 ] && echo "security: without a key of the cluster, steal/listen/forge/stranger/plain API got 0 through" \
    "(insecure: $(got insecure steal) tasks, $(got insecure listen) events, $(got insecure forge) frames, API answered);" \
    "with the cluster's keys, 0 forged training batches used (insecure: $(got insecure insider) of 6) and the forged" \
    "step report refused; job step rate $rb / $rd / $ra steps/s before / during / after the attacks; $(tail -n 1 "$tmp/reward.txt");" \
    "$(tail -n 1 "$tmp/trainer.txt")"
exit $fail

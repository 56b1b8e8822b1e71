#!/usr/bin/env bash
# A simulated cluster (docs/SIMULATOR.md): every service with --backend sim:h100 on the
# Qwen3-8B-shaped folder models/sim/qwen3-8b (no weights), two rollout replicas, the real
# scheduler, verifier, trainer bookkeeping, Redis and ZeroMQ. Three jobs of two tenants on the
# simulated tasks run to the end: rewards and the greedy eval rise along the tasks' learning
# curves, both rollout replicas generate, the services report the modelled device. Then what must
# be refused: a simulated job's adapter (no weights) for download, a simulated task on a real
# cluster, a real-backend service on a folder without weights, a simulated service on an unknown
# device or with a bad setting. The trainer holds 2 jobs (max_jobs): the scheduler learns it from
# the trainer's heartbeat and runs at most 2 of the 3 jobs at once, so the trainer refuses nothing.
set -euo pipefail
source tests/integration/lib.sh
fail=0

export MARLAAS_SIM_SCALE=600 MARLAAS_SIM_LENGTHS=lognormal:120,0.8 MARLAAS_CHUNK=1 MARLAAS_MAX_JOBS=2
cluster_up --model models/sim/qwen3-8b --backend sim:h100 --rollouts 2 > /dev/null
# the scheduler reads the trainers' heartbeats every second
check "the scheduler knows the trainer's 2 job slots" wait_for 10 grep -q "async admission: at most 2 jobs running at once" "$RUN/logs/scheduler.log"
A=$(mk_tenant alice)
B=$(mk_tenant bob)
SPEC=(--steps 15 --prompts 4 --group 8 --max-new 512 --eval-every 15 --eval-n 64)
J1=$(submit "$A" --task sim-easy "${SPEC[@]}")
J2=$(submit "$A" --task sim-hard "${SPEC[@]}")
J3=$(submit "$B" --task sim-medium "${SPEC[@]}")
wait_jobs "$A" 240
wait_jobs "$B" 240
for jt in "$A $J1" "$A $J2" "$B $J3"; do
    read -r tok job <<< "$jt"
    st=$(job_field "$tok" "$job" status)
    a0=$(job_field "$tok" "$job" eval_acc0)
    a1=$(job_field "$tok" "$job" eval_acc)
    echo "$job: $st, eval $a0 -> $a1"
    check "$job finished ($st)" test "$st" = done
done
# at most 2 running at once: the scheduler's status lines in order, counting running - ended
most=$(awk '/ status running/ {n++; if (n > m) m = n} / status (done|failed|cancelled)/ {n--} END {print m + 0}' "$RUN/logs/scheduler.log")
check "at most 2 jobs ran at once ($most)" test "$most" -eq 2
check "the trainer refused no job for lack of slots" bash -c "! grep -q 'jobs with pending data' '$RUN/logs/trainer.log'"
# sim-easy rises from 0.30 towards 0.95 (15 steps: 0.30 + 0.65 (1 - e^-1) = 0.71); sim-hard from
# 0.05 towards 0.60 (0.05 + 0.55 (1 - e^-0.25) = 0.17): 64 eval examples tell both apart
a0=$(job_field "$A" "$J1" eval_acc0) a1=$(job_field "$A" "$J1" eval_acc)
check "sim-easy's eval rises by more than 25 points ($a0 -> $a1)" awk -v a="$a0" -v b="$a1" 'BEGIN {exit !(b - a > 0.25)}'
h1=$(job_field "$A" "$J2" eval_acc)
check "sim-hard ends below sim-easy ($h1 < $a1)" awk -v a="$h1" -v b="$a1" 'BEGIN {exit !(a < b)}'
# the training rewards of sim-easy: the last three steps above the first three
read -r r0 r1 < <(grep "job=$J1 step=" "$RUN/logs/trainer.log" | sed 's/.*reward=\([0-9.]*\).*/\1/' |
    awk '{r[NR] = $1} END {print (r[1] + r[2] + r[3]) / 3, (r[NR] + r[NR - 1] + r[NR - 2]) / 3}')
check "sim-easy's rewards rise ($r0 -> $r1)" awk -v a="$r0" -v b="$r1" 'BEGIN {exit !(b > a + 0.15)}'
check "the rollouts report the modelled device" grep -q "simulated device h100: 989 TFLOP/s, 3.35 TB/s, 80 GB (bf16 weights 16.4 GB" "$RUN/logs/rollout.log"
check "the second rollout replica started" grep -q "simulated device h100" "$RUN/logs/rollout2.log"
for f in "$RUN"/logs/rollout.log "$RUN"/logs/rollout2.log; do
    n=$(grep -c "ready:" "$f" || true)
    check "$(basename "$f") is ready" test "$n" -ge 1
done
# both replicas generated: each one's heartbeat counts tokens
REDIS_PORT=$(sed -n 's/^MARLAAS_REDIS=.*:\([0-9]*\)$/\1/p' "$RUN/env")
export REDISCLI_AUTH=$(sed -n 's/^MARLAAS_REDIS_PASSWORD=//p' "$RUN/env")
busy=0
for k in $(redis-cli -p "$REDIS_PORT" --scan --pattern '*svc:rollout:*'); do
    t=$(redis-cli -p "$REDIS_PORT" --raw hget "$k" tokens)
    echo "$k: $t tokens"
    [ "${t:-0}" -gt 10000 ] && busy=$((busy + 1))
done
check "both rollout replicas generated ($busy of 2)" test "$busy" -eq 2

# a simulated job's adapter has no weights: pull refuses it and says why
out=$("$M" adapter pull --token "$A" "$J1" --out "$RUN/pulled" 2>&1) && bad=0 || bad=1
echo "adapter pull: $out"
check "adapter pull of a simulated job refused" test "$bad" = 1
check "adapter pull says why" grep -q "simulated" <<< "$out"
# a simulated task needs a simulated cluster: the scheduler refuses it on a real one
cluster_down
unset MARLAAS_SIM_SCALE MARLAAS_SIM_LENGTHS MARLAAS_CHUNK MARLAAS_MAX_JOBS
cluster_up --model models/micro > /dev/null
C=$(mk_tenant carol)
out=$(submit "$C" --task sim-easy --steps 5 2>&1) && ok=1 || ok=0
echo "sim-easy on a real cluster: $out"
check "sim-easy refused on a real cluster" test "$ok" = 0
check "the refusal names the simulated cluster" grep -q "simulated cluster" <<< "$out"
# services refuse what cannot run, with the reason, before starting (the cluster's settings,
# another model folder)
svc() {
    local name=$1
    shift
    (
        set -a
        . "$RUN/env"
        set +a
        export MARLAAS_MODEL=models/sim/qwen3-8b MARLAAS_HTTP=0
        exec timeout 20 "$BIN/marlaas-$name" "$@"
    ) 2>&1
}
out=$(svc rollout --backend cpu) && rc=0 || rc=$?
check "a cpu rollout on a folder without weights exits ($rc)" test "$rc" -ne 0
check "... naming the missing weights" grep -q "safetensors" <<< "$out"
out=$(svc rollout --backend sim:tpu9) && rc=0 || rc=$?
check "an unknown simulated device is refused ($rc)" test "$rc" -ne 0
check "... naming the known ones" grep -q "known: .*h100" <<< "$out"
out=$(svc trainer --backend sim:h100 --set sim_devices=0) && rc=0 || rc=$?
check "sim_devices=0 is refused ($rc)" test "$rc" -ne 0
check "... naming the setting" grep -q "sim_devices" <<< "$out"
out=$(svc scheduler --set max_running=lots) && rc=0 || rc=$?
check "max_running=lots is refused ($rc)" test "$rc" -ne 0
check "... naming the setting" grep -q "max_running" <<< "$out"
out=$(svc rollout --backend sim:h100 --set sim_lengths=pareto:2) && rc=0 || rc=$?
check "a bad length distribution is refused ($rc)" test "$rc" -ne 0
check "... with the forms it takes" grep -q "lognormal:MEDIAN,SIGMA" <<< "$out"
out=$(svc rollout --backend sim:h100 --set sim_coalesce_s=-1) && rc=0 || rc=$?
check "sim_coalesce_s=-1 is refused ($rc)" test "$rc" -ne 0
check "... naming the setting" grep -q "sim_coalesce_s" <<< "$out"
[ "$fail" = 0 ] && echo "simulated cluster: 3 jobs trained along their curves on 2 simulated H100 rollouts; refusals hold"
exit "$fail"

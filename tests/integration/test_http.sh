#!/usr/bin/env bash
# Every service serves GET /healthz, /readyz and /metrics (Prometheus text) on its own HTTP port.
# A real cluster trains a job on models/micro while this test scrapes each service with curl:
# the counters are live (they grow between two scrapes during the run: tokens, samples, steps,
# the job's step), the per-job series carry the job id, and after the run they agree with the
# job (trainer and scheduler at the final step, every training sample scored). Then readiness
# follows Redis (paused with SIGSTOP: /readyz 503 naming Redis, /healthz still 200; resumed:
# ready again), unknown paths get 404 and other methods 405, and a service whose HTTP port is
# taken or malformed exits with a message saying what to set.
set -euo pipefail
source tests/integration/lib.sh
fail=0
gt() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN {exit !(a + 0 > b + 0)}'; }
ge() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN {exit !(a + 0 >= b + 0)}'; }
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@"; }
code_is() { [ "$(code "${@:2}")" = "$1" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }

cluster_up --model models/micro
SCH=$(svc_http scheduler) ROL=$(svc_http rollout) VER=$(svc_http verifier) TRA=$(svc_http trainer)

# readiness comes within a few seconds of "up" (first heartbeat, first verifier resolution)
for svc in scheduler rollout verifier trainer; do
    addr=$(svc_http $svc)
    check "$svc /readyz 200 within 10 s" wait_for 10 code_is 200 "http://$addr/readyz"
    check "$svc /healthz 200" [ "$(code "http://$addr/healthz")" = 200 ]
    check "$svc /metrics names the service" \
        sh -c "curl -sf --max-time 5 http://$addr/metrics | grep -q '^marlaas_info{service=\"$svc\",id=\"'"
    check "$svc /nope 404" [ "$(code "http://$addr/nope")" = 404 ]
    check "$svc POST 405" [ "$(code -X POST -d x "http://$addr/metrics")" = 405 ]
done
# the container image's health check (bash only, no curl): ok on a ready service, not on a closed port
check "image probe: ready scheduler" bash deploy/docker/entrypoint.sh probe "${SCH##*:}" /readyz
check "image probe: closed port fails" sh -c "! bash deploy/docker/entrypoint.sh probe $(free_low_port) 2>/dev/null"
check "image probe: 404 path fails" sh -c "! bash deploy/docker/entrypoint.sh probe ${SCH##*:} /nope 2>/dev/null"
# Prometheus text format: every sample line belongs to a family announced by # TYPE
check "metrics are well-formed" sh -c "curl -sf http://$TRA/metrics | awk '
    /^# TYPE /{t[\$3]=1; next} /^#/{next}
    {n=\$1; sub(/\\{.*/, \"\", n); if (!(n in t) || NF != 2) bad=1}
    END{exit bad}'"

T=$(mk_tenant metrics)
STEPS=800
job=$(submit "$T" --task vowels --steps $STEPS --prompts 16 --group 8 --eval-every 0 --eval-n 64)
# two scrapes during the run, once training has started: the second as soon as every counter has
# moved past the first (the services export every 2 s), within 30 s
training() { gt "$(metric "$TRA" marlaas_trainer_job_step "$job")" 2 && gt "$(metric "$SCH" marlaas_scheduler_job_step "$job")" 0; }
wait_for 20 training || true   # the checks below say what did not move
scrape() {
    r2=$(metric "$ROL" marlaas_rollout_tokens_total); v2=$(metric "$VER" marlaas_verifier_samples_total)
    t2=$(metric "$TRA" marlaas_trainer_steps_total); s2=$(metric "$SCH" marlaas_scheduler_job_step "$job")
    rj2=$(metric "$ROL" marlaas_rollout_job_tokens_total "$job"); vj2=$(metric "$VER" marlaas_verifier_job_samples_total "$job")
}
grown() {
    scrape
    gt "$r2" "$r1" && gt "$rj2" "$rj1" && gt "$v2" "$v1" && gt "$vj2" "$vj1" && gt "$t2" "$t1" && gt "$s2" "$s1"
}
scrape
r1=$r2 v1=$v2 t1=$t2 s1=$s2 rj1=$rj2 vj1=$vj2 t_scrape=$EPOCHREALTIME
wait_for 30 grown || true   # the checks below say which counter did not grow
dt_scrape=$(awk -v a="$t_scrape" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
echo "during the run ($dt_scrape s apart): rollout tokens $r1 -> $r2, job tokens $rj1 -> $rj2; verifier samples $v1 -> $v2," \
     "job $vj1 -> $vj2; trainer steps $t1 -> $t2; scheduler job step $s1 -> $s2"
check "rollout tokens grow" gt "$r2" "$r1"
check "rollout job tokens grow" gt "$rj2" "$rj1"
check "verifier samples grow" gt "$v2" "$v1"
check "verifier job samples grow" gt "$vj2" "$vj1"
check "trainer steps grow" gt "$t2" "$t1"
check "scheduler job step grows" gt "$s2" "$s1"
tps=$(metric "$ROL" marlaas_rollout_tokens_per_second); busy=$(metric "$TRA" marlaas_busy_fraction)
echo "rollout tokens/s $tps, trainer busy fraction $busy"
check "rollout tokens/s > 0" gt "$tps" 0
check "trainer busy fraction in (0, 1.05]" sh -c "awk -v b='$busy' 'BEGIN {exit !(b > 0 && b <= 1.05)}'"
check "rollout sees a verifier" [ "$(metric "$ROL" marlaas_rollout_verifiers)" = 1 ]
check "scheduler: the job is running" [ "$(metric "$SCH" marlaas_scheduler_job_running "$job")" = 1 ]
recent() { awk -v a="${1:-}" 'BEGIN {exit !(a != "" && a + 0 >= 0 && a + 0 < 5)}'; }
for addr in "$SCH" "$ROL" "$VER" "$TRA"; do
    check "$addr: main loop turned within 5 s (marlaas_loop_age_seconds)" recent "$(metric "$addr" marlaas_loop_age_seconds)"
done

wait_jobs "$T" 300
# the services' next exports carry the job's end (every 2 s)
settled() {
    st=$(metric "$TRA" marlaas_trainer_job_step "$job"); ss=$(metric "$SCH" marlaas_scheduler_job_step "$job")
    vs=$(metric "$VER" marlaas_verifier_job_samples_total "$job"); active=$(metric "$SCH" marlaas_scheduler_job_active "$job")
    [ "$st" = $STEPS ] && [ "$ss" = $STEPS ] && [ "$active" = 0 ] && ge "$vs" $((STEPS * 16 * 8))
}
wait_for 15 settled || true   # the checks below say which value is off
echo "after the run: trainer job step $st, scheduler job step $ss (active $active), verifier job samples $vs"
check "job done" [ "$(job_field "$T" "$job" status)" = done ]
check "trainer at the final step" [ "$st" = $STEPS ]
check "scheduler at the final step" [ "$ss" = $STEPS ]
check "scheduler job no longer active" [ "$active" = 0 ]
check "scheduler job no longer running" [ "$(metric "$SCH" marlaas_scheduler_job_running "$job")" = 0 ]
check "every training sample scored" ge "$vs" $((STEPS * 16 * 8))
check "no errors in the trainer" [ "$(metric "$TRA" marlaas_errors_total)" = 0 ]
check "API requests counted" gt "$(metric "$SCH" marlaas_api_requests_total)" 2

# readiness follows Redis; liveness does not
# (an extra verifier, to be stopped while Redis does not answer)
XP=$(free_low_port)
(set -a; . "$RUN/env"; set +a; MARLAAS_HTTP=0 MARLAAS_VERIFIERS="tcp://127.0.0.1:$XP" exec "$BIN/marlaas-verifier") > "$RUN/xv.log" 2>&1 &
xv_pid=$!
check "extra verifier ready within 10 s" wait_for 10 grep -qs " ready: " "$RUN/xv.log"
redis_pid=$(svc_pid redis)
kill -STOP "$redis_pid"
wait_for 15 code_is 503 "http://$TRA/readyz" || true
body=$(curl -s --max-time 5 "http://$TRA/readyz" || true)
echo "Redis paused: trainer /readyz: $body"
check "not ready without Redis" [ "$(code "http://$TRA/readyz")" = 503 ]
check "/readyz names Redis" sh -c "echo '$body' | grep -q Redis"
check "still alive without Redis" [ "$(code "http://$TRA/healthz")" = 200 ]
# SIGTERM while Redis hangs: the extra verifier is blocked in a Redis read (30 s I/O timeout),
# its heartbeat (every 2 s) unanswered in the paused Redis's socket, and still exits by its 10 s
# stop deadline
check "extra verifier waits on the paused Redis" wait_for 10 tcp_unanswered "$xv_pid" "$(env_port MARLAAS_REDIS)"
kill -TERM "$xv_pid"
t0=$EPOCHREALTIME
wait_for 13 gone "$xv_pid" || true
xv_s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
echo "SIGTERM to a verifier blocked on the paused Redis: gone after $xv_s s ($(tail -n 1 "$RUN/xv.log" | cut -c1-90))"
check "blocked verifier exits within 13 s of SIGTERM" sh -c "! kill -0 $xv_pid 2>/dev/null"
kill -9 "$xv_pid" 2>/dev/null || true
kill -CONT "$redis_pid"
wait_for 15 code_is 200 "http://$TRA/readyz" || true
check "ready again with Redis" [ "$(code "http://$TRA/readyz")" = 200 ]
check "redis_up back to 1" [ "$(metric "$TRA" marlaas_redis_up)" = 1 ]

# a taken or malformed HTTP port: the service exits at once and says what to set
set +e
out=$(set -a; . "$RUN/env"; set +a; MARLAAS_HTTP="$SCH" timeout 20 "$BIN/marlaas-verifier" --verifiers tcp://127.0.0.1:1 2>&1)
rc=$?
out2=$(set -a; . "$RUN/env"; set +a; MARLAAS_HTTP=99999 timeout 20 "$BIN/marlaas-verifier" 2>&1)
rc2=$?
out3=$(MARLAAS_HTTP=0 timeout 20 "$BIN/marlaas-trainer" --insecure --backend cuda 2>&1)
rc3=$?
out4=$(MARLAAS_HTTP=0 timeout 20 "$BIN/marlaas-rollout" --insecure --backend tpu 2>&1)
rc4=$?
set -e
echo "port taken: rc $rc: $(echo "$out" | grep -m1 -o 'cannot serve HTTP.*')"
check "port taken: exit 1" [ $rc = 1 ]
check "port taken: message" sh -c "echo '$out' | grep -q 'set --http / MARLAAS_HTTP to a free port'"
check "bad setting: exit 1" [ $rc2 = 1 ]
echo "--backend cuda: rc $rc3: $(echo "$out3" | grep -m1 -o 'backend cuda:.*' | cut -c1-100)"
check "backend cuda refused here: exit 2" [ $rc3 = 2 ]
check "backend cuda refused with a reason" sh -c "echo '$out3' | grep -q 'use --backend cpu'"
check "unknown backend: exit 2 and message" sh -c "[ $rc4 = 2 ] && echo '$out4' | grep -q 'known: cpu, cuda'"
check "bad setting: message" sh -c "echo '$out2' | grep -q 'give PORT, HOST:PORT, or 0'"

# the Kubernetes base's placeholder admin token is refused: no tenant can be created with it
P=()
for _ in 1 2 3 4 5; do P+=("$(free_low_port)"); done
PH=replace-with-a-random-token
(set -a; . "$RUN/env"; set +a; export MARLAAS_ADMIN_TOKEN=$PH MARLAAS_API="tcp://127.0.0.1:${P[0]}" \
    MARLAAS_WORK="tcp://127.0.0.1:${P[1]}" MARLAAS_EVENTS="tcp://127.0.0.1:${P[2]}" MARLAAS_REPORTS="tcp://127.0.0.1:${P[3]}" \
    MARLAAS_HTTP="127.0.0.1:${P[4]}"; exec "$BIN/marlaas-scheduler") > "$RUN/ph.log" 2>&1 &
ph_pid=$!
check "scheduler with the placeholder token ready within 10 s" wait_for 10 grep -qs " ready: " "$RUN/ph.log"
set +e
ph_out=$(MARLAAS_API="tcp://127.0.0.1:${P[0]}" MARLAAS_ADMIN_TOKEN=$PH "$M" tenant create mallory 2>&1)
ph_rc=$?
set -e
kill "$ph_pid" 2>/dev/null; wait "$ph_pid" 2>/dev/null || true
echo "placeholder admin token: scheduler log: $(grep -m1 -o 'the admin token is the placeholder[^:]*' "$RUN/ph.log"); tenant create: rc $ph_rc"
check "placeholder token logged" grep -q "admin token is the placeholder" "$RUN/ph.log"
check "placeholder token creates no tenant" [ $ph_rc != 0 ]

[ $fail = 0 ] && echo "4 services: /healthz /readyz /metrics live (rollout tokens $r1 -> $r2 in $dt_scrape s, trainer steps $t1 -> $t2), readiness follows Redis, bad ports refused"
exit $fail

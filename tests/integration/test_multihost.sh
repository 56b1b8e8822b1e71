#!/usr/bin/env bash
# Three hosts made with network namespaces, veth pairs and a bridge; the services reach each
# other only through those addresses, by name (each host's /etc/hosts, as a cluster DNS would):
#   host 1: redis-server, scheduler, trainer          (names: redis, scheduler, trainer)
#   host 2: rollout, verifier                          (name verifiers -> host 2 and host 3:
#   host 3: rollout, verifier                           the headless-Service pattern)
# Phase 1: two jobs finish; each rollout resolved "verifiers" to both hosts and connected to both,
# and both verifiers and both rollouts did work (their /metrics, read with curl).
# Phase 2: two longer jobs; mid-run host 2's link is cut (its veth set down); the jobs still
# finish on host 3 (expired leases re-issue what was lost; ZMTP heartbeats drop the dead peers).
# Needs CAP_NET_ADMIN (root): skipped with a message (exit 77) where namespaces cannot be made.
set -euo pipefail
source tests/integration/lib.sh

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
    echo "SKIP: the multi-host test needs root (CAP_NET_ADMIN) and iproute2 to create network namespaces"
    exit 77
fi
TAG="mh$$"
# what the test needs, tried once: a namespace that runs a program (`ip netns exec` mounts a
# private /sys and remounts / as a slave: a chroot or a container without the mount privilege
# cannot), a bridge and a veth pair
probe() {
    ip netns add "${TAG}t" && ip netns exec "${TAG}t" true && ip link add "${TAG}tb" type bridge &&
        ip link add "${TAG}tv" type veth peer name "${TAG}tp"
}
if ! why=$(probe 2>&1); then
    # what the probe made before it failed (set -e: each may be absent)
    ip netns del "${TAG}t" 2>/dev/null || true
    ip link del "${TAG}tb" 2>/dev/null || true
    ip link del "${TAG}tv" 2>/dev/null || true
    echo "SKIP: cannot make test hosts here: network namespaces that run programs, bridges and veth pairs need CAP_NET_ADMIN and CAP_SYS_ADMIN outside a chroot (ip: $(echo "$why" | tail -n 1))"
    exit 77
fi
ip netns del "${TAG}t"; ip link del "${TAG}tb"; ip link del "${TAG}tv"

RUN=$(mktemp -d /tmp/marlaas-mh.XXXXXX)
mkdir -p "$RUN/logs"
NET="10.213.$((RANDOM % 200 + 20))"
BR="${TAG}br"
PIDS=()
# every process of the hosts: what `ip netns pids` lists (the services themselves, whatever
# shell started them)
host_pids() { for h in 1 2 3; do ip netns pids "${TAG}h$h" 2>/dev/null; done; }
cleanup() {
    set +e
    local pids p
    pids=$(host_pids)
    [ -n "$pids" ] && kill $pids 2>/dev/null
    # a service stops within its 10 s stop deadline even with Redis out of reach
    for _ in $(seq 1 130); do
        pids=$(host_pids)
        [ -z "$pids" ] && break
        sleep 0.1
    done
    if [ -n "$pids" ]; then
        echo "still running 13 s after SIGTERM (killed): $(ps -o comm= -p $(echo $pids | tr ' ' ',') | tr '\n' ' ')"
        kill -9 $pids 2>/dev/null
    fi
    for h in 1 2 3; do
        ip netns del "${TAG}h$h" 2>/dev/null
        rm -rf "/etc/netns/${TAG}h$h"
    done
    for h in 1 2 3; do ip link del "${TAG}v$h" 2>/dev/null; done
    ip link del "$BR" 2>/dev/null
    [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp -r "$RUN/logs" "$KEEP_LOGS/$(basename "$RUN")"
    rm -rf "$RUN"
}
trap cleanup EXIT

# --- the hosts --------------------------------------------------------------------------------
ip link add "$BR" type bridge
# bridged frames skip the host's iptables (a FORWARD policy of DROP, as Docker sets it, would
# otherwise drop them where br_netfilter is loaded); older kernels lack the option
ip link set "$BR" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 2>/dev/null || true
ip link set "$BR" up
for h in 1 2 3; do
    ns="${TAG}h$h"
    ip netns add "$ns"
    ip link add "${TAG}v$h" type veth peer name "${TAG}p$h"
    ip link set "${TAG}v$h" master "$BR" up
    ip link set "${TAG}p$h" netns "$ns"
    ip -n "$ns" link set "${TAG}p$h" name eth0
    ip -n "$ns" addr add "$NET.$h/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # `ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts: the cluster's names
    mkdir -p "/etc/netns/$ns"
    {
        echo "127.0.0.1 localhost"
        echo "$NET.1 redis scheduler trainer"
        echo "$NET.2 verifiers"
        echo "$NET.3 verifiers"
    } > "/etc/netns/$ns/hosts"
done
on() { local h=$1; shift; ip netns exec "${TAG}h$h" "$@"; }
echo "hosts: $NET.1 (redis, scheduler, trainer), $NET.2 and $NET.3 (rollout + verifier each); \"verifiers\" resolves to: $(on 2 getent hosts verifiers | awk '{print $1}' | tr '\n' ' ')"

# --- the services -----------------------------------------------------------------------------
ADMIN=mh-admin-token-0123456789
ABS_BIN=$(cd "$BIN" && pwd)
# the links between hosts are CURVE-authenticated: one keypair per service, shared by its replicas
"$ABS_BIN/marlaas" keys generate "$RUN/keys" > /dev/null
ENV=(MARLAAS_REDIS=redis:6379 MARLAAS_MODEL="$PWD/models/micro" MARLAAS_THREADS=1
     MARLAAS_API=tcp://scheduler:7000 MARLAAS_WORK=tcp://scheduler:7001 MARLAAS_EVENTS=tcp://scheduler:7002
     MARLAAS_REPORTS=tcp://scheduler:7003 MARLAAS_VERIFIERS=tcp://verifiers:7010 MARLAAS_TRAINER=tcp://trainer:7020
     MARLAAS_TRAINER_EVENTS=tcp://trainer:7021 MARLAAS_ADMIN_TOKEN=$ADMIN MARLAAS_KEYS="$RUN/keys")
start() {   # start HOST NAME COMMAND...
    local h=$1 name=$2
    shift 2
    on "$h" env "${ENV[@]}" "$@" > "$RUN/logs/$name.log" 2>&1 < /dev/null &
    PIDS+=($!)
}
start 1 redis redis-server --port 6379 --bind 0.0.0.0 --protected-mode no --save "" --appendonly no
# the other hosts reach Redis by name over the bridge
for h in 2 3; do
    ok=0
    for _ in $(seq 1 50); do on $h redis-cli -h redis -p 6379 ping 2>/dev/null | grep -q PONG && { ok=1; break; }; sleep 0.2; done
    [ $ok = 1 ] || { echo "host $h cannot reach Redis on host 1 over the bridge"; exit 1; }
done
# short leases: what a cut host held is issued again within seconds
start 1 scheduler "$ABS_BIN/marlaas-scheduler" --set lease_s=4 --set train_lease_s=8
start 1 trainer "$ABS_BIN/marlaas-trainer"
for h in 2 3; do
    start $h "verifier$h" "$ABS_BIN/marlaas-verifier"
    start $h "rollout$h" "$ABS_BIN/marlaas-rollout"
done
# readiness over HTTP (default ports 9500-9503), from host 1: only the bridge addresses
ready() { [ "$(on 1 curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://$1/readyz")" = 200 ]; }
for addr in "$NET.1:9500" "$NET.1:9503" "$NET.2:9501" "$NET.2:9502" "$NET.3:9501" "$NET.3:9502"; do
    ok=0
    for _ in $(seq 1 100); do ready "$addr" && { ok=1; break; }; sleep 0.2; done
    [ $ok = 1 ] || { echo "service at $addr not ready; logs:"; tail -n 5 "$RUN"/logs/*.log; exit 1; }
done
mval() { on 1 curl -sf --max-time 3 "http://$1/metrics" | awk -v n="$2" '$1==n{print $2}'; }
cli() { on 1 env MARLAAS_API=tcp://scheduler:7000 MARLAAS_API_KEY="$RUN/keys/scheduler.key" MARLAAS_ADMIN_TOKEN="$ADMIN" "$ABS_BIN/marlaas" "$@"; }
fail=0
gt() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN {exit !(a + 0 > b + 0)}'; }

# headless-service behaviour: each rollout connected to both verifier addresses
for h in 2 3; do
    check "rollout on host $h connected to 2 verifiers" [ "$(mval "$NET.$h:9501" marlaas_rollout_verifiers)" = 2 ]
done

T=$(cli tenant create mh | awk '/^token/{print $2}')
[ -n "$T" ] || { echo "tenant not created"; exit 1; }
jobs_done() {   # jobs_done TIMEOUT JOB...: every job reaches "done"
    local timeout=$1 start j st
    shift
    start=$(date +%s)
    for j in "$@"; do
        while :; do
            st=$(cli status --token "$T" "$j" | sed -n 's/^[[:space:]]*"status":[[:space:]]*"\([a-z]*\)".*/\1/p' | head -n1)
            [ "$st" = done ] && break
            if [ "$st" = failed ] || [ "$st" = cancelled ] || [ $(( $(date +%s) - start )) -gt "$timeout" ]; then
                echo "job $j: status '$st' after $(( $(date +%s) - start )) s"
                return 1
            fi
            sleep 0.5
        done
    done
}

# --- phase 1: jobs finish across the three hosts --------------------------------------------
t0=$(date +%s)
spec='--steps 150 --prompts 16 --group 8 --eval-every 0 --eval-n 64 --lr 0.003'
a=$(cli submit --token "$T" --task vowels $spec)
b=$(cli submit --token "$T" --task len $spec)
check "phase 1 jobs done" jobs_done 240 "$a" "$b"
s2=$(mval "$NET.2:9502" marlaas_verifier_samples_total); s3=$(mval "$NET.3:9502" marlaas_verifier_samples_total)
k2=$(mval "$NET.2:9501" marlaas_rollout_tokens_total); k3=$(mval "$NET.3:9501" marlaas_rollout_tokens_total)
echo "phase 1: 2 jobs x 150 steps in $(( $(date +%s) - t0 )) s; samples scored: host 2 $s2, host 3 $s3; tokens generated: host 2 $k2, host 3 $k3"
check "verifier on host 2 scored" gt "$s2" 0
check "verifier on host 3 scored" gt "$s3" 0
check "rollout on host 2 generated" gt "$k2" 0
check "rollout on host 3 generated" gt "$k3" 0

# --- phase 2: host 2's link is cut mid-run ---------------------------------------------------
t0=$(date +%s)
spec='--steps 400 --prompts 16 --group 8 --eval-every 0 --eval-n 64 --lr 0.003'
c=$(cli submit --token "$T" --task vowels $spec)
d=$(cli submit --token "$T" --task len $spec)
for _ in $(seq 1 200); do
    gt "$(mval "$NET.1:9503" marlaas_trainer_steps_total)" $((300 + 60)) && break
    sleep 0.1
done
steps_cut=$(mval "$NET.1:9503" marlaas_trainer_steps_total)
s3_cut=$(mval "$NET.3:9502" marlaas_verifier_samples_total)
ip link set "${TAG}v2" down
echo "phase 2: host 2 cut at trainer step total $steps_cut"
check "phase 2 jobs done after the cut" jobs_done 300 "$c" "$d"
s3_end=$(mval "$NET.3:9502" marlaas_verifier_samples_total)
expired=$(mval "$NET.1:9500" marlaas_scheduler_leases_expired_total)
unreach=$(on 1 curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$NET.2:9501/metrics" || true)
echo "phase 2: 2 jobs x 400 steps in $(( $(date +%s) - t0 )) s; host 3 scored $s3_cut -> $s3_end samples after the cut;" \
     "leases expired: $expired; host 2 from host 1: HTTP '$unreach'"
check "host 3 took over" gt "$s3_end" "$s3_cut"
check "host 2 unreachable after the cut" [ "$unreach" = 000 ]
for j in "$c" "$d"; do
    step=$(cli status --token "$T" "$j" | sed -n 's/^[[:space:]]*"step":[[:space:]]*\([0-9]*\).*/\1/p' | head -n1)
    check "job $j at step 400" [ "$step" = 400 ]
done
# SIGTERM stops every service: those on connected hosts at once, those on the cut host (blocked
# on Redis reads that can only time out) at the services' 10 s stop deadline
pids=$(host_pids)
kill $pids 2>/dev/null
t0=$EPOCHREALTIME
for _ in $(seq 1 130); do [ -z "$(host_pids)" ] && break; sleep 0.1; done
left=$(host_pids)
echo "SIGTERM to $(echo $pids | wc -w) processes: all gone after $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}') s${left:+; still running: $left}"
check "every service stops within 13 s of SIGTERM" [ -z "$left" ]
[ $fail = 0 ] && echo "3 hosts (netns): 2 + 2 jobs done; rollouts connected to both verifiers by name; after host 2's link was cut, host 3 finished the jobs"
exit $fail

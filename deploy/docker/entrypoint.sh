#!/bin/bash
# marlaas-entrypoint - the container image's entry point: the first argument picks what runs.
#   scheduler | rollout | verifier | trainer [flags]   a service (marlaas-NAME; flags as --help shows)
#                                                      trainer with MARLAAS_TRAINER_GPUS=N > 1: a
#                                                      data-parallel group of N ranks (trainer_group)
#   marlaas [args]                                     the command-line client and tools
#   reward_service | env_service [flags]               the example external services
#   probe PORT [PATH]                                  exits 0 when GET http://127.0.0.1:PORT/PATH
#                                                      (default /readyz) answers 200: for container
#                                                      health checks, with nothing but bash
# Anything else runs as a command (a shell for debugging: `docker run -it IMAGE bash`).
set -euo pipefail
BIN=${MARLAAS_BIN_DIR:-/usr/local/bin}

probe() {
    local port=${1:?probe: give the HTTP port}
    local path=${2:-/readyz} line
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$path" >&3
    IFS= read -r -t 5 line <&3 || exit 1
    exec 3<&-
    case "$line" in
        "HTTP/1."[01]" 200 "*) exit 0 ;;
        *) echo "probe: GET $path on port $port: ${line%$'\r'}" >&2; exit 1 ;;
    esac
}

# A data-parallel trainer of N ranks in this container (README "Data-parallel trainer"): rank r
# on GPU r (CUDA_VISIBLE_DEVICES=r), joined over 127.0.0.1:MARLAAS_DP_PORT (7040). Rank 0 is the
# trainer service with the given flags and its HTTP port; ranks 1..N-1 only compute (no HTTP
# endpoint; give settings through the environment, which every rank reads). When any rank exits,
# the others are stopped and the container exits with that rank's status: the orchestrator then
# restarts the whole group, since a rank cannot rejoin a formed group. SIGTERM stops every rank.
trainer_group() {
    local n=$1 port=${MARLAAS_DP_PORT:-7040} r rc=0 stopping=0
    shift
    local pids=() group=(--set "dp_world=$n" --set "dp_endpoint=tcp://127.0.0.1:$port")
    for r in $(seq 1 $((n - 1))); do
        CUDA_VISIBLE_DEVICES=$r MARLAAS_HTTP=0 MARLAAS_ID="${MARLAAS_ID:-trainer-$HOSTNAME}-rank$r" \
            "$BIN/marlaas-trainer" "$@" "${group[@]}" --set "dp_rank=$r" &
        pids+=($!)
    done
    CUDA_VISIBLE_DEVICES=0 "$BIN/marlaas-trainer" "$@" "${group[@]}" --set dp_rank=0 &
    pids+=($!)
    trap 'stopping=1; kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
    wait -n "${pids[@]}" || rc=$?
    if [ "$stopping" = 0 ]; then
        echo "trainer group: a rank exited (status $rc); stopping the others so that the group restarts" >&2
    fi
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait || true
    [ "$stopping" = 1 ] && rc=0
    exit "$rc"
}

if [ $# -eq 0 ]; then
    echo "usage: IMAGE scheduler|rollout|verifier|trainer [flags] | marlaas [args] | reward_service | env_service | probe PORT [PATH]" >&2
    exit 2
fi
cmd=$1
shift
case "$cmd" in
    trainer)
        gpus=${MARLAAS_TRAINER_GPUS:-1}
        case "$gpus" in '' | *[!0-9]* | 0) echo "MARLAAS_TRAINER_GPUS must be a number >= 1, got '$gpus'" >&2; exit 2 ;; esac
        if [ "$gpus" -gt 1 ]; then trainer_group "$gpus" "$@"; fi
        exec "$BIN/marlaas-trainer" "$@" ;;
    scheduler | rollout | verifier) exec "$BIN/marlaas-$cmd" "$@" ;;
    marlaas | reward_service | env_service) exec "$BIN/$cmd" "$@" ;;
    probe) probe "$@" ;;
    *) exec "$cmd" "$@" ;;
esac

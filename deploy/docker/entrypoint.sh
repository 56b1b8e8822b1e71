#!/bin/bash
# marlaas-entrypoint - the container image's entry point: the first argument picks what runs.
#   scheduler | rollout | verifier | trainer [flags]   a service (marlaas-NAME; flags as --help shows)
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

if [ $# -eq 0 ]; then
    echo "usage: IMAGE scheduler|rollout|verifier|trainer [flags] | marlaas [args] | reward_service | env_service | probe PORT [PATH]" >&2
    exit 2
fi
cmd=$1
shift
case "$cmd" in
    scheduler | rollout | verifier | trainer) exec "$BIN/marlaas-$cmd" "$@" ;;
    marlaas | reward_service | env_service) exec "$BIN/$cmd" "$@" ;;
    probe) probe "$@" ;;
    *) exec "$cmd" "$@" ;;
esac

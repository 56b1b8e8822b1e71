# lib.sh - helpers for integration tests that start a real local cluster (redis-server + the
# four services) on loopback. Source it; every function uses $RUN (the run directory).
#
#   cluster_up [marlaas up flags]      starts a cluster in a fresh $RUN on free ports
#   mk_tenant NAME                     prints the new tenant's token
#   submit TOKEN marlaas-submit-flags  prints the job id
#   wait_jobs TOKEN TIMEOUT_S          waits until no job of the tenant is queued/running
#   job_field TOKEN JOB FIELD          prints a field of `marlaas status JOB`
#   svc_pid NAME                       pid of a service of the cluster
#   cluster_down                       stops everything (also registered as an EXIT trap)
BIN=${MARLAAS_BIN:-build/bin}
M="$BIN/marlaas"

free_port_base() {
    # a base whose 22 ports are free, from a range the other tests do not use by default
    local base
    for _ in $(seq 1 50); do
        base=$(( 20000 + (RANDOM % 400) * 100 ))
        if ! (ss -ltn 2>/dev/null | awk '{print $4}' | grep -qE ":(${base}|$((base + 1))|$((base + 10))|$((base + 20))|$((base + 21)))\$"); then
            echo "$base"
            return
        fi
    done
    echo 29000
}

cluster_up() {
    RUN=$(mktemp -d /tmp/marlaas-it.XXXXXX)
    PORT_BASE=$(free_port_base)
    export MARLAAS_RUN_DIR="$RUN"
    trap cluster_down EXIT
    "$M" up --run-dir "$RUN" --port-base "$PORT_BASE" "$@"
}

cluster_down() {
    if [ -n "${RUN:-}" ] && [ -d "$RUN" ]; then
        "$M" down --run-dir "$RUN" >/dev/null 2>&1 || true
        if [ -n "${KEEP_LOGS:-}" ]; then cp -r "$RUN/logs" "$KEEP_LOGS" 2>/dev/null || true; fi
        rm -rf "$RUN"
    fi
}

mk_tenant() {
    "$M" tenant create "$1" | awk '/^token/{print $2}'
}

submit() {
    local tok=$1
    shift
    "$M" submit --token "$tok" "$@"
}

wait_jobs() {
    local tok=$1 timeout=$2 start
    start=$(date +%s)
    while [ $(( $(date +%s) - start )) -lt "$timeout" ]; do
        if ! "$M" jobs --token "$tok" | awk 'NR>1 && ($4=="running" || $4=="queued"){found=1} END{exit !found}'; then
            return 0
        fi
        sleep 1
    done
    echo "jobs still running after ${timeout}s:"
    "$M" jobs --token "$tok"
    return 1
}

job_field() {
    "$M" status --token "$1" "$2" | sed -n "s/^[[:space:]]*\"$3\":[[:space:]]*\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n 1
}

svc_pid() {
    awk -v n="$1" '$1==n{print $2}' "$RUN/pids"
}

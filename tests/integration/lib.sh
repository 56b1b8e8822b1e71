# lib.sh - helpers for integration tests that start a real local cluster (redis-server + the
# four services) on loopback. Source it; every function uses $RUN (the run directory).
#
#   cluster_up [marlaas up flags]      starts a cluster in a fresh $RUN on free ports
#   mk_tenant NAME                     prints the new tenant's token
#   submit TOKEN marlaas-submit-flags  prints the job id
#   wait_jobs TOKEN TIMEOUT_S          waits until no job of the tenant is queued/running
#   job_field TOKEN JOB FIELD          prints a field of `marlaas status JOB`
#   svc_pid NAME                       pid of a service of the cluster
#   svc_http NAME                      HOST:PORT of a service's /healthz /readyz /metrics
#   console_url                        the web console's URL (the scheduler's, `marlaas up` turns it on)
#   metric HOSTPORT NAME [JOB]         a value from GET /metrics (empty when absent)
#   free_low_port                      a free loopback port for an example service
#   check DESCRIPTION COMMAND...       runs COMMAND; when it fails prints "FAILED: DESCRIPTION" and
#                                      sets fail=1 (the test exits $fail at its end)
#   wait_for TIMEOUT_S COMMAND...      runs COMMAND every 0.1 s until it succeeds; after TIMEOUT_S
#                                      without success says which condition never held, returns 1
#   env_port NAME                      the port of setting NAME in $RUN/env (MARLAAS_WORK, ...)
#   envv NAME                          the value of setting NAME in $RUN/env
#   make_tmp                           $tmp, removed at exit with the cluster (again after cluster_up)
#   tcp_connected PID PORT             true while PID holds an established connection to PORT
#   tcp_unread PID PORT [MIN_BYTES]    true while at least MIN_BYTES (default 1) sent to PID on its
#                                      connection to PORT wait unread by PID (a stopped process)
#   tcp_unanswered PID PORT            true while bytes PID sent on its connection to PORT wait
#                                      unread by the other end (a server stopped with SIGSTOP)
#   log_end T0 LOG [N]                 seconds from T0 ($EPOCHREALTIME then) to the last (or the Nth)
#                                      "status done|failed|cancelled" line of a scheduler log
#   cluster_down                       stops everything (also registered as an EXIT trap)
BIN=${MARLAAS_BIN:-build/bin}
M="$BIN/marlaas"

free_port_base() {
    # a base whose ports are free, below the kernel's range for outgoing connections (an
    # outgoing connection may hold any port in that range, even one we are about to bind)
    local lo base span
    lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    span=$(( (lo - 10100) / 100 ))
    [ "$span" -ge 1 ] || span=1
    for _ in $(seq 1 50); do
        base=$(( 10000 + (RANDOM % span) * 100 ))
        if ! (ss -ltn 2>/dev/null | awk '{print $4}' | grep -qE ":(${base}|$((base + 1))|$((base + 2))|$((base + 3))|$((base + 10))|$((base + 20))|$((base + 21))|$((base + 30))|$((base + 31))|$((base + 32))|$((base + 33))|$((base + 40)))\$"); then
            echo "$base"
            return
        fi
    done
    echo 10000
}

# free_low_port: a loopback port nobody listens on, for an example service a test starts. It
# lies below the kernel's range for outgoing connections (a client reconnecting to a dead port
# there is never handed that port as its own source, and an outgoing connection never holds it)
# and in the upper half of a hundred, which lib.sh never gives a cluster (base + 0..21).
free_low_port() {
    local lo span p
    lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    span=$(( (lo - 10100) / 100 ))
    [ "$span" -ge 1 ] || span=1
    for _ in $(seq 1 100); do
        p=$(( 10000 + (RANDOM % span) * 100 + 50 + RANDOM % 50 ))
        if ! ss -ltn 2>/dev/null | awk '{print $4}' | grep -qE ":$p\$"; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

check() {
    local what=$1
    shift
    if "$@"; then :; else echo "FAILED: $what"; fail=1; fi
}

# Polls a condition instead of sleeping for a time that is enough on some machine and not on a
# slower or busier one: the test goes on as soon as the condition holds and says which one did
# not when it never does.
wait_for() {
    local timeout=$1 t0=$EPOCHREALTIME
    shift
    until "$@"; do
        if awk -v a="$t0" -v b="$EPOCHREALTIME" -v t="$timeout" 'BEGIN {exit !(b - a >= t)}'; then
            echo "wait_for: still false after ${timeout} s: $*" >&2
            return 1
        fi
        sleep 0.1
    done
}

env_port() {
    sed -n "s/^$1=.*:\([0-9]*\)\$/\1/p" "$RUN/env"
}

envv() {
    sed -n "s/^$1=//p" "$RUN/env"
}

# $tmp: a directory of the test's own, removed at exit with the cluster. cluster_up installs
# its own exit trap: call make_tmp again after it.
make_tmp() {
    tmp=${tmp:-$(mktemp -d)}
    trap 'cluster_down; rm -rf "$tmp"' EXIT
}

# `ss` lists PID's established connections to loopback PORT (-p names the owner, for processes
# of this user; a stopped process is listed like a running one): Recv-Q, Send-Q, local, peer.
tcp_conns() {
    ss -Htnp state established "( dport = :$2 )" 2>/dev/null | awk -v p="pid=$1," 'index($0, p)'
}

tcp_connected() {
    [ -n "$(tcp_conns "$1" "$2")" ]
}

tcp_unread() {
    tcp_conns "$1" "$2" | awk -v m="${3:-1}" '$1 >= m {f = 1} END {exit !f}'
}

tcp_unanswered() {
    local lp
    # the other end of each connection: its Recv-Q holds what PID sent and it has not read
    for lp in $(tcp_conns "$1" "$2" | awk '{n = split($3, a, ":"); print a[n]}'); do
        ss -Htn state established "( sport = :$2 and dport = :$lp )" 2>/dev/null | awk '$1 > 0 {f = 1} END {exit !f}' &&
            return 0
    done
    return 1
}

cluster_up() {
    RUN=$(mktemp -d /tmp/marlaas-it.XXXXXX)
    PORT_BASE=$(free_port_base)
    export MARLAAS_RUN_DIR="$RUN"
    trap cluster_down EXIT
    "$M" up --run-dir "$RUN" --port-base "$PORT_BASE" "$@"
}

log_end() {
    awk -v t0="$1" -v n="${3:-0}" '
        function logt(ts,   d, c, e, cmd) {
            split(ts, d, "T"); split(d[2], c, ":"); sub("Z", "", c[3])
            if (!(d[1] in day)) {cmd = "date -u -d " d[1] " +%s"; cmd | getline e; close(cmd); day[d[1]] = e}
            return day[d[1]] + c[1] * 3600 + c[2] * 60 + c[3] - t0
        }
        / status (done|failed|cancelled)/ {k++; if (!n || k <= n) e = logt($1)} END {printf "%.3f", e}' "$2"
}

cluster_down() {
    if [ -n "${RUN:-}" ] && [ -d "$RUN" ]; then
        "$M" down --run-dir "$RUN" >/dev/null 2>&1 || true
        # KEEP_LOGS=DIR: each cluster's logs are kept in DIR/<run dir name>/
        if [ -n "${KEEP_LOGS:-}" ]; then
            mkdir -p "$KEEP_LOGS" && cp -r "$RUN/logs" "$KEEP_LOGS/$(basename "$RUN")" 2>/dev/null || true
        fi
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

wait_jobs() {   # wait_jobs TOKEN TIMEOUT_S: until no job of the tenant is queued or running (polled every WAIT_POLL s, 1)
    local tok=$1 timeout=$2 start out
    start=$(date +%s)
    while [ $(( $(date +%s) - start )) -lt "$timeout" ]; do
        # a failed listing (the scheduler or Redis restarting) says nothing: ask again
        if out=$("$M" jobs --token "$tok" 2>/dev/null) &&
            ! awk 'NR>1 && ($4=="running" || $4=="queued"){found=1} END{exit !found}' <<< "$out"; then
            return 0
        fi
        sleep "${WAIT_POLL:-1}"
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

svc_http() {
    awk -v n="$1" '$1==n{print $2}' "$RUN/http" | tail -n 1
}

console_url() {
    head -n 1 "$RUN/console"
}

metric() {
    local addr=$1 name=$2 job=${3:-}
    if [ -n "$job" ]; then
        curl -sf --max-time 5 "http://$addr/metrics" | awk -v n="$name{job_id=\"$job\"}" '$1==n{print $2}'
    else
        curl -sf --max-time 5 "http://$addr/metrics" | awk -v n="$name" '$1==n{print $2}'
    fi
}

# --- restarting services of a running cluster --------------------------------------------------
#   svc_alive PID                      true while any thread of PID runs (zombies count as gone)
#   svc_stop NAME [SIGNAL]             signals a service (default TERM) and waits until it is gone
#   svc_start NAME [service flags]     starts another instance with the settings `marlaas up` used
#                                      (log $RUN/logs/NAME2.log, NAME3.log, ... in $SVC_LOG), waits
#                                      until it logs "ready:" (text or json log format)
#   svc_restart NAME [service flags]   svc_stop NAME TERM, then svc_start NAME [flags]
# svc_start records the new pid in $RUN/pids in place of the old one, so `marlaas down` (and
# cluster_down) stops it like the rest of the cluster.

svc_alive() {
    local f st
    # Orphaned services stay zombies until pid 1 reaps them. The main thread turns zombie while
    # other threads are still exiting, and the sockets (the ports a restarted service binds)
    # close only with the last thread: gone means no thread left but zombies.
    for f in /proc/"$1"/task/*/stat; do
        st=$(sed 's/.*) //' "$f" 2>/dev/null | cut -d' ' -f1) || continue
        if [ -n "$st" ] && [ "$st" != Z ]; then return 0; fi
    done
    return 1
}

svc_stop() {
    local name=$1 sig=${2:-TERM} pid
    pid=$(svc_pid "$name" | tail -n 1)
    if [ -z "$pid" ]; then
        echo "svc_stop: no $name in $RUN/pids" >&2
        return 1
    fi
    kill -s "$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        svc_alive "$pid" || return 0
        sleep 0.1
    done
    echo "svc_stop: $name (pid $pid) still running 10 s after SIG$sig" >&2
    return 1
}

svc_start() {
    local name=$1 n=2 log pid http_port
    shift
    while [ -e "$RUN/logs/$name$n.log" ]; do n=$((n + 1)); done
    log="$RUN/logs/$name$n.log"
    SVC_LOG=$log
    # its own HTTP port (another instance of the service may hold the one `marlaas up` gave)
    http_port=$(free_low_port)
    # MARLAAS_POLICY is not in $RUN/env: a caller that started the cluster with --policy sync
    # exports it before restarting the scheduler
    (
        set -a
        . "$RUN/env"
        set +a
        export MARLAAS_THREADS=1 MARLAAS_POLICY="${MARLAAS_POLICY:-async}" MARLAAS_HTTP="127.0.0.1:$http_port"
        exec "$BIN/marlaas-$name" "$@"
    ) > "$log" 2>&1 < /dev/null &
    pid=$!
    echo "$name 127.0.0.1:$http_port" >> "$RUN/http"
    # like the services `marlaas up` starts: no job notice from this shell when it is killed
    disown "$pid"
    if grep -q "^$name " "$RUN/pids"; then
        awk -v n="$name" -v p="$pid" '$1 == n {$2 = p} {print}' "$RUN/pids" > "$RUN/pids.new"
        mv "$RUN/pids.new" "$RUN/pids"
    else
        echo "$name $pid" >> "$RUN/pids"
    fi
    for _ in $(seq 1 300); do
        # the ready line in either log format (text, or json's "message")
        if grep -qE ' ready: |"message":"ready: ' "$log"; then return 0; fi
        if ! svc_alive "$pid"; then
            echo "svc_start: $name exited at start; $log:" >&2
            cat "$log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "svc_start: $name not ready after 30 s; $log:" >&2
    cat "$log" >&2
    return 1
}

svc_restart() {
    local name=$1
    shift
    svc_stop "$name" TERM
    svc_start "$name" "$@"
}

# A free port base (as free_port_base) below the kernel's ephemeral port range, for clusters
# whose services are restarted: while nothing listens on a port of that range, an outgoing
# connection (a peer reconnecting, a CLI call) may be given it as its local port, and the
# restarted service then cannot bind it. Pass it as `cluster_up --port-base "$(low_port_base)"`
# (the last --port-base wins).
low_port_base() {
    local lo base
    lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    if [ "$lo" -lt 10200 ]; then
        free_port_base
        return
    fi
    for _ in $(seq 1 50); do
        base=$(( 10000 + (RANDOM % ((lo - 10100) / 100)) * 100 ))
        if ! (ss -ltn 2>/dev/null | awk '{print $4}' | grep -qE ":(${base}|$((base + 1))|$((base + 2))|$((base + 3))|$((base + 10))|$((base + 20))|$((base + 21))|$((base + 30))|$((base + 31))|$((base + 32))|$((base + 33))|$((base + 40)))\$"); then
            echo "$base"
            return
        fi
    done
    echo 30000
}

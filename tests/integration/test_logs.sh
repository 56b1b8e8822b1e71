#!/usr/bin/env bash
# The log formats on a live local cluster, and no secret in any log. Runs twice, with
# MARLAAS_LOG_FORMAT=text and =json (the extra processes of the json round take --log-format json
# as a flag instead). Each round starts a cluster (`marlaas up`: a Redis password, an admin token
# and a CURVE keypair per service), creates a tenant, trains a short job, and goes through the
# paths that handle secrets:
#   - a tenant token one character off and a made-up admin token, refused by the API;
#   - a verifier given a wrong Redis password (refused by Redis, the service exits);
#   - a verifier whose secret key file holds garbage (refused at start);
#   - a scheduler given an admin token shorter than 8 characters (started, warned about);
#   - `marlaas keys generate` (the CLI writing secret keys);
# and, in the json round, the line a signal handler writes when a service blocked on a paused Redis
# exits at its stop deadline; then checks every line of every service log with check_logs.py (text lines as they always
# were; json: one object per line with time, level, service, id, message, and job, tenant,
# fields where they apply), and that none of the secrets (the admin token, the Redis password,
# every service's and the generated secret keys, the tenant's token, the wrong tokens and
# passwords) appears in any log, the CLI's error output or `marlaas up`'s output. An unknown
# --log-format is refused. The test fails when a secret appears: its self-check plants one in a
# copy of a log and expects the grep to find it.
set -euo pipefail
source tests/integration/lib.sh
fail=0
hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
OUT=$(mktemp -d)
trap 'cluster_down; rm -rf "$OUT"' EXIT

# found DIR SECRET...: prints "FILE: secret #i" for each secret found in a file under DIR
found() {
    local dir=$1 i=0 s
    shift
    for s in "$@"; do
        i=$((i + 1))
        grep -rlF -e "$s" "$dir" 2>/dev/null | sed "s|\$|: secret #$i (${#s} characters)|" || true
    done
}

round() {
    local fmt=$1 D="$OUT/$1" K="$OUT/keys-$1" flag=() CLI
    mkdir -p "$D" "$K"
    CLI="$D/cli.log"   # every CLI command's error output
    export MARLAAS_LOG_FORMAT=$fmt
    KEEP_LOGS="$D/run"   # cluster_down copies the cluster's logs there, once the services stopped
    cluster_up --model models/micro > "$D/up.log" 2>&1 || { echo "FAILED: $fmt: marlaas up"; cat "$D/up.log"; fail=1; return; }
    trap 'cluster_down; rm -rf "$OUT"' EXIT
    local admin rpass t job bad_t bad_admin bad_rpass junk short sp s i
    admin=$(envv MARLAAS_ADMIN_TOKEN) rpass=$(envv MARLAAS_REDIS_PASSWORD)
    local -a secrets=("$admin" "$rpass")
    for f in "$RUN"/keys/*.key_secret; do secrets+=("$(sed -n 's/^ *secret-key = "\(.*\)"$/\1/p' "$f")"); done
    t=$(mk_tenant "logs-$fmt" 2>> "$CLI")
    secrets+=("$t")
    job=$(submit "$t" --task vowels --steps 3 --prompts 4 --group 4 --eval-every 0 --eval-n 8 2>> "$CLI")
    check "$fmt: the job finishes" wait_jobs "$t" 120
    check "$fmt: job done" [ "$(job_field "$t" "$job" status 2>> "$CLI")" = done ]

    # refused tokens (a token one character off may well be another tenant's real one)
    bad_t="${t%?}$([ "${t: -1}" = 0 ] && echo 1 || echo 0)"
    bad_admin="admin-$(hex 16)"
    secrets+=("$bad_t" "$bad_admin")
    check "$fmt: a wrong tenant token is refused" sh -c "! '$M' jobs --token '$bad_t' > /dev/null 2>> '$CLI'"
    check "$fmt: a wrong admin token is refused" \
        sh -c "! MARLAAS_ADMIN_TOKEN='$bad_admin' '$M' tenant create mallory > /dev/null 2>> '$CLI'"
    check "$fmt: the admin reads the job" sh -c "'$M' status --token '$admin' '$job' > /dev/null 2>> '$CLI'"

    # the extra processes: the json round names the format with the flag instead
    if [ "$fmt" = json ]; then
        flag=(--log-format json)
        unset MARLAAS_LOG_FORMAT
    fi
    # a verifier with a wrong Redis password: refused by Redis, it exits
    bad_rpass="redis-$(hex 16)"
    secrets+=("$bad_rpass")
    if (set -a; . "$RUN/env"; set +a; MARLAAS_HTTP=0 MARLAAS_REDIS_PASSWORD=$bad_rpass \
        MARLAAS_VERIFIERS="tcp://127.0.0.1:$(free_low_port)" exec timeout 60 "$BIN/marlaas-verifier" "${flag[@]}") \
        > "$RUN/logs/verifier-badpass.log" 2>&1 < /dev/null; then
        echo "FAILED: $fmt: a verifier with a wrong Redis password ran"
        fail=1
    fi
    check "$fmt: the wrong Redis password is refused" grep -q "refused the password" "$RUN/logs/verifier-badpass.log"
    # a verifier whose secret key file holds garbage: refused at start
    mkdir -p "$K/bad"
    cp "$RUN"/keys/*.key "$K/bad/"
    junk="junk~$(hex 12)~key"
    secrets+=("$junk")
    sed "s/^\( *secret-key = \"\).*\"\$/\1$junk\"/" "$RUN/keys/verifier.key_secret" > "$K/bad/verifier.key_secret"
    check "$fmt: the garbage key is planted" grep -qF "$junk" "$K/bad/verifier.key_secret"
    if (set -a; . "$RUN/env"; set +a; MARLAAS_HTTP=0 MARLAAS_KEYS="$K/bad" \
        MARLAAS_VERIFIERS="tcp://127.0.0.1:$(free_low_port)" exec timeout 60 "$BIN/marlaas-verifier" "${flag[@]}") \
        > "$RUN/logs/verifier-badkey.log" 2>&1 < /dev/null; then
        echo "FAILED: $fmt: a verifier with a garbage secret key ran"
        fail=1
    fi
    check "$fmt: the garbage key is refused" grep -q "holds no CURVE secret key" "$RUN/logs/verifier-badkey.log"
    # a scheduler with a short admin token, on ports and a key prefix of its own (it sees no job)
    short="s$(hex 3)"
    secrets+=("$short")
    (set -a; . "$RUN/env"; set +a; MARLAAS_HTTP=0 MARLAAS_PREFIX="logs-$fmt:" MARLAAS_ADMIN_TOKEN=$short \
        MARLAAS_API="tcp://127.0.0.1:$(free_low_port)" MARLAAS_WORK="tcp://127.0.0.1:$(free_low_port)" \
        MARLAAS_EVENTS="tcp://127.0.0.1:$(free_low_port)" MARLAAS_REPORTS="tcp://127.0.0.1:$(free_low_port)" \
        exec "$BIN/marlaas-scheduler" "${flag[@]}") > "$RUN/logs/scheduler-short.log" 2>&1 < /dev/null &
    sp=$!
    check "$fmt: the scheduler with a short admin token starts" \
        wait_for 20 grep -qE ' ready: |"message":"ready: ' "$RUN/logs/scheduler-short.log"
    kill -TERM "$sp" 2>/dev/null || true
    wait "$sp" 2>/dev/null || true
    check "$fmt: the short admin token is warned about" grep -q "no admin token of 8+ characters" "$RUN/logs/scheduler-short.log"
    # the CLI writing secret keys
    check "$fmt: marlaas keys generate" sh -c "'$M' keys generate '$K/new' > '$D/keys-generate.log' 2>&1"
    for f in "$K"/new/*.key_secret; do secrets+=("$(sed -n 's/^ *secret-key = "\(.*\)"$/\1/p' "$f")"); done
    check "$fmt: an unknown log format is refused" sh -c "! MARLAAS_HTTP=0 '$BIN/marlaas-verifier' --insecure \
        --log-format xml 2> '$D/xml.err' && grep -q 'must be text or json' '$D/xml.err'"
    local extra=()
    if [ "$fmt" = json ]; then
        # the line of the stop deadline, written by a signal handler: a verifier blocked on a paused
        # Redis, told to stop, exits 10 s later with one json line (text: test_http.sh)
        local xv redis_pid
        (set -a; . "$RUN/env"; set +a; MARLAAS_HTTP=0 MARLAAS_VERIFIERS="tcp://127.0.0.1:$(free_low_port)" \
            exec "$BIN/marlaas-verifier" "${flag[@]}") > "$RUN/logs/verifier-deadline.log" 2>&1 < /dev/null &
        xv=$!
        check "json: the extra verifier starts" wait_for 20 grep -q '"message":"ready: ' "$RUN/logs/verifier-deadline.log"
        redis_pid=$(svc_pid redis)
        kill -STOP "$redis_pid"
        check "json: the extra verifier waits on the paused Redis" wait_for 10 tcp_unanswered "$xv" "$(env_port MARLAAS_REDIS)"
        kill -TERM "$xv"
        (sleep 20; kill -9 "$xv" 2>/dev/null) &   # in case the deadline does not end it
        local guard=$!
        wait "$xv" 2>/dev/null || true
        kill "$guard" 2>/dev/null || true
        kill -CONT "$redis_pid"
        check "json: the stop deadline's line" grep -qE '^\{"time":"[0-9T:.-]+Z","level":"warn","service":"verifier","id":"verifier-[^"]+","message":"still busy 10 s after the stop signal' \
            "$RUN/logs/verifier-deadline.log"
    fi
    export MARLAAS_LOG_FORMAT=$fmt

    cluster_down
    local L
    L=$(find "$D/run" -mindepth 1 -maxdepth 1 -type d | head -n 1)
    [ "$fmt" = json ] && extra=(verifier="$L/verifier-deadline.log")
    if [ -z "$L" ] || [ ! -s "$L/trainer.log" ]; then
        echo "FAILED: $fmt: the cluster's logs were not kept"
        fail=1
        return
    fi
    # every line of every service log
    check "$fmt: every log line is a $fmt log line" python3 tests/integration/check_logs.py "$fmt" \
        scheduler="$L/scheduler.log" rollout="$L/rollout.log" verifier="$L/verifier.log" trainer="$L/trainer.log" \
        verifier="$L/verifier-badpass.log" verifier="$L/verifier-badkey.log" scheduler="$L/scheduler-short.log" \
        "${extra[@]}"
    if [ "$fmt" = json ]; then
        check "json: the submission names job and tenant" \
            grep -qE '"job":"'"$job"'","tenant":"t-[0-9]+","message":"submitted by tenant' "$L/scheduler.log"
        check "json: the trainer's step lines carry job, tenant and fields" \
            grep -qE '"job":"'"$job"'","tenant":"t-[0-9]+","message":"step=3 .*"fields":\{"step":"3","version":"3"' \
            "$L/trainer.log"
        check "json: lines name the instance id" grep -qE '"service":"trainer","id":"trainer-' "$L/trainer.log"
    else
        check "text: the step line as always" grep -qE '^[0-9T:.-]+Z INFO  trainer job='"$job"' step=3 version=3 ' "$L/trainer.log"
    fi
    # no secret anywhere: every service's log, Redis's, the CLI's error output, marlaas up's output
    i=0
    for s in "${secrets[@]}"; do
        i=$((i + 1))
        [ ${#s} -ge 7 ] || { echo "FAILED: $fmt: secret #$i is empty or short ('$s'): the test could not read it"; fail=1; }
    done
    local leaks
    leaks=$(found "$D" "${secrets[@]}")
    if [ -n "$leaks" ]; then
        echo "FAILED: $fmt: secrets in the logs:"
        echo "$leaks"
        fail=1
    fi
    # self-check: a secret planted in a copy of a log is found
    mkdir -p "$OUT/plant-$fmt"
    { cat "$L/scheduler.log"; echo "x ${secrets[1]} y"; } > "$OUT/plant-$fmt/scheduler.log"
    if [ -z "$(found "$OUT/plant-$fmt" "${secrets[1]}")" ]; then
        echo "FAILED: $fmt: self-check: a secret planted in a log was not found"
        fail=1
    fi
    [ -z "$leaks" ] && echo "$fmt: $(cat "$L"/*.log "$D"/*.log "$D/xml.err" | wc -l) lines of logs and CLI output, ${#secrets[@]} secrets, none in them"
}

for fmt in text json; do
    round "$fmt"
done
unset MARLAAS_LOG_FORMAT
[ $fail = 0 ] && echo "logs: text and json lines checked on a live cluster; no secret in any log"
exit $fail

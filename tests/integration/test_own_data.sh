#!/usr/bin/env bash
# The README's "Train on your own data", as a newcomer types it (models/micro, few steps), with
# the CLI put on PATH by `make install PREFIX=...` and run from a folder that is not the clone:
# a cluster, a tenant whose token is exported, a JSONL dataset submitted without --task (the
# job is named after the file), watch, adapter pull, generate (its model from the cluster's
# settings). On the way, what a first hour trips over:
#   - `submit --help` names --token, --api and MARLAAS_TOKEN;
#   - an invalid dataset is refused before upload, naming the file as given and the line;
#   - the status shows the spec's numbers as written ("lr": 0.003);
#   - the job's evals count each distinct held-out prompt once: 300 lines over 95 prompts give
#     the n that `marlaas eval --dataset` reports, which says it is smaller than asked.
set -euo pipefail
source tests/integration/lib.sh
fail=0
out=$(mktemp -d)
trap 'cluster_down; rm -rf "$out"' EXIT
san=0
[[ $BIN == */san/bin ]] && san=1
make -s --no-print-directory install PREFIX="$out/prefix" SAN=$san > /dev/null
export PATH=$out/prefix/bin:$PATH
M=$(command -v marlaas)
check "marlaas installed on PATH" test "$M" = "$out/prefix/bin/marlaas"
cd "$out"

help=$(marlaas submit --help)
for w in --token --api MARLAAS_TOKEN --dataset; do
    check "submit --help names $w" grep -q -- "$w" <<< "$help"
done

# 300 records over 95 distinct prompts
for i in $(seq 0 299); do
    k=$((i % 95))
    printf '{"prompt": "sum %d+%d=", "answer": "%d"}\n' $k $((7 * k)) $((8 * k))
done > "$out/sums.jsonl"
printf '{"prompt": "a", "answer": "1"}\n{"prompt": "b" "answer": "2"}\n' > "$out/broken.jsonl"

cluster_up --model "$out/prefix/share/marlaas/models/micro"
export MARLAAS_TOKEN=$(marlaas tenant create newcomer | awk '/^token/{print $2}')
check "tenant token" test -n "$MARLAAS_TOKEN"

if marlaas submit --dataset "$out/broken.jsonl" 2> "$out/broken.err"; then
    echo "FAILED: an invalid dataset was accepted"; fail=1
fi
check "the dataset error names the file as given and the line ($(cat "$out/broken.err"))" \
    grep -q "$out/broken.jsonl:2: " "$out/broken.err"

job=$(marlaas submit --dataset "$out/sums.jsonl" --steps 4 --prompts 4 --eval-every 2 --lr 0.003)
check "job id" grep -qE '^j-[0-9]+$' <<< "$job"
wait_jobs "$MARLAAS_TOKEN" 300
marlaas watch --once > "$out/watch.txt"
check "watch shows the job" grep -q "$job .*sums" "$out/watch.txt"
marlaas status "$job" > "$out/status.json"
check "job done" grep -q '"status":[[:space:]]*"done"' "$out/status.json"
check "task named after the file" grep -q '"task":[[:space:]]*"sums",' "$out/status.json"
check "lr shown as written" grep -q '"lr":[[:space:]]*0.003,' "$out/status.json"

marlaas eval --model "$out/prefix/share/marlaas/models/micro" --dataset "$out/sums.jsonl" --n 500 > "$out/eval.txt"
n_eval=$(awk -F'|' '/sums/ && NF > 4 {gsub(/ /, "", $5); print $5; exit}' "$out/eval.txt")
n_job=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["eval_n"])' < "$out/status.json")
check "marlaas eval counts distinct held-out prompts ($n_eval of 95)" test "${n_eval:-0}" -ge 1 -a "${n_eval:-999}" -lt 95
check "marlaas eval says the held-out set is smaller than asked" grep -q "distinct held-out prompts, each evaluated once (asked for 500)" "$out/eval.txt"
check "the job's eval n ($n_job) = marlaas eval's n ($n_eval)" test "$n_job" = "$n_eval"

marlaas adapter pull "$job" -o "$out/adapter" > /dev/null
check "adapter pulled" test -s "$out/adapter/adapter_model.safetensors" -a -s "$out/adapter/adapter_config.json"
gen=$(marlaas generate --job "$job" "sum 3+21=")
check "generate answers" test -n "$gen"

[ $fail = 0 ] && echo "own data: dataset job $job (task sums, lr 0.003) done; eval n $n_job distinct of 300 lines; adapter pulled; generate: $(head -c 40 <<< "$gen" | tr '\n' ' ')"
exit $fail

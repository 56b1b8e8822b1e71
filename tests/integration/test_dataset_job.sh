#!/usr/bin/env bash
# A user dataset (JSONL) drives eval and train-local end to end; an invalid dataset is refused
# whole with file:line.
set -euo pipefail
BIN=${MARLAAS_BIN:-build/bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 60); do
    printf '{"prompt": "double %d:", "answer": "%d"}\n' "$i" $((2 * i))
done > "$out/double.jsonl"
"$BIN"/marlaas eval --model models/micro --dataset "$out/double.jsonl" --verifier numeric --n 20 > "$out/eval.txt"
grep -q '| ' "$out/eval.txt"
"$BIN"/marlaas train-local --model models/micro --dataset "$out/double.jsonl" --verifier numeric --steps 4 \
    --prompts 4 --eval-every 4 --eval-n 10 --out "$out/adapter" 2> "$out/train.log" > /dev/null
[ -s "$out/adapter/adapter_model.safetensors" ] && [ -s "$out/adapter/adapter_config.json" ]
grep -q '"peft_type"' "$out/adapter/adapter_config.json"
printf '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n{"prompt": 3, "answer": "x"}\n' > "$out/bad.jsonl"
if "$BIN"/marlaas eval --model models/micro --dataset "$out/bad.jsonl" 2> "$out/bad.log"; then
    echo "invalid dataset accepted"; exit 1
fi
grep -q "bad.jsonl:3:" "$out/bad.log" || { cat "$out/bad.log"; exit 1; }
echo "dataset job: eval and 4 GRPO steps on a 60-record JSONL dataset; invalid line 3 refused: $(cat "$out/bad.log")"

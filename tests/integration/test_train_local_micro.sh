#!/usr/bin/env bash
# Synchronous GRPO (marlaas train-local) on the shipped micro model must raise a task's greedy
# eval accuracy by at least MARGIN points within STEPS steps. Fails if learning breaks.
set -euo pipefail
TASK=${TASK:-vowels}
STEPS=${STEPS:-200}
MARGIN=${MARGIN:-15}
BIN=${MARLAAS_BIN:-build/bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
line=$("$BIN"/marlaas train-local --model models/micro --task "$TASK" --steps "$STEPS" --eval-every "$STEPS" \
       --eval-n 400 --lr 0.003 --out "$out/adapter" --seed 3 2> "$out/log" | tail -n 1) || { tail -n 20 "$out/log"; exit 1; }
read -r task before after steps secs <<< "$line"
# the adapter written is a loadable PEFT adapter that reproduces the final accuracy
check=$("$BIN"/marlaas eval --model models/micro --adapter "$out/adapter" --task "$TASK" --n 400 | tail -n 1)
awk -v b="$before" -v a="$after" -v m="$MARGIN" -v t="$task" -v s="$secs" -v c="$check" 'BEGIN {
    gain = 100 * (a - b);
    printf "%s: eval accuracy %.1f%% -> %.1f%% (+%.1f points, required +%d) in %s s; reloaded adapter: %s\n", t, 100*b, 100*a, gain, m, s, c;
    exit !(gain >= m) }'

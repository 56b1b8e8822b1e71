#!/usr/bin/env bash
# `marlaas chat`: a conversation on stdin rendered with a model's chat template. The prompt equals
# the reference rendering (tests/chat/expected/chat.json, Jinja2 as Hugging Face runs it) byte for
# byte, from --config and from --model DIR (where chat_template.jinja replaces the config's
# template); bad input and contradictory flags end with exit 1 and a message.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${MARLAAS_BIN:-build/bin}
TMP=build/test-chat-cli
rm -rf $TMP
mkdir -p $TMP
fail=0
bad() { echo "FAILED: $*"; fail=1; }

# the request of conversation ID and the expected prompt for TEMPLATE
extract() { # extract TEMPLATE ID
    python3 - "$1" "$2" "$TMP" <<'PY'
import json, sys
tpl, cid, tmp = sys.argv[1:4]
for line in open("tests/chat/conversations.jsonl", encoding="utf-8"):
    c = json.loads(line)
    if c["id"] == cid:
        open(f"{tmp}/req.json", "w", encoding="utf-8").write(json.dumps(c["request"], ensure_ascii=False))
exp = json.load(open("tests/chat/expected/chat.json", encoding="utf-8"))["templates"][tpl][cid]
open(f"{tmp}/want.txt", "w", encoding="utf-8", newline="").write(exp.get("output", ""))
print("output" if "output" in exp else "error")
PY
}

n=0
for tpl in qwen3 llama3 llama3_1 gemma3 deepseek_v3 llama2; do
    for id in system_user multi_turn_system tool_call_round_trip enable_thinking_false unicode; do
        kind=$(extract $tpl $id)
        "$BIN/marlaas" chat --config tests/chat/templates/$tpl.json < $TMP/req.json > $TMP/got.txt 2> $TMP/err.txt
        rc=$?
        if [ "$kind" = output ]; then
            [ $rc -eq 0 ] || bad "$tpl/$id: exit $rc: $(cat $TMP/err.txt)"
            cmp -s $TMP/got.txt $TMP/want.txt || bad "$tpl/$id: the prompt differs from tests/chat/expected/chat.json"
        else
            [ $rc -eq 1 ] && [ -s $TMP/err.txt ] || bad "$tpl/$id: the reference refuses this conversation, marlaas chat exited $rc"
        fi
        n=$((n + 1))
    done
done

# --model DIR: tokenizer_config.json, and chat_template.jinja in its place when present
mkdir -p $TMP/model
cp tests/chat/templates/llama3_1.json $TMP/model/tokenizer_config.json
extract llama3_1 system_user > /dev/null
"$BIN/marlaas" chat --model $TMP/model < $TMP/req.json > $TMP/got.txt || bad "--model: exit $?"
cmp -s $TMP/got.txt $TMP/want.txt || bad "--model: the prompt differs from the reference"
printf '{%% for m in messages %%}<{{ m.role }}>{%% endfor %%}{{ bos_token }}\n' > $TMP/model/chat_template.jinja
out=$(echo '[{"role": "user", "content": "x"}]' | "$BIN/marlaas" chat --model $TMP/model)
[ "$out" = "<user><|begin_of_text|>" ] || bad "chat_template.jinja was not used: '$out'"

# flags and errors
out=$(echo '[{"role": "user", "content": "Hi"}]' | "$BIN/marlaas" chat --config tests/chat/templates/qwen3.json --no-generation-prompt)
[ "$out" = $'<|im_start|>user\nHi<|im_end|>' ] || bad "--no-generation-prompt: '$out'"
out=$(echo '{"messages": [], "add_generation_prompt": true}' | "$BIN/marlaas" chat --config tests/chat/templates/qwen3.json --no-generation-prompt 2>&1)
[ $? -eq 1 ] && [[ $out == *"add_generation_prompt to true"* ]] || bad "a contradicting flag was not refused: '$out'"
out=$(echo '[]' | "$BIN/marlaas" chat --config tests/chat/templates/qwen3.json --template nope 2>&1)
[ $? -eq 1 ] && [[ $out == *"no chat template named 'nope' (it has: default)"* ]] || bad "--template nope: '$out'"
out=$("$BIN/marlaas" chat --config tests/chat/templates/qwen3.json --list-templates)
[ "$out" = default ] || bad "--list-templates: '$out'"
out=$(echo '[{"role": "user"' | "$BIN/marlaas" chat --config tests/chat/templates/qwen3.json 2>&1)
[ $? -eq 1 ] && [[ $out == *"not valid JSON"* ]] || bad "bad JSON: '$out'"
out=$(echo '[{"role": "assistant", "content": "a"}]' | "$BIN/marlaas" chat --config tests/chat/templates/gemma3.json 2>&1)
[ $? -eq 1 ] && [[ $out == *"template error: Conversation roles must alternate"* ]] || bad "raise_exception: '$out'"
out=$("$BIN/marlaas" chat --config tests/chat/templates/llama2.json --model x 2>&1 < /dev/null)
[ $? -eq 2 ] || bad "--config with --model was accepted"
out=$("$BIN/marlaas" chat --config tests/chat/templates/gptoss-missing.json 2>&1 < /dev/null)
[ $? -eq 1 ] && [[ $out == *"gptoss-missing.json"* ]] || bad "a missing config: '$out'"

[ $fail -eq 0 ] || exit 1
echo "marlaas chat: $n conversations equal the reference byte for byte; --model, chat_template.jinja, flags and errors checked"

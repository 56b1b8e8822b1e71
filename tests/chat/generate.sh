#!/usr/bin/env bash
# Renders the chat-template fixtures (tests/chat/templates/*.json x conversations.jsonl, and the
# language pieces of snippets.jsonl) with the reference renderers and writes the expected results
# to tests/chat/expected/: Jinja2 as Hugging Face transformers runs it (render_python.py, Debian's
# python3-jinja2) is the reference; @huggingface/jinja (render_js.mjs, pinned in package-lock.json)
# is the second opinion, its differences listed in expected/js_differences.json.
#
#   tests/chat/generate.sh           rewrite tests/chat/expected/
#   tests/chat/generate.sh --check   render into build/chat-oracle/expected/ and compare with the
#                                    committed files (exit 1 when they differ)
#
# The npm package is installed once under build/chat-oracle (npm cache in build/npm-cache); when
# the registry is unreachable and nothing is installed yet, the script skips with exit 77.
set -euo pipefail
cd "$(dirname "$0")/../.."
check=0
[ "${1:-}" = --check ] && check=1
for tool in python3 node npm; do
    command -v $tool >/dev/null || { echo "generate.sh: missing $tool: run scripts/install-deps.sh"; exit 1; }
done
python3 -c 'import jinja2' 2>/dev/null ||
    { echo "generate.sh: python3 cannot import jinja2: install python3-jinja2 (scripts/install-deps.sh)"; exit 1; }
MODS=build/chat-oracle
CACHE=$PWD/build/npm-cache
mkdir -p $MODS
if ! cmp -s tests/chat/package-lock.json $MODS/package-lock.json || [ ! -d $MODS/node_modules/@huggingface/jinja ]; then
    cp tests/chat/package.json tests/chat/package-lock.json $MODS/
    if ! out=$(cd $MODS && npm ci --no-audit --no-fund --prefer-offline --cache "$CACHE" --loglevel=error 2>&1); then
        if ! timeout 40 npm ping --fetch-retries=0 --fetch-timeout=30000 --cache "$CACHE" >/dev/null 2>&1; then
            echo "SKIP: the npm registry is unreachable; the JavaScript reference (tests/chat/package-lock.json) is installed once, then runs offline from $MODS"
            exit 77
        fi
        echo "FAILED: npm ci of tests/chat/package-lock.json, with the registry reachable:"
        echo "$out"
        exit 1
    fi
fi
python3 tests/chat/render_python.py $MODS/python.json
node tests/chat/render_js.mjs $MODS $MODS/js.json
if [ $check = 1 ]; then
    mkdir -p $MODS/expected
    python3 tests/chat/compare.py $MODS/python.json $MODS/js.json $MODS/expected
    # the results must agree; the renderers' versions (metadata) may differ
    if ! python3 - tests/chat/expected $MODS/expected <<'PY'; then
import json, sys
a, b = sys.argv[1:3]
bad = []
for f in ("chat.json", "snippets.json", "js_differences.json"):
    x, y = (json.load(open(f"{d}/{f}", encoding="utf-8")) for d in (a, b))
    for k in ("renderer", "reference", "second_opinion"):
        x.pop(k, None), y.pop(k, None)
    if x != y:
        bad.append(f)
if bad:
    print("differs:", ", ".join(bad))
sys.exit(1 if bad else 0)
PY
        echo "FAILED: the committed tests/chat/expected/ differs from a fresh rendering ($MODS/expected)"
        exit 1
    fi
    echo "tests/chat/expected/ matches a fresh rendering ($(python3 -c 'import jinja2; print("Jinja2", jinja2.__version__)'))"
else
    python3 tests/chat/compare.py $MODS/python.json $MODS/js.json tests/chat/expected
fi

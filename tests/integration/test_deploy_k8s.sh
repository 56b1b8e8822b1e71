#!/usr/bin/env bash
# The Kubernetes manifests, checked offline: every overlay (deploy/k8s/overlays/*) renders with
# `kubectl kustomize`, and the output passes deploy/k8s/check/validate.js: the Kubernetes OpenAPI
# schemas (npm packages kubernetes-models and @kubernetes/client-node, pinned in
# deploy/k8s/check/package-lock.json), no unknown fields, and the consistency of our objects
# (probes, resources, Service selectors and ports, endpoints in the ConfigMap, GPUs only where
# the overlay puts them, the CURVE keys mounted per service). Nine broken variants of the rendered
# manifests must each be refused.
set -euo pipefail
fail=0
for tool in kubectl node npm; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# The checker's npm packages (pinned in deploy/k8s/check/package-lock.json) are installed once
# under build/deploy-check (tests/npm_install_once.sh): later runs need no network, and a
# machine that cannot reach the registry skips this test, saying so.
CHECK=deploy/k8s/check
MODS=build/deploy-check
bash tests/npm_install_once.sh $CHECK $MODS "the manifest checker's schemas"
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
refuse "a pod given another service's secret key" "the keys volume holds another service's secret key" \
    '0,/- key: rollout.key_secret/{s/- key: rollout.key_secret/- key: trainer.key_secret/}'
refuse "keys not mounted" "mounts no secret at MARLAAS_KEYS" 's|mountPath: /etc/marlaas/keys|mountPath: /etc/marlaas/other|'
refuse "Redis without a password" "Redis without --requirepass" 's/"--requirepass",*//; s/- --requirepass$/- --appendonly/'
refuse "a policy naming a port the pods lack" "names port wrk, which the selected pods do not name" 's/- port: work$/- port: wrk/'
refuse "no default deny" "no default-deny NetworkPolicy" '/name: default-deny-ingress/,/policyTypes/{s/podSelector: {}/podSelector: {matchLabels: {x: y}}/}'
refuse "endpoint to a missing port" "MARLAAS_WORK=tcp://scheduler:7009: Service scheduler has no port 7009" 's/tcp:\/\/scheduler:7001/tcp:\/\/scheduler:7009/'

[ $fail = 0 ] && echo "k8s: overlays ($(ls deploy/k8s/overlays | tr '\n' ' ')) valid under kubectl $kver + schemas, 9 broken variants refused"
exit $fail

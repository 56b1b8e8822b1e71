#!/usr/bin/env bash
# The deployment files, checked offline:
#   Kubernetes: every overlay (deploy/k8s/overlays/*) renders with `kubectl kustomize`, and the
#     output passes deploy/k8s/check/validate.js: the Kubernetes OpenAPI schemas (npm packages
#     kubernetes-models and @kubernetes/client-node, pinned in deploy/k8s/check/package-lock.json),
#     no unknown fields, and the consistency of our objects (probes, resources, Service
#     selectors and ports, endpoints in the ConfigMap, GPUs only where the overlay puts them).
#     Four broken variants of the rendered manifests must each be refused.
#   docker-compose: `docker-compose config` accepts docker-compose.yml alone and with the GPU
#     override; rollout and verifier stay scalable (no container name, no host port); Redis keeps
#     an append-only file on a volume; every service has a health check and a restart policy;
#     without MARLAAS_ADMIN_TOKEN the file is refused with the reason.
#   Dockerfile: the runtime stage's package list (deploy/docker/runtime-packages.txt) is exactly
#     the set of Debian packages that provide the libraries the shipped binaries load (DT_NEEDED,
#     resolved with ldd on this Debian machine); every listed package exists; every COPY source
#     exists; the entrypoint starts the service its first argument names.
set -euo pipefail
BIN=${MARLAAS_BIN:-build/bin}
source tests/integration/lib.sh
fail=0
for tool in kubectl docker-compose node npm python3; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# --- Kubernetes ---------------------------------------------------------------------------------
CHECK=deploy/k8s/check
if [ ! -d $CHECK/node_modules ] || [ $CHECK/package-lock.json -nt $CHECK/node_modules ]; then
    (cd $CHECK && npm ci --no-audit --no-fund --loglevel=error) || { echo "npm ci in $CHECK failed"; exit 1; }
    touch $CHECK/node_modules
fi
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
echo "manifests: rendered with kubectl $kver (kustomize built in), 4 broken variants refused"

# --- docker-compose -----------------------------------------------------------------------------
export MARLAAS_ADMIN_TOKEN=compose-check-token-0123
check "docker-compose config" docker-compose -f docker-compose.yml config -q
check "docker-compose config with the GPU override" docker-compose -f docker-compose.yml -f docker-compose.gpu.yml config -q
docker-compose -f docker-compose.yml config > "$TMP/compose.yaml"
docker-compose -f docker-compose.yml -f docker-compose.gpu.yml config > "$TMP/compose-gpu.yaml"
check "compose semantics" python3 - "$TMP/compose.yaml" "$TMP/compose-gpu.yaml" <<'EOF'
import sys, yaml
ok = True
def bad(m):
    global ok
    print("compose:", m)
    ok = False
base, gpu = (yaml.safe_load(open(p)) for p in sys.argv[1:3])
s = base["services"]
for name in ("redis", "scheduler", "trainer", "verifier", "rollout"):
    if name not in s: bad(f"no service {name}"); continue
    if "healthcheck" not in s[name]: bad(f"{name} has no healthcheck")
    if s[name].get("restart") not in ("always", "unless-stopped", "on-failure"): bad(f"{name} has no restart policy")
for name in ("verifier", "rollout"):
    if "container_name" in s[name] or s[name].get("ports"): bad(f"{name} cannot be scaled (container name or host port)")
    if s[name]["environment"].get("MARLAAS_VERIFIERS") != "tcp://verifier:7010": bad("rollouts must find verifiers by service name")
cmd = " ".join(s["redis"].get("command", []))
if "--appendonly yes" not in cmd: bad("redis without an append-only file")
if not any(":/data" in str(v) for v in s["redis"].get("volumes", [])) and not any(
        isinstance(v, dict) and v.get("target") == "/data" for v in s["redis"].get("volumes", [])): bad("redis data not on a volume")
for name in ("trainer", "rollout"):
    dev = gpu["services"][name].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if not any("gpu" in d.get("capabilities", []) for d in dev): bad(f"GPU override: {name} reserves no GPU")
    if "cuda" not in gpu["services"][name]["image"]: bad(f"GPU override: {name} not on the CUDA image")
    if gpu["services"][name]["environment"].get("MARLAAS_BACKEND") != "cuda": bad(f"GPU override: {name} not on the CUDA backend")
    if gpu["services"][name]["environment"].get("MARLAAS_REDIS") != "redis:6379": bad(f"GPU override: {name} lost the shared settings")
sys.exit(0 if ok else 1)
EOF
unset MARLAAS_ADMIN_TOKEN
if out=$(docker-compose -f docker-compose.yml config -q 2>&1); then
    echo "FAILED: docker-compose accepted a configuration without MARLAAS_ADMIN_TOKEN"; fail=1
else
    check "compose names the missing token" grep -q "set MARLAAS_ADMIN_TOKEN" <<< "$out"
fi
echo "compose: $(docker-compose version --short 2>/dev/null || echo '?') validated docker-compose.yml and the GPU override"

# --- Dockerfile ---------------------------------------------------------------------------------
shipped=$(sed -n 's/.*bins="\(.*\)";.*/\1/p' Dockerfile)
check "Dockerfile names the shipped binaries" [ -n "$shipped" ]
needed=()
for b in $shipped; do
    check "$BIN/$b exists" [ -x "$BIN/$b" ]
    [ -x "$BIN/$b" ] || continue
    for lib in $(readelf -d "$BIN/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        path=$(ldd "$BIN/$b" | awk -v l="$lib" '$1 == l {print $3}')
        real=$(readlink -f "$path")
        # usrmerge: dpkg may know the file under /lib
        pkg=$(dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || true)
        pkg=${pkg%%:*}
        [ -n "$pkg" ] || { echo "FAILED: no Debian package provides $lib ($real) of $b"; fail=1; continue; }
        needed+=("$pkg")
    done
done
# libc6 is in every Debian image; the sanitizer runtimes are there only in `make test SAN=1`
# builds (the image is built without SAN)
want=$(printf '%s\n' "${needed[@]}" | grep -vxE 'libc6|libasan[0-9]*|libubsan[0-9]*' | sort -u)
have=$(grep -v '^#' deploy/docker/runtime-packages.txt | sort -u)
if [ "$want" != "$have" ]; then
    echo "FAILED: deploy/docker/runtime-packages.txt differs from the packages the binaries need:"
    diff <(echo "$have") <(echo "$want") | sed 's/^/    /'
    fail=1
fi
for p in $(cat deploy/docker/build-packages.txt deploy/docker/runtime-packages.txt); do
    apt-cache show "$p" > /dev/null 2>&1 || { echo "FAILED: Debian has no package $p"; fail=1; }
done
for src in $(grep '^COPY ' Dockerfile | grep -v -- '--from=' | awk '{for (i = 2; i < NF; i++) print $i}'); do
    [ -e "$src" ] || { echo "FAILED: Dockerfile copies $src, which does not exist"; fail=1; }
done
out=$(MARLAAS_BIN_DIR=$BIN bash deploy/docker/entrypoint.sh verifier --help)
check "entrypoint starts the named service" grep -q "usage: marlaas-verifier" <<< "$out"
check "entrypoint without arguments: usage, exit 2" sh -c "bash deploy/docker/entrypoint.sh 2>/dev/null; [ \$? = 2 ]"
echo "image: runtime packages = what the binaries load ($(echo $have | wc -w) packages: $(echo $have))"

[ $fail = 0 ] && echo "deploy: k8s overlays ($(ls deploy/k8s/overlays | tr '\n' ' ')) valid under kubectl $kver + schemas, compose valid, image libraries exact"
exit $fail

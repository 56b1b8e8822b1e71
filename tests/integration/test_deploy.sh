#!/usr/bin/env bash
# The container files, checked offline (the Kubernetes manifests: test_deploy_k8s.sh):
#   docker-compose: `docker-compose config` accepts docker-compose.yml alone and with the GPU
#     override; rollout and verifier stay scalable (no container name, no host port); Redis keeps
#     an append-only file on a volume; every service has a health check and a restart policy;
#     without MARLAAS_ADMIN_TOKEN the file is refused with the reason.
#   Dockerfile: the runtime stage's packages (role "image" of scripts/packages.txt) are exactly
#     the Debian packages that provide the libraries the shipped binaries load (DT_NEEDED,
#     resolved with ldd on this Debian machine); every package the image installs exists; every
#     COPY source exists; the entrypoint starts the service its first argument names.
set -euo pipefail
BIN=${MARLAAS_BIN:-build/bin}
source tests/integration/lib.sh
fail=0
for tool in docker-compose python3; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# --- docker-compose -----------------------------------------------------------------------------
export MARLAAS_ADMIN_TOKEN=compose-check-token-0123 MARLAAS_REDIS_PASSWORD=compose-check-password-0123
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
# CURVE: every service reads the keys (read-only) that the one-shot "keys" service made
if "keys" not in s or "keys generate /keys" not in " ".join(s["keys"].get("entrypoint", [])): bad("no keys service")
for name in ("scheduler", "trainer", "verifier", "rollout"):
    if s[name]["environment"].get("MARLAAS_KEYS") != "/keys": bad(f"{name} has no MARLAAS_KEYS")
    if s[name]["environment"].get("MARLAAS_INSECURE"): bad(f"{name} runs with plain links")
    vols = s[name].get("volumes", [])   # "SRC:/keys:ro" (compose 1.x) or the long form
    if not any(str(v).endswith(":/keys:ro") or (isinstance(v, dict) and v.get("target") == "/keys" and v.get("read_only"))
               for v in vols): bad(f"{name} does not mount the keys read-only")
    if s[name].get("depends_on", {}).get("keys", {}).get("condition") != "service_completed_successfully":
        bad(f"{name} may start before the keys exist")
cmd = " ".join(s["redis"].get("command", []))
if "requirepass" not in cmd: bad("redis without a password")
for name in ("scheduler", "trainer", "verifier", "rollout"):
    if not s[name]["environment"].get("MARLAAS_REDIS_PASSWORD"): bad(f"{name} has no MARLAAS_REDIS_PASSWORD")
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
export MARLAAS_ADMIN_TOKEN=compose-check-token-0123
unset MARLAAS_REDIS_PASSWORD
if out=$(docker-compose -f docker-compose.yml config -q 2>&1); then
    echo "FAILED: docker-compose accepted a configuration without MARLAAS_REDIS_PASSWORD"; fail=1
else
    check "compose names the missing Redis password" grep -q "set MARLAAS_REDIS_PASSWORD" <<< "$out"
fi
unset MARLAAS_ADMIN_TOKEN
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
have=$(sh scripts/packages.sh image | sort -u)
if [ "$want" != "$have" ]; then
    echo "FAILED: the packages of role image in scripts/packages.txt differ from the packages the binaries need:"
    diff <(echo "$have") <(echo "$want") | sed 's/^/    /'
    fail=1
fi
for p in $(sh scripts/packages.sh build image-build image); do
    apt-cache show "$p" > /dev/null 2>&1 || { echo "FAILED: Debian has no package $p"; fail=1; }
done
for src in $(grep '^COPY ' Dockerfile | grep -v -- '--from=' | awk '{for (i = 2; i < NF; i++) print $i}'); do
    [ -e "$src" ] || { echo "FAILED: Dockerfile copies $src, which does not exist"; fail=1; }
done
out=$(MARLAAS_BIN_DIR=$BIN bash deploy/docker/entrypoint.sh verifier --help)
check "entrypoint starts the named service" grep -q "usage: marlaas-verifier" <<< "$out"
check "entrypoint without arguments: usage, exit 2" sh -c "bash deploy/docker/entrypoint.sh 2>/dev/null; [ \$? = 2 ]"
echo "image: runtime packages = what the binaries load ($(echo $have | wc -w) packages: $(echo $have))"

[ $fail = 0 ] && echo "deploy: compose files valid, image packages = the binaries' libraries"
exit $fail

#!/usr/bin/env bash
# Installs the Debian packages MARLaaS builds and runs with, when any is missing.
# Runs apt-get directly as root, through sudo otherwise; prints the command when neither works.
set -euo pipefail

PKGS=(build-essential pkg-config
      libopenblas-dev libopenblas-openmp-dev libcjson-dev libcriterion-dev
      libzmq3-dev libczmq-dev libmsgpack-dev libhiredis-dev libsodium-dev libmicrohttpd-dev redis-server valgrind iproute2
      curl gnuplot-nox)   # curl: the tests read /metrics; gnuplot: the benchmark report's plots

# The deployment checks (tests/integration/test_deploy.sh): docker-compose validates the compose
# files, kubectl renders the kustomize overlays, Node.js runs the schema checker. A kubectl or
# npm that is already installed (from any source) is used as is.
PKGS+=(docker-compose)
command -v kubectl >/dev/null 2>&1 || PKGS+=(kubernetes-client)
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm after Node.js: a Node.js package that bundles npm conflicts with Debian's npm package
need_npm() { ! command -v npm >/dev/null 2>&1; }
[ ${#missing[@]} -eq 0 ] && ! need_npm && exit 0

echo "marlaas: installing missing Debian packages: ${missing[*]}$(need_npm && echo ' (then npm)')" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    echo "marlaas: cannot install packages (not root, no sudo). Run as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]} && (command -v npm || apt-get install -y npm)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if need_npm; then
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
echo "marlaas: packages installed" >&2

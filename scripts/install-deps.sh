#!/usr/bin/env bash
# Installs the Debian packages a development machine needs (scripts/packages.txt, roles build,
# run, test, bench and deploy-check), when any is missing. Runs apt-get directly as root,
# through sudo otherwise; prints the command to run when neither works. `make` runs it before
# it probes the machine, so `make demo` and `make test` work on a fresh Debian 12.
set -euo pipefail
here=$(dirname "$0")

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# Packages marked NAME? in packages.txt are skipped when the command NAME is already installed
# (from any source), and decided one at a time, in the list's order, after the others: npm is
# looked for only once Node.js is there (a Node.js that bundles npm conflicts with Debian's npm).
plain=()
when_missing=()
while read -r pkg progs; do
    if [[ " $progs " == *"? "* ]]; then when_missing+=("$pkg $progs"); else plain+=("$pkg"); fi
done < <(sh "$here/packages.sh" --lines dev)

missing=()
for p in "${plain[@]}"; do installed "$p" || missing+=("$p"); done
needs() {   # needs "PACKAGE PROGRAM? ...": the package is needed now
    local pkg=$1 w
    shift
    installed "$pkg" && return 1
    for w in "$@"; do
        [[ $w == *\? ]] && command -v "${w%\?}" >/dev/null 2>&1 && return 1
    done
    return 0
}
later=()
for l in "${when_missing[@]}"; do
    # shellcheck disable=SC2086
    needs $l && later+=("${l%% *}")
done
[ ${#missing[@]} -eq 0 ] && [ ${#later[@]} -eq 0 ] && exit 0

echo "marlaas: installing missing Debian packages: ${missing[*]} ${later[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    echo "marlaas: cannot install packages (not root, no sudo). Run as root:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]} ${later[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt() {
    if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
        echo "marlaas: apt-get install $* failed (see above); is Debian's package archive reachable?" >&2
        exit 1
    fi
}
"${SUDO[@]}" apt-get update -qq
[ ${#missing[@]} -gt 0 ] && apt "${missing[@]}"
for l in "${when_missing[@]}"; do
    # shellcheck disable=SC2086
    needs $l && apt "${l%% *}"
done
echo "marlaas: packages installed" >&2

#!/bin/sh
# Reads scripts/packages.txt (the one list of the Debian packages MARLaaS uses).
#   packages.sh ROLE...           the packages that have any of the roles, one per line
#   packages.sh --lines ROLE...   the same packages with their programs: "PACKAGE PROGRAM..."
# ROLE "dev" stands for the roles of a development machine: build run test bench deploy-check.
# MARLAAS_PACKAGES=FILE reads another list (the dependency test's self-check).
set -eu
list=${MARLAAS_PACKAGES:-$(dirname "$0")/packages.txt}
lines=0
[ "${1:-}" = --lines ] && { lines=1; shift; }
[ $# -gt 0 ] || { echo "usage: packages.sh [--lines] ROLE..." >&2; exit 2; }
awk -v want="$*" -v lines=$lines '
function known(x) { return x ~ /^(build|run|test|bench|deploy-check|image-build|image|cuda-build|cuda-image|optional)$/ }
BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) {
            if (w[i] != "dev" && !known(w[i])) { print "packages.sh: unknown role " w[i] > "/dev/stderr"; bad = 1; exit 2 }
            if (w[i] == "dev") { split("build run test bench deploy-check", d, " "); for (k in d) role[d[k]] = 1 }
            else role[w[i]] = 1 } }
/^[[:space:]]*(#|$)/ { next }
{ m = split($2, r, ","); hit = 0
  for (i = 1; i <= m; i++) {
      if (!known(r[i])) {
          printf "packages.txt:%d: unknown role %s\n", NR, r[i] > "/dev/stderr"; bad = 1; exit 1 }
      if (r[i] in role) hit = 1 }
  if (!hit) next
  if (!lines) { print $1; next }
  out = $1; for (i = 3; i <= NF; i++) out = out " " $i; print out }
END { if (bad) exit bad }' "$list"

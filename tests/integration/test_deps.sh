#!/usr/bin/env bash
# Every program the project's scripts run, and every library the Makefile links, comes from a
# package of scripts/packages.txt (the list install-deps.sh installs), so a fresh Debian machine
# has it after `make`:
#   - the programs: every shell script (scripts/, tests/, bench/, deploy/, .ci/run), the
#     Makefile's recipes and $(shell) calls (parsed with shfmt: tests/integration/shell_commands.py),
#     and the programs the C code starts by name (execvp of a literal argv[0]). Each must be found
#     here and come from a listed package, from a package every Debian system has (Essential or
#     Priority required: what `debootstrap --variant=minbase` installs), or, where dpkg does not
#     know the file (a Node.js from NodeSource), be declared as a program of a listed package.
#     A declared program must come from a package the list installs (with dependencies).
#   - the libraries: each -lNAME of the Makefile's LDLIBS and of the unit tests' link comes from
#     a listed package or one it depends on (the compiler's own, from build-essential).
# The list itself must parse, and every package in it must exist in Debian. Self-check: the same
# check with procps left out of the list fails, naming pgrep.
set -uo pipefail
fail=0
bad() { echo "FAILED: $*"; fail=1; }
LIST=${MARLAAS_PACKAGES:-scripts/packages.txt}
for tool in shfmt python3 dpkg-query apt-cache; do
    command -v $tool >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
dev=$(sh scripts/packages.sh dev) || { echo "FAILED: $LIST does not parse"; exit 1; }
declare -A listed declared any_source optional own
for p in $dev; do listed[$p]=1; done
while read -r pkg progs; do
    for w in $progs; do
        declared[${w%\?}]=$pkg
        [[ $w == *\? ]] && any_source[${w%\?}]=1
    done
done < <(sh scripts/packages.sh --lines dev)
for w in $(sh scripts/packages.sh --lines optional | cut -d' ' -f2-); do optional[$w]=1; done

# the listed packages and everything they depend on
closure=" $(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances $dev 2>/dev/null | grep -v '^ ' | tr -d '<>' | sort -u | tr '\n' ' ') "
declare -A owner_of
owners() {   # owners PATH...: learns which Debian package installed each file (one dpkg query)
    local f g pkgs path
    local -a ask=()
    for f in "$@"; do
        for g in "$f" "$(readlink -f "$f")"; do ask+=("$g" "${g#/usr}" "/usr$g"); done   # usrmerge: /bin = /usr/bin
    done
    while IFS= read -r line; do
        [[ $line == diversion* ]] && continue
        pkgs=${line%%: /*}
        path=/${line#*: /}
        pkgs=${pkgs%%,*}
        owner_of[$path]=${pkgs%%:*}
    done < <(dpkg-query -S "${ask[@]}" 2>/dev/null)
}
owner() {   # owner PATH: the package of a file owners has seen, or nothing
    local f g
    for f in "$1" "$(readlink -f "$1")"; do
        for g in "$f" "${f#/usr}" "/usr$f"; do
            [ -n "${owner_of[$g]:-}" ] && { echo "${owner_of[$g]}"; return 0; }
        done
    done
    return 1
}
base_system() {   # base_system PACKAGE: every Debian system has it
    local pe
    pe=$(dpkg-query -W -f='${Priority} ${Essential}' "$1" 2>/dev/null)
    [[ $pe == required* || $pe == *yes ]]
}

# --- the programs -------------------------------------------------------------------------------
mapfile -t scripts < <(find scripts tests bench deploy -name '*.sh' -not -path '*/node_modules/*' | sort; echo .ci/run)
uses=$(python3 tests/integration/shell_commands.py "${scripts[@]}" && python3 tests/integration/shell_commands.py --make Makefile) ||
    { echo "FAILED: shell_commands.py could not read the scripts"; exit 1; }
# C: argv arrays started with execvp whose first element is a literal
for f in $(grep -rlE 'exec(v|vp|lp)\(' --include='*.c' cli common services tools examples); do
    grep -noE '\[\] *= *\{ *"[a-z][a-z0-9_.+-]*"' "$f" | sed -E 's/^([0-9]+):.*"([^"]+)"$/\2\t'"${f//\//\\/}"':\1/'
done > build/deps-c-exec.txt
uses+=$'\n'$(cat build/deps-c-exec.txt)
# the project's own programs (build/bin: the CLI, the services, examples, tools), run from PATH
# by tests that install them
for f in "${MARLAAS_BIN:-build/bin}"/*; do [ -x "$f" ] && own[$(basename "$f")]=1; done
mapfile -t paths < <(cut -f1 <<< "$uses" | sort -u | while read -r p; do [ -n "$p" ] && [ -z "${own[$p]:-}" ] && command -v "$p"; done | grep '^/')
owners "${paths[@]}"
n_prog=0
declare -A seen
while IFS=$'\t' read -r prog where; do
    [ -n "$prog" ] || continue
    [ -n "${seen[$prog]:-}" ] && continue
    seen[$prog]=1
    n_prog=$((n_prog + 1))
    [ -n "${optional[$prog]:-}" ] && continue
    [ -n "${own[$prog]:-}" ] && continue
    path=$(command -v "$prog" 2>/dev/null)
    if [ -z "$path" ] || [[ $path != /* ]]; then
        bad "$prog (run at $where) is not installed: add the Debian package that provides it to $LIST"
        continue
    fi
    pkg=$(owner "$path")
    dec=${declared[$prog]:-}
    if [ -n "${any_source[$prog]:-}" ]; then
        :   # used as installed, from whatever source (NAME? in the list)
    elif [ -n "$pkg" ]; then
        if [ -n "$dec" ]; then
            [[ $closure == *" $pkg "* ]] ||
                bad "$LIST declares $prog as a program of $dec, but it comes from $pkg, which the list does not install"
        elif [ -z "${listed[$pkg]:-}" ] && ! base_system "$pkg"; then
            bad "$prog (run at $where) comes from the package $pkg, which $LIST does not list"
        fi
    elif [ -z "$dec" ]; then
        bad "$prog (run at $where; $path) belongs to no Debian package here and no package of $LIST declares it"
    fi
done <<< "$uses"

# --- the libraries ------------------------------------------------------------------------------
ldlibs=$(make -s --no-print-directory print-LDLIBS)
libdirs=$(tr ' ' '\n' <<< "$ldlibs" | sed -n 's/^-L//p')
n_lib=0
for l in $(tr ' ' '\n' <<< "$ldlibs -lcriterion" | sed -n 's/^-l//p' | sort -u); do
    n_lib=$((n_lib + 1))
    so=""
    for d in $libdirs; do [ -e "$d/lib$l.so" ] && so="$d/lib$l.so" && break; done
    [ -n "$so" ] || so=$(cc -print-file-name="lib$l.so")
    [[ $so == /* ]] || so=$(cc -print-file-name="lib$l.a")
    [[ $so == /* ]] && so=$(realpath -s "$so")
    if [[ $so != /* ]]; then bad "-l$l: lib$l.so is not installed: add its -dev package to $LIST"; continue; fi
    owners "$so"
    pkg=$(owner "$so")
    if [ -z "$pkg" ]; then
        bad "-l$l: $so belongs to no Debian package"
    elif [ -z "${listed[$pkg]:-}" ] && [[ $closure != *" $pkg "* ]]; then
        bad "-l$l comes from $pkg, which $LIST does not list"
    fi
done

# --- the list -----------------------------------------------------------------------------------
all=$(sh scripts/packages.sh build run test bench deploy-check image-build image | sort -u)
n_pkg=$(wc -w <<< "$all")
known=$(apt-cache show --no-all-versions $all 2>/dev/null | sed -n 's/^Package: //p' | sort -u)
for p in $(comm -23 <(echo "$all") <(echo "$known")); do bad "$LIST lists $p, which Debian does not have"; done

# The check must catch a missing package: without procps, pgrep (test_dp_trainer.sh) is unprovided.
if [ -z "${MARLAAS_PACKAGES:-}" ] && [ $fail = 0 ]; then
    mkdir -p build
    grep -v '^procps ' scripts/packages.txt > build/packages-without-procps.txt
    if out=$(MARLAAS_PACKAGES=build/packages-without-procps.txt bash "$0" 2>&1); then
        bad "the check passed with procps removed from the list"
    elif ! grep -q "^FAILED: pgrep (run at tests/integration/.*) comes from the package procps, which build/packages-without-procps.txt does not list" <<< "$out"; then
        bad "with procps removed from the list, the check did not name pgrep:"; echo "$out"
    fi
fi

[ $fail = 0 ] && echo "deps: $n_prog programs run by $((${#scripts[@]} + 1)) scripts, the Makefile and the C code, and $n_lib libraries linked, all from the $n_pkg packages of $LIST or the base system; without procps it fails on pgrep"
exit $fail

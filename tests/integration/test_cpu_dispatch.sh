#!/usr/bin/env bash
# The CPU kernels are chosen at run time, and the binaries are not built for the build host:
#   - every compilation unit of build/bin/marlaas was compiled for the x86-64 baseline (no -march,
#     read from the -march each unit's DWARF producer string records), except the three CPU kernel
#     variants (kernels/cpu/cpu.c for x86-64-v4, x86-64-v3 and the baseline); so no -march=native,
#     which GCC records as the host's -march=<cpu> with its list of extensions;
#   - on a CPU whose /proc/cpuinfo has AVX-512 (x86-64-v4), `marlaas info` reports an avx512
#     variant (avx512-bf16 where the CPU has avx512_bf16 too, amx where it has amx_tile and
#     amx_bf16 as well);
#   - MARLAAS_CPU_ISA=avx2 and =scalar are honoured and compute what the best variant computes, to
#     rounding: `marlaas score --generate` on models/tiny (fp32, then bf16 weights) gives the same
#     log-probs to 1e-4 and the same greedy tokens; with bf16 weights the same, but the
#     avx512-bf16 and amx variants round the activations of their products to bf16 (kernels.h),
#     which moves log-probs about as much as the weights' own rounding does (measured on these ids:
#     mean 0.03, max 0.31-0.33 on log-probs around -10; bf16 against fp32 weights mean 0.01, max
#     0.09): there the input log-probs are compared to 0.6 and their mean difference to 0.08, the
#     greedy tokens not (a choice between two tokens closer than that rounding flips);
#   - a MARLAAS_CPU_ISA that names no variant stops the program with status 2 and the valid values.
# Skipped (77) on a CPU without AVX-512, after the build check.
set -uo pipefail
BIN=${MARLAAS_BIN:-build/bin}
M="$BIN/marlaas"
fail=0
[ -x "$M" ] || { echo "FAILED: $M not built (make)"; exit 1; }
command -v readelf > /dev/null || { echo "FAILED: readelf (binutils) not installed"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# --- the build: -march of every compilation unit ----------------------------------------------
readelf --debug-dump=info "$M" 2> /dev/null | grep 'DW_AT_producer' | sed -n 's/.*DW_AT_producer.*\(GNU C.*\)/\1/p' |
    grep '^GNU C' > "$out/producers"
units=$(wc -l < "$out/producers")
if [ "$units" -lt 10 ]; then
    echo "FAILED: $M has no DWARF producer strings for its units ($units found; is it built with -g?)"
    exit 1
fi
# the -march of each unit (the last one given wins, as in GCC), "none" when there is none
awk '{ m = "none"; for (i = 1; i <= NF; i++) if ($i ~ /^-march=/) m = substr($i, 8); print m }' "$out/producers" |
    sort | uniq -c > "$out/marches"
others=$(awk '$2 != "x86-64" && $2 != "x86-64-v3" && $2 != "x86-64-v4" && $2 != "none"' "$out/marches")
if [ -n "$others" ]; then
    echo "FAILED: units of $M compiled for a particular CPU (a build with ARCH=... or -march=native?):"
    echo "$others"
    fail=1
fi
v4=$(awk '$2 == "x86-64-v4" {print $1}' "$out/marches")
v3=$(awk '$2 == "x86-64-v3" {print $1}' "$out/marches")
if [ "${v4:-0}" -ne 1 ] || [ "${v3:-0}" -ne 1 ]; then
    echo "FAILED: expected exactly one x86-64-v4 unit and one x86-64-v3 unit (the avx512 and avx2 kernel variants):"
    cat "$out/marches"
    fail=1
fi
[ "$fail" -eq 0 ] || exit 1

# --- the choice --------------------------------------------------------------------------------
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ $flags == *" $1 "* ]]; }
if ! (has avx512f && has avx512bw && has avx512cd && has avx512dq && has avx512vl); then
    echo "SKIP: this CPU has no AVX-512 (x86-64-v4) in /proc/cpuinfo; the build check passed ($units units, baseline but the kernel variants)"
    exit 77
fi
want=avx512
has avx512_bf16 && want=avx512-bf16
has avx512_bf16 && has amx_tile && has amx_bf16 && want=amx
isa() { MARLAAS_CPU_ISA=${1-} "$M" info | awk '$1 == "cpu-kernels" {print $2}'; }
best=$(isa "")
if [ "$best" != "$want" ]; then
    echo "FAILED: marlaas info reports the CPU kernels '$best' on a CPU with $want"
    "$M" info
    fail=1
fi
for v in avx2 scalar; do
    got=$(isa "$v")
    [ "$got" = "$v" ] || { echo "FAILED: MARLAAS_CPU_ISA=$v: marlaas info reports '$got'"; fail=1; }
done
if MARLAAS_CPU_ISA=avx3 "$M" info > /dev/null 2> "$out/bad.err"; then
    echo "FAILED: MARLAAS_CPU_ISA=avx3 was accepted"
    fail=1
else
    rc=$?
    [ "$rc" -eq 2 ] || { echo "FAILED: MARLAAS_CPU_ISA=avx3: exit status $rc, want 2"; fail=1; }
    grep -q "MARLAAS_CPU_ISA=avx3 names no CPU kernel variant: use one of amx, avx512-bf16, avx512, avx2, scalar (this CPU's best: $want)" \
        "$out/bad.err" || { echo "FAILED: MARLAAS_CPU_ISA=avx3: unexpected message:"; cat "$out/bad.err"; fail=1; }
fi

# --- the variants agree -----------------------------------------------------------------------
# three sequences of ids of the tiny model's character vocabulary (20, 9 and 33 tokens)
echo '[[52,72,69,0,67,65,80,73,84,65,76,0,79,70,0,70,82,65,78,67],[20,11,22,0,29,0,24,25,0],[84,72,69,0,81,85,73,67,75,0,66,82,79,87,78,0,70,79,88,0,74,85,77,80,83,0,79,86,69,82,0,84,72]]' \
    > "$out/ids.json"
GEN=16
# compare LABEL A.json B.json TOL GEN_TOL [MEAN_TOL]: the input log-probs within TOL, the greedy
# tokens equal and their log-probs within GEN_TOL; with MEAN_TOL (a variant that rounds every
# product's activations, whose greedy choices may flip where two tokens are within that rounding)
# the input log-probs' mean |diff| within MEAN_TOL instead of the greedy tokens
compare() {
    python3 - "$@" << 'EOF'
import json, sys
label, a, b, tol, gtol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
mtol = float(sys.argv[6]) if len(sys.argv) > 6 else None
A, B = json.load(open(a))["sequences"], json.load(open(b))["sequences"]
worst = gworst = total = 0.0
n = 0
ok = len(A) == len(B)
for x, y in zip(A, B):
    for p, q in zip(x["logprobs"][1:], y["logprobs"][1:]):
        worst = max(worst, abs(p - q))
        total += abs(p - q)
        n += 1
    if mtol is not None:
        continue
    if x["generated"] != y["generated"]:
        print(f"{label}: greedy tokens {x['generated']} vs {y['generated']}")
        ok = False
    for p, q in zip(x["generated_logprobs"], y["generated_logprobs"]):
        gworst = max(gworst, abs(p - q))
mean = total / max(n, 1)
if mtol is not None:
    ok = ok and n > 0 and worst <= tol and mean <= mtol
    print(f"{label}: input log-probs max |diff| {worst:.3g} (tol {tol:g}), mean |diff| {mean:.3g} (tol {mtol:g}): "
          f"{'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
ok = ok and worst <= tol and gworst <= gtol
print(f"{label}: input log-probs max |diff| {worst:.3g} (tol {tol:g}), greedy tokens equal, their log-probs "
      f"max |diff| {gworst:.3g} (tol {gtol:g}): {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
}
for w in fp32 bf16; do
    for v in "$best" avx2 scalar; do
        MARLAAS_CPU_ISA=$v "$M" score --model models/tiny --ids --generate $GEN --weights $w < "$out/ids.json" \
            > "$out/$w.$v.json" 2> "$out/$w.$v.err" || { echo "FAILED: score with MARLAAS_CPU_ISA=$v, weights $w:"; cat "$out/$w.$v.err"; fail=1; }
    done
    tol=1e-4 gtol=1e-4 mean=()
    # avx512-bf16 and amx round the activations of their products (see the top)
    [ "$w" = bf16 ] && { [ "$best" = amx ] || [ "$best" = avx512-bf16 ]; } && tol=0.6 mean=(0.08)
    for v in avx2 scalar; do
        compare "$w weights, $best vs $v" "$out/$w.$best.json" "$out/$w.$v.json" $tol $gtol "${mean[@]}" || fail=1
    done
done

[ "$fail" -eq 0 ] || exit 1
echo "cpu dispatch: $units units built for x86-64 but the avx512/avx2 kernel variants; $best chosen on this CPU;" \
    "avx2 and scalar (MARLAAS_CPU_ISA) agree with it on models/tiny (fp32 and bf16 weights, $GEN greedy tokens); avx3 refused"

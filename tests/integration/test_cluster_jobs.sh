#!/usr/bin/env bash
# Four jobs of two tenants on four tasks train together on models/micro (async policy) and each
# raises its eval accuracy; a tenant sees only its own jobs.
set -euo pipefail
source tests/integration/lib.sh
cluster_up --model models/micro
A=$(mk_tenant alice)
B=$(mk_tenant bob)
spec='--steps 150 --prompts 16 --group 8 --eval-every 150 --eval-n 200 --temperature 1.3'
j1=$(submit "$A" --task vowels $spec)
j2=$(submit "$B" --task pad $spec)
j3=$(submit "$A" --task rep $spec)
j4=$(submit "$B" --task wrap $spec)
wait_jobs "$A" 300
wait_jobs "$B" 300
fail=0
for pair in "$A $j1" "$B $j2" "$A $j3" "$B $j4"; do
    set -- $pair
    st=$(job_field "$1" "$2" status)
    a0=$(job_field "$1" "$2" eval_acc0)
    a1=$(job_field "$1" "$2" eval_acc)
    echo "$2: status $st, eval accuracy $a0 -> $a1"
    [ "$st" = done ] || fail=1
done
# isolation: alice cannot see or touch bob's job
if "$M" status --token "$A" "$j2" 2>/dev/null; then echo "alice saw bob's job"; fail=1; fi
"$M" jobs --token "$A" | grep -q "$j2" && { echo "bob's job listed for alice"; fail=1; }
exit $fail

#!/usr/bin/env bash
# report.sh - turns a results directory of bench/run.sh into report.md and SVG plots (gnuplot).
#
#   bench/report.sh DIR
set -euo pipefail
D=${1:?usage: bench/report.sh RESULTS_DIR}
cd "$D"
meta() { sed -n "s/^$1=//p" meta.txt; }
read -r -a NS <<< "$(meta ns)"
NMAX=${NS[-1]}
col() {   # col FILE LABEL N FIELD: a field of the e2e.csv row of a run
    awk -F, -v l="$2" -v n="$3" -v f="$4" 'NR == 1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
        $1 == l && $2 == n {print $(c[f])}' "$1"
}
pct() { awk -v x="$1" 'BEGIN {if (x == "") print "-"; else printf "%.0f%%", 100 * x}'; }
R=report.md

# --- derived data -----------------------------------------------------------------------------
# time vs N
awk -F, 'NR > 1 {t[$1 "," $2] = $3; n[$2] = 1}
    END {for (k in n) printf "%s %s %s %s\n", k, t["sync," k], t["async," k], (("sync-all," k) in t ? t["sync-all," k] : "NaN")}' \
    e2e.csv | sort -n > time_vs_n.dat
# utilization timelines of the largest run: busy fraction over a sliding 5-sample window, from
# the services' own accounting (busy seconds / seconds up)
for p in sync async; do
    f=e2e/$p-n$NMAX/timeline.csv
    [ -f "$f" ] || continue
    awk -F, 'NR > 1 && $2 != "" && $6 != "" {k++; t[k] = $1; rb[k] = $2; ru[k] = $3; tb[k] = $6; tu[k] = $7; rc[k] = $5; tc[k] = $9}
        END {for (i = 6; i <= k; i++) {j = i - 5; dt = t[i] - t[j]
            printf "%.1f %.3f %.3f %.3f %.3f\n", (t[i] + t[j]) / 2,
                (ru[i] > ru[j] ? (rb[i] - rb[j]) / (ru[i] - ru[j]) : 0), (tu[i] > tu[j] ? (tb[i] - tb[j]) / (tu[i] - tu[j]) : 0),
                (dt > 0 ? (rc[i] - rc[j]) / dt : 0), (dt > 0 ? (tc[i] - tc[j]) / dt : 0)}}' "$f" > "util_$p.dat"
done
# reward curves (moving mean over 10 steps) of four jobs under both policies
CURVE_TASKS="vowels wrap rep csort"
for p in sync async; do
    f=e2e/$p-n$NMAX/steps.csv
    [ -f "$f" ] || continue
    for t in $CURVE_TASKS; do
        awk -F, -v t="$t" 'NR > 1 && $3 == t {k++; r[k] = $5; s = 0; m = 0
            for (i = k; i > k - 10 && i > 0; i--) {s += r[i]; m++}
            printf "%d %.4f\n", $4, s / m}' "$f" > "reward_${p}_$t.dat"
    done
done

# --- plots ------------------------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<EOF
set terminal svg size 720,420 font "sans,12" background "white"
set output "time_vs_n.svg"
set title "End-to-end time for N jobs ($(meta model), $(meta steps) steps x $(meta prompts) prompts x $(meta group) samples each)"
set xlabel "concurrent jobs N"; set ylabel "wall time (s)"; set key top left; set grid
set logscale x 2; set xtics (1, 4, 8, 16, 32)
plot "time_vs_n.dat" u 1:2 w lp lw 2 pt 7 t "sync (one job after another)", \
     "" u 1:3 w lp lw 2 pt 5 t "async (all jobs at once)", \
     "" u 1:4 w p pt 9 ps 1.5 t "sync, every core per service"
unset logscale x; set xtics auto
do for [p in "sync async"] {
    if (system("test -s util_".p.".dat && echo 1") eq "1") {
        set output "utilization_".p.".svg"
        set title "Busy fraction, ".p.", N = $NMAX (own accounting; dashed: CPU time from /proc)"
        set xlabel "time (s)"; set ylabel "busy fraction"; set yrange [0:1.1]; set key bottom right
        plot "util_".p.".dat" u 1:2 w l lw 2 lc 1 t "rollout", "" u 1:3 w l lw 2 lc 2 t "trainer", \
             "" u 1:4 w l dt 2 lc 1 t "rollout CPU", "" u 1:5 w l dt 2 lc 2 t "trainer CPU"
        set autoscale y
    }
}
set output "rewards.svg"
set title "Training reward (mean of the last 10 steps), N = $NMAX: sync dashed, async solid"
set xlabel "step"; set ylabel "reward"; set key outside right
files = "$CURVE_TASKS"
plot for [i=1:words(files)] "reward_sync_".word(files, i).".dat" u 1:2 w l dt 2 lw 2 lc i t word(files, i)." sync", \
     for [i=1:words(files)] "reward_async_".word(files, i).".dat" u 1:2 w l lw 2 lc i t word(files, i)." async"
EOF
else
    echo "report.sh: gnuplot not found (apt-get install gnuplot-nox); report without plots" >&2
fi

# --- targets ----------------------------------------------------------------------------------
WS=$(col e2e.csv sync "$NMAX" wall_s)
WA=$(col e2e.csv async "$NMAX" wall_s)
RATIO=$(awk -v a="$WA" -v s="$WS" 'BEGIN {if (s > 0 && a != "") printf "%.4f", a / s}')
RB=$(col e2e.csv async "$NMAX" roll_busy_steady)
TB=$(col e2e.csv async "$NMAX" train_busy_steady)
# per-job quality at the largest N: final accuracy async - sync, by task
REP=e2e/sync-repeat-n$NMAX/jobs.csv
[ -f "$REP" ] || REP=/dev/null
awk -F, 'FNR == 1 {p = (FILENAME ~ /\/async-/) ? "a" : (FILENAME ~ /sync-repeat/) ? "r" : "s"; next}
    {task[$2] = 1; acc[p, $2] = $5; acc0[$2] = $4}
    END {for (t in task) if ((("s", t) in acc) && (("a", t) in acc))
        printf "%s,%.4f,%.4f,%.4f,%.4f,%s\n", t, acc0[t], acc["s", t], acc["a", t], acc["a", t] - acc["s", t],
            (("r", t) in acc) ? sprintf("%.4f", acc["r", t] - acc["s", t]) : ""}' \
    "e2e/sync-n$NMAX/jobs.csv" "e2e/async-n$NMAX/jobs.csv" "$REP" 2>/dev/null | sort > quality.csv || true
read -r QMEAN QWORST QN RMEAN RWORST RABS AABS < <(awk -F, '{s += $5; n++; if (n == 1 || $5 < w) w = $5; aa += ($5 < 0 ? -$5 : $5)
        if ($6 != "") {rs += $6; rn++; if (rn == 1 || $6 < rw) rw = $6; ra += ($6 < 0 ? -$6 : $6)}}
    END {printf "%.4f %.4f %d %s %s %s %.4f\n", (n ? s / n : 0), w, n, (rn ? rs / rn : "-"), (rn ? rw : "-"),
        (rn ? ra / rn : "-"), (n ? aa / n : 0)}' quality.csv)
pf() { awk -v c="$1" 'BEGIN {print (c ? "PASS" : "FAIL")}'; }
T1=$(pf "$(awk -v r="$RATIO" 'BEGIN {print (r != "" && r <= 0.10)}')")
T2R=$(pf "$(awk -v x="$RB" 'BEGIN {print (x != "" && x >= 0.9)}')")
T2T=$(pf "$(awk -v x="$TB" 'BEGIN {print (x != "" && x >= 0.9)}')")
T3=$(pf "$(awk -v m="$QMEAN" -v n="$QN" 'BEGIN {print (n > 0 && m >= -0.03 && m <= 0.03)}')")
T4=$(pf "$(awk -v w="$QWORST" -v n="$QN" 'BEGIN {print (n > 0 && w >= -0.08)}')")
# what two cores allow: the sync run's compute (CPU seconds of rollout + trainer) spread over two
# cores with no batching gain at all
BOUND=$(awk -F, -v n="$NMAX" 'NR == 1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
    $1 == "sync" && $2 == n {printf "%.3f", ($(c["roll_cpu"]) + $(c["train_cpu"])) / 2}' e2e.csv)
# The work-conserving bound of a run of N jobs: the CPU-seconds all four services used in the sync
# run of N spread over every core (no idle core, no batching gain): async can only beat it by
# making each token cheaper.
CORES=$(meta cores)
bound_s() {
    awk -F, -v n="$1" -v cores="$CORES" 'NR == 1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
        $1 == "sync" && $2 == n && ("svc_cpu_s" in c) && $(c["svc_cpu_s"]) != "" {printf "%.2f", $(c["svc_cpu_s"]) / cores}' e2e.csv
}
WB=$(bound_s "$NMAX")
T6=$(pf "$(awk -v a="$WA" -v b="$WB" 'BEGIN {print (b > 0 && a <= 1.15 * b)}')")
T7=$(pf "$(awk -v r="$RATIO" 'BEGIN {print (r != "" && r <= 0.55)}')")

# --- report -----------------------------------------------------------------------------------
{
echo "# MARLaaS benchmark: $(meta mode) run, $(meta date)"
echo
echo "Machine: $(meta cpu), $(meta cores) cores, $(meta mem_gib) GiB; commit $(meta commit); host $(meta host)."
echo "OpenBLAS sgemm (2048³): $(sed -n 2p sgemm.csv | cut -d, -f2) GFLOP/s on 1 thread, $(sed -n 3p sgemm.csv | cut -d, -f2) GFLOP/s on 2."
echo
echo "Every job: model \`$(meta model)\`, $(meta steps) steps of $(meta prompts) prompts x $(meta group) samples, temperature $(meta temp), lr $(meta lr),"
echo "LoRA r = 8 on all targets, greedy eval on $(meta eval_n) held-out prompts before and after; one task per job; jobs"
echo "spread over $(meta tenants) tenants. Each run is a fresh local cluster (redis-server + the four services, one compute thread"
echo "each, as \`marlaas up\` starts them). sync: the scheduler admits one job at a time and issues a step's prompts only"
echo "after the previous step was trained (generate, verify, train in series). async: all jobs at once, fair share,"
echo "staleness bound 1."
echo
echo "## Targets (N = $NMAX)"
echo
echo "| target | measured | result |"
echo "|---|---|---|"
echo "| async end-to-end time <= 10 % of sync | $(pct "$RATIO") ($WA s vs $WS s) | $T1 |"
echo "| async end-to-end time <= 1.15x the work-conserving bound | $(awk -v a="$WA" -v b="$WB" 'BEGIN {if (b > 0) printf "%.2fx (%s s vs bound %s s)", a / b, a, b; else print "no bound (sync run lacks svc_cpu_s)"}') | $T6 |"
echo "| async end-to-end time <= 55 % of sync | $(pct "$RATIO") | $T7 |"
echo "| rollout busy >= 90 % in async steady state | $(pct "$RB") | $T2R |"
echo "| trainer busy >= 90 % in async steady state | $(pct "$TB") | $T2T |"
echo "| mean per-job accuracy difference async - sync within 3 points | $(awk -v m="$QMEAN" 'BEGIN {printf "%+.1f points", 100 * m}') over $QN jobs | $T3 |"
echo "| no job worse under async by more than 8 points | worst $(awk -v m="$QWORST" 'BEGIN {printf "%+.1f points", 100 * m}') | $T4 |"
WP=$(col e2e.csv async-plain "$NMAX" wall_s)
TP=$(col e2e.csv async-plain "$NMAX" tokens_per_s)
TA=$(col e2e.csv async "$NMAX" tokens_per_s)
if [ -n "$WP" ] && [ -n "$WA" ]; then
    CURVE=$(awk -v a="$WA" -v p="$WP" 'BEGIN {printf "%.4f", a / p - 1}')
    T5=$(pf "$(awk -v c="$CURVE" 'BEGIN {print (c <= 0.05)}')")
    echo "| CURVE links cost <= 5 % end to end (async, default vs --insecure) | $(awk -v c="$CURVE" 'BEGIN {printf "%+.1f%%", 100 * c}') ($WA s vs $WP s; $TA vs $TP tokens/s) | $T5 |"
fi
echo
echo "Two cores bound what overlap alone can give: the sync run at N = $NMAX kept rollout + trainer busy for"
echo "$(pct "$BOUND") of two cores' time (CPU seconds from /proc), so running the same work on both cores at once"
echo "and no faster per token ends at about $(pct "$BOUND") of the sync time; anything below needs batching to make each"
echo "token cheaper (section 4 measures that for the trainer, section 3 for the rollout)."
echo
echo "## 1. End to end"
echo
echo "Work-conserving bound of N jobs: the CPU-seconds of the four services in the sync run of N divided by the"
echo "$CORES cores, i.e. the time the same work takes with no core ever idle and no batching gain."
echo
echo "| N | policy | wall s | async / sync | bound s | wall / bound | rollout busy (own / CPU) | trainer busy (own / CPU) | steady-state busy rollout / trainer | tokens/s | steps/s | mean accuracy before -> after |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
awk -F, -v cores="$CORES" 'NR == 1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
    {k++; row[k] = $0; wall[$1, $2] = $(c["wall_s"]); if ($1 == "sync" && ("svc_cpu_s" in c)) bnd[$2] = $(c["svc_cpu_s"]) / cores}
    END {for (i = 1; i <= k; i++) {split(row[i], f, ",")
        r = (("sync", f[2]) in wall && wall["sync", f[2]] > 0) ? sprintf("%.0f%%", 100 * f[c["wall_s"]] / wall["sync", f[2]]) : "-"
        st = (f[c["roll_busy_steady"]] == "") ? "- (run too short)" : sprintf("%.0f%% / %.0f%%", 100 * f[c["roll_busy_steady"]], 100 * f[c["train_busy_steady"]])
        b = (f[2] in bnd && bnd[f[2]] > 0) ? sprintf("%.1f | %.2fx", bnd[f[2]], f[c["wall_s"]] / bnd[f[2]]) : "- | -"
        printf "| %s | %s | %.1f | %s | %s | %.0f%% / %.0f%% | %.0f%% / %.0f%% | %s | %.0f | %.1f | %.1f%% -> %.1f%% |\n",
            f[2], f[1], f[c["wall_s"]], r, b, 100 * f[c["roll_busy"]], 100 * f[c["roll_cpu"]], 100 * f[c["train_busy"]],
            100 * f[c["train_cpu"]], st,
            f[c["tokens_per_s"]], f[c["steps_per_s"]], 100 * f[c["acc0_mean"]], 100 * f[c["acc_mean"]]}}' e2e.csv | sort -t'|' -k2,2n -s
echo
echo "Busy: the share of the run's wall time the process spent computing by its own accounting (rollout: generation"
echo "steps; trainer: training passes, optimiser steps and publication), and its CPU time from /proc over the same"
echo "time. Steady state: async, from the moment every job is training to the first job's last step; sync, the whole"
echo "training span. tokens/s: rows computed by the rollout (prompt + generated tokens) per second of wall time."
echo
[ -f time_vs_n.svg ] && echo "![time vs N](time_vs_n.svg)" && echo
[ -f utilization_sync.svg ] && echo "![utilization sync](utilization_sync.svg)" && echo
[ -f utilization_async.svg ] && echo "![utilization async](utilization_async.svg)" && echo
[ -f rewards.svg ] && echo "![reward curves](rewards.svg)" && echo
echo "## 2. Quality: final eval accuracy per job, N = $NMAX"
echo
echo "| task | before | sync | async | async - sync | second sync run - sync |"
echo "|---|---|---|---|---|---|"
awk -F, '{printf "| %s | %.1f%% | %.1f%% | %.1f%% | %+.1f | %s |\n", $1, 100 * $2, 100 * $3, 100 * $4, 100 * $5,
    ($6 == "" ? "-" : sprintf("%+.1f", 100 * $6))}' quality.csv
echo
pts() { awk -v m="$1" 'BEGIN {if (m == "-" || m == "") print "-"; else printf "%+.1f", 100 * m}'; }
echo "async - sync: mean $(pts "$QMEAN") points, worst $(pts "$QWORST"), mean absolute $(pts "$AABS") over $QN jobs."
echo "Second sync run - sync (the same policy twice): mean $(pts "$RMEAN"), worst $(pts "$RWORST"), mean absolute $(pts "$RABS")."
echo "A $(meta eval_n)-prompt eval has a 95 % interval of about ±5 points at 50 % accuracy, and two GRPO runs of one"
echo "task differ (other samples are drawn); the second sync run measures how far on this machine and model."
echo
if [ -f quality.md ]; then
    sed 's/^## /## 2b. /' quality.md
    echo
fi
echo "## 3. Rollout (models/tiny, one thread as in the service)"
echo
echo "Generated tokens/s of the continuous-batching generator (prefill included), 32 new tokens per sequence:"
echo
echo "| sweep | sequences in the batch | distinct adapters | tokens/s | vs 1 sequence |"
echo "|---|---|---|---|---|"
awk -F, 'NR > 1 {if ($1 == "batch" && $2 == 1) b1 = $4; row[NR] = $0}
    END {for (i = 2; i <= NR; i++) {split(row[i], f, ",")
        printf "| %s | %s | %s | %.0f | %.2fx |\n", (f[1] == "batch" ? "batch size" : "adapters"), f[2], f[3], f[4], f[4] / b1}}' rollout.csv
echo
echo "Resident memory of one rollout runtime (model, KV cache for 256 full contexts, 128 adapter slots) as adapters"
echo "(rank 8, all targets, every parameter written) are loaded:"
echo
echo "| model | parameters | weights MiB | adapter MiB | RSS, 0 adapters | 1 | 32 | 128 | 128 jobs vs 128 copies (RSS) | (weights only) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk -F, 'NR > 1 {m = $1; p[m] = $2; w[m] = $3; a[m] = $4; r[m, $5] = $6; if (!(m in seen)) {seen[m] = 1; o[++n] = m}}
    END {for (i = 1; i <= n; i++) {m = o[i]
        printf "| %s | %.1fM | %.1f | %.2f | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %.1f%% (%.0f MiB vs %.0f MiB) | %.1f%% |\n",
            m, p[m] / 1e6, w[m], a[m], r[m, 0], r[m, 1], r[m, 32], r[m, 128], 100 * r[m, 128] / (128 * r[m, 1]), r[m, 128],
            128 * r[m, 1], 100 * (w[m] + 128 * a[m]) / (128 * w[m])}}' memory.csv
echo
echo "## 4. Trainer: optimiser steps/s for small per-job batches (4 prompts x 8 samples per step, one thread)"
echo
echo "| model | jobs | prompt recomputed per sample, one job per pass | shared prompt, one job per pass | shared prompt, all jobs in one mixed-adapter pass | mixed / one-by-one | effective GFLOP/s (unshared / one-by-one / mixed) |"
echo "|---|---|---|---|---|---|---|"
awk -F, 'NR > 1 {k = $1 "," $2; if (!(k in seen)) {seen[k] = 1; o[++n] = k}; s[k, $3] = $4; g[k, $3] = $7}
    END {for (i = 1; i <= n; i++) {k = o[i]; split(k, f, ",")
        printf "| %s | %s | %.1f | %.1f | %.1f | %.2fx | %.0f / %.0f / %.0f |\n", f[1], f[2], s[k, "unshared"], s[k, "one-by-one"],
            s[k, "mixed"], s[k, "mixed"] / s[k, "one-by-one"], g[k, "unshared"], g[k, "one-by-one"], g[k, "mixed"]}}' trainer.csv
echo
echo "The trainer service shares each GRPO group's prompt (computed once, attended to by its samples). Effective"
echo "GFLOP/s: the FLOPs of the forward and the backward's input gradients of every sample's whole sequence (2x the"
echo "forward's GEMM FLOPs, the work without sharing) per second; compare with sgemm on 1 thread above."
if [ -s dp.csv ]; then
    echo
    echo "## 5. Data-parallel trainer: one process with 2 threads vs 2 ranks with 1 thread each (same cores)"
    echo
    echo "| model | jobs | 1 process x 2 threads, steps/s | 2 ranks x 1 thread, steps/s | ranks / process |"
    echo "|---|---|---|---|---|"
    awk -F, 'NR > 1 {k = $1 "," $2; if (!(k in seen)) {seen[k] = 1; o[++n] = k}; s[k, $3] = $5}
        END {for (i = 1; i <= n; i++) {k = o[i]; split(k, f, ",")
            printf "| %s | %s | %.1f | %.1f | %.2fx |\n", f[1], f[2], s[k, 1], s[k, 2], s[k, 2] / s[k, 1]}}' dp.csv
    echo
    echo "The mixed-adapter pass of all jobs (shared prompts), as the trainer service runs it: in one process, or split"
    echo "over a data-parallel group (common/rl/dp.h: rank 0 broadcasts the pass, each rank trains whole GRPO groups of"
    echo "it, gradients summed over the group's ZeroMQ sockets, the same AdamW step on every rank). Includes every"
    echo "message of the group. On GPUs the ranks are one per GPU and the sums go through NCCL."
fi
if [ -f engine.txt ]; then
    echo
    echo "## Engine (\`build/bin/marlaas-bench-engine\`)"
    echo
    echo '```'
    cat engine.txt
    echo '```'
fi
echo
echo "Raw data: meta.txt, e2e.csv (one row per run), e2e/<policy>-n<N>/{jobs,steps,timeline}.csv and the services'"
echo "logs, rollout.csv, memory.csv, trainer.csv, dp.csv. Reproduce: \`bench/run.sh$([ "$(meta mode)" = quick ] && echo " --quick")\`."
} > "$R"
echo "report: $D/$R"

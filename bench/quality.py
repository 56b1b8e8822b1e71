#!/usr/bin/env python3
"""quality.py - the paired quality comparison of bench/quality.sh's runs.

    bench/quality.py DIR EVAL_N

DIR holds one folder per run, POLICY-sSEED-nN/jobs.csv (bench/e2e.sh), for the policies sync and
async and the same seeds. Prints a Markdown section and writes DIR/quality_stats.csv.

Statistics (stated in the output):
- per task and policy: the final eval accuracy's mean over the seeds with a 95 % t-interval;
- the paired difference async - sync of each (task, seed): both runs use the same task, seed and
  settings, so the pair removes the task's own difficulty; the mean over all pairs with its 95 %
  t-interval (the pairs taken as independent: each job's GRPO draws its own samples; the two
  runs of a seed are separate clusters). PASS when the interval holds no value below -3 points;
- "never worse than start": per task and policy, the mean final accuracy must not lie below the
  mean starting accuracy by more than the eval's 95 % half-width at the start (a Wilson interval
  of the prompts the eval covers: EVAL_N, or fewer where a task's held-out set is smaller); and the best evaluated version the job keeps (best_acc) must not lie below
  its own start at all (it is one of the candidates).
"""
import csv
import math
import os
import sys

# two-sided 95 % quantiles of Student's t, df 1..30; beyond: the normal's
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df):
    return T95[df - 1] if 1 <= df <= len(T95) else 1.960


def mean_ci(xs):
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, t95(n - 1) * sd / math.sqrt(n)


def wilson_half(p, n):
    z = 1.96
    den = 1 + z * z / n
    return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: quality.py DIR EVAL_N")
    root, eval_n = sys.argv[1], int(sys.argv[2])
    runs = {}  # (policy, seed) -> {task: row}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "jobs.csv")
        if not os.path.isfile(path):
            continue
        pol, rest = name.split("-s", 1)
        seed = int(rest.split("-n", 1)[0])
        with open(path) as f:
            runs[(pol, seed)] = {r["task"]: r for r in csv.DictReader(f)}
    seeds = sorted({s for (p, s) in runs if (("sync", s) in runs and ("async", s) in runs)})
    if len(seeds) < 2:
        sys.exit(f"quality.py: need sync and async runs of at least 2 seeds in {root}, found {sorted(runs)}")
    tasks = sorted(set.intersection(*(set(runs[(p, s)]) for s in seeds for p in ("sync", "async"))))

    def acc(p, s, t, field):
        v = runs[(p, s)][t].get(field, "")
        return float(v) if v not in ("", None) else float("nan")

    print(f"## Quality over seeds: {len(tasks)} tasks x {len(seeds)} seeds (seeds {', '.join(map(str, seeds))}), "
          f"sync and async")
    print()
    print("| task | start | sync final (mean ± 95 % CI) | async final | async - sync (mean ± CI, points) | "
          "never worse than start: sync / async | best kept ≥ start |")
    print("|---|---|---|---|---|---|---|")
    pairs, rows, never_ok, best_ok = [], [], True, True
    for t in tasks:
        start = [acc(p, s, t, "acc0") for s in seeds for p in ("sync", "async")]
        st_m = sum(start) / len(start)
        # the prompts an eval covers (eval_n column: a task with a small held-out set has fewer
        # than EVAL_N); runs without the column take EVAL_N
        ns = [acc(p, s, t, "eval_n") for s in seeds for p in ("sync", "async")]
        n_eval = int(min(ns)) if all(n == n for n in ns) else eval_n
        half = wilson_half(st_m, n_eval)
        fin = {p: [acc(p, s, t, "acc") for s in seeds] for p in ("sync", "async")}
        d = [100 * (fin["async"][i] - fin["sync"][i]) for i in range(len(seeds))]
        pairs += d
        ms, cs = mean_ci(fin["sync"])
        ma, ca = mean_ci(fin["async"])
        md, cd = mean_ci(d)
        ok = {p: sum(fin[p]) / len(fin[p]) >= st_m - half for p in fin}
        never_ok &= all(ok.values())
        bests = [(acc(p, s, t, "best_acc"), acc(p, s, t, "acc0")) for s in seeds for p in ("sync", "async")]
        b_ok = all(not math.isnan(b) and b >= a0 - 1e-9 for b, a0 in bests)
        best_ok &= b_ok
        print(f"| {t} | {100 * st_m:.1f} % (± {100 * half:.1f}) | {100 * ms:.1f} ± {100 * cs:.1f} | "
              f"{100 * ma:.1f} ± {100 * ca:.1f} | {md:+.1f} ± {cd:.1f} | "
              f"{'ok' if ok['sync'] else 'WORSE'} / {'ok' if ok['async'] else 'WORSE'} | {'yes' if b_ok else 'NO'} |")
        rows.append([t, f"{st_m:.4f}", f"{half:.4f}", f"{ms:.4f}", f"{cs:.4f}", f"{ma:.4f}", f"{ca:.4f}", f"{md:.2f}",
                     f"{cd:.2f}", int(ok["sync"]), int(ok["async"]), int(b_ok)])
    m, c = mean_ci(pairs)
    lo = m - c
    print()
    print(f"Paired difference async - sync over {len(pairs)} (task, seed) pairs: {m:+.2f} points, 95 % interval "
          f"[{lo:+.2f}, {m + c:+.2f}] (t with {len(pairs) - 1} degrees of freedom).")
    print()
    print("| target | measured | result |")
    print("|---|---|---|")
    print(f"| the 95 % interval of the mean difference async - sync holds no value below -3 points | lower end "
          f"{lo:+.2f} | {'PASS' if lo >= -3 else 'FAIL'} |")
    print(f"| no task's mean final accuracy below its start by more than the eval's 95 % half-width (both policies) "
          f"| {sum(r[9] + r[10] for r in rows)} of {2 * len(rows)} | {'PASS' if never_ok else 'FAIL'} |")
    print(f"| every job's kept best version (best_acc) at or above its start | "
          f"{sum(r[11] for r in rows)} of {len(rows)} tasks | {'PASS' if best_ok else 'FAIL'} |")
    with open(os.path.join(root, "quality_stats.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "start", "start_half95", "sync_mean", "sync_ci95", "async_mean", "async_ci95",
                    "diff_points", "diff_ci95", "sync_not_worse", "async_not_worse", "best_not_below_start"])
        w.writerows(rows)
        w.writerow(["ALL", "", "", "", "", "", "", f"{m:.2f}", f"{c:.2f}", int(never_ok), int(never_ok), int(best_ok)])


if __name__ == "__main__":
    main()

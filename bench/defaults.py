#!/usr/bin/env python3
"""defaults.py - the "never worse than start" check of bench/defaults.sh's run.

    bench/defaults.py JOBS_CSV EVAL_N OUT_CSV

JOBS_CSV is bench/e2e.sh's jobs.csv (one job per task). Prints a Markdown section and writes
OUT_CSV. Per task: the greedy eval accuracy before training (acc0) and at the end (acc), both on
the same EVAL_N held-out prompts, and the best evaluated version the job keeps (best_acc). A task
passes when it ended (status done) and its final accuracy is not below its start by more than
the eval's 95 % half-width at the start (a Wilson interval of the prompts the eval covers: the
job's eval_n column, fewer than EVAL_N for a task whose held-out set is smaller; a difference
inside it is the eval's own noise); the kept best version must not lie below the start at all (the
start is one of its candidates).
"""
import csv
import math
import sys


def wilson_half(p, n):
    z = 1.96
    den = 1 + z * z / n
    return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den


def num(x):
    try:
        return float(x)
    except ValueError:
        return float("nan")


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: defaults.py JOBS_CSV EVAL_N OUT_CSV")
    eval_n = int(sys.argv[2])
    rows = list(csv.DictReader(open(sys.argv[1])))
    out = []
    print("## The job spec's defaults on every built-in task\n")
    print("| task | status | eval prompts | start | end | end - start | half-width | best kept | end check | best check |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    n_end = n_best = 0
    worst = None
    for r in sorted(rows, key=lambda r: r["task"]):
        a0, a1, ab = num(r["acc0"]), num(r["acc"]), num(r["best_acc"])
        en = int(r["eval_n"]) if r.get("eval_n") else eval_n
        half = wilson_half(a0, en) if a0 == a0 else float("nan")
        done = r["status"] == "done"
        ok_end = done and a1 >= a0 - half
        ok_best = done and ab >= a0
        n_end += ok_end
        n_best += ok_best
        d = a1 - a0
        if d == d and (worst is None or d < worst[1]):
            worst = (r["task"], d)
        print(f"| {r['task']} | {r['status']} | {en} | {100 * a0:.1f} % | {100 * a1:.1f} % | {100 * d:+.1f} | ± {100 * half:.1f} | "
              f"{100 * ab:.1f} % | {'PASS' if ok_end else 'FAIL'} | {'PASS' if ok_best else 'FAIL'} |")
        out.append([r["task"], r["status"], en, f"{a0:.4f}", f"{a1:.4f}", f"{ab:.4f}", f"{half:.4f}", int(ok_end), int(ok_best)])
    n = len(rows)
    gain = sum(num(r["acc"]) - num(r["acc0"]) for r in rows) / n if n else float("nan")
    print()
    print(f"- **{'PASS' if n and n_end == n else 'FAIL'}**: no task ends below its start by more than the eval's 95 % "
          f"half-width ({n_end} of {n} tasks hold; evals of up to {eval_n} prompts)")
    print(f"- **{'PASS' if n and n_best == n else 'FAIL'}**: the best evaluated version each job keeps is at least its "
          f"start ({n_best} of {n})")
    if worst:
        print(f"- mean change of the final accuracy {100 * gain:+.1f} points; the largest fall: {worst[0]} {100 * worst[1]:+.1f} points")
    with open(sys.argv[3], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "status", "eval_n", "start", "end", "best", "start_half95", "end_ok", "best_ok"])
        w.writerows(out)
    return 0 if n and n_end == n and n_best == n else 1


if __name__ == "__main__":
    sys.exit(main())

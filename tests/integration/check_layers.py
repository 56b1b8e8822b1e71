#!/usr/bin/env python3
"""check_layers.py - the include rules of docs/ARCHITECTURE.md (section Layering), checked on
every #include "..." of the project's C and CUDA sources.

    python3 tests/integration/check_layers.py [ROOT]

Prints one line per include that breaks a rule (file:line: what it includes, what the
directory may include) and exits 1 when there is any; 0 otherwise. An include is resolved as
the compiler resolves it: relative to the including file's directory first, then to ROOT (-I.).
"""
import os
import re
import sys

# directory -> the directories (or single headers) its files may include, besides its own
RULES = [
    ("kernels", ["kernels"]),
    ("common/util", ["common/util"]),
    ("common/formats", ["common/formats", "common/util"]),
    ("common/sim", ["common/sim", "common/formats", "common/util"]),
    ("common/engine", ["common/engine", "common/sim", "common/formats", "common/util", "kernels/kernels.h"]),
    ("common/tasks", ["common/tasks", "common/sim", "common/formats", "common/util"]),
    ("common/net", ["common/net", "common/util"]),
    ("common/svc", ["common/svc", "common/sim", "common/net", "common/util"]),
    ("common/rl", ["common/rl", "common/engine", "common/sim", "common/formats", "common/tasks", "common/net",
                   "common/util", "kernels/kernels.h"]),
    ("services/scheduler", ["services/scheduler", "common", "kernels/kernels.h"]),
    ("services/rollout", ["services/rollout", "common", "kernels/kernels.h"]),
    ("services/verifier", ["services/verifier", "common", "kernels/kernels.h"]),
    ("services/trainer", ["services/trainer", "common", "kernels/kernels.h"]),
    ("cli", ["cli", "common", "kernels/kernels.h"]),
    ("bench", ["bench", "common", "kernels/kernels.h"]),
    ("examples", ["examples", "common/net", "common/tasks", "common/util"]),
    ("tools", ["tools", "common/net", "common/util"]),
]
SOURCES = (".c", ".h", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def under(path, prefix):
    return path == prefix or path.startswith(prefix + "/")


def rule_of(path):
    best = None
    for d, allowed in RULES:
        if under(path, d) and (best is None or len(d) > len(best[0])):
            best = (d, allowed)
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = 0
    checked = 0
    for d, _ in RULES:
        top = os.path.join(root, d)
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                rule = rule_of(rel)
                if rule is None or rule[0] != d:
                    continue   # a deeper rule's directory: checked under that rule
                with open(full, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        checked += 1
                        inc = m.group(1)
                        local = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
                        target = local if os.path.exists(os.path.join(root, local)) else os.path.normpath(inc)
                        if not os.path.exists(os.path.join(root, target)):
                            continue   # a generated or system header named with quotes
                        if any(under(target, a) for a in rule[1]):
                            continue
                        print("%s:%d: includes %s; %s/ may include only %s" %
                              (rel, lineno, target, rule[0], ", ".join(rule[1])))
                        bad += 1
    print("layers: %d includes checked, %d break a rule" % (checked, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

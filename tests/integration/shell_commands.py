#!/usr/bin/env python3
"""Lists the external programs that shell scripts run, parsed with shfmt (a real shell parser).

usage: shell_commands.py FILE...          shell scripts (bash)
       shell_commands.py --make Makefile  the recipes and $(shell ...) calls of a Makefile

Prints one line per use: "PROGRAM<TAB>FILE:LINE". What is not printed:
  - shell builtins and keywords (asked of bash itself: compgen -b -k);
  - functions defined in the file or in a file it sources with a literal path;
  - relative paths (the project's own files and binaries) and words that are not literal
    ("$M", $(...)): what they name is decided at run time.
Programs behind a wrapper count too: `timeout 5 curl`, `sudo ip`, `xargs kill`, `env X=1 cmd`,
`ip netns exec NS cmd`, and the arguments of a function that runs "$@" (after its shifts), as
`check "what" docker-compose config`. The code of `bash -c '...'`, `sh -c`, `trap '...'` and
`eval '...'` is parsed as shell as well. `command -v X` only asks whether X exists: not a use.
"""
import json
import os
import re
import subprocess
import sys

BUILTINS = set(subprocess.run(["bash", "-c", "compgen -b; compgen -k"], capture_output=True, text=True,
                              check=True).stdout.split())


def parse(code, name):
    p = subprocess.run(["shfmt", "--tojson", "-ln", "bash", "--filename", name], input=code, capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.exit(f"shell_commands: shfmt cannot parse {name}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def literal(word):
    """The text of a word made only of literal parts, else None."""
    if not word or "Parts" not in word:
        return None
    out = []
    for part in word["Parts"]:
        t = part.get("Type")
        # shfmt leaves Value out when it is empty ('' is a SglQuoted part without one)
        if t == "Lit":
            out.append(part.get("Value", ""))
        elif t == "SglQuoted":
            out.append(part.get("Value", ""))
        elif t == "DblQuoted":
            inner = literal(part)
            if inner is None:
                return None
            out.append(inner)
        else:
            return None
    return "".join(out)


def is_all_args(word):
    """True for "$@" (the word that runs a function's arguments)."""
    parts = word.get("Parts", [])
    if len(parts) == 1 and parts[0].get("Type") == "DblQuoted":
        parts = parts[0].get("Parts", [])
    return (len(parts) == 1 and parts[0].get("Type") == "ParamExp" and parts[0].get("Param", {}).get("Value") == "@"
            and not parts[0].get("Slice") and not parts[0].get("Repl") and not parts[0].get("Exp"))


def walk(node, fn):
    if isinstance(node, dict):
        fn(node)
        for v in node.values():
            walk(v, fn)
    elif isinstance(node, list):
        for v in node:
            walk(v, fn)


def call_args(node):
    return node.get("Args") or []


# Wrappers: name -> (options that take a value, positional arguments before the command)
WRAPPERS = {
    "sudo": ({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"}, 0),
    "timeout": ({"-s", "--signal", "-k", "--kill-after"}, 1),
    "nice": ({"-n", "--adjustment"}, 0),
    "ionice": ({"-c", "-n", "-p"}, 0),
    "nohup": (set(), 0),
    "setsid": (set(), 0),
    "stdbuf": ({"-i", "-o", "-e"}, 0),
    "taskset": (set(), 1),
    "xargs": ({"-n", "-P", "-I", "-d", "-L", "-s", "-a", "-E", "-e"}, 0),
    "env": ({"-u", "-C", "-S"}, 0),
    "exec": ({"-a"}, 0),
    "command": (set(), 0),
    "time": (set(), 0),
    "chroot": (set(), 1),
    "valgrind": (set(), 0),
    "strace": ({"-o", "-e", "-p", "-s"}, 0),
    "perf": (set(), 0),
}
CODE_ARGS = {"trap": "first", "eval": "all"}


class Scanner:
    def __init__(self):
        self.uses = []            # (program, file, line)
        self.funcs = {}           # name -> shifts before "$@" (or None: does not run its arguments)
        self.parsed = {}

    def tree(self, path):
        if path not in self.parsed:
            with open(path, encoding="utf-8") as f:
                self.parsed[path] = parse(f.read(), path)
        return self.parsed[path]

    def learn_functions(self, tree, path, seen):
        """Functions of tree and of the files it sources (literal paths, from the repository root)."""
        def fn(n):
            if n.get("Type") == "FuncDecl":
                name = n["Name"]["Value"]
                self.funcs.setdefault(name, self.runs_args(n["Body"]))
            elif n.get("Type") == "CallExpr":
                a = call_args(n)
                w = [literal(x) for x in a]
                if w and w[0] in ("source", ".") and len(w) > 1 and w[1] and os.path.isfile(w[1]) and w[1] not in seen:
                    seen.add(w[1])
                    self.learn_functions(self.tree(w[1]), w[1], seen)
        walk(tree, fn)

    @staticmethod
    def runs_args(body):
        """How many arguments a function shifts away before running "$@", or None."""
        shifts = 0
        found = [None]

        def fn(n):
            nonlocal shifts
            if n.get("Type") != "CallExpr" or found[0] is not None:
                return
            a = call_args(n)
            if not a:
                return
            if literal(a[0]) == "shift":
                k = literal(a[1]) if len(a) > 1 else "1"
                shifts += int(k) if k and k.isdigit() else 1
            elif is_all_args(a[0]):
                found[0] = shifts
        walk(body, fn)
        return found[0]

    def use(self, word, path, line):
        name = literal(word)
        if name is None or name == "" or name in BUILTINS or name in self.funcs:
            return
        if "/" in name and not name.startswith("/"):
            return                     # the project's own file or binary
        if "=" in name.split("/")[-1]:
            return
        self.uses.append((name, path, line))

    def command_at(self, args, i, path, line):
        """Records the program at args[i] and, for a wrapper, the program it runs."""
        while i < len(args):
            name = literal(args[i])
            lineno = args[i]["Pos"]["Line"] + line - 1
            self.use(args[i], path, lineno)
            if name is None:
                return
            base = os.path.basename(name)
            if base in ("bash", "sh") and i + 2 < len(args) and literal(args[i + 1]) == "-c":
                code = literal(args[i + 2])
                if code is not None:
                    self.scan_code(code, path, lineno)
                return
            if base == "command" and i + 1 < len(args) and literal(args[i + 1]) in ("-v", "-V"):
                return
            if base == "ip":
                w = [literal(x) for x in args[i + 1:]]
                if len(w) >= 3 and w[0] == "netns" and w[1] == "exec":
                    i = i + 4
                    continue
                return
            if name in self.funcs and self.funcs[name] is not None:
                i = i + 1 + self.funcs[name]
                continue
            if base not in WRAPPERS:
                return
            valued, positional = WRAPPERS[base]
            i += 1
            while i < len(args):
                w = literal(args[i])
                if w is None:
                    break
                if base == "env" and "=" in w and not w.startswith("-"):
                    i += 1
                elif w.startswith("-") and w != "-":
                    i += 2 if w in valued else 1
                elif positional:
                    positional -= 1
                    i += 1
                else:
                    break
            if base in ("perf", "valgrind") and i < len(args) and literal(args[i]) in ("stat", "record"):
                i += 1
                while i < len(args) and (literal(args[i]) or "").startswith("-"):
                    i += 1

    def scan_tree(self, tree, path, line=1):
        def fn(n):
            t = n.get("Type")
            if t == "CallExpr":
                args = call_args(n)
                if not args:
                    return
                self.command_at(args, 0, path, line)
                head = literal(args[0])
                if head in CODE_ARGS and len(args) > 1:
                    code_words = args[1:2] if CODE_ARGS[head] == "first" else args[1:]
                    for w in code_words:
                        code = literal(w)
                        if code is not None:
                            self.scan_code(code, path, w["Pos"]["Line"] + line - 1)
        walk(tree, fn)

    def scan_code(self, code, path, line):
        self.scan_tree(parse(code, path), path, line)

    def scan_file(self, path):
        tree = self.tree(path)
        saved = dict(self.funcs)
        self.learn_functions(tree, path, {path})
        self.scan_tree(tree, path)
        self.funcs = saved


def make_recipes(path):
    """The shell code of a Makefile: recipe lines and $(shell ...) calls, make's own references
    replaced by shell parameters except the programs make names ($(CC) cc, $(MAKE) make, ...)."""
    programs = {"CC": "cc", "MAKE": "make", "NVCC": "nvcc", "AR": "ar"}
    out = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # continuation lines joined (each keeps its first line's number); inside define ... endef one
    # level of $$ is undone, as $(eval $(call ...)) does
    lines, in_define = [], False
    for no, raw in enumerate(text.split("\n"), 1):
        if lines and lines[-1][2]:
            code, first, _ = lines.pop()
            raw, no = code + " " + raw.lstrip(), first
        if re.match(r"\s*define\s", raw):
            in_define = True
        elif re.match(r"\s*endef\b", raw):
            in_define = False
        elif in_define:
            raw = raw.replace("$$", "$")
        cont = raw.endswith("\\")
        lines.append((raw[:-1] if cont else raw, no, cont))

    def subst(s):
        # innermost references first, until none is left
        s = s.replace("$$", "\x00")
        prev = None
        while prev != s:
            prev = s
            s = re.sub(r"\$\(shell ([^()]*)\)", lambda m: "\x01" + m.group(1) + "\x02", s)
            s = re.sub(r"\$[({]([A-Za-z0-9_]+)[)}]",
                       lambda m: programs.get(m.group(1), "$MAKEVAR_" + m.group(1)), s)
            s = re.sub(r"\$\([a-z]+ [^()]*\)", "$MAKEFN", s)
            s = re.sub(r"\$[@<^?*|%]|\$[({][@<^?*][DF]?[)}]", "$MAKEAUTO", s)
        return s.replace("\x00", "$")

    for raw, no, _ in lines:
        if raw.startswith("\t"):
            code = subst(raw[1:].lstrip("@-+"))
            code = code.replace("\x01", "$(").replace("\x02", ")")
            out.append((code, no))
        else:
            for m in re.finditer(r"\$\(shell ((?:[^()]|\([^()]*\))*)\)", raw):
                code = subst(m.group(1)).replace("\x01", "$(").replace("\x02", ")")
                out.append((code, no))
    return out


def main(argv):
    sc = Scanner()
    if argv[:1] == ["--make"]:
        for path in argv[1:]:
            for code, no in make_recipes(path):
                sc.scan_code(code, path, no)
    else:
        for path in argv:
            sc.scan_file(path)
    for name, path, line in sc.uses:
        print(f"{name}\t{path}:{line}")


if __name__ == "__main__":
    main(sys.argv[1:])

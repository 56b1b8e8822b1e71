#!/usr/bin/env python3
"""Writes the expected results of the chat-template fixtures and where the two references differ.

usage: compare.py PYTHON.json JS.json OUTDIR

PYTHON.json (render_python.py, Jinja2 as Hugging Face transformers runs it) is the reference:
OUTDIR/chat.json and OUTDIR/snippets.json hold its results. OUTDIR/js_differences.json lists the
cases where @huggingface/jinja (render_js.mjs) renders otherwise, with both results; a summary
per template goes to stdout.
"""
import json
import sys


def main():
    py_path, js_path, out = sys.argv[1:4]
    py = json.load(open(py_path, encoding="utf-8"))
    js = json.load(open(js_path, encoding="utf-8"))

    def same(a, b):
        # both rendered the same text, or both refused
        return ("output" in a) == ("output" in b) and a.get("output") == b.get("output")

    diffs = {"chat": {}, "snippets": {}}
    for name, cases in sorted(py["chat"].items()):
        d = {cid: {"python": r, "js": js["chat"][name][cid]} for cid, r in cases.items()
             if not same(r, js["chat"][name][cid])}
        if d:
            diffs["chat"][name] = d
        ok = sum(1 for r in cases.values() if "output" in r)
        print(f"{name:12s} {len(cases)} conversations: {ok} rendered, {len(cases) - ok} refused by the template; "
              f"@huggingface/jinja differs on {len(d)}")
    diffs["snippets"] = {sid: {"python": r, "js": js["snippets"][sid]} for sid, r in py["snippets"].items()
                         if not same(r, js["snippets"][sid])}
    ok = sum(1 for r in py["snippets"].values() if "output" in r)
    print(f"{'snippets':12s} {len(py['snippets'])} templates: {ok} rendered, {len(py['snippets']) - ok} errors; "
          f"@huggingface/jinja differs on {len(diffs['snippets'])}")

    def dump(path, obj):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1, sort_keys=True)
            f.write("\n")

    dump(f"{out}/chat.json", {"renderer": py["meta"]["renderer"], "templates": py["chat"]})
    dump(f"{out}/snippets.json", {"renderer": py["meta"]["renderer"], "snippets": py["snippets"]})
    dump(f"{out}/js_differences.json", {"reference": py["meta"]["renderer"], "second_opinion": js["meta"]["renderer"],
                                        "chat": diffs["chat"], "snippets": diffs["snippets"]})


if __name__ == "__main__":
    main()

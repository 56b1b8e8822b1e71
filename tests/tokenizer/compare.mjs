// compare.mjs - compares `marlaas tokenize` output with a family's fixture (gen_fixtures.mjs).
//
//   node tests/tokenizer/compare.mjs FIXTURE PLAIN SPECIAL DECODED
//
// PLAIN / SPECIAL: our id arrays for corpus.jsonl (--no-special / --special), one per line;
// DECODED: our --decode of the fixture's plain ids, one JSON string per line. Every id list must
// equal the oracle's, and every string the oracle round-trips must come back from our decode.
// Prints one summary line; exits 1 on any difference, showing the first few.
import crypto from "crypto";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const [fixture, plainFile, specialFile, decodedFile] = process.argv.slice(2);
const lines = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l.length);
const corpusText = fs.readFileSync(path.join(here, "corpus.jsonl"), "utf8");
const corpus = corpusText.split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const fx = lines(fixture);
const head = JSON.parse(fx[0]);
const sha = crypto.createHash("sha256").update(corpusText).digest("hex");
if (head.corpus_sha256 !== sha || head.strings !== corpus.length) {
    console.log(`${head.family}: the fixture was made from another corpus; rerun gen_fixtures.mjs`);
    process.exit(1);
}
const want = fx.slice(1).map((l) => JSON.parse(l));
const plain = lines(plainFile), special = lines(specialFile), decoded = lines(decodedFile);
const shown = [];
const show = (what, i, got, exp) => {
    if (shown.length < 5)
        shown.push(`  ${what} #${i + 1} ${JSON.stringify(corpus[i]).slice(0, 80)}\n    got  ${got}\n    want ${exp}`);
};
let okPlain = 0, okSpecial = 0, okRt = 0, nRt = 0;
for (let i = 0; i < corpus.length; i++) {
    const [p, s, rt] = want[i];
    if (plain[i] === JSON.stringify(p)) okPlain++;
    else show("ids", i, plain[i], JSON.stringify(p));
    if (special[i] === JSON.stringify(s)) okSpecial++;
    else show("ids with special tokens", i, special[i], JSON.stringify(s));
    if (rt) {
        nRt++;
        let got;
        try {
            got = JSON.parse(decoded[i]);
        } catch {
            got = undefined;
        }
        if (got === corpus[i]) okRt++;
        else show("decode", i, decoded[i], JSON.stringify(corpus[i]));
    }
}
const n = corpus.length;
const all = okPlain === n && okSpecial === n && okRt === nRt;
console.log(`${head.family} (${head.package} ${head.version}): ids ${okPlain}/${n}, with special tokens ${okSpecial}/${n}, ` +
    `decode round trips ${okRt}/${nRt}${all ? "" : "  FAILED"}`);
for (const s of shown) console.log(s);
process.exit(all ? 0 : 1);

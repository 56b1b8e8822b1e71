// tokenizer_corpus.mjs - writes the tokenizer benchmark's input: about 1 MB of mixed text, one
// document per line, deterministic. Half the lines are strings of the conformance corpus
// (tests/tokenizer/corpus.jsonl: prose, code, numbers, CJK, Arabic, Devanagari, emoji, special
// tokens) with their newlines and tabs; half are synthetic sentences over a 20,000-word lexicon
// drawn Zipf-like (frequent words repeat, rare ones rarely, as in text) with numbers and
// punctuation, so a word cache helps only as much as it would on real text.
//
//   node bench/tokenizer_corpus.mjs OUT [BYTES]
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const [out, bytesArg] = process.argv.slice(2);
const target = Number(bytesArg || 1000000);
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rand() * a.length)];

const corpus = fs.readFileSync(path.join(here, "..", "tests", "tokenizer", "corpus.jsonl"), "utf8")
    .split("\n").filter((l) => l.length).map((l) => JSON.parse(l).replace(/\n/g, " "));
const alphabets = ["etaoinshrdlcumwfgypbvkjxqz", "абвгдежзиклмнопрстуфхцчшщыэюя", "αβγδεζηθικλμνξοπρστυφχψω",
    "的一是不了人我在有他这为之大来以个中上们", "のにはをたがでてとしれさあいうえおかき"];
const lexicon = [];
for (let i = 0; i < 20000; i++) {
    const a = i % 10 < 7 ? alphabets[0] : pick(alphabets);
    const n = 1 + Math.floor(rand() * rand() * 12);
    let w = "";
    for (let k = 0; k < n; k++) w += pick([...a]);
    lexicon.push(i % 17 === 0 ? w[0].toUpperCase() + w.slice(1) : w);
}
const zipf = () => lexicon[Math.floor(Math.pow(rand(), 3) * lexicon.length)];
const punct = [",", ".", ";", ":", "!", "?", " -", " (", ")", "\"", "'s", "n't"];

const lines = [];
let size = 0;
while (size < target) {
    let line;
    if (rand() < 0.5) {
        line = pick(corpus);
    } else {
        const words = [];
        const n = 5 + Math.floor(rand() * 40);
        for (let k = 0; k < n; k++) {
            let w = rand() < 0.05 ? String(Math.floor(rand() * 1e6)) : zipf();
            if (rand() < 0.12) w += pick(punct);
            words.push(w);
        }
        line = words.join(rand() < 0.05 ? "  " : " ");
    }
    lines.push(line);
    size += Buffer.byteLength(line) + 1;
}
fs.writeFileSync(out, lines.join("\n") + "\n");
console.log(`${out}: ${lines.length} lines, ${size} bytes`);

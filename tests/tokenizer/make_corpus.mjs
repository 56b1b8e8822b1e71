// make_corpus.mjs - writes corpus.jsonl, the strings the tokenizer conformance test encodes
// with every model family (one JSON string per line). Deterministic: rerun it after editing the
// lists below, then rerun gen_fixtures.mjs.
//
//   node tests/tokenizer/make_corpus.mjs
//
// The strings avoid characters assigned after Unicode 14 (PCRE2 10.42's tables) so that no
// difference between Unicode versions of the three implementations is tested by accident, and
// "ſ" after an apostrophe (Oniguruma's case folding matches it in (?i:'s), the JavaScript
// oracle's ASCII folding does not).
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));

const prose = [
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
    "Tokenizers split text into pieces; models see only the pieces.",
    "She sells sea-shells by the sea-shore (or so they say).",
    "A man, a plan, a canal: Panama.",
    "E-mail me at jane.doe+test@example.com or visit https://example.org/a/b?c=1&d=%20x#frag.",
    "Prices rose 3.5% in Q3 2023, to $1,299.99 per unit (up from $999).",
    "\"Quoted\" text, 'single quotes', and «guillemets» — with an em dash… and ellipsis.",
    "Mr. Smith went to Washington D.C. on Jan. 5th at 3 p.m.",
    "UPPERCASE WORDS AND lowercase words AND MiXeD cAsE wOrDs",
    "camelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE",
    "What's the time? It's 5 o'clock, isn't it?",
    "To be, or not to be, that is the question.",
    "semi;colon,comma.period!bang?question",
    "(parentheses) [brackets] {braces} <angles>",
    "#hashtag @mention $dollar %percent ^caret &ampersand *star",
    "~tilde `backtick` |pipe| \\backslash/ slash",
    "Tab\tseparated\tvalues\there",
    "Line one\nLine two\nLine three",
    "Windows\r\nline\r\nendings\r\n",
    "Old Mac\rline endings\r",
    "Ends with a newline\n",
    "\nStarts with a newline",
    "Multiple\n\n\nblank lines\n\n",
    "Paragraph one.\n\nParagraph two has more words in it.\n\n\nParagraph three.",
    "A sentence with trailing spaces   ",
    "   A sentence with leading spaces",
    "Two  spaces  between  words",
    "Many          spaces",
    "Mixed \t \t whitespace \n \r\n runs",
    "non\u00a0breaking\u00a0space and thin\u2009space and ideographic\u3000space",
    "zero\u200bwidth\u200cjoiners\u200dhere",
    "soft\u00adhyphen and word\u2060joiner",
    "next line\u0085char",
    "line\u2028separator and paragraph\u2029separator",
];

const contractions = [
    "don't", "DON'T", "Don't", "we'LL", "We'll", "WE'LL", "I'm", "I'M", "you're", "YOU'RE", "they've", "THEY'VE",
    "she'd", "SHE'D", "it's", "IT'S", "It'S", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "y'all", "rock 'n' roll", "O'Neil's dog", "the dogs' bones", "I'd've", "can't won't shouldn't",
    "it’s curly", "'quoted'", "''double''", "'", "''", "a'b'c'd", "'sss", "'tis the season", "'LLama",
];

const numbers = [
    "0", "7", "42", "123", "1234", "12345", "123456", "1234567", "1234567890", "12345678901234567890",
    "3.14159265358979", "1,000,000", "1.000.000,00", "2024-01-15", "12:34:56", "+1 (555) 123-4567",
    "007", "0x1F4A9", "1e-10", "-273.15", "10^6", "99.9%", "v1.2.3-beta.4", "192.168.0.1",
    "a1b2c3d4", "x=1;y=22;z=333", "Room 101, Floor 12", "IPv6 ::1 and fe80::1%eth0",
    "٠١٢٣٤٥٦٧٨٩", "१२३४५", "①②③", "½ ¼ ¾", "²³¹", "Ⅻ Ⅳ", "１２３ full width",
    "1st 2nd 3rd 4th 21st 102nd", "3d 4k 1080p 60fps",
];

const code = [
    "def add(a, b):\n    return a + b\n",
    "def f(x):\n\tif x > 0:\n\t\treturn x\n\treturn -x\n",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "for (int i = 0; i < n; i++) {\r\n\tsum += a[i] * b[i];\r\n}\r\n",
    "const x = { a: 1, b: [2, 3], c: 'str' };\nconsole.log(JSON.stringify(x));",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<div class=\"box\"><p>Hello <b>world</b></p></div>",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "    indented four\n        indented eight\n            twelve",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}",
    "x += 1; y -= 2; z *= 3; w /= 4; a %= 5; b **= 6; c //= 7;",
    "if (a && b || !c) { return a != b ? a : b; }",
    "$ ls -la | grep '\\.c$' | wc -l\n",
    "{\"key\": \"value\", \"list\": [1, 2.5, true, null], \"nested\": {\"k\": \"v\"}}",
    "```python\nprint('hi')\n```",
    "// comment\n/* block\n   comment */\n# shell comment\n-- sql comment",
    "matrix = [[1, 2, 3],\n          [4, 5, 6]]",
    "    \n    \n",
    "\t\t\t",
    "a\tb\t\tc\t\t\td",
    "__init__ __name__ == '__main__'",
    "std::vector<std::string> v; v.push_back(\"x\");",
    "lambda x: x**2 + 2*x + 1",
    "arr[i][j] = arr[i-1][j-1] + 1;",
    "https://github.com/huggingface/tokenizers/blob/main/README.md",
    "C:\\Users\\Public\\Documents\\file.txt",
    "key1=value1&key2=value2",
];

const scripts = [
    "你好，世界！",
    "我爱自然语言处理。今天天气很好，我们去公园散步吧。",
    "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。",
    "カタカナだけのテキスト",
    "ひらがなだけのぶんしょう",
    "한국어 텍스트입니다. 안녕하세요!",
    "مرحبا بالعالم",
    "اللغة العربية جميلة جداً، وهي لغة القرآن.",
    "שלום עולם",
    "नमस्ते दुनिया",
    "हिन्दी एक भारतीय भाषा है। क्षत्रिय ज्ञान श्री",
    "สวัสดีชาวโลก",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "Tiếng Việt có dấu: Người ta nói rằng",
    "Ελληνικά και Русский и English",
    "Türkçe: İstanbul, ığdır, şeker, çiçek",
    "Deutsch: Größe, Straße, Äpfel, Öl, Übung",
    "Français : élève, où, garçon, naïve, cœur",
    "Español: ¿Qué tal? ¡Muy bien! Niño, señor",
    "Polski: zażółć gęślą jaźń",
    "Ελληνικό ερωτηματικό;",
    "ქართული ენა",
    "Հայերեն լեզու",
    "ᚠᛇᚻ᛫ᛒᛦᚦ runes",
    "Ⓗⓔⓛⓛⓞ circled",
    "ｆｕｌｌｗｉｄｔｈ ＡＳＣＩＩ",
    "Mixed: Hello世界مرحباПривет123",
    "iPhone 15 Pro Max 256GB — ¥159,800 (税込)",
    "数学: ∑_{i=1}^{n} i² = n(n+1)(2n+1)/6, ∀x∈ℝ, x² ≥ 0",
    "Currency: € £ ¥ ₹ ₩ ₿ ¢",
    "Arrows → ← ↑ ↓ ⇒ ⇔ and box ┌─┐ │ └─┘",
    "Music ♪ ♫ and chess ♔ ♕ and cards ♠ ♥",
];

const emoji = [
    "😀", "I love it 😍😍😍", "👍🏽 thumbs up with skin tone", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "🇺🇸🇯🇵🇫🇷 flags",
    "❤️ heart with variation selector", "🧑‍💻 technologist", "emoji at end 🎉", "🚀🌟✨🔥💯",
    "text😀text", "👩🏾‍🔬 scientist", "1️⃣ keycap", "©️ ®️ ™️", "🤷‍♀️🤷‍♂️",
];

const nfd = [
    "cafe\u0301", "Cre\u0300me bru\u0302le\u0301e", "n\u0303", "Ame\u0301lie", "re\u0301sume\u0301",
    "A\u030a ngstro\u0308m", "\u1112\u1161\u11ab\u1100\u1173\u11af", "e\u0301e\u0301e\u0301",
    "o\u0308\u0304 stacked", "Z\u0327\u0301 combining", "x\u0301y\u0302z\u0303",
];

const specials = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "Hi<|im_end|>", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "text<|endoftext|>more",
    "<|begin_of_text|>Hello", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "<|eot_id|>",
    "<s>Hello</s>", "</s>", "<s>", "<unk>", "[INST] Hello [/INST]", "<s>[INST] What? [/INST] Answer</s>",
    "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>", "<｜User｜>Hi<｜Assistant｜>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>text", "<eos>",
    "<|start|>user<|message|>Hi<|end|>", "<|return|>", "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "<|im_end", "<|im_end|", "< |im_end|>", "<|im_end|><|im_end|>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<table><tr><td>x</td></tr></table>",
    "<h1>Title</h1><strong>bold</strong>", "[multimodal]", "<unused0><unused1>",
];

const long = [
    "supercalifragilisticexpialidocious",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "Donaudampfschifffahrtsgesellschaftskapitänsmütze",
    "a".repeat(300),
    "ab".repeat(150),
    "abc ".repeat(60),
    "x".repeat(1000),
    " ".repeat(50),
    "\n".repeat(40),
    "\t".repeat(35),
    "-".repeat(80),
    "=".repeat(40) + "\n" + "#".repeat(40),
    "0".repeat(100),
    "9876543210".repeat(10),
    "😀".repeat(30),
    "日本".repeat(50),
    "हिन्दी".repeat(20),
    "antidisestablishmentarianism ".repeat(5),
    "http://" + "a".repeat(60) + ".com/" + "b/".repeat(20),
    "The tokenizer must handle long mixed paragraphs, with punctuation, numbers like 12,345.67, " +
        "quotes \"like this\", contractions (don't, won't, it's), URLs https://x.y/z, code `f(x)`, " +
        "emoji 🎉, CJK 中文, Arabic العربية, and newlines\nin\nthe\nmiddle, all at once.\n",
];

const edge = [
    "", " ", "  ", "\n", "\t", "\r\n", "a", "A", "é", "中", "😀", ".", "'", "\"", "\\", "<", ">", "|", "_", "▁",
    "▁leading metaspace", "word▁with▁metaspace", "Ġ", "Ġhello", "Ċ", "<0x41>", "<0xFF>", "byte <0x0A> token",
    "#", "##", "###", "...", "?!", "!?", "-->", "<!--", "\u00ad", "\ufeffBOM first",
];

// Variants of a base string: what chat prompts and documents do to text.
function variants(s, i) {
    const out = [s];
    if (i % 2 === 0) out.push(" " + s);
    if (i % 3 === 0) out.push(s + " ");
    if (i % 4 === 1) out.push(s + "\n");
    if (i % 5 === 2) out.push(s.toUpperCase());
    if (i % 6 === 3) out.push(s.toLowerCase());
    if (i % 7 === 4) out.push(s + " " + s);
    if (i % 8 === 5) out.push("\n" + s + "\n\n");
    if (i % 9 === 6) out.push(s + "<|im_end|>");
    if (i % 10 === 7) out.push("<s>" + s + "</s>");
    return out;
}

const groups = [prose, contractions, numbers, code, scripts, emoji, nfd, specials, long, edge];
const seen = new Set();
const corpus = [];
let k = 0;
for (const g of groups) {
    for (const s of g) {
        for (const v of variants(s, k++)) {
            if (seen.has(v)) continue;
            seen.add(v);
            corpus.push(v);
        }
    }
}
fs.writeFileSync(path.join(here, "corpus.jsonl"), corpus.map((s) => JSON.stringify(s)).join("\n") + "\n");
console.log(`corpus.jsonl: ${corpus.length} strings`);

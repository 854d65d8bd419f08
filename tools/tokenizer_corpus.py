"""The tokenizer test corpus: hand-written multilingual text, code, and generated edge cases.

build_snippets() returns a deterministic list of strings (none contains U+001E). Used by
tools/make_tokenizer_fixtures.py (corpus.txt + HF's ids) and by tools/bench_hf_tokenizer.py.
"""
import random

ENGLISH = """\
The quick brown fox jumps over the lazy dog. It's a sentence you've seen before, and we'll see it again.
Tokenizers split text into pieces that a language model can read. Byte-level BPE starts from the 256
possible bytes and merges the most frequent adjacent pairs, one rank at a time, until the vocabulary is full.
She said: "I'd rather not." He replied, 'They're late; we're early; you're right; I'm tired; it'd work.'
In 1969, Apollo 11 landed on the Moon; 384,400 km away, 3.14159 radians, 2^10 = 1024, and 0x7FFF_FFFF.
Mr. O'Neil's dog didn't bark at 5:30 a.m. -- nobody knows why. Ms. D'Angelo's cat, however, did.
Prices rose 12.5% year-over-year (from $1,299.99 to $1,461.24), while wages grew by just 3%.
E-mail: someone@example.com; URL: https://example.org/path?query=1&lang=en#section-2
Good morning!!! Is this... really happening?!? Yes -- no -- maybe; who can tell.
The committee's report, which was published on 2024-03-15, contains 47 recommendations.
Shakespeare wrote: "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles."
ALL CAPS SHOUTING IS HARD TO READ, AND IT'S WORSE WHEN IT'S LONG. WE'LL STOP NOW. THEY'VE STOPPED. I'M DONE.
camelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE_CASE PascalCaseName
A well-known fact: tokenization errors silently change model inputs, and nobody notices until evaluation.
"""

LOREM = """\
Memory bandwidth, not arithmetic, bounds the decode step of a large mixture-of-experts model: every
generated token reads the attention weights, the router, and the few experts it selects. Placing the hot
experts on the GPU and the cold ones in host memory turns the problem into one of scheduling; the CPU
computes what it holds while the GPU computes the rest, and the two meet at the combine step.
A tokenizer sits at both ends of this pipeline. It turns the prompt into ids before the first forward
pass, and it turns sampled ids back into text, one token at a time, without ever printing half a
character. If it disagrees with the reference implementation on a single id, the logits diverge, the
samples diverge, and the comparison with the original model is meaningless.
"""

CHINESE = """\
自然语言处理是人工智能领域中的一个重要方向。它研究能实现人与计算机之间用自然语言进行有效通信的各种理论和方法。
今天天气很好，我们去公园散步吧！你觉得怎么样？我觉得不错。
机器学习模型需要大量的数据进行训练，而分词器决定了模型看到的基本单位。
“你好，世界！”——这是每个程序员写的第一行代码。价格：１２３元，约合１７．５美元。
中华人民共和国成立于1949年10月1日。北京是首都，上海是最大的城市。
春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。
床前明月光，疑是地上霜。举头望明月，低头思故乡。
繁體中文：這是一個測試句子，包含了許多不同的漢字與標點符號。
"""

JAPANESE = """\
吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。
東京都渋谷区で新しいカフェがオープンしました。コーヒーは一杯４５０円です。
カタカナ、ひらがな、漢字が混ざった文章は、トークナイザーにとって難しい課題です。
ｶﾞｷﾞｸﾞｹﾞｺﾞ（半角カナ）とガギグゲゴ（全角カナ）は違う文字です。
「こんにちは」と彼女は言った。『さようなら』と彼は答えた。
"""

KOREAN = """\
안녕하세요! 저는 한국어를 공부하고 있습니다. 한글은 세종대왕이 1443년에 창제했습니다.
대한민국의 수도는 서울입니다. 인구는 약 950만 명입니다.
자연어 처리 모델은 형태소 분석 없이도 바이트 수준의 BPE로 한국어를 처리할 수 있습니다.
"""

RUSSIAN = """\
Съешь же ещё этих мягких французских булок, да выпей чаю. Широкая электрификация южных губерний.
Москва — столица России. В 2023 году население составляло около 13 миллионов человек.
«Война и мир» — роман Льва Николаевича Толстого, опубликованный в 1865–1869 годах.
ВСЕ ЗАГЛАВНЫЕ БУКВЫ И цифры 1234567890 вместе.
Українська мова: Ґанок, їжак, єнот, щастя. Беларуская: Ўсё будзе добра.
"""

ARABIC = """\
اللغة العربية هي لغة رسمية في أكثر من عشرين دولة. يتحدث بها أكثر من ٤٠٠ مليون شخص.
مرحبا بالعالم! كيف حالك اليوم؟ أنا بخير، شكراً.
بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ — نص مع التشكيل الكامل.
الأرقام العربية الهندية: ٠١٢٣٤٥٦٧٨٩ والأرقام الفارسية: ۰۱۲۳۴۵۶۷۸۹
فارسی: زبان فارسی یکی از زبان‌های هندواروپایی است.
"""

HEBREW_GREEK_OTHERS = """\
עברית: שָׁלוֹם עֲלֵיכֶם! מה שלומך היום? בְּרֵאשִׁית בָּרָא אֱלֹהִים.
Ελληνικά: Γειά σου Κόσμε! Η γλώσσα είναι όμορφη. ΑΒΓΔΕ αβγδε άέήίόύώ ΐΰ.
हिन्दी: नमस्ते दुनिया! भारत एक विशाल देश है। संख्याएँ: ०१२३४५६७८९ क्षत्रिय ज्ञान श्री।
বাংলা: আমি বাংলায় গান গাই। தமிழ்: வணக்கம் உலகம். ಕನ್ನಡ ಭಾಷೆ. മലയാളം ഭാഷ.
ไทย: สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ
Tiếng Việt: Xin chào thế giới! Tôi yêu tiếng Việt. Người Việt Nam rất thân thiện. Đường phố Hà Nội.
ქართული ენა. Հայերեն լեզու. አማርኛ ቋንቋ. ᠮᠣᠩᠭᠣᠯ ᠬᠡᠯᠡ. ᐃᓄᒃᑎᑐᑦ.
Türkçe: İstanbul'da ılık bir gün. Ğ ğ Ş ş Ç ç Ö ö Ü ü. Polski: Zażółć gęślą jaźń.
Deutsch: Größenwahn, Straße, Fußgängerübergänge. Français: Où est la bibliothèque ? Ça va très bien.
Español: ¿Dónde está el baño? ¡Qué día tan bonito! Mañana será otro día, señor Núñez.
"""

PYTHON = '''\
import json
from dataclasses import dataclass, field


@dataclass
class Config:
    """Model hyper-parameters read from config.json."""
    hidden_size: int = 2048
    num_experts: int = 256
    layer_types: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.hidden_size % 128 != 0:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of 128")
        for i, kind in enumerate(self.layer_types):
            assert kind in ("linear_attention", "full_attention"), (i, kind)


def load(path: str) -> Config:
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    return Config(**{k: v for k, v in raw.items() if k in Config.__annotations__})


if __name__ == "__main__":
    cfg = load("config.json")
    print(f"{cfg!r:>40}", end="\\r\\n")
    x = [i ** 2 for i in range(10) if i % 3 == 0]  # squares
    y = {"a": 1, 'b': 2, "c": [1, 2, 3]}
    lambda_ = lambda a, *args, **kw: (a, args, kw)
'''

CPP = '''\
// runtime/example.cpp: a small C++ sample for the tokenizer corpus.
#include <cstdint>
#include <string_view>
#include <vector>

namespace tandem {

template <typename T>
[[nodiscard]] constexpr T ceil_div(T a, T b) noexcept { return (a + b - 1) / b; }

struct Expert {
  int32_t id = -1;
  float weight = 0.0f;
  bool operator<(const Expert& o) const { return weight > o.weight; }
};

std::vector<Expert> top_k(std::span<const float> logits, size_t k) {
  std::vector<Expert> out;
  out.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out.push_back({static_cast<int32_t>(i), logits[i]});
  std::partial_sort(out.begin(), out.begin() + k, out.end());
  out.resize(k);
  return out;  // k <= logits.size()
}

}  // namespace tandem

int main(int argc, char** argv) {
	if (argc < 2) { std::fprintf(stderr, "usage: %s FILE\\n", argv[0]); return 2; }
	auto x = 0x1p-3f + 1e-5 - .5e+2; uint64_t mask = ~0ull >> 3;
	return x != x || mask == 0 ? 1 : 0;
}
'''

JSON_SAMPLE = '''\
{
  "architectures": ["Qwen3_5MoeForConditionalGeneration"],
  "model_type": "qwen3_5_moe",
  "text_config": {
    "hidden_size": 2048, "num_hidden_layers": 40, "num_experts": 256, "num_experts_per_tok": 8,
    "rope_parameters": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "eos_token_id": [248046, 248044], "nested": {"empty": {}, "list": [], "null": null, "t": true}
  },
  "escaped": "line\\nbreak \\"quoted\\" \\u00e9 \\ud83d\\ude00 tab\\there"
}
'''

EMOJI = """\
Emoji: 😀😃😄😁 👍👍🏻👍🏼👍🏽👍🏾👍🏿 ❤️ 💔 🔥🔥🔥 ✨ 🎉🎊 🤖 🦀 🐍
Families (ZWJ): 👨‍👩‍👧‍👦 👩‍👩‍👦 👨‍👨‍👧‍👧 🧑‍🤝‍🧑 👩🏽‍💻 👨🏿‍🚀 🏳️‍🌈 🏴‍☠️ 👁️‍🗨️ 🧔🏻‍♂️ 🫱🏼‍🫲🏾
Flags: 🇺🇸 🇯🇵 🇩🇪 🇫🇷 🇨🇳 🇰🇷 🇧🇷 🇮🇳 🏴󠁧󠁢󠁳󠁣󠁴󠁿 Keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣ Variation: ☺︎ ☺️ ✔︎ ✔️
Emoji in text:I love🍕and☕!! Ok👌.Thanks🙏🙏🙏
"""

COMBINING = [
    "e\u0301 (decomposed é) vs \u00e9 (precomposed), cafe\u0301 vs caf\u00e9, nai\u0308ve vs na\u00efve",
    "A\u030a ångström vs \u00c5ngstr\u00f6m vs \u212b (Angstrom sign, NFC maps it to \u00c5)",
    "Vietnamese decomposed: Tie\u0302\u0301ng Vie\u0323\u0302t, Ngu\u031bo\u031b\u0300i, \u0111u\u031bo\u031b\u0300ng",
    "Stacked marks: a\u0301\u0302\u0303\u0304 o\u0323\u0302 z\u0335\u0336\u0337 Zalgo: H\u0336\u0321e\u0338\u031bl\u0334\u0327l\u0335o\u0337",
    "Marks out of canonical order: a\u0301\u0323 vs a\u0323\u0301, q\u0307\u0323 vs q\u0323\u0307",
    "Devanagari with nukta: \u0915\u093c \u0916\u093c \u0917\u093c (decomposed) vs \u0958 \u0959 \u095a",
    "Hebrew points: \u05e9\u05c1\u05b8 \u05d1\u05bc\u05b0 \u05d0\u05b1\u05dc\u05b9\u05d4\u05b4\u05d9\u05dd",
    "Hangul jamo: \u1112\u1161\u11ab\u1100\u1173\u11af (conjoining) vs \ud55c\uae00 (syllables)",
    "Lone marks: \u0301 \u0301\u0301 x\u200d\u0301 \u0300abc \u20dd\u20e3 ' \u0301's",
    "Newer marks HF's NFC may not know: \u0915\u0898\u0301 \u09a4\u09fe\u09cd \u07ca\u07fd\u07eb a\u1ac1\u0316 b\u1df6\u0301",
    "Compatibility characters NFC keeps: \ufb01 \ufb02 \u2460 \u00bd \u2153 \u00b2 \u2162 \uff21\uff22\uff23 \u3000\u3001",
    "Singletons NFC changes: \u2126 (Ohm) \u212a (Kelvin) \u2000\u2001 \u0340\u0341 \u0374 \u037e \u0387",
]

WHITESPACE = [
    "tab\tseparated\tvalues\t\t\tand trailing tab\t",
    "windows\r\nline\r\nendings\r\n\r\n",
    "old mac\rline\rendings\r",
    "mixed \r\n \n\r \n\n\n\n\n   \n\t\n  end",
    "trailing spaces   ",
    "   leading spaces",
    "many      internal        spaces          here",
    "nbsp\u00a0between\u00a0words and\u00a0\u00a0double, narrow\u202fnbsp, figure\u2007space",
    "ideographic\u3000space\u3000\u3000二重",
    "em\u2003space en\u2002space thin\u2009space hair\u200aspace zero\u200bwidth (not White_Space)",
    "line\u2028separator paragraph\u2029separator next\u0085line ogham\u1680space mongolian\u180evowel",
    "vertical\x0btab form\x0cfeed \x0b\x0c mixed",
    "\n\n\nstarts with newlines",
    "ends with newlines\n\n\n",
    " \n \n \n",
    "\t \t \t\n",
    "  \u00a0 \u3000 \n",
    "word \n",
    "word  \n  word",
    "x\n \ny",
    "x \r\n\t y",
    "\u3000\u3000indented with ideographic spaces",
    "control\x01chars\x02and\x7fdel\x1bescape\x00nul",
]

CONTRACTIONS = [
    "I'm, you're, he's, she'll, we've, they'd, it's, can't, won't, shouldn't",
    "I'M, YOU'RE, HE'S, SHE'LL, WE'VE, THEY'D, IT'S, CAN'T",
    "I'M vs I'm vs i'M; 'S 'LL 'Ll 'lL 'RE 'Re 'rE 'VE 'Ve 'D 'M 'T",
    "rock'n'roll, o'clock, '90s, 'tis, 'twas, y'all'd've, ma'am",
    "'s'S'ſ'st'ſt — long s: ſ ſt ſs ' ſ '\u017f",
    "Curly quotes: it\u2019s, don\u2019t, \u2018quoted\u2019 and \u201cdouble\u201d",
    "Apostrophe then mark: '\u0301s 'e\u0301 '\u00e9 'K '\u212a",
    "dangling ' quote ' and '' double '''",
]

SPECIALS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think about this.\n</think>\n\nThe answer is 42.<|im_end|>",
    "<think>\n\n</think>\n\n<|endoftext|><|endoftext|>",
    "text<|im_end|>text <|im_start|> spaced <|im_end|>  <|endoftext|>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "broken special tokens: <|im_end| <|im_start <im_end|> <|IM_END|> < |im_end|> <|endoftext|",
    "nested <|im_start|><|im_start|>x<|im_end|><|im_end|> and <<|im_end|>> and <|<|endoftext|>|>",
    "<|im_end|>",
    "mask tests: <mask> a<mask> <mask>b x <mask>, <mask>! \u00e9<mask> 1<mask>",
    "sep tests: a [SEP] b   [SEP]   c\t[SEP]\nd[SEP]e",
    "normalized added token: cafe\u0301 au lait, caf\u00e9 au lait, CAF\u00c9 AU LAIT, cafe au lait",
]

NUMBERS = [
    "0 1 12 123 1234 12345 123456 1234567 12345678901234567890",
    "3.14159265358979323846 -2.71828 +1e10 6.022e23 1,000,000 1_000_000 0xDEADBEEF 0b1010 0o777",
    "Phone: +1 (555) 123-4567, ISBN 978-3-16-148410-0, date 2026-11-29T12:34:56Z",
    "Fullwidth: ０１２３４５６７８９ Arabic-Indic: ٠١٢٣٤٥٦٧٨٩ Devanagari: ०१२३४५६७८९ Thai: ๐๑๒๓",
    "Other numbers: ² ³ ¹ ¼ ½ ¾ ⅓ Ⅻ ⅻ ① ⑳ ㉑ 〇 〡〢〣 𝟙𝟚𝟛",
    "v1.2.3-rc.4+build.567 x86_64 aarch64 sm_90 fp8e4m3 int4 bf16 3rd 21st 100th",
]

SYMBOLS = [
    "Math: ∀x∈ℝ, ∃y: x² + y² ≤ r²; ∑ᵢ aᵢ = ∫₀^∞ f(t) dt ≈ π/4 ± ε; A ⊆ B ∪ C; ¬(p ∧ q) ⇔ ¬p ∨ ¬q",
    "Arrows and boxes: ← ↑ → ↓ ↔ ⇒ ┌─┬─┐ │ │ │ └─┴─┘ ░▒▓█ ■□▪▫ ●○◆◇",
    "Currency: $ € £ ¥ ₹ ₽ ₩ ₿ ¢ 〒 ¤",
    "Punctuation runs: !!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ~~~ ``` ''' \"\"\"",
    "Markdown: # Title\n## Sub\n- item\n- **bold** _it_ `code` [link](http://x.y)\n> quote\n\n| a | b |\n|---|---|",
    "Private use and rare: \ue000\uf8ff \U000f0000 \U0010fffd noncharacters \ufdd0 \ufffe",
    "Supplementary letters: 𝐀𝐁𝐂 𝒜ℬ𝒞 𝔄𝔅 𝕬 𝓐 Gothic 𐌰𐌱𐌲 Linear B 𐀀𐀁 CJK Ext B 𠀀𠀁𪚥",
    "Newer Unicode letters (HF regex knows Unicode 16): \U0002ebf0\U0002ebf1 \ua7cb\ua7cc \u1c89\u1c8a",
]

WORDS = (
    "the of and to in is was for on that with as by at from his her it an are were which be this had not "
    "but have they or one all their has been would there if more when will who so no can what about out "
    "model token merge byte vocab rank expert router layer attention decode prefill cache stream sample "
    "北京 上海 学习 模型 数据 東京 日本語 서울 한국어 Москва город данные القاهرة بيانات नमस्ते"
).split()

POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(" \t\n\r\u00a0\u3000\u2003\u200b\u2028\u0085\x0b\x0c")
    + list("'\"`!?.,;:-_=+*/\\|&^%$#@~()[]{}<>")
    + list("\u0301\u0300\u0323\u0308\u0327\u093c\u05b8\u0651\u200d\u200c\ufe0f\u20e3")
    + list("éñüßøæœçÅİıſ\u212aΩωжЖяשאعك中文字日本語한국ไทยक्षি")
    + list("٠١٢٣०१²½Ⅻ①")
    + ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "𝐀", "𠀀", "'s", "'LL", "'re", "<|im_end|>", "<think>", "\r\n", "  ", "\n\n"]
)


def generated_snippets(rng):
    out = []
    # Random strings from a pool of tricky characters and fragments.
    for _ in range(400):
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(POOL) for _ in range(n)))
    # Word salads with varied separators.
    seps = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", ", ", ". ", "-", "_", "/", "'", "'s ", "", " \n "]
    for _ in range(200):
        n = rng.randint(2, 25)
        words = []
        for _ in range(n):
            w = rng.choice(WORDS)
            r = rng.random()
            if r < 0.1:
                w = w.upper()
            elif r < 0.2:
                w = w.capitalize()
            words.append(w + rng.choice(seps))
        out.append("".join(words))
    # Whitespace runs of every kind and length, between and around words.
    spaces = [" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2003", "\u0085", "\u2028", "\x0b"]
    for _ in range(120):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append("".join(rng.choice(spaces) for _ in range(rng.randint(0, 8))))
            parts.append(rng.choice(["", "x", "word", "42", "!", "é", "中", "'s", "<|im_end|>"]))
        out.append("".join(parts))
    # Digit runs.
    for n in range(1, 41):
        out.append("".join(rng.choice("0123456789") for _ in range(n)))
    # Long runs (exercise the heap path of BPE and long words).
    out.append(" " * 300 + "x")
    out.append("a" * 500)
    out.append("ab" * 300)
    out.append("-" * 200 + "\n" + "=" * 150)
    out.append("\n" * 100)
    out.append("😀" * 60)
    out.append("".join(chr(c) for c in range(0x4E00, 0x4E00 + 300)))
    return out


def build_snippets():
    rng = random.Random(1234)
    snippets = []
    for block in (ENGLISH, LOREM, CHINESE, JAPANESE, KOREAN, RUSSIAN, ARABIC, HEBREW_GREEK_OTHERS, EMOJI):
        # Paragraph lines one by one, and the block as one snippet (keeps the newlines).
        snippets.extend(line for line in block.split("\n") if line)
        snippets.append(block)
    for code in (PYTHON, CPP, JSON_SAMPLE):
        snippets.append(code)
        snippets.append(code.replace("\n", "\r\n"))
        lines = code.split("\n")
        snippets.extend("\n".join(lines[i:i + 5]) for i in range(0, len(lines), 5))
    for group in (COMBINING, WHITESPACE, CONTRACTIONS, SPECIALS, NUMBERS, SYMBOLS):
        snippets.extend(group)
        snippets.append("\n".join(group))
    snippets.extend(generated_snippets(rng))
    # Everything again, concatenated across languages, as a few long documents.
    for _ in range(3):
        picks = rng.sample(snippets, 30)
        snippets.append("\n\n".join(picks))
    return [s for s in snippets if s]

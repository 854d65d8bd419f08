#!/usr/bin/env python3
"""Check a `tandem synth` tokenizer with HF tokenizers: it loads, every byte is encodable, text
round-trips, special tokens sit where config.json / generation_config.json / tokenizer_config.json
say, and the declared pipeline is the official Qwen3.5 one. Prints a summary; exits 1 on a failure,
77 when the `tokenizers` package is missing (CTest treats that as a skip).

Usage:  python3 tools/check_synth_tokenizer.py DIR
"""
import json
import os
import sys
import unicodedata

try:
    from tokenizers import Tokenizer
except ImportError:
    print("check_synth_tokenizer: the 'tokenizers' package is not installed (pip install tokenizers); skipping")
    sys.exit(77)

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
            "</tool_response>", "<think>", "</think>"]
SAMPLES = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's 2024-06-01 and the temperature is 21.5 °C; we'll see what's next.",
    "def f(x):\n    return x * 2  # double\n\n\nprint(f(21))\n",
    "Der Zug hat Verspätung. Le café est prêt. ¿Dónde está la estación?",
    "Москва, Αθήνα, 東京, 서울, القاهرة, नई दिल्ली, กรุงเทพ",
    "emoji: 🚲🍞📚 ✅ e\u0301 (combining) \u00a0nbsp \t tabs\r\nwindows newline",
    "   leading spaces, trailing spaces   \n\n\n",
]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what)


def load_json(d, name):
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return json.load(f)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    d = sys.argv[1]
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tj = load_json(d, "tokenizer.json")
    cfg = load_json(d, "config.json")
    gen = load_json(d, "generation_config.json")
    tcfg = load_json(d, "tokenizer_config.json")
    text_cfg = cfg.get("text_config", cfg)

    # Declared pipeline: exactly the official Qwen3.5 one.
    check(tj["normalizer"] == {"type": "NFC"}, "normalizer is NFC")
    pre = tj["pre_tokenizer"]["pretokenizers"]
    check(pre[0]["type"] == "Split" and pre[0]["pattern"] == {"Regex": QWEN35_REGEX} and pre[0]["behavior"] == "Isolated",
          "pre_tokenizer[0] is Split(Qwen3.5 regex, Isolated)")
    check(pre[1] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
          "pre_tokenizer[1] is ByteLevel(no prefix space, no regex)")
    check(tj["decoder"]["type"] == "ByteLevel", "decoder is ByteLevel")
    m = tj["model"]
    check(m["type"] == "BPE" and m["byte_fallback"] is False and m["ignore_merges"] is False, "model is BPE without byte_fallback")

    vocab = tok.get_vocab(with_added_tokens=False)
    regular = len(vocab)
    check(sorted(vocab.values()) == list(range(regular)), "regular ids are 0..n-1 without gaps")
    # Every single byte encodes to its own byte token and decodes back.
    for b in range(256):
        s = bytes([b]).decode("latin-1") if b < 128 else None
        if s is not None:
            ids = tok.encode(s).ids
            check(len(ids) == 1 and tok.decode(ids) == s, f"byte {b:#04x} encodes to one token and round-trips")
    check(all(len(tok.encode(chr(c)).ids) >= 1 for c in range(128, 0x800, 7)), "non-ASCII code points encode")

    # Special tokens at the ids the configs name.
    base = tok.token_to_id("<|endoftext|>")
    for i, s in enumerate(SPECIALS):
        check(tok.token_to_id(s) == base + i, f"{s} has id {base + i}")
    check(text_cfg["eos_token_id"] == base and text_cfg["bos_token_id"] == base, "text_config bos/eos = <|endoftext|>")
    check(gen["eos_token_id"] == [base + 2, base] and gen["bos_token_id"] == base and gen["pad_token_id"] == base,
          "generation_config eos = [<|im_end|>, <|endoftext|>], bos = pad = <|endoftext|>")
    check(tcfg["eos_token"] == "<|im_end|>" and tcfg["pad_token"] == "<|endoftext|>", "tokenizer_config eos/pad")
    check(cfg.get("image_token_id", base + 12) == base + 12, "image_token_id = <|image_pad|>")
    check(base + len(SPECIALS) <= text_cfg["vocab_size"], "special tokens fit in vocab_size")
    check(base >= regular, "special tokens follow the regular tokens")

    # Round trips and the chat format.
    total_bytes = total_tokens = 0
    for s in SAMPLES:
        ids = tok.encode(s).ids
        check(tok.decode(ids) == unicodedata.normalize("NFC", s), f"round trip of {s[:30]!r} (NFC)")
        check(all(i < text_cfg["vocab_size"] for i in ids), "ids < vocab_size")
        total_bytes += len(s.encode("utf-8"))
        total_tokens += len(ids)
    chat = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    ids = tok.encode(chat).ids
    check(ids[0] == base + 1 and base + 2 in ids and ids[-2] == base + 24, "chat prompt keeps special tokens whole")
    check(tok.encode("\n").ids == [198], '"\\n" is id 198 as in Qwen')

    pieces = tok.encode(SAMPLES[0]).tokens
    print(f"tokenizer  {d}/tokenizer.json: {regular} regular tokens, {len(tj['model']['merges'])} merges, "
          f"specials {base}..{base + len(SPECIALS) - 1}, vocab_size {text_cfg['vocab_size']}")
    print(f"encode     {total_bytes} bytes of samples -> {total_tokens} tokens ({total_bytes / total_tokens:.2f} bytes/token)")
    print(f"example    {SAMPLES[0]!r} -> {pieces}")
    print(f"chat       {len(ids)} ids: {ids}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()

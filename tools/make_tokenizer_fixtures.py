#!/usr/bin/env python3
"""Tokenizer fixtures: test tokenizers trained with HF `tokenizers`, a multilingual corpus, and HF's ids.

usage: python3 tools/make_tokenizer_fixtures.py [--out tests/data/tokenizers] [--unicode-inc runtime/tokenizer/unicode_hf.inc]

Writes, under --out:
  corpus.txt               snippets separated by U+001E (record separator); written by tools/tokenizer_corpus.py
  <name>.json              tokenizer.json files (Qwen3.5 normalizer / pre-tokenizer / decoder, and variants)
  <name>.expected.json     HF's ids for every snippet and for the whole file, HF's decodes where they differ
                           from the snippet, and HF's decodes of random id sequences
  hf_unicode.json          HF's regex classes (\\p{L} \\p{M} \\p{N} \\s) and NFC's non-zero combining classes, as ranges
and the C++ table --unicode-inc: what HF knows that ICU 72 may not (characters assigned after Unicode 14,
and which marks HF's NFC reorders). Needs `pip install tokenizers`; deterministic (fixed seeds, one thread).
"""
import argparse
import json
import os
import random
import sys
import unicodedata

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic training

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_corpus import build_snippets  # noqa: E402

QWEN35_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SEP = "\x1e"

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen ships <think> and friends as added tokens that are not special (skip_special keeps them).
QWEN_NONSPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def qwen_tokenizer(regex):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(tok, texts, vocab_size, special_tokens=()):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def build_tokenizers(snippets):
    """name -> (tokenizer json text, note)."""
    out = {}

    # 1. Qwen3.5 setup, vocab 1000, specials at the lowest ids (inside the model vocab), merges
    #    rewritten in the older "a b" string form.
    t = train(qwen_tokenizer(QWEN35_RE), snippets, 1000, QWEN_SPECIALS)
    j = json.loads(t.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    out["qwen35_v1000_lowspecial"] = (j, "Qwen3.5 regex, vocab 1000, specials at ids 0..2, merges as 'a b' strings")

    # 2. Qwen3.5 setup, vocab 5000, Qwen-like added tokens after the vocab, plus added tokens that
    #    exercise normalized / single_word / lstrip / rstrip.
    t = train(qwen_tokenizer(QWEN35_RE), snippets, 5000)
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    t.add_tokens([AddedToken(s, special=False, normalized=False) for s in QWEN_NONSPECIAL])
    t.add_tokens([
        AddedToken("caf\u00e9 au lait", special=False, normalized=True),   # matched after NFC
        AddedToken("<mask>", special=False, normalized=False, single_word=True),
        AddedToken("[SEP]", special=True, normalized=False, lstrip=True, rstrip=True),
    ])
    out["qwen35_v5000_highspecial"] = (json.loads(t.to_str()),
                                       "Qwen3.5 regex, vocab 5000, Qwen-like added tokens after the vocab")

    # 3. Qwen2/3 regex (no \p{M}), vocab 2000, ignore_merges.
    t = train(qwen_tokenizer(QWEN2_RE), snippets, 2000, ["<|endoftext|>"])
    j = json.loads(t.to_str())
    j["model"]["ignore_merges"] = True
    out["qwen2_v2000_ignoremerges"] = (j, "Qwen2 regex, vocab 2000, ignore_merges=true")

    # 4. GPT-2 style: ByteLevel(use_regex=true, add_prefix_space=true), no normalizer.
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    t.decoder = decoders.ByteLevel()
    train(t, snippets, 3000, ["<|endoftext|>"])
    out["gpt2_v3000_prefixspace"] = (json.loads(t.to_str()), "GPT-2 ByteLevel regex, add_prefix_space, vocab 3000")
    return out


def random_id_sequences(rng, vocab_size, n):
    seqs = []
    for _ in range(n):
        length = rng.randint(1, 24)
        seqs.append([rng.randrange(vocab_size + 3) for _ in range(length)])  # a few ids past the end
    return seqs


def ranges(cps):
    r = []
    for c in sorted(cps):
        if r and r[-1][1] == c - 1:
            r[-1][1] = c
        else:
            r.append([c, c])
    return r


def hf_unicode_tables():
    """HF's regex classes and NFC reordering set, probed through the library itself."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(chr(c) for c in cps)
    classes = {}
    for name, pat in [("L", r"\p{L}"), ("M", r"\p{M}"), ("N", r"\p{N}"), ("S", r"\s")]:
        covered = bytearray(len(text))
        for _, (a, b) in pre_tokenizers.Split(Regex(pat), "removed").pre_tokenize_str(text):
            covered[a:b] = b"\x01" * (b - a)
        classes[name] = [cps[i] for i in range(len(text)) if not covered[i]]
    # U+0345 has the highest combining class (240): NFC moves a following mark of class 1..239 before it.
    probe = [c for c in cps if c not in (0x0A, 0x345)]
    outs = normalizers.NFC().normalize_str("\n".join("\u0345" + chr(c) for c in probe)).split("\n")
    classes["ccc"] = [0x345] + [c for c, o in zip(probe, outs) if o != "\u0345" + chr(c) and o.endswith("\u0345")]
    return classes


def write_unicode_inc(path, classes):
    # Characters HF classes as L/M/N that Python's unicodedata (Unicode 14) has unassigned: newer than
    # any ICU we may link, so the runtime adds them to ICU's answer. The unit test checks every code
    # point against hf_unicode.json, which catches a mismatch either way.
    lines = [
        "// runtime/tokenizer/unicode_hf.inc: generated by tools/make_tokenizer_fixtures.py; do not edit.",
        f"// HF tokenizers {tokenizers.__version__}: its regex engine knows Unicode newer than ICU 72, and its",
        "// NFC reorders fewer marks than ICU (older data). Ranges are inclusive.",
        "// clang-format off",
    ]
    for name, flag in [("L", "kLetter"), ("M", "kMark"), ("N", "kNumber")]:
        extra = [c for c in classes[name] if unicodedata.category(chr(c)) == "Cn"]
        body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges(extra))
        lines.append(f"constexpr CodeRange kHfExtra{name}[] = {{{body}}};")
    body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges(classes["ccc"]))
    lines.append(f"constexpr CodeRange kHfNfcReordered[] = {{{body}}};")
    lines.append("// clang-format on")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/tokenizers")
    ap.add_argument("--unicode-inc", default="runtime/tokenizer/unicode_hf.inc")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    snippets = build_snippets()
    assert all(SEP not in s for s in snippets)
    corpus = SEP.join(snippets)
    with open(os.path.join(args.out, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(corpus)
    print(f"corpus: {len(snippets)} snippets, {len(corpus.encode())} bytes")

    classes = hf_unicode_tables()
    with open(os.path.join(args.out, "hf_unicode.json"), "w") as f:
        json.dump({"tokenizers_version": tokenizers.__version__,
                   **{k: ranges(v) for k, v in classes.items()}}, f, separators=(",", ":"))
    write_unicode_inc(args.unicode_inc, classes)

    rng = random.Random(20261129)
    for name, (j, note) in build_tokenizers(snippets).items():
        path = os.path.join(args.out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        tok = Tokenizer.from_file(path)  # what HF reads back is the reference, not the trained object
        ids = [tok.encode(s, add_special_tokens=False).ids for s in snippets]
        vocab = tok.get_vocab_size(with_added_tokens=True)
        prefix = " " if "add_prefix_space\":true" in json.dumps(j["pre_tokenizer"], separators=(",", ":")) else ""
        rand = random_id_sequences(rng, vocab, 300)
        expected = {
            "tokenizers_version": tokenizers.__version__,
            "note": note,
            "snippets": ids,
            "whole": tok.encode(corpus, add_special_tokens=False).ids,
            # Decodes only where they differ from decode_prefix + snippet (NFC, skipped specials, ...).
            "decode_prefix": prefix,
            "decode": {str(k): d for k, (s, i) in enumerate(zip(snippets, ids))
                       if (d := tok.decode(i, skip_special_tokens=False)) != prefix + s},
            "decode_skip_special": {str(k): d for k, (s, i) in enumerate(zip(snippets, ids))
                                    if (d := tok.decode(i, skip_special_tokens=True)) != prefix + s},
            "random_ids": rand,
            "random_decode": [tok.decode(i, skip_special_tokens=False) for i in rand],
            "random_decode_skip_special": [tok.decode(i, skip_special_tokens=True) for i in rand],
        }
        with open(os.path.join(args.out, name + ".expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        print(f"{name}: vocab {vocab}, {sum(map(len, ids))} ids over the snippets")


if __name__ == "__main__":
    main()

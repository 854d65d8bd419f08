#!/usr/bin/env python3
"""HF `tokenizers` encode/decode throughput, single-threaded, on the same corpus as bench/bench_tokenizer.cpp.

usage: python3 tools/bench_hf_tokenizer.py [--reps 15] [--data tests/data/tokenizers]

For each test tokenizer: encode of the whole corpus as one string, encode snippet by snippet (one
`encode` call each; no encode_batch, so no Rayon parallelism), encode of the whole corpus by a freshly
loaded tokenizer (cold word cache), and decode of all the ids. Prints medians in MB/s (10^6 bytes / s
of CPU time, as Google Benchmark reports them; 'M' there is 2^20, converted by the caller).
"""
import argparse
import os
import statistics
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before the import: Rayon reads it once

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

NAMES = ["qwen35_v1000_lowspecial", "qwen35_v5000_highspecial", "qwen2_v2000_ignoremerges", "gpt2_v3000_prefixspace"]


def median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--data", default="tests/data/tokenizers")
    args = ap.parse_args()
    with open(os.path.join(args.data, "corpus.txt"), encoding="utf-8", newline="") as f:
        corpus = f.read()
    snippets = corpus.split("\x1e")
    nbytes = len(corpus.encode())
    snippet_bytes = sum(len(s.encode()) for s in snippets)
    print(f"HF tokenizers {tokenizers.__version__}, corpus {nbytes} bytes, {len(snippets)} snippets, "
          f"RAYON_NUM_THREADS=1, median of {args.reps}")
    for name in NAMES:
        path = os.path.join(args.data, name + ".json")
        tok = Tokenizer.from_file(path)
        ids = tok.encode(corpus, add_special_tokens=False).ids
        text = tok.decode(ids, skip_special_tokens=False)

        def cold():
            fresh = Tokenizer.from_file(path)
            t0 = time.process_time()
            fresh.encode(corpus, add_special_tokens=False)
            return time.process_time() - t0

        whole = median_seconds(lambda: tok.encode(corpus, add_special_tokens=False), args.reps)
        per = median_seconds(lambda: [tok.encode(s, add_special_tokens=False) for s in snippets], args.reps)
        cold_s = statistics.median(cold() for _ in range(args.reps))
        dec = median_seconds(lambda: tok.decode(ids, skip_special_tokens=False), args.reps)
        print(f"{name:28s} encode whole {nbytes / whole / 1e6:7.2f} MB/s | per snippet {snippet_bytes / per / 1e6:7.2f} MB/s"
              f" | cold {nbytes / cold_s / 1e6:7.2f} MB/s | decode {len(text.encode()) / dec / 1e6:7.2f} MB/s")


if __name__ == "__main__":
    main()

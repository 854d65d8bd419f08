#!/usr/bin/env python3
"""The accuracy price of an int8 / FP8 KV cache (`--kv-format`, `kv_cache.format`; issue: the consumer
card's bytes), measured through the engine itself: `tandem logits --device ref` with each cached key and
value row rounded per KV head as the GPU's coded cache holds it (core/row_format.h), fp32 arithmetic
otherwise, so the difference from the bf16 column is the cache's rounding alone.

For every HF fixture, against HF's logits: the largest and the median relative L2 over positions, the
mean KL divergence of the next-token distributions (nats) and the argmax agreement. On the trained
demo model: the perplexity of a text like its training text (a standard-library file) and of one it was
not trained on (numpy's sources), and, over a long text, the KL of each format's next-token
distributions against the exact cache's by position range (the error a long context accumulates);
then the MTP head's acceptance (`tandem bench --draft 2 --device cpu`). Usage:
python3 bench/dev/kv_cache_accuracy.py [--tandem build/tandem]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dense_quant_accuracy import ROOT, perplexity, rel_l2  # noqa: E402
from expert_int4_accuracy import acceptance, logits  # noqa: E402

FORMATS = ["bf16", "int8", "fp8"]


def kl_rows(lg, want):  # KL(softmax(want) || softmax(lg)) per position, nats
    def logsm(x):
        z = x - x.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p, q = logsm(want), logsm(lg)
    return (np.exp(p) * (p - q)).sum(axis=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--text-tokens", type=int, default=768)
    ap.add_argument("--long-tokens", type=int, default=3072)
    a = ap.parse_args()
    data = os.path.join(ROOT, "tests", "data")
    fixtures = sorted(d for d in os.listdir(data) if os.path.exists(os.path.join(data, d, "reference.json")))
    tmp = tempfile.mkdtemp(prefix="kv-cache-")
    ref_dev = ["--device", "ref"]
    try:
        print("| fixture | KV cache | max rel L2 | median rel L2 | KL (nats) | argmax agreement |")
        print("|---|---|---|---|---|---|")
        for fx in fixtures:
            d = os.path.join(data, fx)
            ref = json.load(open(os.path.join(d, "reference.json")))
            want = np.load(os.path.join(d, "logits.npy"))
            for f in FORMATS:
                lg = logits(a.tandem, d, ref["ids"], ref["prefill"], os.path.join(tmp, "fx.npy"), ref_dev + ["--kv-format", f])
                r = rel_l2(lg, want)
                print(f"| {fx} ({len(ref['ids'])} tokens) | {f} | {r.max():.1e} | {np.median(r):.1e} | {kl_rows(lg, want).mean():.1e} | "
                      f"{100 * (lg.argmax(1) == want.argmax(1)).mean():.0f}% |", flush=True)
        d = os.path.join(data, "demo")
        import json as _json, numpy as _np
        texts = {"json/decoder.py (standard library)": open(_json.decoder.__file__).read()[:20000],
                 "numpy/lib/_function_base_impl.py": open(os.path.join(os.path.dirname(_np.__file__), "lib", "_function_base_impl.py")).read()}
        tok = {}
        for k, v in texts.items():
            with open(os.path.join(tmp, "text.in"), "w") as fh:
                fh.write(v)
            tok[k] = [int(t) for t in subprocess.run([a.tandem, "tokenize", "--model", d, "--file", os.path.join(tmp, "text.in")], check=True,
                                                     capture_output=True, text=True).stdout.split()]
        print("\n| demo model: perplexity (first tokens of a file) | tokens | " + " | ".join(f"KV {f}" for f in FORMATS) + " |")
        print("|---|---|" + "---|" * len(FORMATS))
        for what, ids in tok.items():
            ids = ids[: a.text_tokens]
            row = [perplexity(logits(a.tandem, d, ids, len(ids), os.path.join(tmp, "ppl.npy"), ref_dev + ["--kv-format", f]), ids) for f in FORMATS]
            print(f"| {what} | {len(ids)} | " + " | ".join(f"{p:.3f}" for p in row) + " |", flush=True)
        ids = tok["numpy/lib/_function_base_impl.py"][: a.long_tokens]
        lg = {f: logits(a.tandem, d, ids, len(ids), os.path.join(tmp, f"long-{f}.npy"), ref_dev + ["--kv-format", f]) for f in FORMATS}
        edges = [0, 256, 1024, 2048, len(ids)]
        print(f"\n| demo model, {len(ids)} tokens of numpy's source: KL against the exact cache (nats) | " +
              " | ".join(f"positions {lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:]) if hi > lo) + " | argmax agreement |")
        print("|---|" + "---|" * (len(edges) - 1) + "---|")
        for f in FORMATS[1:]:
            k = kl_rows(lg[f], lg["bf16"])
            agree = 100 * (lg[f].argmax(1) == lg["bf16"].argmax(1)).mean()
            print(f"| KV {f} | " + " | ".join(f"{k[lo:hi].mean():.1e}" for lo, hi in zip(edges, edges[1:]) if hi > lo) + f" | {agree:.1f}% |",
                  flush=True)
        text_file = os.path.join(tmp, "text.txt")
        with open(text_file, "w") as fh:
            fh.write(texts["json/decoder.py (standard library)"])
        print("\n| KV cache (the model's and the MTP head's) | acceptance by draft position (--draft 2, cpu) | tokens a step |")
        print("|---|---|---|")
        for f in FORMATS:
            acc = acceptance(a.tandem, d, text_file, ["--kv-format", f])
            print(f"| {f} | " + " / ".join(f"{x:.2f}" for x in acc[:-1]) + f" | {acc[-1]:.2f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

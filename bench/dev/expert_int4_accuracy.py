#!/usr/bin/env python3
"""The accuracy price of routed experts quantized to int4 on load (`--experts-format int4`, issue: the
consumer card's bytes), measured through the engine itself on the trained demo model (BF16, with its
MTP head): `tandem logits` as stored and with int4 experts, on the exact reference (`--device ref`, fp32
arithmetic on the quantized weights) and on the CPU kernels (`--device cpu`, int8 activations).

Against HF's float32 logits of the fixture: the largest and the median relative L2 over positions, the
mean KL divergence of the next-token distributions (nats) and the argmax agreement; the perplexity of a
text like the model's training text (a standard-library file) and of one it was not trained on (numpy's
sources); and the MTP head's acceptance by draft position with its experts as stored and as int4
(`tandem bench --draft 2` on the standard-library text). The random-weight fixtures' shapes (hidden 48)
have no int4 group, so they are not quantizable. Usage:
python3 bench/dev/expert_int4_accuracy.py [--tandem build/tandem]
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
from dense_quant_accuracy import ROOT, kl, perplexity, rel_l2  # noqa: E402


def logits(tandem, model, ids, prefill, out, extra):
    with open(out + ".ids", "w") as f:
        f.write(" ".join(map(str, ids)))
    subprocess.run([tandem, "logits", "--model", model, "--ids", "@" + out + ".ids", "--prefill", str(prefill), "--out", out,
                    "--threads", "2"] + extra, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return np.load(out)


def acceptance(tandem, model, text_file, extra):
    out = subprocess.run([tandem, "bench", "--model", model, "--device", "cpu", "--draft", "2", "--prompts", text_file,
                          "--prompt-len", "64", "--gen", "256", "--repeat", "3", "--threads", "2", "--json"] + extra,
                         check=True, capture_output=True, text=True).stdout
    sp = json.loads(out[out.index("{"):])["results"][0]["speculative"]
    return sp["acceptance_by_position"] + [sp["tokens_per_step"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--text-tokens", type=int, default=768)
    a = ap.parse_args()
    d = os.path.join(ROOT, "tests", "data", "demo")
    ref = json.load(open(os.path.join(d, "reference.json")))
    want = np.load(os.path.join(d, "logits.npy"))
    tmp = tempfile.mkdtemp(prefix="expert-int4-")
    int4 = ["--experts-format", "int4", "--quant-cache", os.path.join(tmp, "cache")]
    variants = [("as stored, ref", ["--device", "ref"]), ("int4 experts, ref", ["--device", "ref"] + int4),
                ("as stored, cpu", ["--device", "cpu"]), ("int4 experts, cpu", ["--device", "cpu"] + int4)]
    try:
        print("| demo model against HF | max rel L2 | median rel L2 | KL (nats) | argmax agreement |")
        print("|---|---|---|---|---|")
        for name, extra in variants:
            lg = logits(a.tandem, d, ref["ids"], ref["prefill"], os.path.join(tmp, "fx.npy"), extra)
            r = rel_l2(lg, want)
            print(f"| {name} | {r.max():.1e} | {np.median(r):.1e} | {kl(lg, want):.1e} | {100 * (lg.argmax(1) == want.argmax(1)).mean():.0f}% |",
                  flush=True)
        import json as _json, numpy as _np
        texts = {"json/decoder.py (standard library)": open(_json.decoder.__file__).read()[:20000],
                 "numpy/lib/_function_base_impl.py": open(os.path.join(os.path.dirname(_np.__file__), "lib", "_function_base_impl.py")).read()[:20000]}
        print("\n| perplexity (first tokens of a file) | tokens | " + " | ".join(n for n, _ in variants) + " |")
        print("|---|---|" + "---|" * len(variants))
        for what, text in texts.items():
            ids = [int(t) for t in subprocess.run([a.tandem, "tokenize", "--model", d, "--text", text], check=True, capture_output=True,
                                                 text=True).stdout.split()][: a.text_tokens]
            row = [perplexity(logits(a.tandem, d, ids, len(ids), os.path.join(tmp, "ppl.npy"), extra), ids) for _, extra in variants]
            print(f"| {what} | {len(ids)} | " + " | ".join(f"{p:.3f}" for p in row) + " |", flush=True)
        text_file = os.path.join(tmp, "text.txt")
        with open(text_file, "w") as f:
            f.write(texts["json/decoder.py (standard library)"])
        print("\n| experts (the model's and the MTP head's) | acceptance by draft position (--draft 2, cpu) | tokens a step |")
        print("|---|---|---|")
        for name, extra in [("as stored (bf16)", []), ("int4", int4)]:
            acc = acceptance(a.tandem, d, text_file, extra)
            print(f"| {name} | " + " / ".join(f"{x:.2f}" for x in acc[:-1]) + f" | {acc[-1]:.2f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

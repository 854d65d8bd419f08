#!/usr/bin/env python3
"""The accuracy price of quantizing the dense weights on load (issue: the consumer card's bytes),
measured before any kernel exists: each dense matrix of a checkpoint is rounded through the format
and written back as float32, so `tandem logits --device ref` (exact fp32 arithmetic) computes what a
W8A16 / FP8 kernel with fp32 accumulation would, up to summation order.

Formats: int8 with a scale per output channel (symmetric, max |w| / 127), FP8 E4M3 with a scale per
output channel (max |w| / 448; round to nearest even, subnormals kept). Scopes: the projections
(attention, DeltaNet, router, shared expert), and the same plus the embedding table and lm_head.
Routed experts, norms, conv weights and the MTP head stay as they are.

For every HF fixture, against HF's logits: the largest relative L2 over positions, the mean KL
divergence of the next-token distributions (nats) and the argmax agreement, next to the unquantized
checkpoint's; for the demo model also the perplexity of a text like its
training text (a standard-library file) and of one it was not trained on (numpy's sources). Usage: python3 bench/dev/dense_quant_accuracy.py [--tandem build/tandem]
"""
import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DENSE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "linear_attn.in_proj_qkv",
         "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a", "linear_attn.out_proj", "mlp.gate.",
         "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj", "shared_expert_gate")
TABLES = ("embed_tokens", "lm_head")


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def to_f32(dtype, raw, shape):
    if dtype == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(raw, np.float16).astype(np.float32).reshape(shape)
    if dtype == "F32":
        return np.frombuffer(raw, np.float32).reshape(shape).copy()
    return None


def int8_rows(w):
    s = np.abs(w).max(axis=1, keepdims=True) / 127.0
    s[s == 0] = 1
    return (np.clip(np.round(w / s), -127, 127) * s).astype(np.float32)


def e4m3(v):  # v already scaled into [-448, 448]
    a = np.abs(v)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -20)))
    step = 2.0 ** (np.maximum(e, -6) - 3)  # 3 mantissa bits; below 2^-6 the subnormal step 2^-9
    return np.clip(np.sign(v) * np.round(a / step) * step, -448, 448)


def fp8_rows(w):
    s = np.abs(w).max(axis=1, keepdims=True) / 448.0
    s[s == 0] = 1
    return (e4m3(w / s) * s).astype(np.float32)


def quantized_copy(src, dst, fmt, tables):
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        p = os.path.join(src, f)
        if os.path.isfile(p) and not f.endswith(".safetensors"):
            shutil.copy(p, dst)
    count = 0
    for path in glob.glob(os.path.join(src, "*.safetensors")):
        header, data = read_st(path)
        meta = header.pop("__metadata__", None)
        out, blobs, off = {}, [], 0
        for name, t in header.items():
            raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
            dense = len(t["shape"]) == 2 and not name.startswith("mtp.") and ".experts." not in name and (
                any(d in name for d in DENSE) or (tables and any(d in name for d in TABLES)))
            w = to_f32(t["dtype"], raw, t["shape"]) if dense else None
            if w is not None:
                raw = (int8_rows(w) if fmt == "int8" else fp8_rows(w)).tobytes()
                t = {"dtype": "F32", "shape": t["shape"]}
                count += 1
            out[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
        if meta is not None:
            out["__metadata__"] = meta
        h = json.dumps(out).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(dst, os.path.basename(path)), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for b in blobs:
                f.write(b)
    return count


def logits(tandem, model, ids, prefill, out):
    ids_file = out + ".ids"
    with open(ids_file, "w") as f:
        f.write(" ".join(map(str, ids)))
    subprocess.run([tandem, "logits", "--model", model, "--ids", "@" + ids_file, "--prefill", str(prefill), "--device", "ref",
                    "--out", out], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return np.load(out)


def rel_l2(a, b):
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


def kl(lg, want):  # mean over positions of KL(softmax(want) || softmax(lg)), nats
    def logsm(x):
        z = x - x.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p, q = logsm(want), logsm(lg)
    return float((np.exp(p) * (p - q)).sum(axis=1).mean())


def perplexity(lg, ids):
    z = lg[:-1] - lg[:-1].max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--text-tokens", type=int, default=768)
    a = ap.parse_args()
    data = os.path.join(ROOT, "tests", "data")
    fixtures = sorted(d for d in os.listdir(data) if os.path.exists(os.path.join(data, d, "reference.json")))
    variants = [("int8", False), ("int8", True), ("fp8", False), ("fp8", True)]
    print("| fixture | reference (as stored) | " + " | ".join(f"{f} {'+ embed, lm_head' if t else 'projections'}" for f, t in variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    tmp = tempfile.mkdtemp(prefix="dense-quant-")
    ppl_rows = []
    try:
        import json as _json, numpy as _np  # a text like the demo model's training text (the standard library), one not (numpy)
        texts = {"json/decoder.py (standard library)": open(_json.decoder.__file__).read()[:20000],
                 "numpy/lib/_function_base_impl.py": open(os.path.join(os.path.dirname(_np.__file__), "lib", "_function_base_impl.py")).read()[:20000]}
        for fx in fixtures:
            d = os.path.join(data, fx)
            ref = json.load(open(os.path.join(d, "reference.json")))
            want = np.load(os.path.join(d, "logits.npy"))
            base = logits(a.tandem, d, ref["ids"], ref["prefill"], os.path.join(tmp, fx + ".npy"))
            cell = lambda lg: f"{rel_l2(lg, want).max():.1e} / {kl(lg, want):.1e} / {100 * (lg.argmax(1) == want.argmax(1)).mean():.0f}%"
            cells = [cell(base)]
            got = {}
            for fmt, tables in variants:
                q = os.path.join(tmp, f"{fx}-{fmt}-{int(tables)}")
                n = quantized_copy(d, q, fmt, tables)
                lg = logits(a.tandem, q, ref["ids"], ref["prefill"], q + ".npy")
                got[(fmt, tables)] = q
                cells.append(f"{cell(lg)} ({n})")
                shutil.rmtree(q) if fx != "demo" else None
            print(f"| {fx} | " + " | ".join(cells) + " |", flush=True)
            if fx == "demo":
                for what, text in texts.items():
                    ids = [int(t) for t in subprocess.run([a.tandem, "tokenize", "--model", d, "--text", text], check=True,
                                                         capture_output=True, text=True).stdout.split()][: a.text_tokens]
                    row = [perplexity(logits(a.tandem, d, ids, len(ids), os.path.join(tmp, "ppl.npy")), ids)]
                    for v in variants:
                        row.append(perplexity(logits(a.tandem, got[v], ids, len(ids), os.path.join(tmp, "pplq.npy")), ids))
                    ppl_rows.append((what, len(ids), row))
        print("\ndemo model, perplexity of the first tokens of a file:")
        print("| text | tokens | as stored | " + " | ".join(f"{f} {'+ embed, lm_head' if t else 'projections'}" for f, t in variants) + " |")
        print("|---|---|---|" + "---|" * len(variants))
        for what, n, row in ppl_rows:
            print(f"| {what} | {n} | " + " | ".join(f"{p:.3f}" for p in row) + " |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

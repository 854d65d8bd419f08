#!/usr/bin/env python3
"""Second-turn TTFT of a long conversation through `tandem serve` (issue 26's prefix-cache target): turn 1
sends a history of about --history tokens, turn 2 resends it with the reply and a new question; the
time to the first token of turn 2 (a 1-token reply, so the request's time) with the server's prefix
cache, against a server started with --cache-bytes 0. Starts both servers itself (flags after --).

  bench/serve_cache_ttft.py --tandem build/tandem --model DIR --history 16000 -- --device gpu --context 17000
"""
import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def start(tandem, model, flags):
    p = subprocess.Popen([tandem, "serve", "--model", model, "--port", "0", *flags], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, m.group(1), line.strip()
    sys.exit("tandem serve exited before listening")


def chat(url, messages):
    body = json.dumps({"messages": messages, "max_tokens": 1, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}).encode()
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=600).read())
    return time.perf_counter() - t0, r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default="build/tandem")
    ap.add_argument("--model", required=True)
    ap.add_argument("--history", type=int, default=16000, help="approximate history tokens")
    ap.add_argument("--vram", help="also a server whose cache is only its VRAM tier of this size (--cache-vram, GPU)")
    ap.add_argument("flags", nargs="*")
    a = ap.parse_args()
    print("| server | turn 1 prompt tokens | turn 1 s | turn 2 prompt tokens | cached | turn 2 TTFT s |")
    print("|---|---|---|---|---|---|")
    results = {}
    variants = [("prefix cache (host memory)", [])]
    if a.vram:
        variants.append((f"prefix cache (VRAM tier, --cache-vram {a.vram})", ["--cache-vram", a.vram, "--cache-bytes", "0"]))
    variants.append(("no cache (--cache-bytes 0)", ["--cache-bytes", "0"]))
    for name, extra in variants:
        p, url, line = start(a.tandem, a.model, a.flags + extra)
        try:
            # a history of about --history tokens (at most), measured with the server's tokenizer
            def tokens(text):
                req = urllib.request.Request(url + "/tokenize", data=json.dumps({"content": text}).encode(), headers={"Content-Type": "application/json"})
                return len(json.loads(urllib.request.urlopen(req, timeout=60).read())["tokens"])
            items = a.history // 4
            for _ in range(4):  # item numbers grow longer as they go: rescale until it fits
                words = " ".join(f"item{i} is here." for i in range(items))
                n = tokens(words)
                if a.history * 0.97 <= n <= a.history:
                    break
                items = int(items * a.history * 0.985 / n)
            turn1 = [{"role": "system", "content": "You are a careful reader."}, {"role": "user", "content": "Read this: " + words}]
            t1, r1 = chat(url, turn1)
            turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"] or "ok"}, {"role": "user", "content": "What was item7?"}]
            t2, r2 = chat(url, turn2)
        except urllib.error.HTTPError as e:
            sys.exit(f"{name}: HTTP {e.code}: {e.read()[:400]!r}")
        finally:
            p.terminate()
            p.wait(timeout=60)
        u1, u2 = r1["usage"], r2["usage"]
        results[name] = t2
        print(f"| {name} | {u1['prompt_tokens']} | {t1:.3f} | {u2['prompt_tokens']} | {u2['prompt_tokens_details']['cached_tokens']} | {t2:.3f} |", flush=True)
    base = results.pop("no cache (--cache-bytes 0)")
    print()
    for name, t in results.items():
        print(f"second-turn TTFT without the cache / with the {name[len('prefix cache ('):-1]}: {base / t:.1f}x")


if __name__ == "__main__":
    main()

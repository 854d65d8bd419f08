#!/usr/bin/env python3
"""Load test of `tandem serve` (loopback only; stops by itself): for each concurrency level, that many
clients stream chat completions at once (plain HTTP and SSE, no client library), and the table gives aggregate
generated tok/s, TTFT and inter-token latency p50 / p99. With --soak SECONDS it instead keeps the
highest level running for that long and reports the server's resident memory every 30 s (growth is a
leak). Starts the server itself with --model (extra server flags after --), or talks to --url.

  bench/serve_load.py --model build/models/tiny --streams 1,2,4,8 -- --device cpu --slots 8
  bench/serve_load.py --url http://127.0.0.1:8080 --streams 1,4 --max-tokens 128 --prompt-words 2000
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(url, prompt, max_tokens, out):
    """One streamed chat completion over plain HTTP (no client library: the GPU machine has none)."""
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                       "chat_template_kwargs": {"enable_thinking": False}})
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json",
                                                        "Authorization": "Bearer " + os.environ.get("TANDEM_API_KEY", "none")})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    times, tokens, buf = [], 0, b""
    while True:
        piece = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not piece:
            break
        buf += piece
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            if not frame.startswith(b"data: ") or frame == b"data: [DONE]":
                continue
            chunk = json.loads(frame[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                d = c.get("delta", {})
                if d.get("content") or d.get("reasoning_content"):
                    times.append(time.perf_counter())
    conn.close()
    out.append((t0, times, tokens))


def run_level(url, streams, requests, prompt, max_tokens):
    results = []
    lock = threading.Lock()

    def client_loop(i):
        for r in range(requests):
            mine = []
            one_request(url, f"[client {i}, request {r}] {prompt}", max_tokens, mine)
            with lock:
                results.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [(ts[0] - s) * 1e3 for s, ts, _ in results if ts]
    gaps = [(b - a) * 1e3 for _, ts, n in results for a, b in zip(ts, ts[1:])]
    generated = sum(n for _, _, n in results)
    per_stream = [(len(ts) - 1) / (ts[-1] - ts[0]) for _, ts, _ in results if len(ts) > 2 and ts[-1] > ts[0]]
    return {"streams": streams, "requests": len(results), "tok_s": generated / wall, "decode": statistics.median(per_stream) if per_stream else float("nan"), "ttft50": percentile(ttft, 50), "ttft99": percentile(ttft, 99),
            "itl50": percentile(gaps, 50), "itl99": percentile(gaps, 99), "wall": wall, "tokens": generated}


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024
    except (OSError, AttributeError):
        return float("nan")


def cache_mib(url):
    import urllib.request
    try:
        req = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer " + os.environ.get("TANDEM_API_KEY", "none")})
        text = urllib.request.urlopen(req, timeout=10).read().decode()
        m = re.search(r"^tandem_prefix_cache_bytes (\S+)$", text, re.M)
        return float(m.group(1)) / 2 ** 20 if m else 0.0
    except OSError:
        return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--tandem", default=os.environ.get("TANDEM_CLI", "build/tandem"))
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=2, help="requests each client sends in turn")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=32)
    ap.add_argument("--soak", type=float, default=0, help="seconds of load at the highest level, reporting memory")
    ap.add_argument("server_flags", nargs="*")
    a = ap.parse_args()
    if not a.url and not a.model:
        ap.error("--url or --model")
    proc = None
    if a.model:
        proc = subprocess.Popen([a.tandem, "serve", "--model", a.model, "--port", "0", *a.server_flags], stderr=subprocess.PIPE, text=True)
        while True:
            line = proc.stderr.readline()
            if not line:
                sys.exit("tandem serve exited before listening")
            sys.stderr.write(line)
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                a.url = m.group(1)
                break
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    if not re.match(r"http://(127\.|localhost|\[::1\])", a.url):
        sys.exit("serve_load.py talks to loopback addresses only")
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * max(1, a.prompt_words // 9))
    levels = [int(x) for x in a.streams.split(",")]
    try:
        if a.soak > 0:
            pid = proc.pid if proc else None
            t0 = time.time()
            print("| elapsed s | server RSS MiB | of it prefix cache MiB | requests | tok/s |")
            print("|---|---|---|---|---|")
            start_rss, last, done, toks = rss_mib(pid) if pid else float("nan"), 0.0, 0, 0.0
            while time.time() - t0 < a.soak:
                r = run_level(a.url, levels[-1], 1, prompt, a.max_tokens)
                done, toks = done + r["requests"], r["tok_s"]
                if time.time() - last >= 30 or time.time() - t0 >= a.soak:
                    last = time.time()
                    print(f"| {time.time() - t0:.0f} | {rss_mib(pid) if pid else float('nan'):.1f} | {cache_mib(a.url):.1f} | {done} | {toks:.1f} |", flush=True)
            if pid:
                print(f"\nRSS {start_rss:.1f} -> {rss_mib(pid):.1f} MiB over {a.soak:.0f} s (the prefix cache fills up to its budget first)")
            return
        print(f"| streams | requests | aggregate tok/s | decode tok/s a stream (median) | TTFT p50 / p99 ms | ITL p50 / p99 ms |")
        print("|---|---|---|---|---|---|")
        for n in levels:
            r = run_level(a.url, n, a.requests, prompt, a.max_tokens)
            print(f"| {n} | {r['requests']} | {r['tok_s']:.1f} | {r['decode']:.1f} | {r['ttft50']:.1f} / {r['ttft99']:.1f} | {r['itl50']:.2f} / {r['itl99']:.2f} |", flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""One decode step of a `tandem ... --trace FILE.json` timeline as a PNG, with the time per lane.

usage: tools/trace_plot.py TRACE.json OUT.png [--step K] [--text-only]
  K counts decode steps from the end (1 = the last, the default). Lanes: the GPU stream's spans by
  category (pid 2) and each host thread (pid 1). Printed: the step's length, busy time per lane, and how
  much of the CPU experts' time the GPU was busy too (the overlap the dispatcher buys). --text-only
  prints without drawing (no matplotlib needed).
"""
import argparse, json, sys


def union_length(spans):
    total, end = 0.0, None
    for b, e in sorted(spans):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def intersect_length(a, b):
    """Length of (union of a) intersected with (union of b)."""
    def merged(spans):
        out = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    ma, mb, i, j, total = merged(a), merged(b), 0, 0, 0.0
    while i < len(ma) and j < len(mb):
        lo, hi = max(ma[i][0], mb[j][0]), min(ma[i][1], mb[j][1])
        if hi > lo:
            total += hi - lo
        if ma[i][1] < mb[j][1]:
            i += 1
        else:
            j += 1
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--text-only", action="store_true")
    a = ap.parse_args()
    try:
        events = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X"]
    except (OSError, ValueError, KeyError) as err:
        sys.exit(f"trace_plot: {a.trace}: not a tandem trace ({err})")
    steps = sorted((e for e in events if e["name"] == "forward (decode)"), key=lambda e: e["ts"])
    if len(steps) < a.step:
        sys.exit(f"trace_plot: {a.trace} has {len(steps)} decode steps; --step {a.step} asks for more")
    step = steps[-a.step]
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    inside = [e for e in events if e["ts"] < t1 and e["ts"] + e["dur"] > t0 and e is not step]

    def lane(e):
        return f"GPU: {e.get('cat', '')}" if e["pid"] == 2 else f"host thread {e['tid']}: {e.get('cat', '')}"

    lanes = sorted({lane(e) for e in inside})
    clip = lambda e: (max(e["ts"], t0) - t0, min(e["ts"] + e["dur"], t1) - t0)
    busy = {l: union_length([clip(e) for e in inside if lane(e) == l]) for l in lanes}
    gpu = [clip(e) for e in inside if e["pid"] == 2 and e.get("cat") == "gpu"]
    cpu = [clip(e) for e in inside if e.get("cat") == "cpu"]
    length = t1 - t0
    print(f"decode step {len(steps) - a.step + 1} of {len(steps)}: {length / 1000:.2f} ms")
    print(f"{'lane':40s} {'busy ms':>8s} {'share':>6s}")
    for l in lanes:
        print(f"{l:40s} {busy[l] / 1000:8.3f} {100 * busy[l] / length:5.0f}%")
    if cpu:
        both = intersect_length(cpu, gpu)
        print(f"CPU experts {union_length(cpu) / 1000:.3f} ms, of which the GPU was busy too {both / 1000:.3f} ms "
              f"({100 * both / max(union_length(cpu), 1e-9):.0f}%)")
    if a.text_only:
        return

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"gpu": "#1f77b4", "copy": "#9467bd", "cpu": "#d62728", "handoff": "#ff7f0e", "host": "#7f7f7f"}
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(lanes) + 1.6))
    for i, l in enumerate(lanes):
        spans = [clip(e) for e in inside if lane(e) == l]
        cat = l.split(": ")[-1]
        ax.broken_barh([(b / 1000, (e - b) / 1000) for b, e in spans], (i - 0.35, 0.7), facecolors=colors.get(cat, "#2ca02c"))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes, fontsize=8)
    ax.set_xlim(0, length / 1000)
    ax.set_xlabel("ms into the decode step")
    ax.set_title(f"one decode step ({length / 1000:.2f} ms): {a.trace.split('/')[-1]}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

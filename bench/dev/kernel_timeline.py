#!/usr/bin/env python3
"""Where a captured decode step's time goes, from bench/dev/kernel_timeline.cpp's kernel_timeline.csv.

A step is one replay of a CUDA graph: its kernels share the graph launch's correlation id (where CUPTI
gives none, a node seen twice starts the graph's next replay). Steps of the same graph and kernel count
are one step form (a batch size, a verification width); a form replayed at least --min-steps times is
reported, its first --skip replays dropped as warm-up. A step's wall time is its first kernel's start to
its last kernel's end. A kernel is named with its launch shape (blocks x threads), which tells apart the
GEMVs of different matrices. Every kernel is credited with the time it extends the step's frontier (its
end less the latest end of the kernels that ended before it; nothing when it ends inside that), so the
credits sum to the step's wall time. A graph's kernels run on streams of the driver's choosing (a stream
id says nothing of the chain), hence the frontier rather than a main stream. A kernel's duration
includes the time its blocks wait for the kernel before it (programmatic dependent launch starts them
early), so the credit, not the duration, is what a faster kernel saves.

Then the median step's kernels from the --seq-from-th on, --seq of them, in the order they start: each
one's start against the frontier so far (negative: it started early, a programmatic launch or a kernel
beside the chain), duration and credit, so a layer's chain reads kernel by kernel.

usage: kernel_timeline.py kernel_timeline.csv [--min-steps 8] [--skip 2] [--top 25] [--seq 24] [--seq-from 40]
"""
import argparse
import csv
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from kernel_steps import short  # noqa: E402  (the kernel's name as the ncu tables print it)


def median(xs):
    return statistics.median(xs) if xs else 0.0


def steps_of(recs):
    """A graph's records (sorted by start) cut into replays: by the launch's correlation id, else a node
    seen again starts the next replay."""
    if len({r["correlation"] for r in recs}) > 1:
        by_launch = defaultdict(list)
        for r in recs:
            by_launch[r["correlation"]].append(r)
        return sorted(by_launch.values(), key=lambda s: s[0]["start"])
    steps, cur, seen = [], [], set()
    for r in recs:
        if r["node"] in seen:
            steps.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r["node"])
    if cur:
        steps.append(cur)
    return steps


def label(r):
    return "%s [%d x %d]" % (short(r["kernel"]), r["blocks"], r["threads"])


def credit(step):
    """{kernel label: ns the kernel extends the step's frontier} and the step's wall ns."""
    start = min(r["start"] for r in step)
    got, front = defaultdict(int), start
    for r in sorted(step, key=lambda r: r["end"]):
        if r["end"] > front:
            got[label(r)] += r["end"] - front
            front = r["end"]
    return got, front - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--min-steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--seq-from", type=int, default=40)
    a = ap.parse_args()
    graphs = defaultdict(list)
    with open(a.csv) as f:
        for row in csv.DictReader(f):
            r = {k: int(row[k]) for k in ("start_ns", "end_ns", "graph", "node", "stream", "correlation", "blocks", "threads")}
            r["start"], r["end"], r["kernel"] = r.pop("start_ns"), r.pop("end_ns"), row["kernel"]
            if r["graph"]:
                graphs[r["graph"]].append(r)
    if not graphs:
        print("no graph-launched kernels in %s" % a.csv)
        return
    forms = defaultdict(list)
    for g, recs in graphs.items():
        recs.sort(key=lambda r: r["start"])
        for s in steps_of(recs):
            forms[(g, len(s))].append(s)
    shown_any = False
    for (g, n), steps in sorted(forms.items()):
        steps = steps[a.skip:]
        if len(steps) < a.min_steps:
            continue
        shown_any = True
        walls, credits, durs, calls = [], defaultdict(list), defaultdict(list), defaultdict(list)
        gaps = [nxt[0]["start"] - max(r["end"] for r in cur) for cur, nxt in zip(steps, steps[1:])]
        for s in steps:
            got, wall = credit(s)
            walls.append(wall)
            cnt = defaultdict(int)
            for r in s:
                durs[label(r)].append(r["end"] - r["start"])
                cnt[label(r)] += 1
            for k in set(cnt) | set(got):
                credits[k].append(got.get(k, 0))
                calls[k].append(cnt.get(k, 0))
        wall = median(walls)
        total_dur = median([sum(r["end"] - r["start"] for r in s) for s in steps])
        print("## Graph %d: %d replays of %d kernels; step %.1f us (median; %.1f-%.1f), kernels' durations summed %.1f us;"
              " %.1f us from a step's last kernel to the next step's first (median)\n"
              % (g, len(steps), n, wall / 1e3, min(walls) / 1e3, max(walls) / 1e3, total_dur / 1e3, median(gaps) / 1e3))
        print("| kernel | calls a step | duration us (median) | credited us a step | share of the step |")
        print("|---|---:|---:|---:|---:|")
        rows = [k for k in sorted(credits, key=lambda k: -median(credits[k])) if median(credits[k]) or median(calls[k])]
        for k in rows[: a.top]:
            c = median(credits[k])
            print("| %s | %d | %.2f | %.1f | %.1f%% |" % (k[:110], round(median(calls[k])), median(durs[k]) / 1e3 if durs[k] else 0, c / 1e3, 100 * c / wall))
        rest = sum(median(credits[k]) for k in rows[a.top:])
        if rest:
            print("| (%d more kernels) | | | %.1f | %.1f%% |" % (len(rows) - a.top, rest / 1e3, 100 * rest / wall))
        print()
        if a.seq > 0:
            mid = steps[sorted(range(len(steps)), key=walls.__getitem__)[len(steps) // 2]]
            chain = sorted(mid, key=lambda r: r["start"])
            print("The median step's kernels %d.. in the order they start (us):\n" % a.seq_from)
            print("| # | kernel | start - frontier | duration | credit |")
            print("|---:|---|---:|---:|---:|")
            front = chain[0]["start"]
            for i, r in enumerate(chain):
                if a.seq_from <= i < a.seq_from + a.seq:
                    print("| %d | %s | %.2f | %.2f | %.2f |" % (i, label(r)[:90], (r["start"] - front) / 1e3, (r["end"] - r["start"]) / 1e3,
                                                             max(0, r["end"] - front) / 1e3))
                front = max(front, r["end"])
            print()

    if not shown_any:
        print("no step form replayed %d times or more (forms: %s)" % (a.min_steps + a.skip, ", ".join(
            "graph %d x %d kernels: %d" % (g, n, len(v)) for (g, n), v in sorted(forms.items()))))


if __name__ == "__main__":
    main()

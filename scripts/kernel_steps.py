#!/usr/bin/env python3
"""scripts/kernel_steps.py: ncu's per-kernel times (gpu_quant.sh's `kernels` step), steps side by side.

usage: kernel_steps.py CSV:INDEX:LABEL [CSV:INDEX:LABEL ...]
Each CSV is one run under ncu (--csv --page raw, gpu__time_duration.sum). Every model step starts with its
embedding lookup (embed_kernel), so a run's kernels are cut there; INDEX picks one of its long segments
(over 100 kernels: the prompt's chunks and the model's steps, not the drafts), -1 the last. Prints each
run's segments (kernels, µs), then per kernel name the launches and time in each picked step, sorted by
how much more time the last step spends in it than the first (µs; kernels run one at a time under ncu).
"""
import collections
import csv
import re
import sys


def short(name):
    """The kernel's name and template arguments, without its parameters and namespaces."""
    if name.endswith(")"):  # cut the last top-level parameter list
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|tandem::gpu::|tandem::|detail::", "", name)
    return name[:110]


def segments(path):
    lines = open(path, errors="replace").read().splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith('"ID"') and "Kernel Name" in l)
    except StopIteration:
        sys.exit("kernels: no ncu table in %s (%s)" % (path, " | ".join(lines[-3:])))
    rows = [r for r in csv.DictReader(lines[start:]) if r.get("ID", "").isdigit()]  # not the units row
    ks = [(short(r["Kernel Name"]), float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3) for r in rows]
    cuts = [i for i, (n, _) in enumerate(ks) if n.startswith("embed_kernel")] + [len(ks)]
    segs = [ks[a:b] for a, b in zip(cuts, cuts[1:])]
    print("kernels, %s: %d launches, %d segments (kernels, µs): %s" % (
        path.split("/")[-1], len(ks), len(segs), ", ".join("%d %.0f" % (len(s), sum(t for _, t in s)) for s in segs)))
    return [s for s in segs if len(s) > 100]


def main():
    runs, picked = {}, []
    for arg in sys.argv[1:]:
        path, index, label = arg.rsplit(":", 2)
        if path not in runs:
            runs[path] = segments(path)
        longs = runs[path]
        if not -len(longs) <= int(index) < len(longs):
            sys.exit("kernels: %s has %d long segments, no %s" % (path, len(longs), index))
        picked.append((label, longs[int(index)]))
    tot = collections.OrderedDict()
    for col, (_, seg) in enumerate(picked):
        for n, t in seg:
            e = tot.setdefault(n, [[0, 0.0] for _ in picked])
            e[col][0] += 1
            e[col][1] += t
    print("kernels: " + ", ".join("%s %.1f µs (%d launches)" % (l, sum(t for _, t in s), len(s)) for l, s in picked))
    print("%-100s" % "kernel" + "".join(" %5s %9s" % ("n", l[:9]) for l, _ in picked))
    for n, cols in sorted(tot.items(), key=lambda kv: -(kv[1][-1][1] - kv[1][0][1])):
        print("%-100s" % n[:100] + "".join(" %5d %9.1f" % (c, t) for c, t in cols))


if __name__ == "__main__":
    main()

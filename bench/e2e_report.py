#!/usr/bin/env python3
"""Turns the JSON files of bench/run_e2e.sh into the committed report: a Markdown table, one JSON with
every figure, and a PNG of decode tok/s against the GPU budget with the bound drawn in.

usage: bench/e2e_report.py RAW_DIR OUT_PREFIX --machine TEXT --commit SHA [--tandem BUILD/tandem --model CONFIG_DIR]
  RAW_DIR holds <scenario>-<prompt_len>.json (tandem bench --json) and <scenario>.yaml configs;
  with --tandem/--model the planner's prediction for each config is added (tandem plan --json, with the
  bandwidths the bench measured on that machine).
"""
import argparse, glob, json, os, re, subprocess, tempfile

BUDGET = {"hybrid-8gib-cpu-experts": 8, "hybrid-12gib": 12, "hybrid-16gib": 16, "hybrid-24gib": 24}
# Expert deferral 1-4 (bench/run_e2e.sh hybrid-<N>gib-defer<D>): not on the budget curve, their own rows.
DEFERRED = {"hybrid-%dgib-defer%d" % (b, d): b for b in (8, 12) for d in range(1, 5)}
LABEL = {"hybrid-8gib-cpu-experts": "8 GiB, every routed expert on the CPU", "hybrid-12gib": "12 GiB hybrid",
         "hybrid-16gib": "16 GiB hybrid", "hybrid-24gib": "24 GiB hybrid", "gpu-all": "everything on the GPU (--device gpu)",
         "cpu-all": "everything on the CPU (--device cpu)",
         **{n: ("8 GiB, all experts on the CPU, deferral %s" if b == 8 else "12 GiB hybrid, deferral %s") % n[-1] for n, b in DEFERRED.items()}}
# experts.link (bench/run_e2e.sh hybrid-8gib-cpu-experts-link<N>): the GPU computes N of each token's host
# experts over PCIe; the same budget and placement, their own rows.
LINKED = ["hybrid-8gib-cpu-experts-link%d" % n for n in range(1, 9)]
LABEL.update({n: "8 GiB, every routed expert on the CPU, experts.link %s" % n.split("-link")[1] for n in LINKED})
ORDER = ["hybrid-8gib-cpu-experts", *LINKED, *["hybrid-8gib-defer%d" % d for d in range(1, 5)], "hybrid-12gib",
         *["hybrid-12gib-defer%d" % d for d in range(1, 5)], "hybrid-16gib", "hybrid-24gib",
         "gpu-all", "cpu-all"]


def predict(tandem, model, yaml_path, bw):
    with open(yaml_path) as f:
        text = f.read()
    # The configs as run; their heat path was the run's own folder's heat.yaml (bench/run_e2e.sh), read
    # here from the folder the config lies in, so a plan with a heat map is predicted with it.
    heat = os.path.join(os.path.dirname(os.path.abspath(yaml_path)), "heat.yaml")
    text = re.sub(r"(?m)^  heat: .*\n", ("  heat: %s\n" % heat) if os.path.exists(heat) else "", text)
    measured = "  gpu: %.0fGB/s\n  pcie: %.1fGB/s\n  cpu: %.1fGB/s\n" % (bw["gpu"] / 1e9, bw["pcie"] / 1e9, bw["cpu"] / 1e9)
    if re.search(r"(?m)^bandwidth:\n", text):  # the config's own block (host_memory, ...) with the measured three
        text = re.sub(r"(?m)^  (gpu|pcie|cpu): .*\n", "", text)
        text = re.sub(r"(?m)^bandwidth:\n", "bandwidth:\n" + measured, text)
    else:
        text += "bandwidth:\n" + measured
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as t:
        t.write(text)
    try:
        out = subprocess.run([tandem, "plan", "--model", model, "--config", t.name, "--json"], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)
    finally:
        os.unlink(t.name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out_prefix")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--tandem")
    ap.add_argument("--model")
    a = ap.parse_args()

    # <scenario>.json (one bench run, every prompt length) or <scenario>-<len>.json (one per length)
    runs = {}
    for path in sorted(glob.glob(os.path.join(a.raw, "*.json"))):
        base = os.path.basename(path)[:-5]
        if base.endswith(".plan") or base == "report":
            continue
        m = re.match(r"(.+)-(\d+)$", base)
        name = m.group(1) if m and m.group(1) in LABEL else base
        if name not in LABEL:
            continue
        j = json.load(open(path))
        for r in j["results"]:
            runs.setdefault(name, {})[r["prompt_len"]] = dict(j, results=[r])
    rows, report = [], {"machine": a.machine, "commit": a.commit, "date": a.date, "model": "qwen3.5-35b-a3b synthetic GPTQ-Int4 (routing skew 1)", "scenarios": []}
    for name in ORDER:
        if name not in runs:
            continue
        for plen, j in sorted(runs[name].items()):
            r = j["results"][0]
            bw = {"gpu": j["bandwidth_bytes_per_s"], "pcie": j.get("pcie_h2d_bytes_per_s") or 25e9, "cpu": j.get("cpu_read_bytes_per_s") or 90.5e9}
            entry = {"scenario": name, "label": LABEL[name], "budget_gib": BUDGET.get(name), "prompt_len": plen, "gen": j["gen"], "repeat": j["repeat"],
                     "prefill_tok_s": r["prefill_tok_s"], "prefill_tok_s_min": r["prefill_tok_s_min"], "prefill_tok_s_max": r["prefill_tok_s_max"],
                     "decode_tok_s": r["decode_tok_s"], "decode_tok_s_min": r["decode_tok_s_min"], "decode_tok_s_max": r["decode_tok_s_max"],
                     "ttft_ms": r["ttft_ms"], "itl_p50_ms": r["itl_p50_ms"], "itl_p99_ms": r["itl_p99_ms"],
                     "gpu_expert_fraction": r.get("gpu_expert_fraction", 1.0), "bound_decode_tok_s": r.get("bound_decode_tok_s", j["bound_decode_tok_s"]),
                     "decode_ratio_to_bound": r["decode_ratio_to_bound"], "peak_vram_bytes": j["peak_vram_bytes"], "peak_host_bytes": j["peak_host_bytes"],
                     "gpu_copy_bytes_per_s": j["bandwidth_bytes_per_s"], "cpu_read_bytes_per_s": j.get("cpu_read_bytes_per_s"),
                     "pcie_h2d_bytes_per_s": j.get("pcie_h2d_bytes_per_s"), "prefill_streamed_layers": r.get("prefill_streamed_layers", 0)}
            yaml_path = os.path.join(a.raw, name + ".yaml")
            if a.tandem and a.model and os.path.exists(yaml_path):
                p = predict(a.tandem, a.model, yaml_path, bw)
                entry["predicted_decode_tok_s"] = p["predicted_decode_tok_s"]
                entry["planned_gpu_expert_fraction"] = p["expected_gpu_expert_fraction"]
                entry["planned_vram_total_bytes"] = p["vram_total_bytes"]
            report["scenarios"].append(entry)
            rows.append(entry)

    with open(a.out_prefix + ".json", "w") as f:
        json.dump(report, f, indent=2)

    md = []
    md.append("| placement | prompt | prefill tok/s [min-max] | TTFT ms | decode tok/s [min-max] | ITL p50 / p99 ms | GPU share | bound tok/s | decode / bound | predicted | peak VRAM | peak host |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in rows:
        md.append("| %s | %d | %.1f [%.1f-%.1f]%s | %.0f | %.1f [%.1f-%.1f] | %.2f / %.2f | %.0f%% | %.1f | %.0f%% | %s | %.2f GB | %.2f GB |" % (
            e["label"], e["prompt_len"], e["prefill_tok_s"], e["prefill_tok_s_min"], e["prefill_tok_s_max"],
            " (streamed)" if e["prefill_streamed_layers"] else "", e["ttft_ms"],
            e["decode_tok_s"], e["decode_tok_s_min"], e["decode_tok_s_max"], e["itl_p50_ms"], e["itl_p99_ms"],
            100 * e["gpu_expert_fraction"], e["bound_decode_tok_s"], 100 * e["decode_ratio_to_bound"],
            "%.1f" % e["predicted_decode_tok_s"] if "predicted_decode_tok_s" in e else "-", e["peak_vram_bytes"] / 1e9, e["peak_host_bytes"] / 1e9))
    with open(a.out_prefix + ".table.md", "w") as f:
        f.write("\n".join(md) + "\n")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    pts = [e for e in rows if e["budget_gib"] and e["prompt_len"] == 512]
    gpu = [e for e in rows if e["scenario"] == "gpu-all" and e["prompt_len"] == 512]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    xs = [e["budget_gib"] for e in pts]
    ax.plot(xs, [e["decode_tok_s"] for e in pts], "o-", color="#1f77b4", label="Tandem --device hybrid (measured median)")
    ax.errorbar(xs, [e["decode_tok_s"] for e in pts], yerr=[[e["decode_tok_s"] - e["decode_tok_s_min"] for e in pts], [e["decode_tok_s_max"] - e["decode_tok_s"] for e in pts]], fmt="none", color="#1f77b4")
    ax.plot(xs, [e["bound_decode_tok_s"] for e in pts], "s--", color="#d62728", label="bandwidth bound (GPU HBM / CPU DRAM, measured)")
    if all("predicted_decode_tok_s" in e for e in pts):
        ax.plot(xs, [e["predicted_decode_tok_s"] for e in pts], "^:", color="#2ca02c", label="planner prediction")
    dfr = [e for e in rows if e["scenario"] in DEFERRED and e["prompt_len"] == 512]
    if dfr:
        ax.plot([DEFERRED[e["scenario"]] for e in dfr], [e["decode_tok_s"] for e in dfr], "D", color="#ff7f0e",
                label="hybrid with expert deferral (changes the output slightly)")
    if gpu:
        ax.axhline(gpu[0]["decode_tok_s"], color="#9467bd", lw=1, label="--device gpu (all on GPU): %.0f tok/s" % gpu[0]["decode_tok_s"])
    ax.axhline(58, color="gray", lw=1, ls="-.", label="ik_llama.cpp, all experts on CPU: 58 tok/s")
    ax.set_xlabel("GPU memory budget (GiB)")
    ax.set_ylabel("decode tok/s (prompt 512, %d generated)" % (pts[0]["gen"] if pts else 128))
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_title("Qwen3.5-35B-A3B GPTQ-Int4 (synthetic), %s" % a.machine, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(a.out_prefix + ".png")
    print("wrote", a.out_prefix + ".{json,table.md,png}")


if __name__ == "__main__":
    main()

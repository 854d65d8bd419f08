#!/usr/bin/env bash
# The end-to-end scenario on the GPU machine (issue: end-to-end benchmark). Synthesizes Qwen3.5-35B-A3B
# as GPTQ-Int4 with realistic routing skew, profiles its routing into a heat map, then runs
# `tandem bench` for: budget 8 GiB (every routed expert on the CPU), 12, 16 and 24 GiB (hybrid, hottest
# experts on the GPU) and everything on the GPU (--device gpu); one JSON per run in $OUT/e2e/, then
# bench/e2e_report.py writes the table, JSON and plot.
# usage: [WARMUP=tokens] bench/run_e2e.sh BUILD_DIR|TANDEM_BINARY_DIR [MODEL_DIR] [PROMPT_LENS] [GEN] [REPEAT] [SCENARIOS]
set -uo pipefail
build="${1:-build}"
model="${2:-/tmp/qwen35-35b-a3b-gptq}"
lens="${3:-512,4096}"
gen="${4:-128}"
repeat="${5:-3}"
scenarios="${6:-gpu-all hybrid-24gib hybrid-16gib hybrid-12gib hybrid-8gib-cpu-experts}"
# hybrid-8gib-cpu-experts-linkN: experts.link (PCIE_BW / HOST_MEMORY_BW: the plan's bandwidth lines)
# BENCH_FLAGS: extra `tandem bench` flags for every run (e.g. --eager)
out="${OUT:-$PWD/e2e-out}/e2e"
mkdir -p "$out"
tandem="$build/tandem"

if [ ! -f "$model/config.json" ]; then
  echo "== synth qwen3.5-35b-a3b gptq-int4 -> $model"
  "$tandem" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out "$model" 2>&1 | tail -14 | tee "$out/synth.txt"
fi
"$tandem" info --model "$model" > "$out/info.txt" 2>&1

heat="$out/heat.yaml"
python3 - "$out/prompts.txt" <<'PY'
import random, sys
random.seed(0)
words = "the model routes every token to eight of two hundred fifty six experts while the GPU keeps the hot ones".split()
with open(sys.argv[1], "w") as f:
    for _ in range(8):
        f.write(" ".join(random.choice(words) for _ in range(160)) + "\n")
PY
if [ ! -f "$heat" ]; then
  echo "== profile routing -> heat.yaml"
  timeout "${PROFILE_TIMEOUT:-240}" "$tandem" profile --model "$model" --prompts "$out/prompts.txt" --out "$heat" --device cpu \
    --max-tokens 256 2>/dev/null | tee "$out/profile.txt"
fi

config() {  # name budget extra-yaml (the heat map when profiling produced one)
  local heat_line="" prefill=""
  # NO_HEAT=1: plan without the heat map (uniform expert selection)
  [ -f "$heat" ] && [ -z "${NO_HEAT:-}" ] && heat_line="  heat: $heat"
  # PREFILL_CHUNK=N / PREFILL_STRATEGY=auto|cpu|gpu_stream: the hybrid configs' prefill section
  [ -n "${PREFILL_CHUNK:-}${PREFILL_STRATEGY:-}" ] && prefill="prefill:
${PREFILL_CHUNK:+  chunk: $PREFILL_CHUNK
}${PREFILL_STRATEGY:+  strategy: $PREFILL_STRATEGY
}"
  printf 'gpu:\n  memory: %s\n  reserve: 512MiB\ncontext: %s\nexperts:\n  select: frequency\n%s\n%s%s' "$2" "$ctx" "$heat_line" "$3" "$prefill" > "$out/$1.yaml"
}
longest=$(echo "$lens" | tr ',' '\n' | sort -n | tail -1)
ctx=$((longest + gen + 16))

run() {  # name, then bench flags
  local name="$1"; shift
  echo "== bench $name"
  local cfg=""
  [ -f "$out/$name.yaml" ] && cfg="--config $out/$name.yaml"
  [ "$name" = gpu-all ] && cfg="--gpu-mem 1000GiB"
  "$tandem" plan --model "$model" $cfg --json > "$out/$name.plan.json" 2>/dev/null || true
  # BENCH_PROMPTS=1: prompts from the profiling text (where the heat map's routing applies) instead of random ids
  # FOLLOW_TEXT=1 (with BENCH_PROMPTS): decode steps fed the text's next tokens (bench --follow-text);
  # ignored without BENCH_PROMPTS (random-id runs after a text run in one gpu_session.sh call)
  local follow=""
  [ -n "${BENCH_PROMPTS:-}" ] && [ -n "${FOLLOW_TEXT:-}" ] && follow="--follow-text"
  "$tandem" bench --model "$model" --prompt-len "$lens" --gen "$gen" --repeat "$repeat" --json ${WARMUP:+--warmup $WARMUP} \
    ${BENCH_PROMPTS:+--prompts "$out/prompts.txt"} $follow ${BENCH_FLAGS:-} "$@" \
    > "$out/$name.json" 2> "$out/$name.log"
  local rc=$?
  python3 - "$out/$name.json" <<'PY' || { echo "  failed (rc=$rc):"; tail -3 "$out/$name.log"; }
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["results"]:
    print("  prompt %5d: prefill %8.1f tok/s, decode %7.2f tok/s [%.2f-%.2f] (bound %.1f, %.0f%%), ttft %.0f ms, GPU share %.0f%%" % (
        r["prompt_len"], r["prefill_tok_s"], r["decode_tok_s"], r["decode_tok_s_min"], r["decode_tok_s_max"],
        r["bound_decode_tok_s"], 100 * r["decode_ratio_to_bound"], r["ttft_ms"], 100 * r["gpu_expert_fraction"]))
print("  peak VRAM %.2f GB, peak host %.2f GB" % (j["peak_vram_bytes"] / 1e9, j["peak_host_bytes"] / 1e9))
PY
}

for s in $scenarios; do
  case "$s" in
    gpu-all) run gpu-all --device gpu --context "$ctx" ;;
    hybrid-8gib-cpu-experts) config "$s" 8GiB 'cpu_experts: all
'; run "$s" --device hybrid --config "$out/$s.yaml" ;;
    hybrid-8gib-cpu-experts-link*)  # experts.link: link3 = 3 read in place
      config "$s" 8GiB "  link: ${s##*link}
cpu_experts: all
${PCIE_BW:+bandwidth:
  pcie: $PCIE_BW
${HOST_MEMORY_BW:+  host_memory: $HOST_MEMORY_BW
}}"; run "$s" --device hybrid --config "$out/$s.yaml" ;;
    hybrid-8gib-defer*) config "$s" 8GiB "  deferral: ${s##*defer}
cpu_experts: all
"; run "$s" --device hybrid --config "$out/$s.yaml" ;;
    hybrid-*gib-defer*) b=${s#hybrid-}; b=${b%gib-defer*}; config "$s" "${b}GiB" "  deferral: ${s##*defer}
"; run "$s" --device hybrid --config "$out/$s.yaml" ;;
    hybrid-*gib) b=${s#hybrid-}; b=${b%gib}; config "$s" "${b}GiB" ''; run "$s" --device hybrid --config "$out/$s.yaml" ;;
    cpu-all) run cpu-all --device cpu ;;
    *) echo "unknown scenario $s" ;;
  esac
done

echo "== report"
python3 "$(dirname "$0")/e2e_report.py" "$out" "$out/report" --machine "$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU) | head -1) + $(nproc)-thread CPU" \
  --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" --date "$(date -u +%F)" --tandem "$tandem" --model "$model" \
  && cat "$out/report.table.md"

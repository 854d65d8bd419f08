#!/usr/bin/env bash
# The end-to-end scenario on the GPU machine: synthesize Qwen3.5-35B-A3B as GPTQ-Int4 with realistic
# routing skew, then `tandem bench` each placement that exists in this version, writing one JSON per
# run to $OUT/e2e/. usage: bench/run_e2e.sh BUILD_DIR [MODEL_DIR] [PROMPT_LENS] [GEN] [REPEAT]
set -uo pipefail
build="${1:-build}"
model="${2:-/tmp/qwen35-35b-a3b-gptq}"
lens="${3:-512}"
gen="${4:-64}"
repeat="${5:-3}"
out="${OUT:-$PWD/e2e-out}/e2e"
mkdir -p "$out"
tandem="$build/tandem"

if [ ! -f "$model/config.json" ]; then
  echo "== synth qwen3.5-35b-a3b gptq-int4 -> $model"
  "$tandem" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out "$model" 2>&1 | tail -12 | tee "$out/synth.txt"
fi
"$tandem" info --model "$model" | tee "$out/info.txt"

run() {  # name, then bench flags
  local name="$1"; shift
  echo "== bench $name"
  "$tandem" bench --model "$model" --prompt-len "$lens" --gen "$gen" --repeat "$repeat" --json "$@" \
    > "$out/$name.json" 2> "$out/$name.log"
  local rc=$?
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('  prefill %.1f tok/s, decode %.2f tok/s (bound %.1f), ttft %.0f ms, peak vram %.2f GB' % (j['prefill_tok_s'], j['decode_tok_s'], j['bound_decode_tok_s'], j['ttft_ms'], j['peak_vram_bytes']/1e9))" "$out/$name.json" 2>/dev/null \
    || { echo "  failed (rc=$rc):"; tail -3 "$out/$name.log"; }
}
run gpu-all --device gpu --context 4096
run cpu-all --device cpu

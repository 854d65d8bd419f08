#!/usr/bin/env bash
# `make demo`: the main job on the embedded default model. Until text generation lands this runs the
# exact reference forward over a committed HF fixture and checks it against transformers' logits.
set -euo pipefail
build="${1:-build}"
root="$(cd "$(dirname "$0")/.." && pwd)"
model="$root/tests/data/bf16_fused"
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$model/reference.json")
prefill=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prefill'])" "$model/reference.json")

"$root/$build/tandem" info --model "$model"
echo
"$root/$build/tandem" logits --model "$model" --ids "$ids" --prefill "$prefill" \
  --out "$root/$build/demo_logits.npy" --compare "$model/logits.npy" --tol 1e-4

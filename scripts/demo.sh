#!/usr/bin/env bash
# `make demo`: the main job on the embedded default model. Synthesizes the tiny Qwen3.5-MoE model once
# (cached in the build folder), then runs one chat turn with the answer streamed and the stats line.
set -euo pipefail
build="${1:-build}"
root="$(cd "$(dirname "$0")/.." && pwd)"
tandem="$root/$build/tandem"
model="$root/$build/models/tiny"

if [ ! -f "$model/config.json" ]; then
  "$tandem" synth --preset tiny --out "$model"
  echo
fi
"$tandem" info --model "$model"
echo
prompt="Write two sentences about the sea."
echo "> $prompt"
"$tandem" generate --model "$model" --chat --prompt "$prompt" --max-new-tokens 64 --temperature 0 --device cpu
echo "(the tiny model has random weights: the text is noise, but every step is the real pipeline:"
echo " tokenizer, chat template, MoE forward on the CPU kernels, greedy sampling, streaming)"

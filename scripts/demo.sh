#!/usr/bin/env bash
# `make demo`: the main job on the embedded default model, models/demo (tools/train_demo.py: a small
# Qwen3.5-MoE trained with its MTP head on the Python standard library's sources, 5 MB, in the repo:
# no network). One chat turn streamed, greedy, with the head drafting 2 tokens a step, and the stats
# line (prefill and decode speed, the drafts' acceptance by position).
set -euo pipefail
build="${1:-build}"
root="$(cd "$(dirname "$0")/.." && pwd)"
tandem="$root/$build/tandem"
model="$root/models/demo"

"$tandem" info --model "$model"
echo
prompt="Write some Python."
echo "> $prompt"
"$tandem" generate --model "$model" --chat --prompt "$prompt" --max-new-tokens 160 --temperature 0 --device cpu --draft 2
echo "(the demo model has 2 M parameters trained for 4 minutes: it writes the standard library's kind of"
echo " Python, not answers; every step is the real pipeline: tokenizer, chat template, the MoE forward on"
echo " the CPU kernels, the MTP head's drafts verified in one step, greedy sampling, streaming)"

#!/usr/bin/env bash
# Speculative decoding on the GPU machine in one call that always brings its results back
# ($OUT/results.tgz, packed after every step, and $OUT/summary.txt):
#   build      tandem + tandem_gpu_tests into ../build-gpu-mtp (outside the carried tree: it survives
#              between calls while the machine stays warm)
#   tests      tandem_gpu_tests --gtest_filter=$TESTS (default: the MTP, speculative, batch and model suites)
#   demo       the demo model (models/demo): decode with and without drafts on gpu and cpu, prompts from
#              Python sources (json/decoder.py + textwrap.py of the machine's Python)
#   verify     the 35B synthetic GPTQ-Int4: tandem bench --verify-cost 1,2,3,4 for each of $PLACEMENTS
#              (gpu, or a budget such as 24GiB / 12GiB; 8GiB runs every routed expert on the CPU), with
#              --draft 4 (the drafts' cost) and without (a plain runner: its decode step is the decode
#              graph), then decode with --draft auto and without (random weights: auto should settle on 0);
#              a budget with the suffix -headcpu (e.g. 12GiB-headcpu) puts the head's experts in host
#              memory (speculative.head_experts: cpu)
# usage (device tool, carry .deps and .snap): cd .snap && DEADLINE=560 STEPS="build tests demo verify" bash scripts/gpu_mtp.sh
set -uo pipefail
DEADLINE="${DEADLINE:-560}"
STEPS="${STEPS:-build tests demo verify}"
TESTS="${TESTS:-*Mtp*:*Speculative*:GpuBatch*:GpuModel*}"
PLACEMENTS="${PLACEMENTS:-gpu 24GiB 12GiB 8GiB}"
build=../build-gpu-mtp
name=gpu-mtp
source "$(dirname "$0")/gpu_steps.sh"
tandem="$build/tandem"
py=$(python3 -c 'import json, textwrap; print(json.decoder.__file__, textwrap.__file__)')
cat $py > "$res/pytext.txt"

for s in $STEPS; do
  case "$s" in
    build)
      build_step tandem tandem_gpu_tests ;;
    tests)
      step gpu-tests 240 "$build/tests/tandem_gpu_tests" --gtest_filter="$TESTS" ;;
    demo)
      for dev in gpu cpu; do
        for d in 0 2 3 auto; do
          step "demo-$dev-draft$d" 60 "$tandem" bench --model models/demo --device "$dev" --prompts "$res/pytext.txt" --prompt-len 64 \
            --gen 256 --repeat 5 --draft "$d" --json
        done
      done ;;
    verify)
      [ -f /tmp/q35/config.json ] || step synth 150 "$tandem" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out /tmp/q35
      for p in $PLACEMENTS; do
        if [ "$p" = gpu ]; then
          place="--device gpu --gpu-mem 1000GiB --context 1280"
        else
          extra="" head="" budget="${p%-headcpu}"
          [ "$budget" = 8GiB ] && extra="cpu_experts: all"
          [ "$p" != "$budget" ] && head="  head_experts: cpu"
          printf 'gpu:\n  memory: %s\n  reserve: 512MiB\ncontext: 1280\nspeculative:\n  draft: 4\n%s\n%s\n' "$budget" "$head" "$extra" > "$res/$p.yaml"
          printf 'gpu:\n  memory: %s\n  reserve: 512MiB\ncontext: 1280\n%s\n' "$budget" "$extra" > "$res/$p-plain.yaml"
          place="--device hybrid --config $res/$p.yaml"
        fi
        plain="$place"
        [ "$p" != gpu ] && plain="--device hybrid --config $res/$p-plain.yaml"
        step "verify-$p" 120 "$tandem" bench --model /tmp/q35 $place --prompt-len 1024 --gen 16 --repeat 3 --verify-cost 1,2,3,4 --draft 4 --json
        step "verify-$p-plain" 120 "$tandem" bench --model /tmp/q35 $plain --prompt-len 1024 --gen 16 --repeat 3 --verify-cost 1,2,3,4 --json
        if [ "$p" = gpu ] || [ "$p" = 12GiB ]; then
          step "auto-$p" 120 "$tandem" bench --model /tmp/q35 $place --prompt-len 1024 --gen 96 --repeat 3 --draft auto --json
          step "plain-$p" 120 "$tandem" bench --model /tmp/q35 $plain --prompt-len 1024 --gen 96 --repeat 3 --json
        fi
      done ;;
  esac
done
cat "$res/summary.txt"
pack

#!/usr/bin/env bash
# The consumer card's bytes (dense weights and experts quantized on load) on the GPU machine, in one call
# that always brings its results back ($OUT/results.tgz, packed after every step, and $OUT/summary.txt):
#   build      tandem + tandem_gpu_tests into ../build-gpu-quant (outside the carried tree)
#   tests      tandem_gpu_tests --gtest_filter=$TESTS (default: the int8 GEMV and dense model, experts
#              quantized on load, the whole model and the MTP head suites)
#   gemv       bench_gpu_gemv: the 8-bit rows' GEMV against bf16 at 1, 2 and 8 tokens
#   dense      the 35B synthetic GPTQ-Int4: decode at a 4096-token context with the dense projections as ($FORMATS)
#              stored, as int8 rows, int8 with the lm_head too, and fp8 rows, for each of $PLACEMENTS (a budget:
#              24GiB holds every routed expert; 8GiB runs them all on the CPU), each run's plan beside it;
#              then `tandem plan` at 24 GiB for a 131072-token context with int8 dense weights, and the prompt
#              GEMM of 8-bit rows against bf16 alone (bench_gpu_gemv BM_gemm_bf16 / BM_gemm_rows8)
#   head       the same model drafting at 12 GiB with its MTP head's 256 BF16 experts as stored and as
#              int4 on load (experts.gpu_format: int4): the plan's GPU experts, --verify-cost 1,2,3,4
#   kv         the same model at 24 GiB decoding after a 32768-token prompt with the KV cache as bf16,
#              int8 and fp8 (kv_cache.format), and the attention decode kernel alone per format
#              (bench_gpu_gemv BM_attention_decode: 512 / 4096 / 32768 cached rows)
#   hdraft     the same model drafting on each of $PLACEMENTS (8GiB: every routed expert on the CPU) with the
#              drafts' int8 lm_head copy: --verify-cost 1,2,3,4
#   draft      the same model all on the GPU: tandem bench --verify-cost 1,2,3,4 --draft 4 with the drafts
#              reading the lm_head as stored and their own int8 copy (--draft-lm-head int8)
#   trace      the same model all on the GPU decoding $TBATCH (default 8) sequences at once (prompts of 1024)
#              with --trace: each layer's segments (mixer, router, experts + shared expert) as GPU spans in the
#              batched steps, per step and per layer (eager launches: the graph's kernels one by one)
#   kernels    the same model all on the GPU under ncu: each kernel's time in a decode step, the step that
#              verifies $VK (default 3) drafts and a step of $TBATCH sequences, side by side (kernel_steps.py)
#   batch      the same model decoding $BATCHES sequences at once (prompts of 4096) for each of $BPLACEMENTS
#              (default 12GiB 8GiB, the latter every routed expert on the CPU; gpu: all on the GPU): tandem bench --batch
# usage (device tool, carry .deps): DEADLINE=560 STEPS="build tests dense head kv" bash scripts/gpu_quant.sh
#   (TANDEM_MAX_SM=89 in front: the RTX 4090 code path)
set -uo pipefail
DEADLINE="${DEADLINE:-560}"
STEPS="${STEPS:-build tests dense head}"
TESTS="${TESTS:-*GemvRows8*:*GemmRows8*:*DenseRows8*:*Int4OnLoad*:GpuModel*:GpuMtpHead*:*GpuAttention*:*GpuKvCache*}"
PLACEMENTS="${PLACEMENTS:-24GiB 12GiB 8GiB}"
build="${BUILD:-../build-gpu-quant}"  # BUILD: a build folder a call before left (build-ab-new from gpu_ab.sh)
name=gpu-quant
source "$(dirname "$0")/gpu_steps.sh"
tandem="$build/tandem"
model=/tmp/q35

brief() {  # step-name: the bench JSON in its log, in one line of summary.txt (in case results.tgz does not come back)
  python3 - "$res/$1.log" "$1" >> "$res/summary.txt" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try: j, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
except Exception as e: print("%s: no JSON (%s)" % (sys.argv[2], e)); sys.exit()
if "verify" in j:
    print("%s: decode %.3f ms; k, verify ms, draft ms, speed-up at 0.6 / 0.8 / 0.9: %s" % (sys.argv[2], j["decode_ms"], "; ".join(
        "%d %.3f %s %.2f/%.2f/%.2f" % (r["drafts"], r["verify_ms"], "-" if r["draft_ms"] is None else "%.3f" % r["draft_ms"], r["speedup_at_acceptance"]["0.6"],
        r["speedup_at_acceptance"]["0.8"], r["speedup_at_acceptance"]["0.9"]) for r in j["verify"])))
elif "batches" in j:
    print("%s: %s" % (sys.argv[2], "; ".join("B=%d %.1f tok/s (%.2fx, %.0f%% of %.1f)" % (r["batch"], r["decode_tok_s"], r["vs_batch_1"],
        100 * r["decode_ratio_to_bound"], r["bound_decode_tok_s"]) for r in j["batches"])))
else:
    r = j["results"][0]
    print("%s: decode %.1f tok/s (p50 %.2f ms, %.0f%% of bound %.1f), prefill %.0f tok/s, active %.2f GB/token, GPU experts %.2f, peak VRAM %.2f GiB" % (
        sys.argv[2], j["decode_tok_s"], r["itl_p50_ms"], 100 * r["decode_ratio_to_bound"], r["bound_decode_tok_s"], j["prefill_tok_s"],
        j["active_bytes_per_token"] / 1e9, j["gpu_expert_fraction"] or 0, j["peak_vram_bytes"] / 2**30))
PY
}

synth_once() {  # the synthetic 35B, written by the first step that needs it
  [ -f $model/config.json ] || step synth 150 "$tandem" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out $model
}

yaml() {  # file budget extra-lines (an 8GiB budget: every routed expert on the CPU)
  printf 'gpu:\n  memory: %s\n  reserve: 512MiB\ncontext: 4224\n%s\n%s\n' "$2" "$([ "$2" = 8GiB ] && echo 'cpu_experts: all')" "${3:-}" > "$1"
}

for s in $STEPS; do
  case "$s" in
    build)
      build_step tandem tandem_gpu_tests bench_gpu_gemv ;;
    tests)
      step gpu-tests "${TESTS_SECS:-240}" "$build/tests/tandem_gpu_tests" --gtest_filter="$TESTS" ;;
    gemv)
      step gemv 90 "$build/bench/bench_gpu_gemv" --benchmark_filter='BM_gemv_(bf16|rows8)'
      grep -E '^BM_' "$res/gemv.log" >> "$res/summary.txt" ;;
    dense)
      synth_once
      for p in $PLACEMENTS; do
        for f in ${FORMATS:-bf16 int8 int8-lm_head fp8}; do
          yaml "$res/$p-$f.yaml" "$p" "dense: {format: ${f%%-*}$([ "$f" = int8-lm_head ] && echo ', lm_head: int8')}"
          "$tandem" plan --model $model --config "$res/$p-$f.yaml" --no-measure > "$res/plan-$p-$f.txt" 2>&1
          step "dense-$p-$f" 100 "$tandem" bench --model $model --device hybrid --config "$res/$p-$f.yaml" --prompt-len 4096 --gen 64 --repeat 3 --json
          brief "dense-$p-$f"
        done
      done
      yaml "$res/24GiB-128k.yaml" 24GiB "dense: {format: int8, lm_head: int8}"
      step plan-128k 30 "$tandem" plan --model $model --config "$res/24GiB-128k.yaml" --context 131072 --no-measure
      step dense-gemm 90 "$build/bench/bench_gpu_gemv" --benchmark_filter='BM_gemm_(bf16|rows8)' ;;
    head)
      synth_once
      for e in auto int4; do
        yaml "$res/head-$e.yaml" 12GiB "speculative: {draft: 4}
experts: {gpu_format: $e}"
        "$tandem" plan --model $model --config "$res/head-$e.yaml" --no-measure > "$res/plan-head-$e.txt" 2>&1
        step "head-$e" 150 "$tandem" bench --model $model --device hybrid --config "$res/head-$e.yaml" --quant-cache /tmp/qcache \
          --prompt-len 1024 --gen 16 --repeat 3 --verify-cost 1,2,3,4 --draft 4 --json
      done ;;
    hdraft)
      synth_once
      for p in $PLACEMENTS; do
        yaml "$res/hdraft-$p.yaml" "$p" "speculative: {draft: 4, lm_head: int8}"
        "$tandem" plan --model $model --config "$res/hdraft-$p.yaml" --no-measure > "$res/plan-hdraft-$p.txt" 2>&1
        step "hdraft-$p" 100 "$tandem" bench --model $model --device hybrid --config "$res/hdraft-$p.yaml" \
          --prompt-len 1024 --gen 16 --repeat 3 --verify-cost 1,2,3,4 --draft 4 --json
        brief "hdraft-$p"
      done ;;
    draft)
      synth_once
      for h in bf16 int8; do
        step "draft-$h" 120 "$tandem" bench --model $model --device gpu --gpu-mem 1000GiB --context 1280 --prompt-len 1024 --gen 16 \
          --repeat 3 --verify-cost 1,2,3,4 --draft 4 $([ $h = int8 ] && echo --draft-lm-head int8) --json
        brief "draft-$h"
      done ;;
    trace)
      synth_once
      # (--trace feeds a prompt token by token, so the prompts are 1024 tokens, not 4096)
      step trace 150 "$tandem" bench --model $model --device gpu --gpu-mem 1000GiB --context 1152 --prompt-len 1024 --gen 16 --repeat 1 \
        --warmup 64 --batch "${TBATCH:-8}" --trace "$res/trace.json" --json
      python3 - "$res/trace.json" >> "$res/summary.txt" <<'PY'
import bisect, collections, json, re, sys
try: ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
except Exception as e: print("no trace: %s" % e); sys.exit()
steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["pid"] == 1 and e["name"] == "forward (batch)")
starts = [a for a, _ in steps]
def in_step(t):
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and t <= steps[i][1]
tot, cnt = collections.defaultdict(float), collections.defaultdict(int)
for e in ev:
    m = re.match(r"(.*\D) (\d+)$", e["name"])
    if e["pid"] == 2 and m and in_step(e["ts"] + e["dur"] / 2): tot[m.group(1)] += e["dur"]; cnt[m.group(1)] += 1
n = max(len(steps), 1)
print("trace, batched steps only (%d, eager): per step %.3f ms host; %s" % (len(steps), sum(b - a for a, b in steps) / n / 1e3, ", ".join(
    "%s %.3f ms (%.1f us a layer)" % (k, tot[k] / n / 1e3, tot[k] / cnt[k]) for k in sorted(tot))))
PY
      rm -f "$res/trace.json" ;;
    kernels)
      synth_once
      # ncu's time of every kernel (graph nodes one by one, caches and clocks left alone) in two short runs
      # all on the GPU: the prompt, then (warm-up and one measured) a decode step, k drafts, the verification
      # of k + 1 tokens, a rollback; and $TBATCH prompts, then one step of $TBATCH sequences
      # (the batched run profiles from near its last step on: each 8-token prompt launches $PROMPT_KERNELS
      # kernels, 2 x $TBATCH prompts before it, warm-up and measured; under ncu each takes ~20 ms)
      skip=$(( 2 * ${TBATCH:-8} * ${PROMPT_KERNELS:-1697} - 300 ))
      prof() {  # name ncu-options... -- bench-options...
        local what=$1 opts=(); shift
        while [ "$1" != -- ]; do opts+=("$1"); shift; done
        shift
        step "kernels-$what" 240 ncu --clock-control none --cache-control none --graph-profiling node "${opts[@]}" \
          --metrics gpu__time_duration.sum --csv --page raw --print-units base --log-file "$res/kernels-$what.csv" \
          "$tandem" bench --model $model --device gpu --gpu-mem 1000GiB --context 256 --prompt-len 8 --gen 2 --repeat 1 --json "$@"
      }
      prof verify -- --verify-cost "${VK:-3}" --draft 4
      prof batch --launch-skip "$skip" --launch-count 2000 -- --batch "${TBATCH:-8}"
      python3 scripts/kernel_steps.py "$res/kernels-verify.csv:-2:decode" "$res/kernels-verify.csv:-1:verify" \
        "$res/kernels-batch.csv:-1:batch" > "$res/kernels.txt" 2>&1
      head -c 6000 "$res/kernels.txt" >> "$res/summary.txt" ;;
    batch)
      synth_once
      for p in ${BPLACEMENTS:-12GiB 8GiB}; do
        yaml "$res/batch-$p.yaml" "$p"
        place="--device hybrid --config $res/batch-$p.yaml"
        [ "$p" = gpu ] && place="--device gpu --gpu-mem 1000GiB --context 4224"
        step "batch-$p" 200 "$tandem" bench --model $model $place --prompt-len 4096 --gen 32 --repeat 2 \
          --warmup 64 --batch "${BATCHES:-1,2,4,8}" --json
        brief "batch-$p"
      done ;;
    kv)
      synth_once
      for f in bf16 int8 fp8; do
        printf 'gpu:\n  memory: 24GiB\n  reserve: 512MiB\ncontext: 33024\nkv_cache: {format: %s}\n' "$f" > "$res/kv-$f.yaml"
        "$tandem" plan --model $model --config "$res/kv-$f.yaml" --no-measure > "$res/plan-kv-$f.txt" 2>&1
        step "kv-$f" 120 "$tandem" bench --model $model --device hybrid --config "$res/kv-$f.yaml" --prompt-len 32768 --gen 64 --repeat 3 --json
      done
      step kv-kernel 90 "$build/bench/bench_gpu_gemv" --benchmark_filter=BM_attention_decode ;;
  esac
done
cat "$res/summary.txt"
pack

#!/usr/bin/env bash
# A/B of two source trees on the GPU machine, in one device call (issue 24: a refactoring must give the
# same logits bit for bit and the same speed): builds the old tree ($OLD, e.g. `git archive BASE`
# unpacked into .base/) and this one side by side, then runs the steps asked for, old and new
# interleaved, and writes a summary to $OUT/summary.md (the logs and each run's JSON: $OUT/results.tgz).
#
# usage (device tool, carry [".deps", ".base"]): OLD=.base DEADLINE=560 bash scripts/gpu_ab.sh STEP...
#   (VTREES="new": the verify step runs the new tree only; every bench step configures a context of $CTX,
#   default $PLEN + $GEN + 16)
#   ab       scripts/ab_logits.sh on every HF fixture: --device gpu, hybrid, hybrid with every expert on the CPU
#   tests    the new tree's GPU suite (tandem_gpu_tests, --gtest_filter=$TESTS when set) and the CLI tests
#            (a change that lands runs the whole suite, TESTS unset: ~145 s on the H100; stop 54 found a
#            failure on main that the filtered runs before had not reached)
#   e2e      the synthetic 35B GPTQ model (synthesized once, to /tmp/q35), `tandem bench` (prompt $PLEN, $GEN
#            tokens, $REPEAT repeats) for each of $SCENARIOS, old then new
#            (gpu-all, hybrid-24gib, hybrid-12gib, hybrid-8gib, hybrid-8gib-link3; also gpu-int8: 24 GiB holding
#            every routed expert with int8 dense weights and lm_head, issue 28's case; gpu-int8-sh16: the same
#            with the shared experts kept bf16)
#   batch    `tandem bench --batch $BATCHES` on the synthetic 35B for each of $BSCENARIOS (default gpu-all
#            hybrid-24gib hybrid-8gib), old and new (old first in the first scenario, new first in the
#            next, and so on): aggregate decode at each batch size, ITL, bound
#   verify   `tandem bench --verify-cost 1,2,3,4` after a 1024-token prompt, all on the GPU, old then new
#            (with --draft 4 when $VDRAFT is set; with $VLM_HEAD, the drafts' lm_head copy speculative.lm_head,
#            a YAML key: --device hybrid with a $VMEM budget, default 64GiB, that holds every expert): the
#            verification step, drafts and rollback against decode
#   kbench   the kernel benchmarks (bench_gpu_gemv) matching $KFILTER: old, new, old, new
#   ncu      Nsight Compute on the new tree's bench_gpu_gemv ($KFILTER), kernels matching $NCU_KERNELS
#            (a regex), $NCU_COUNT launches after 20: duration, issue slots, L1 / DRAM / SM throughput,
#            registers, warps an SM and the four largest warp-stall reasons per kernel (the raw report:
#            $OUT/ncu.txt)
#   timeline where the new tree's decode step spends its time, kernel by kernel as the graph runs (CUPTI,
#            bench/dev/kernel_timeline.cpp injected; the machine has no nsys): `tandem bench --batch B`
#            for each B of $TBATCHES (default "1 8"), $TSCENARIO (default gpu-all); each kernel's calls,
#            duration and the time it adds to the step (bench/dev/kernel_timeline.py)
set -uo pipefail
OUT="${OUT:-$PWD/gpu-ab-out}"
mkdir -p "$OUT"
old="${OLD:-.base}"
deadline="${DEADLINE:-560}"
t0=$(date +%s)
left() { echo $((deadline - ($(date +%s) - t0))); }
summary="$OUT/summary.md"
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
{ echo "# A/B on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) CPU threads, $(date -u +%F)"; echo; } > "$summary"

steps=" $* "
new_targets=tandem
[[ "$steps" == *" tests "* ]] && new_targets="$new_targets tandem_gpu_tests"
[[ "$steps" == *" kbench "* || "$steps" == *" ncu "* ]] && new_targets="$new_targets bench_gpu_gemv"
build() {  # src dir targets...
  local src="$1" dir="$2"; shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build "$dir" -j "$(nproc)" --target "$@"
}
old_targets=""
[[ "$steps" == *" ab "* || "$steps" == *" e2e "* || "$steps" == *" batch "* || "$steps" == *" verify "* ]] && old_targets=tandem  # the steps that run the old tree
[[ "$steps" == *" kbench "* ]] && old_targets="$old_targets bench_gpu_gemv"
b0=$(date +%s)
if [ -n "$old_targets" ]; then
  (build "$old" build-ab-old $old_targets > "$OUT/build-old.log" 2>&1; echo $? > "$OUT/build-old.rc") &
else
  echo 0 > "$OUT/build-old.rc"
fi
(build . build-ab-new $new_targets > "$OUT/build-new.log" 2>&1; echo $? > "$OUT/build-new.rc") &
wait
echo "builds: old rc $(cat "$OUT/build-old.rc"), new rc $(cat "$OUT/build-new.rc") in $(( $(date +%s) - b0 )) s" | tee -a "$summary"
[ "$(cat "$OUT/build-old.rc")" = 0 ] && [ "$(cat "$OUT/build-new.rc")" = 0 ] || { tail -30 "$OUT"/build-*.log; exit 1; }
OLD_T=build-ab-old/tandem NEW_T=build-ab-new/tandem here=$PWD

if [[ "$steps" == *" ab "* ]]; then
  echo "## Logits, bit for bit (scripts/ab_logits.sh)" >> "$summary"
  timeout "$(left)" bash scripts/ab_logits.sh "$OLD_T" "$NEW_T" "gpu hybrid hybrid-cpu" /tmp/ab > "$OUT/ab_logits.txt" 2>&1
  echo "rc $?: $(tail -1 "$OUT/ab_logits.txt")" | tee -a "$summary"
  grep -E '^DIFFER|exited' "$OUT/ab_logits.txt" | head -20 | tee -a "$summary"
  echo >> "$summary"
fi

if [[ "$steps" == *" tests "* ]]; then
  echo "## New tree: GPU suite and CLI tests" >> "$summary"
  timeout "$(left)" build-ab-new/tests/tandem_gpu_tests --gtest_filter="${TESTS:-*}" > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc $?: $(grep -E '^\[  PASSED|tests ran' "$OUT/gpu-tests.log" | tr '\n' ' ')" | tee -a "$summary"
  grep '^\[  FAILED  \]' "$OUT/gpu-tests.log" | head -20 | tee -a "$summary"
  timeout "$(left)" bash tests/cli/test_cli.sh "$NEW_T" tests/data > "$OUT/cli.log" 2>&1
  echo "cli rc $?: $(tail -1 "$OUT/cli.log")" | tee -a "$summary"
  echo >> "$summary"
fi

m=/tmp/q35
plen="${PLEN:-4096}" gen="${GEN:-64}" repeat="${REPEAT:-2}"
ctx="${CTX:-$((plen + gen + 16))}"  # the configured context (KV cache rows a sequence); CTX: a longer one
prepare_35b() {  # the synthetic model and the scenarios' placements
  s0=$(date +%s)
  [ -f $m/config.json ] || timeout "$(left)" "$NEW_T" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out $m > "$OUT/synth.txt" 2>&1
  echo "synth: $(tail -1 "$OUT/synth.txt" 2>/dev/null) ($(( $(date +%s) - s0 )) s)" >> "$OUT/e2e.log"
  mkdir -p "$OUT/e2e"
  yaml() {  # name budget extra
    printf 'gpu:\n  memory: %s\n  reserve: 512MiB\ncontext: %s\n%s' "$2" "$ctx" "$3" > "$OUT/e2e/$1.yaml"
  }
  yaml hybrid-24gib 24GiB $'experts:\n  select: frequency\n'
  yaml hybrid-12gib 12GiB $'experts:\n  select: frequency\n'
  yaml hybrid-8gib 8GiB $'cpu_experts: all\n'
  yaml hybrid-8gib-link3 8GiB $'cpu_experts: all\nexperts:\n  link:\n    in_place: 3\n'
  local int8=$'dense:\n  format: int8\n  lm_head: int8\n'
  yaml gpu-int8 24GiB "$int8"  # every routed expert fits: issue 28's int8 dense
  yaml gpu-int8-sh16 24GiB "$int8"$'rules:\n  - match: "layers.*.mlp.shared_expert"\n    format: bf16\n'
}
scenario_args() {  # scenario -> the bench's device flags
  if [ "$1" = gpu-all ]; then echo "--device gpu --gpu-mem 1000GiB --context $ctx"; else echo "--device hybrid --config $OUT/e2e/$1.yaml"; fi
}

if [[ "$steps" == *" batch "* ]]; then
  prepare_35b
  batches="${BATCHES:-1,2,4,8}"
  echo "## Batched decode: prompt $plen, $gen tokens a sequence, $repeat repeats, batch $batches (synthetic 35B GPTQ-Int4), old and new in turn" >> "$summary"
  echo "| scenario | tree | batch | aggregate tok/s [min-max] | per sequence | ITL p50 / p99 ms | vs B=1 | bound tok/s | of bound |" >> "$summary"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$summary"
  order="old new"  # which tree runs first alternates by scenario: the second run of a pair has read ~1% low (stop 65)
  for s in ${BSCENARIOS:-gpu-all hybrid-24gib hybrid-8gib}; do
    for which in $order; do
      t=$OLD_T; [ $which = new ] && t=$NEW_T
      [ "$(left)" -gt 40 ] || { echo "batch $s $which: no time left" >> "$OUT/e2e.log"; continue; }
      timeout "$(left)" "$t" bench --model $m --prompt-len "$plen" --gen "$gen" --repeat "$repeat" --batch "$batches" --warmup "${WARMUP:-64}" --json $(scenario_args "$s") \
        > "$OUT/e2e/$s.batch.$which.json" 2> "$OUT/e2e/$s.batch.$which.log"
      echo "batch $s $which rc $?" >> "$OUT/e2e.log"
      python3 - "$OUT/e2e/$s.batch.$which.json" "$s" "$which" >> "$summary" <<'PY'
import json, sys
try: rows = json.load(open(sys.argv[1]))["batches"]
except Exception as e: print("| %s | %s | failed: %s |" % (sys.argv[2], sys.argv[3], e)); sys.exit()
for r in rows:
    print("| %s | %s | %d | %.1f [%.1f-%.1f] | %.1f | %.2f / %.2f | %.2fx | %.1f | %.0f%% |" % (sys.argv[2], sys.argv[3], r["batch"], r["decode_tok_s"],
          r["decode_tok_s_min"], r["decode_tok_s_max"], r["per_sequence_tok_s"], r["itl_p50_ms"], r["itl_p99_ms"], r["vs_batch_1"],
          r["bound_decode_tok_s"], 100 * r["decode_ratio_to_bound"]))
PY
    done
    [ "$order" = "old new" ] && order="new old" || order="old new"
  done
  echo >> "$summary"
fi

if [[ "$steps" == *" verify "* ]]; then
  prepare_35b
  vplace="--device gpu --gpu-mem 1000GiB --context 1280"
  if [ -n "${VLM_HEAD:-}" ]; then  # a YAML key, so the hybrid device with a budget that holds every expert
    printf 'gpu:\n  memory: %s\ncontext: 1280\nspeculative:\n  lm_head: %s\n' "${VMEM:-64GiB}" "$VLM_HEAD" > "$OUT/e2e/verify.yaml"
    vplace="--device hybrid --config $OUT/e2e/verify.yaml"
  fi
  echo "## Verification cost: prompt 1024, all on the GPU$([ -n "${VDRAFT:-}" ] && echo ', drafting with the MTP head')${VLM_HEAD:+, draft lm_head $VLM_HEAD}, old then new" >> "$summary"
  echo "| tree | decode ms | k | verify ms | draft ms | rollback ms | speed-up at 0.6 / 0.8 / 0.9 |" >> "$summary"
  echo "|---|---|---|---|---|---|---|" >> "$summary"
  for which in ${VTREES:-old new}; do
    t=$OLD_T; [ $which = new ] && t=$NEW_T
    [ "$(left)" -gt 30 ] || { echo "verify $which: no time left" >> "$OUT/e2e.log"; continue; }
    timeout "$(left)" "$t" bench --model $m $vplace --prompt-len 1024 --gen 16 --repeat 3 \
      --verify-cost 1,2,3,4 ${VDRAFT:+--draft 4} --json > "$OUT/e2e/verify.$which.json" 2> "$OUT/e2e/verify.$which.log"
    python3 - "$OUT/e2e/verify.$which.json" "$which" >> "$summary" <<'PY'
import json, sys
try: rows = json.load(open(sys.argv[1]))["verify"]
except Exception as e: print("| %s | failed: %s |" % (sys.argv[2], e)); sys.exit()
for r in rows:
    s = r["speedup_at_acceptance"]
    d = "n/a" if r["draft_ms"] is None else "%.3f" % r["draft_ms"]
    print("| %s | %.3f | %d | %.3f | %s | %.3f | %.2fx / %.2fx / %.2fx |" % (sys.argv[2], r["decode_ms"], r["drafts"], r["verify_ms"], d,
          r.get("rollback_ms", float("nan")), s["0.6"], s["0.8"], s["0.9"]))  # trees before cf84f1e: no rollback column
PY
  done
  echo >> "$summary"
fi

if [[ "$steps" == *" kbench "* ]]; then
  echo "## Kernel benchmarks (bench_gpu_gemv, filter ${KFILTER:-all}): old, new, old, new" >> "$summary"
  echo '```' >> "$summary"
  for run in old new old new; do
    timeout "$(left)" build-ab-$run/bench/bench_gpu_gemv --benchmark_filter="${KFILTER:-.}" > "$OUT/kbench-$run.txt" 2>&1
    grep -E '^BM_' "$OUT/kbench-$run.txt" | sed "s/^/$run /" >> "$summary"
  done
  echo '```' >> "$summary"; echo >> "$summary"
fi

if [[ "$steps" == *" ncu "* ]]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  echo "## Nsight Compute: bench_gpu_gemv ${KFILTER:-.}, kernels ${NCU_KERNELS:-.} (ncu: ${ncu:-not found})" >> "$summary"
  if [ -n "$ncu" ]; then
    timeout "$(left)" "$ncu" --kernel-name "regex:${NCU_KERNELS:-.}" --launch-skip 20 --launch-count "${NCU_COUNT:-2}" --section SpeedOfLight \
      --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      build-ab-new/bench/bench_gpu_gemv --benchmark_filter="${KFILTER:-.}" > "$OUT/ncu.txt" 2>&1
    python3 - "$OUT/ncu.txt" >> "$summary" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
keys = [("Duration", "us"), ("Issued Warp Per Scheduler", "issue"), ("L1/TEX Cache Throughput", "L1 %"), ("DRAM Throughput", "DRAM %"),
        ("Compute (SM) Throughput", "SM %"), ("Registers Per Thread", "regs"), ("Achieved Active Warps Per SM", "warps/SM")]
print("| kernel | " + " | ".join(k[1] for k in keys) + " | top stalls (warp cycles an issued instruction) |"); print("|---" * (len(keys) + 2) + "|")
for block in re.split(r"\n  (?=\S)", text)[1:]:
    name = block.split("(")[0].split("::")[-1].strip()[:60]
    vals = []
    for k, _ in keys:
        m = re.search(re.escape(k) + r"\s+\S*\s+([\d.,]+)", block)
        vals.append(m.group(1) if m else "?")
    stalls = sorted(((float(v.replace(",", "")), r) for r, v in
                     re.findall(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S+\s+([\d.,]+)", block)), reverse=True)
    top = ", ".join("%s %.2f" % (r, v) for v, r in stalls[:4]) or "?"
    if any(v != "?" for v in vals): print("| %s | %s | %s |" % (name, " | ".join(vals), top))
PY
  fi
  echo >> "$summary"
fi

if [[ "$steps" == *" timeline "* ]]; then
  prepare_35b
  cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
  cupti_lib=$(dirname "$(find "$cuda/" "$cuda/extras/CUPTI/" -name 'libcupti.so' 2>/dev/null | head -1)")
  rm -f /tmp/libkernel_timeline.so  # a warm machine's earlier build is not this tree's
  g++ -std=c++20 -O2 -shared -fPIC bench/dev/kernel_timeline.cpp -I"$cuda/include" -I"$cuda/extras/CUPTI/include" -L"$cupti_lib" -lcupti \
    -Wl,-rpath,"$cupti_lib" -o /tmp/libkernel_timeline.so > "$OUT/timeline-build.log" 2>&1
  echo "## Decode step timeline (CUPTI, bench/dev/kernel_timeline.cpp): \`tandem bench --batch B\`, ${TSCENARIO:-gpu-all}, new tree" >> "$summary"
  if [ ! -f /tmp/libkernel_timeline.so ]; then
    echo "the injection library did not build: $(tail -3 "$OUT/timeline-build.log")" >> "$summary"
  fi
  for b in ${TBATCHES:-1 8}; do
    [ -f /tmp/libkernel_timeline.so ] && [ "$(left)" -gt 40 ] || break
    mkdir -p "$OUT/timeline-$b"
    (cd "$OUT/timeline-$b" && CUDA_INJECTION64_PATH=/tmp/libkernel_timeline.so timeout "$(left)" "$here/$NEW_T" bench --model $m --prompt-len "$plen" \
      --gen "$gen" --repeat 1 --warmup 8 --batch "$b" $(scenario_args "${TSCENARIO:-gpu-all}") > bench.txt 2> bench.log)
    echo "### B = $b" >> "$summary"
    python3 bench/dev/kernel_timeline.py "$OUT/timeline-$b/kernel_timeline.csv" >> "$summary" 2>&1
    gzip -f "$OUT/timeline-$b/kernel_timeline.csv"
  done
  echo >> "$summary"
fi

if [[ "$steps" == *" e2e "* ]]; then
  scenarios="${SCENARIOS:-gpu-all hybrid-24gib hybrid-12gib hybrid-8gib hybrid-8gib-link3}"
  prepare_35b
  echo "## End to end: prompt $plen, $gen decode tokens, $repeat repeats (synthetic 35B GPTQ-Int4), old | new" >> "$summary"
  echo "| scenario | prefill tok/s old | new | decode tok/s old | new | new/old decode |" >> "$summary"
  echo "|---|---|---|---|---|---|" >> "$summary"
  for s in $scenarios; do
    for which in old new; do
      t=$OLD_T; [ $which = new ] && t=$NEW_T
      read -r -a args <<< "$(scenario_args "$s")"
      [ "$(left)" -gt 30 ] || { echo "$s $which: no time left" >> "$OUT/e2e.log"; continue; }
      timeout "$(left)" "$t" bench --model $m --prompt-len "$plen" --gen "$gen" --repeat "$repeat" --json "${args[@]}" \
        > "$OUT/e2e/$s.$which.json" 2> "$OUT/e2e/$s.$which.log"
      echo "$s $which rc $?" >> "$OUT/e2e.log"
    done
    python3 - "$OUT/e2e/$s.old.json" "$OUT/e2e/$s.new.json" "$s" >> "$summary" <<'PY'
import json, sys
def get(p):
    try: r = json.load(open(p))["results"][0]; return r["prefill_tok_s"], r["decode_tok_s"], r["decode_tok_s_min"], r["decode_tok_s_max"]
    except Exception: return None
o, n = get(sys.argv[1]), get(sys.argv[2])
f = lambda r, i: "-" if r is None else "%.1f" % r[i]
d = lambda r: "-" if r is None else "%.1f [%.1f-%.1f]" % (r[1], r[2], r[3])
ratio = "-" if o is None or n is None else "%.3f" % (n[1] / o[1])
print("| %s | %s | %s | %s | %s | %s |" % (sys.argv[3], f(o, 0), f(n, 0), d(o), d(n), ratio))
PY
  done
  echo >> "$summary"
fi
echo "total $(( $(date +%s) - t0 )) s" >> "$summary"
# The device tool brings back at most 8 files: everything but the summary goes into one archive.
(cd "$OUT" && tar czf /tmp/gpu-ab-results.tgz --exclude=summary.md . && find . -mindepth 1 ! -name summary.md -delete && mv /tmp/gpu-ab-results.tgz results.tgz)
cat "$summary"

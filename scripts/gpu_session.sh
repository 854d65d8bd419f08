#!/usr/bin/env bash
# One GPU-machine call that does the session's device work and always brings its results back: the
# device tool returns at most 8 files per call and nothing once the call is killed, so every step
# writes under one folder, each step has its own time limit inside an overall DEADLINE (seconds, keep
# it below the call's limit_s), and the folder is packed into $OUT/results.tgz at the end (and after
# each step, so a kill loses at most the step in flight).
#
# .deps: scripts/fetch_device_deps.sh fills it once per checkout (oneDNN, ICU: the machine lacks them).
# usage (device tool, carry .deps): COMMIT=<sha> DEADLINE=540 [HEAT=heat.yaml] bash scripts/gpu_session.sh STEP...
#   (write the sha itself into the command: $(git rev-parse HEAD) there reads the copy's .git, which can be stale)
#   build        configure + build everything into build-gpu/ (sm_90)
#   gpu-tests    the GPU suites (kernels, whole model, hybrid, CUDA graph) + the CLI tests
#   gpu-tests:FILTER  tandem_gpu_tests with --gtest_filter=FILTER (e.g. '-Shapes/GpuMoeInt4*': all but the
#                MoE kernel shapes, whose host-side fp64 references take 80-200 s there)
#   cli-tests    the CLI tests (with a GPU: the --device gpu ones too)
#   ctest        the whole CTest suite
#   cpu-experts  scripts/gpu_machine_cpu_experts.sh (AMX tests at every ISA cap + benchmarks)
#   cpu-tests    the cpu_experts tests at the CPU's best level (AMX there), no benchmarks
#   cpu-bench:FILTER  bench/bench_cpu_experts with --benchmark_filter=FILTER (e.g. 'decode'), JSON + console
#   handoff-bench[:FILTER]  bench/bench_handoff: the hybrid handoff's round trip (one graph vs event + copies), the
#                link's read rate (pcie rows) and the link experts' kernel (link rows)
#   gpu-bench[:FILTER]  bench/bench_gpu_gemv (per-kernel bandwidth at the 35B shapes), JSON + console
#   e2e:LENS:REPEAT:SCENARIOS  bench/run_e2e.sh, e.g. e2e:4096:3:hybrid-8gib-cpu-experts,hybrid-24gib
#                (scenarios: gpu-all hybrid-{8gib-cpu-experts,12gib,16gib,24gib} hybrid-{8,12}gib-defer{1..4}
#                 hybrid-8gib-cpu-experts-linkN cpu-all)
#   e2e-eager:LENS:REPEAT:SCENARIOS    the same with `tandem bench --eager` (every kernel launched eagerly, no CUDA graphs)
#   e2e-text:LENS:REPEAT:SCENARIOS     prompts from the profiling text instead of random ids (the heat map applies)
#   ncu[:PLEN]   Nsight Compute per-kernel durations (kernels serialised) of an all-GPU bench with a PLEN-token
#                prompt (default 1024) and 2 decode steps: ncu.txt
#   profile-batch:B  the same for step_rows' walk (B sequences a step: the batched decode, and the walk a
#                verification step of B - 1 drafts runs): profile-batchB.*
#   profile[:PLEN]  decode-step kernel times as they run (warm caches, graph nodes in place): Nsight Systems
#                when the machine has it (cuda_gpu_kern_sum of an all-GPU bench, PLEN-token prompt, 16
#                decode steps), else Nsight Compute with --cache-control none --clock-control none: profile-PLEN.txt
#   ncu-bench:FILTER:KERNEL_REGEX  Nsight Compute sections (speed of light, occupancy, warp stalls) of the
#                first 2 launches of the kernels matching KERNEL_REGEX in bench_gpu_gemv --benchmark_filter=FILTER
#   trace:GIB    a hybrid decode at that budget with --trace, and tools/trace_plot.py's picture of one step
#   env:VAR=VALUE  exported for the steps after it (GEN=N: tokens generated per e2e run, default 128; e.g. env:PREFILL_CHUNK=512);
#                their result names carry VALUE's variable as a suffix so A/B runs of one step do not overwrite each other
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
DEADLINE="${DEADLINE:-540}"
# Results live outside $OUT (only the archive and the summary come back: the tool returns at most 8 files).
res=/tmp/gpu-session/session
rm -rf "$res"; mkdir -p "$res"
t0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
pack() { tar czf "$OUT/results.tgz" -C /tmp/gpu-session session; cp "$res/summary.txt" "$OUT/" 2>/dev/null; }
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
{ date -u; echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null) (from the .git of the copy, which may be stale: pass COMMIT=)}"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$res/machine.txt" 2>&1

run_step() {  # name seconds command...
  local name="$1" secs="$2"; shift 2
  local budget; budget=$(left)
  [ "$secs" -gt "$budget" ] && secs=$budget
  if [ "$secs" -le 5 ]; then echo "== $name: skipped (no time left)" | tee -a "$res/summary.txt"; return; fi
  echo "== $name (limit ${secs}s)" | tee -a "$res/summary.txt"
  local s0; s0=$(date +%s)
  timeout "$secs" "$@" > "$res/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $(( $(date +%s) - s0 ))s" | tee -a "$res/summary.txt"
  tail -4 "$res/$name.log" | sed 's/^/   /' | tee -a "$res/summary.txt"
  pack
}

tag=""
for step in "$@"; do
  case "$step" in
    env:*=*)
      kv="${step#env:}"; export "${kv?}"; tag="$tag-$(echo "${kv%%=*}" | tr 'A-Z_' 'a-z-' | sed 's/^tandem-//')$(echo "${kv#*=}" | tr '/' 'p')"  # 53GB/s -> 53GBps
      echo "== env $kv" | tee -a "$res/summary.txt" ;;
    build)
      run_step build 400 bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        && cmake --build build-gpu -j $(nproc)" ;;
    gpu-tests)
      # both suites run whatever the first gives; the step fails if either does
      run_step "gpu-tests$tag" 300 bash -c "build-gpu/tests/tandem_gpu_tests; a=\$?; ctest --test-dir build-gpu -R 'cli_' --output-on-failure; b=\$?; exit \$((a | b))" ;;
    gpu-tests:*)
      run_step "gpu-tests-filtered$tag" 300 build-gpu/tests/tandem_gpu_tests --gtest_filter="${step#gpu-tests:}" ;;
    cli-tests)
      run_step "cli-tests$tag" 200 ctest --test-dir build-gpu -R 'cli_' --output-on-failure ;;
    ctest)
      run_step ctest 500 ctest --test-dir build-gpu --output-on-failure -j 8 ;;
    gpu-bench|gpu-bench:*)
      filter="${step#gpu-bench}"; filter="${filter#:}"
      run_step "gpu-bench$tag" 240 build-gpu/bench/bench_gpu_gemv ${filter:+--benchmark_filter="$filter"} \
        --benchmark_out="$res/gpu-bench$tag.json" --benchmark_out_format=json ;;
    handoff-bench|handoff-bench:*)
      filter=""; [ "$step" != handoff-bench ] && filter="${step#handoff-bench:}"
      run_step "handoff-bench$tag" 120 build-gpu/bench/bench_handoff --benchmark_filter="${filter:-.}" \
        --benchmark_out="$res/handoff-bench$tag.json" --benchmark_out_format=json ;;
    cpu-tests)
      run_step cpu-tests 200 build-gpu/tests/tandem_cpu_experts_tests ;;
    cpu-bench:*)
      run_step "cpu-bench$tag" 240 build-gpu/bench/bench_cpu_experts --benchmark_filter="${step#cpu-bench:}" \
        --benchmark_out="$res/cpu-bench$tag.json" --benchmark_out_format=json ;;
    cpu-experts)
      run_step cpu-experts 400 env OUT="$res/cpu_experts" TEST_TIMEOUT=200 BENCH_TIMEOUT=150 bash scripts/gpu_machine_cpu_experts.sh ;;
    e2e:*|e2e-eager:*|e2e-text:*)
      IFS=: read -r kind lens repeat scen <<< "$step"
      flags=""
      [ "$kind" = e2e-eager ] && flags="BENCH_FLAGS=--eager"
      [ "$kind" = e2e-text ] && flags="BENCH_PROMPTS=1"
      # HEAT=file: reuse a heat map (profiling the 35B synth takes minutes)
      name="$kind-${lens//,/_}$tag"
      mkdir -p "$res/$name/e2e"; [ -n "${HEAT:-}" ] && cp "$HEAT" "$res/$name/e2e/heat.yaml"
      run_step "$name" 9999 env $flags OUT="$res/$name" WARMUP=32 PROFILE_TIMEOUT=120 \
        bash bench/run_e2e.sh build-gpu /tmp/q35 "$lens" "${GEN:-128}" "$repeat" "${scen//,/ }" ;;
    ncu|ncu:*)
      plen="${step#ncu}"; plen="${plen#:}"; plen="${plen:-1024}"
      ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
      [ -n "$ncu_bin" ] || { echo "no ncu" | tee -a "$res/summary.txt"; continue; }
      [ -f /tmp/q35/config.json ] || build-gpu/tandem synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out /tmp/q35 > /dev/null 2>&1
      run_step "ncu-$plen" 240 bash -c "$ncu_bin --metrics gpu__time_duration.sum --print-summary per-kernel \
          build-gpu/tandem bench --model /tmp/q35 --device gpu --context $((plen + 64)) --prompt-len $plen --gen 2 --repeat 1 --warmup 1 \
          > $res/ncu-$plen.txt 2>&1; grep -c 'gpu__time_duration' $res/ncu-$plen.txt" ;;
    profile|profile:*|profile-batch:*)
      if [ "${step%%:*}" = profile-batch ]; then  # step_rows' walk (the batched decode and the verification step): B short prompts, then B at a time
        b="${step#profile-batch:}"; plen="batch$b"
        bench="build-gpu/tandem bench --model /tmp/q35 --device gpu --context 256 --prompt-len 32 --gen 48 --repeat 1 --batch $b"
      else
        plen="${step#profile}"; plen="${plen#:}"; plen="${plen:-16}"
        bench="build-gpu/tandem bench --model /tmp/q35 --device gpu --context $((plen + 64)) --prompt-len $plen --gen 16 --repeat 1 --warmup 1"
      fi
      [ -f /tmp/q35/config.json ] || build-gpu/tandem synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out /tmp/q35 > /dev/null 2>&1
      nsys_bin=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys 2>/dev/null | head -1)
      ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
      if [ -n "$nsys_bin" ]; then
        run_step "profile-$plen" 240 bash -c "$nsys_bin profile --cuda-graph-trace=node -t cuda -o /tmp/prof-$plen -f true $bench > /dev/null \
          && $nsys_bin stats --report cuda_gpu_kern_sum --format csv -o $res/profile-$plen /tmp/prof-$plen.nsys-rep > /dev/null; \
          $nsys_bin stats --report cuda_gpu_trace --format csv -o $res/profile-$plen /tmp/prof-$plen.nsys-rep > /dev/null; ls $res"
      elif [ -n "$ncu_bin" ]; then
        run_step "profile-$plen" 240 bash -c "$ncu_bin --cache-control none --clock-control none --metrics gpu__time_duration.sum \
          --print-summary per-kernel $bench > $res/profile-$plen.txt 2>&1; grep -c 'gpu__time_duration' $res/profile-$plen.txt"
      else echo "no nsys, no ncu" | tee -a "$res/summary.txt"; fi ;;
    ncu-bench:*)
      IFS=: read -r _ filter kre <<< "$step"
      ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
      run_step "ncu-bench-${kre//[^a-z0-9]/_}" 200 bash -c "$ncu_bin --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis -k 'regex:$kre' -c 2 \
          build-gpu/bench/bench_gpu_gemv --benchmark_filter='$filter' --benchmark_min_time=0.01s > $res/ncu-bench-${kre//[^a-z0-9]/_}.txt 2>&1; tail -3 $res/ncu-bench-${kre//[^a-z0-9]/_}.txt" ;;
    trace:*)
      gib=${step#trace:}
      [ -f /tmp/q35/config.json ] || build-gpu/tandem synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out /tmp/q35 > /dev/null 2>&1
      printf 'gpu:\n  memory: %sGiB\n  reserve: 512MiB\ncontext: 1024\n' "$gib" > "$res/trace-${gib}gib.yaml"
      run_step "trace-${gib}gib" 200 bash -c "build-gpu/tandem generate --model /tmp/q35 --device hybrid --config $res/trace-${gib}gib.yaml \
          --prompt 'the model routes every token to eight experts' --max-new-tokens 24 --temperature 0 --trace $res/trace-${gib}gib.json > /dev/null \
        && python3 tools/trace_plot.py $res/trace-${gib}gib.json $res/trace-${gib}gib.png --step 4" ;;
    *) echo "unknown step $step" | tee -a "$res/summary.txt" ;;
  esac
done
pack
cat "$res/summary.txt"

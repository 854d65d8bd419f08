#!/usr/bin/env bash
# tandem serve on the GPU machine (issue 26's figures), one device call: builds the CLI (and the GPU
# tests when TESTS names some), synthesizes the 35B GPTQ-Int4 model once, then for each placement in
# PLACEMENTS measures one sequence with `tandem bench`, serves it with $SLOTS slots and runs
# bench/serve_load.py at $STREAMS concurrent streams; with HISTORY set, the second-turn TTFT of a
# conversation of that many tokens with and without the prefix cache (bench/serve_cache_ttft.py).
# Summary: $OUT/summary.md.
# usage (device tool, carry [".deps"]):
#   DEADLINE=540 [SLOTS=8] [REQUESTS=2 (each stream's)] [PLEN=512 (the bench's prompt; the server's
#   ~450-word prompts are ~830 tokens in the chat template)] [PLACEMENTS="gpu 24GiB 8GiB"] [STREAMS=1,2,4,8] [HISTORY=16000] [CACHE_VRAM=4GiB]
#   [TESTS='*GpuBatch*'] bash scripts/gpu_serve.sh
# A placement is `gpu` (--device gpu) or a budget (--device hybrid --gpu-mem BUDGET).
set -uo pipefail
OUT="${OUT:-$PWD/gpu-serve-out}"
mkdir -p "$OUT"
deadline="${DEADLINE:-540}" slots="${SLOTS:-8}" requests="${REQUESTS:-2}" plen="${PLEN:-512}" placements="${PLACEMENTS-gpu}" streams="${STREAMS:-1,2,4,8}"
t0=$(date +%s)
left() { echo $((deadline - ($(date +%s) - t0))); }
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
summary="$OUT/summary.md"
echo "# tandem serve on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F), $slots slots" > "$summary"
targets="tandem"
[ -n "${TESTS:-}" ] && targets="tandem tandem_gpu_tests"
cmake -S . -B build-serve -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 &&
  cmake --build build-serve -j "$(nproc)" --target $targets > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log" | tee -a "$summary"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s" >> "$summary"
if [ -n "${TESTS:-}" ]; then
  echo; echo "## GPU tests: $TESTS" >> "$summary"
  timeout "$(left)" build-serve/tests/tandem_gpu_tests --gtest_filter="$TESTS" > "$OUT/tests.txt" 2>&1
  echo "rc=$?" >> "$summary"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|FAILED  \]" "$OUT/tests.txt" | tail -12 >> "$summary"
fi
T=build-serve/tandem m=/tmp/q35
[ -f $m/config.json ] || timeout "$(left)" $T synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out $m > "$OUT/synth.txt" 2>&1
echo "synth done: $(( $(date +%s) - t0 )) s" >> "$summary"

placement_flags() { if [ "$1" = gpu ]; then echo "--device gpu"; else echo "--device hybrid --gpu-mem $1"; fi; }

if [ -n "${HISTORY:-}" ]; then
  echo; echo "## Second-turn TTFT, a ${HISTORY}-token history (bench/serve_cache_ttft.py, --device gpu)" >> "$summary"
  timeout "$(left)" python3 bench/serve_cache_ttft.py --tandem $T --model $m --history "$HISTORY" ${CACHE_VRAM:+--vram $CACHE_VRAM} -- \
    --device gpu --context $((HISTORY + 1024)) --slots 2 >> "$summary" 2>&1
  echo "rc=$? at $(( $(date +%s) - t0 )) s" >> "$summary"
fi

ctx=4608
for p in $placements; do
  [ "$(left)" -gt 60 ] || { echo "out of time before $p" >> "$summary"; break; }
  flags=$(placement_flags "$p")
  echo; echo "## $p: tandem bench (prompt $plen, 64 tokens, 2 repeats)" >> "$summary"
  timeout "$(left)" $T bench --model $m $flags --context $ctx --prompt-len $plen --gen 64 --repeat 2 > "$OUT/bench-$p.txt" 2>&1
  grep -A1 -E "^ +prompt +prefill" "$OUT/bench-$p.txt" >> "$summary"  # the table's header and its row
  # the same placement with the server's slots (their KV caches and states come out of the experts' budget): B = 1 and B = slots
  echo; echo "## $p: tandem bench --batch 1,$slots (the server's slots)" >> "$summary"
  timeout "$(left)" $T bench --model $m $flags --context $ctx --prompt-len $plen --gen 64 --repeat 2 --batch "1,$slots" > "$OUT/bench-batch-$p.txt" 2>&1
  tail -8 "$OUT/bench-batch-$p.txt" >> "$summary"
  $T serve --model $m $flags --context $ctx --slots "$slots" --port 0 2> "$OUT/serve-$p.log" &
  pid=$!
  url=""
  for _ in $(seq 1 240); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve-$p.log" | head -1)
    [ -n "$url" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  [ -n "$url" ] || { echo "the server did not start:" >> "$summary"; tail -20 "$OUT/serve-$p.log" >> "$summary"; continue; }
  grep "listening on" "$OUT/serve-$p.log" >> "$summary"
  echo; echo "$p through the server (bench/serve_load.py: 450-word prompts, ~830 tokens in the chat template, 64 tokens, ignore_eos, greedy)" >> "$summary"
  timeout "$(left)" python3 bench/serve_load.py --url "$url" --streams "$streams" --requests "$requests" --max-tokens 64 --prompt-words 450 >> "$summary" 2> "$OUT/load-$p.err"
  kill -TERM $pid; wait $pid; echo "server exit: $?" >> "$summary"
  echo "the server's own clock, its first requests (the one-stream level when STREAMS starts with 1):" >> "$summary"
  grep "tandem serve: " "$OUT/serve-$p.log" | head -2 >> "$summary"
done
echo "total $(( $(date +%s) - t0 )) s" >> "$summary"

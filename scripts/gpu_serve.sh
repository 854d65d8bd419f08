#!/usr/bin/env bash
# tandem serve on the GPU machine (issue 26's figures), one device call: builds the CLI, synthesizes the
# 35B GPTQ-Int4 model once, measures one sequence with `tandem bench`, then serves it with $SLOTS slots
# and runs bench/serve_load.py at 1, 2, 4, 8 concurrent streams. Summary: $OUT/summary.md.
# usage (device tool, carry [".deps"]): DEADLINE=540 [DEVICE=gpu] [SLOTS=8] bash scripts/gpu_serve.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu-serve-out}"
mkdir -p "$OUT"
deadline="${DEADLINE:-540}" device="${DEVICE:-gpu}" slots="${SLOTS:-8}"
t0=$(date +%s)
left() { echo $((deadline - ($(date +%s) - t0))); }
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
summary="$OUT/summary.md"
echo "# tandem serve on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F), --device $device, $slots slots" > "$summary"
cmake -S . -B build-serve -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 &&
  cmake --build build-serve -j "$(nproc)" --target tandem > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log" | tee -a "$summary"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s" >> "$summary"
T=build-serve/tandem m=/tmp/q35
[ -f $m/config.json ] || timeout "$(left)" $T synth --preset qwen3.5-35b-a3b --quant gptq-int4 --routing-skew 1 --out $m > "$OUT/synth.txt" 2>&1
ctx=4608
echo; echo "## One sequence: tandem bench (prompt 512, 64 tokens, 2 repeats)" >> "$summary"
timeout "$(left)" $T bench --model $m --device "$device" --context $ctx --prompt-len 512 --gen 64 --repeat 2 > "$OUT/bench.txt" 2>&1
grep -A1 -E "^ +prompt +prefill" "$OUT/bench.txt" >> "$summary"  # the table's header and its row
$T serve --model $m --device "$device" --context $ctx --slots "$slots" --port 0 2> "$OUT/serve.log" &
pid=$!
url=""
for _ in $(seq 1 240); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.log" | head -1)
  [ -n "$url" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
[ -n "$url" ] || { echo "the server did not start:" >> "$summary"; tail -20 "$OUT/serve.log" >> "$summary"; exit 1; }
grep "listening on" "$OUT/serve.log" >> "$summary"
echo; echo "## Through the server (bench/serve_load.py: ~500-token prompts, 64 tokens, ignore_eos, greedy)" >> "$summary"
timeout "$(left)" python3 bench/serve_load.py --url "$url" --streams 1,2,4,8 --requests 2 --max-tokens 64 --prompt-words 450 >> "$summary" 2> "$OUT/load.err"
kill -TERM $pid; wait $pid; echo "server exit: $?" >> "$summary"
grep -c "chatcmpl" "$OUT/serve.log" >> "$summary"
echo "total $(( $(date +%s) - t0 )) s" >> "$summary"

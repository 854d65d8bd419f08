#!/usr/bin/env bash
# cpu_experts on the GPU machine (16-core AMX Xeon, see shared/device.md), in one batch: build, run the
# differential tests under every TANDEM_MAX_ISA level (AMX can only be tested there), then the
# benchmarks (decode GB/s against the measured read bandwidth, prefill TOPS, oneDNN baseline).
# Results and logs go to $OUT (at most 8 files come back): machine.txt, build.log, tests.log,
# tests_capped.log, bench.txt, bench.json.
#
# usage (device tool, carry .deps for oneDNN):
#   bash scripts/gpu_machine_cpu_experts.sh              # configure + build in build-gpu/ with all cores
#   bash scripts/gpu_machine_cpu_experts.sh build-carry  # binaries built elsewhere: build-carry/{tandem_cpu_experts_tests,
#                                                        #   bench_cpu_experts} and the shared libraries they need in build-carry/lib
# TEST_TIMEOUT / BENCH_TIMEOUT (seconds) bound the two long steps.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
if ls .deps/*.deb > /dev/null 2>&1; then
  for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
fi
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
PREBUILT="${1:-}"

{
  echo "date: $(date -u)"; echo "commit: $(git rev-parse HEAD 2>/dev/null) (+ working tree)"
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3"
  echo "amx flags: $(grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  uname -r; free -g | head -2
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if [ -n "$PREBUILT" ]; then
  TESTS="$PREBUILT/tandem_cpu_experts_tests"
  BENCH="$PREBUILT/bench_cpu_experts"
  export LD_LIBRARY_PATH="$PWD/$PREBUILT/lib:$LD_LIBRARY_PATH"
  echo "prebuilt binaries from $PREBUILT" > "$OUT/build.log"
else
  echo "== configure + build (build-gpu)"
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      && cmake --build build-gpu -j "$(nproc)" --target tandem_cpu_experts_tests bench_cpu_experts; } > "$OUT/build.log" 2>&1
  rc=$?; echo "build rc=$rc"; tail -3 "$OUT/build.log"
  [ $rc -eq 0 ] || exit 1
  TESTS=build-gpu/tests/tandem_cpu_experts_tests
  BENCH=build-gpu/bench/bench_cpu_experts
fi

echo "== tests, no cap (every level this CPU has, incl. AMX, against the scalar reference)"
timeout "${TEST_TIMEOUT:-600}" "$TESTS" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "cpu experts:|PASSED|FAILED|amx" "$OUT/tests.log" | sort -u | head -20

echo "== tests under TANDEM_MAX_ISA=avx512|avx2|scalar (selection + the fast differential cases)"
for isa in avx512 avx2 scalar; do
  echo "---- TANDEM_MAX_ISA=$isa"
  TANDEM_MAX_ISA=$isa timeout 120 "$TESTS" \
    --gtest_filter='CpuIsa.*:CpuOps.*:*Bitwise/odd*:*Bitwise/small*:*Bitwise/prefill*:CpuMoe.Skips*'
  echo "rc=$?"
done > "$OUT/tests_capped.log" 2>&1
grep -E "^---- |cpu experts:|PASSED|FAILED|^rc=" "$OUT/tests_capped.log"

echo "== benchmarks"
timeout "${BENCH_TIMEOUT:-1200}" "$BENCH" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.3 \
  --benchmark_out="$OUT/bench.json" --benchmark_out_format=json > "$OUT/bench.txt" 2>&1
echo "bench rc=$?"
grep -E "read bandwidth|cpu expert store|_median" "$OUT/bench.txt"

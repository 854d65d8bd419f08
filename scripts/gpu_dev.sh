#!/usr/bin/env bash
# The GPU kernels' tests and micro-benchmarks on the GPU machine, in one call that always brings its
# results back ($OUT/results.tgz, packed after every step, and $OUT/summary.txt):
#   build   bench_gpu_gemv and tandem_gpu_tests into ../build-gpu-dev
#   tests   tandem_gpu_tests --gtest_filter=$TESTS (default: the speculative suite, the 8-bit rows, the ops
#           and the int4 MoE kernels)
#   rows8   bench_gpu_gemv: the 8-bit rows' GEMV against bf16 ($RFILTER, default BM_gemv_(bf16|rows8))
#   moe     bench_gpu_gemv: one decode MoE layer, 1..8 tokens ($MFILTER, default BM_moe_int4_decode)
# usage (device tool, carry .deps): DEADLINE=400 STEPS="build tests rows8 moe" bash scripts/gpu_dev.sh
set -uo pipefail
DEADLINE="${DEADLINE:-400}"
STEPS="${STEPS:-build tests rows8 moe}"
TESTS="${TESTS:-*Speculative*:*Rows8*:GpuOps*:*GpuMoeInt4*}"
build=../build-gpu-dev
name=gpu-dev
source "$(dirname "$0")/gpu_steps.sh"

for s in $STEPS; do
  case "$s" in
    build)
      build_step bench_gpu_gemv tandem_gpu_tests ;;
    tests)
      step gpu-tests "${TESTS_SECS:-200}" "$build/tests/tandem_gpu_tests" --gtest_filter="$TESTS"
      grep -E '^\[  (PASSED|FAILED)' "$res/gpu-tests.log" >> "$res/summary.txt" ;;
    rows8)
      step rows8 120 "$build/bench/bench_gpu_gemv" --benchmark_filter="${RFILTER:-BM_gemv_(bf16|rows8)}"
      grep -E '^BM_' "$res/rows8.log" >> "$res/summary.txt" ;;
    moe)
      step moe 120 "$build/bench/bench_gpu_gemv" --benchmark_filter="${MFILTER:-BM_moe_int4_decode}"
      grep -E '^BM_' "$res/moe.log" >> "$res/summary.txt" ;;
  esac
  pack
done
cat "$res/summary.txt"

#!/usr/bin/env bash
# One batch on the GPU machine (see shared/device.md): unpack the carried .deps, build into build-gpu/
# with all cores, run the whole test suite there, regenerate the HF fixtures with that machine's
# transformers and check them byte for byte against tests/data. Logs go to $OUT.
# usage (device tool): [SKIP_FIXTURES=1] bash scripts/gpu_machine.sh
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

step() { echo "== $*"; }
{
  step "machine"; date -u; git rev-parse HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(amx[a-z_0-9 ]*\).*/AMX flags: \1/'
} > "$OUT/machine.txt" 2>&1

step "configure + build"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
  && cmake --build build-gpu -j "$(nproc)" > "$OUT/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc"; tail -3 "$OUT/build.log"

if [ $build_rc -eq 0 ]; then
  step "tests"
  ctest --test-dir build-gpu --output-on-failure -j 8 > "$OUT/ctest.log" 2>&1
  echo "ctest rc=$?"; tail -4 "$OUT/ctest.log"
  build-gpu/tandem info > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt"
fi

if [ $build_rc -eq 0 ] && [ -x build-gpu/bench/bench_gpu_gemv ]; then
  step "GPU GEMV benchmark"
  build-gpu/bench/bench_gpu_gemv --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$OUT/bench_gpu_gemv.json" --benchmark_out_format=json > "$OUT/bench_gpu_gemv.txt" 2>&1
  grep -E "median" "$OUT/bench_gpu_gemv.txt"
fi

[ -n "${SKIP_FIXTURES:-}" ] && exit 0
step "HF fixtures regenerated here"
rm -rf /tmp/fx && python3 tools/make_reference.py --out /tmp/fx > "$OUT/make_reference.log" 2>&1
echo "make_reference rc=$?"; tail -2 "$OUT/make_reference.log"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" | tee -a "$OUT/make_reference.log"
mkdir -p "$OUT/fixtures"
for d in /tmp/fx/*/; do
  n=$(basename "$d")
  mkdir -p "$OUT/fixtures/$n" && cp "$d/logits.npy" "$d/reference.json" "$OUT/fixtures/$n/"
  for f in "$d"/*.safetensors; do cmp -s "$f" "tests/data/$n/$(basename "$f")" || echo "weights differ: $n/$(basename "$f")"; done
done | tee "$OUT/fixture_compare.txt"
python3 - "$OUT/fixtures" <<'PY' | tee -a "$OUT/fixture_compare.txt"
import sys, os, numpy as np
for n in sorted(os.listdir(sys.argv[1])):
    a = np.load(os.path.join(sys.argv[1], n, "logits.npy")); b = np.load(os.path.join("tests/data", n, "logits.npy"))
    print(f"{n}: logits here vs committed: max rel L2 per row {np.max(np.linalg.norm(a-b,axis=1)/np.linalg.norm(b,axis=1)):.2e}")
PY

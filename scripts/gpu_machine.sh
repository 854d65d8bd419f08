#!/usr/bin/env bash
# One batch on the GPU machine (see shared/device.md): unpack the carried .deps, build into build-gpu/
# with all cores, run the whole test suite there, regenerate the HF fixtures with that machine's
# transformers and check them byte for byte against tests/data. Logs go to $OUT.
# usage (device tool): bash scripts/gpu_machine.sh [extra steps: bench]
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

step "HF fixtures regenerated here"
rm -rf /tmp/fx && python3 tools/make_reference.py --out /tmp/fx > "$OUT/make_reference.log" 2>&1
echo "make_reference rc=$?"; tail -3 "$OUT/make_reference.log"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" >> "$OUT/make_reference.log" 2>&1
same=0; diff=0
for f in tests/data/*/*.safetensors tests/data/*/logits.npy; do
  rel=${f#tests/data/}
  if cmp -s "$f" "/tmp/fx/$rel"; then same=$((same+1)); else diff=$((diff+1)); echo "differs: $rel"; fi
done | tee "$OUT/fixture_compare.txt"
echo "fixtures identical: $(grep -c differs "$OUT/fixture_compare.txt" | sed 's/^0$/all/')" | tee -a "$OUT/fixture_compare.txt"

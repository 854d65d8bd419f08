#!/usr/bin/env bash
# The consumer-card checks on the GPU machine (issue 23.1), one mode a device call:
#   native: a build for the machine's own architecture; the GPU suite, the CLI's GPU fixture checks, the
#           start-up line of a binary built for an architecture the device cannot run (sm_80 SASS).
#   sm89:   PTX for compute_89 alone (the driver compiles it for the H200: no sm_90 instruction can be
#           in it) and TANDEM_MAX_SM=89, so the runtime chooses what it would on an RTX 4090 (99 KB of
#           shared memory a block, no programmatic launch); the same suite.
#   firstrun: the sm89 build as a user with a 24 GB card would run it: the 35B GPTQ-Int4 model
#           (synthetic weights, real shapes), `tandem chat` and `generate` with nothing but --gpu-mem 24GiB.
# usage (device tool): bash scripts/gpu_consumer.sh native|sm89|firstrun   (logs under $OUT)
set -uo pipefail
mode="${1:?native or sm89}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
case "$mode" in
  native) archs=native; export -n TANDEM_MAX_SM ;;
  sm89|firstrun) archs=89-virtual; export TANDEM_MAX_SM=89 ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
b="build-gpu-${mode/firstrun/sm89}"
{
  date -u; git rev-parse HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "CMAKE_CUDA_ARCHITECTURES=$archs TANDEM_MAX_SM=${TANDEM_MAX_SM:-unset}"
} > "$OUT/$mode-machine.txt" 2>&1
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$archs" > "$OUT/$mode-build.log" 2>&1 \
  && cmake --build "$b" -j "$(nproc)" --target tandem tandem_gpu_tests >> "$OUT/$mode-build.log" 2>&1
rc=$?
echo "build rc=$rc"; tail -2 "$OUT/$mode-build.log"
[ $rc -eq 0 ] || exit 1
if [ "$mode" = firstrun ]; then
  m=/tmp/q35
  [ -f $m/config.json ] || "$b/tandem" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --out $m > "$OUT/firstrun-synth.txt" 2>&1
  tail -1 "$OUT/firstrun-synth.txt"
  {
    echo '$ printf "Hello! What can you do?\n" | tandem chat --model M --gpu-mem 24GiB --max-new-tokens 48'
    printf 'Hello! What can you do?\n' | timeout 240 "$b/tandem" chat --model $m --gpu-mem 24GiB --max-new-tokens 48 --seed 1 2>&1 | cut -c1-400
    echo "rc=${PIPESTATUS[1]}"
    echo '$ tandem generate --model M --gpu-mem 24GiB --chat --prompt "..." --max-new-tokens 64'
    timeout 240 "$b/tandem" generate --model $m --gpu-mem 24GiB --chat --prompt "Explain mixture-of-experts models in one paragraph." \
      --max-new-tokens 64 --temperature 0 2>&1 | cut -c1-400
    echo "rc=${PIPESTATUS[0]}"
    echo '$ tandem plan --model M --gpu-mem 24GiB'
    "$b/tandem" plan --model $m --gpu-mem 24GiB 2>&1 | head -24
  } > "$OUT/firstrun.txt" 2>&1
  cat "$OUT/firstrun.txt" | grep -v "^  *[0-9]*: " | head -60
  bash tests/cli/test_cli.sh "$b/tandem" tests/data > "$OUT/firstrun-cli.log" 2>&1
  echo "cli rc=$?"; tail -1 "$OUT/firstrun-cli.log"; grep -E "^FAIL" "$OUT/firstrun-cli.log" | head
  exit 0
fi
"$b/tandem" info | tee -a "$OUT/$mode-machine.txt"
"$b/tests/tandem_gpu_tests" > "$OUT/$mode-gpu-tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^\[  (PASSED|FAILED)|tests ran|^\[ caps" "$OUT/$mode-gpu-tests.log"; grep "^\[  FAILED  \]" "$OUT/$mode-gpu-tests.log" | head -20
# The CLI's GPU fixture checks (logits --device gpu within 2e-2 of HF, budget errors) and --device auto.
bash tests/cli/test_cli.sh "$b/tandem" tests/data > "$OUT/$mode-cli.log" 2>&1
echo "cli rc=$?"; tail -1 "$OUT/$mode-cli.log"; grep -E "^FAIL" "$OUT/$mode-cli.log" | head
"$b/tandem" logits --model tests/data/gptq_asym_v1 --ids 1,2,3 --out /tmp/auto.npy > "$OUT/$mode-auto.txt" 2>&1; cat "$OUT/$mode-auto.txt"
if [ "$mode" = native ]; then
  # A binary with no image for this device: one line at start-up (sm_80 SASS does not run on sm_90).
  cat > /tmp/probe.cpp <<'CPP'
#include <cstdio>
#include "gpu_core/device.cuh"
int main() { const auto& c = tandem::gpu::gpu_device_caps(); std::printf("usable=%d error: %s\n", c.usable, c.error); return c.usable ? 0 : 1; }
CPP
  nvcc -std=c++17 -gencode arch=compute_80,code=sm_80 -DTANDEM_CUDA_ARCHS='"80"' -I. gpu_core/device.cu /tmp/probe.cpp -o /tmp/probe80 > "$OUT/no-image.txt" 2>&1
  /tmp/probe80 >> "$OUT/no-image.txt" 2>&1; echo "probe rc=$?" >> "$OUT/no-image.txt"; cat "$OUT/no-image.txt"
fi

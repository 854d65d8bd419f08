#!/usr/bin/env bash
# Kernel A/B of several candidate patches at once, on the GPU machine, in one device call: .base (the
# tree they apply to, e.g. `git archive main` unpacked) and .base + each patch build bench_gpu_gemv side
# by side (sources in /tmp/ksrc-NAME, builds in build-k-NAME: a warm machine rebuilds only what changed),
# then the benchmarks matching $KFILTER run for every tree, twice, interleaved; with $NCU_FILTER, Nsight
# Compute's duration, DRAM bytes and L2 hit rate of the kernels matching $NCU_KERNELS ($NCU_COUNT
# launches after 20) for each tree of $NCU_TREES (default all; this step has not run on the machine yet).
# A patch NAME is bench/dev/NAME.patch, or any path ending in .patch. For a change that lands, gpu_ab.sh's
# tests and end-to-end steps still apply.
#
# Keep KFILTER narrow: a tree's run of the three BM_moe_int4_decode cases takes ~30 s on the H100. A
# benchmark that never prints has a hung kernel (stop 55's "slow" run was a candidate's hang): wrap the
# call in `timeout`.
#
# usage (device tool, carry [".deps", ".base"]):
#   PATCHES="NAME ..." KFILTER='BM_attention_decode/4096/0/8/0/' timeout 250 bash scripts/gpu_kab.sh   (NAME: bench/dev/NAME.patch)
set -uo pipefail
OUT="${OUT:-$PWD/kab-out}"; mkdir -p "$OUT"
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
here=$PWD; trees="base ${PATCHES:-}"; j=$(( $(nproc) / $(echo $trees | wc -w) + 1 ))
b0=$(date +%s)
name() { basename "$1" .patch; }
for t in $trees; do
  (
    n=$(name "$t"); src=/tmp/ksrc-$n
    rm -rf "$src.new"; cp -r .base "$src.new"
    if [ "$t" != base ]; then
      patch=$t; [[ "$patch" == *.patch ]] || patch=bench/dev/$t.patch
      [[ "$patch" = /* ]] || patch=$here/$patch
      (cd "$src.new" && git apply "$patch") || { echo "patch $t failed"; echo 1 > "$OUT/rc-$n"; exit 1; }
    fi
    # keep the old source dir (and its mtimes) when nothing changed, so a warm machine rebuilds nothing
    if [ -d "$src" ] && diff -rq "$src" "$src.new" >/dev/null; then rm -rf "$src.new"; else rm -rf "$src"; mv "$src.new" "$src"; fi
    cmake -S "$src" -B build-k-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build-$n.log" 2>&1 &&
      cmake --build build-k-$n -j $j --target bench_gpu_gemv >> "$OUT/build-$n.log" 2>&1
    echo $? > "$OUT/rc-$n"
  ) &
done
wait
echo "builds in $(( $(date +%s) - b0 )) s: $(for t in $trees; do echo -n "$(name $t) rc $(cat $OUT/rc-$(name $t)) "; done)"
for t in $trees; do [ "$(cat $OUT/rc-$(name $t))" = 0 ] || { tail -20 "$OUT/build-$(name $t).log"; exit 1; }; done
nvidia-smi --query-gpu=name --format=csv,noheader
for rep in 1 2; do
  for t in $trees; do
    build-k-$(name $t)/bench/bench_gpu_gemv --benchmark_filter="${KFILTER:-.}" 2>&1 | grep -E '^BM_' | sed "s/^/$(name $t) /"
  done
done
if [ -n "${NCU_FILTER:-}" ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  for t in ${NCU_TREES:-$trees}; do
    t=$(name $t)
    "$ncu" --kernel-name "regex:${NCU_KERNELS:-.}" --launch-skip 20 --launch-count "${NCU_COUNT:-4}" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      build-k-$t/bench/bench_gpu_gemv --benchmark_filter="$NCU_FILTER" > "$OUT/ncu-$t.txt" 2>&1
    echo "== ncu $t"; grep -E "^  [a-z_]+.*\(|gpu__time|dram__|lts__" "$OUT/ncu-$t.txt" | sed 's/(int, int, .*//' | cut -c1-110
  done
fi

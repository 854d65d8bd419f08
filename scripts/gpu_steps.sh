# scripts/gpu_steps.sh: what a GPU-machine script that runs named steps under one deadline shares
# (sourced by gpu_dev.sh, gpu_mtp.sh and gpu_quant.sh). The device tool returns at most 8 files per call
# and nothing once the call is killed, so every step writes under $res, has its own limit inside
# DEADLINE, and the folder is packed into $OUT/results.tgz after each step (a kill loses at most the step
# in flight).
# Before sourcing: name (the folder under /tmp), build (the build folder), DEADLINE (seconds). After: $res
# (with machine.txt: the date, the GPU, the tree's hash and TANDEM_MAX_SM), left, pack, step,
# build_step, and the .deps packages unpacked into /opt/deps (oneDNN, ICU: the machine lacks them).
OUT="${OUT:-$PWD/gpu-out}"
res=/tmp/$name/results
rm -rf "$res"; mkdir -p "$res" "$OUT"
# The tree's hash, not `git log`: the device's copy of .git can lag the working tree it runs (on the
# caller's side, `git rev-parse COMMIT^{tree}` names the commit that matches).
tree=$(GIT_INDEX_FILE=/tmp/$name.index git add -A . 2>/dev/null && GIT_INDEX_FILE=/tmp/$name.index git write-tree 2>/dev/null)
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; echo "tree ${tree:-unknown}"
  echo "TANDEM_MAX_SM=${TANDEM_MAX_SM:-}"; } > "$res/machine.txt" 2>&1
t0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
pack() { tar czf "$OUT/results.tgz" -C /tmp/$name results; cp "$res/summary.txt" "$OUT/" 2>/dev/null; }
step() {  # name seconds command...
  local step_name="$1" secs="$2"; shift 2
  local budget; budget=$(( $(left) - 5 ))
  [ "$secs" -gt "$budget" ] && secs=$budget
  if [ "$secs" -le 5 ]; then echo "$step_name: skipped (no time left)" >> "$res/summary.txt"; pack; return; fi
  local s0; s0=$(date +%s)
  timeout "$secs" "$@" > "$res/$step_name.log" 2>&1
  echo "$step_name: rc=$? in $(( $(date +%s) - s0 ))s" >> "$res/summary.txt"
  pack
}
build_step() {  # targets...: configured for sm_90, Release, into $build (300 s)
  step build 300 bash -c "cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null \
    && cmake --build $build -j $(nproc) --target $*"
}
for f in ../.deps/*.deb .deps/*.deb; do [ -f "$f" ] && dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

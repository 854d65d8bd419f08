#!/usr/bin/env bash
# `tandem logits --device cpu` against the HF fixtures at every expert-kernel ISA level this CPU has
# (TANDEM_MAX_ISA=scalar, avx2, avx512, amx; a level the CPU lacks is skipped with a message): relative L2
# <= 3e-2 per position and the same argmax at decisive positions, else MISMATCH and the test fails.
#  - GPTQ fixtures: int4 experts with 16-bit activations (the default).
#  - BF16 fixtures: bf16 experts (the default; exact products) at 3e-2; int8 experts
#    (16-bit activations) are checked too, at 5e-2: their weight rounding alone moves these tiny
#    random-weight models' logits by 2.7-3.2% (bench/results/2026-11-29-cpu-experts-devbox.md).
# usage: test_cpu_device.sh TANDEM DATA_DIR
tandem="$1"
data="$2"
source "$(dirname "$0")/common.sh"
is_gptq() { python3 -c "import json,sys; sys.exit(0 if 'quantization_config' in json.load(open(sys.argv[1])) else 1)" "$1/config.json"; }

run() {  # run ISA NAME DIR TOL [extra args...]; returns 3 when the level is not available here
  local isa="$1" name="$2" d="$3" tol="$4"
  shift 4
  TANDEM_MAX_ISA="$isa" "$tandem" logits --model "$d" --ids "$(ids_of "$d")" --prefill "$(prefill_of "$d")" \
    --device cpu --compare "$d/logits.npy" --tol "$tol" "$@" >"$tmp/out" 2>&1
  local rc=$?
  if grep -q "this CPU cannot run" "$tmp/out"; then return 3; fi
  local line
  line=$(grep "^compare" "$tmp/out")
  if [ "$rc" -ne 0 ] || ! grep -q ": OK$" <<<"$line" || grep -q "MISMATCH" "$tmp/out"; then
    echo "FAIL $isa $name (exit $rc): ${line:-no comparison}"; tail -3 "$tmp/out"; failures=$((failures + 1)); return 1
  fi
  echo "ok   $isa $name: ${line#*: }"
  passes=$((passes + 1))
}

for isa in scalar avx2 avx512 amx; do
  for d in "$data"/*/; do
    d=${d%/}
    [ -f "$d/reference.json" ] || continue
    n=$(basename "$d")
    if is_gptq "$d"; then
      run "$isa" "$n int4 experts" "$d" 3e-2
    else
      run "$isa" "$n bf16 experts (default)" "$d" 3e-2
      [ $? -eq 3 ] || run "$isa" "$n int8 experts" "$d" 5e-2 --cpu-expert-format int8
    fi
    if [ $? -eq 3 ]; then
      echo "skip $isa: $(grep -o "this CPU cannot run[^;]*" "$tmp/out" | head -1)"
      continue 2
    fi
  done
done

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ] && [ "$passes" -gt 0 ]

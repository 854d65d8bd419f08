#!/usr/bin/env bash
# The host test suites and a few CLI runs under AddressSanitizer + UBSan (`make sanitize`, CI after
# `make test`). usage: run_sanitize.sh BUILD_DIR (configured with -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF).
# Any report ends the run with a non-zero exit (halt_on_error; UBSan is built with -fno-sanitize-recover).
set -euo pipefail
build="${1:-build-asan}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
# Leaks are checked too (no suppression needed today).
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_odr_violation=2"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TANDEM_TEST_SEED="${TANDEM_TEST_SEED:-1}"  # reproducible runs; the suites print it
t0=$SECONDS

suite() {  # suite NAME BINARY [gtest args...]
  local name="$1" bin="$2"
  shift 2
  local s=$SECONDS
  "$bin" --gtest_brief=1 "$@" >"$build/sanitize-$name.log" 2>&1 || {
    tail -60 "$build/sanitize-$name.log"
    echo "sanitize: $name FAILED (log: $build/sanitize-$name.log)"
    exit 1
  }
  echo "sanitize: $name ok ($((SECONDS - s)) s; $(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$build/sanitize-$name.log" | head -1))"
}

suite unit "$build/tests/tandem_unit_tests"
suite placement "$build/tests/tandem_placement_tests"
suite cpu_experts "$build/tests/tandem_cpu_experts_tests"

# The CLI end to end on the fixtures and a synthesized tiny model: every path these take (loading, the
# tokenizer, sampling, the CPU experts, the planner, the writers) runs under the sanitizers.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cli() {  # cli NAME EXPECTED_EXIT command...
  local name="$1" want="$2"
  shift 2
  local rc=0
  "$build/tandem" "$@" >"$work/out" 2>"$work/err" || rc=$?
  if [ "$rc" -ne "$want" ] || grep -qE "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$work/err"; then
    tail -60 "$work/err"
    echo "sanitize: cli $name FAILED (exit $rc, expected $want)"
    exit 1
  fi
  echo "sanitize: cli $name ok"
}
fx="$root/tests/data/bf16_text_only"
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$fx/reference.json")
cli "synth tiny" 0 synth --preset tiny --out "$work/tiny"
cli "logits ref vs HF" 0 logits --model "$fx" --device ref --ids "$ids" --compare "$fx/logits.npy" --tol 1e-4
cli "logits cpu vs HF" 0 logits --model "$fx" --device cpu --ids "$ids" --compare "$fx/logits.npy" --tol 3e-2
cli "generate cpu" 0 generate --model "$work/tiny" --device cpu --prompt "The sea is" --max-new-tokens 16 --temperature 0
cli "generate ref, sampled chat" 0 generate --model "$work/tiny" --device ref --prompt "Hello" --chat --max-new-tokens 8 --seed 3 --preset instruct
cli "tokenize" 0 tokenize --model "$work/tiny" --text "Hello, world! Grüße — 你好 🙂"
cli "detokenize" 0 detokenize --model "$work/tiny" --ids "$(cat "$work/out")"
cli "synth qwen3.5 config" 0 synth --preset qwen3.5-35b-a3b --quant gptq-int4 --config-only --out "$work/q35"
cli "plan" 0 plan --model "$work/q35" --config "$root/configs/12gb.yaml" --json --no-measure
cli "missing model" 1 info --model "$work/none"
cli "threads out of range" 2 logits --model "$fx" --device cpu --ids 1 --out "$work/x.npy" --threads 100000
cli "config is /dev/zero" 1 plan --model /dev/zero --no-measure
rc=0
"$build/tandem" plan --model "$work/q35" --gpu-mem 12GiB --json --no-measure >/dev/full 2>"$work/err" || rc=$?
if [ "$rc" -ne 1 ] || grep -qE "AddressSanitizer|runtime error:|LeakSanitizer" "$work/err"; then
  cat "$work/err"; echo "sanitize: cli plan to a full disk FAILED (exit $rc)"; exit 1
fi
echo "sanitize: cli plan to a full disk ok"
echo "sanitize: all clean in $((SECONDS - t0)) s"

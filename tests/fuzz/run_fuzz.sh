#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a short time.
# usage: run_fuzz.sh BUILD_DIR SECONDS   (SECONDS per target: a few seconds find nothing but the seeds)
set -euo pipefail
build="${1:-build}"
seconds="${2:-30}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/$build/fuzz"
mkdir -p "$out"
cxx="${FUZZ_CXX:-clang++}"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root")

build_target() {  # name sources... [-- extra compiler and linker flags]
  local name="$1"; shift
  local bin="$out/$name"
  local sources=() extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sources+=("$1"); shift; done
  if [ $# -gt 0 ]; then shift; extra=("$@"); fi
  local newest
  newest=$(ls -t "${sources[@]}" "$0" "$root"/core/*.h "$root"/runtime/*/*.h "$root"/placement/*.h "$root"/gpu_core/*.h | head -1)
  if [ ! -x "$bin" ] || [ "$newest" -nt "$bin" ]; then
    echo "fuzz: building $name"
    "$cxx" "${flags[@]}" "${sources[@]}" "${extra[@]}" -o "$bin"
  fi
}

# error.cpp (message escaping) and file_io.cpp (bounded reads) sit under every parser.
common=("$root/core/error.cpp" "$root/core/file_io.cpp")
build_target fuzz_safetensors_header "$root/tests/fuzz/fuzz_safetensors_header.cpp" \
  "$root/runtime/format/safetensors.cpp" "$root/core/dtype.cpp" "${common[@]}"
build_target fuzz_config "$root/tests/fuzz/fuzz_config.cpp" "$root/runtime/format/config.cpp" "${common[@]}"
build_target fuzz_tokenizer "$root/tests/fuzz/fuzz_tokenizer.cpp" "$root/runtime/tokenizer/tokenizer.cpp" "${common[@]}" \
  "$root/runtime/tokenizer/load.cpp" "$root/runtime/tokenizer/bpe.cpp" "$root/runtime/tokenizer/pretok.cpp" \
  "$root/runtime/tokenizer/unicode.cpp" -- -DTANDEM_TOKENIZER_DIR="\"$root/tests/data/tokenizers\"" -licuuc

build_target fuzz_placement "$root/tests/fuzz/fuzz_placement.cpp" "$root/placement/placement_config.cpp" "$root/placement/heat.cpp" \
  "$root/placement/planner.cpp" "$root/placement/gpu_layout.cpp" "$root/gpu_core/int4_layout.cpp" "$root/gpu_core/rows8_layout.cpp" "$root/runtime/format/config.cpp" "$root/core/bytes.cpp" "$root/core/nearest.cpp" "$root/core/row_format.cpp" \
  "${common[@]}" \
  -- -DTANDEM_FUZZ_MODEL_CONFIG="\"$root/tests/data/gptq_sym_v1/config.json\"" -lyaml-cpp
build_target fuzz_reply "$root/tests/fuzz/fuzz_reply.cpp" "$root/runtime/engine/reply_parser.cpp"
build_target fuzz_server_api "$root/tests/fuzz/fuzz_server_api.cpp" "$root/runtime/server/api.cpp" "$root/runtime/engine/reply_parser.cpp" \
  "$root/runtime/engine/sampling.cpp" "$root/runtime/tokenizer/chat_template.cpp" "$root/runtime/tokenizer/unicode.cpp" "${common[@]}" -- -licuuc

targets=(safetensors_header config tokenizer placement reply server_api)
for t in "${targets[@]}"; do
  work="$out/corpus-$t"
  mkdir -p "$work"
  echo "fuzz: $t for ${seconds}s"
  "$out/fuzz_$t" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
    "$work" "$root/tests/fuzz/corpus/$t" 2>"$out/$t.log" || { tail -40 "$out/$t.log"; echo "fuzz: $t FAILED"; exit 1; }
  grep -E "^#[0-9]+.*DONE" "$out/$t.log" | tail -1 || true
done
echo "fuzz: no crashes"

#!/usr/bin/env bash
# The codebase's structural rules (issue 24), checked on every test run:
#  - the library graph is one-way: core <- kernels (gpu_core, cpu_experts) <- placement <- engine
#    (runtime/) <- CLI, bindings; tools/ (synth, BPE trainer) is not linked into the engine;
#  - the environment is read in one place per layer: only TANDEM_MAX_ISA (cpu_experts/isa.cpp) and
#    TANDEM_MAX_SM (gpu_core/device.cu), besides test-only seeds;
#  - no source file over 800 lines; the README at most 200 lines; no raw benchmark logs in the tree.
# usage: check_layout.sh SOURCE_DIR
set -uo pipefail
root="${1:-.}"
cd "$root" || exit 2
bad=0
say() { echo "check_layout: $*"; bad=1; }

includes() {  # dir pattern: #include lines in dir matching pattern
  grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"($2)" "$1" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' --include='*.inc' 2>/dev/null
}

# core/ includes nothing of the project but core/.
hits=$(includes core 'runtime/|placement/|gpu_core/|cpu_experts/|tools/|bindings/')
[ -n "$hits" ] && say "core/ must include only core/ headers:"$'\n'"$hits"
# The kernels know no model, config, YAML or engine.
for d in gpu_core cpu_experts; do
  hits=$(includes "$d" 'runtime/|placement/|tools/|bindings/')
  [ -n "$hits" ] && say "$d/ must not include runtime/, placement/, tools/ or bindings/ headers:"$'\n'"$hits"
done
hits=$(includes gpu_core 'cpu_experts/')
[ -n "$hits" ] && say "gpu_core/ must not include cpu_experts/ headers:"$'\n'"$hits"
# The planner decides and runs nothing: no runner, engine, model or device header; only CUDA-free sizes.
hits=$(includes placement 'runtime/(engine|models|cli|tokenizer)/|tools/|bindings/|cpu_experts/|gpu_core/[a-z_0-9]*\.cuh')
[ -n "$hits" ] && say "placement/ may include core/, runtime/format/ and CUDA-free gpu_core size headers only:"$'\n'"$hits"
# Rooms under runtime/: format and tokenizer below the model, the model below the engine, the CLI on top.
for d in runtime/format runtime/tokenizer; do
  hits=$(includes "$d" 'runtime/(engine|models|cli)/|placement/|tools/|cpu_experts/|gpu_core/')
  [ -n "$hits" ] && say "$d/ must not include the model, engine, CLI, placement, tools or kernels:"$'\n'"$hits"
done
hits=$(includes runtime/models 'runtime/(engine|cli)/|tools/|placement/(planner|placement_config|heat)')
[ -n "$hits" ] && say "runtime/models/ must not include the engine, CLI or tools, and of placement/ only the layout it allocates from (gpu_layout.h):"$'\n'"$hits"
hits=$(includes runtime/engine 'runtime/cli/|tools/|bindings/')
[ -n "$hits" ] && say "runtime/engine/ must not include the CLI, tools or bindings:"$'\n'"$hits"

# The environment: TANDEM_MAX_ISA and TANDEM_MAX_SM only, each read once.
env_reads=$(grep -rn 'getenv' core runtime placement cpu_experts gpu_core bindings tools --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' 2>/dev/null)
others=$(echo "$env_reads" | grep -v '^$' | grep -vE 'cpu_experts/isa\.(cpp|h):.*TANDEM_MAX_ISA|gpu_core/device\.cu:.*TANDEM_MAX_SM')
[ -n "$others" ] && say "environment reads outside TANDEM_MAX_ISA (cpu_experts/isa.cpp) and TANDEM_MAX_SM (gpu_core/device.cu):"$'\n'"$others"

# File sizes.
while IFS= read -r f; do
  n=$(wc -l < "$f")
  [ "$n" -gt 800 ] && say "$f has $n lines (at most 800: split it by what its parts do)"
done < <(git ls-files -co --exclude-standard -- '*.h' '*.cpp' '*.cu' '*.cuh' '*.py' '*.sh' 2>/dev/null | grep -v '^tests/data/' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
n=$(wc -l < README.md)
[ "$n" -gt 200 ] && say "README.md has $n lines (at most 200: details belong in docs/)"
[ -e bench/results/raw ] && git ls-files --error-unmatch bench/results/raw >/dev/null 2>&1 && say "bench/results/raw/ is tracked: raw logs stay out of the tree"

[ "$bad" -eq 0 ] && echo "check_layout: the library graph, the environment, file sizes and the README hold"
exit "$bad"

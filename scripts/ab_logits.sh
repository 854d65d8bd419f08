#!/usr/bin/env bash
# Bit-for-bit A/B of two tandem binaries: every HF fixture in tests/data through `tandem logits` on each
# device asked for, with both binaries, and the float32 outputs compared byte for byte (cmp). A
# refactoring that claims "the same logits" passes this; any changed bit fails it.
# usage: scripts/ab_logits.sh OLD_TANDEM NEW_TANDEM [DEVICES] [OUT_DIR]   (DEVICES: "ref cpu", on a GPU also "gpu hybrid hybrid-cpu")
set -uo pipefail
old="$1" new="$2"
devices="${3:-ref cpu}"
out="${4:-$(mktemp -d)}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
pass=0 fail=0
for fx in "$root"/tests/data/*/reference.json; do
  dir=$(dirname "$fx") name=$(basename "$(dirname "$fx")")
  read -r ids prefill < <(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(','.join(map(str,r['ids'])), r['prefill'])" "$fx")
  for d in $devices; do
    extra=(--device "$d")
    [ "$d" = hybrid ] && extra=(--device hybrid --gpu-mem 2GiB)
    # hybrid-cpu: every routed expert on the host (configs/cpu-experts.yaml)
    [ "$d" = hybrid-cpu ] && extra=(--device hybrid --config "$root/configs/cpu-experts.yaml" --context 64)
    for which in old new; do
      bin=$old; [ $which = new ] && bin=$new
      "$bin" logits --model "$dir" --ids "$ids" --prefill "$prefill" "${extra[@]}" --out "$out/$name.$d.$which.npy" \
        > "$out/$name.$d.$which.log" 2>&1 || echo "  ($which exited $? on $name --device $d: $(tail -1 "$out/$name.$d.$which.log"))"
    done
    if [ -s "$out/$name.$d.old.npy" ] && cmp -s "$out/$name.$d.old.npy" "$out/$name.$d.new.npy"; then
      pass=$((pass + 1)); echo "same   $name --device $d"
    else
      fail=$((fail + 1)); echo "DIFFER $name --device $d"
    fi
  done
done
echo "ab_logits: $pass identical, $fail differ ($out)"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# The tandem CLI end to end: logits on every fixture within tolerance, and for bad input an exit code
# of 1 or 2 with exactly one clear line on stderr (never a crash).
tandem="$1"
data="$2"
configs="$(cd "$(dirname "$0")/../../configs" && pwd)"
src="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(dirname "$0")/common.sh"

for d in "$data"/*/; do
  d=${d%/}
  [ -f "$d/reference.json" ] || continue
  n=$(basename "$d")
  check "logits $n matches HF" "0" "OK" -- "$tandem" logits --model "$d" --device ref --ids "$(ids_of "$d")" \
    --prefill "$(prefill_of "$d")" --out "$tmp/l.npy" --compare "$d/logits.npy" --tol 1e-4
done

fx="$data/bf16_text_only"
ids=$(ids_of "$fx")
printf '%s' "$ids" | tr ',' '\n' >"$tmp/ids.txt"
check "ids from a file" "0" "OK" -- "$tandem" logits --model "$fx" --device ref --ids "@$tmp/ids.txt" --prefill "$(prefill_of "$fx")" --compare "$fx/logits.npy"
check "--eager (the host paths have no graphs)" "0" "OK" -- "$tandem" logits --model "$fx" --device ref --eager --ids "$ids" \
  --prefill "$(prefill_of "$fx")" --compare "$fx/logits.npy"

cp -r "$fx" "$tmp/trunc"
truncate -s 5000 "$tmp/trunc/model.safetensors"
check "truncated checkpoint" "1 2" "model.safetensors.*truncated" -- "$tandem" logits --model "$tmp/trunc" --ids 1,2 --out "$tmp/x.npy"

cp -r "$fx" "$tmp/badcfg"
sed -i 's/"hidden_size": [0-9]*/"hidden_size": "wide"/' "$tmp/badcfg/config.json"
check "bad config value" "1 2" "hidden_size" -- "$tandem" logits --model "$tmp/badcfg" --ids 1,2 --out "$tmp/x.npy"

check "missing model folder" "1 2" "no-such-model" -- "$tandem" logits --model "$tmp/no-such-model" --ids 1 --out "$tmp/x.npy"
check "id beyond vocab" "1 2" "outside the vocabulary" -- "$tandem" logits --model "$fx" --ids 1,99999 --out "$tmp/x.npy"
check "prefill beyond ids" "2" "--prefill 5" -- "$tandem" logits --model "$fx" --ids 1,2 --prefill 5 --out "$tmp/x.npy"
check "bad id text" "2" "'x7' is not a token id" -- "$tandem" logits --model "$fx" --ids 1,x7 --out "$tmp/x.npy"
check "unknown flag" "2" "did you mean '--prefill'" -- "$tandem" logits --model "$fx" --ids 1 --prefil 1 --out "$tmp/x.npy"
check "unknown device" "2" "--device must be one of" -- "$tandem" logits --model "$fx" --ids 1 --device tpu --out "$tmp/x.npy"
check "bad --experts-format" "2" "--experts-format must be auto or int4" -- "$tandem" logits --model "$fx" --ids 1 --experts-format int3 --out "$tmp/x.npy"
check "bad --kv-format" "2" "--kv-format: 'int4' must be bf16, int8 or fp8" -- "$tandem" logits --model "$fx" --ids 1 --kv-format int4 --out "$tmp/x.npy"
check "bad --dense-format" "1" "--dense-format: 'int4' must be bf16, int8 or fp8" -- "$tandem" logits --model "$fx" --ids 1 --device gpu --dense-format int4 --out "$tmp/x.npy"
check "--dense-format int8 on the CPU" "1" "--dense-format int8 quantizes projections for the GPU (--device gpu or hybrid); --device cpu runs them as stored" -- "$tandem" logits --model "$fx" --device cpu --ids 1 --dense-format int8 --out "$tmp/x.npy"
check "bad --draft-lm-head" "2" "--draft-lm-head: 'int4' must be bf16, int8 or fp8" -- "$tandem" logits --model "$fx" --ids 1 --draft-lm-head int4 --out "$tmp/x.npy"
check "--draft-lm-head int8 on the CPU" "1" "--draft-lm-head int8 quantizes projections for the GPU (--device gpu or hybrid); --device cpu runs them as stored" -- "$tandem" logits --model "$fx" --device cpu --ids 1 --draft-lm-head int8 --out "$tmp/x.npy"
check "--kv-format fp8 on the CPU" "0" "KV cache fp8 (codes and a scale per position and KV head" -- "$tandem" logits --model "$fx" --device cpu --ids 1,2,3 --kv-format fp8 --out "$tmp/x.npy"
check "--experts-format int4 on a model without an int4 group" "1" "experts (hidden 48, intermediate 16) have no int4 group" -- "$tandem" logits --model "$fx" --device cpu --ids 1 --experts-format int4 --quant-cache "$tmp/qc" --out "$tmp/x.npy"
check "--experts-format int4 with a cache folder that cannot be made" "1" "cannot create the int4 cache folder.*--quant-cache" -- "$tandem" logits --model "$data/demo" --device cpu --ids 1 --experts-format int4 --quant-cache "$data/demo/config.json/cache" --out "$tmp/y.npy"
check "info before the int4 cache is made" "0" "int4 .*120 expert matrices in groups of 64, not cached yet" -- bash -c "'$tandem' info --model '$data/demo' --quant-cache '$tmp/qc' 1>&2"
check "--experts-format int4 on the demo model" "0" "routed experts and the MTP head's as int4" -- "$tandem" logits --model "$data/demo" --device cpu --ids 1,2,3 --experts-format int4 --quant-cache "$tmp/qc" --out "$tmp/y.npy"
check "info after" "0" "int4 .*120 expert matrices in groups of 64, cached in $tmp/qc/int4-" -- bash -c "'$tandem' info --model '$data/demo' --quant-cache '$tmp/qc' 1>&2"
if "$tandem" info | grep -q "no CUDA device"; then
  check "gpu without a device" "1" "no CUDA device" -- "$tandem" logits --model "$fx" --ids 1 --device gpu --out "$tmp/x.npy"
else
  for d in "$data"/*/; do
    d=${d%/}
    [ -f "$d/reference.json" ] || continue
    check "gpu logits $(basename "$d") within 2e-2" "0" "OK" -- "$tandem" logits --model "$d" --ids "$(ids_of "$d")" \
      --prefill "$(prefill_of "$d")" --device gpu --compare "$d/logits.npy" --tol 2e-2
    # every kernel launched eagerly (the default runs each decode step as one CUDA graph)
    check "gpu logits $(basename "$d") --eager" "0" "OK" -- "$tandem" logits --model "$d" --ids "$(ids_of "$d")" \
      --prefill "$(prefill_of "$d")" --device gpu --eager --compare "$d/logits.npy" --tol 2e-2
  done
  check "gpu budget too small" "1" "raise --gpu-mem" -- "$tandem" logits --model "$fx" --ids 1 --device gpu --gpu-mem 1MiB --out "$tmp/x.npy"
fi
check "unknown command" "2" "did you mean 'logits'" -- "$tandem" logit

# Text in, text out on a synthesized tiny model (real tokenizer, chat template, sampling).
"$tandem" synth --preset tiny --out "$tmp/tiny" >/dev/null 2>&1 || { echo "FAIL synth tiny"; failures=$((failures + 1)); }
gen() { "$tandem" generate --model "$tmp/tiny" --max-new-tokens 24 "$@" 2>/dev/null; }
a=$(gen --prompt "The sea is" --temperature 0); b=$(gen --prompt "The sea is" --temperature 0)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   greedy generation is deterministic"; passes=$((passes + 1));
else echo "FAIL greedy generation differs between runs"; failures=$((failures + 1)); fi
a=$(gen --prompt "Hello" --seed 7 --preset instruct); b=$(gen --prompt "Hello" --seed 7 --preset instruct)
c=$(gen --prompt "Hello" --seed 8 --preset instruct)
if [ "$a" = "$b" ] && [ "$a" != "$c" ]; then echo "ok   seeded sampling reproduces (and the seed matters)"; passes=$((passes + 1));
else echo "FAIL seeded sampling: '$a' / '$b' / '$c'"; failures=$((failures + 1)); fi
full=$(gen --prompt "The sea is" --temperature 0)
stop=${full:6:4}
cut=$(gen --prompt "The sea is" --temperature 0 --stop "$stop")
if [ -n "$stop" ] && [ "$cut" = "${full%%"$stop"*}" ]; then echo "ok   --stop ends the text before the stop string"; passes=$((passes + 1));
else echo "FAIL --stop '$stop': got '$cut' from '$full'"; failures=$((failures + 1)); fi
check "generate stats line" "0" "prefill .* tok/s .* decode .* tok/s" -- "$tandem" generate --model "$tmp/tiny" --prompt hi --chat --max-new-tokens 4
check "chat REPL: two turns, reset, Ctrl-D" "0" "stop:" -- bash -c "printf 'hi\n/reset\nhello again\n' | '$tandem' chat --model '$tmp/tiny' --max-new-tokens 4 --temperature 0"
# A model folder with its own chat template: one note line when it is not the Qwen3.5 one Tandem renders.
mkdir -p "$tmp/tiny_tmpl" && ln -sf "$tmp/tiny"/* "$tmp/tiny_tmpl/" && printf '{{ messages }}\n' >"$tmp/tiny_tmpl/chat_template.jinja"
check "chat notes a different model template" "0" "^note: .*/chat_template.jinja differs from the Qwen3.5 template" -- bash -c "printf 'hi\n' | '$tandem' chat --model '$tmp/tiny_tmpl' --max-new-tokens 2 --temperature 0"
if "$tandem" generate --model "$tmp/tiny" --prompt hi --chat --max-new-tokens 2 2>&1 >/dev/null | grep -q "^note:"; then
  echo "FAIL a folder without a chat template got a note"; failures=$((failures + 1));
else echo "ok   no template note without a folder template"; passes=$((passes + 1)); fi
text='Hello, world! Grüße — 你好 🙂'
ids=$("$tandem" tokenize --model "$tmp/tiny" --text "$text" 2>/dev/null)
back=$("$tandem" detokenize --model "$tmp/tiny" --ids "$ids" 2>/dev/null)
if [ -n "$ids" ] && [ "$back" = "$text" ]; then echo "ok   tokenize / detokenize round trip"; passes=$((passes + 1));
else echo "FAIL tokenize round trip: '$ids' -> '$back'"; failures=$((failures + 1)); fi
# tandem bench: one JSON object with the fields the issue names, all positive where they must be.
"$tandem" bench --model "$tmp/tiny" --device cpu --prompt-len 8,16 --gen 4 --repeat 2 --json >"$tmp/bench.json" 2>"$tmp/bench.err"
if python3 - "$tmp/bench.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("prefill_tok_s", "decode_tok_s", "ttft_ms", "peak_host_bytes", "bound_decode_tok_s"):
    assert j[k] > 0, k
assert j["peak_vram_bytes"] == 0 and len(j["results"]) == 2
assert j["eager"] is False, j["eager"]
for r in j["results"]:
    assert r["prefill_tok_s_min"] <= r["prefill_tok_s"] <= r["prefill_tok_s_max"]
    assert r["itl_p50_ms"] <= r["itl_p99_ms"]
PY
then echo "ok   bench --json fields"; passes=$((passes + 1)); else echo "FAIL bench --json"; cat "$tmp/bench.err"; failures=$((failures + 1)); fi
# bench --verify-cost: per draft count the verification, draft and rollback times, and the speed-ups
# they imply (a rollback after the steps that reject a draft, 1 - a^k of them).
"$tandem" bench --model "$tmp/tiny" --device cpu --prompt-len 16 --repeat 2 --verify-cost 1,2 --draft 2 --json >"$tmp/vc.json" 2>"$tmp/vc.err"
if python3 - "$tmp/vc.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert [r["drafts"] for r in j["verify"]] == [1, 2]
for r in j["verify"]:
    k = r["drafts"]
    assert r["verify_ms"] > 0 and r["draft_ms"] > 0 and r["rollback_ms"] >= 0, r
    for a in (0.6, 0.8, 0.9):
        tokens = (1 - a ** (k + 1)) / (1 - a)
        want = tokens * j["decode_ms"] / (r["verify_ms"] + r["draft_ms"] + (1 - a ** k) * r["rollback_ms"])
        assert abs(r["speedup_at_acceptance"][str(a)] - want) < 1e-9 * want, (a, r)
PY
then echo "ok   bench --verify-cost fields"; passes=$((passes + 1)); else echo "FAIL bench --verify-cost"; cat "$tmp/vc.err"; failures=$((failures + 1)); fi
# --prompts: windows of a text file's tokens instead of random ids (shorter than the prompt: cycled).
printf 'the model routes every token to eight experts\n' >"$tmp/prompts.txt"
check "bench --prompts" "0" "" -- "$tandem" bench --model "$tmp/tiny" --device cpu --prompt-len 24 --gen 3 --repeat 2 --prompts "$tmp/prompts.txt" --json
grep -q '"prompts": ".*prompts.txt"' "$tmp/out" || { echo "FAIL bench --prompts: the JSON does not name the file"; failures=$((failures + 1)); }
check "bench --prompts missing" "1" "cannot open the prompts file" -- "$tandem" bench --model "$tmp/tiny" --device cpu --prompts "$tmp/none.txt"
: >"$tmp/empty.txt"
check "bench --prompts empty" "1" "has no text" -- "$tandem" bench --model "$tmp/tiny" --device cpu --prompts "$tmp/empty.txt"
# --follow-text: decode steps fed the text's next tokens (needs --prompts).
check "bench --follow-text" "0" "" -- "$tandem" bench --model "$tmp/tiny" --device cpu --prompt-len 8 --gen 4 --repeat 1 --prompts "$tmp/prompts.txt" --follow-text --json
grep -q '"decode_tokens": "the text.s next tokens' "$tmp/out" || { echo "FAIL bench --follow-text: the JSON does not say what decode was fed"; failures=$((failures + 1)); }
check "bench --follow-text without --prompts" "2" "needs --prompts" -- "$tandem" bench --model "$tmp/tiny" --device cpu --follow-text
check "generate without prompt" "2" "missing required option '--prompt'" -- "$tandem" generate --model "$tmp/tiny"
check "bad temperature" "2" "temperature" -- "$tandem" generate --model "$tmp/tiny" --prompt x --temperature -1
check "unknown preset" "2" "unknown sampling preset" -- "$tandem" generate --model "$tmp/tiny" --prompt x --preset wild
check "no-think without chat" "2" "need --chat" -- "$tandem" generate --model "$tmp/tiny" --prompt x --no-think

# tandem plan / profile: the plan as JSON with the issue's fields, without a GPU or weight files; a budget
# below the minimum exits 1 naming the minimum; YAML errors name file:line; a heat map from profile feeds it.
"$tandem" synth --preset qwen3.5-35b-a3b --quant gptq-int4 --config-only --out "$tmp/q35" >/dev/null 2>&1
"$tandem" plan --model "$tmp/q35" --config "$configs/12gb.yaml" --json --no-measure >"$tmp/plan.json" 2>"$tmp/plan.err"
if python3 - "$tmp/plan.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("budget_bytes", "vram_total_bytes", "vram_bytes", "experts_on_gpu", "expected_gpu_expert_fraction", "predicted_decode_tok_s"):
    assert k in j, k
assert j["budget_bytes"] == 12 * 2**30 and j["vram_total_bytes"] <= j["budget_bytes"]
assert len(j["experts_on_gpu"]) == 40 and 0 < sum(j["experts_on_gpu"]) < 40 * 256
assert 0 < j["expected_gpu_expert_fraction"] < 1 and j["predicted_decode_tok_s"] > 0
assert sum(j["vram_bytes"].values()) == j["vram_total_bytes"] and not j["embed_on_gpu"]
PY
then echo "ok   plan --json fields"; passes=$((passes + 1)); else echo "FAIL plan --json"; cat "$tmp/plan.err"; failures=$((failures + 1)); fi
check "plan table" "0" "" -- "$tandem" plan --model "$tmp/q35" --gpu-mem 16GiB --no-measure
grep -q "predicted decode" "$tmp/out" && grep -q "routed experts" "$tmp/out" || { echo "FAIL plan table content"; failures=$((failures + 1)); }
check "plan below minimum" "1" "below the minimum of 5.3. GiB" -- "$tandem" plan --model "$tmp/q35" --gpu-mem 3GiB --no-measure
printf 'gpu:\n  memory: 8GiB\nexperts:\n  selct: uniform\n' >"$tmp/bad.yaml"
check "plan yaml unknown key" "1" "bad.yaml:4: unknown key 'experts.selct' (did you mean 'select'?)" -- "$tandem" plan --model "$tmp/q35" --config "$tmp/bad.yaml"
check "auto device line" "0" "tandem: --device auto chose " -- "$tandem" logits --model "$tmp/tiny" --ids 1,2 --out "$tmp/x.npy"
# No YAML: the planner picks the context (the longest whose KV cache takes a quarter of the room) and says so.
"$tandem" plan --model "$tmp/q35" --gpu-mem 24GiB --no-measure >"$tmp/out" 2>&1
if grep -q "context 245760" "$tmp/out" && grep -q "auto: the KV cache" "$tmp/out"; then echo "ok   plan context auto"; passes=$((passes + 1));
else echo "FAIL plan context auto"; head -4 "$tmp/out"; failures=$((failures + 1)); fi
check "config without hybrid" "2" "applies to --device hybrid" -- "$tandem" logits --model "$tmp/tiny" --device cpu --ids 1,2 --out "$tmp/x.npy" --config "$configs/8gb.yaml"
# --device auto (the default): hybrid on a GPU this build can use, else cpu; one line says which.
if ! "$tandem" info | grep -q "device(s)"; then  # where a GPU exists these run (tests/gpu covers them)
  check "auto without GPU" "0" "device auto chose cpu: no CUDA device" -- "$tandem" logits --model "$tmp/tiny" --ids 1,2 --out "$tmp/x.npy"
  check "hybrid without GPU" "1" "no CUDA device" -- "$tandem" logits --model "$tmp/tiny" --ids 1,2 --out "$tmp/x.npy" --device hybrid --gpu-mem 1GiB
  check "plan without budget" "1" "no GPU memory budget" -- "$tandem" plan --model "$tmp/q35" --no-measure
fi
printf 'The quick brown fox\nOnce upon a time there was a model\n\nmixture of experts\n' >"$tmp/prompts.txt"
check "profile" "0" "" -- "$tandem" profile --model "$tmp/tiny" --prompts "$tmp/prompts.txt" --out "$tmp/heat.yaml" --gen 2
if python3 - "$tmp/heat.yaml" "$tmp/out" <<'PY'
import sys, re
text = open(sys.argv[1]).read()
rows = [r for r in text.splitlines() if r.startswith("  - [")]
counts = [list(map(int, r[5:-1].split(","))) for r in rows]
tokens = int(re.search(r"^tokens: (\d+)", text, re.M).group(1))
top_k = int(re.search(r"^top_k: (\d+)", text, re.M).group(1))
assert len(rows) == 4 and all(len(c) == 16 for c in counts), (len(rows), [len(c) for c in counts])
assert tokens > 6 and all(sum(c) == tokens * top_k for c in counts), (tokens, [sum(c) for c in counts])
out = open(sys.argv[2]).read()
assert "hottest 20% of experts take" in out
# the early guess (a layer's router on its input): shares that order as they must
m = re.search(r"foresees ([\d.]+)% of its top-(\d+) \(([\d.]+)-([\d.]+)% by layer; ([\d.]+)% within its top-(\d+); ([\d.]+)% from", out)
assert m, out
share, lo, hi, wide, host = float(m[1]), float(m[3]), float(m[4]), float(m[5]), float(m[7])
assert int(m[6]) == 2 * int(m[2]) == 2 * top_k, m.groups()
assert 0 <= lo <= share <= hi <= 100 and share <= wide <= 100 and 0 <= host <= 100, m.groups()
PY
then echo "ok   profile heat map counts"; passes=$((passes + 1)); else echo "FAIL profile heat map"; failures=$((failures + 1)); fi
printf 'gpu:\n  memory: 1GiB\nexperts:\n  heat: heat.yaml\n' >"$tmp/withheat.yaml"
check "plan with heat" "0" "" -- "$tandem" plan --model "$tmp/tiny" --config "$tmp/withheat.yaml" --no-measure
grep -q "(heat map)" "$tmp/out" || { echo "FAIL plan with heat: heat map not used"; failures=$((failures + 1)); }

# --trace: a Chrome/Perfetto timeline with the forward calls and the CPU expert jobs of every layer.
check "trace" "0" "" -- "$tandem" generate --model "$tmp/tiny" --device cpu --prompt "hello" --max-new-tokens 3 --temperature 0 --trace "$tmp/trace.json"
if python3 - "$tmp/trace.json" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
names = [e["name"] for e in ev]
assert sum(n.startswith("forward (decode)") for n in names) == 2 and sum(n.startswith("forward (prefill)") for n in names) == 1, names
assert sum(n.startswith("cpu experts, layer") for n in names) == 3 * 4, names   # 3 forward calls x 4 layers
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev)
PY
then echo "ok   trace events"; passes=$((passes + 1)); else echo "FAIL trace events"; failures=$((failures + 1)); fi
# tools/trace_plot.py reads the same file: the last decode step, its CPU expert lane.
check "trace plot" "0" "" -- python3 "$src/tools/trace_plot.py" "$tmp/trace.json" "$tmp/step.png" --text-only
grep -q "decode step 2 of 2" "$tmp/out" && grep -q "host thread .*: cpu" "$tmp/out" ||
  { echo "FAIL trace plot: no last decode step with a CPU expert lane"; cat "$tmp/out"; failures=$((failures + 1)); }
check "trace plot, too few steps" "1" "has 2 decode steps" -- python3 "$src/tools/trace_plot.py" "$tmp/trace.json" "$tmp/step.png" --step 5 --text-only
check "trace unwritable" "1" "cannot write the trace" -- "$tandem" generate --model "$tmp/tiny" --device cpu --prompt "hi" --max-new-tokens 1 --trace /nonexistent/dir/t.json

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]

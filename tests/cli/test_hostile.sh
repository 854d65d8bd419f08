#!/usr/bin/env bash
# The tandem CLI against a hostile user (issue 29): output to a full disk or a closed pipe, thread counts
# and integers past what they fit in, files that are devices, FIFOs or symlink loops, a disk that fills
# up under synth, and the smaller cases (context checks, binary bytes in messages, chat's over-long turn,
# a cancelled generate's exit code). Every bad input: exit 1 or 2 with one clear line on stderr.
tandem="$1"
data="$2"
source "$(dirname "$0")/common.sh"

ok() { echo "ok   $1"; passes=$((passes + 1)); }
bad() { echo "FAIL $1"; failures=$((failures + 1)); }

# A copy of model folder $1 at $2 (weights linked) with python code $3 applied to its JSON files `c`
# (config.json), `g` (generation_config.json), `t` (tokenizer.json).
variant() {
  mkdir -p "$2"
  for f in "$1"/*; do ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$2/"; done
  rm "$2/config.json" "$2/generation_config.json" "$2/tokenizer.json"
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
src, dst, code = sys.argv[1:]
c, g, t = (json.load(open(f"{src}/{n}", encoding="utf-8")) for n in ("config.json", "generation_config.json", "tokenizer.json"))
exec(code)
for n, j in (("config.json", c), ("generation_config.json", g), ("tokenizer.json", t)):
    json.dump(j, open(f"{dst}/{n}", "w", encoding="utf-8"))
PY
}

"$tandem" synth --preset tiny --out "$tmp/tiny" >/dev/null 2>&1 || bad "synth tiny"
m="$tmp/tiny"
run=(--model "$m" --device cpu)

# 5. Output that cannot be written is an error (exit 1), not an empty file and exit 0; a closed pipe is quiet.
check "plan --json to a full disk" "1" "writing to standard output: No space left on device" -- \
  bash -c "'$tandem' plan --model '$m' --gpu-mem 1GiB --no-measure --json >/dev/full"
check "info to a full disk" "1" "writing to standard output" -- bash -c "'$tandem' info --model '$m' >/dev/full"
check "tokenize to a full disk" "1" "writing to standard output" -- bash -c "'$tandem' tokenize --model '$m' --text hello >/dev/full"
check "detokenize to a full disk" "1" "writing to standard output" -- bash -c "'$tandem' detokenize --model '$m' --ids 1,2,3 >/dev/full"
check "generate to a full disk" "1" "writing to standard output" -- \
  bash -c "'$tandem' generate ${run[*]} --prompt hello --max-new-tokens 64 --temperature 0 >/dev/full"
yes "the quick brown fox" | head -c 300000 >"$tmp/long.txt"
check "tokenize, large output to a full disk" "1" "writing to standard output" -- \
  bash -c "'$tandem' tokenize --model '$m' --file '$tmp/long.txt' >/dev/full"
# The reader is gone before tandem writes: no message, exit 141 (as a process SIGPIPE ended).
for cmd in "tokenize --model $m --file $tmp/long.txt" "plan --model $m --gpu-mem 1GiB --no-measure --json"; do
  { sleep 0.5; "$tandem" $cmd 2>"$tmp/pipe.err"; echo $? >"$tmp/pipe.rc"; } | true
  if [ "$(cat "$tmp/pipe.rc")" = 141 ] && [ ! -s "$tmp/pipe.err" ]; then ok "closed pipe is quiet: ${cmd%% *}";
  else bad "closed pipe: ${cmd%% *}: exit $(cat "$tmp/pipe.rc"), stderr: $(cat "$tmp/pipe.err")"; fi
done

# 2. --threads is capped like cpu.threads; a thread that cannot start is an error, not a crash.
check "--threads 100000, ref" "2" "--threads: 100000 is out of range (1..4096)" -- "$tandem" logits --model "$m" --device ref --ids 1,2 --out "$tmp/x.npy" --threads 100000
check "--threads 100000, cpu" "2" "--threads: 100000 is out of range (1..4096)" -- "$tandem" logits "${run[@]}" --ids 1,2 --out "$tmp/x.npy" --threads 100000
check "--threads past 2^32" "2" "4294967298 is out of range" -- "$tandem" logits "${run[@]}" --ids 1,2 --out "$tmp/x.npy" --threads 4294967298
check "--threads past int64" "2" "is out of range" -- "$tandem" logits "${run[@]}" --ids 1,2 --out "$tmp/x.npy" --threads 99999999999999999999
# 4096 threads of 8 MiB stacks do not fit in 2 GiB of address space: the pool cannot start them all.
check "threads that cannot start" "1" "cannot start worker thread" -- \
  bash -c "ulimit -v 2000000; exec '$tandem' logits ${run[*]} --ids 1,2 --out '$tmp/x.npy' --threads 4096"

# 3. Integers past 32 bits are errors naming the key or flag, never their low bits.
variant "$m" "$tmp/e32" 't=t; c["text_config"]["num_experts"] = 2**32 + 16'
check "config num_experts 2^32+16" "1" "text_config.num_experts: 4294967312 is out of range" -- "$tandem" logits --model "$tmp/e32" --device cpu --ids 1,2 --out "$tmp/x.npy"
variant "$m" "$tmp/e12" 'c["text_config"]["num_experts"] = 10**12'
check "config num_experts 10^12" "1" "num_experts: 1000000000000 is out of range" -- "$tandem" info --model "$tmp/e12"
variant "$m" "$tmp/gk" 'g["top_k"] = 2**32 + 20'
check "generation_config top_k 2^32+20" "1" "generation_config.json: top_k: 4294967316 is out of range" -- "$tandem" generate --model "$tmp/gk" --device cpu --prompt hi --max-new-tokens 2
check "--top-k 2^32+20" "2" "--top-k: 4294967316 is out of range" -- "$tandem" generate "${run[@]}" --prompt hi --top-k 4294967316
check "--defer-experts 2^32+1" "2" "--defer-experts: 4294967297 is out of range" -- "$tandem" logits "${run[@]}" --ids 1,2 --out "$tmp/x.npy" --defer-experts 4294967297

# 6. Only regular files are read, with a size cap: /dev/zero fails at once, a FIFO does not hang.
variant "$m" "$tmp/zero" 'pass'
ln -sf /dev/zero "$tmp/zero/config.json"
check "config.json is /dev/zero" "1" "config.json: cannot read the model config: it is a character device" -- timeout 20 "$tandem" info --model "$tmp/zero"
variant "$m" "$tmp/fifo" 'pass'
rm "$tmp/fifo/config.json" && mkfifo "$tmp/fifo/config.json"
check "config.json is a FIFO" "1" "config.json: cannot read the model config: it is a FIFO" -- timeout 20 "$tandem" info --model "$tmp/fifo"
variant "$m" "$tmp/tokzero" 'pass'
ln -sf /dev/zero "$tmp/tokzero/tokenizer.json"
check "tokenizer.json is /dev/zero" "1" "tokenizer.json: cannot read the tokenizer file: it is a character device" -- timeout 20 "$tandem" tokenize --model "$tmp/tokzero" --text hi
printf 'gpu:\n  memory: 1GiB\n' >"$tmp/ok.yaml"
check "placement YAML is /dev/zero" "1" "cannot read the placement config: it is a character device" -- timeout 20 "$tandem" plan --model "$m" --config /dev/zero --no-measure
check "--file on a directory" "1" "cannot read the --file text: it is a directory" -- "$tandem" tokenize --model "$m" --file "$tmp"
check "--ids @FIFO" "1" "cannot read the ids file: it is a FIFO" -- timeout 20 "$tandem" detokenize --model "$m" --ids "@$tmp/fifo/config.json"

# 7. synth on a full disk (RLIMIT_FSIZE, SIGXFSZ ignored) leaves nothing loadable under final names.
for kib in 60 4000; do  # 60 KiB: tokenizer.json cannot be written; 4000 KiB: the 8.7 MB weights cannot
  rm -rf "$tmp/full"
  check "synth on a full disk ($kib KiB)" "1" "File too large" -- bash -c "ulimit -f $kib; trap '' XFSZ; exec '$tandem' synth --preset tiny --out '$tmp/full'"
  left=$(ls -A "$tmp/full" 2>/dev/null)
  if [ -z "$left" ]; then ok "synth on a full disk ($kib KiB) removed what it wrote"; else bad "synth on a full disk ($kib KiB) left: $left"; fi
done

# 8. The smaller ones.
variant "$m" "$tmp/ctx4" 'c["text_config"]["max_position_embeddings"] = 4'
check "logits checks the context" "1" "6 ids exceed the context of 4 tokens" -- "$tandem" logits --model "$tmp/ctx4" --device cpu --ids 1,2,3,4,5,6 --out "$tmp/x.npy"
check "generate checks the context" "1" "exceeds the context of 4 tokens" -- "$tandem" generate --model "$tmp/ctx4" --device cpu --prompt "hello there" --max-new-tokens 8
ln -s loop_b "$tmp/loop_a" && ln -s loop_a "$tmp/loop_b"
check "model folder is a symlink loop" "1" "symlink loop" -- "$tandem" info --model "$tmp/loop_a"
variant "$m" "$tmp/gdir" 'pass'
rm "$tmp/gdir/generation_config.json" && mkdir "$tmp/gdir/generation_config.json"
check "generation_config.json is a directory" "1" "generation_config.json: cannot read the generation config: it is a directory" -- "$tandem" generate --model "$tmp/gdir" --device cpu --prompt hi
if [ "$(id -u)" -ne 0 ]; then  # root reads any file
  variant "$m" "$tmp/gperm" 'pass'
  cp --remove-destination "$m/generation_config.json" "$tmp/gperm/" && chmod 000 "$tmp/gperm/generation_config.json"
  check "unreadable generation_config.json" "1" "Permission denied" -- "$tandem" generate --model "$tmp/gperm" --device cpu --prompt hi
fi
variant "$m" "$tmp/bin" 'pass'
printf '\x89PNG\r\n\x1a\n\xff\xfe\x00binary' >"$tmp/bin/config.json.new" && mv "$tmp/bin/config.json.new" "$tmp/bin/config.json"
check "binary config.json" "1" "not valid JSON" -- "$tandem" info --model "$tmp/bin"
if LC_ALL=C grep -q $'[\x80-\xff]' "$tmp/err"; then bad "the message echoes raw bytes: $(od -c "$tmp/err" | head -3)"; else ok "binary bytes are escaped"; fi
python3 -c "print('gpu:\n  memory: ' + 'x' * 10_000_000)" >"$tmp/huge.yaml"
check "10 MB YAML value" "1" "huge.yaml:2: key 'gpu.memory'" -- "$tandem" plan --model "$m" --config "$tmp/huge.yaml" --no-measure
if [ "$(wc -c <"$tmp/err")" -lt 2000 ]; then ok "the 10 MB value is cut"; else bad "the message is $(wc -c <"$tmp/err") bytes"; fi
# chat: a turn past the context is reported and the conversation goes on.
long=$(printf 'word %.0s' $(seq 1 40))
printf '%s\nhi\n' "$long" | "$tandem" chat --model "$tmp/ctx4" --device cpu --max-new-tokens 1 --temperature 0 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && grep -q "exceeds the context of 4 tokens" "$tmp/err" && grep -q "turn was dropped" "$tmp/err"; then
  ok "chat keeps the conversation after an over-long turn"; else bad "chat over-long turn: exit $rc"; cat "$tmp/err"; fi
# A cancelled generate exits 130 (no eos ids at all, so only SIGINT ends it early).
variant "$m" "$tmp/noeos" 'c["text_config"]["eos_token_id"] = []; c.pop("eos_token_id", None); g["eos_token_id"] = []
for a in t["added_tokens"]:
    if a["content"] in ("<|im_end|>", "<|endoftext|>"): a["content"] = a["content"].replace("|>", "_off|>")'
"$tandem" generate --model "$tmp/noeos" --device cpu --threads 1 --prompt hello --temperature 0 --max-new-tokens 200000 >/dev/null 2>"$tmp/err" &
pid=$!
sleep 1.5
kill -INT $pid
wait $pid
rc=$?
if [ $rc -eq 130 ] && grep -q "stop: cancelled" "$tmp/err"; then ok "a cancelled generate exits 130"; else bad "cancelled generate: exit $rc"; cat "$tmp/err"; fi

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]

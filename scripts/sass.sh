#!/usr/bin/env bash
# A CUDA source's machine code on this machine (no GPU needed): compiles FILE.cu as the build does for one
# architecture (default sm_90), prints each kernel's registers, stack and spills (ptxas), and for the
# kernels whose mangled name matches REGEX the SASS instruction mix (loads, stores, spills, barriers, math,
# per kernel; for a kernel that waits for the kernel before it, how many 16-byte loads it issues before
# the wait) and the listing itself in $OUT_DIR (default /tmp/sass). cuobjdump and nvdisasm, which the
# toolkit here lacks, come once from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) into .cache/sass-tools.
#
# usage: scripts/sass.sh gpu_core/moe_int4_wide.cu [REGEX] [ARCH]
#   e.g. scripts/sass.sh gpu_core/attention_decode.cu attend_group_kernel
# FILE is a path in the tree that holds this copy of the script, whatever the current directory: to
# compare with another tree (.base), run that tree's copy (bash .base/scripts/sass.sh FILE).
set -euo pipefail
src="$1" regex="${2:-.}" arch="${3:-sm_90}"
here=$(cd "$(dirname "$0")/.." && pwd)
tools="$here/.cache/sass-tools" out="${OUT_DIR:-/tmp/sass}"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ ! -x "$tools/bin/nvdisasm" ]; then
  mkdir -p "$tools/wheels" "$tools/bin"
  python3 -m pip download -q --no-deps -d "$tools/wheels" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  for w in "$tools"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tools/unpacked"; done
  for b in cuobjdump nvdisasm; do cp "$(find "$tools/unpacked" -name "$b" -type f | head -1)" "$tools/bin/$b"; chmod +x "$tools/bin/$b"; done
fi
export PATH="$tools/bin:$PATH"
mkdir -p "$out"
obj="$out/$(basename "$src" .cu).$arch.o"
"$nvcc" -std=c++20 --expt-relaxed-constexpr -O3 -I"$here" -I"$here/runtime" -arch="$arch" -Xptxas -v -c "$here/$src" -o "$obj" 2> "$out/ptxas.txt"
cuobjdump -sass "$obj" > "$out/all.sass"
python3 - "$out" "$regex" "$here/scripts" <<'PY'
import collections, os, re, subprocess, sys
out, regex, scripts = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, scripts)
from kernel_steps import short as short_name  # the name as the ncu tables print it
def short(mangled):
    return short_name(subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip() or mangled)
# ptxas: registers, stack and spills a kernel
name = None
print("| kernel | registers | stack B | spill stores / loads B |")
print("|---|---:|---:|---|")
for line in open(out + "/ptxas.txt"):
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m: name = m.group(1); continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name: frame = m.groups(); continue
    m = re.search(r"Used (\d+) registers", line)
    if m and name and re.search(regex, name):
        print("| %s | %s | %s | %s / %s |" % (short(name), m.group(1), frame[0], frame[1], frame[2])); name = None
# SASS: the instruction mix a kernel, and its listing
groups = {"global loads": r"^LDG", "global stores": r"^(STG|RED|ATOM)", "shared": r"^(LDS|STS|LDSM)", "local (spills)": r"^(LDL|STL)",
          "barriers": r"^(BAR|WARPSYNC)", "shuffles/votes": r"^(SHFL|VOTE|MATCH|REDUX)", "tensor core": r"^(HMMA|IMMA|HGMMA)",
          "integer dot": r"^(IDP|IDP4A)", "fp32": r"^(FFMA|FADD|FMUL|FMNMX|MUFU)", "int/logic": r"^(IMAD|IADD|LOP|SHF|LEA|PRMT|ISETP|SEL|I2F|F2I|F2F)"}
for fn, body in re.findall(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", open(out + "/all.sass").read(), re.S):
    if not re.search(regex, fn): continue
    ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)]
    base = collections.Counter(o.split(".")[0] for o in ops)
    mix = {g: sum(n for o, n in base.items() if re.match(p, o)) for g, p in groups.items()}
    open("%s/%s.sass" % (out, fn[:150]), "w").write(body)
    print("\n%s: %d instructions; %s" % (short(fn), len(ops), ", ".join("%s %d" % (g, n) for g, n in mix.items() if n)))
    if "ACQBULK" in ops:  # griddepcontrol.wait (pdl.cuh): the weight loads a PDL-launched kernel issues before it
        w = ops.index("ACQBULK")
        print("  griddepcontrol.wait (ACQBULK) at instruction %d; 16-byte global loads before it: %d"
              % (w, sum(1 for o in ops[:w] if o.startswith("LDG") and ".128" in o)))
PY
echo "(listings: $out/<mangled name>.sass)"

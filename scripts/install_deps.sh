#!/usr/bin/env bash
# Installs what Tandem needs to build and test, from Debian packages (and PyPI for Python test tools).
# Idempotent: does nothing when everything is already present, so `make` targets can call it each time.
set -euo pipefail

debs=(
  cmake ninja-build ccache g++ clang libclang-rt-dev pkg-config make
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libyaml-cpp-dev libhwloc-dev libdnnl-dev libomp-dev
  libicu-dev pybind11-dev python3-dev libcpp-httplib-dev
  ocl-icd-opencl-dev opencl-headers  # libdnnl-dev's CMake config looks for OpenCL
)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "tandem: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python test tools (PyPI): HF `tokenizers` checks that synthesized tokenizer.json files load in the
# reference implementation; numpy reads .npy files in tools/ and is the bindings' array type.
# pytest runs the Python binding tests (bindings/tests); the official openai and anthropic clients
# drive tandem serve in its tests (tests/server).
if ! python3 -c "import tokenizers, numpy, pytest, openai, anthropic" >/dev/null 2>&1; then
  echo "tandem: installing Python test tools (tokenizers, numpy, pytest, openai, anthropic)"
  python3 -m pip install --quiet --disable-pip-version-check tokenizers numpy pytest openai anthropic \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages tokenizers numpy pytest openai anthropic
fi

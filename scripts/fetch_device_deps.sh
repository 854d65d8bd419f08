#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with the Debian packages the GPU machine lacks, for scripts/gpu_session.sh
# to unpack there (the device tool's carry: [".deps"]): oneDNN (and its OpenCL loader) and ICU (headers,
# CMake's FindICU, and the matching runtime library: the machine's own ICU has no headers), cpp-httplib
# for tandem serve (its header needs OpenSSL's headers; the library links libssl3 and brotli).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
icu_runtime=$(apt-cache depends libicu-dev | sed -n 's/.*Depends: \(libicu[0-9][0-9]*\)$/\1/p' | head -1)
apt-get download libdnnl2 libdnnl-dev ocl-icd-libopencl1 libicu-dev "$icu_runtime" \
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli1 2>&1 | grep -v "unsandboxed" || true
ls -1 "$PWD"

# Tandem: top-level driver. `make demo` runs the main job on the embedded default model,
# `make test` builds everything and runs every test. Both install what is missing first.

BUILD_DIR   ?= build
BUILD_TYPE  ?= Release
# CUDA architectures: the GPU in this machine (CMake's `native`) when one is visible, else RTX 30xx /
# 40xx and Hopper (86;89;90). CI passes 90 (fast) and compiles gpu_core for 86;89 beside it (sm8x).
CUDA_ARCHS  ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo native || echo "86;89;90")
JOBS        ?= $(shell nproc)
# Seconds per fuzz target (four targets).
FUZZ_SECONDS ?= 30
# make sanitize: the CPU paths under AddressSanitizer + UBSan (CUDA off), in their own build folder.
ASAN_DIR    ?= build-asan

CMAKE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_CUDA_ARCHITECTURES="$(CUDA_ARCHS)"

.PHONY: all deps configure build test unit fuzz sanitize demo release sm8x clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)

configure: $(BUILD_DIR)/build.ninja

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

unit: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

fuzz: build
	@bash tests/fuzz/run_fuzz.sh $(BUILD_DIR) $(FUZZ_SECONDS)

test: unit fuzz

# Debug asserts at -O1: the cpu_experts suite takes ~6 min on 2 cores (25+ at -O0), and issue 29's type
# defined twice still shows (UBSan in the synth run).
sanitize: deps
	cmake -S . -B $(ASAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DTANDEM_CUDA=OFF -DTANDEM_SANITIZE=ON
	cmake --build $(ASAN_DIR) -j $(JOBS) --target tandem tandem_unit_tests tandem_placement_tests tandem_cpu_experts_tests
	@bash tests/sanitize/run_sanitize.sh $(ASAN_DIR)

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

release:
	$(MAKE) build BUILD_DIR=build-release CUDA_ARCHS="86;89;90"

# The CUDA kernels for RTX 3090 / 4090 (sm_86 / sm_89), compiled alone: CI's check that they build there.
sm8x: deps
	@if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  cmake -S . -B build-sm8x -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="86;89" >/dev/null && \
	  cmake --build build-sm8x -j $(JOBS) --target tandem_gpu_core; \
	else echo "tandem: no nvcc: sm_86 / sm_89 kernels not compiled"; fi

clean:
	rm -rf $(BUILD_DIR)

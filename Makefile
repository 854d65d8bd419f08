# Tandem: top-level driver. `make demo` runs the main job on the embedded default model,
# `make test` builds everything and runs every test. Both install what is missing first.

BUILD_DIR   ?= build
BUILD_TYPE  ?= Release
# CI compiles CUDA for sm_90 only (fast); release builds cover consumer cards too.
CUDA_ARCHS  ?= 90
JOBS        ?= $(shell nproc)
FUZZ_SECONDS ?= 30

CMAKE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_CUDA_ARCHITECTURES="$(CUDA_ARCHS)"

.PHONY: all deps configure build test unit fuzz demo release clean

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

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

release:
	$(MAKE) build BUILD_DIR=build-release CUDA_ARCHS="86;89;90"

clean:
	rm -rf $(BUILD_DIR)

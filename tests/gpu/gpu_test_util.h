// tests/gpu/gpu_test_util.h: device buffers and the skip rule for GPU tests (no device: skip with a message).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace tandem::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define TANDEM_REQUIRE_GPU()                                                        \
  do {                                                                              \
    if (!::tandem::test::have_gpu()) GTEST_SKIP() << "no CUDA device on this machine"; \
  } while (0)

#define CUDA_OK(expr)                                         \
  do {                                                        \
    const cudaError_t e_ = (expr);                            \
    ASSERT_EQ(e_, cudaSuccess) << cudaGetErrorString(e_);     \
  } while (0)

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (cudaMalloc(&ptr, count * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (ptr) cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// Page-locked, mapped host memory for `count` values of T, zeroed (freed with the object).
template <typename T>
struct Pinned {
  T* ptr = nullptr;
  explicit Pinned(size_t count) {
    if (cudaHostAlloc(reinterpret_cast<void**>(&ptr), count * sizeof(T), cudaHostAllocMapped) != cudaSuccess) ptr = nullptr;
    else std::memset(ptr, 0, count * sizeof(T));
  }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  ~Pinned() { cudaFreeHost(ptr); }
};

}  // namespace tandem::test

// The mapped-memory handoff (gpu_core/handoff.cuh): host_post delivers x, ids and weights to host
// memory exactly, then its flag; host_wait_add waits for the host's flag, adds the host's buffer with
// the same fp32 add as copy + add_inplace, and gives up (reporting it) instead of hanging. The fused
// form host_wait_add_rmsnorm_zc as host_wait_add + add_rmsnorm_zc bit for bit (the router GEMV's own
// post: GpuRouterFused.WithItsNormEqualsNormThenRouter).
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "gpu_core/handoff.cuh"
#include "gpu_core/ops.cuh"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using test::Pinned;

TEST(GpuHandoff, PostDeliversThenFlags) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed());
  for (const auto& [nx, nk] : {std::pair{2048, 8}, std::pair{48, 3}, std::pair{5000, 16}}) {
    const auto x = test::random_floats(rng, nx), w = test::random_floats(rng, nk);
    std::vector<int32_t> ids(nk);
    for (int i = 0; i < nk; ++i) ids[i] = static_cast<int32_t>(rng() % 256);
    test::DeviceBuffer<float> dx(x), dw(w);
    test::DeviceBuffer<int32_t> dids(ids);
    Pinned<float> hx(nx), hw(nk);
    Pinned<int32_t> hids(nk);
    Pinned<unsigned> flag(1);
    ASSERT_TRUE(hx.ptr && hw.ptr && hids.ptr && flag.ptr);
    CUDA_OK(gpu::host_post(dx.ptr, nx, dids.ptr, dw.ptr, nk, hx.ptr, hids.ptr, hw.ptr, flag.ptr, 7u, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(*flag.ptr, 7u);
    EXPECT_EQ(std::vector<float>(hx.ptr, hx.ptr + nx), x) << nx;
    EXPECT_EQ(std::vector<float>(hw.ptr, hw.ptr + nk), w) << nk;
    EXPECT_EQ(std::vector<int32_t>(hids.ptr, hids.ptr + nk), ids) << nk;
  }
}

TEST(GpuHandoff, WaitAddWaitsForTheHostThenAddsAsCopyPlusAdd) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed() + 1);
  const int64_t n = 2048;
  const auto dst0 = test::random_floats(rng, n), src = test::random_floats(rng, n);
  test::DeviceBuffer<float> dst(dst0), ref(dst0), copy(n);
  Pinned<float> hsrc(n);
  Pinned<unsigned> flags(2);
  ASSERT_TRUE(hsrc.ptr && flags.ptr);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(gpu::host_wait_add(flags.ptr, 3u, hsrc.ptr, dst.ptr, n, flags.ptr + 1, 10'000'000'000, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the kernel must still be waiting for the flag";
  std::memcpy(hsrc.ptr, src.data(), n * sizeof(float));
  std::atomic_thread_fence(std::memory_order_release);
  *reinterpret_cast<volatile unsigned*>(flags.ptr) = 3u;
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(flags.ptr[1], 0u) << "no timeout";
  CUDA_OK(cudaMemcpy(copy.ptr, src.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(gpu::add_inplace(ref.ptr, copy.ptr, n, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dst.to_host(), ref.to_host());
  // A flag that never comes: the wait gives up after its timeout and says so.
  CUDA_OK(gpu::host_wait_add(flags.ptr, 9u, hsrc.ptr, dst.ptr, n, flags.ptr + 1, 2'000'000, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(flags.ptr[1], 9u);
  CUDA_OK(cudaStreamDestroy(s));
}

// host_wait_add_rmsnorm_zc waits for the host's flag (the stream stays busy until it comes), then gives
// h and y bit for bit as host_wait_add into a followed by add_rmsnorm_zc, leaving a as it was (rows up to
// 4096; longer rows take the two launches, a += src); past its time-out it reports the flag's value.
TEST(GpuHandoff, WaitAddNormEqualsWaitAddThenNorm) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed() + 2);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  for (const int64_t n : {int64_t{2048}, int64_t{48}, int64_t{300}, int64_t{5000}}) {
    const auto h = test::random_floats(rng, n), a = test::random_floats(rng, n), w = test::random_floats(rng, n);
    const auto src = test::random_floats(rng, n);
    test::DeviceBuffer<float> h1(h), h2(h), a1(a), a2(a), dw(w), y1(n), y2(n);
    Pinned<float> hsrc(n);
    Pinned<unsigned> flags(2);
    ASSERT_TRUE(hsrc.ptr && flags.ptr);
    const gpu::HostSum host{flags.ptr, 5u, hsrc.ptr, flags.ptr + 1, 10'000'000'000};
    CUDA_OK(gpu::host_wait_add_rmsnorm_zc(host, h1.ptr, a1.ptr, dw.ptr, n, 1e-6f, y1.ptr, s));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << n << ": the kernel must still be waiting for the flag";
    std::memcpy(hsrc.ptr, src.data(), n * sizeof(float));
    std::atomic_thread_fence(std::memory_order_release);
    *reinterpret_cast<volatile unsigned*>(flags.ptr) = 4u;  // not yet the value it waits for
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << n << ": flag 4 < 5";
    *reinterpret_cast<volatile unsigned*>(flags.ptr) = 5u;
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(flags.ptr[1], 0u) << n << ": no timeout";
    CUDA_OK(gpu::host_wait_add(flags.ptr, 5u, hsrc.ptr, a2.ptr, n, flags.ptr + 1, 10'000'000'000, nullptr));
    CUDA_OK(gpu::add_rmsnorm_zc(h2.ptr, a2.ptr, nullptr, nullptr, dw.ptr, n, 1, 1e-6f, y2.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(h1.to_host(), h2.to_host()) << n;
    EXPECT_EQ(y1.to_host(), y2.to_host()) << n;
    EXPECT_NE(y1.to_host(), std::vector<float>(n, 0.0f)) << n;
    if (n <= 4096) EXPECT_EQ(a1.to_host(), a) << n << ": a is left as it was";
    else EXPECT_EQ(a1.to_host(), a2.to_host()) << n << ": the two launches' a += src";
    // A flag that never comes: the wait gives up after its time-out and says so.
    const gpu::HostSum never{flags.ptr, 9u, hsrc.ptr, flags.ptr + 1, 2'000'000};
    CUDA_OK(gpu::host_wait_add_rmsnorm_zc(never, h1.ptr, a1.ptr, dw.ptr, n, 1e-6f, y1.ptr, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(flags.ptr[1], 9u) << n;
  }
  CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace tandem

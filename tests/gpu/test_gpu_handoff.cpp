// The mapped-memory handoff (gpu_core/handoff.cuh): host_post delivers x, ids and weights to host
// memory exactly, then its flag; host_wait_add waits for the host's flag, adds the host's buffer with
// the same fp32 add as copy + add_inplace, and gives up (reporting it) instead of hanging. The fused
// forms: host_wait_add_rmsnorm_zc as host_wait_add + add_rmsnorm_zc, the router GEMV's own post as
// host_post after it, bit for bit.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "gpu_core/gemv.cuh"
#include "gpu_core/handoff.cuh"
#include "gpu_core/ops.cuh"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// Page-locked, mapped host memory for `count` values of T (freed with the object).
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

// gemv_bf16_router_topk_norm with a HostPost: the device outputs as without it, and the host gets x, ids
// and weights as host_post after the launch would give them, then the flag; three launches in a row (the
// ticket re-arms with the post in the last block).
TEST(GpuHandoff, RouterPostsAsHostPost) {
  TANDEM_REQUIRE_GPU();
  struct Case {
    int64_t N, K;
    int E, k;
  };
  for (const Case c : {Case{1281, 2048, 256, 8}, Case{40, 64, 8, 4}, Case{300, 520, 33, 2}}) {
    std::mt19937 rng(test::test_seed() + 3);
    std::vector<uint16_t> W(c.N * c.K);
    for (auto& v : W) v = f32_to_bf16(std::normal_distribution<float>(0, 0.2f)(rng));
    const auto norm_w = test::random_floats(rng, c.K);
    test::DeviceBuffer<uint16_t> dW(W);
    test::DeviceBuffer<float> dnw(norm_w);
    test::DeviceBuffer<unsigned> t1(std::vector<unsigned>{0u}), t2(std::vector<unsigned>{0u});
    Pinned<float> px(c.K), pw(c.k), rx(c.K), rw(c.k);
    Pinned<int32_t> pids(c.k), rids(c.k);
    Pinned<unsigned> pflag(1), rflag(1);
    ASSERT_TRUE(px.ptr && pw.ptr && rx.ptr && rw.ptr && pids.ptr && rids.ptr && pflag.ptr && rflag.ptr);
    for (unsigned launch = 1; launch <= 3; ++launch) {
      const auto h = test::random_floats(rng, c.K), a = test::random_floats(rng, c.K);
      test::DeviceBuffer<float> h1(h), h2(h), da(a), x1(c.K), x2(c.K), y1(c.N), y2(c.N), w1(c.k), w2(c.k);
      test::DeviceBuffer<int32_t> i1(c.k), i2(c.k);
      const gpu::HostPost post{px.ptr, pids.ptr, pw.ptr, pflag.ptr, launch};
      CUDA_OK(gpu::gemv_bf16_router_topk_norm(dW.ptr, c.N, c.K, h1.ptr, da.ptr, nullptr, nullptr, dnw.ptr, 1e-6f, x1.ptr, y1.ptr, c.E, c.k,
                                              t1.ptr, i1.ptr, w1.ptr, nullptr, &post));
      CUDA_OK(gpu::gemv_bf16_router_topk_norm(dW.ptr, c.N, c.K, h2.ptr, da.ptr, nullptr, nullptr, dnw.ptr, 1e-6f, x2.ptr, y2.ptr, c.E, c.k,
                                              t2.ptr, i2.ptr, w2.ptr, nullptr));
      CUDA_OK(gpu::host_post(x2.ptr, c.K, i2.ptr, w2.ptr, c.k, rx.ptr, rids.ptr, rw.ptr, rflag.ptr, launch, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = str_cat(c.N, " x ", c.K, " launch ", launch);
      EXPECT_EQ(*pflag.ptr, launch) << what;
      EXPECT_EQ(*rflag.ptr, launch) << what;
      EXPECT_EQ(std::vector<float>(px.ptr, px.ptr + c.K), std::vector<float>(rx.ptr, rx.ptr + c.K)) << what;
      EXPECT_EQ(std::vector<int32_t>(pids.ptr, pids.ptr + c.k), std::vector<int32_t>(rids.ptr, rids.ptr + c.k)) << what;
      EXPECT_EQ(std::vector<float>(pw.ptr, pw.ptr + c.k), std::vector<float>(rw.ptr, rw.ptr + c.k)) << what;
      EXPECT_EQ(std::vector<float>(px.ptr, px.ptr + c.K), x2.to_host()) << what;
      EXPECT_EQ(h1.to_host(), h2.to_host()) << what;
      EXPECT_EQ(x1.to_host(), x2.to_host()) << what;
      EXPECT_EQ(y1.to_host(), y2.to_host()) << what;
      EXPECT_EQ(i1.to_host(), i2.to_host()) << what;
      EXPECT_EQ(w1.to_host(), w2.to_host()) << what;
      EXPECT_EQ(t1.to_host()[0], 0u) << what;
    }
  }
}

}  // namespace
}  // namespace tandem

// gpu::gpu_device_caps: what the runtime may use of the device, and TANDEM_MAX_SM's cap (an H200 made to
// choose what an RTX 3090 / 4090 would).
#include <cstdlib>
#include <string>

#include "gpu_core/device.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace tandem {
namespace {

TEST(DeviceCaps, TheDeviceOrTheCap) {
  TANDEM_REQUIRE_GPU();
  const gpu::DeviceCaps& caps = gpu::gpu_device_caps();
  ASSERT_TRUE(caps.usable) << caps.error;
  gpu::DeviceProbe p;
  gpu::gpu_device_probe(&p);
  const int device_sm = p.cc_major * 10 + p.cc_minor, sm = caps.cc_major * 10 + caps.cc_minor;
  int dev = 0, optin = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const char* cap = std::getenv("TANDEM_MAX_SM");
  if (cap && std::atoi(cap) < device_sm) {
    EXPECT_EQ(sm, std::atoi(cap)) << caps.description;
    EXPECT_LE(caps.smem_per_block, optin);
    if (sm == 86 || sm == 89) {
      EXPECT_EQ(caps.smem_per_block, 99 * 1024) << "an RTX 3090 / 4090 gives a block 99 KB";
    }
    EXPECT_NE(std::string(caps.description).find("capped by TANDEM_MAX_SM="), std::string::npos) << caps.description;
  } else {
    EXPECT_EQ(sm, device_sm);
    EXPECT_EQ(caps.smem_per_block, optin);
  }
  std::printf("[ caps     ] %s; built for %s\n", caps.description, gpu::cuda_architectures_built());
}

}  // namespace
}  // namespace tandem

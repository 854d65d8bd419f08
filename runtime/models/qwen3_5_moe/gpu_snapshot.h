// runtime/models/qwen3_5_moe/gpu_snapshot.h: memory for saved GPU sequences (Qwen35MoeGpu::save_slot,
// the server's prefix cache). A snapshot is one byte stream (a slot's KV rows and DeltaNet states) laid
// over fixed-size pages of a pool reserved once: device memory (the cache's VRAM tier: a save or a
// restore is a device-to-device copy) or page-locked host memory (copies at the link's full rate, no
// allocation or page faults on the request's path). When both pools are full a snapshot takes a block
// of plain host memory instead. Pages go back to their pool when the last holder lets go.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem {

class SnapshotPool {
 public:
  static constexpr uint64_t kPage = uint64_t(4) << 20;
  // Reserves bytes / kPage pages (cudaMalloc on the current device, or cudaHostAlloc).
  SnapshotPool(bool device, uint64_t bytes);
  ~SnapshotPool();
  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;
  bool device() const { return device_; }
  // n pages, or none when fewer are free.
  std::vector<uint8_t*> take(size_t n);
  void give(const std::vector<uint8_t*>& pages);

 private:
  bool device_;
  std::vector<uint8_t*> chunks_;
  std::mutex m_;
  std::vector<uint8_t*> free_;
};

// One snapshot's memory: pages of a pool, or one host block.
class SnapshotMemory {
 public:
  // Pages from the first pool with room for `bytes` (nullptrs skipped), else a host block.
  SnapshotMemory(uint64_t bytes, const std::vector<std::shared_ptr<SnapshotPool>>& pools);
  ~SnapshotMemory();
  SnapshotMemory(const SnapshotMemory&) = delete;
  SnapshotMemory& operator=(const SnapshotMemory&) = delete;
  uint64_t bytes() const { return bytes_; }
  const char* where() const { return !pool_ ? "host memory" : pool_->device() ? "device memory" : "page-locked host memory"; }
  // The address of byte `offset` and how many bytes follow it contiguously.
  uint8_t* at(uint64_t offset, uint64_t* contiguous) const;

 private:
  uint64_t bytes_;
  std::shared_ptr<SnapshotPool> pool_;
  std::vector<uint8_t*> pages_;
  std::unique_ptr<uint8_t[]> block_;
};

}  // namespace tandem

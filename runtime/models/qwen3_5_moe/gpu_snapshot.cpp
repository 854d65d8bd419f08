#include "runtime/models/qwen3_5_moe/gpu_snapshot.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/bytes.h"
#include "core/error.h"

namespace tandem {

SnapshotPool::SnapshotPool(bool device, uint64_t bytes) : device_(device) {
  const uint64_t pages = bytes / kPage, per_chunk = 64;  // 256 MiB reservations
  for (uint64_t done = 0; done < pages;) {
    const uint64_t n = std::min(per_chunk, pages - done);
    void* p = nullptr;
    const cudaError_t e = device ? cudaMalloc(&p, n * kPage) : cudaHostAlloc(&p, n * kPage, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      for (uint8_t* c : chunks_) device ? cudaFree(c) : cudaFreeHost(c);  // the destructor does not run for a throwing constructor
      fail("the prefix cache's ", device ? "VRAM tier" : "page-locked host memory", " of ", format_gib(bytes), " could not be reserved (",
           cudaGetErrorString(e), " after ", format_gib(done * kPage), "); lower ", device ? "--cache-vram / server.cache_vram" : "--cache-bytes / server.cache");
    }
    chunks_.push_back(static_cast<uint8_t*>(p));
    for (uint64_t i = 0; i < n; ++i) free_.push_back(static_cast<uint8_t*>(p) + i * kPage);
    done += n;
  }
}

SnapshotPool::~SnapshotPool() {
  for (uint8_t* c : chunks_) device_ ? cudaFree(c) : cudaFreeHost(c);
  chunks_.clear();
}

std::vector<uint8_t*> SnapshotPool::take(size_t n) {
  std::lock_guard<std::mutex> lock(m_);
  if (free_.size() < n) return {};
  std::vector<uint8_t*> out(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
  free_.resize(free_.size() - n);
  return out;
}

void SnapshotPool::give(const std::vector<uint8_t*>& pages) {
  std::lock_guard<std::mutex> lock(m_);
  free_.insert(free_.end(), pages.begin(), pages.end());
}

SnapshotMemory::SnapshotMemory(uint64_t bytes, const std::vector<std::shared_ptr<SnapshotPool>>& pools) : bytes_(bytes) {
  const size_t n = static_cast<size_t>((bytes + SnapshotPool::kPage - 1) / SnapshotPool::kPage);
  for (const auto& p : pools) {
    if (!p || n == 0) continue;
    pages_ = p->take(n);
    if (!pages_.empty()) {
      pool_ = p;
      return;
    }
  }
  block_.reset(new uint8_t[std::max<uint64_t>(bytes, 1)]);  // not value-initialised: every byte is copied over
}

SnapshotMemory::~SnapshotMemory() {
  if (pool_) pool_->give(pages_);
}

uint8_t* SnapshotMemory::at(uint64_t offset, uint64_t* contiguous) const {
  if (!pool_) {
    *contiguous = bytes_ - offset;
    return block_.get() + offset;
  }
  const uint64_t in = offset % SnapshotPool::kPage;
  *contiguous = std::min(SnapshotPool::kPage - in, bytes_ - offset);
  return pages_[static_cast<size_t>(offset / SnapshotPool::kPage)] + in;
}

}  // namespace tandem

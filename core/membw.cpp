#include "core/membw.h"

#include <cstdio>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tandem {

BandwidthResult measure_read_bandwidth(uint64_t buffer_bytes, int passes) {
  const uint64_t n = buffer_bytes / sizeof(uint64_t);
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(64, n * sizeof(uint64_t)));
  // First touch from the threads that will read, so pages land on their NUMA node.
#pragma omp parallel for schedule(static)
  for (uint64_t i = 0; i < n; ++i) buf[i] = i;
  double best = 1e30;
  uint64_t sink = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t acc = 0;
#pragma omp parallel for schedule(static) reduction(^ : acc)
    for (uint64_t i = 0; i < n; ++i) acc ^= buf[i];
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    sink ^= acc;
  }
  std::free(buf);
  BandwidthResult r;
  r.bytes_per_s = static_cast<double>(n * sizeof(uint64_t)) / best + static_cast<double>(sink & 0);
  r.threads = omp_get_max_threads();
  r.buffer_bytes = n * sizeof(uint64_t);
  return r;
}

uint64_t available_host_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

}  // namespace tandem

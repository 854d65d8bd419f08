// core/membw.h: measures this machine's memory read bandwidth (the denominator of every CPU bound).
//
// A streaming read over a buffer much larger than the last-level cache, all threads (OpenMP), best
// of a few passes; vector loads come from the compiler's auto-vectorised reduction (compiled at the
// baseline ISA, which is enough to saturate DRAM).
#pragma once

#include <cstdint>

namespace tandem {

struct BandwidthResult {
  double bytes_per_s = 0;
  int threads = 0;
  uint64_t buffer_bytes = 0;
};

BandwidthResult measure_read_bandwidth(uint64_t buffer_bytes = 1ull << 30, int passes = 5);

// Host memory a new allocation can get without swapping (Linux MemAvailable), 0 when unknown.
uint64_t available_host_memory();

}  // namespace tandem

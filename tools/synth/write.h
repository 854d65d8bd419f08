// tools/synth/write.h: fills a planned checkpoint with its generated contents, in parallel.
//
// Every shard file is cut into work units: consecutive `unit_bytes` ranges of the file (a multiple of
// the 4 KiB direct-I/O block), header bytes included. `threads` workers take units from a shared
// counter, generate each into a private aligned buffer (the header bytes, then every tensor range
// the unit overlaps, see synth_fill.h) and write it with O_DIRECT. Output never depends on threads or
// unit size. Progress goes to `log` (when not null): a single \r-updated line (bytes, GB/s, ETA) on a
// TTY, otherwise a plain line at each quarter.
#pragma once

#include <cstdio>
#include <vector>

#include "runtime/format/safetensors_stream.h"
#include "tools/synth/fill.h"

namespace tandem::synth {

// plan[i] must describe writer.tensors()[i]. Calls writer.open(Direct) and writer.finish(); rethrows
// the first worker error (the writer then removes its partial files).
void write_weights(const std::vector<PlannedTensor>& plan, SafetensorsStreamWriter& writer, uint64_t seed, int threads,
                   uint64_t unit_bytes, std::FILE* log);

}  // namespace tandem::synth

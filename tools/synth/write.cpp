#include "tools/synth/write.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/progress.h"

namespace tandem::synth {

namespace {

struct Unit {
  size_t shard;
  uint64_t offset;  // in the file, a multiple of the direct-I/O block
  uint64_t bytes;
};


}  // namespace

void write_weights(const std::vector<PlannedTensor>& plan, SafetensorsStreamWriter& writer, uint64_t seed, int threads,
                   uint64_t unit_bytes, std::FILE* log) {
  if (plan.size() != writer.tensors().size()) fail("internal: plan and writer disagree on the tensor count");
  constexpr uint64_t kAlign = SafetensorsStreamWriter::kDirectAlign;
  unit_bytes = std::max<uint64_t>(kAlign, unit_bytes - unit_bytes % kAlign);
  const size_t num_shards = writer.shards().size();
  std::vector<Unit> units;
  std::vector<std::string> headers(num_shards);
  std::vector<std::vector<uint64_t>> starts(num_shards);  // file offset of each tensor, in file order
  uint64_t total = 0;
  for (size_t s = 0; s < num_shards; ++s) {
    const auto& sh = writer.shards()[s];
    headers[s] = writer.header_bytes(s);
    for (size_t t : sh.tensors) starts[s].push_back(writer.location(t).file_offset);
    const uint64_t size = sh.data_start + sh.data_bytes;
    for (uint64_t off = 0; off < size; off += unit_bytes) units.push_back({s, off, std::min(unit_bytes, size - off)});
    total += size;
  }

  writer.open(SafetensorsStreamWriter::Io::Direct);
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> abort{false};
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;
  int running = std::max(1, threads);

  auto worker = [&] {
    std::byte* buf = static_cast<std::byte*>(std::aligned_alloc(kAlign, unit_bytes));
    try {
      if (!buf) fail("out of host memory for a ", unit_bytes, "-byte write buffer");
      while (!abort.load(std::memory_order_relaxed)) {
        const size_t i = next.fetch_add(1);
        if (i >= units.size()) break;
        const Unit& u = units[i];
        const auto& sh = writer.shards()[u.shard];
        const uint64_t end = u.offset + u.bytes;
        const std::string& head = headers[u.shard];
        if (u.offset < head.size())
          std::memcpy(buf, head.data() + u.offset, std::min<uint64_t>(end, head.size()) - u.offset);
        // First tensor that ends after the unit starts, then every tensor until the unit's end.
        const auto& st = starts[u.shard];
        size_t k = static_cast<size_t>(std::upper_bound(st.begin(), st.end(), u.offset) - st.begin());
        if (k > 0) --k;
        for (; k < st.size() && st[k] < end; ++k) {
          const PlannedTensor& t = plan[sh.tensors[k]];
          const uint64_t t0 = st[k], t1 = t0 + t.spec.nbytes();
          const uint64_t a = std::max(t0, u.offset), b = std::min(t1, end);
          if (a < b) fill_range(t, seed, a - t0, b - t0, buf + (a - u.offset));
        }
        writer.write(u.shard, u.offset, buf, u.bytes);
        done.fetch_add(u.bytes, std::memory_order_relaxed);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      abort = true;
    }
    std::free(buf);
    std::lock_guard<std::mutex> lock(mu);
    --running;
    cv.notify_all();
  };

  const auto t0 = std::chrono::steady_clock::now();
  auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  Progress progress(log, total);
  std::vector<std::thread> pool;
  for (int i = 0; i < std::max(1, threads); ++i) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error& e) {
      abort = true;  // the started workers stop after their unit; the writer then removes its files
      for (auto& th : pool) th.join();
      fail("synth: cannot start writer thread ", i + 1, " of ", threads, " (", e.what(), "); use fewer --threads");
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      cv.wait_for(lock, std::chrono::milliseconds(200));
      if (running > 0) progress.show(done.load(), secs(), false);
    }
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  progress.show(done.load(), secs(), true);
  writer.finish();
}

}  // namespace tandem::synth

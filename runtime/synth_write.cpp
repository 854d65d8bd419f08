#include "runtime/synth_write.h"

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
#include <thread>

#include "runtime/error.h"

namespace tandem::synth {

namespace {

struct Unit {
  size_t shard;
  uint64_t offset;  // in the file, a multiple of the direct-I/O block
  uint64_t bytes;
};

std::string clock_text(double s) {
  if (!(s >= 0) || s > 359999) return "--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

class Progress {
 public:
  Progress(std::FILE* log, uint64_t total) : log_(log), total_(total), tty_(log && ::isatty(::fileno(log))) {}

  void show(uint64_t done, double secs, bool final) {
    if (!log_) return;
    const double frac = total_ ? static_cast<double>(done) / total_ : 1.0;
    const double rate = secs > 0 ? done / secs : 0.0;
    const double eta = rate > 0 ? (total_ - done) / rate : -1.0;
    char line[160];
    if (tty_) {
      constexpr int kWidth = 28;
      std::string bar(kWidth, ' ');
      const int fill = static_cast<int>(frac * kWidth);
      for (int i = 0; i < fill; ++i) bar[i] = '=';
      if (fill < kWidth) bar[fill] = '>';
      std::snprintf(line, sizeof line, "\r  weights [%s] %3d%%  %.2f / %.2f GB  %.2f GB/s  %s %s\x1b[K", bar.c_str(),
                    static_cast<int>(frac * 100), done / 1e9, total_ / 1e9, rate / 1e9, final ? "in" : "ETA",
                    clock_text(final ? secs : eta).c_str());
      std::fputs(line, log_);
      if (final) std::fputc('\n', log_);
      std::fflush(log_);
      return;
    }
    const int quarter = static_cast<int>(frac * 4);
    if (!final && quarter <= last_quarter_) return;
    last_quarter_ = quarter;
    std::snprintf(line, sizeof line, "  weights %3d%%  %.2f / %.2f GB  %.2f GB/s  %s %s\n", static_cast<int>(frac * 100),
                  done / 1e9, total_ / 1e9, rate / 1e9, final ? "in" : "ETA", clock_text(final ? secs : eta).c_str());
    std::fputs(line, log_);
    std::fflush(log_);
  }

 private:
  std::FILE* log_;
  uint64_t total_;
  bool tty_;
  int last_quarter_ = 0;
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
  for (int i = 0; i < std::max(1, threads); ++i) pool.emplace_back(worker);
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

#include "core/progress.h"

#include <unistd.h>

namespace tandem {

std::string clock_text(double s) {
  if (!(s >= 0) || s > 359999) return "--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

Progress::Progress(std::FILE* log, uint64_t total, std::string label)
    : log_(log), total_(total), label_(std::move(label)), tty_(log && ::isatty(::fileno(log))) {}

void Progress::show(uint64_t done, double secs, bool final) {
  if (!log_) return;
  const double frac = total_ ? static_cast<double>(done) / total_ : 1.0;
  const double rate = secs > 0 ? done / secs : 0.0;
  const double eta = rate > 0 ? (total_ - done) / rate : -1.0;
  char stats[120];
  std::snprintf(stats, sizeof stats, "%3d%%  %.2f / %.2f GB  %.2f GB/s  %s %s", static_cast<int>(frac * 100), done / 1e9, total_ / 1e9,
                rate / 1e9, final ? "in" : "ETA", clock_text(final ? secs : eta).c_str());
  if (tty_) {  // a bar redrawn in place
    constexpr int kWidth = 28;
    std::string bar(kWidth, ' ');
    const int fill = static_cast<int>(frac * kWidth);
    for (int i = 0; i < fill; ++i) bar[i] = '=';
    if (fill < kWidth) bar[fill] = '>';
    std::fprintf(log_, "\r  %s [%s] %s\x1b[K%s", label_.c_str(), bar.c_str(), stats, final ? "\n" : "");
  } else {  // a line at every quarter
    const int quarter = static_cast<int>(frac * 4);
    if (!final && quarter <= last_quarter_) return;
    last_quarter_ = quarter;
    std::fprintf(log_, "  %s %s\n", label_.c_str(), stats);
  }
  std::fflush(log_);
}

}  // namespace tandem

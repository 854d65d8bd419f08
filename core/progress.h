// core/progress.h: one progress line for long byte-counted work (synth writing weights, the GPU
// model's upload): a bar redrawn in place on a terminal, a line at every quarter otherwise.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem {

// "m:ss" / "h:mm:ss"; "--:--" for unknown or absurd values.
std::string clock_text(double seconds);

class Progress {
 public:
  // label: what moves ("weights", "to GPU"); log nullptr: silent.
  Progress(std::FILE* log, uint64_t total, std::string label = "weights");
  // done of total bytes after secs seconds; final: the last call (prints the total time).
  void show(uint64_t done, double secs, bool final);

 private:
  std::FILE* log_;
  uint64_t total_;
  std::string label_;
  bool tty_;
  int last_quarter_ = 0;
};

}  // namespace tandem

// core/trace.h: a Chrome / Perfetto timeline of a run (`--trace FILE.json`): host spans (CPU expert
// jobs, handoff waits, whole forward calls) and, on the GPU placements, the stream's work between
// recorded CUDA events, so the CPU/GPU overlap can be seen in ui.perfetto.dev or chrome://tracing.
//
// Format: the JSON object {"traceEvents": [...]} of "X" (complete) events, microseconds since the
// trace started; pid 1 = host threads (tid = a small per-thread number), pid 2 = the GPU stream.
// Thread-safe appends; written by Trace::write (the CLI calls it when the command ends). Tracing off
// (no --trace) costs one branch per span.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {

class Trace {
 public:
  // The process-wide trace, or nullptr when tracing is off.
  static Trace* active();
  // Starts tracing to `path` (replaces a previous trace).
  static void start(const std::string& path);
  // Writes the file (tandem::Error naming it on failure) and stops tracing.
  static void finish();

  double now_us() const;  // since start
  void host_span(const std::string& name, const char* category, double begin_us, double end_us);
  void gpu_span(const std::string& name, const char* category, double begin_us, double end_us);
  size_t size() const;

 private:
  struct Event {
    std::string name;
    const char* cat;
    int pid, tid;
    double ts, dur;
  };
  explicit Trace(std::string path);
  void write() const;
  std::string path_;
  std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// A host span over a scope: TraceSpan s("cpu experts L3", "cpu");
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category, int index = -1);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Trace* t_;
  const char* name_;
  const char* cat_;
  int index_;
  double begin_ = 0;
};

}  // namespace tandem

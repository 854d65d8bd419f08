// runtime/server/scheduler.h: continuous batching for the server. One engine thread owns the runner and
// a Batcher; HTTP handler threads submit requests and read their text back through a Ticket. Requests
// join and leave between steps; prompts go in chunks (prefill_chunk) beside the other sequences'
// decode steps; a bounded queue refuses what it cannot hold; a request past its wall-clock limit, or
// whose client went away (the handler sets cancel), leaves at the next step and frees its slot.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/generate.h"
#include "runtime/engine/runner.h"
#include "runtime/server/prefix_cache.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem::server {

using Clock = std::chrono::steady_clock;

// One request between its handler and the engine thread.
struct Ticket {
  std::atomic<bool> cancel{false};  // set by the handler (client gone); the request leaves at the next step
  Clock::time_point submitted = Clock::now();

  // Waits up to `wait` for new text or the end; appends the text emitted since the last call to `out`
  // and returns whether the request has ended (then result() / error() are final).
  bool take(std::string& out, std::chrono::milliseconds wait);
  const GenerateResult& result() const { return result_; }
  const std::string& error() const { return error_; }  // non-empty: the engine failed the request
  bool timed_out() const { return timed_out_; }
  double ttft_s() const;  // submission to the first text (or to the end)

 private:
  friend class Scheduler;
  void emit(std::string_view text);
  void end(std::string error = {});
  std::mutex m_;
  std::condition_variable cv_;
  std::string text_;
  bool done_ = false, timed_out_ = false;
  std::string error_;
  GenerateResult result_;  // written by the engine thread until done_
  Clock::time_point first_ = {};
};

struct SchedulerOptions {
  int64_t prefill_chunk = 512;  // prompt tokens a step feeds one sequence (0: whole prompts)
  size_t max_queue = 64;        // requests waiting for a slot (beyond one a slot) before new ones are refused
  double timeout_s = 600;       // a request's wall-clock limit (0: none)
  uint64_t cache_bytes = uint64_t{2} << 30;  // the prefix cache's budget (0: off; off too where the runner saves no sequences)
  uint64_t cache_vram = 0;                    // of it, the runner's VRAM tier (RunnerOptions::cache_vram; for the log line)
  int64_t cache_every = 4096;   // besides the last message boundary, a prompt is saved every this many tokens
};

class Scheduler {
 public:
  Scheduler(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, SchedulerOptions opts);
  ~Scheduler();  // cancels what is in flight and joins the engine thread

  enum class Refusal { none, queue_full, draining };
  // Queues a request (its on_text / on_done / cancel are the ticket's); nullptr with `why` set when it
  // is refused.
  std::shared_ptr<Ticket> submit(GenerateRequest req, Refusal& why);
  void drain();        // refuse new requests from now on
  bool idle() const;   // nothing queued or running

  struct Stats {
    uint64_t requests = 0, prompt_tokens = 0, generated_tokens = 0, failed = 0, timed_out = 0, cancelled = 0;
    double busy_s = 0;  // time the engine spent in steps
    DraftStats drafts;  // speculative decoding (--draft), over the ended requests
    size_t queued = 0, running = 0;
    int slots = 0;
  };
  Stats stats() const;
  // The prefix cache (nullptr: off) and why it is off ("" when on).
  const PrefixCache* cache() const { return cache_.get(); }
  const std::string& cache_note() const { return cache_note_; }

 private:
  struct Incoming {
    GenerateRequest req;
    std::shared_ptr<Ticket> ticket;
  };
  void loop();
  void fail_all(const std::string& why);
  void use_cache(GenerateRequest& req);
  std::vector<int64_t> checkpoints(std::span<const int32_t> prompt, int64_t from) const;

  Runner& runner_;
  int64_t vocab_;
  const Tokenizer& tokenizer_;
  SchedulerOptions opts_;
  std::unique_ptr<Batcher> batcher_;                // the engine thread's
  std::unique_ptr<PrefixCache> cache_;
  std::string cache_note_;
  int32_t im_end_ = -1, newline_ = -1;              // a message ends with these two tokens
  std::vector<std::shared_ptr<Ticket>> live_;       // added to the batcher, not yet ended (engine thread)
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<Incoming> incoming_;
  bool stop_ = false, draining_ = false;
  std::atomic<size_t> in_batcher_{0}, running_{0};  // requests the batcher holds, of them in slots
  Stats totals_;                                    // under m_
  std::thread thread_;
};

}  // namespace tandem::server

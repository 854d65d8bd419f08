// runtime/server/prefix_cache.h: saved sequences by their token prefix, for requests that resend a
// history (chats and agents send the whole conversation each turn). The recurrent (DeltaNet) state
// cannot be cut back to an earlier position, so what is kept are whole sequence snapshots at chosen
// positions (the scheduler saves at the prompt's last message boundary, every `every` tokens and after
// a reply); a request resumes from the longest saved prefix of its prompt. Bounded by bytes, least
// recently used first out. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/engine/runner.h"

namespace tandem::server {

class PrefixCache {
 public:
  explicit PrefixCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // The longest saved prefix of `prompt` that is shorter than it (nullptr: none); counts a hit or a miss.
  std::shared_ptr<const SequenceSnapshot> find(std::span<const int32_t> prompt);
  // Saves `s`, the sequence of `tokens`, evicting the least recently used entries past the budget
  // (one larger than the whole budget is not kept).
  void add(std::span<const int32_t> tokens, std::shared_ptr<const SequenceSnapshot> s);

  struct Stats {
    uint64_t hits = 0, misses = 0, reused_tokens = 0, entries = 0, bytes = 0, max_bytes = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::shared_ptr<const SequenceSnapshot> saved;
    uint64_t bytes = 0;
  };
  mutable std::mutex m_;
  std::list<Entry> lru_;  // most recently used first
  uint64_t max_bytes_, bytes_ = 0;
  Stats counts_;
};

}  // namespace tandem::server

#include "runtime/server/prefix_cache.h"

#include <algorithm>

namespace tandem::server {

std::shared_ptr<const SequenceSnapshot> PrefixCache::find(std::span<const int32_t> prompt) {
  std::lock_guard l(m_);
  auto best = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const size_t n = it->tokens.size();
    if (n >= prompt.size() || (best != lru_.end() && n <= best->tokens.size())) continue;
    if (std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) best = it;
  }
  if (best == lru_.end()) {
    ++counts_.misses;
    return nullptr;
  }
  ++counts_.hits;
  counts_.reused_tokens += best->tokens.size();
  lru_.splice(lru_.begin(), lru_, best);  // most recently used
  return lru_.front().saved;
}

void PrefixCache::add(std::span<const int32_t> tokens, std::shared_ptr<const SequenceSnapshot> s) {
  if (!s || tokens.empty()) return;
  const uint64_t bytes = s->bytes + tokens.size() * sizeof(int32_t);
  std::lock_guard l(m_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it)  // the same prefix again: the new copy replaces it
    if (it->tokens.size() == tokens.size() && std::equal(tokens.begin(), tokens.end(), it->tokens.begin())) {
      bytes_ -= it->bytes;
      lru_.erase(it);
      break;
    }
  if (bytes > max_bytes_) return;
  lru_.push_front({std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(s), bytes});
  bytes_ += bytes;
  while (bytes_ > max_bytes_) {
    bytes_ -= lru_.back().bytes;
    lru_.pop_back();
  }
}

PrefixCache::Stats PrefixCache::stats() const {
  std::lock_guard l(m_);
  Stats s = counts_;
  s.entries = lru_.size();
  s.bytes = bytes_;
  s.max_bytes = max_bytes_;
  return s;
}

}  // namespace tandem::server

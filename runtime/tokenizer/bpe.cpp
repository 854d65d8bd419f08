// runtime/tokenizer/bpe.cpp: see tokenizer_bpe.h.
#include "runtime/tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <cstring>

namespace tandem::tok {

namespace {

uint64_t mix(uint64_t a, uint64_t b) {
  const __uint128_t r = __uint128_t(a ^ 0xA0761D6478BD642Full) * (b ^ 0xE7037ED1A0B428DBull);
  return uint64_t(r) ^ uint64_t(r >> 64);
}

size_t capacity_for(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  return cap;
}

}  // namespace

size_t hash_bytes(std::string_view s) {
  // wyhash-style: words are short, so the cost is one or two multiplies.
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x53C5CA59ull * (n + 1);
  while (n >= 16) {
    uint64_t a, b;
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + 8, 8);
    h = mix(a ^ h, b ^ 0x8BB84B93962EACC9ull);
    p += 16;
    n -= 16;
  }
  uint64_t a = 0, b = 0;
  if (n >= 8) {
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + n - 8, 8);
  } else if (n >= 4) {
    uint32_t x, y;
    std::memcpy(&x, p, 4);
    std::memcpy(&y, p + n - 4, 4);
    a = x;
    b = y;
  } else if (n > 0) {
    a = (uint64_t(p[0]) << 16) | (uint64_t(p[n >> 1]) << 8) | p[n - 1];
  }
  return mix(a ^ h, b ^ 0x4B33A62ED433D4A3ull);
}

// ---- StringIdMap ----

void StringIdMap::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity_for(std::max<size_t>(size_ + 1, 8)), Slot{});
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    size_t i = s.hash & mask;
    while (slots_[i].id >= 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

bool StringIdMap::insert(std::string_view key, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t h = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (; slots_[i].id >= 0; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == h && std::string_view(arena_.data() + s.offset, s.length) == key) return false;
  }
  slots_[i] = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
  arena_.append(key);
  ++size_;
  return true;
}

int32_t StringIdMap::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask; slots_[i].id >= 0; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == h && std::string_view(arena_.data() + s.offset, s.length) == key) return s.id;
  }
  return -1;
}

// ---- MergeTable ----

void MergeTable::reserve(size_t n) {
  const size_t cap = capacity_for(std::max<size_t>(n, 8));
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(size_ + 1, old.size()));
    for (const Slot& s : old) {
      if (s.key != kEmpty) insert(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.rank, s.merged);
    }
  }
  const uint64_t key = pack(left, right);
  size_t i = slot_of(key);
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) ++size_;
  slots_[i] = Slot{key, rank, merged};
}

// ---- WordCache ----

void WordCache::clear() {
  slots_.assign(kMaxEntries * 2, Slot{});
  keys_.clear();
  ids_.clear();
  size_ = 0;
}

bool WordCache::lookup(std::string_view word, size_t hash, std::vector<int32_t>& out) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask; slots_[i].num_ids; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == hash && s.key_length == word.size() &&
        std::memcmp(keys_.data() + s.key_offset, word.data(), word.size()) == 0) {
      out.insert(out.end(), ids_.begin() + s.ids_offset, ids_.begin() + s.ids_offset + s.num_ids);
      return true;
    }
  }
  return false;
}

void WordCache::insert(std::string_view word, size_t hash, const int32_t* ids, size_t n) {
  if (word.size() > kMaxWordBytes || n == 0 || n > UINT16_MAX) return;
  if (slots_.empty() || size_ >= kMaxEntries) clear();
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].num_ids) i = (i + 1) & mask;
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint16_t>(word.size()), static_cast<uint16_t>(n)};
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + n);
  ++size_;
}

// ---- BpeModel ----

namespace {
constexpr size_t kShortWord = 48;  // symbols; above this the heap beats the quadratic scan
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& s,
                           WordCache* cache) const {
  if (ignore_merges) {
    // HF checks the whole word against the vocabulary before the cache and the merges.
    const int32_t id = whole_words.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  size_t hash = 0;
  if (cache && word.size() <= WordCache::kMaxWordBytes) {
    hash = hash_bytes(word);
    if (cache->lookup(word, hash, out)) return;
  }

  s.ids.clear();
  bool pending_unk = false;
  for (const char ch : word) {
    const int32_t id = byte_ids[static_cast<unsigned char>(ch)];
    if (id >= 0) {
      s.ids.push_back(id);
      pending_unk = false;
    } else if (unk_id >= 0 && !(fuse_unk && pending_unk)) {
      s.ids.push_back(unk_id);
      pending_unk = true;
    }
  }
  if (s.ids.size() > 1) {
    if (s.ids.size() <= kShortWord) {
      merge_short(s);
    } else {
      merge_long(s);
    }
  }
  out.insert(out.end(), s.ids.begin(), s.ids.end());
  if (cache && word.size() <= WordCache::kMaxWordBytes) cache->insert(word, hash, s.ids.data(), s.ids.size());
}

void BpeModel::merge_short(BpeScratch& s) const {
  int32_t* ids = s.ids.data();
  size_t n = s.ids.size();
  s.ranks.resize(n);
  s.merged.resize(n);
  int32_t* rank = s.ranks.data();
  int32_t* merged = s.merged.data();
  auto pair_rank = [&](size_t k) {
    if (!merges.find(ids[k], ids[k + 1], rank[k], merged[k])) rank[k] = INT32_MAX;
  };
  for (size_t k = 0; k + 1 < n; ++k) pair_rank(k);
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k) {
      if (rank[k] < rank[best]) best = k;  // strict: the leftmost of equal ranks wins
    }
    if (rank[best] == INT32_MAX) break;
    ids[best] = merged[best];
    std::memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(int32_t));
    std::memmove(rank + best, rank + best + 1, (n - best - 2) * sizeof(int32_t));
    std::memmove(merged + best, merged + best + 1, (n - best - 2) * sizeof(int32_t));
    --n;
    if (best > 0) pair_rank(best - 1);
    if (best + 1 < n) pair_rank(best);
  }
  s.ids.resize(n);
}

void BpeModel::merge_long(BpeScratch& s) const {
  const size_t n = s.ids.size();
  s.symbols.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.symbols[i] = {s.ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  }
  // Min-heap on (rank, pos): std heap functions build a max-heap, so the comparison is reversed.
  auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  s.heap.clear();
  auto push_pair = [&](int32_t pos) {
    const auto& left = s.symbols[pos];
    if (left.next < 0) return;
    int32_t rank, merged;
    if (merges.find(left.id, s.symbols[left.next].id, rank, merged)) {
      s.heap.push_back({rank, pos, merged});
      std::push_heap(s.heap.begin(), s.heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i));
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), later);
    const BpeScratch::Candidate top = s.heap.back();
    s.heap.pop_back();
    auto& left = s.symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // A stale entry: one of the two symbols has merged since it was queued.
    int32_t rank, merged;
    if (!merges.find(left.id, s.symbols[left.next].id, rank, merged) || merged != top.merged) continue;
    auto& right = s.symbols[left.next];
    left.id = merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) s.symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  s.ids.clear();
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) s.ids.push_back(s.symbols[i].id);
}

}  // namespace tandem::tok

// runtime/tokenizer/bpe.h: the byte-level BPE model: merge table, word -> ids, and a bounded word cache.
//
// A word is a run of raw UTF-8 bytes from the pre-tokenizer. Each byte starts as the id of its
// ByteLevel character; merges are applied in HF's order: always the pair of lowest rank, the leftmost
// one among equal ranks (HF keeps a heap of (rank, position); this is the same order). Short words
// use a linear scan (no heap, no allocation); long ones (runs of spaces, long symbols) a heap over a
// linked list of symbols, so a 100 KB whitespace run stays O(n log n).
//
// Ids are int32 (HF uses u32; real vocabularies are far below 2^31). The tables are immutable after
// loading and safe to share between threads; a WordCache is not thread-safe and belongs to one
// encoding thread at a time (the Tokenizer arranges that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

size_t hash_bytes(std::string_view s);

// Open-addressing map from a byte string to an id; keys live in one arena.
class StringIdMap {
 public:
  // Returns false (and changes nothing) when `key` is already present.
  bool insert(std::string_view key, int32_t id);
  int32_t find(std::string_view key) const;  // -1 when absent
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;  // -1: empty
  };
  void grow();

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  void reserve(size_t n);
  // A pair given twice keeps its last rank, as HF's HashMap collect does.
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  bool find(int32_t left, int32_t right, int32_t& rank, int32_t& merged) const {
    if (slots_.empty()) return false;
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        rank = s.rank;
        merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Word bytes -> ids, bounded: when full it is emptied and refilled (frequent words come back fast).
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;  // longer words are not cached (HF: the same bound)
  static constexpr size_t kMaxEntries = 1 << 15;

  // Appends the cached ids of `word` to `out` and returns true, or returns false.
  bool lookup(std::string_view word, size_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view word, size_t hash, const int32_t* ids, size_t n);

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t ids_offset = 0;
    uint16_t key_length = 0;
    uint16_t num_ids = 0;  // 0: empty
  };
  void clear();

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t size_ = 0;
};

// Scratch buffers of one encode call, so words never allocate.
struct BpeScratch {
  std::vector<int32_t> ids, ranks, merged;
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  struct Candidate {
    int32_t rank, pos, merged;
  };
  std::vector<Candidate> heap;
};

struct BpeModel {
  int32_t byte_ids[256];  // id of each byte's ByteLevel character, -1 when the vocab lacks it
  MergeTable merges;
  StringIdMap whole_words;  // raw bytes of every byte-level token -> id (for ignore_merges)
  bool ignore_merges = false;
  int32_t unk_id = -1;  // -1: bytes missing from the vocab are dropped (HF without unk_token)
  bool fuse_unk = false;

  // Appends the ids of one pre-tokenized word (raw bytes, non-empty).
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch, WordCache* cache) const;

 private:
  void merge_short(BpeScratch& s) const;
  void merge_long(BpeScratch& s) const;
};

}  // namespace tandem::tok

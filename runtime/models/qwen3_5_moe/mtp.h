// runtime/models/qwen3_5_moe/mtp.h: the MTP head's side of one host sequence (speculative decoding):
// the head's KV cache and the main model's hidden states it has not consumed yet.
//
// Head row p pairs the main model's final hidden state at position p with the token fed at p + 1, so
// a row can be built once that token is known. After ordinary steps the head catches up on their rows
// at the next draft, or once kCatchUp rows wait (a prompt: at once); after a step that kept its states
// (a verification) it waits for the rollback to say which rows stand. draft() completes the last pair
// with the token about to be fed, then chains the head on its own output for the later drafts. Only
// rows built from the main model's states are kept: a chain's rows are provisional, dropped at the
// next call. The head's own KV cache is attention only, so dropping rows is a truncation. The cache
// is in host memory (Qwen35Moe::mtp_forward) or in a GPU model's slot (MtpDevice).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem {

// Chooses draft i from the head's logits [vocab] (Runner::draft; nullptr: the argmax).
using DraftPick = std::function<int32_t(int i, std::span<const float> logits)>;

// Index of the largest value, the lowest on ties.
int32_t argmax_lowest(std::span<const float> v);

// A head whose cache lives elsewhere (the GPU model's slots): rows at positions at.. of a slot's cache
// from the main model's hidden states [n, H] (host memory) and the tokens that followed; the last
// row's logits, argmax and state after mtp.norm where asked for (nullptr: not wanted).
class MtpDevice {
 public:
  virtual ~MtpDevice() = default;
  virtual void mtp_rows(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, float* logits, int32_t* argmax,
                        float* hidden_out) = 0;
  // Greedy drafts: the rows as mtp_rows, then the chain on the head's own output (drafts.size() in all),
  // in one go; false (nothing run) where the device cannot, and the caller chains mtp_rows.
  virtual bool mtp_chain(int slot, int64_t at, std::span<const int32_t> ids, const float* hidden, std::span<int32_t> drafts) = 0;
};

class MtpSequence {
 public:
  MtpSequence(const Qwen35Moe& model, MatmulBackend* backend, RowFormat kv = RowFormat::Bf16);  // the cache in host memory, rows in `kv`
  MtpSequence(const Qwen35Moe& model, MtpDevice* device, int slot);  // the cache is the device's slot
  void move_to(int slot);  // a device sequence restored into another slot (its cache copied there)
  void reset();
  // The main model fed `ids` (their final hidden states: hidden [n, H]); kept: its step kept states.
  // Rows wait for the next draft() until kCatchUp of them have their following token.
  static constexpr int64_t kCatchUp = 32;
  void fed(std::span<const int32_t> ids, const float* hidden, bool kept);
  // The main model went back to the first `keep` tokens of its last kept step.
  void rolled_back(int64_t keep);
  // Fills `out` (at least one) with draft tokens to follow `next`, the token the main model is fed next.
  void draft(int32_t next, std::span<int32_t> out, const DraftPick& pick);
  uint64_t bytes() const;

 private:
  void drop_provisional();
  void consumed(int64_t rows);  // the pending rows went into the head's cache (a draft's first call)
  // The head over rows at the cache's end (host or device); the last row's outputs where asked for.
  void head(std::span<const int32_t> ids, const float* hidden, float* logits, int32_t* argmax, float* hidden_out);
  const Qwen35Moe* model_;
  Qwen35State st_;              // host: the head's cache
  MtpDevice* device_ = nullptr;  // device: the slot's cache
  int slot_ = 0;
  int64_t rows_ = 0;            // rows in the cache
  int64_t committed_ = 0;       // head rows built from the main model's states (the cache may hold a chain's beyond)
  std::vector<float> hidden_;   // [rows, H]: the main model's hidden states at positions committed_ ..
  std::vector<int32_t> ids_;    // the tokens fed at those positions
  int64_t kept_rows_ = 0;       // of them, the last kept step's (held until rolled_back)
};

}  // namespace tandem

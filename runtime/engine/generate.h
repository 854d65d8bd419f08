// runtime/engine/generate.h: the generation loop: prefill the prompt, then sample, stream and stop.
//
// Text is streamed through on_text as soon as it is complete UTF-8 and cannot be the start of a stop
// string; generation ends on an eos id, a stop string (not emitted), max_new_tokens, or when *cancel
// becomes true (checked between tokens, so Ctrl-C in a REPL keeps the conversation usable).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/engine/runner.h"
#include "runtime/engine/sampling.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  std::vector<std::string> stop;
  std::function<void(std::string_view)> on_text;
  const std::atomic<bool>* cancel = nullptr;
  std::function<void()> on_done;  // the request has ended and its result is final (Batcher: in step())
  // Prefix cache (the server): start from `resume`, a saved sequence of the prompt's first
  // resume->position tokens (1 ..< prompt size), instead of feeding them; save the sequence through
  // on_checkpoint when it has been fed each of `checkpoints` (prompt positions, increasing, above the
  // resumed ones and below the prompt's size) and, with checkpoint_reply, after a reply that ended on
  // eos (the prompt and the reply but its eos). Runners that make no snapshots skip the saves.
  std::shared_ptr<const SequenceSnapshot> resume;
  std::vector<int64_t> checkpoints;
  bool checkpoint_reply = false;
  std::function<void(std::span<const int32_t> tokens, std::shared_ptr<const SequenceSnapshot> saved)> on_checkpoint;
  // Speculative decoding: tokens the runner's MTP head drafts for each step to verify (0: off; at most
  // the runner's max_draft(), and fewer near max_new_tokens or the context's end). Greedy requests
  // get exactly the tokens they get without drafts; sampled ones the same distribution.
  int draft = 0;
  // Forced text (the server's tool_choice): once the reply's text ends with force_after (empty: from
  // its first token), its next tokens are force_ids whatever the model's logits say; once a reply.
  std::string force_after;
  std::vector<int32_t> force_ids;
};

enum class StopReason { Eos, StopString, MaxTokens, Cancelled };

// Speculative decoding's counts (GenerateRequest::draft): steps that verified drafts, and for each
// draft position the drafts verified there and how many were accepted (a position is reached only when
// every earlier draft of its step was accepted). One request's, or summed (add) over several.
struct DraftStats {
  int64_t verify_steps = 0;
  std::vector<int64_t> drafted, accepted;
  void add(const DraftStats& o);
  double tokens_per_step() const;                // each step commits one token plus its accepted drafts
  std::vector<double> acceptance() const;        // accepted / drafted by position (0 where none reached)
  // "drafts: 2.41 tokens a step, accepted 0.80 / 0.62 / 0.41 by position"; empty without verifications.
  std::string summary() const;
};
const char* stop_reason_name(StopReason r);

struct GenerateResult {
  std::string text;               // everything emitted (stop string excluded)
  std::vector<int32_t> tokens;    // generated ids (eos included when it ended the reply)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // of them, resumed from a saved sequence (GenerateRequest::resume), not fed
  double prefill_s = 0, decode_s = 0;
  StopReason stop = StopReason::MaxTokens;
  std::string stop_string;        // the stop string that ended it (StopReason::StopString)
  DraftStats drafts;              // speculative decoding (GenerateRequest::draft)

  double prefill_tok_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
  // Decode speed counts the tokens sampled after the first (the first comes from the prefill).
  double decode_tok_s() const { return decode_s > 0 && tokens.size() > 1 ? (tokens.size() - 1) / decode_s : 0; }
};

// Continuous batching over a runner's slots: requests join (add) at any time and leave when they end
// (eos, a stop string, max_new_tokens, cancel: a cancelled one frees its slot at the next step).
// Each step() first gives waiting requests the free slots, then feeds every sequence still reading
// its prompt the next piece, up to its next checkpoint and at most prefill_chunk tokens while another
// sequence decodes (else kAloneChunks times that; 0: the whole prompt at once), and every other
// sequence its next token, in one runner step (pieces before a prompt's last go in a step of their
// own, without logits), so a long prompt does not stall the others' decoding. Each sequence has its
// own sampler and stop rules: a request gets what generate() gives it alone wherever the runner's
// batched rows equal its single ones (bit for bit on ref and cpu, chunked prompts too).
// A request with drafts (GenerateRequest::draft) feeds, instead of its next token, that token and the
// runner's drafts in a step that keeps its states, takes the longest prefix the model agrees with
// (plus the model's own next token), and rolls the rest back.
class Batcher {
 public:
  static constexpr int64_t kAloneChunks = 8;  // a prompt's pieces while no other sequence decodes, in prefill_chunks
  Batcher(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, int64_t prefill_chunk = 0);
  ~Batcher();
  // Queues a copy of `req` (tandem::Error for an empty prompt or stop string); `out` (which must
  // outlive the request) receives its result as it runs: final once it has left.
  void add(const GenerateRequest& req, GenerateResult* out);
  void step();
  bool idle() const { return active_.empty() && waiting_.empty(); }
  size_t running() const;                           // sequences in slots
  size_t waiting() const { return waiting_.size(); }  // requests waiting for a slot

 private:
  class Live;
  struct Queued {
    GenerateRequest req;
    GenerateResult* out;
  };
  bool run(const std::vector<Live*>& who, const std::vector<std::span<const int32_t>>& ids, const std::vector<uint8_t>& verify);
  void retire();
  void checkpoint(const Live& l);  // saves the sequence at its checkpoints and after its reply (GenerateRequest::checkpoints)
  Runner& runner_;
  int64_t vocab_;
  const Tokenizer& tokenizer_;
  int64_t chunk_;
  bool try_top_ = true;
  std::deque<Queued> waiting_;
  std::vector<std::unique_ptr<Live>> active_;
  std::vector<int> free_slots_;  // the lowest last: taken first
};

// Several requests on one runner (a Batcher with whole prompts): each takes a free slot (the rest wait for one), its prompt is fed on
// its own, then one step feeds every sequence in flight its next token together. Every sequence has
// its own sampler (its own seed) and stop rules, so each result is what generate() gives that request
// alone wherever the runner's batched logits equal its single ones (bit for bit on ref and cpu).
// vocab = the model's vocab_size.
std::vector<GenerateResult> generate_batch(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, std::span<const GenerateRequest> reqs);
// One request in slot 0 (reset first: every call is a fresh sequence): the one-sequence case.
GenerateResult generate(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, const GenerateRequest& req);

// The ids that end a reply: generation_config.json's eos ids (else config.json's), plus <|im_end|> and
// <|endoftext|> when the tokenizer has them.
std::vector<int32_t> stop_token_ids(const ModelConfig& config, const Tokenizer& tokenizer, const GenerationDefaults& defaults);

// Length of the longest suffix of `text` that is a proper prefix of one of `stops` (text that must be
// held back because a stop string may be starting).
size_t held_back_suffix(std::string_view text, const std::vector<std::string>& stops);

}  // namespace tandem

// runtime/engine/generate.h: the generation loop: prefill the prompt, then sample, stream and stop.
//
// Text is streamed through on_text as soon as it is complete UTF-8 and cannot be the start of a stop
// string; generation ends on an eos id, a stop string (not emitted), max_new_tokens, or when *cancel
// becomes true (checked between tokens, so Ctrl-C in a REPL keeps the conversation usable).
#pragma once

#include <atomic>
#include <functional>
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
};

enum class StopReason { Eos, StopString, MaxTokens, Cancelled };
const char* stop_reason_name(StopReason r);

struct GenerateResult {
  std::string text;               // everything emitted (stop string excluded)
  std::vector<int32_t> tokens;    // generated ids (eos included when it ended the reply)
  int64_t prompt_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  StopReason stop = StopReason::MaxTokens;

  double prefill_tok_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
  // Decode speed counts the tokens sampled after the first (the first comes from the prefill).
  double decode_tok_s() const { return decode_s > 0 && tokens.size() > 1 ? (tokens.size() - 1) / decode_s : 0; }
};

// Several requests on one runner: each takes a free slot (the rest wait for one), its prompt is fed on
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

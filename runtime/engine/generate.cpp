#include "runtime/engine/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace tandem {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::StopString: return "stop string";
    case StopReason::MaxTokens: return "max tokens";
    case StopReason::Cancelled: return "cancelled";
  }
  return "?";
}

size_t held_back_suffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        hold = n;
        break;
      }
  return hold;
}

GenerateResult generate(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, const GenerateRequest& req) {
  if (req.prompt.empty()) fail("generate: the prompt is empty (no tokens)");
  for (const auto& s : req.stop)
    if (s.empty()) fail("generate: empty stop string");
  using clock = std::chrono::steady_clock;
  const int64_t V = vocab;
  GenerateResult res;
  res.prompt_tokens = static_cast<int64_t>(req.prompt.size());

  runner.reset();
  Sampler sampler(req.sampling);
  StreamDecoder decoder(tokenizer, /*skip_special=*/true);
  std::vector<float> logits(V);
  std::vector<int32_t> context = req.prompt;
  std::string pending;  // decoded text not yet emitted

  auto emit = [&](std::string_view s) {
    if (s.empty()) return;
    res.text.append(s);
    if (req.on_text) req.on_text(s);
  };

  // The runner selects the sampler's candidates itself when it can (the GPU: k pairs cross, not the row).
  // A runner that declines once (no such path) is not asked again, so the penalty list is not built
  // per token for nothing.
  const int need = sampler.candidates_needed();
  std::vector<std::pair<int32_t, float>> top;
  bool try_top = need > 0, have_top = false;
  auto feed = [&](std::span<const int32_t> ids) {
    have_top = try_top && runner.forward_top(ids, sampler.penalties(context, res.tokens), need, top);
    try_top = have_top;
    if (!have_top) runner.forward(ids, logits.data(), Qwen35Moe::LogitRows::Last);
  };
  const auto t0 = clock::now();
  feed(req.prompt);
  res.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  const auto t1 = clock::now();
  for (int64_t step = 0; step < req.max_new_tokens; ++step) {
    if (req.cancel && req.cancel->load()) {
      res.stop = StopReason::Cancelled;
      break;
    }
    const int32_t id = have_top ? sampler.sample_top(top) : sampler.sample(logits, context, res.tokens);
    res.tokens.push_back(id);
    context.push_back(id);
    if (std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end()) {
      res.stop = StopReason::Eos;
      break;
    }
    pending += decoder.push(id);
    if (!req.stop.empty()) {
      size_t cut = std::string::npos;
      for (const auto& s : req.stop) cut = std::min(cut, pending.find(s));
      if (cut != std::string::npos) {
        emit(std::string_view(pending).substr(0, cut));
        pending.clear();
        res.stop = StopReason::StopString;
        break;
      }
      const size_t hold = held_back_suffix(pending, req.stop);
      emit(std::string_view(pending).substr(0, pending.size() - hold));
      pending.erase(0, pending.size() - hold);
    } else {
      emit(pending);
      pending.clear();
    }
    if (step + 1 == req.max_new_tokens) break;  // no forward for a token we will not sample from
    feed(std::span(&id, 1));
  }
  if (res.stop != StopReason::StopString) {
    pending += decoder.flush();
    emit(pending);
  }
  res.decode_s = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

std::vector<int32_t> stop_token_ids(const ModelConfig& config, const Tokenizer& tokenizer, const GenerationDefaults& defaults) {
  std::vector<int32_t> eos;
  for (int64_t id : defaults.eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  if (eos.empty())
    for (int64_t id : config.eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  for (const char* t : {"<|im_end|>", "<|endoftext|>"})
    if (const int32_t id = tokenizer.token_to_id(t); id >= 0 && std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  return eos;
}

}  // namespace tandem

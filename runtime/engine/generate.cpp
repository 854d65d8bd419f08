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

namespace {

using Clock = std::chrono::steady_clock;

// One request in flight: its slot, sampler, text decoder and result. After each forward that gave its
// logits (or candidates) take_next() samples, streams and decides whether it goes on; next() is the
// token the following step feeds it.
class Live {
 public:
  Live(const GenerateRequest& req, GenerateResult& res, const Tokenizer& tok, int slot, int64_t vocab)
      : req_(req), res_(res), slot_(slot), sampler_(req.sampling), decoder_(tok, /*skip_special=*/true), context_(req.prompt) {
    logits_.resize(static_cast<size_t>(vocab));
    res_.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  }
  int slot() const { return slot_; }
  bool done() const { return done_; }
  int32_t next() const { return res_.tokens.back(); }
  float* logits() { return logits_.data(); }
  // What the runner needs to pick this sequence's candidates on its side (k 0: it needs the row).
  int candidates() const { return sampler_.candidates_needed(); }
  std::vector<LogitPenalty> penalties() const { return sampler_.penalties(context_, res_.tokens); }
  std::vector<std::pair<int32_t, float>>& top() { return top_; }
  void prefilled(double seconds) {
    res_.prefill_s = seconds;
    t_decode_ = Clock::now();
    if (req_.max_new_tokens <= 0) finish(StopReason::MaxTokens);
  }
  // The step gave this sequence's logits row (have_top: its candidates in top()); samples the next
  // token, streams its text, and ends the sequence on eos, a stop string, max_new_tokens or cancel.
  void take_next(bool have_top) {
    if (req_.cancel && req_.cancel->load()) return finish(StopReason::Cancelled);
    const int32_t id = have_top ? sampler_.sample_top(top_) : sampler_.sample(logits_, context_, res_.tokens);
    res_.tokens.push_back(id);
    context_.push_back(id);
    if (std::find(req_.eos_ids.begin(), req_.eos_ids.end(), id) != req_.eos_ids.end()) return finish(StopReason::Eos);
    pending_ += decoder_.push(id);
    if (!req_.stop.empty()) {
      size_t cut = std::string::npos;
      for (const auto& s : req_.stop) cut = std::min(cut, pending_.find(s));
      if (cut != std::string::npos) {
        emit(std::string_view(pending_).substr(0, cut));
        pending_.clear();
        return finish(StopReason::StopString);
      }
      const size_t hold = held_back_suffix(pending_, req_.stop);
      emit(std::string_view(pending_).substr(0, pending_.size() - hold));
      pending_.erase(0, pending_.size() - hold);
    } else {
      emit(pending_);
      pending_.clear();
    }
    if (static_cast<int64_t>(res_.tokens.size()) == req_.max_new_tokens) finish(StopReason::MaxTokens);  // no forward for a token never sampled from
  }

 private:
  void emit(std::string_view s) {
    if (s.empty()) return;
    res_.text.append(s);
    if (req_.on_text) req_.on_text(s);
  }
  void finish(StopReason why) {
    res_.stop = why;
    if (why != StopReason::StopString) {
      pending_ += decoder_.flush();
      emit(pending_);
      pending_.clear();
    }
    res_.decode_s = std::chrono::duration<double>(Clock::now() - t_decode_).count();
    done_ = true;
  }

  const GenerateRequest& req_;
  GenerateResult& res_;
  int slot_;
  Sampler sampler_;
  StreamDecoder decoder_;
  std::vector<int32_t> context_;
  std::string pending_;  // decoded text not yet emitted
  std::vector<float> logits_;
  std::vector<std::pair<int32_t, float>> top_;
  Clock::time_point t_decode_ = Clock::now();
  bool done_ = false;
};

void check_request(const GenerateRequest& req) {
  if (req.prompt.empty()) fail("generate: the prompt is empty (no tokens)");
  for (const auto& s : req.stop)
    if (s.empty()) fail("generate: empty stop string");
}

}  // namespace

std::vector<GenerateResult> generate_batch(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, std::span<const GenerateRequest> reqs) {
  for (const GenerateRequest& r : reqs) check_request(r);
  std::vector<GenerateResult> results(reqs.size());
  std::vector<std::unique_ptr<Live>> active;
  std::vector<int> free_slots;  // the lowest last: taken first
  for (int s = runner.slots() - 1; s >= 0; --s) free_slots.push_back(s);
  size_t waiting = 0;  // the first request not started
  // The runner selects the samplers' candidates itself when it can (the GPU: k pairs cross, not the
  // rows). A runner that declines once is not asked again, so penalty lists are not built for nothing.
  bool try_top = true;
  // One step feeding ids[i] to who[i]; returns whether their candidates (not rows) came back.
  auto run = [&](const std::vector<Live*>& who, const std::vector<std::span<const int32_t>>& ids) {
    std::vector<Runner::Feed> feeds(who.size());
    for (size_t i = 0; i < who.size(); ++i) feeds[i] = {who[i]->slot(), ids[i], who[i]->logits(), Qwen35Moe::LogitRows::Last, false};
    bool all_k = try_top;
    for (Live* l : who) all_k = all_k && l->candidates() > 0;
    if (all_k) {
      std::vector<std::vector<LogitPenalty>> pens(who.size());
      std::vector<Runner::TopWant> want(who.size());
      for (size_t i = 0; i < who.size(); ++i) {
        pens[i] = who[i]->penalties();
        want[i] = {pens[i], who[i]->candidates(), &who[i]->top()};
      }
      if (runner.step_top(feeds, want)) return true;
      try_top = false;
    }
    runner.step(feeds);
    return false;
  };
  auto retire = [&] {  // finished sequences give their slots back
    for (size_t i = 0; i < active.size();)
      if (active[i]->done()) {
        free_slots.push_back(active[i]->slot());
        std::sort(free_slots.rbegin(), free_slots.rend());
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
  };
  while (true) {
    // Waiting requests take free slots; each prompt is fed on its own (a prefill).
    while (waiting < reqs.size() && !free_slots.empty()) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      runner.reset_slot(slot);
      active.push_back(std::make_unique<Live>(reqs[waiting], results[waiting], tokenizer, slot, vocab));
      Live* l = active.back().get();
      const auto t0 = Clock::now();
      const bool top = run({l}, {reqs[waiting].prompt});
      l->prefilled(std::chrono::duration<double>(Clock::now() - t0).count());
      if (!l->done()) l->take_next(top);
      ++waiting;
      retire();
    }
    if (active.empty()) break;
    // Every sequence in flight feeds its last token in one step.
    std::vector<Live*> who;
    std::vector<std::span<const int32_t>> ids;
    std::vector<int32_t> next(active.size());
    for (size_t i = 0; i < active.size(); ++i) {
      next[i] = active[i]->next();
      who.push_back(active[i].get());
      ids.push_back(std::span(&next[i], 1));
    }
    const bool top = run(who, ids);
    for (Live* l : who) l->take_next(top);
    retire();
  }
  return results;
}

GenerateResult generate(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, const GenerateRequest& req) {
  return std::move(generate_batch(runner, vocab, tokenizer, std::span(&req, 1))[0]);
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

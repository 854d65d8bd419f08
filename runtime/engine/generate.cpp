#include "runtime/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdio>
#include <tuple>

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

using Clock = std::chrono::steady_clock;

// One request in flight: its slot, sampler, text decoder and result. The prompt is fed in chunks
// (next_chunk / fed); after each forward that gave its logits (or candidates) take_next() samples,
// streams and decides whether it goes on; next() is the token the following step feeds it.
class Batcher::Live {
 public:
  Live(const GenerateRequest& req, GenerateResult& res, const Tokenizer& tok, int slot, int64_t vocab)
      : req_(req), res_(res), slot_(slot), vocab_(vocab), sampler_(req.sampling), decoder_(tok, /*skip_special=*/true), context_(req.prompt) {
    logits_.resize(static_cast<size_t>(vocab));
    res_ = GenerateResult{};
    res_.prompt_tokens = static_cast<int64_t>(req.prompt.size());
    fed_ = req.resume ? req.resume->position : 0;  // the slot holds the saved sequence
    res_.cached_tokens = fed_;
    if (req.force_after.empty()) force(req.force_ids);
  }
  const GenerateRequest& request() const { return req_; }
  // The prompt's next checkpoint still ahead (-1: none).
  int64_t next_checkpoint() const {
    for (int64_t c : req_.checkpoints)
      if (c > fed_) return c;
    return -1;
  }
  bool at_checkpoint() const { return std::find(req_.checkpoints.begin(), req_.checkpoints.end(), fed_) != req_.checkpoints.end(); }
  int64_t fed_tokens() const { return fed_; }
  std::span<const int32_t> context() const { return context_; }
  int slot() const { return slot_; }
  bool done() const { return done_; }
  StopReason result_stop() const { return res_.stop; }
  bool cancelled() const { return req_.cancel && req_.cancel->load(); }
  // The prompt's next piece (chunk 0: the rest) and whether it is the prompt's last.
  bool prefilling() const { return fed_ < static_cast<int64_t>(req_.prompt.size()); }
  std::span<const int32_t> next_chunk(int64_t chunk) const {  // ends at the next checkpoint, if any
    int64_t n = static_cast<int64_t>(req_.prompt.size()) - fed_;
    if (chunk > 0) n = std::min(chunk, n);
    if (const int64_t c = next_checkpoint(); c > 0) n = std::min(n, c - fed_);
    return std::span(req_.prompt.data() + fed_, static_cast<size_t>(n));
  }
  bool last_chunk(int64_t chunk) const { return fed_ + static_cast<int64_t>(next_chunk(chunk).size()) == static_cast<int64_t>(req_.prompt.size()); }
  void fed(int64_t n) { fed_ += n; }
  int32_t next() const { return res_.tokens.back(); }
  float* logits() { return logits_.data(); }
  // What the runner needs to pick this sequence's candidates on its side (k 0: it needs the row).
  int candidates() const { return sampler_.candidates_needed(); }
  // What this step wants picked for it on the runner's side (Runner::step_top): its next token's row, or
  // with `verifying` every row of propose()'s feed, row i with the penalties of the context as it
  // will be when drafts 0..i-1 are accepted. The lists go to `pens` (kept alive by the caller).
  void wants(bool verifying, std::deque<std::vector<LogitPenalty>>& pens, std::vector<Runner::TopWant>& want) {
    const size_t rows = verifying ? feed_.size() : 1;
    tops_.resize(rows);
    pens.push_back(sampler_.penalties(context_, res_.tokens));
    want.push_back({pens.back(), candidates(), &tops_[0]});
    if (rows == 1) return;
    const bool penalised = sampler_.penalised();
    std::vector<int32_t> ctx, gen;  // the context as it is when the drafts before the row are accepted (penalties only)
    if (penalised) ctx = context_, gen = res_.tokens;
    for (size_t i = 1; i < rows; ++i) {
      if (penalised) {
        ctx.push_back(drafts_[i - 1]), gen.push_back(drafts_[i - 1]);
        pens.push_back(sampler_.penalties(ctx, gen));
      } else {
        pens.emplace_back();  // no penalties: none to name
      }
      want.push_back({pens.back(), candidates(), &tops_[i]});
    }
  }
  void prefilled() {
    res_.prefill_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
    t_decode_ = Clock::now();
    if (req_.max_new_tokens <= 0) finish(StopReason::MaxTokens);
  }
  // The step gave this sequence's logits row (have_top: its candidates in top()); samples the next
  // token, streams its text, and ends the sequence on eos, a stop string, max_new_tokens or cancel.
  void take_next(bool have_top) {
    if (cancelled()) return finish(StopReason::Cancelled);
    if (!forcing_.empty()) {  // forced text: its token, not the logits'
      const int32_t id = forcing_.front();
      forcing_.pop_front();
      return commit(id);
    }
    commit(have_top ? sampler_.sample_top(tops_[0]) : sampler_.sample(std::span(logits_).first(vocab_), context_, res_.tokens));
  }

  // Speculative decoding. How many drafts this step should verify (0: an ordinary step): what the
  // request asks (kDraftAuto: what the runner's tuner picks), within what the runner drafts, the
  // tokens still allowed and the context. alone: no other sequence in flight; beside others a sequence
  // drafts only with --draft N on a runner that verifies several sequences in one step
  // (Runner::keeps_several; elsewhere a verification is a step of its own and a plain token in the
  // others' batched step pays more), and --draft auto never (its tuner times one sequence's steps).
  int drafts_wanted(const Runner& r, bool alone) const {
    if (req_.draft == 0 || prefilling() || done_ || !forcing_.empty()) return 0;
    if (!alone && (req_.draft == kDraftAuto || !r.keeps_several())) return 0;
    const int asked = req_.draft != kDraftAuto ? req_.draft : r.draft_tuner() ? r.draft_tuner()->choose() : r.max_draft();
    if (asked <= 0) return 0;
    int64_t k = std::min<int64_t>(asked, r.max_draft());
    k = std::min(k, req_.max_new_tokens - static_cast<int64_t>(res_.tokens.size()) - 1);
    k = std::min(k, r.max_context() - r.position(slot_) - 1);
    return static_cast<int>(std::max<int64_t>(k, 0));
  }
  // The runner's k drafts to follow next() (sampled ones drawn from the head's distribution with this
  // request's sampler, which is kept for the acceptance test); returns what the step feeds: next() and them.
  bool drafts_auto() const { return req_.draft == kDraftAuto; }
  int last_drafts() const { return static_cast<int>(drafts_.size()); }
  std::span<const int32_t> propose(Runner& r, int k) {
    drafts_.assign(static_cast<size_t>(k), 0);
    q_.clear();
    DraftPick pick;
    if (!sampler_.greedy())
      pick = [this](int i, std::span<const float> logits) {
        std::vector<int32_t> ctx(context_), gen(res_.tokens);  // as they will be if drafts 0..i-1 are accepted
        ctx.insert(ctx.end(), drafts_.begin(), drafts_.begin() + i);
        gen.insert(gen.end(), drafts_.begin(), drafts_.begin() + i);
        q_.push_back(sampler_.distribution(logits, ctx, gen));
        return sampler_.draw_from(q_.back());
      };
    r.draft(slot_, next(), drafts_, pick);
    feed_.assign(1, next());
    feed_.insert(feed_.end(), drafts_.begin(), drafts_.end());
    logits_.resize(feed_.size() * static_cast<size_t>(vocab_));
    return feed_;
  }
  // After the step that fed propose()'s tokens (a logits row each, or with have_top each row's
  // candidates, wants()): row i decides the token after feed_[i]: the draft when the model agrees
  // (greedy: the same token; sampling: the acceptance rule), else the model's own token, which ends the
  // step; all drafts agreed: row k's token as well. Returns how many of the fed tokens the sequence
  // keeps (every committed token but the last is fed).
  int64_t verify(bool have_top) {
    const size_t k = drafts_.size();
    DraftStats& st = res_.drafts;
    ++st.verify_steps;
    if (st.drafted.size() < k) st.drafted.resize(k, 0), st.accepted.resize(k, 0);
    int64_t committed = 0;
    for (size_t i = 0; i <= k && !done_; ++i) {
      if (cancelled()) {
        finish(StopReason::Cancelled);
        break;
      }
      const std::span<const float> row(logits_.data() + i * static_cast<size_t>(vocab_), static_cast<size_t>(vocab_));
      auto sample = [&] { return have_top ? sampler_.sample_top(tops_[i]) : sampler_.sample(row, context_, res_.tokens); };
      bool accepted = false;
      int32_t id = 0;
      if (i < k) {
        if (sampler_.greedy()) {
          id = sample();
          accepted = id == drafts_[i];
        } else {
          const Sampler::Dist p = have_top ? sampler_.distribution_top(tops_[i]) : sampler_.distribution(row, context_, res_.tokens);
          std::tie(accepted, id) = sampler_.verify_draft(p, q_[i], drafts_[i]);
        }
        ++st.drafted[i];
        st.accepted[i] += accepted;
      } else {
        id = sample();
      }
      commit(id);
      ++committed;
      if (i < k && !accepted) break;
      if (!forcing_.empty()) break;  // the forced text's trigger: the tokens after it are the forced ones
    }
    return std::max<int64_t>(committed, 1);
  }

  // Appends a chosen token: streams its text and ends the sequence on eos, a stop string or max_new_tokens.
  void commit(int32_t id) {
    res_.tokens.push_back(id);
    context_.push_back(id);
    if (std::find(req_.eos_ids.begin(), req_.eos_ids.end(), id) != req_.eos_ids.end()) return finish(StopReason::Eos);
    pending_ += decoder_.push(id);
    if (!req_.stop.empty()) {
      size_t cut = std::string::npos;
      for (const auto& s : req_.stop)
        if (const size_t at = pending_.find(s); at < cut) cut = at, res_.stop_string = s;
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
    if (static_cast<int64_t>(res_.tokens.size()) == req_.max_new_tokens) return finish(StopReason::MaxTokens);  // no forward for a token never sampled from
    if (!forced_ && !req_.force_after.empty() && ends_with_trigger()) force(req_.force_ids);
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
    if (req_.on_done) req_.on_done();
  }

 private:
  void force(const std::vector<int32_t>& ids) {
    forced_ = true;
    forcing_.assign(ids.begin(), ids.end());
  }
  // Whether the reply's text so far (emitted, then held back) ends with force_after.
  bool ends_with_trigger() const {
    const std::string& t = req_.force_after;
    if (res_.text.size() + pending_.size() < t.size()) return false;
    const size_t from_pending = std::min(t.size(), pending_.size());
    const size_t from_text = t.size() - from_pending;
    return std::string_view(pending_).substr(pending_.size() - from_pending) == std::string_view(t).substr(from_text) &&
           std::string_view(res_.text).substr(res_.text.size() - from_text) == std::string_view(t).substr(0, from_text);
  }
  void emit(std::string_view s) {
    if (s.empty()) return;
    res_.text.append(s);
    if (req_.on_text) req_.on_text(s);
  }

  GenerateRequest req_;  // a copy: the caller's may go away once added
  GenerateResult& res_;
  int slot_;
  int64_t vocab_;
  Sampler sampler_;
  StreamDecoder decoder_;
  std::vector<int32_t> context_;
  std::string pending_;  // decoded text not yet emitted
  std::vector<float> logits_;  // [vocab], or a row for each token a verification step feeds
  std::vector<std::vector<std::pair<int32_t, float>>> tops_;  // candidates per wanted row (wants())
  std::vector<int32_t> drafts_, feed_;  // the step's drafts, and what it feeds: next() and the drafts
  std::vector<Sampler::Dist> q_;        // the drafts' distributions (sampling)
  std::deque<int32_t> forcing_;         // forced tokens still to commit (GenerateRequest::force_ids)
  bool forced_ = false;                 // the forced text has been triggered
  int64_t fed_ = 0;      // prompt tokens fed (or resumed)
  Clock::time_point t_start_ = Clock::now(), t_decode_ = Clock::now();
  bool done_ = false;
};

namespace {

void check_request(const GenerateRequest& req) {
  if (req.prompt.empty()) fail("generate: the prompt is empty (no tokens)");
  for (const auto& s : req.stop)
    if (s.empty()) fail("generate: empty stop string");
  const auto n = static_cast<int64_t>(req.prompt.size());
  const int64_t from = req.resume ? req.resume->position : 0;
  if (req.resume && (from < 1 || from >= n)) fail("generate: a resumed sequence of ", from, " tokens for a prompt of ", n, " (it must be shorter)");
  int64_t last = from;
  for (int64_t c : req.checkpoints) {
    if (c <= last || c >= n) fail("generate: checkpoint ", c, " is not increasing inside ", from + 1, "..", n - 1);
    last = c;
  }
}

}  // namespace

Batcher::Batcher(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, int64_t prefill_chunk)
    : runner_(runner), vocab_(vocab), tokenizer_(tokenizer), chunk_(prefill_chunk) {
  if (prefill_chunk < 0) fail("prefill chunk ", prefill_chunk, " must be 0 (whole prompts) or positive");
  for (int s = runner.slots() - 1; s >= 0; --s) free_slots_.push_back(s);
}

Batcher::~Batcher() = default;

void Batcher::add(const GenerateRequest& req, GenerateResult* out) {
  check_request(req);
  if (!out) fail("internal: Batcher::add without a result");
  waiting_.push_back({req, out});
}

size_t Batcher::running() const { return active_.size(); }

// One step feeding ids[i] to who[i] with logits; returns whether their candidates (not rows) came back.
// A verifying feed (verify[i]) keeps its states and gets every row's logits, or every row's candidates
// when the runner picks them (step_top; returns whether it did).
bool Batcher::run(const std::vector<Live*>& who, const std::vector<std::span<const int32_t>>& ids, const std::vector<uint8_t>& verify) {
  std::vector<Runner::Feed> feeds(who.size());
  for (size_t i = 0; i < who.size(); ++i) {
    feeds[i] = {who[i]->slot(), ids[i], who[i]->logits(), verify[i] ? Qwen35Moe::LogitRows::All : Qwen35Moe::LogitRows::Last, verify[i] != 0};
  }
  bool all_k = try_top_;
  for (Live* l : who) all_k = all_k && l->candidates() > 0;
  if (all_k) {
    std::deque<std::vector<LogitPenalty>> pens;  // the wants' lists, where they stay put
    std::vector<Runner::TopWant> want;
    for (size_t i = 0; i < who.size(); ++i) who[i]->wants(verify[i] != 0, pens, want);
    if (runner_.step_top(feeds, want)) return true;
    try_top_ = false;  // a runner that declines once is not asked again (penalty lists not built for nothing)
  }
  runner_.step(feeds);
  return false;
}

// After a prompt chunk (once per chunk: the fed count only grows): the sequence when it is at one of its
// checkpoints. After the reply's last token: the sequence when it ended on eos (all but the eos fed).
void Batcher::checkpoint(const Live& l) {
  const GenerateRequest& r = l.request();
  if (!r.on_checkpoint || !runner_.saves_sequences()) return;
  if (l.prefilling()) {
    if (l.at_checkpoint()) r.on_checkpoint(std::span(r.prompt).first(static_cast<size_t>(l.fed_tokens())), runner_.save(l.slot()));
    return;
  }
  if (!l.done() || !r.checkpoint_reply || l.result_stop() != StopReason::Eos) return;
  const std::span<const int32_t> held = l.context().first(l.context().size() - 1);
  if (static_cast<int64_t>(held.size()) == runner_.position(l.slot())) r.on_checkpoint(held, runner_.save(l.slot()));
}

void Batcher::retire() {  // finished sequences give their slots back (the lowest is taken first)
  for (size_t i = 0; i < active_.size();)
    if (active_[i]->done()) {
      free_slots_.push_back(active_[i]->slot());
      std::sort(free_slots_.rbegin(), free_slots_.rend());
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
}

void Batcher::step() {
  while (!waiting_.empty() && !free_slots_.empty()) {  // waiting requests take free slots
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    const Queued& q = waiting_.front();
    if (q.req.resume) runner_.restore(slot, *q.req.resume);
    else runner_.reset_slot(slot);
    active_.push_back(std::make_unique<Live>(q.req, *q.out, tokenizer_, slot, vocab_));
    waiting_.pop_front();
  }
  for (auto& l : active_)  // a cancelled request still reading its prompt leaves now
    if (l->prefilling() && l->cancelled()) l->finish(StopReason::Cancelled);
  retire();
  if (active_.empty()) return;
  // Prompts go in chunks of chunk_ while another sequence decodes (the chunks keep its steps coming);
  // with none decoding, in pieces kAloneChunks times larger (a long prompt's faster path: the GPU's
  // streamed prefill of the host's experts pays from a few hundred tokens in one forward; a cancel or
  // a new request still waits one piece at most).
  const bool decoding = std::any_of(active_.begin(), active_.end(), [](const auto& l) { return !l->prefilling(); });
  const int64_t chunk = decoding ? chunk_ : chunk_ * kAloneChunks;
  // Prompts not at their last chunk: fed first, no logits.
  std::vector<Runner::Feed> partial;
  std::vector<uint8_t> in_partial(active_.size(), 0);
  for (size_t i = 0; i < active_.size(); ++i)
    if (Live* l = active_[i].get(); l->prefilling() && !l->last_chunk(chunk)) {
      partial.push_back({l->slot(), l->next_chunk(chunk), nullptr, Qwen35Moe::LogitRows::Last, false});
      in_partial[i] = 1;
    }
  if (!partial.empty()) {
    runner_.step(partial);
    for (size_t i = 0; i < active_.size(); ++i)
      if (in_partial[i]) {
        active_[i]->fed(static_cast<int64_t>(active_[i]->next_chunk(chunk).size()));
        checkpoint(*active_[i]);
      }
  }
  // Every other sequence: its prompt's last chunk or its next token, together. --draft auto: a step
  // of one decoding sequence is timed for the runner's tuner (its drafts, verification and rollback).
  const Clock::time_point t0 = Clock::now();
  const bool alone = active_.size() == 1;  // no other sequence in flight (Live::drafts_wanted)
  const bool timed = runner_.draft_tuner() && partial.empty() && alone && !active_[0]->prefilling() && active_[0]->drafts_auto();
  std::vector<Live*> who;
  std::vector<std::span<const int32_t>> ids;
  std::vector<uint8_t> verify;
  std::vector<int32_t> next(active_.size());
  for (size_t i = 0; i < active_.size(); ++i) {
    Live* l = active_[i].get();
    if (in_partial[i]) continue;  // fed its chunk above: one piece a step
    verify.push_back(0);
    if (l->prefilling()) {
      ids.push_back(l->next_chunk(chunk));
    } else if (const int k = l->drafts_wanted(runner_, alone); k > 0) {
      ids.push_back(l->propose(runner_, k));
      verify.back() = 1;
    } else {
      next[i] = l->next();
      ids.push_back(std::span(&next[i], 1));
    }
    who.push_back(l);
  }
  if (!who.empty()) {
    const bool top = run(who, ids, verify);
    for (size_t i = 0; i < who.size(); ++i) {
      if (who[i]->prefilling()) {  // its prompt's last chunk went in this step
        who[i]->fed(static_cast<int64_t>(ids[i].size()));
        who[i]->prefilled();
        if (who[i]->done()) continue;
      }
      int64_t kept = 1;
      if (verify[i]) runner_.rollback(who[i]->slot(), kept = who[i]->verify(top));
      else who[i]->take_next(top);
      if (timed) {
        const int k = verify[i] ? who[i]->last_drafts() : 0;
        runner_.draft_tuner()->record(k, static_cast<int>(std::clamp<int64_t>(kept - 1, 0, k)),
                                      std::chrono::duration<double>(Clock::now() - t0).count());
      }
      checkpoint(*who[i]);
    }
  }
  retire();
}

std::vector<GenerateResult> generate_batch(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, std::span<const GenerateRequest> reqs) {
  std::vector<GenerateResult> results(reqs.size());
  Batcher b(runner, vocab, tokenizer);  // add() checks each request before any step runs
  for (size_t i = 0; i < reqs.size(); ++i) b.add(reqs[i], &results[i]);
  while (!b.idle()) b.step();
  return results;
}

GenerateResult generate(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, const GenerateRequest& req) {
  return std::move(generate_batch(runner, vocab, tokenizer, std::span(&req, 1))[0]);
}

void DraftStats::add(const DraftStats& o) {
  verify_steps += o.verify_steps;
  if (drafted.size() < o.drafted.size()) drafted.resize(o.drafted.size(), 0), accepted.resize(o.drafted.size(), 0);
  for (size_t i = 0; i < o.drafted.size(); ++i) drafted[i] += o.drafted[i], accepted[i] += o.accepted[i];
}

double DraftStats::tokens_per_step() const {
  if (verify_steps == 0) return 0;
  int64_t tokens = verify_steps;
  for (int64_t a : accepted) tokens += a;
  return static_cast<double>(tokens) / static_cast<double>(verify_steps);
}

std::vector<double> DraftStats::acceptance() const {
  std::vector<double> out;
  for (size_t i = 0; i < drafted.size(); ++i) out.push_back(drafted[i] ? static_cast<double>(accepted[i]) / static_cast<double>(drafted[i]) : 0.0);
  return out;
}

std::string DraftStats::summary() const {
  if (verify_steps == 0) return {};
  auto two = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", v);
    return std::string(b);
  };
  std::string s = "drafts: " + two(tokens_per_step()) + " tokens a step, accepted";
  const std::vector<double> acc = acceptance();
  for (size_t i = 0; i < acc.size(); ++i) s += std::string(i ? " /" : "") + " " + (drafted[i] ? two(acc[i]) : "-");
  return s + " by position";
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

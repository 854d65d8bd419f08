#include "runtime/server/scheduler.h"

#include <algorithm>
#include <exception>

namespace tandem::server {

bool Ticket::take(std::string& out, std::chrono::milliseconds wait) {
  std::unique_lock l(m_);
  cv_.wait_for(l, wait, [&] { return done_ || !text_.empty(); });
  out += text_;
  text_.clear();
  return done_;
}

double Ticket::ttft_s() const {
  const Clock::time_point t = first_ == Clock::time_point{} ? Clock::now() : first_;
  return std::chrono::duration<double>(t - submitted).count();
}

void Ticket::emit(std::string_view text) {
  std::lock_guard l(m_);
  if (first_ == Clock::time_point{}) first_ = Clock::now();
  text_.append(text);
  cv_.notify_all();
}

void Ticket::end(std::string error) {
  std::lock_guard l(m_);
  if (first_ == Clock::time_point{}) first_ = Clock::now();
  error_ = std::move(error);
  done_ = true;
  cv_.notify_all();
}

Scheduler::Scheduler(Runner& runner, int64_t vocab, const Tokenizer& tokenizer, SchedulerOptions opts)
    : runner_(runner), vocab_(vocab), tokenizer_(tokenizer), opts_(opts) {
  batcher_ = std::make_unique<Batcher>(runner_, vocab_, tokenizer_, opts_.prefill_chunk);
  totals_.slots = runner_.slots();
  if (opts_.cache_bytes == 0) cache_note_ = "off (--cache-bytes 0)";
  else if (!runner_.saves_sequences()) cache_note_ = "off (this device keeps no sequence snapshots yet)";
  else cache_ = std::make_unique<PrefixCache>(opts_.cache_bytes);
  im_end_ = tokenizer_.token_to_id("<|im_end|>");
  if (const std::vector<int32_t> nl = tokenizer_.encode("\n"); nl.size() == 1) newline_ = nl[0];
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard l(m_);
    stop_ = true;
    for (auto& in : incoming_) in.ticket->cancel = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Ticket> Scheduler::submit(GenerateRequest req, Refusal& why) {
  auto t = std::make_shared<Ticket>();
  Ticket* raw = t.get();  // the engine thread holds the ticket (live_) until it has ended
  req.on_text = [raw](std::string_view s) { raw->emit(s); };
  req.cancel = &t->cancel;
  {
    std::lock_guard l(m_);
    why = Refusal::none;
    if (draining_ || stop_) why = Refusal::draining;
    // every request not yet ended: at most a slot each plus max_queue waiting
    else if (incoming_.size() + in_batcher_.load() >= static_cast<size_t>(totals_.slots) + opts_.max_queue) why = Refusal::queue_full;
    if (why != Refusal::none) return nullptr;
    incoming_.push_back({std::move(req), t});
  }
  cv_.notify_all();
  return t;
}

void Scheduler::drain() {
  std::lock_guard l(m_);
  draining_ = true;
}

bool Scheduler::idle() const {
  std::lock_guard l(m_);
  return incoming_.empty() && in_batcher_.load() == 0;
}

Scheduler::Stats Scheduler::stats() const {
  std::lock_guard l(m_);
  Stats s = totals_;
  s.running = running_.load();
  s.queued = incoming_.size() + in_batcher_.load() - std::min(in_batcher_.load(), s.running);
  return s;
}

// Where a prompt is saved: after its last message (the end of a "<|im_end|>\n"; the next turn of the
// conversation starts the same way) and every cache_every tokens, all past the resumed part and
// before the prompt's last token (which must be fed for its logits).
std::vector<int64_t> Scheduler::checkpoints(std::span<const int32_t> prompt, int64_t from) const {
  const auto n = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> at;
  if (opts_.cache_every > 0)
    for (int64_t c = (from / opts_.cache_every + 1) * opts_.cache_every; c < n; c += opts_.cache_every) at.push_back(c);
  if (im_end_ >= 0 && newline_ >= 0)
    for (int64_t i = n - 1; i >= 2 && i > from; --i)
      if (prompt[i - 1] == newline_ && prompt[i - 2] == im_end_) {
        at.push_back(i);
        break;
      }
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return at;
}

// With the cache: resume from the longest saved prefix, save at the checkpoints and after the reply.
void Scheduler::use_cache(GenerateRequest& req) {
  if (!cache_) return;
  req.resume = cache_->find(req.prompt);
  req.checkpoints = checkpoints(req.prompt, req.resume ? req.resume->position : 0);
  req.checkpoint_reply = true;
  PrefixCache* cache = cache_.get();
  req.on_checkpoint = [cache](std::span<const int32_t> tokens, std::shared_ptr<const SequenceSnapshot> saved) { cache->add(tokens, std::move(saved)); };
}

// The engine failed mid-step: every request it held that had not ended (on_done, earlier in the step)
// ends with the error, and a fresh batcher takes the next ones (each request resets its slot when it
// takes one).
void Scheduler::fail_all(const std::string& why) {
  std::vector<std::shared_ptr<Ticket>> held;
  held.swap(live_);
  in_batcher_ = 0;  // before any reply goes out: a client that sends its next request at once finds room
  size_t failed = 0;
  for (auto& t : held) failed += !t->done_;  // done_: written on this thread (on_done)
  {
    std::lock_guard l(m_);
    totals_.failed += failed;
  }
  for (auto& t : held)
    if (!t->done_) t->end("the engine failed: " + why);
  batcher_ = std::make_unique<Batcher>(runner_, vocab_, tokenizer_, opts_.prefill_chunk);
}

void Scheduler::loop() {
  for (;;) {
    std::deque<Incoming> take;
    {
      std::unique_lock l(m_);
      cv_.wait(l, [&] { return stop_ || !incoming_.empty() || !live_.empty(); });
      if (stop_) {
        for (auto& t : live_) t->cancel = true;
        for (auto& in : incoming_) in.ticket->end("the server stopped before the request started");
        incoming_.clear();
        if (live_.empty()) break;
      }
      take.swap(incoming_);
    }
    for (Incoming& in : take) {
      Ticket* raw = in.ticket.get();
      in.req.on_done = [this, raw] {  // in step(), on this thread
        const GenerateResult& r = raw->result_;
        {
          std::lock_guard l(m_);
          totals_.requests += 1;
          totals_.prompt_tokens += static_cast<uint64_t>(r.prompt_tokens);
          totals_.generated_tokens += r.tokens.size();
          totals_.timed_out += raw->timed_out_;
          totals_.cancelled += r.stop == StopReason::Cancelled && !raw->timed_out_;
          totals_.drafts.add(r.drafts);
        }
        // Its slot counts as free before the reply goes out: a client that sends its next request as soon
        // as this one's reply arrives must not be refused for the slot it just left (one slot, no queue).
        --in_batcher_;
        raw->end();
      };
      try {
        use_cache(in.req);
        batcher_->add(in.req, &in.ticket->result_);
        live_.push_back(in.ticket);
      } catch (const std::exception& e) {
        in.ticket->end(e.what());
      }
    }
    if (opts_.timeout_s > 0) {
      const Clock::time_point now = Clock::now();
      for (auto& t : live_)
        if (!t->timed_out_ && std::chrono::duration<double>(now - t->submitted).count() > opts_.timeout_s) t->timed_out_ = true, t->cancel = true;
    }
    in_batcher_ = live_.size();
    const Clock::time_point t0 = Clock::now();
    try {
      batcher_->step();
    } catch (const std::exception& e) {
      fail_all(e.what());
    }
    {
      std::lock_guard l(m_);
      totals_.busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    live_.erase(std::remove_if(live_.begin(), live_.end(), [](const std::shared_ptr<Ticket>& t) { return t->done_; }), live_.end());
    in_batcher_ = live_.size();
    running_ = batcher_->running();
  }
}

}  // namespace tandem::server

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

// The engine failed mid-step: every request it held ends with the error, and a fresh batcher takes
// the next ones (each request resets its slot when it takes one).
void Scheduler::fail_all(const std::string& why) {
  for (auto& t : live_) t->end("the engine failed: " + why);
  {
    std::lock_guard l(m_);
    totals_.failed += live_.size();
  }
  live_.clear();
  batcher_ = std::make_unique<Batcher>(runner_, vocab_, tokenizer_, opts_.prefill_chunk);
}

void Scheduler::loop() {
  for (;;) {
    std::deque<Incoming> take;
    {
      std::unique_lock l(m_);
      cv_.wait(l, [&] { return stop_ || !incoming_.empty() || !live_.empty(); });
      if (stop_)
        for (auto& t : live_) t->cancel = true;
      if (stop_ && live_.empty()) break;
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
        }
        raw->end();
      };
      try {
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

#include "core/trace.h"

#include <atomic>
#include <cstdio>
#include <memory>

#include "core/error.h"

namespace tandem {

namespace {

std::unique_ptr<Trace> g_trace;
std::atomic<Trace*> g_active{nullptr};

int thread_number() {
  static std::atomic<int> next{1};
  thread_local int id = next.fetch_add(1);
  return id;
}

void json_escape(std::string& out, const std::string& s) {
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
}

}  // namespace

Trace* Trace::active() { return g_active.load(std::memory_order_acquire); }

void Trace::start(const std::string& path) {
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {  // fail now, not after the run
    std::fclose(f);
  } else {
    fail(path, ": cannot write the trace (--trace)");
  }
  g_active.store(nullptr);
  g_trace.reset(new Trace(path));
  g_active.store(g_trace.get(), std::memory_order_release);
}

void Trace::finish() {
  Trace* t = g_active.exchange(nullptr);
  if (!t) return;
  t->write();
  g_trace.reset();
}

Trace::Trace(std::string path) : path_(std::move(path)), t0_(std::chrono::steady_clock::now()) {}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

void Trace::host_span(const std::string& name, const char* category, double begin_us, double end_us) {
  const int tid = thread_number();
  std::lock_guard lock(mu_);
  events_.push_back({name, category, 1, tid, begin_us, end_us - begin_us});
}

void Trace::gpu_span(const std::string& name, const char* category, double begin_us, double end_us) {
  std::lock_guard lock(mu_);
  events_.push_back({name, category, 2, 1, begin_us, end_us - begin_us});
}

size_t Trace::size() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

void Trace::write() const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"host\"}},\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"args\":{\"name\":\"GPU stream\"}}";
  std::lock_guard lock(mu_);
  char buf[160];
  for (const Event& e : events_) {
    out += ",\n{\"name\":\"";
    json_escape(out, e.name);
    std::snprintf(buf, sizeof buf, "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", e.cat, e.pid, e.tid,
                  e.ts, e.dur < 0 ? 0.0 : e.dur);
    out += buf;
  }
  out += "\n]}\n";
  std::FILE* f = std::fopen(path_.c_str(), "wb");
  if (!f) fail(path_, ": cannot write the trace (--trace)");
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) fail(path_, ": writing the trace failed");
}

TraceSpan::TraceSpan(const char* name, const char* category, int index)
    : t_(Trace::active()), name_(name), cat_(category), index_(index) {
  if (t_) begin_ = t_->now_us();
}

TraceSpan::~TraceSpan() {
  if (!t_) return;
  t_->host_span(index_ >= 0 ? str_cat(name_, " ", index_) : std::string(name_), cat_, begin_, t_->now_us());
}

}  // namespace tandem

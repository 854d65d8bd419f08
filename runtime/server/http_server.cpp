#include "runtime/server/http_server.h"

#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "runtime/server/api.h"

namespace tandem::server {

namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

// Equal without an early exit on the first differing byte (the key's length is not secret).
bool same_key(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Api api_of_path(const std::string& path) { return path.rfind("/v1/messages", 0) == 0 ? Api::messages : Api::chat; }

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(wire(body), "application/json");
}

// Non-streaming replies (Service::generate): how long one may take and still go out as one body, and
// the interval of the whitespace that keeps a longer one's connection probed.
constexpr std::chrono::milliseconds kWholeWait{1000}, kHeartbeat{1000};

// Waits on a request until `until` or its end (its text is not wanted: the reply is built from the
// result); whether it ended.
bool wait_end(Ticket& t, Clock::time_point until) {
  for (std::string ignored; Clock::now() < until; ignored.clear())
    if (t.take(ignored, std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()) + std::chrono::milliseconds(1))) return true;
  return false;
}

class Service {
 public:
  Service(Session& s, const ServeOptions& o)
      : s_(s), o_(o), sched_(*s.runner, s.model->config().vocab_size, *s.tokenizer, o.scheduler), started_(unix_now()) {
    d_.model = o.model_id;
    d_.sampling = s.defaults.sampling;
    d_.eos = s.eos;
    std::random_device rd;
    char stamp[16];
    std::snprintf(stamp, sizeof stamp, "%08x", rd());
    stamp_ = stamp;
  }
  Scheduler& scheduler() { return sched_; }

  void routes(httplib::Server& svr) {
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::chat); });
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::completion); });
    svr.Post("/v1/messages", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::messages); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) { models(r); });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& r) { health(r); });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) { metrics(r); });
    svr.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) { tokenize(q, r); });
    svr.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) { detokenize(q, r); });
    svr.set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& r) { return authorize(q, r); });
    svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& q, httplib::Response& r) { return error_page(q, r); }));
    svr.set_exception_handler([this](const httplib::Request& q, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      fail(q, r, api_of_path(q.path), 500, "internal error: " + what, "");
    });
  }

 private:
  using HR = httplib::Server::HandlerResponse;

  void fail(const httplib::Request& q, httplib::Response& r, Api api, int status, const std::string& message, const std::string& param) {
    send_json(r, status, error_body(api, status, message, param));
    ++http_errors_;
    std::fprintf(stderr, "tandem serve: %s %s -> %d: %s\n", q.method.c_str(), q.path.c_str(), status, message.c_str());
  }

  HR authorize(const httplib::Request& q, httplib::Response& r) {
    if (o_.api_key.empty() || q.path == "/health") return HR::Unhandled;
    std::string given;
    if (const std::string auth = q.get_header_value("Authorization"); auth.rfind("Bearer ", 0) == 0) given = auth.substr(7);
    else given = q.get_header_value("x-api-key");
    if (same_key(given, o_.api_key)) return HR::Unhandled;
    r.set_header("WWW-Authenticate", "Bearer");
    fail(q, r, api_of_path(q.path), 401, given.empty() ? "an API key is required (Authorization: Bearer KEY or x-api-key: KEY)" : "the API key is not valid", "");
    return HR::Handled;
  }

  HR error_page(const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return HR::Unhandled;  // one of ours, already JSON
    const Api api = api_of_path(q.path);
    if (r.status == 404) fail(q, r, api, 404, str_cat("no such endpoint: ", q.method, " ", q.path), "");
    else if (r.status == 413) fail(q, r, api, 413, str_cat("the request body is over this server's limit of ", o_.max_body_bytes, " bytes"), "");
    else fail(q, r, api, r.status, str_cat("HTTP ", r.status), "");
    return HR::Handled;
  }

  bool body_json(const httplib::Request& q, httplib::Response& r, Api api, Json& body) {
    try {
      body = Json::parse(q.body);
      return true;
    } catch (const Json::parse_error& e) {
      fail(q, r, api, 400, str_cat("the request body is not valid JSON: ", e.what()), "");
      return false;
    }
  }

  static const char* id_prefix(Api api) { return api == Api::chat ? "chatcmpl-" : api == Api::completion ? "cmpl-" : "msg_"; }

  void log_reply(const std::string& id, const std::string& path, const Ticket& t, const std::string& finish) {
    const GenerateResult& r = t.result();
    const std::string drafts = r.drafts.summary();
    std::fprintf(stderr, "tandem serve: %s %s prompt %lld (cached %lld), %zu tokens, TTFT %.0f ms, %.1f tok/s, %s%s%s%s\n", id.c_str(), path.c_str(),
                 static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.cached_tokens), r.tokens.size(), t.ttft_s() * 1e3, r.decode_tok_s(), finish.c_str(),
                 t.timed_out() ? " (timed out)" : r.stop == StopReason::Cancelled ? " (cancelled)" : "", drafts.empty() ? "" : ", ", drafts.c_str());
  }

  void generate(const httplib::Request& q, httplib::Response& r, Api api) {
    Json body;
    if (!body_json(q, r, api, body)) return;
    auto job = std::make_shared<Job>();
    try {
      *job = api == Api::chat ? parse_chat(body, d_) : api == Api::completion ? parse_completion(body, d_) : parse_messages(body, d_);
    } catch (const ApiError& e) {
      return fail(q, r, api, e.status, e.what(), e.param);
    }
    const char* prompt_field = api == Api::completion ? "prompt" : "messages";
    GenerateRequest g;
    g.prompt = s_.tokenizer->encode(job->prompt);
    const auto n = static_cast<int64_t>(g.prompt.size());
    const int64_t ctx = s_.runner->max_context();
    if (n == 0) return fail(q, r, api, 400, "the prompt is empty", prompt_field);
    if (n >= ctx) return fail(q, r, api, 400, str_cat("the prompt is ", n, " tokens; the context holds ", ctx, " (tandem serve --context)"), prompt_field);
    g.max_new_tokens = job->max_tokens < 0 ? ctx - n : std::min(job->max_tokens, ctx - n);  // what fits the context
    g.sampling = job->sampling;
    g.draft = s_.runner->request_draft();  // speculative decoding when the server was started with --draft
    if (!job->ignore_eos) g.eos_ids = d_.eos;
    g.stop = job->stop;
    if (!job->force_text.empty()) {  // tool_choice: the reply opens a call
      g.force_after = job->force_after;
      g.force_ids = s_.tokenizer->encode(job->force_text);
    }
    Scheduler::Refusal why;
    std::shared_ptr<Ticket> t = sched_.submit(std::move(g), why);
    if (!t) {
      r.set_header("Retry-After", "1");
      return fail(q, r, api, 503, why == Scheduler::Refusal::queue_full ? "every slot is busy and the queue is full: retry later" : "the server is shutting down", "");
    }
    const std::string id = id_prefix(api) + stamp_ + std::to_string(++serial_);
    auto reply = std::make_shared<Reply>(*job, id, unix_now());
    if (!job->stream) {
      // A reply ready within kWholeWait goes out as one JSON body with its status. A longer one is sent
      // chunked: whitespace (which JSON allows before a value) every kHeartbeat while it runs, so a
      // client that went away fails a write and its slot frees at the next step as a stream's does; then
      // the body. An engine error after the heartbeats began can no longer change the status: the
      // connection is dropped without the body's end (the client sees a broken reply), and logged.
      if (wait_end(*t, Clock::now() + kWholeWait)) {
        if (!t->error().empty()) return fail(q, r, api, 500, t->error(), "");
        send_json(r, 200, reply->whole(t->result(), t->result().cached_tokens));
        log_reply(id, q.path, *t, reply->finish_reason(t->result()));
        return;
      }
      const std::string path = q.path;
      r.set_chunked_content_provider(
          "application/json",
          [this, t, reply, id, path](size_t, httplib::DataSink& sink) {
            if (!wait_end(*t, Clock::now() + kHeartbeat)) {
              if (!sink.is_writable() || !sink.write(" ", 1)) {
                t->cancel = true;  // the client went away: the slot frees at the next step
                return false;
              }
              return true;
            }
            if (!t->error().empty()) {
              std::fprintf(stderr, "tandem serve: %s %s -> error after the reply began: %s\n", id.c_str(), path.c_str(), t->error().c_str());
              return false;
            }
            const std::string body = wire(reply->whole(t->result(), t->result().cached_tokens));
            log_reply(id, path, *t, reply->finish_reason(t->result()));
            if (!sink.write(body.data(), body.size())) return false;
            sink.done();
            return true;
          },
          [t](bool success) {
            if (!success) t->cancel = true;
          });
      return;
    }
    r.set_header("Cache-Control", "no-cache");
    r.set_header("X-Accel-Buffering", "no");
    auto started = std::make_shared<bool>(false);
    const std::string path = q.path;
    r.set_chunked_content_provider(
        "text/event-stream",
        [this, job, t, reply, started, n, api, id, path](size_t, httplib::DataSink& sink) {
          if (!sink.is_writable()) {
            t->cancel = true;
            return false;
          }
          std::string out;
          if (!*started) out = reply->start(n, 0), *started = true;
          std::string text;
          const bool done = t->take(text, std::chrono::milliseconds(200));
          if (!text.empty()) out += reply->piece(text);
          if (done) {
            if (!t->error().empty()) {
              const Json err = error_body(api, 500, t->error(), "");
              out += api == Api::messages ? sse_event("error", err) : sse(err);
              std::fprintf(stderr, "tandem serve: %s %s -> stream error: %s\n", id.c_str(), path.c_str(), t->error().c_str());
            } else {
              out += reply->end(t->result(), t->result().cached_tokens);
              log_reply(id, path, *t, reply->finish_reason(t->result()));
            }
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            t->cancel = true;  // the client went away: the slot frees at the next step
            return false;
          }
          if (done) sink.done();
          return true;
        },
        [t](bool success) {
          if (!success) t->cancel = true;
        });
  }

  void models(httplib::Response& r) {
    send_json(r, 200, {{"object", "list"},
                       {"data", Json::array({{{"id", d_.model}, {"object", "model"}, {"created", started_}, {"owned_by", "tandem"},
                                              {"meta", {{"context", s_.runner->max_context()}, {"slots", s_.runner->slots()}}}}})}});
  }

  void health(httplib::Response& r) {
    const Scheduler::Stats st = sched_.stats();
    const bool draining = g_stop.load();
    send_json(r, draining ? 503 : 200,
              {{"status", draining ? "draining" : "ok"}, {"slots_idle", st.slots - static_cast<int>(st.running)}, {"slots_processing", st.running},
               {"queued", st.queued}});
  }

  void metrics(httplib::Response& r) {
    const Scheduler::Stats st = sched_.stats();
    std::ostringstream m;
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
      m << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << v << '\n';
    };
    metric("tandem_requests_total", "counter", "Generation requests that ended (any reason).", static_cast<double>(st.requests));
    metric("tandem_requests_failed_total", "counter", "Generation requests the engine failed.", static_cast<double>(st.failed));
    metric("tandem_requests_timed_out_total", "counter", "Generation requests stopped at the wall-clock limit.", static_cast<double>(st.timed_out));
    metric("tandem_requests_cancelled_total", "counter", "Generation requests whose client went away.", static_cast<double>(st.cancelled));
    metric("tandem_http_errors_total", "counter", "HTTP replies with an error status.", static_cast<double>(http_errors_.load()));
    metric("tandem_prompt_tokens_total", "counter", "Prompt tokens of ended requests.", static_cast<double>(st.prompt_tokens));
    metric("tandem_generated_tokens_total", "counter", "Generated tokens of ended requests.", static_cast<double>(st.generated_tokens));
    metric("tandem_generated_tokens_per_second", "gauge", "Generated tokens over the engine's busy time.",
           st.busy_s > 0 ? static_cast<double>(st.generated_tokens) / st.busy_s : 0.0);
    metric("tandem_queue_depth", "gauge", "Requests waiting for a slot.", static_cast<double>(st.queued));
    metric("tandem_slots_in_use", "gauge", "Slots holding a sequence.", static_cast<double>(st.running));
    metric("tandem_slots", "gauge", "Slots (sequences held at once).", static_cast<double>(st.slots));
    if (const PrefixCache* c = sched_.cache()) {
      const PrefixCache::Stats cs = c->stats();
      metric("tandem_prefix_cache_hits_total", "counter", "Requests resumed from a saved prefix.", static_cast<double>(cs.hits));
      metric("tandem_prefix_cache_misses_total", "counter", "Requests with no saved prefix.", static_cast<double>(cs.misses));
      metric("tandem_prefix_cache_reused_tokens_total", "counter", "Prompt tokens served from saved prefixes.", static_cast<double>(cs.reused_tokens));
      metric("tandem_prefix_cache_entries", "gauge", "Saved sequences.", static_cast<double>(cs.entries));
      metric("tandem_prefix_cache_bytes", "gauge", "Bytes the saved sequences take.", static_cast<double>(cs.bytes));
    }
    if (s_.runner->max_draft() > 0) {  // speculative decoding: per draft position, by label
      metric("tandem_verify_steps_total", "counter", "Steps that verified drafts of the MTP head.", static_cast<double>(st.drafts.verify_steps));
      auto by_position = [&](const char* name, const char* help, const std::vector<int64_t>& v) {
        m << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n";
        for (size_t i = 0; i < static_cast<size_t>(s_.runner->max_draft()); ++i)
          m << name << "{position=\"" << i + 1 << "\"} " << (i < v.size() ? v[i] : 0) << '\n';
      };
      by_position("tandem_drafts_total", "Drafts verified at each draft position (reached when the earlier ones were accepted).", st.drafts.drafted);
      by_position("tandem_drafts_accepted_total", "Drafts accepted at each draft position.", st.drafts.accepted);
    }
    r.set_content(m.str(), "text/plain; version=0.0.4");
  }

  void tokenize(const httplib::Request& q, httplib::Response& r) {
    Json body;
    if (!body_json(q, r, Api::chat, body)) return;
    if (!body.is_object() || !body.contains("content") || !body["content"].is_string())
      return fail(q, r, Api::chat, 400, "content must be a string (the text to tokenize)", "content");
    const std::vector<int32_t> ids = s_.tokenizer->encode(body["content"].get<std::string>());
    send_json(r, 200, {{"tokens", ids}});
  }

  void detokenize(const httplib::Request& q, httplib::Response& r) {
    Json body;
    if (!body_json(q, r, Api::chat, body)) return;
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
      return fail(q, r, Api::chat, 400, "tokens must be a list of token ids", "tokens");
    const int64_t vocab = s_.model->config().vocab_size;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < body["tokens"].size(); ++i) {
      const Json& v = body["tokens"][i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
        return fail(q, r, Api::chat, 400, str_cat("tokens[", i, "] must be an id in [0, ", vocab, "), got ", v.dump()), str_cat("tokens[", i, "]"));
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    send_json(r, 200, {{"content", s_.tokenizer->decode(ids)}});
  }

  Session& s_;
  const ServeOptions& o_;
  Scheduler sched_;
  Defaults d_;
  int64_t started_;
  std::string stamp_;  // this process's part of reply ids (ids stay distinct across restarts)
  std::atomic<uint64_t> serial_{0}, http_errors_{0};
};

}  // namespace

int serve(Session& session, const ServeOptions& opts) {
  if (!session.tokenizer) fail("serve: the model folder has no tokenizer.json");
  Service service(session, opts);
  httplib::Server svr;
  const int threads = opts.http_threads > 0 ? opts.http_threads
                                            : session.runner->slots() + static_cast<int>(opts.scheduler.max_queue) + 4;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(opts.max_body_bytes);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  service.routes(svr);
  int port = opts.port;
  if (port == 0) port = svr.bind_to_any_port(opts.host);
  else if (!svr.bind_to_port(opts.host, port)) port = -1;
  if (port <= 0) fail("serve: cannot listen on ", opts.host, ":", opts.port, " (in use, or not an address of this machine)");

  g_stop = false;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::atomic<bool> listening_done{false};
  std::thread watcher([&] {  // on a signal: refuse new requests, let those in flight finish, then stop listening
    while (!g_stop.load() && !listening_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (listening_done.load()) return;
    service.scheduler().drain();
    std::fprintf(stderr, "tandem serve: stopping: finishing %zu request(s) in flight\n",
                 service.scheduler().stats().running + service.scheduler().stats().queued);
    while (!service.scheduler().idle()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last replies' bytes leave
    svr.stop();
  });
  const std::string cache = service.scheduler().cache() ? str_cat("up to ", opts.scheduler.cache_bytes >> 20, " MiB",
                                                                  opts.scheduler.cache_vram ? str_cat(", ", opts.scheduler.cache_vram >> 20, " MiB of it in VRAM") : std::string()) : service.scheduler().cache_note();
  std::fprintf(stderr, "tandem serve: listening on http://%s:%d (model %s, %d slots, context %lld, prefix cache %s)\n", opts.host.c_str(), port,
               opts.model_id.c_str(), session.runner->slots(), static_cast<long long>(session.runner->max_context()), cache.c_str());
  const bool ok = svr.listen_after_bind();
  listening_done = true;
  watcher.join();
  if (!ok && !g_stop.load()) fail("serve: the listening socket failed");
  std::fprintf(stderr, "tandem serve: stopped\n");
  return 0;
}

}  // namespace tandem::server

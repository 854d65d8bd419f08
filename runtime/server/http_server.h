// runtime/server/http_server.h: `tandem serve`'s HTTP side (cpp-httplib): the OpenAI and Anthropic
// endpoints over a Scheduler, auth, limits, metrics and a draining shutdown.
//
//   POST /v1/chat/completions, /v1/completions, /v1/messages   (stream: server-sent events)
//   GET  /v1/models, /health, /metrics (Prometheus text)
//   POST /tokenize {"content"} -> {"tokens"}, /detokenize {"tokens"} -> {"content"}
//
// Errors are JSON in the API's shape (api.h's error_body): 400 naming the field, 401 without the key,
// 404 for an unknown path, 413 for a body over the limit, 503 with Retry-After when the queue is full or
// the server drains. One log line per request on stderr.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/engine/session.h"
#include "runtime/server/scheduler.h"

namespace tandem::server {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (the listening line says which)
  std::string api_key;                  // non-empty: required as "Authorization: Bearer KEY" or "x-api-key: KEY"
  std::string model_id;                 // the id /v1/models lists and replies carry
  size_t max_body_bytes = size_t(16) << 20;
  int http_threads = 0;                 // 0: slots + max_queue + 4
  SchedulerOptions scheduler;
};

// Serves until SIGTERM or SIGINT, then refuses new requests, lets those in flight finish and returns 0.
// Prints "tandem serve: listening on http://HOST:PORT" to stderr once it accepts connections.
int serve(Session& session, const ServeOptions& opts);

}  // namespace tandem::server

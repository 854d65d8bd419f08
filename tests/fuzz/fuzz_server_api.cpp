// libFuzzer target: the server's request parsers (runtime/server/api.h) take any body without
// crashing: a body is a job or an ApiError (a 400 with a field), never anything else; a job's reply
// to the body's own text, whole and streamed, is well-formed JSON.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "runtime/server/api.h"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_server_api: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  using tandem::server::Json;
  const int which = data[0] % 3;
  const Json body = Json::parse(reinterpret_cast<const char*>(data + 1), reinterpret_cast<const char*>(data + size), nullptr, false);
  if (body.is_discarded()) return 0;
  tandem::server::Defaults d;
  d.model = "m";
  tandem::server::Job job;
  try {
    job = which == 0 ? tandem::server::parse_chat(body, d) : which == 1 ? tandem::server::parse_completion(body, d) : tandem::server::parse_messages(body, d);
  } catch (const tandem::server::ApiError& e) {
    if (e.status != 400) broken("an error other than 400");
    return 0;
  } catch (const tandem::Error&) {
    broken("a tandem::Error escaped the parser (it must become an ApiError)");
  }
  tandem::GenerateResult r;
  r.text = job.prompt.substr(0, 512);
  r.tokens = {1, 2};
  r.prompt_tokens = 5;
  tandem::server::Reply whole(job, "chatcmpl-x1", 0), streamed(job, "chatcmpl-x1", 0);
  const std::string out = whole.whole(r, 0).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (out.empty()) broken("empty reply");
  std::string sse = streamed.start(5, 0);
  sse += streamed.piece(r.text);
  sse += streamed.end(r, 0);
  if (sse.find("\n\n") == std::string::npos) broken("a stream without frames");
  return 0;
}

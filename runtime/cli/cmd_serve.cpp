// tandem serve: the OpenAI- and Anthropic-compatible HTTP server (runtime/server/http_server.h).
#include <cstdio>
#include <filesystem>

#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/device_flags.h"
#include "core/bytes.h"
#include "placement/placement_config.h"
#include "runtime/server/http_server.h"

namespace tandem::cli {

namespace {

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

}  // namespace

int cmd_serve(int argc, char** argv) {
  std::vector<Flag> flags = {
      {"model", true, "model folder (config.json, safetensors, tokenizer.json)"},
      {"host", true, "address to listen on (default: the config's server.host, else 127.0.0.1)"},
      {"port", true, "port (default: server.port, else 8080; 0: any free port, printed when listening)"},
      {"api-key", true, "require this key (Authorization: Bearer KEY or x-api-key: KEY)"},
      {"insecure", false, "allow listening on a non-loopback address without --api-key"},
      {"slots", true, "sequences decoded at once (default: the config's batch, else 4)"},
      {"prefill-chunk", true, "prompt tokens a step feeds one sequence, between the others' decode steps (default: server.prefill_chunk, else 512; 0: whole prompts)"},
      {"max-queue", true, "requests waiting for a slot before new ones get 503 (default: server.max_queue, else 64)"},
      {"timeout", true, "a request's wall-clock limit in seconds (default: server.timeout, else 600; 0: none)"},
      {"max-body", true, "largest request body in bytes (default: server.max_body, else 16 MiB)"},
      {"cache-bytes", true, "the prefix cache's host memory, e.g. 4GiB (default: server.cache, else 2GiB; 0: none); page-locked at start on --device gpu|hybrid"},
      {"cache-vram", true, "--device gpu|hybrid: the prefix cache's GPU memory (its VRAM tier: saves and restores at device speed), inside --gpu-mem (default: server.cache_vram, else 0)"},
      {"alias", true, "the model id /v1/models lists (default: the model folder's name)"},
  };
  for (auto& f : device_flags()) flags.push_back(f);
  flags.push_back({"help", false, "show this help"});
  Args a("serve", flags);
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  // the YAML's server: section, then the flags
  const placement::PlacementConfig cfg = a.has("config") ? placement::load_placement_config(a.get("config")) : placement::default_placement_config();
  server::ServeOptions o;
  o.host = a.get("host", cfg.server.host);
  o.port = a.get_int<int>("port", cfg.server.port, 0, 65535);
  o.api_key = a.get("api-key", "");
  if (!loopback(o.host) && o.api_key.empty() && !a.has("insecure"))
    throw UsageError("tandem serve: --host " + o.host + " is reachable from other machines: give --api-key KEY, or --insecure to serve without one");
  o.scheduler.prefill_chunk = a.get_int<int64_t>("prefill-chunk", cfg.server.prefill_chunk, 0, int64_t{1} << 20);
  o.scheduler.max_queue = a.get_int<size_t>("max-queue", static_cast<size_t>(cfg.server.max_queue), 0, 1 << 16);
  o.scheduler.timeout_s = a.get_double("timeout", cfg.server.timeout_s);
  if (o.scheduler.timeout_s < 0) throw UsageError("tandem serve: --timeout must be 0 (none) or positive seconds");
  uint64_t cache_host = cfg.server.cache_bytes, cache_vram = cfg.server.cache_vram;
  try {
    if (a.has("cache-bytes")) cache_host = parse_bytes_or_zero(a.get("cache-bytes"), "--cache-bytes");
    if (a.has("cache-vram")) cache_vram = parse_bytes_or_zero(a.get("cache-vram"), "--cache-vram");
  } catch (const Error& e) {
    throw UsageError(str_cat("tandem serve: ", e.what()));
  }
  o.scheduler.cache_bytes = cache_host + cache_vram;
  o.scheduler.cache_vram = cache_vram;
  o.max_body_bytes = a.get_int<size_t>("max-body", static_cast<size_t>(cfg.server.max_body), 1024, size_t(1) << 32);
  const std::string model = a.get("model");
  o.model_id = a.get("alias", std::filesystem::path(model).lexically_normal().filename().string());
  if (o.model_id.empty()) o.model_id = std::filesystem::path(model).lexically_normal().parent_path().filename().string();
  RunnerOptions ro = runner_options(a);
  ro.batch = a.get_int<int>("slots", ro.config.empty() ? 4 : 0, 0, 64);
  ro.cache_host = cache_host;  // the GPU placements reserve them (the host ones save into plain vectors)
  ro.cache_vram = cache_vram;
  if (cache_vram > 0 && ro.device != Device::Gpu && ro.device != Device::Hybrid && ro.device != Device::Auto)
    throw UsageError(str_cat("tandem serve: --cache-vram is for --device gpu or hybrid (got --device ", device_name(ro.device), ")"));
  Session s = Session::open(model, true);
  start_session(s, ro);
  return server::serve(s, o);
}

}  // namespace tandem::cli

#include "runtime/engine/session.h"

#include <algorithm>
#include <filesystem>

#include "gpu_core/device.cuh"
#include "core/bytes.h"
#include "core/error.h"
#include "core/membw.h"

namespace tandem {

using placement::default_placement_config;
using placement::load_placement_config;
using placement::make_plan;
using placement::Plan;
using placement::PlacementConfig;
using placement::PlanRequest;

namespace {

PlanRequest request_for(const gpu::DeviceProbe& probe, const PlacementConfig& config, uint64_t gpu_mem, int64_t context, bool measure_cpu) {
  PlanRequest r;
  r.gpu_mem = gpu_mem;
  r.context = context;
  if (probe.device_count > 0) r.device_free_bytes = probe.free_bytes;
  if (measure_cpu && config.bw_cpu <= 0) r.measured_cpu_bw = measure_read_bandwidth(512ull << 20, 3).bytes_per_s;
  r.host_available_bytes = available_host_memory();
  return r;
}

}  // namespace

PlanRequest plan_request(const PlacementConfig& config, uint64_t gpu_mem, int64_t context, bool measure_cpu) {
  gpu::DeviceProbe probe;
  gpu::gpu_device_probe(&probe);
  return request_for(probe, config, gpu_mem, context, measure_cpu);
}

Device requested_device(const std::string& name, bool has_config, const char* device_what, const char* config_what) {
  const Device d = parse_device(name, device_what);
  if (!has_config || d == Device::Hybrid) return d;
  if (d == Device::Auto) return Device::Hybrid;  // a placement implies hybrid
  fail(config_what, " (a placement YAML) applies to ", device_what, " hybrid (or auto); add ", device_what, " hybrid");
}

namespace {

// Plans `config` against `model` on the probed device and fills opts.plan, opts.context (the config's
// unless --context was given; the planner's for context: auto), opts.batch (the config's unless
// --batch was) and opts.threads (the config's unless --threads was).
Plan prepare_hybrid(RunnerOptions& o, const ModelConfig& model, const PlacementConfig& config, const gpu::DeviceProbe& probe) {
  if (probe.device_count == 0) fail("--device hybrid: ", probe.reason, "; tandem plan shows the placement without a GPU");
  PlacementConfig cfg = config;  // --batch over the config's batch: the plan holds that many sequences
  if (o.batch > 0) cfg.batch = o.batch;
  o.batch = cfg.batch;
  if (!o.draft_set) o.draft = cfg.draft;  // speculative.draft unless --draft was given
  cfg.draft = o.draft;                     // the plan counts the MTP head on the GPU
  if (o.dense_format.empty()) o.dense_format = cfg.dense_format;  // --dense-format over the config's dense.format
  cfg.dense_format = o.dense_format;
  if (o.lm_head_format.empty()) o.lm_head_format = cfg.lm_head_format;
  cfg.lm_head_format = o.lm_head_format;
  if (o.draft_lm_head_format.empty()) o.draft_lm_head_format = cfg.draft_lm_head_format;  // --draft-lm-head over speculative.lm_head
  cfg.draft_lm_head_format = o.draft_lm_head_format;
  if (!o.experts_format.empty()) cfg.gpu_format = o.experts_format;  // --experts-format over experts.gpu_format
  if (o.kv_format.empty()) o.kv_format = cfg.kv_format;  // --kv-format over kv_cache.format
  cfg.kv_format = o.kv_format;
  cfg.gpu_reserve += o.cache_vram;        // the prefix cache's VRAM tier: set aside before experts are placed
  // --context, else the config's (at least what the command needs), else the planner's choice
  const int64_t context = o.context_set ? o.context : cfg.context ? std::max(cfg.context, o.min_context) : 0;
  PlanRequest req = request_for(probe, cfg, o.gpu_mem, context, false);
  req.verify_tokens = o.verify_tokens;  // tandem bench --verify-cost: its steps' kept states
  Plan plan = make_plan(model, cfg, req);
  if (plan.context < o.min_context) {
    req.context = o.min_context;
    plan = make_plan(model, cfg, req);
  }

  if (!plan.host_fits())
    fail("the CPU experts of this placement need ", format_gib(plan.host_expert_bytes), " of host RAM but only ",
         format_gib(plan.host_available_bytes), " is available (MemAvailable); raise the GPU budget (more experts on the GPU), ",
         "use int4 CPU experts, or free memory");
  if (plan.experts_int4_on_load) o.experts_format = "int4";  // the plan counted them so: Session::start quantizes them
  o.plan = std::make_shared<const Plan>(plan);
  o.context = plan.context;
  if (o.threads == 0) o.threads = cfg.cpu_threads;
  return plan;
}

}  // namespace

std::string prepare_device(RunnerOptions& o, const ModelConfig& model, const PlacementConfig& cfg) {
  const bool automatic = o.device == Device::Auto;
  std::string why_cpu;
  if (automatic) {
    const gpu::DeviceCaps& caps = gpu::gpu_device_caps();
    if (caps.usable) {
      o.device = Device::Hybrid;
    } else if (caps.run_on_cpu) {
      o.device = Device::Cpu;
      why_cpu = caps.error;
    } else {
      fail(caps.error);  // a device, but no kernels in this build for it (or a bad TANDEM_MAX_SM)
    }
  }
  if (o.device != Device::Hybrid) return automatic ? str_cat("--device auto chose cpu: ", why_cpu) : std::string();
  gpu::DeviceProbe probe;
  gpu::gpu_device_probe(&probe);
  const Plan plan = prepare_hybrid(o, model, cfg, probe);
  return str_cat(automatic ? "--device auto chose hybrid" : "hybrid", " on ", probe.name, " (", gpu::gpu_device_caps().description, "): ",
                 placement::plan_summary(plan), ", context ", plan.context, plan.context_note.empty() ? "" : " (auto: tandem plan shows its cost)",
                 ", predicted ", static_cast<int>(plan.predicted.decode_tok_s + 0.5), " tok/s decode");
}

std::string prepare_device(RunnerOptions& o, const ModelConfig& model) {
  return prepare_device(o, model, o.config.empty() ? default_placement_config() : load_placement_config(o.config));
}

Session Session::open(const std::string& model_dir, bool need_tokenizer) {
  Session s;
  s.model = Qwen35Moe::load(model_dir);
  s.defaults = load_generation_config(model_dir);
  if (need_tokenizer || std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) {
    s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_model_dir(model_dir));
    s.eos = stop_token_ids(s.model->config(), *s.tokenizer, s.defaults);
  }
  return s;
}

void Session::start(RunnerOptions opts, const placement::PlacementConfig* config) {
  runner.reset();  // a hybrid runner's host and device memory before the next plan counts what is free
  device_line = config ? prepare_device(opts, model->config(), *config) : prepare_device(opts, model->config());
  check_experts_format(opts.experts_format, "--experts-format");
  if (opts.experts_format == "int4") {
    const std::string q = model->quantize_experts_int4(opts.quant_cache, stderr);
    if (!q.empty()) device_line += (device_line.empty() ? "" : "; ") + q;
  }
  runner = make_runner(*model, opts);
  options = std::move(opts);
}

}  // namespace tandem

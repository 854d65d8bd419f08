#include "runtime/cli/device_flags.h"

#include <omp.h>

#include <algorithm>
#include <climits>

#include <cstdio>

#include "runtime/engine/session.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/trace.h"

namespace tandem::cli {

std::vector<Flag> device_flags() {
  return {
      {"device", true, "auto (default: hybrid with a CUDA device, else cpu) | ref (exact fp32 reference) | cpu (fast CPU kernels) | gpu (everything on one GPU) | hybrid (GPU + CPU experts, --config)"},
      {"config", true, "--device hybrid: placement YAML (configs/*.yaml; default: frequency placement in the free GPU memory)"},
      {"threads", true, "CPU threads (default: all physical cores)"},
      {"cpu-expert-format", true, "--device cpu: experts of BF16 checkpoints as bf16 (default, exact) or int8 (half the bytes)"},
      {"gpu-mem", true, "--device gpu|hybrid: memory budget, e.g. 24GiB (default: the config's, else free device memory)"},
      {"context", true, "--device gpu|hybrid: longest sequence the KV cache holds (hybrid: the config's, else the longest whose KV cache takes at most a quarter of the free budget; gpu: 4096)"},
      {"kv-format", true, "every device: the KV cache as bf16 (default), int8 or fp8 codes with a scale per token and KV head (half the bytes: twice the context; hybrid: the config's kv_cache.format)"},
      {"dense-format", true, "--device gpu|hybrid: the dense projections as stored (bf16, default) or quantized on load to int8 or fp8 rows (half their bytes; hybrid: the config's dense.format)"},
      {"experts-format", true, "routed experts as stored (auto, default) or int4: a BF16 checkpoint's experts and the MTP head's quantized on load (a quarter of their bytes; cached on disk; hybrid: the config's experts.gpu_format)"},
      {"quant-cache", true, "--experts-format int4: the folder its cache goes in (default: MODEL/.tandem-cache when writable, else ~/.cache/tandem)"},
      {"lm-head-format", true, "--device gpu|hybrid: the lm_head as stored (bf16, default) or as int8 or fp8 rows (hybrid: the config's dense.lm_head)"},
      {"draft", true, "speculative decoding: tokens the model's MTP head drafts a step, 0 = off (default), auto = as many as pay (up to 4, measured as it goes)"},
      {"draft-lm-head", true, "--device gpu|hybrid with --draft: the drafts read their own int8 or fp8 copy of the lm_head (half its bytes a draft; the model's logits keep theirs; hybrid: the config's speculative.lm_head)"},
      {"defer-experts", true, "--device ref|cpu: apply each token's N lowest-weight experts one layer late (measures expert deferral)"},
      {"trace", true, "write a Perfetto / chrome://tracing timeline (GPU work, CPU expert jobs, copies) to this .json"},
      {"eager", false, "launch every kernel eagerly, no CUDA graphs (debugging)"},
  };
}

namespace {

// Runs a value's check (or parse); its error is a usage error: the command prints its flags with it.
template <typename Check>
auto as_usage(Check&& check) {
  try {
    return check();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

RunnerOptions runner_options(const Args& a, int64_t min_context) {
  RunnerOptions o;
  o.device = as_usage([&] { return requested_device(a.get("device", "auto"), a.has("config"), "--device", "--config"); });
  if (a.has("threads")) {
    o.threads = a.get_int<int>("threads", 0, 1, kMaxThreads);  // the YAML's cpu.threads cap
    omp_set_num_threads(o.threads);
  }
  o.cpu_expert_format = a.get("cpu-expert-format", "bf16");
  if (o.cpu_expert_format != "int8" && o.cpu_expert_format != "bf16")
    throw UsageError(str_cat("--cpu-expert-format must be int8 or bf16 (got '", o.cpu_expert_format, "')"));
  if (a.has("gpu-mem")) o.gpu_mem = as_usage([&] { return parse_bytes(a.get("gpu-mem"), "--gpu-mem"); });
  o.context = std::max(a.get_int("context", 4096), min_context);
  o.context_set = a.has("context");
  o.min_context = min_context;
  if (o.context < 1) throw UsageError("--context must be at least 1");
  o.config = a.get("config", "");
  o.dense_format = a.get("dense-format", "");
  o.kv_format = a.get("kv-format", "");
  as_usage([&] { return parse_row_format(o.kv_format, "--kv-format"); });
  o.lm_head_format = a.get("lm-head-format", "");
  o.draft_lm_head_format = a.get("draft-lm-head", "");
  as_usage([&] { return parse_row_format(o.draft_lm_head_format, "--draft-lm-head"); });
  o.experts_format = a.get("experts-format", "");
  as_usage([&] { check_experts_format(o.experts_format, "--experts-format"); });
  o.quant_cache = a.get("quant-cache", "");
  o.draft = a.get("draft", "") == "auto" ? kDraftAuto : a.get_int<int>("draft", 0, 0, kMaxDraft);
  o.draft_set = a.has("draft");
  o.defer_experts = a.get_int<int>("defer-experts", 0, 0, INT_MAX);  // make_runner checks it against the model
  if (a.has("trace")) Trace::start(a.get("trace"));
  o.eager = a.has("eager");
  return o;
}

void start_session(Session& s, const RunnerOptions& o) {
  s.start(o);
  if (!s.device_line.empty()) std::fprintf(stderr, "tandem: %s\n", s.device_line.c_str());
}

}  // namespace tandem::cli

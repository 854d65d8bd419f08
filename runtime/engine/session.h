// runtime/engine/session.h: the one way a model folder is opened to run, shared by the CLI commands
// and the Python bindings: Session::open loads the checkpoint (and its tokenizer and generation
// defaults), Session::start resolves the device once (prepare_device: --device auto, the placement
// plan for hybrid) and makes the runner.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "placement/planner.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/runner.h"
#include "runtime/engine/sampling.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

// What the machine offers the planner: free GPU memory (0 without a device) and, unless the config
// sets them, the measured CPU read bandwidth. `measure_cpu` false skips the ~1 s measurement.
placement::PlanRequest plan_request(const placement::PlacementConfig& config, uint64_t gpu_mem, int64_t context, bool measure_cpu);

// The device a caller asked for, checked once for the CLI and Python alike: `name` parsed
// (parse_device), and with a placement config Auto becomes Hybrid and any other device is an error.
// device_what / config_what name the inputs in messages ("--device" / "--config", "device" / "config").
Device requested_device(const std::string& name, bool has_config, const char* device_what, const char* config_what);


// What every model-running entry point does before make_runner, CLI and Python alike. --device auto
// (the default) becomes hybrid where this build can run kernels on a CUDA device (planned for its
// free memory unless a budget is given), else cpu; a device this build has no kernels for stops here
// with gpu::gpu_device_caps()'s one line (which architectures were built, how to rebuild), rather than
// falling back in silence. A config (placement YAML) implies hybrid. Hybrid is then planned on the
// device probed once. Returns the one line a person reads about the choice: the device, the GPU budget,
// routed experts on the GPU, the context and the predicted decode rate; empty for ref / cpu / gpu
// asked for by name.
std::string prepare_device(RunnerOptions& opts, const ModelConfig& model, const placement::PlacementConfig& config);
// The same with opts.config loaded (a YAML path), or default_placement_config() without one (the CLI).
std::string prepare_device(RunnerOptions& opts, const ModelConfig& model);

// A model folder opened to run.
struct Session {
  std::unique_ptr<Qwen35Moe> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the folder has no tokenizer.json (logits need none)
  GenerationDefaults defaults;           // generation_config.json
  std::vector<int32_t> eos;              // the ids that end a reply (with a tokenizer)
  std::unique_ptr<Runner> runner;        // after start()
  RunnerOptions options;                 // as start() resolved them: the device, the plan, the context, threads
  std::string device_line;               // prepare_device's line (empty for ref / cpu / gpu asked for by name)

  // Loads the checkpoint, its generation defaults and, when the folder has one (or `need_tokenizer`:
  // then its absence is the error), its tokenizer.
  static Session open(const std::string& model_dir, bool need_tokenizer);
  // Resolves the device and makes the runner. `config`: the placement (nullptr: opts.config's YAML, or
  // the defaults without one).
  void start(RunnerOptions opts, const placement::PlacementConfig* config = nullptr);
};

}  // namespace tandem

// runtime/engine/runner.h: one sequence of a model on a placement (--device ref | cpu | gpu), behind one
// interface so that logits, generate, chat and bench share the device handling.
//
//  ref: Qwen35Moe::forward with the exact reference matmuls.
//  cpu: the same forward with CpuBackend (cpu_experts kernels at the runtime-chosen ISA).
//  gpu: Qwen35MoeGpu (everything on one GPU; only where the build has CUDA and a device exists).
//  hybrid: Qwen35MoeGpu with the routed experts the plan leaves in host memory run by the
//       cpu_experts kernels (RunnerOptions::plan, from prepare_device).
// Errors (unknown device, no GPU, budget too small) are tandem::Error with the reason.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/limits.h"
#include "placement/planner.h"
#include "runtime/engine/sampling.h"
#include "runtime/models/qwen3_5_moe/model.h"

namespace tandem {

// Where a sequence runs (--device, device=). Auto resolves to Hybrid or Cpu in prepare_device.
enum class Device { Auto, Ref, Cpu, Gpu, Hybrid };
const char* device_name(Device d);  // "auto", "ref", ...
// The one parse of a device name: tandem::Error "<what> must be one of auto, ref, cpu, gpu, hybrid (got
// 'x'); did you mean 'y'?" otherwise.
Device parse_device(const std::string& name, const char* what);

struct RunnerOptions {
  Device device = Device::Auto;          // prepare_device resolves Auto
  int threads = 0;                       // cpu: worker threads (0: physical cores)
  std::string cpu_expert_format = "bf16";  // cpu: bf16 | int8 for BF16 checkpoints' experts
  int defer_experts = 0;                 // ref/cpu: Qwen35State::defer_experts (measures deferral)
  uint64_t gpu_mem = 0;                  // gpu: budget in bytes (0: free device memory)
  int64_t context = 4096;                // gpu: KV cache length
  bool eager = false;                    // gpu: every kernel launched eagerly, no CUDA graphs (debugging; --trace implies it)
  bool context_set = false;              // --context given (else a hybrid config's context applies)
  int64_t min_context = 0;               // what the command needs at least (prompt + generation)
  std::string config;                    // hybrid: placement YAML (empty: defaults)
  // hybrid: the placement as the planner made it (prepare_device), handed to the engine as it is
  std::shared_ptr<const placement::Plan> plan;
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual void reset() = 0;  // a new, empty sequence
  // Feeds ids at the current position; logits [ids, vocab] (All) or [vocab] (Last) to host memory.
  virtual void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows) = 0;
  // Like forward(ids, ..., Last) for a sampler that needs only the k best penalised logits
  // (Sampler::candidates_needed / penalties / sample_top): runners that can select them where the
  // logits are (the GPU) fill `top` and return true; the others return false and run nothing.
  virtual bool forward_top(std::span<const int32_t> ids, std::span<const LogitPenalty> penalties, int k,
                           std::vector<std::pair<int32_t, float>>& top) {
    (void)ids, (void)penalties, (void)k, (void)top;
    return false;
  }
  virtual std::string describe() const = 0;  // one line: placement, ISA / GPU memory
  // The longest sequence this runner holds: the KV cache it allocated (gpu, hybrid), else the model's
  // max_position_embeddings (ref, cpu: the cache grows as needed).
  virtual int64_t max_context() const = 0;
  virtual uint64_t peak_device_bytes() const { return 0; }
  // Share of decode's routed-expert activations served on the GPU since reset() (0 for host placements).
  virtual double gpu_expert_share() const { return 0; }
  // What the placement expects that share to be (the planner's figure; 1 for gpu, 0 for host paths).
  virtual double gpu_expert_share_planned() const { return 0; }
  // Hybrid streamed prefill: layers of CPU experts copied to the GPU since the last reset (their
  // activations are not in gpu_expert_share, which describes the placement's decode).
  virtual uint64_t streamed_layers() const { return 0; }
  // Hybrid decode since reset(), the host's side: time spent waiting for the GPU's router results and
  // running the host-resident experts, over `layers` layer handoffs; host_activations routed experts
  // served there. Zeros for other runners.
  struct HostSplit {
    double wait_s = 0, run_s = 0;
    uint64_t layers = 0, host_activations = 0;
  };
  virtual HostSplit host_split() const { return {}; }
  // Pinned host-to-device copy bandwidth in bytes/s, measured now (0 without a GPU).
  virtual double pcie_bandwidth() { return 0; }
  // Measured bandwidth of the memory the weights stream from (host DRAM read, or GPU copy), and
  // what it is called: the denominator of the decode bound.
  virtual double weight_bandwidth(std::string* what) = 0;
};

std::unique_ptr<Runner> make_runner(const Qwen35Moe& model, const RunnerOptions& opts);

// tandem::Error when prompt_tokens + new_tokens do not fit runner.max_context(), with the figures and
// what to change (`new_tokens_name`: "--max-new-tokens" on the CLI, "max_new_tokens" in Python; none:
// `prompt_tokens` ids fed as they are, as logits does). The one check for generate, chat, logits and
// the bindings.
void check_context(const Runner& runner, int64_t prompt_tokens, int64_t new_tokens = 0, const char* new_tokens_name = nullptr);

// tandem::Error "<what>: token id X at position i is outside the vocabulary of <model_dir> (vocab_size V)"
// for the first id out of range (the same words for the CLI and the Python bindings).
void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size, const std::string& model_dir, const char* what);

}  // namespace tandem

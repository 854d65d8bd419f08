// runtime/engine/runner.h: a model on a placement (--device ref | cpu | gpu | hybrid) holding one or
// more sequences (slots), behind one interface so that logits, generate, chat, bench and the batched
// engine share the device handling.
//
// A runner holds slots() sequences. step() feeds tokens to any of them at once: one layer walk over
// all the step's tokens (B sequences one token each: batched decode; K tokens of one sequence kept
// state by state: the verification step of speculative decoding; a prompt: prefill). Each sequence
// gets the numbers it gets alone. reset() / forward() are slot 0's, the one-sequence case.
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
#include "runtime/engine/draft_tuner.h"
#include "runtime/engine/sampling.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/models/qwen3_5_moe/mtp.h"

namespace tandem {

// Where a sequence runs (--device, device=). Auto resolves to Hybrid or Cpu in prepare_device.
enum class Device { Auto, Ref, Cpu, Gpu, Hybrid };
const char* device_name(Device d);  // "auto", "ref", ...
// The one parse of a device name: tandem::Error "<what> must be one of auto, ref, cpu, gpu, hybrid (got
// 'x'); did you mean 'y'?" otherwise.
Device parse_device(const std::string& name, const char* what);
// The one check of RunnerOptions::experts_format: "", auto or int4, else tandem::Error "<what> must be
// auto or int4 (got 'x')".
void check_experts_format(const std::string& value, const char* what);

struct RunnerOptions {
  Device device = Device::Auto;          // prepare_device resolves Auto
  int threads = 0;                       // cpu: worker threads (0: physical cores)
  std::string cpu_expert_format = "bf16";  // cpu: bf16 | int8 for BF16 checkpoints' experts
  std::string dense_format;              // gpu / hybrid: bf16 | int8 | fp8 (the projections quantized on load: GpuOptions::dense); "": a hybrid config's dense.format, else bf16
  std::string lm_head_format;            // gpu / hybrid: bf16 | int8 | fp8 (GpuOptions::lm_head); "": a hybrid config's dense.lm_head, else bf16
  // gpu / hybrid, with drafts: the lm_head the MTP head's drafts read, int8 | fp8 (their own copy,
  // GpuOptions::mtp_lm_head); "": a hybrid config's speculative.lm_head, else the model's lm_head
  std::string draft_lm_head_format;
  // every device: "" (a hybrid config's experts.gpu_format / cpu_format, else as stored) | auto (as
  // stored) | int4: every routed expert stored in a floating-point format (a BF16 checkpoint's, the
  // MTP head's) quantized on load (Qwen35Moe::quantize_experts_int4), cached under quant_cache
  std::string experts_format;
  std::string quant_cache;               // the int4 cache's root ("": default_int4_cache_root)
  // every device: bf16 | int8 | fp8, the KV cache's format (core/row_format.h; --kv-format); "": a hybrid
  // config's kv_cache.format, else bf16
  std::string kv_format;
  int defer_experts = 0;                 // ref/cpu: Qwen35State::defer_experts (measures deferral)
  uint64_t gpu_mem = 0;                  // gpu: budget in bytes (0: free device memory)
  int64_t context = 4096;                // gpu: KV cache length
  bool eager = false;                    // gpu: every kernel launched eagerly, no CUDA graphs (debugging; --trace implies it)
  bool context_set = false;              // --context given (else a hybrid config's context applies)
  int64_t min_context = 0;               // what the command needs at least (prompt + generation)
  int64_t verify_tokens = 0;             // gpu / hybrid: tokens a step that keeps its states (Feed::keep_states) may feed (0: none)
  int draft = 0;                         // tokens the MTP head may draft a step (speculative decoding; 0: off; kDraftAuto: auto)
  bool draft_set = false;                // --draft given (else a hybrid config's speculative.draft applies)
  // gpu / hybrid: memory reserved at start for saved sequences (the server's prefix cache): device
  // memory (its VRAM tier, inside the budget) and page-locked host memory; 0: none
  uint64_t cache_vram = 0, cache_host = 0;
  int batch = 0;                         // sequences held at once (slots; gpu / hybrid: KV cache and state each); 0: the config's batch, else 1
  std::string config;                    // hybrid: placement YAML (empty: defaults)
  // hybrid: the placement as the planner made it (prepare_device), handed to the engine as it is
  std::shared_ptr<const placement::Plan> plan;
};

// A slot's sequence saved at its position: its KV rows and recurrent states, as the runner that made it
// holds them (the server's prefix cache restores it into any slot of that runner).
class Runner;
struct SequenceSnapshot {
  virtual ~SequenceSnapshot() = default;
  const Runner* owner = nullptr;  // the runner that made it (restore refuses the others')
  int64_t position = 0;           // tokens the sequence held
  uint64_t bytes = 0;             // memory the snapshot takes
  const char* where = "host memory";  // or "device memory" (a VRAM tier), "page-locked host memory"
};

class Runner {
 public:
  virtual ~Runner() = default;

  // One sequence's part of a step.
  struct Feed {
    int slot = 0;
    std::span<const int32_t> ids;      // fed at the slot's position (at least one)
    float* logits = nullptr;           // [ids, vocab] (All) or [vocab] (Last) to host memory; nullptr: none
    Qwen35Moe::LogitRows rows = Qwen35Moe::LogitRows::Last;
    bool keep_states = false;          // keep the state after every token: rollback(slot, keep) afterwards
  };
  // What a feed's sampler needs when the runner selects candidates where the logits are (step_top).
  struct TopWant {
    std::span<const LogitPenalty> penalties;      // Sampler::penalties
    int k = 0;                                    // Sampler::candidates_needed
    std::vector<std::pair<int32_t, float>>* top;  // filled: the k best (id, penalised logit), best first
  };

  virtual int slots() const = 0;                  // sequences held at once
  virtual void reset_slot(int slot) = 0;          // slot becomes a new, empty sequence
  virtual int64_t position(int slot) const = 0;   // tokens the slot's sequence holds
  // Feeds every feed's ids (distinct slots) in one step. tandem::Error (nothing run) for a bad slot,
  // a slot twice, an id outside the vocabulary or a sequence past max_context().
  virtual void step(std::span<const Feed> feeds) = 0;
  // Like step() for feeds whose rows are sampled from their k best penalised logits (logits unused):
  // `want` has one entry per wanted row in feed order, the last row of a Last feed and every row of an
  // All feed (a verification, keep_states: row i with the penalties of the context up to its token).
  // Runners that select them where the logits are (the GPU) fill the tops and return true; the others
  // return false and run nothing.
  virtual bool step_top(std::span<const Feed> feeds, std::span<const TopWant> want) {
    (void)feeds, (void)want;
    return false;
  }
  // After a keep_states step that fed n tokens to `slot`: back to its state after the first `keep`
  // (0..n) of them, as if the rest had never been fed (no recompute).
  virtual void rollback(int slot, int64_t keep) = 0;
  // Whether one step may hold several feeds that keep their states (each rolled back after it), and
  // verify them together. False: one such feed a step (tandem::Error for more; the GPU model keeps one
  // sequence's states, and verifies a step's rows as a step of their own); the Batcher then drafts for
  // a sequence only while it is the only one in flight.
  virtual bool keeps_several() const { return true; }

  // Speculative decoding with the model's MTP head (RunnerOptions::draft): the most tokens draft()
  // proposes (0: this runner does not draft). draft() fills `drafts` (1..max_draft() of them) with the
  // tokens the head expects to follow `next`, the token the slot's sequence is fed next (the one its
  // last step's logits gave); pick(i, logits) chooses draft i from the head's logits (nullptr: the
  // argmax). The runner keeps what the head needs (the main model's hidden states) itself, through
  // step() and rollback(), whichever placement runs it.
  virtual int max_draft() const { return 0; }
  virtual void draft(int slot, int32_t next, std::span<int32_t> drafts, const DraftPick& pick);
  // --draft auto (RunnerOptions::draft kDraftAuto): the tuner that picks each step's drafts, kept for
  // the runner's life so that its measurements carry over from request to request; nullptr otherwise.
  DraftTuner* draft_tuner() const { return tuner_.get(); }
  void tune_drafts() { tuner_ = std::make_unique<DraftTuner>(max_draft()); }
  // What a request asks for to draft as this runner was configured: kDraftAuto, or max_draft().
  int request_draft() const { return tuner_ ? kDraftAuto : max_draft(); }

  // Sequence snapshots (the prefix cache): whether this runner makes them; a copy of the slot's
  // sequence; the slot becomes a saved sequence (tandem::Error for another runner's snapshot). Every
  // placement makes them: the host ones copy the state's vectors, the GPU ones copy the slot's KV rows
  // and DeltaNet states to host memory (Qwen35MoeGpu::save_slot).
  virtual bool saves_sequences() const { return false; }
  virtual std::shared_ptr<const SequenceSnapshot> save(int slot) const {
    (void)slot;
    return nullptr;
  }
  virtual void restore(int slot, const SequenceSnapshot& s);

  // Slot 0, the one-sequence case.
  void reset() { reset_slot(0); }
  // Feeds ids at the current position; logits [ids, vocab] (All) or [vocab] (Last) to host memory.
  void forward(std::span<const int32_t> ids, float* logits, Qwen35Moe::LogitRows rows) {
    const Feed f{0, ids, logits, rows, false};
    step(std::span(&f, 1));
  }
  // forward(ids, ..., Last) through step_top.
  bool forward_top(std::span<const int32_t> ids, std::span<const LogitPenalty> penalties, int k,
                   std::vector<std::pair<int32_t, float>>& top) {
    const Feed f{0, ids, nullptr, Qwen35Moe::LogitRows::Last, false};
    const TopWant w{penalties, k, &top};
    return step_top(std::span(&f, 1), std::span(&w, 1));
  }
  virtual std::string describe() const = 0;  // one line: placement, ISA / GPU memory
  // The longest sequence this runner holds: the KV cache it allocated (gpu, hybrid), else the model's
  // max_position_embeddings (ref, cpu: the cache grows as needed).
  virtual int64_t max_context() const = 0;
  virtual uint64_t peak_device_bytes() const { return 0; }
  // Dense weight bytes a decode token reads as this runner stores them (gpu, hybrid: quantized on load
  // or as stored); 0: as the checkpoint stores them (Qwen35Moe::weight_bytes).
  virtual uint64_t dense_bytes_per_token() const { return 0; }
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

 private:
  std::unique_ptr<DraftTuner> tuner_;
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

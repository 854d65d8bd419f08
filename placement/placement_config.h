// placement/placement_config.h: where tensors and experts live, as the user writes it in YAML
// (configs/*.yaml; the schema with every key is configs/README.md).
//
// The YAML says *where* things live and in which format; code picks the kernels. Presets expand into
// ordered rules at load time, after the user's own rules (first match wins):
//   cpu_experts: all            -> rule {match: "layers.*.mlp.experts.*", place: cpu}
//   gpu_experts_per_layer: N    -> experts.select: uniform with exactly N routed experts per layer
// Rule patterns are globs ('*' = any run of characters) over Tandem's canonical tensor names:
//   embed_tokens, lm_head, norm, layers.L.{input_layernorm, post_attention_layernorm, self_attn,
//   linear_attn, mlp.gate, mlp.shared_expert, mlp.shared_expert_gate, mlp.experts.E}
// Every error names the file, the line and the key; an unknown key names the nearest valid one.
// A config can also come as YAML/JSON text (the Python bindings pass dicts as JSON).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::placement {

enum class Side : uint8_t { Gpu, Cpu };
enum class ExpertSelection : uint8_t { Frequency, Uniform, Layers, None, All };
enum class PrefillStrategy : uint8_t { Auto, Cpu, GpuStream };

const char* side_name(Side s);
const char* selection_name(ExpertSelection s);
const char* prefill_name(PrefillStrategy s);

struct PlacementRule {
  std::string match;           // glob over canonical names
  std::optional<Side> place;   // unset: placement left to the planner
  std::string format;          // "" (default), "int4", "int8", "fp8" (dense units only), "bf16"
  int line = 0;                // 1-based line in the source, for messages
};

// `server:`, tandem serve's defaults (its flags override them; runtime/server/http_server.h).
struct ServerSection {
  std::string host = "127.0.0.1";
  int port = 8080;
  int64_t max_queue = 64;          // requests waiting for a slot before new ones get 503
  int64_t prefill_chunk = 512;     // prompt tokens a step feeds one sequence (0: whole prompts)
  double timeout_s = 600;          // a request's wall-clock limit (0: none)
  uint64_t max_body = 16ull << 20; // largest request body
  uint64_t cache_bytes = 2ull << 30; // the prefix cache's host memory (0: none)
  uint64_t cache_vram = 0;           // its GPU memory, the VRAM tier (gpu / hybrid; 0: none)
};

struct PlacementConfig {
  std::string source = "<defaults>";  // file path (or "<dict>") for messages

  // gpu
  uint64_t gpu_memory = 0;             // the card's memory Tandem may use; 0: free device memory
  uint64_t gpu_reserve = 512ull << 20; // CUDA context, driver and allocator slack, inside gpu_memory
  // sequence
  int64_t context = 4096;  // KV cache length; 0 (`context: auto`, and without a YAML): the planner's choice
  int batch = 1;           // sequences decoded together (KV and state scale with it)
  int draft = 0;           // `speculative: {draft: N | auto}`: tokens the MTP head drafts a step (0: off; kDraftAuto; --draft overrides)
  // `speculative: {head_experts: gpu | cpu}`: the MTP head's 256 routed experts in VRAM (default) or in
  // host memory beside the CPU experts (a hybrid plan; their VRAM goes to the main model's experts).
  bool head_experts_cpu = false;
  // `speculative: {lm_head: int8 | fp8}`: the drafts read their own copy of the lm_head as 8-bit rows,
  // quantized on load (its VRAM counted), while the model's logits keep dense.lm_head's ("": the drafts
  // read the model's). Drafts only propose: the output is the same whatever they read.
  std::string draft_lm_head_format;
  // `dense: {format: bf16 | int8 | fp8}`: the dense projections (attention, DeltaNet, shared experts) as
  // stored or quantized on load to 8-bit rows, int8 or FP8 E4M3 with a scale each (GpuOptions::dense;
  // --dense-format overrides).
  std::string dense_format = "bf16";
  std::string lm_head_format = "bf16";  // `dense: {lm_head: int8 | fp8}`: the lm_head as 8-bit rows too (--lm-head-format)
  // `kv_cache: {format: bf16 | int8 | fp8}`: the KV cache's rows (core/row_format.h; --kv-format overrides)
  std::string kv_format = "bf16";
  // cpu
  int cpu_threads = 0;          // 0: physical cores
  std::string numa = "auto";    // auto | off
  // experts
  ExpertSelection select = ExpertSelection::Frequency;
  int layer_first = -1, layer_last = -1;  // select: layers a-b
  std::string heat;                       // heat map file (tandem profile); resolved against the config's folder
  int gpu_experts_per_layer = -1;         // preset; -1: unset
  bool cpu_experts_all = false;           // preset
  std::string cpu_format = "auto";        // auto | int4 | int8 | bf16
  // auto (as stored) | int4: every routed expert stored in a floating-point format (a BF16
  // checkpoint's, the MTP head's) quantized on load (Qwen35Moe::quantize_experts_int4), on both sides.
  // cpu_format: int4 (or a rule's format: int4) on a BF16 checkpoint asks for the same.
  std::string gpu_format = "auto";
  // Whether this config asks for experts quantized on load to int4 on a checkpoint whose routed
  // experts are `checkpoint_int4` or not (see gpu_format).
  bool experts_int4_on_load(bool checkpoint_int4) const;
  int deferral = 0;                       // lowest-weight CPU experts of layer L applied at L+1
  // experts.link: of each token's CPU experts, the first link_in_place the GPU computes itself reading
  // them in place over PCIe (GpuOptions::link_experts). 0: off, the CPU computes all of them.
  int link_in_place = 0;
  bool link_auto = false;  // `link: auto`: the cost model picks link_in_place (none when it does not pay)
  // prefill
  PrefillStrategy prefill = PrefillStrategy::Auto;
  int64_t prefill_gpu_min_tokens = 0;  // 0: the cost model decides
  int64_t prefill_chunk = -1;          // prompt tokens per batched GPU prefill chunk; 0: token by token; -1: auto (the planner picks)
  int64_t prefill_stream_pass = 4096;  // streamed prefill: tokens per pass (each pass streams every layer once)
  // bandwidths in bytes/s for the cost model; 0: measure (cpu, gpu when present) or the default
  double bw_gpu = 0, bw_pcie = 0, bw_cpu = 0;
  // host memory's read rate for the cores and PCIe together (experts.link); 0: the CPU figure (the cores
  // take all memory gives, as on a desktop's two channels: the link then moves reads, adds none)
  double bw_host_memory = 0;
  // cost model constants
  // launch_us fitted to session 10's H200 runs (bench/results/2026-12-01-h200-session10.md, commit
  // 1bd4e03, decode at a 4096-token context, at the run's measured bandwidths): the 24 GiB step (347.4
  // tok/s; all-GPU 344.4); the attention's context cost (~5 ns a cached row a layer) is inside it.
  // handoff_us refitted in session 13 (bench/results/2026-12-01-h200-session13.md, the handoff kernels
  // folded into the router and norm launches, L2 prefetch): 8 GiB all-CPU-experts 119.8 tok/s
  // (predicted 115.7) and with experts.link 3 140.4 (135.4); it was 32 before those changes. The 12 GiB
  // step it over-predicts (220 for 193: a token's host share of a layer varies, and the layer waits
  // for the slower side each time, which the average share hides).
  double launch_us = 4.7;        // per decode kernel beyond its bytes, in a CUDA graph (all-GPU and hybrid)
  double handoff_us = 12.0;      // GPU -> CPU -> GPU handoff per MoE layer with CPU experts, beyond the CPU's bytes

  std::vector<PlacementRule> rules;  // user rules, then preset rules
  ServerSection server;

  // Range and consistency checks; throws tandem::Error naming the source.
  void validate() const;
};

// Reads a YAML file. Throws tandem::Error "FILE:LINE: key 'x': ..." on any problem.
// The placement without a YAML (--device auto / hybrid with no --config, Engine(config=None), tandem
// plan without --config): every default, and the context chosen by the planner (context: auto).
PlacementConfig default_placement_config();
PlacementConfig load_placement_config(const std::string& path);
// Parses YAML (or JSON) text; `source` names it in messages; relative heat paths resolve against `base_dir`.
PlacementConfig parse_placement_config(const std::string& text, const std::string& source, const std::string& base_dir = "");

// Glob match ('*' any run, '?' one character) of a canonical tensor name.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace tandem::placement

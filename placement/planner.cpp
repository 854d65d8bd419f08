#include "placement/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <map>
#include <numeric>
#include <set>

#include "gpu_core/attention_sizes.h"
#include "gpu_core/deltanet_sizes.h"
#include "gpu_core/int4_layout.h"
#include "gpu_core/rows8_layout.h"
#include "placement/gpu_layout.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/limits.h"
#include "core/quantize_int4.h"

namespace tandem::placement {

namespace {

uint64_t floats(int64_t n) { return align256(static_cast<uint64_t>(n) * 4); }

// The pointer tables the GPU MoE kernels index by expert id (gpu_core/moe.cuh): 3 Int4Views of
// 4 pointers + 3 int64 each, or 3 pointers.
constexpr uint64_t kInt4ExpertTableEntry = 3 * (4 * 8 + 3 * 8);
constexpr uint64_t kBf16ExpertTableEntry = 3 * 8;
// experts.link's cost terms, measured on the H200 machine (bench/results/2026-12-01-h200-session12.md):
// 15 cores streaming host memory beside a kernel reading it over PCIe keep 72 of their 91 GB/s while
// the kernel reads 49.5 (bench_handoff pcie rows: host memory gave ~121 GB/s to both; the host experts
// in decode: 62-65 of 80-88), the link kernel reads 3 experts at 42 of the link's 51-55 GB/s, and a
// layer's input foresees ~0.9 of its top-8 (tandem profile).
constexpr double kLinkCpuShare = 0.78, kLinkRate = 0.8;
// A verification step's cost beyond its bytes, per layer: what the batched step of T tokens lacks
// against the fused one-token decode step (kVerifyStepUs) and, per token beyond the first, the decode
// MoE kernel's dequantising arithmetic (issue-bound: its time grows with the (token, expert) pairs) and
// the mixer's per-position work (kVerifyTokenUs). Fitted to the H100's `tandem bench --verify-cost`,
// all on the GPU (bench/results/2026-12-05-stop44-h100-moe-layout-rollback.md): verify - decode =
// 0.99 / 1.56 / 2.06 / 2.57 ms at k = 1..4, of which the bytes are 0.17-0.66 ms. Latency and issue
// bound, so about the same on any large GPU; bytes alone predicted 1.05-1.20x a decode step against
// the measured 1.33-1.85x.
constexpr double kVerifyStepUs = 11.6, kVerifyTokenUs = 9.0;

struct Sizer {
  const ModelConfig& c;
  std::string prefix;  // module name prefix, as the loader sees it
  // Dense units whose projections are 8-bit rows (dense.format, dense.lm_head, rules' format: int8 |
  // fp8): "lm_head", "layers.3.linear_attn", "layers.3.mlp.shared_expert", ...; nullptr: none.
  const std::map<std::string, RowFormat>* rows8_units = nullptr;

  bool experts_int4 = false;  // floating-point routed experts quantized on load (PlacementConfig::experts_int4_on_load)

  // How `module` is stored once loaded: as the checkpoint says, or int4 on load for an expert.
  QuantConfig::ModuleQuant quant(const std::string& module) const {
    QuantConfig::ModuleQuant q = c.quant.for_module(prefix + module);
    if (experts_int4 && !q.quantized && module.find(".experts.") != std::string::npos)
      q = {.quantized = true, .bits = 4, .group_size = static_cast<int>(int4_expert_group(c.hidden_size, c.moe_intermediate_size)),
           .sym = false, .desc_act = false};
    return q;
  }
  // One nn.Linear as Qwen35MoeGpu stores it (quantizable: a projection, not a router, gate or table).
  uint64_t linear(const std::string& module, int64_t out, int64_t in, bool quantizable = true) const {
    const auto q = quantizable ? quant(module) : QuantConfig::ModuleQuant{};
    const bool rows8 = rows8_units && in % 16 == 0 &&
                       (module == "lm_head" ? rows8_units->count(module) > 0
                                            : quantizable && !q.quantized && module.find(".experts.") == std::string::npos &&
                                                  rows8_units->count(module.substr(0, module.rfind('.'))) > 0);  // its unit
    if (rows8) return gpu::rows8_matrix_bytes(out, in);
    return gpu_linear_pieces(out, in, q.quantized, in / (q.group_size > 0 ? q.group_size : in), q.desc_act).total();
  }
  // Host bytes of one expert matrix as cpu_experts/packed_weight.h streams it: nibbles / bytes / bf16
  // plus f16 scales per group (and u8 zeros for asymmetric int4).
  static uint64_t host_matrix(const std::string& fmt, int64_t out, int64_t in, int64_t group, bool sym) {
    if (fmt == "bf16") return static_cast<uint64_t>(out * in) * 2;
    const uint64_t G = static_cast<uint64_t>(std::max<int64_t>(1, in / group)) * static_cast<uint64_t>(out);
    if (fmt == "int8") return static_cast<uint64_t>(out * in) + G * 2;
    return static_cast<uint64_t>(out * in / 2) + G * (sym ? 2 : 3);
  }
};

std::string layer_unit(int l, const char* what) { return str_cat("layers.", l, ".", what); }

// First rule matching `name`, or nullptr.
const PlacementRule* first_rule(const std::vector<PlacementRule>& rules, const std::string& name, std::vector<uint8_t>& used) {
  for (size_t i = 0; i < rules.size(); ++i)
    if (glob_match(rules[i].match, name)) {
      used[i] = 1;
      return &rules[i];
    }
  return nullptr;
}

std::string rule_where(const PlacementConfig& cfg, const PlacementRule& r) {
  return r.line ? str_cat(cfg.source, ":", r.line, ": rule (match '", r.match, "')")
                : str_cat(cfg.source, ": preset rule (match '", r.match, "')");
}

// prefill.chunk: auto. The largest of 2048, 1024 and 512 tokens whose workspace costs no GPU experts
// -- every routed expert still fits beside it, or (cpu_experts: all) none goes to the GPU and the
// streamed prefill's buffers still fit -- else 256. On the H200 a chunk of 2048 runs a 4096-token
// prompt at 9,491 tok/s all on the GPU where 256 gives 4,264 (session 9). Where experts compete for
// the room the chunk stays 256: a larger one would take GPU experts from decode, and choosing it by
// budget would break the plan's monotony (more budget, never fewer GPU experts); prefill.chunk sets
// it by hand. fixed_for(chunk): the fixed VRAM with that chunk (expert tables included); stream_for(chunk):
// the streamed prefill's buffers for a layer of only host experts.
template <typename Fixed, typename Stream>
int64_t auto_prefill_chunk(bool cpu_experts_all, uint64_t budget, uint64_t all_experts, Fixed&& fixed_for, Stream&& stream_for) {
  for (const int64_t chunk : {2048, 1024, 512})
    if (fixed_for(chunk) + (cpu_experts_all ? stream_for(chunk) : all_experts) <= budget) return chunk;
  return 256;
}

// Everything but routed experts, as Qwen35MoeGpu allocates it (header comment, point 1).
VramBytes fixed_vram(const ModelConfig& c, const Sizer& s, int64_t context, RowFormat kv, int batch, bool embed_on_gpu, bool tied_shared,
                     int64_t prefill_chunk, bool int4_experts, int deferral, uint64_t reserve, int draft, bool head_cpu, int64_t verify_tokens,
                     RowFormat draft_lm_head) {
  const int64_t H = c.hidden_size, V = c.vocab_size, Is = c.shared_expert_intermediate_size;
  const int64_t conv_dim = c.linear_conv_dim(), Vd = c.linear_value_dim(), Hv = c.linear_num_value_heads;
  const int E = c.num_experts, L = c.num_layers;
  const int nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  VramBytes v;
  if (embed_on_gpu) v.dense_weights += align256(static_cast<uint64_t>(V * H) * 2);
  if (!tied_shared) v.dense_weights += s.linear("lm_head", V, H, false);
  v.dense_weights += floats(H) + floats(c.rotary_dim / 2);  // final norm, RoPE frequencies
  for (int l = 0; l < L; ++l) {
    const std::string pre = str_cat("layers.", l, ".");
    v.dense_weights += 2 * floats(H);
    if (c.layer_types[l] == LayerKind::LinearAttention) {
      const std::string a = pre + "linear_attn.";
      v.dense_weights += s.linear(a + "in_proj_qkv", conv_dim, H) + s.linear(a + "in_proj_z", Vd, H) + s.linear(a + "in_proj_b", Hv, H) +
                         s.linear(a + "in_proj_a", Hv, H) + s.linear(a + "out_proj", H, Vd);
      v.dense_weights += floats(conv_dim * c.linear_conv_kernel) + 2 * floats(Hv) + floats(c.linear_value_head_dim);
      v.deltanet_state += (conv_state_bytes(c) + ssm_state_bytes(c)) * batch;
    } else {
      const std::string a = pre + "self_attn.";
      v.dense_weights += s.linear(a + "q_proj", int64_t(nh) * hd * 2, H) + s.linear(a + "k_proj", int64_t(nkv) * hd, H) +
                         s.linear(a + "v_proj", int64_t(nkv) * hd, H) + s.linear(a + "o_proj", H, int64_t(nh) * hd);
      v.dense_weights += 2 * floats(hd);
      v.kv_cache += kv_cache_bytes(c, context, kv) * batch;
    }
    const std::string m = pre + "mlp.";
    v.dense_weights += s.linear(m + "gate", E, H, false) + s.linear(m + "shared_expert.gate_proj", Is, H) +
                       s.linear(m + "shared_expert.up_proj", Is, H) + s.linear(m + "shared_expert.down_proj", H, Is) +
                       s.linear(m + "shared_expert_gate", 1, H, false);
  }
  // speculative.draft: the MTP head on the GPU (GpuOptions::mtp): fc as two [H, H] halves, its norms,
  // one attention layer with its MoE, every routed expert of it resident (head_cpu: none, they are in
  // host memory) and their table, a KV cache per sequence; the verification step keeps draft + 1
  // DeltaNet states.
  const bool mtp = draft > 0 && c.mtp_layers > 0;
  if (mtp) {
    const Sizer ms{c, "mtp.", nullptr, s.experts_int4};  // the head's projections stay as stored
    const std::string a = "layers.0.self_attn.", m = "layers.0.mlp.";
    v.dense_weights += 2 * ms.linear("fc", H, H, false) + 5 * floats(H) + 2 * floats(hd);
    v.dense_weights += ms.linear(a + "q_proj", int64_t(nh) * hd * 2, H) + ms.linear(a + "k_proj", int64_t(nkv) * hd, H) +
                       ms.linear(a + "v_proj", int64_t(nkv) * hd, H) + ms.linear(a + "o_proj", H, int64_t(nh) * hd);
    v.dense_weights += ms.linear(m + "gate", E, H, false) + ms.linear(m + "shared_expert.gate_proj", Is, H) +
                       ms.linear(m + "shared_expert.up_proj", Is, H) + ms.linear(m + "shared_expert.down_proj", H, Is) +
                       ms.linear(m + "shared_expert_gate", 1, H, false);
    const bool q = ms.quant(m + "experts.0.gate_proj").quantized;
    const int64_t I = c.moe_intermediate_size;
    if (!head_cpu)
      v.expert_weights += static_cast<uint64_t>(E) * (2 * ms.linear(m + "experts.0.gate_proj", I, H) + ms.linear(m + "experts.0.down_proj", H, I));
    v.expert_weights += align256(static_cast<uint64_t>(E) * (q ? kInt4ExpertTableEntry : kBf16ExpertTableEntry));
    v.kv_cache += kv_cache_bytes(c, context, kv) * batch;
    if (draft_lm_head != RowFormat::Bf16) v.dense_weights += gpu::rows8_matrix_bytes(V, H);  // speculative.lm_head's copy
  }
  const int64_t kept = std::max<int64_t>(mtp ? draft + 1 : 0, verify_tokens), rows = decode_rows_for(c, prefill_chunk, batch, kept);
  // a decoder projection as 8-bit rows (any unit but lm_head, which prompts never run as a GEMM)
  const bool rows8 = s.rows8_units && std::any_of(s.rows8_units->begin(), s.rows8_units->end(), [](const auto& u) { return u.first != "lm_head"; });
  v.workspace += gpu_workspace(c, {.context = context,
                                   .prefill_chunk = prefill_chunk,
                                   .int4_experts = int4_experts,
                                   .deferral = deferral > 0,
                                   .rows8_prefill = rows8,
                                   .decode_rows = rows,
                                   .kept_positions = rows > 1 ? kept : 0})
                     .total();  // as the GPU model allocates it
  v.reserve = reserve;
  return v;
}

// The cost model (header comment, point 4): decode time per token from bytes over bandwidths plus
// per-kernel and per-handoff latency, and the prefill switch point.
void predict(const ModelConfig& c, const PlacementConfig& cfg, const PlanRequest& req, bool tied_shared, Plan& p) {
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const int k = c.num_experts_per_tok, L = c.num_layers, nkv = c.num_kv_heads, hd = c.head_dim;
  const VramBytes& v = p.vram;
  Prediction& pr = p.predicted;
  pr = Prediction{};  // from scratch: experts.link: auto predicts the same plan once per candidate
  auto pick = [](double configured, double measured, double dflt, std::string& from) {
    if (configured > 0) return from = "config", configured;
    if (measured > 0) return from = "measured", measured;
    return from = "default", dflt;
  };
  pr.gpu_bw = pick(cfg.bw_gpu, req.measured_gpu_bw, 1008e9, pr.gpu_bw_from);  // RTX 4090 spec
  pr.pcie_bw = pick(cfg.bw_pcie, 0, 25e9, pr.pcie_bw_from);                  // PCIe 4.0 x16, pinned
  pr.cpu_bw = pick(cfg.bw_cpu, req.measured_cpu_bw, 60e9, pr.cpu_bw_from);   // dual-channel DDR5
  // A decode token at cache position `pos` reads every attention layer's K and V rows up to it.
  const double typical_pos = static_cast<double>(std::min(p.context, kTypicalCachePosition));
  const double kv_row_read = static_cast<double>(c.num_full_attention_layers()) * 2 * static_cast<double>(gpu::kv_row_bytes(p.kv_format, nkv, hd));
  const double kv_read = kv_row_read * typical_pos;
  const double expert_read = static_cast<double>(p.gpu_expert_bytes);
  double dense_read = static_cast<double>(v.dense_weights);
  if (p.embed_on_gpu) dense_read -= static_cast<double>(align256(static_cast<uint64_t>(V * H) * 2)) - static_cast<double>(H * 2);
  if (tied_shared) dense_read += static_cast<double>(V * H * 2);  // the tied table is read once as lm_head
  // Decode kernels a layer (gpu.cpp): norm (fused with the residual add), stacked input
  // projections, the mixer (DeltaNet 2, attention 3), output projection, stacked router / shared
  // projections with the add + norm before them and the top-k in the last block, 2 MoE kernels (fp32
  // input read in them), shared down with SiLU * up formed as it reads = 9 / 10.
  const double launches = 9.0 * (L - c.num_full_attention_layers()) + 10.0 * c.num_full_attention_layers() + 4;
  const double shared_bytes = static_cast<double>(3 * Is * H * 2);
  // Hybrid steps run as one CUDA graph with the handoffs inside, like the all-GPU step (expert deferral
  // included).
  const double launch_us = cfg.launch_us;
  // experts.link: host memory's rate for the cores and PCIe together (unset: the CPU figure)
  const double memory = cfg.bw_host_memory > 0 ? std::max(cfg.bw_host_memory, pr.cpu_bw) : pr.cpu_bw;
  struct Step {
    double s = 0, gpu_bytes = 0, cpu_bytes = 0, cpu_s = 0;  // time, bytes read on each side, the host's bound time
  };
  auto step_at = [&](double pos) {
    Step st;
    st.gpu_bytes = dense_read + 2.0 * static_cast<double>(v.deltanet_state) / p.batch + kv_row_read * pos;
    for (int l = 0; l < L; ++l) st.gpu_bytes += k * p.layer_gpu_fraction[l] * expert_read;
    // The GPU's own time a layer: what a deferred expert's host time hides behind.
    const double gpu_layer = (st.gpu_bytes / pr.gpu_bw + launches * launch_us * 1e-6) / L;
    for (int l = 0; l < L; ++l) {
      const double gpu_acts = k * p.layer_gpu_fraction[l], cpu_acts = k - gpu_acts;
      const double cpu_b = cpu_acts * static_cast<double>(p.cpu_expert_bytes);
      st.cpu_bytes += cpu_b;
      double t_cpu = cpu_b / pr.cpu_bw;
      const bool linked = cpu_acts > 1e-9 && p.link_in_place > 0;
      // the bound: host memory read at the best rate the CPU (and with the link, PCIe beside it) can take
      st.cpu_s += linked ? cpu_b / std::max(pr.cpu_bw, std::min(memory, pr.cpu_bw * kLinkCpuShare + pr.pcie_bw * kLinkRate)) : t_cpu;
      if (linked) {
        // experts.link: the GPU reads some of the layer's CPU experts over PCIe while the host computes
        // the rest: up to link_in_place read in place. The two reads share host memory: the cores' rate
        // falls (kLinkCpuShare), the kernel reads at kLinkRate of the PCIe figure, and both together at
        // most at bandwidth.host_memory (default: the CPU figure).
        const double in_place = std::min(cpu_acts, static_cast<double>(p.link_in_place));
        const double bytes = static_cast<double>(p.cpu_expert_bytes);
        t_cpu = std::max({(cpu_acts - in_place) * bytes / (pr.cpu_bw * kLinkCpuShare), in_place * bytes / (pr.pcie_bw * kLinkRate),
                          cpu_acts * bytes / memory});
      }
      if (cpu_acts > 1e-9) {
        // The host's experts run while the GPU computes its own routed experts (2 launches) and the shared
        // down GEMV (`overlap`); the layer waits for what is left of them. With deferral the host-resident
        // ones among each token's N lowest-weight experts run after the host has released the others,
        // while the GPU goes on to the next layer's mixer and router (`gpu_rest`, the rest of its layer);
        // the host starts the next layer's experts once both are done. So a layer takes
        //   handoff + max(GPU's layer, max(gpu_rest, host's deferred part) + host's other part),
        // which without deferral is handoff + the GPU's layer + what of the host's time the overlap does
        // not cover. Where an expert lives does not depend on its rank in a token's top-k, so about
        // N * cpu_acts / k of the host's experts are deferred: a share N / k of its time.
        const double deferred = std::min(static_cast<double>(cfg.deferral) / k, 1.0);
        const double overlap = (gpu_acts * expert_read + shared_bytes) / pr.gpu_bw + 3 * launch_us * 1e-6;
        const double gpu_rest = std::max(0.0, gpu_layer - overlap);
        const double host_path = std::max(gpu_rest, t_cpu * deferred) + t_cpu * (1 - deferred);
        st.s += cfg.handoff_us * 1e-6 + std::max(gpu_layer, host_path) - gpu_layer;
      }
    }
    st.s += st.gpu_bytes / pr.gpu_bw + launches * launch_us * 1e-6;
    return st;
  };
  const Step typical = step_at(typical_pos), full = step_at(static_cast<double>(p.context));
  pr.gpu_bytes_per_token = typical.gpu_bytes;
  pr.cpu_bytes_per_token = typical.cpu_bytes;
  pr.decode_ms = typical.s * 1e3;
  pr.decode_tok_s = 1.0 / typical.s;
  pr.bound_tok_s = 1.0 / std::max(pr.gpu_bytes_per_token / pr.gpu_bw, typical.cpu_s);
  pr.gpu_bytes_full_context = full.gpu_bytes;
  pr.decode_tok_s_full_context = 1.0 / full.s;
  // Speculative decoding: a verification step of T = k + 1 tokens reads the dense weights once and,
  // per layer, the union of the experts its tokens route to, each where it lives (uniform routing: E
  // (1 - (1 - k/E)^T), an upper bound: text repeats experts), plus what it costs beyond its bytes
  // (kVerifyStepUs, kVerifyTokenUs); one draft reads the MTP head's fc, its
  // attention layer, router, shared expert and 8 of its experts (BF16, or int4 on load), and the whole lm_head, on the GPU.
  if (cfg.draft != 0 && c.mtp_layers > 0) {
    const int E = c.num_experts, nh = c.num_heads;
    for (int d = 1; d <= drafts_held(cfg.draft); ++d) {
      const double T = d + 1.0, extra = E * (1 - std::pow(1 - static_cast<double>(k) / E, T)) - k;  // experts beyond one token's
      double gpu_b = kv_read * (T - 1), cpu_b = 0;
      for (int l = 0; l < L; ++l) {
        gpu_b += extra * p.layer_gpu_fraction[l] * expert_read;
        cpu_b += extra * (1 - p.layer_gpu_fraction[l]) * static_cast<double>(p.cpu_expert_bytes);
      }
      pr.verify_ms.push_back(pr.decode_ms + (gpu_b / pr.gpu_bw + cpu_b / pr.cpu_bw) * 1e3 + L * (kVerifyStepUs + kVerifyTokenUs * (T - 1)) * 1e-3);
    }
    const double attn = (2.0 * nh * hd * H + 2.0 * nkv * hd * H + static_cast<double>(nh) * hd * H) * 2;
    const RowFormat drafts_read = p.draft_lm_head != RowFormat::Bf16 ? p.draft_lm_head : p.dense_format_of("lm_head");  // speculative.lm_head
    const double lm = drafts_read != RowFormat::Bf16 ? static_cast<double>(V) * (H + 4) : static_cast<double>(V) * H * 2;
    const std::string hf = p.experts_int4_on_load ? "int4" : "bf16";  // the head's experts (asymmetric when quantized on load)
    const int64_t hg = int4_expert_group(H, I);
    const double head_expert = static_cast<double>(2 * Sizer::host_matrix(hf, I, H, hg, false) + Sizer::host_matrix(hf, H, I, hg, false));
    // head_experts: cpu: its experts read from host memory instead, behind one more handoff
    const double head = 2.0 * H * H * 2 + attn + static_cast<double>(E) * H * 2 + shared_bytes + (p.head_experts_cpu ? 0 : k * head_expert) + lm;
    const double host = p.head_experts_cpu ? cfg.handoff_us * 1e-6 + k * static_cast<double>(p.head_host_expert_bytes) / E / pr.cpu_bw : 0;
    pr.draft_ms = (head / pr.gpu_bw + 14 * launch_us * 1e-6 + host) * 1e3;
  }
  // Prefill: streaming every CPU expert over PCIe vs computing the CPU share on the CPU: the switch
  // point in prompt tokens. The CPU's rate, ~1.7 T int ops/s effective, is fitted to the H200 machine's
  // 16 cores (all experts on the CPU, 512-token prompt in chunks of 2048: 654 ms, GPU part included).
  const double cpu_share = 1.0 - p.expected_gpu_expert_fraction;
  if (cfg.prefill == PrefillStrategy::Cpu || !p.stream_experts) {
    pr.prefill_gpu_min_tokens = 0;
  } else if (cfg.prefill == PrefillStrategy::GpuStream) {
    pr.prefill_gpu_min_tokens = 1;
  } else if (cfg.prefill_gpu_min_tokens > 0) {
    pr.prefill_gpu_min_tokens = cfg.prefill_gpu_min_tokens;
  } else {
    const double stream_s = static_cast<double>(p.host_expert_bytes) / pr.pcie_bw;
    const double cpu_s_per_token = L * k * std::max(cpu_share, 1e-9) * 6.0 * H * I / 1.7e12;
    pr.prefill_gpu_min_tokens = static_cast<int64_t>(std::min(std::ceil(stream_s / cpu_s_per_token), 1e12));
  }
}

}  // namespace

bool checkpoint_int4_experts(const ModelConfig& c) {
  return c.quant.for_module((c.composite ? "model.language_model." : "model.") + std::string("layers.0.mlp.experts.0.gate_proj")).quantized;
}

std::string expert_name(int layer, int expert) { return str_cat("layers.", layer, ".mlp.experts.", expert); }

double Prediction::speedup(int k, double a) const {
  if (k < 1 || k > static_cast<int>(verify_ms.size())) return 0;
  const double tokens = a >= 1 ? k + 1.0 : (1 - std::pow(a, k + 1)) / (1 - a);
  return tokens * decode_ms / (verify_ms[k - 1] + k * draft_ms);
}

int Plan::total_gpu_experts() const { return std::accumulate(experts_on_gpu.begin(), experts_on_gpu.end(), 0); }
bool Plan::any_cpu_experts() const {
  for (size_t l = 0; l < experts_on_gpu.size(); ++l)
    if (experts_on_gpu[l] < static_cast<int>(expert_on_gpu[l].size())) return true;
  return false;
}

Plan make_plan(const ModelConfig& c, const PlacementConfig& cfg, const PlanRequest& req) {
  Plan p;
  p.model = c.source;
  p.context = req.context ? req.context : cfg.context;
  p.batch = cfg.batch;
  p.deferral = cfg.deferral;
  p.head_experts_cpu = cfg.head_experts_cpu && cfg.draft != 0 && c.mtp_layers > 0;
  p.prefill = cfg.prefill;
  p.dense_format = cfg.dense_format;
  p.lm_head_format = cfg.lm_head_format;
  p.kv_format = parse_row_format(cfg.kv_format, str_cat(cfg.source, ": kv_cache.format"));
  if (p.context < 0 || p.context > c.max_position_embeddings)
    fail("context ", p.context, " must be between 1 and the model's max_position_embeddings (", c.max_position_embeddings, ")");
  p.budget_bytes = req.gpu_mem ? req.gpu_mem : cfg.gpu_memory ? cfg.gpu_memory : req.device_free_bytes;
  if (!p.budget_bytes)
    fail(cfg.source, ": no GPU memory budget: set gpu.memory in the config or pass --gpu-mem (no CUDA device to ask)");

  const std::string prefix = c.composite ? "model.language_model." : "model.";
  const bool gptq_experts = checkpoint_int4_experts(c);
  p.experts_int4_on_load = cfg.experts_int4_on_load(gptq_experts);
  if (p.experts_int4_on_load) p.on_load_note = gptq_experts ? "the MTP head's quantized on load" : "quantized on load";
  if (p.experts_int4_on_load && int4_expert_group(c.hidden_size, c.moe_intermediate_size) == 0)
    fail(cfg.source, ": experts.gpu_format / cpu_format int4: this model's experts (hidden ", c.hidden_size, ", intermediate ",
         c.moe_intermediate_size, ") have no int4 group (both sizes must be multiples of 32); keep them as stored");
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const int E = c.num_experts, L = c.num_layers;

  // ---- rules over the non-expert units ----
  // Where each lives and, for the projection units (a layer's mixer and shared expert, lm_head), its
  // format: a rule's `format: bf16 | int8 | fp8`, else dense.format (dense.lm_head for lm_head).
  std::vector<uint8_t> used(cfg.rules.size(), 0);
  std::map<std::string, RowFormat> rows8_units;
  auto check_fixed = [&](const std::string& unit, bool may_be_cpu, const std::string* default_format = nullptr) -> Side {
    const PlacementRule* r = first_rule(cfg.rules, unit, used);
    const std::string fmt = r && !r->format.empty() ? r->format : default_format ? *default_format : "bf16";
    if (r && !r->format.empty() && r->format != "bf16" && !(default_format && (r->format == "int8" || r->format == "fp8")))
      fail(rule_where(cfg, *r), " asks for format ", r->format, " for '", unit, "'; ",
           default_format ? "projections are bf16 (as stored), int8 or fp8 (rows quantized on load)" : "it is kept as stored (bf16)");
    if (default_format && fmt != "bf16") rows8_units[unit] = parse_row_format(fmt, unit);
    if (!r) return Side::Gpu;
    if (r->place == Side::Cpu && !may_be_cpu)
      fail(rule_where(cfg, *r), " puts '", unit, "' on the cpu; in a hybrid placement only routed experts and embed_tokens ",
           "live in host memory (attention, DeltaNet, routers, shared experts, norms and lm_head stay on the GPU; ",
           "--device cpu runs everything on the CPU)");
    return r->place.value_or(Side::Gpu);
  };
  p.embed_on_gpu = check_fixed("embed_tokens", true) == Side::Gpu;
  check_fixed("lm_head", false, &cfg.lm_head_format);
  check_fixed("norm", false);
  for (int l = 0; l < L; ++l) {
    for (const char* u : {"input_layernorm", "post_attention_layernorm", "mlp.gate", "mlp.shared_expert_gate"})
      check_fixed(layer_unit(l, u), false);
    check_fixed(layer_unit(l, "mlp.shared_expert"), false, &cfg.dense_format);
    check_fixed(layer_unit(l, c.layer_types[l] == LayerKind::FullAttention ? "self_attn" : "linear_attn"), false, &cfg.dense_format);
  }
  p.dense_units.assign(rows8_units.begin(), rows8_units.end());
  if (cfg.draft != 0 && c.mtp_layers > 0 && !cfg.draft_lm_head_format.empty()) {  // speculative.lm_head: a copy unless the model's is that
    const RowFormat f = parse_row_format(cfg.draft_lm_head_format, str_cat(cfg.source, ": speculative.lm_head"));
    if (f != p.dense_format_of("lm_head") && c.hidden_size % 16 == 0) {
      p.draft_lm_head = f;
      p.draft_lm_head_bytes = gpu::rows8_matrix_bytes(c.vocab_size, c.hidden_size);
    }
  }
  const Sizer s{c, prefix, &rows8_units, p.experts_int4_on_load};

  // ---- experts: formats and sizes ----
  const bool tied_shared = c.tie_word_embeddings && p.embed_on_gpu;
  const auto eq = s.quant("layers.0.mlp.experts.0.gate_proj");
  p.expert_checkpoint_format = eq.quantized ? "int4" : "bf16";
  const int64_t group = eq.quantized ? (eq.group_size > 0 ? eq.group_size : H) : 128;
  p.gpu_expert_bytes = 2 * s.linear("layers.0.mlp.experts.0.gate_proj", I, H) + s.linear("layers.0.mlp.experts.0.down_proj", H, I);
  const uint64_t table = align256(E * (eq.quantized ? kInt4ExpertTableEntry : kBf16ExpertTableEntry));

  // ---- context: auto ----
  // The longest context whose KV cache (and context-sized workspaces) takes at most a quarter of what
  // the budget leaves after everything else at the shortest context, up to the model's limit, in
  // steps of 1024 tokens: long contexts by default, most of the card still for routed experts.
  if (p.context == 0) {
    const int64_t chunk = cfg.prefill_chunk < 0 ? 256 : cfg.prefill_chunk, floor = std::min<int64_t>(4096, c.max_position_embeddings);
    auto fixed_at = [&](int64_t ctx) {
      return fixed_vram(c, s, ctx, p.kv_format, p.batch, p.embed_on_gpu, tied_shared, chunk, eq.quantized, cfg.deferral, cfg.gpu_reserve, drafts_held(cfg.draft), p.head_experts_cpu, req.verify_tokens, p.draft_lm_head).total();
    };
    const uint64_t base = fixed_at(floor);
    const uint64_t share = p.budget_bytes > base ? (p.budget_bytes - base) / 4 : 0;
    auto context_at = [&](int64_t i) { return std::min<int64_t>(c.max_position_embeddings, floor + i * 1024); };
    int64_t lo = 0, hi = (c.max_position_embeddings - floor + 1023) / 1024;  // fixed_at grows with the context
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (fixed_at(context_at(mid)) - base <= share) lo = mid;
      else hi = mid - 1;
    }
    p.context = context_at(lo);
    const uint64_t extra = fixed_at(p.context) - base;
    p.context_note = str_cat("auto: the KV cache and context-sized buffers take ", format_gib(extra + base - fixed_at(1)),
                             ", at most a quarter of what the budget leaves; past ", floor, " tokens they hold the room of ",
                             p.gpu_expert_bytes ? extra / p.gpu_expert_bytes : 0, " routed experts (", format_gib(extra),
                             "); --context or `context:` in the YAML sets it");
  }

  // ---- fixed VRAM ----
  auto fixed_for = [&](int64_t chunk) {
    return fixed_vram(c, s, p.context, p.kv_format, p.batch, p.embed_on_gpu, tied_shared, chunk, eq.quantized, cfg.deferral, cfg.gpu_reserve, drafts_held(cfg.draft), p.head_experts_cpu, req.verify_tokens, p.draft_lm_head);
  };
  p.prefill_chunk_auto = cfg.prefill_chunk < 0;
  if (p.prefill_chunk_auto) {
    auto fixed_total = [&](int64_t chunk) { return fixed_for(chunk).total() + static_cast<uint64_t>(L) * table; };
    auto stream_all_host = [&](int64_t chunk) {
      return gpu::stream_buffer_bytes(H, I, group, E, L, E, gpu::stream_pass_tokens(chunk, cfg.prefill_stream_pass)).total();
    };
    p.prefill_chunk = auto_prefill_chunk(cfg.cpu_experts_all, p.budget_bytes, static_cast<uint64_t>(L) * E * p.gpu_expert_bytes,
                                         fixed_total, stream_all_host);
  } else {
    p.prefill_chunk = cfg.prefill_chunk;
  }
  p.vram = fixed_for(p.prefill_chunk);
  VramBytes& v = p.vram;

  // Expert rules: side pins and CPU format.
  p.expert_on_gpu.assign(L, std::vector<uint8_t>(E, 0));
  std::vector<std::vector<int8_t>> pinned(L, std::vector<int8_t>(E, -1));  // -1 free, 0 cpu, 1 gpu
  std::string rule_format;
  const PlacementRule* format_rule = nullptr;
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e) {
      const PlacementRule* r = first_rule(cfg.rules, expert_name(l, e), used);
      if (!r) continue;
      if (r->place) pinned[l][e] = *r->place == Side::Gpu;
      if (!r->format.empty()) {
        if (format_rule && r->format != rule_format)
          fail(rule_where(cfg, *r), " gives experts format ", r->format, " but ", rule_where(cfg, *format_rule), " gives ",
               rule_format, "; all CPU experts share one format");
        rule_format = r->format, format_rule = r;
      }
    }
  for (size_t i = 0; i < cfg.rules.size(); ++i)
    if (!used[i])
      fail(rule_where(cfg, cfg.rules[i]), " matches nothing in this model (names look like ", expert_name(3, 17),
           ", layers.0.self_attn, embed_tokens, lm_head)");
  std::string fmt = !rule_format.empty() ? rule_format : cfg.cpu_format;
  if (fmt == "auto") fmt = p.expert_checkpoint_format;
  if (fmt == "fp8")
    fail(rule_where(cfg, *format_rule), " gives routed experts format fp8; CPU experts are int4, int8 or bf16 (fp8 is for dense units: ",
         "layers.L.self_attn, linear_attn, mlp.shared_expert, lm_head)");
  if (fmt == "int4" && !eq.quantized)
    fail(format_rule ? rule_where(cfg, *format_rule) : cfg.source + ": experts.cpu_format",
         ": int4 CPU experts need a GPTQ checkpoint; this one has bf16 experts (use int8 or bf16)");
  if (fmt == "bf16" && eq.quantized)
    fail(format_rule ? rule_where(cfg, *format_rule) : cfg.source + ": experts.cpu_format",
         p.experts_int4_on_load ? ": the experts are quantized on load to int4 (experts.gpu_format: int4); run them as int4 or int8 on the CPU, not bf16"
                                : ": this checkpoint's experts are GPTQ int4; run them as int4 (lossless) or int8 on the CPU, not bf16");
  p.cpu_expert_format = fmt;
  const int64_t down_group = !eq.quantized ? 128 : p.experts_int4_on_load ? int4_expert_group(H, I) : group, int8_group = 128;
  const bool sym = !eq.quantized || eq.sym;
  p.cpu_expert_bytes = 2 * Sizer::host_matrix(fmt, I, H, fmt == "int8" ? int8_group : group, sym) +
                       Sizer::host_matrix(fmt, H, I, fmt == "int8" ? int8_group : down_group, sym);

  // ---- experts.link: its buffers (tables for every layer, scratch) ----
  const bool link_asked = cfg.link_in_place > 0;
  const bool link_possible = eq.quantized && fmt == "int4" && gpu::moe_int4_tiles_fits(H, I, group, c.num_experts_per_tok, c.num_experts_per_tok);
  if (cfg.link_auto && link_possible)  // room for any number read in place; predict() picks it
    v.workspace += gpu::link_buffer_bytes(H, I, E, L, c.num_experts_per_tok).total();
  if (link_asked) {
    if (!eq.quantized || fmt != "int4")
      fail(cfg.source, ": experts.link: the GPU reads CPU experts in place only as GPTQ int4 (",
           eq.quantized ? "experts.cpu_format is " + fmt + ": set it to int4" : std::string("this checkpoint's experts are bf16"), ")");
    const int k = c.num_experts_per_tok;
    p.link_in_place = std::min(cfg.link_in_place, k);
    if (!gpu::moe_int4_tiles_fits(H, I, group, k, p.link_in_place))
      fail(cfg.source, ": experts.link: the link kernel does not take hidden ", H, ", intermediate ", I, " in groups of ", group);
    v.workspace += gpu::link_buffer_bytes(H, I, E, L, p.link_in_place).total();
  }

  // ---- minimum and the fill ----
  p.min_budget_bytes = v.total() + static_cast<uint64_t>(L) * table;
  auto component_list = [&]() {
    return str_cat("dense weights ", format_gib(v.dense_weights), ", KV cache ", format_gib(v.kv_cache), " at context ", p.context,
                   ", DeltaNet state ", format_gib(v.deltanet_state), ", workspace ", format_gib(v.workspace), ", reserve ",
                   format_gib(v.reserve));
  };
  if (p.budget_bytes < p.min_budget_bytes)
    fail("GPU memory budget ", format_gib(p.budget_bytes), " is below the minimum of ", format_gib(p.min_budget_bytes), " for ",
         c.source, " (", component_list(),
         "); raise gpu.memory / --gpu-mem, lower the context, or move embed_tokens to the CPU with a rule");

  HeatMap heat;
  if (!cfg.heat.empty()) {
    heat = load_heat_map(cfg.heat);
    heat.check_shape(L, E);
    p.heat_used = true;
  }
  // Share of each layer's activations per expert, computed once (the sort below asks E log E times).
  std::vector<std::vector<double>> shares(L, std::vector<double>(E, 1.0 / E));
  if (p.heat_used)
    for (int l = 0; l < L; ++l)
      for (int e = 0; e < E; ++e) shares[l][e] = heat.share(l, e);
  auto share = [&](int l, int e) { return shares[l][e]; };
  // Rank of each expert within its layer, hottest first (ties to the lower id).
  std::vector<std::vector<int>> ranked(L);
  for (int l = 0; l < L; ++l) {
    ranked[l].resize(E);
    std::iota(ranked[l].begin(), ranked[l].end(), 0);
    std::stable_sort(ranked[l].begin(), ranked[l].end(), [&](int a, int b) { return share(l, a) > share(l, b); });
  }
  struct Cand { int l, e, rank; double share; };
  std::vector<Cand> order;
  for (int l = 0; l < L; ++l)
    for (int r = 0; r < E; ++r) {
      const int e = ranked[l][r];
      if (pinned[l][e] == -1) order.push_back({l, e, r, share(l, e)});
    }
  ExpertSelection sel = cfg.select;
  p.selection = selection_name(sel);
  if (cfg.gpu_experts_per_layer >= 0) p.selection = str_cat("gpu_experts_per_layer ", cfg.gpu_experts_per_layer);
  if (sel == ExpertSelection::Layers) p.selection = str_cat("layers ", cfg.layer_first, "-", cfg.layer_last);
  if (sel == ExpertSelection::Uniform) {
    std::stable_sort(order.begin(), order.end(), [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank < b.rank : a.l < b.l; });
  } else {  // frequency (and the order within layers / all): expected activations, then round robin over layers
    std::stable_sort(order.begin(), order.end(), [](const Cand& a, const Cand& b) {
      if (a.share != b.share) return a.share > b.share;
      return a.rank != b.rank ? a.rank < b.rank : a.l < b.l;
    });
  }
  if (sel == ExpertSelection::Layers) {
    if (cfg.layer_last >= L) fail(cfg.source, ": experts.select layers ", cfg.layer_first, "-", cfg.layer_last, " is outside the model's layers 0-", L - 1);
    std::erase_if(order, [&](const Cand& x) { return x.l < cfg.layer_first || x.l > cfg.layer_last; });
  }
  if (sel == ExpertSelection::None) order.clear();
  if (cfg.gpu_experts_per_layer >= 0) std::erase_if(order, [&](const Cand& x) { return x.rank >= cfg.gpu_experts_per_layer; });

  uint64_t used_bytes = p.min_budget_bytes;
  std::vector<int> count(L, 0);
  for (int l = 0; l < L; ++l)
    for (int e = 0; e < E; ++e)
      if (pinned[l][e] == 1) p.expert_on_gpu[l][e] = 1, used_bytes += p.gpu_expert_bytes, ++count[l];
  if (used_bytes > p.budget_bytes)
    fail(cfg.source, ": rules pin ", std::accumulate(count.begin(), count.end(), 0), " routed experts to the GPU (",
         format_gib(used_bytes - p.min_budget_bytes), ") but the budget ", format_gib(p.budget_bytes), " leaves ",
         format_gib(p.budget_bytes - p.min_budget_bytes), " after the minimum; at least ", format_gib(used_bytes), " is needed");
  const bool must_all = sel == ExpertSelection::All || cfg.gpu_experts_per_layer >= 0;
  uint64_t needed = used_bytes + order.size() * p.gpu_expert_bytes;
  // Streamed prefill (GpuOptions::stream_prefill_min_tokens): one layer's host experts on the device in
  // both layouts, sized for the layer with the most host experts (gpu::stream_buffer_bytes). Reserved
  // for all E before the fill, then for what the fill left, and the freed bytes filled again (more
  // GPU experts only lower the most host experts per layer, so the second reserve still fits).
  const bool can_stream = cfg.prefill != PrefillStrategy::Cpu && eq.quantized && fmt == "int4" && p.prefill_chunk > 0;
  const int64_t pass = gpu::stream_pass_tokens(p.prefill_chunk, cfg.prefill_stream_pass);
  p.stream_pass = pass;
  auto stream_bytes = [&](int m) { return gpu::stream_buffer_bytes(H, I, group, E, L, m, pass).total(); };
  // Reserving whenever some experts stay on the CPU keeps the plan monotone in the budget (a budget
  // that cannot hold the buffers places no experts rather than more than a larger one would).
  // Experts stay on the CPU when the budget is short, or when rules and the selection leave some out.
  const bool host_left = needed > p.budget_bytes || used_bytes - p.min_budget_bytes + order.size() * p.gpu_expert_bytes <
                                                        static_cast<uint64_t>(L) * E * p.gpu_expert_bytes;
  const std::string no_room = str_cat("the budget leaves no room for its buffers (", format_gib(stream_bytes(E)),
                                      " with every expert of a layer on the CPU; set prefill.strategy: cpu to use that memory for experts)");
  if (!can_stream && cfg.prefill != PrefillStrategy::Cpu)
    p.stream_note = !eq.quantized ? "it needs GPTQ int4 experts" : fmt != "int4" ? "it needs int4 CPU experts (experts.cpu_format)"
                                                                               : "it needs batched prefill (prefill.chunk > 0)";
  auto fill = [&](uint64_t limit) {
    for (const Cand& x : order) {
      if (p.expert_on_gpu[x.l][x.e]) continue;
      if (used_bytes + p.gpu_expert_bytes > limit) break;
      p.expert_on_gpu[x.l][x.e] = 1;
      used_bytes += p.gpu_expert_bytes;
      ++count[x.l];
    }
  };
  auto most_host = [&]() { return E - *std::min_element(count.begin(), count.end()); };
  auto less = [&](uint64_t b) { return p.budget_bytes > b ? p.budget_bytes - b : 0; };
  const bool streaming = can_stream && host_left;
  fill(streaming ? less(stream_bytes(E)) : p.budget_bytes);
  if (streaming && most_host() > 0) {
    fill(less(stream_bytes(most_host())));  // what the smaller buffers freed
    if (used_bytes + stream_bytes(most_host()) <= p.budget_bytes) {
      p.stream_experts = most_host();
      v.workspace += stream_bytes(p.stream_experts);
    } else {
      p.stream_note = no_room;
    }
  }
  if (must_all && needed > p.budget_bytes)
    fail(cfg.source, ": experts.select '", p.selection, "' needs ", format_gib(needed), " of GPU memory but the budget is ",
         format_gib(p.budget_bytes), " (", component_list(), ", routed experts ", format_gib(needed - p.min_budget_bytes), ")");

  p.experts_on_gpu = count;
  if (cfg.prefill == PrefillStrategy::GpuStream && !p.stream_experts && p.any_cpu_experts())
    fail(cfg.source, ": prefill.strategy: gpu_stream cannot be honoured: ", p.stream_note, "; use prefill.strategy: auto or cpu");
  // beside the MTP head's (fixed_vram's, with drafts), as the GPU model allocates them
  v.expert_weights += static_cast<uint64_t>(L) * table + static_cast<uint64_t>(p.total_gpu_experts()) * p.gpu_expert_bytes;
  p.layer_gpu_fraction.assign(L, 0);
  double frac_sum = 0;
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e)
      if (p.expert_on_gpu[l][e]) p.layer_gpu_fraction[l] += share(l, e);
    p.layer_gpu_fraction[l] = std::min(1.0, p.layer_gpu_fraction[l]);
    frac_sum += p.layer_gpu_fraction[l];
  }
  p.expected_gpu_expert_fraction = L ? frac_sum / L : 1.0;
  p.host_expert_bytes = static_cast<uint64_t>(L * E - p.total_gpu_experts()) * p.cpu_expert_bytes;
  if (p.head_experts_cpu) {  // the MTP head's experts as the host store keeps them (hybrid_cpu.cpp)
    const QuantConfig::ModuleQuant hq = Sizer{c, "mtp.", nullptr, p.experts_int4_on_load}.quant("layers.0.mlp.experts.0.gate_proj");
    // GPTQ (or int4 on load) in the CPU format; floating-point weights asked as int4 are kept as int8
    const std::string hf = hq.quantized ? fmt : fmt == "int4" ? "int8" : fmt;
    const int64_t hg = hf == "int8" ? int8_group : hq.group_size > 0 ? hq.group_size : 128;
    p.head_host_expert_bytes = static_cast<uint64_t>(E) * (2 * Sizer::host_matrix(hf, I, H, hg, hq.sym) + Sizer::host_matrix(hf, H, I, hg, hq.sym));
    p.host_expert_bytes += p.head_host_expert_bytes;
  }
  p.host_available_bytes = req.host_available_bytes;

  predict(c, cfg, req, tied_shared, p);
  if (cfg.link_auto && link_possible && p.any_cpu_experts()) {  // experts.link: auto: the best predicted number read in place
    int best_n = 0;
    Prediction best = p.predicted;
    for (int n = 1; n <= c.num_experts_per_tok; ++n) {
      p.link_in_place = n;
      predict(c, cfg, req, tied_shared, p);
      if (p.predicted.decode_tok_s > best.decode_tok_s * 1.01) best_n = n, best = p.predicted;  // 1%: not for noise in the model
    }
    p.link_in_place = best_n;
    p.predicted = best;
  }
  return p;
}

}  // namespace tandem::placement

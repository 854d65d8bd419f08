// placement/plan_report.cpp: a plan as people and scripts read it (tandem plan's table and JSON, the
// one line a run prints) and the same budget planned per format side by side.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "core/error.h"
#include "core/quantize_int4.h"
#include "placement/planner.h"

namespace tandem::placement {

nlohmann::json plan_to_json(const Plan& p) {
  using nlohmann::json;
  json j;
  j["model"] = p.model;
  j["budget_bytes"] = p.budget_bytes;
  j["vram_total_bytes"] = p.vram.total();
  j["vram_allocated_bytes"] = p.vram.allocated();
  j["min_budget_bytes"] = p.min_budget_bytes;
  j["dense_format"] = p.dense_format;
  j["lm_head_format"] = p.lm_head_format;
  j["kv_format"] = row_format_name(p.kv_format);
  j["dense_units"] = nlohmann::json::object();
  for (const auto& [unit, f] : p.dense_units) j["dense_units"][unit] = row_format_name(f);
  j["vram_bytes"] = {{"dense_weights", p.vram.dense_weights}, {"expert_weights", p.vram.expert_weights},
                     {"kv_cache", p.vram.kv_cache},           {"deltanet_state", p.vram.deltanet_state},
                     {"workspace", p.vram.workspace},         {"reserve", p.vram.reserve}};
  j["context"] = p.context;
  if (!p.context_note.empty()) j["context_note"] = p.context_note;
  j["batch"] = p.batch;
  j["embed_on_gpu"] = p.embed_on_gpu;
  j["selection"] = p.selection;
  j["heat_used"] = p.heat_used;
  j["expert_checkpoint_format"] = p.expert_checkpoint_format;
  j["experts_int4_on_load"] = p.experts_int4_on_load;
  j["cpu_expert_format"] = p.cpu_expert_format;
  j["gpu_expert_bytes"] = p.gpu_expert_bytes;
  j["cpu_expert_bytes"] = p.cpu_expert_bytes;
  j["host_expert_bytes"] = p.host_expert_bytes;
  j["host_available_bytes"] = p.host_available_bytes;
  j["host_fits"] = p.host_fits();
  j["experts_on_gpu"] = p.experts_on_gpu;
  j["experts_on_gpu_total"] = p.total_gpu_experts();
  j["layer_gpu_fraction"] = p.layer_gpu_fraction;
  j["expected_gpu_expert_fraction"] = p.expected_gpu_expert_fraction;
  j["deferral"] = p.deferral;
  j["link"] = {{"in_place", p.link_in_place}};
  j["prefill_strategy"] = prefill_name(p.prefill);
  j["prefill_chunk"] = p.prefill_chunk;
  j["prefill_chunk_auto"] = p.prefill_chunk_auto;
  j["stream_experts_per_layer"] = p.stream_experts;
  j["stream_pass_tokens"] = p.stream_pass;
  if (!p.stream_note.empty()) j["stream_note"] = p.stream_note;
  const Prediction& pr = p.predicted;
  j["predicted_decode_tok_s"] = pr.decode_tok_s;
  j["predicted_decode_ms"] = pr.decode_ms;
  j["bound_decode_tok_s"] = pr.bound_tok_s;
  j["predicted_decode_tok_s_full_context"] = pr.decode_tok_s_full_context;
  j["gpu_bytes_per_token_full_context"] = pr.gpu_bytes_full_context;
  j["prefill_gpu_min_tokens"] = pr.prefill_gpu_min_tokens;
  if (!pr.verify_ms.empty()) {
    nlohmann::json sp = {{"verify_ms", pr.verify_ms}, {"draft_ms", pr.draft_ms}, {"head_experts", p.head_experts_cpu ? "cpu" : "gpu"},
                         {"head_host_expert_bytes", p.head_host_expert_bytes},
                         {"lm_head", p.draft_lm_head != RowFormat::Bf16 ? row_format_name(p.draft_lm_head) : "model's"}};
    for (const double a : {0.6, 0.8, 0.9}) {
      std::vector<double> up;
      for (int k = 1; k <= static_cast<int>(pr.verify_ms.size()); ++k) up.push_back(pr.speedup(k, a));
      sp["speedup_at_acceptance"][str_cat(a)] = up;
    }
    j["speculative"] = sp;
  }
  j["cost_model"] = {{"gpu_bytes_per_token", pr.gpu_bytes_per_token},
                     {"cpu_bytes_per_token", pr.cpu_bytes_per_token},
                     {"gpu_bw", pr.gpu_bw}, {"gpu_bw_from", pr.gpu_bw_from},
                     {"pcie_bw", pr.pcie_bw}, {"pcie_bw_from", pr.pcie_bw_from},
                     {"cpu_bw", pr.cpu_bw}, {"cpu_bw_from", pr.cpu_bw_from}};
  return j;
}

std::string plan_summary(const Plan& plan) {
  int64_t total = 0;
  for (const auto& layer : plan.expert_on_gpu) total += static_cast<int64_t>(layer.size());
  return str_cat(plan.total_gpu_experts(), " of ", total, " routed experts on the GPU (", plan.selection, "), budget ", format_gib(plan.budget_bytes),
                 ", expected GPU share ", static_cast<int>(plan.expected_gpu_expert_fraction * 100 + 0.5), "%");
}

std::string plan_table(const Plan& p) {
  std::string o;
  auto line = [&](const std::string& a, const std::string& b) {
    o += "  " + a + std::string(a.size() < 22 ? 22 - a.size() : 0, ' ') + " " + b + "\n";
  };
  auto pct = [](double x) { return str_cat(static_cast<int>(std::lround(x * 1000)) / 10.0, "%"); };
  const VramBytes& v = p.vram;
  o += str_cat("placement plan for ", p.model, "\n");
  line("GPU budget", str_cat(format_gib(p.budget_bytes), " (minimum ", format_gib(p.min_budget_bytes), "), context ", p.context,
                             ", batch ", p.batch));
  if (!p.context_note.empty()) line("context", p.context_note);
  o += "\n  GPU memory             bytes\n";
  line("dense weights", format_gib(v.dense_weights) + (p.embed_on_gpu ? "" : " (embed_tokens on the CPU)") +
                            [&]() -> std::string {  // which projections are 8-bit rows
                              const RowFormat lm = p.dense_format_of("lm_head");
                              size_t int8 = 0, fp8 = 0;
                              for (const auto& [unit, f] : p.dense_units)
                                if (unit != "lm_head") ++(f == RowFormat::Int8 ? int8 : fp8);
                              const std::string head = lm == RowFormat::Bf16 ? "" : str_cat("lm_head as ", row_format_name(lm), " rows");
                              if (int8 + fp8 == 0) return head.empty() ? "" : " (" + head + ")";
                              const std::string kinds = int8 && fp8 ? str_cat("int8 ", int8, ", fp8 ", fp8) : str_cat(int8 ? "int8 " : "fp8 ", int8 + fp8);
                              return str_cat(" (8-bit rows: ", kinds, " of ", 2 * p.expert_on_gpu.size(), " mixers and shared experts",
                                             head.empty() ? "" : "; " + head, ")");
                            }());
  const bool head_on_gpu = !p.predicted.verify_ms.empty() && !p.head_experts_cpu;
  line("routed experts", str_cat(format_gib(v.expert_weights), " (", p.total_gpu_experts(), " experts", head_on_gpu ? " and the MTP head's" : "", ", ",
                                 p.expert_checkpoint_format, p.on_load_note.empty() ? "" : ", " + p.on_load_note, ")"));
  line("KV cache", str_cat(format_gib(v.kv_cache), " (", row_format_name(p.kv_format), p.kv_format == RowFormat::Bf16 ? "" : ", a scale per token and KV head",
                           "; kv_cache.format sets it)"));
  line("DeltaNet state", format_gib(v.deltanet_state));
  {  // the batch's trade: each sequence's KV cache and state is room routed experts could have had
    const uint64_t per_seq = (v.kv_cache + v.deltanet_state) / static_cast<uint64_t>(std::max(p.batch, 1));
    line("per sequence", str_cat(format_gib(per_seq), " of KV cache and state at context ", p.context, ": the room of ",
                                 p.gpu_expert_bytes ? per_seq / p.gpu_expert_bytes : 0, " routed experts (`batch:` sets the sequences held)"));
  }
  const char* chunk_why = !p.prefill_chunk_auto      ? ""
                          : p.prefill_chunk > 256     ? ", auto: it costs no GPU experts"
                                                      : ", auto: a larger one would take GPU experts (prefill.chunk sets it)";
  line("workspace", format_gib(v.workspace) + (p.prefill_chunk > 0 ? str_cat(" (prefill in batches of ", p.prefill_chunk, " tokens", chunk_why, ")")
                                                                   : std::string(" (prefill token by token)")));
  line("reserve (CUDA)", format_gib(v.reserve));
  line("total", str_cat(format_gib(v.total()), " of ", format_gib(p.budget_bytes)));
  o += "\n";
  line("CPU experts", str_cat(format_gib(p.host_expert_bytes), " in host RAM (", p.cpu_expert_format, ")",
                              p.host_available_bytes ? str_cat(", ", format_gib(p.host_available_bytes), " available") : std::string()));
  if (!p.host_fits())
    line("", "not enough host RAM for the CPU experts: raise the GPU budget, use int4 experts, or free memory");
  line("selection", p.selection + (p.heat_used ? " (heat map)" : " (no heat map: uniform activations)"));
  o += "\n  experts on the GPU per layer (expected share of activations):\n";
  for (size_t l = 0; l < p.experts_on_gpu.size(); ++l) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "  %3zu: %4d %6.1f%%", l, p.experts_on_gpu[l], p.layer_gpu_fraction[l] * 100);
    o += buf;
    o += (l % 4 == 3 || l + 1 == p.experts_on_gpu.size()) ? "\n" : "  ";
  }
  o += "\n";
  const Prediction& pr = p.predicted;
  line("GPU expert share", pct(p.expected_gpu_expert_fraction));
  char buf[160];
  auto gbs = [&](double bw) {
    std::snprintf(buf, sizeof buf, bw >= 1e12 ? "%.0f" : "%.1f", bw / 1e9);
    return std::string(buf);
  };
  line("bandwidths", str_cat(gbs(pr.gpu_bw), " GB/s GPU (", pr.gpu_bw_from, "), ", gbs(pr.pcie_bw), " GB/s PCIe (", pr.pcie_bw_from,
                             "), ", gbs(pr.cpu_bw), " GB/s CPU (", pr.cpu_bw_from, ")"));
  std::snprintf(buf, sizeof buf, "%.2f GB GPU, %.3f GB CPU", pr.gpu_bytes_per_token / 1e9, pr.cpu_bytes_per_token / 1e9);
  line("bytes per token", buf);
  std::snprintf(buf, sizeof buf, "%.1f tok/s (%.2f ms/token; bandwidth bound %.1f tok/s)", pr.decode_tok_s, pr.decode_ms, pr.bound_tok_s);
  line("predicted decode", buf);
  if (p.context > kTypicalCachePosition) {  // the prediction above reads the cache at kTypicalCachePosition
    std::snprintf(buf, sizeof buf, "%.1f tok/s with the cache full at %lld tokens (%.2f GB a token on the GPU)", pr.decode_tok_s_full_context,
                  static_cast<long long>(p.context), pr.gpu_bytes_full_context / 1e9);
    line("", buf);
  }
  if (!pr.verify_ms.empty()) {
    std::string v = "verify k = 1..", up;
    v += str_cat(pr.verify_ms.size(), ":");
    for (size_t i = 0; i < pr.verify_ms.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s %.2f", i ? " /" : "", pr.verify_ms[i] / pr.decode_ms);
      v += buf;
      std::snprintf(buf, sizeof buf, "%s %.2f", i ? " /" : "", pr.speedup(static_cast<int>(i) + 1, 0.8));
      up += buf;
    }
    std::snprintf(buf, sizeof buf, "x a decode step, a draft %.2f ms; speed-up at acceptance 0.8:", pr.draft_ms);
    line("speculative", v + " " + buf + up);
    if (p.head_experts_cpu)
      line("", str_cat("the MTP head's routed experts in host memory (", format_gib(p.head_host_expert_bytes), ", in the CPU experts' figure)"));
    if (p.draft_lm_head != RowFormat::Bf16)
      line("", str_cat("the drafts read their own ", row_format_name(p.draft_lm_head), " copy of the lm_head (speculative.lm_head, ",
                       format_gib(p.draft_lm_head_bytes), ", in the dense weights)"));
  }
  if (p.link_in_place > 0)
    line("link experts", str_cat("the GPU computes the first ", p.link_in_place, " of each token's CPU experts reading them over PCIe"));
  line("prefill on GPU from",
       pr.prefill_gpu_min_tokens
           ? str_cat(pr.prefill_gpu_min_tokens, " prompt tokens (", prefill_name(p.prefill), "; CPU experts streamed over PCIe, up to ",
                     p.stream_experts, " a layer, ", p.stream_pass, " tokens a pass)")
           : str_cat("never (CPU experts computed on the CPU", p.stream_note.empty() ? std::string() : "; no streaming: " + p.stream_note, ")"));
  return o;
}

std::vector<FormatRow> plan_formats(const ModelConfig& model, const PlacementConfig& config, const PlanRequest& request) {
  // Experts: as the config has them and, where floating-point experts would be counted (a BF16
  // checkpoint's, or the MTP head's with drafts) and have an int4 group, quantized on load.
  const bool gptq = checkpoint_int4_experts(model);
  const bool float_experts = !gptq || (config.draft != 0 && model.mtp_layers > 0);
  std::vector<std::pair<std::string, PlacementConfig>> experts;
  if (config.experts_int4_on_load(gptq)) {
    experts.push_back({"int4", config});
  } else {
    experts.push_back({"as stored", config});
    if (float_experts && int4_expert_group(model.hidden_size, model.moe_intermediate_size) > 0) {
      PlacementConfig q = config;
      q.gpu_format = "int4";
      experts.push_back({"int4", q});
    }
  }
  // Dense formats for each choice of experts at the config's KV cache format, then the other KV
  // formats with the config's dense and experts.
  std::vector<FormatRow> rows;
  auto dense_name = [](const PlacementConfig& c) {
    return c.lm_head_format != "bf16" ? c.dense_format + " + lm_head " + c.lm_head_format : c.dense_format;
  };
  for (const auto& [ex, base] : experts)
    for (const char* f : {"bf16", "int8", "int8 + lm_head", "fp8"}) {
      PlacementConfig c = base;
      c.dense_format = std::string(f) == "bf16" ? "bf16" : std::string(f) == "fp8" ? "fp8" : "int8";
      c.lm_head_format = std::string(f) == "int8 + lm_head" ? "int8" : "bf16";
      Plan plan = make_plan(model, c, request);
      // a rule that keeps lm_head's format (`match: lm_head` + `format:`) makes that row the int8 row again
      if (c.lm_head_format == "int8" && plan.dense_format_of("lm_head") != RowFormat::Int8) continue;
      rows.push_back({f, ex, config.kv_format, std::move(plan)});
    }
  for (const char* kv : {"bf16", "int8", "fp8"}) {
    if (kv == config.kv_format) continue;
    PlacementConfig c = experts[0].second;
    c.kv_format = kv;
    rows.push_back({dense_name(c), experts[0].first, kv, make_plan(model, c, request)});
  }
  return rows;
}

std::string formats_table(const std::vector<FormatRow>& rows) {
  std::string o =
      "dense format    experts    KV cache  dense bytes  KV bytes    context  routed experts on GPU  GPU bytes/token  predicted decode  cache full\n";
  char buf[260];
  for (const FormatRow& r : rows) {
    const Plan& p = r.plan;
    std::snprintf(buf, sizeof buf, "%-14s  %-9s  %-8s  %11s  %10s  %7lld  %12d of %5zu  %12.2f GB  %10.1f tok/s  %6.1f tok/s\n", r.format.c_str(), r.experts.c_str(),
                  r.kv.c_str(), format_gib(p.vram.dense_weights).c_str(), format_gib(p.vram.kv_cache).c_str(), static_cast<long long>(p.context), p.total_gpu_experts(),
                  p.expert_on_gpu.size() * (p.expert_on_gpu.empty() ? 0 : p.expert_on_gpu[0].size()), p.predicted.gpu_bytes_per_token / 1e9,
                  p.predicted.decode_tok_s, p.predicted.decode_tok_s_full_context);
    o += buf;
  }
  return o;
}

nlohmann::json formats_to_json(const std::vector<FormatRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const FormatRow& r : rows)
    j.push_back({{"dense_format", r.format}, {"experts", r.experts}, {"kv_format", r.kv}, {"dense_weights", r.plan.vram.dense_weights},
                 {"kv_cache", r.plan.vram.kv_cache}, {"context", r.plan.context},
                 {"gpu_experts", r.plan.total_gpu_experts()}, {"gpu_bytes_per_token", r.plan.predicted.gpu_bytes_per_token},
                 {"predicted_decode_tok_s", r.plan.predicted.decode_tok_s},
                 {"predicted_decode_tok_s_full_context", r.plan.predicted.decode_tok_s_full_context}});
  return j;
}

}  // namespace tandem::placement

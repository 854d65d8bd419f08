// The planner's formats: projections as 8-bit rows (dense.format, dense.lm_head, rules unit by unit),
// routed experts quantized to int4 on load, the KV cache as int8 / fp8 codes, and what a full cache
// costs the decode prediction: the bytes each choice saves, the experts and context they buy, and the
// side-by-side table `tandem plan` prints.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/row_format.h"
#include "gpu_core/attention_sizes.h"
#include "placement/gpu_layout.h"
#include "placement/planner.h"
#include "tests/unit/placement_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem::placement {
namespace {

using namespace test_plans;

// Projections as 8-bit rows unit by unit: a rule's `format: int8 | fp8 | bf16` over a layer's mixer
// (self_attn / linear_attn), its shared expert or lm_head, before dense.format / dense.lm_head. The
// plan counts each unit's bytes and lists the 8-bit ones with their format for the GPU loader.
TEST(Planner, DenseFormatPerUnitByRules) {
  const ModelConfig m = model35();
  const std::string base = "gpu:\n  memory: 12GiB\ncontext: 4096\nprefill: {chunk: 256}\n";
  const Plan bf = make_plan(m, fixed_bw(yaml(base)), {});
  const Plan all = make_plan(m, fixed_bw(yaml(base + "dense: {format: int8}\n")), {});
  EXPECT_TRUE(bf.dense_units.empty());
  EXPECT_EQ(all.dense_units.size(), 80u);  // 40 mixers and 40 shared experts
  EXPECT_EQ(all.dense_format_of("layers.0.linear_attn"), RowFormat::Int8);
  EXPECT_EQ(all.dense_format_of("layers.3.self_attn"), RowFormat::Int8);
  EXPECT_EQ(all.dense_format_of("layers.7.mlp.shared_expert"), RowFormat::Int8);
  EXPECT_EQ(all.dense_format_of("lm_head"), RowFormat::Bf16);
  // DeltaNet only: between none and all, by its share of the bytes
  const Plan dn = make_plan(m, fixed_bw(yaml(base + "rules:\n  - {match: 'layers.*.linear_attn', format: int8}\n")), {});
  EXPECT_EQ(dn.dense_units.size(), 30u);
  EXPECT_EQ(dn.dense_format_of("layers.0.linear_attn"), RowFormat::Int8);
  EXPECT_EQ(dn.dense_format_of("layers.3.self_attn"), RowFormat::Bf16);
  EXPECT_LT(dn.vram.dense_weights, bf.vram.dense_weights);
  EXPECT_GT(dn.vram.dense_weights, all.vram.dense_weights);
  EXPECT_NE(plan_table(dn).find("8-bit rows: int8 30 of 80 mixers and shared experts"), std::string::npos) << plan_table(dn);
  // everything int8 but the attention layers, which a first rule keeps as stored; lm_head fp8 by a rule
  const Plan mixed = make_plan(m, fixed_bw(yaml(base + "dense: {format: int8}\nrules:\n  - {match: 'layers.*.self_attn', format: bf16}\n"
                                                       "  - {match: lm_head, format: fp8}\n")), {});
  EXPECT_EQ(mixed.dense_units.size(), 71u);  // 30 DeltaNet + 40 shared experts + lm_head
  EXPECT_EQ(mixed.dense_format_of("lm_head"), RowFormat::Fp8);
  EXPECT_EQ(mixed.dense_format_of("layers.3.self_attn"), RowFormat::Bf16);
  EXPECT_NE(plan_table(mixed).find("lm_head as fp8 rows"), std::string::npos) << plan_table(mixed);
  EXPECT_EQ(plan_to_json(mixed)["dense_units"]["lm_head"], "fp8");
  const Plan lm = make_plan(m, fixed_bw(yaml(base + "dense: {lm_head: int8}\n")), {});
  ASSERT_EQ(lm.dense_units.size(), 1u);
  EXPECT_EQ(lm.dense_units[0].first, "lm_head");
  EXPECT_NEAR(static_cast<double>(bf.vram.dense_weights - lm.vram.dense_weights), 248320.0 * 2048, 2e6);
  // fp8 rows take int8's bytes
  const Plan f8 = make_plan(m, fixed_bw(yaml(base + "dense: {format: fp8}\n")), {});
  EXPECT_EQ(f8.vram.dense_weights, all.vram.dense_weights);
  EXPECT_EQ(f8.dense_format_of("layers.3.self_attn"), RowFormat::Fp8);
  EXPECT_NE(plan_table(f8).find("8-bit rows: fp8 80 of 80"), std::string::npos) << plan_table(f8);
  // fp8 is for dense units, not routed experts (the CPU experts' format)
  test::expect_error([&] { make_plan(m, fixed_bw(yaml(base + "rules:\n  - {match: 'layers.*.mlp.experts.*', format: fp8}\n")), {}); },
                     {"routed experts format fp8", "int4, int8 or bf16"});
}

// experts.gpu_format: int4 (or cpu_format: int4 / a rule's format: int4 on a BF16 checkpoint): the
// floating-point experts are quantized on load (Qwen35Moe::quantize_experts_int4, asymmetric group 128),
// so the plan counts them as GPTQ int4 with zero points on both sides: a quarter of the BF16 bytes and
// about four times the GPU experts; on the GPTQ release only the MTP head's BF16 experts change.
TEST(Planner, ExpertsQuantizedOnLoad) {
  const uint64_t int4_asym = 3u * (524288 + 16384 + 8192);  // nibbles, f16 scales, u8 zeros per 512x2048 matrix
  const Plan bf16 = make_plan(model35_bf16(), {}, {.gpu_mem = 24ull << 30});
  EXPECT_FALSE(bf16.experts_int4_on_load);
  for (const char* text : {"experts: {gpu_format: int4}", "experts: {cpu_format: int4}",
                           "rules:\n  - {match: 'layers.*.mlp.experts.*', format: int4}\n"}) {
    SCOPED_TRACE(text);
    const Plan q = make_plan(model35_bf16(), yaml(text), {.gpu_mem = 24ull << 30});
    EXPECT_TRUE(q.experts_int4_on_load);
    EXPECT_EQ(q.expert_checkpoint_format, "int4");
    EXPECT_EQ(q.cpu_expert_format, "int4");
    EXPECT_EQ(q.gpu_expert_bytes, int4_asym);
    EXPECT_EQ(q.cpu_expert_bytes, int4_asym);
    EXPECT_GT(q.total_gpu_experts(), 3 * bf16.total_gpu_experts());
    EXPECT_LE(q.vram.total(), 24ull << 30);
    EXPECT_NE(plan_table(q).find("int4, quantized on load"), std::string::npos);
  }
  test::expect_error([] { make_plan(model35_bf16(), yaml("experts: {gpu_format: int4, cpu_format: bf16}"), {.gpu_mem = 24ull << 30}); },
                     {"experts.cpu_format", "quantized on load to int4", "not bf16"});
  test::expect_error([] { yaml("experts: {gpu_format: int8}"); }, {"test.yaml:1", "experts.gpu_format", "'int4'"});
  ModelConfig odd = model35_bf16();
  odd.hidden_size = 48;
  test::expect_error([&] { make_plan(odd, yaml("experts: {gpu_format: int4}"), {.gpu_mem = 24ull << 30}); },
                     {"test.yaml", "no int4 group", "hidden 48"});

  // The GPTQ release: cpu_format: int4 is its experts as stored; gpu_format: int4 quantizes the MTP
  // head's 256 BF16 experts, which a drafting plan then counts at int4's size.
  const ModelConfig m = model35();
  EXPECT_FALSE(make_plan(m, yaml("experts: {cpu_format: int4}"), {.gpu_mem = 16ull << 30}).experts_int4_on_load);
  const std::string base = "prefill: {chunk: 256}\ncontext: 4096\nspeculative: {draft: 3}\n";
  const Plan head_bf16 = make_plan(m, yaml(base), {.gpu_mem = 16ull << 30});
  const Plan head_int4 = make_plan(m, yaml(base + "experts: {gpu_format: int4}\n"), {.gpu_mem = 16ull << 30});
  EXPECT_TRUE(head_int4.experts_int4_on_load);
  EXPECT_EQ(head_int4.gpu_expert_bytes, head_bf16.gpu_expert_bytes);  // the model's experts: as stored
  const uint64_t saved = 256ull * (3 * 2048 * 512 * 2 - int4_asym);
  const int more = head_int4.total_gpu_experts() - head_bf16.total_gpu_experts();
  EXPECT_GE(static_cast<uint64_t>(more + 1) * head_bf16.gpu_expert_bytes, saved) << more << " more GPU experts";
  EXPECT_LT(head_int4.predicted.draft_ms, head_bf16.predicted.draft_ms);

  // tandem plan's side by side: a BF16 checkpoint gets its experts as stored and as int4, each with the
  // four dense formats, then the two other KV cache formats; the GPTQ release without drafts only the
  // four (its experts are int4 already) and the two.
  const std::vector<FormatRow> rows = plan_formats(model35_bf16(), fixed_bw({}), {.gpu_mem = 24ull << 30});
  ASSERT_EQ(rows.size(), 10u);
  EXPECT_EQ(rows[0].kv, "bf16");
  EXPECT_EQ(rows[3].format, "fp8");
  EXPECT_EQ(rows[3].plan.vram.dense_weights, rows[1].plan.vram.dense_weights);  // fp8 rows: int8's bytes
  EXPECT_EQ(rows[8].kv, "int8");
  EXPECT_EQ(rows[9].kv, "fp8");
  EXPECT_LT(rows[8].plan.vram.kv_cache, rows[0].plan.vram.kv_cache);
  EXPECT_EQ(rows[0].experts, "as stored");
  EXPECT_EQ(rows[4].experts, "int4");
  EXPECT_EQ(rows[0].plan.total_gpu_experts(), bf16.total_gpu_experts());
  EXPECT_GT(rows[4].plan.total_gpu_experts(), 3 * rows[0].plan.total_gpu_experts());
  EXPECT_GT(rows[4].plan.predicted.decode_tok_s, rows[0].plan.predicted.decode_tok_s);
  EXPECT_NE(formats_table(rows).find("int4"), std::string::npos);
  EXPECT_EQ(formats_to_json(rows)[4]["experts"], "int4");
  EXPECT_EQ(plan_formats(m, fixed_bw({}), {.gpu_mem = 24ull << 30}).size(), 6u);
  EXPECT_EQ(plan_formats(m, fixed_bw(yaml(base)), {.gpu_mem = 24ull << 30}).size(), 10u);  // drafting: the head's experts
}

// kv_cache.format: int8 / fp8 rows (codes and an fp32 scale per token and KV head, each part padded to
// 16 bytes: gpu::kv_row_bytes) at the 35B shape, 2 KV heads x 256: 512 + 16 bytes a row instead of
// 1,024, so 10,560 B a token over the 10 attention layers' K and V instead of 20,480. The same context
// leaves room for more experts and reads fewer bytes a token; context: auto holds ~1.9x the tokens.
TEST(Planner, CodedKvCacheHalvesItsBytes) {
  const ModelConfig m = model35();
  auto plan = [&](const std::string& text, uint64_t gib) { return make_plan(m, fixed_bw(yaml(text)), {.gpu_mem = gib << 30}); };
  const Plan bf = plan("context: 131072\n", 12), q8 = plan("context: 131072\nkv_cache: {format: int8}\n", 12),
             f8 = plan("context: 131072\nkv_cache: {format: fp8}\n", 12);
  EXPECT_EQ(bf.vram.kv_cache, 20480ull * 131072);
  EXPECT_EQ(q8.vram.kv_cache, 10560ull * 131072);
  EXPECT_EQ(f8.vram.kv_cache, q8.vram.kv_cache);
  EXPECT_EQ(q8.kv_format, RowFormat::Int8);
  EXPECT_EQ(f8.kv_format, RowFormat::Fp8);
  EXPECT_GT(q8.total_gpu_experts(), bf.total_gpu_experts());
  EXPECT_GT(q8.predicted.decode_tok_s, bf.predicted.decode_tok_s);
  // every expert on the GPU either way at 24 GiB: the same bytes but the cache's rows (at the cost
  // model's typical position, 1,024)
  const Plan bf24 = plan("context: 131072\n", 24), q824 = plan("context: 131072\nkv_cache: {format: int8}\n", 24);
  ASSERT_EQ(bf24.total_gpu_experts(), q824.total_gpu_experts());
  EXPECT_NEAR(bf24.predicted.gpu_bytes_per_token - q824.predicted.gpu_bytes_per_token, (20480.0 - 10560.0) * 1024, 1.0);
  EXPECT_NE(plan_table(q8).find("(int8, a scale per token and KV head"), std::string::npos) << plan_table(q8);
  EXPECT_EQ(plan_to_json(f8)["kv_format"], "fp8");
  const Plan auto_bf = plan("context: auto\nprefill: {chunk: 256}\n", 8), auto_q8 = plan("context: auto\nprefill: {chunk: 256}\nkv_cache: {format: int8}\n", 8);
  EXPECT_LT(auto_q8.context, m.max_position_embeddings);
  EXPECT_GE(static_cast<double>(auto_q8.context), 1.8 * static_cast<double>(auto_bf.context)) << auto_bf.context << " -> " << auto_q8.context;
  test::expect_error([] { yaml("kv_cache: {format: int4}\n"); }, {"test.yaml:1", "kv_cache.format", "'int4'", "'bf16', 'int8' or 'fp8'"});
  test::expect_error([] { yaml("kv_cache: {fromat: int8}\n"); }, {"test.yaml:1", "fromat", "format"});
}

// dense.format: int8: the projections (not the router, embedding or lm_head) at a byte a weight plus a
// scale a row, so more routed experts fit the same budget and the cost model reads fewer bytes.
TEST(Planner, Int8DenseProjectionsLeaveRoomForExperts) {
  const ModelConfig m = model35();
  const std::string base = "context: 4096\nprefill: {chunk: 256}\n";
  const Plan bf = make_plan(m, fixed_bw(yaml(base)), {.gpu_mem = 12ull << 30});
  const Plan q8 = make_plan(m, fixed_bw(yaml(base + "dense: {format: int8}\n")), {.gpu_mem = 12ull << 30});
  EXPECT_EQ(q8.dense_format, "int8");
  // the projections: 30 DeltaNet layers (qkv 8192, z 4096, b/a 32, out 2048 x 4096 in) and 10 attention
  // layers (q 8192, k/v 512, o), 40 shared experts (3 x 512 x 2048): ~1.4 GB at 2 bytes, half at 1
  const double saved = static_cast<double>(bf.vram.dense_weights - q8.vram.dense_weights);
  EXPECT_GT(saved, 1.2e9);
  EXPECT_LT(saved, 1.6e9);
  EXPECT_GT(q8.total_gpu_experts(), bf.total_gpu_experts());
  EXPECT_LE(q8.vram.total(), 12ull << 30);
  EXPECT_GT(q8.predicted.decode_tok_s, bf.predicted.decode_tok_s);
  EXPECT_NE(plan_table(q8).find("8-bit rows: int8 80 of 80"), std::string::npos) << plan_table(q8);
  // a prompt chunk's GEMM reads the codes as bf16 from scratch the size of the largest projection
  // (DeltaNet qkv and attention q|gate: 8192 x 2048), counted in the workspace
  // (prefill.strategy: cpu: no streamed-prefill buffers, which follow the experts left on the host)
  auto workspace = [&](const std::string& extra) {
    return make_plan(m, fixed_bw(yaml("context: 4096\nprefill: {chunk: 256, strategy: cpu}\n" + extra)), {.gpu_mem = 12ull << 30}).vram.workspace;
  };
  EXPECT_EQ(workspace("dense: {format: int8}\n") - workspace(""), align256(8192ull * 2048 * 2));
  EXPECT_EQ(workspace("dense: {lm_head: int8}\n"), workspace("")) << "lm_head never runs as a prompt GEMM: no scratch";
  test::expect_error([] { yaml("dense: {format: int4}\n"); }, {"test.yaml:1", "dense.format", "'int4'", "'bf16', 'int8' or 'fp8'"});
  // tandem plan's side-by-side rows: the same budget, one plan a format
  const std::vector<FormatRow> rows = plan_formats(m, fixed_bw(yaml(base)), {.gpu_mem = 12ull << 30});
  ASSERT_EQ(rows.size(), 6u);  // four dense formats, then the KV cache as int8 and fp8
  EXPECT_EQ(rows[0].plan.vram.dense_weights, bf.vram.dense_weights);
  EXPECT_EQ(rows[1].plan.total_gpu_experts(), q8.total_gpu_experts());
  EXPECT_NE(formats_table(rows).find("int8"), std::string::npos);
  EXPECT_EQ(formats_to_json(rows).size(), 6u);
  // dense.lm_head: int8 as well: the 248320 x 2048 table at a byte a weight, half a GB fewer
  const Plan lm = make_plan(m, fixed_bw(yaml(base + "dense: {format: int8, lm_head: int8}\n")), {.gpu_mem = 12ull << 30});
  EXPECT_NEAR(static_cast<double>(q8.vram.dense_weights - lm.vram.dense_weights), 248320.0 * 2048, 2e6);
  EXPECT_EQ(rows[2].plan.vram.dense_weights, lm.vram.dense_weights);
  EXPECT_GT(lm.predicted.decode_tok_s, q8.predicted.decode_tok_s);
  test::expect_error([] { yaml("dense: {lm_head: fp4}\n"); }, {"dense.lm_head", "'fp4'"});
  // a rule that keeps lm_head in bf16 makes "int8 + lm_head" the int8 row: it is left out
  const std::vector<FormatRow> kept = plan_formats(m, fixed_bw(yaml(base + "rules:\n  - {match: lm_head, format: bf16}\n")), {.gpu_mem = 12ull << 30});
  ASSERT_EQ(kept.size(), 5u);
  for (const FormatRow& r : kept) EXPECT_NE(r.format, "int8 + lm_head");
}

// The decode prediction reads the KV cache at 1,024 tokens; the same step with the cache full reads
// every attention layer's K and V rows up to the context: the extra bytes are exactly those rows, in
// the cache's format, so a coded cache loses about half as much speed at a long context.
TEST(Planner, DecodeWithTheCacheFull) {
  const ModelConfig m = model35();
  const std::string base = "cpu_experts: none\nprefill: {chunk: 256}\n";
  auto plan = [&](int64_t ctx, const std::string& kv) {
    return make_plan(m, fixed_bw(yaml(base + "context: " + std::to_string(ctx) + "\nkv_cache: {format: " + kv + "}\n")), {.gpu_mem = 80ull << 30});
  };
  const Plan short_ctx = plan(1024, "bf16");
  EXPECT_DOUBLE_EQ(short_ctx.predicted.decode_tok_s_full_context, short_ctx.predicted.decode_tok_s);
  EXPECT_DOUBLE_EQ(short_ctx.predicted.gpu_bytes_full_context, short_ctx.predicted.gpu_bytes_per_token);
  for (const char* kv : {"bf16", "int8", "fp8"}) {
    SCOPED_TRACE(kv);
    const Plan p = plan(131072, kv);
    const double row = 10 * 2.0 * static_cast<double>(gpu::kv_row_bytes(parse_row_format(kv, "kv"), 2, 256));  // 10 attention layers, K and V
    EXPECT_NEAR(p.predicted.gpu_bytes_full_context - p.predicted.gpu_bytes_per_token, row * (131072 - kTypicalCachePosition), 1.0);
    EXPECT_LT(p.predicted.decode_tok_s_full_context, p.predicted.decode_tok_s);
  }
  const Plan bf = plan(131072, "bf16"), i8 = plan(131072, "int8");
  EXPECT_GT(i8.predicted.decode_tok_s_full_context, bf.predicted.decode_tok_s_full_context * 1.1);
  EXPECT_NE(plan_table(bf).find("with the cache full at 131072 tokens"), std::string::npos) << plan_table(bf);
  EXPECT_EQ(plan_table(short_ctx).find("with the cache full"), std::string::npos);
  EXPECT_DOUBLE_EQ(plan_to_json(bf)["predicted_decode_tok_s_full_context"].get<double>(), bf.predicted.decode_tok_s_full_context);
  EXPECT_NE(formats_table(plan_formats(m, fixed_bw(yaml(base + "context: 131072\n")), {.gpu_mem = 80ull << 30})).find("cache full"), std::string::npos);
}

}  // namespace
}  // namespace tandem::placement

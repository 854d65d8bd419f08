// `tandem synth`: presets, the JSON files of a model folder, and the run itself. See synth.h.
#include "tools/synth/synth.h"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/bpe/bpe_trainer.h"
#include "core/error.h"
#include "core/file_io.h"
#include "runtime/format/safetensors.h"
#include "tools/synth/write.h"

namespace tandem::synth {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// Qwen's distance from <|endoftext|> to the padded vocabulary end (248320 - 248044).
constexpr int64_t kQwenSpecialTail = 276;

ojson vision_config(int64_t out_hidden) {
  return {{"model_type", "qwen3_5_moe_vision"}, {"depth", 27},          {"hidden_size", 1152},
          {"num_heads", 16},                    {"intermediate_size", 4304}, {"hidden_act", "gelu_pytorch_tanh"},
          {"patch_size", 16},                   {"temporal_patch_size", 2},  {"spatial_merge_size", 2},
          {"out_hidden_size", out_hidden},      {"num_position_embeddings", 2304},
          {"deepstack_visual_indexes", ojson::array()}};
}

// M-RoPE sections over the rotary half-dim, in Qwen's 11:11:10 proportions ([11, 11, 10] for 32).
ojson mrope_section(int rotary_half) {
  const int a = static_cast<int>(std::lround(rotary_half * 11.0 / 32.0));
  return {a, a, rotary_half - 2 * a};
}

// The files a run wrote, removed again when it fails part way (a full disk, a failed routing report),
// so a later load finds no model rather than half of one. Each file is written atomically.
class WrittenFiles {
 public:
  ~WrittenFiles() {
    if (done_) return;
    std::error_code ec;
    for (const auto& p : files_) fs::remove(p, ec);
  }
  void write(const fs::path& p, const std::string& text) {
    files_.push_back(p);
    write_file_atomic(p.string(), text);
  }
  void add(const std::string& p) { files_.emplace_back(p); }
  void keep() { done_ = true; }

 private:
  std::vector<fs::path> files_;
  bool done_ = false;
};

std::string generation_config_json(const Vocab& v) {
  const int64_t eot = v.special_base, im_end = v.special_base + 2;
  ojson j = {{"bos_token_id", eot}, {"pad_token_id", eot}, {"eos_token_id", {im_end, eot}},
             {"do_sample", true},   {"top_k", 20},         {"top_p", 0.95},
             {"temperature", 1.0}};
  return j.dump(2) + "\n";
}

std::string tokenizer_config_json(const Vocab& v, int64_t max_positions) {
  ojson decoder = ojson::object();
  ojson extra = ojson::array();
  const auto& sp = qwen_special_tokens();
  for (size_t i = 0; i < sp.size(); ++i) {
    decoder[std::to_string(v.special_base + static_cast<int64_t>(i))] = {
        {"content", sp[i].first}, {"lstrip", false}, {"normalized", false}, {"rstrip", false},
        {"single_word", false},   {"special", sp[i].second}};
    if (i > 0 && sp[i].second) extra.push_back(sp[i].first);
  }
  ojson j = {{"add_bos_token", false},
             {"add_prefix_space", false},
             {"added_tokens_decoder", decoder},
             {"additional_special_tokens", extra},
             {"bos_token", nullptr},
             {"clean_up_tokenization_spaces", false},
             {"eos_token", "<|im_end|>"},
             {"errors", "replace"},
             {"model_max_length", max_positions},
             {"pad_token", "<|endoftext|>"},
             {"split_special_tokens", false},
             {"tokenizer_class", "Qwen2Tokenizer"},
             {"unk_token", nullptr}};
  return j.dump(2) + "\n";
}

bool holds_model(const fs::path& dir) {
  if (!fs::exists(dir)) return false;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == "model.safetensors.index.json" || e.path().extension() == ".safetensors") return true;
  }
  return false;
}

void remove_weights(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n == "model.safetensors.index.json" || n == "synth_report.json" || e.path().extension() == ".safetensors" ||
        (n.rfind("model", 0) == 0 && e.path().extension() == ".partial"))
      fs::remove(e.path());
  }
}

ojson shares_json(const RoutingShares& s) { return {{"top10", s.top10}, {"top20", s.top20}, {"top50", s.top50}}; }

}  // namespace

std::string_view quant_name(Quant q) { return q == Quant::BF16 ? "bf16" : "gptq-int4"; }

Quant parse_quant(const std::string& s) {
  if (s == "bf16") return Quant::BF16;
  if (s == "gptq-int4") return Quant::GptqInt4;
  fail("unknown quantization '", s, "' (expected bf16 or gptq-int4)");
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = [] {
    std::vector<Preset> v;
    Shape tiny;
    tiny.hidden_size = 128;
    tiny.num_layers = 4;
    tiny.num_heads = 4;
    tiny.num_kv_heads = 2;
    tiny.head_dim = 64;
    tiny.linear_num_key_heads = 2;
    tiny.linear_num_value_heads = 4;
    tiny.linear_key_head_dim = 32;
    tiny.linear_value_head_dim = 32;
    tiny.num_experts = 16;
    tiny.num_experts_per_tok = 4;
    tiny.moe_intermediate_size = 128;
    tiny.shared_expert_intermediate_size = 128;
    v.push_back({"tiny", "demo model: hidden 128, 4 layers (3 = attention), 16 experts top-4, vocab = BPE + specials",
                 tiny, Quant::BF16});

    Shape small;
    small.hidden_size = 1024;
    small.num_layers = 12;
    small.num_heads = 8;
    small.num_kv_heads = 2;
    small.head_dim = 256;
    small.linear_num_key_heads = 8;
    small.linear_num_value_heads = 16;
    small.linear_key_head_dim = 128;
    small.linear_value_head_dim = 128;
    small.num_experts = 64;
    small.num_experts_per_tok = 8;
    small.moe_intermediate_size = 512;
    small.shared_expert_intermediate_size = 512;
    small.vocab_size = 32768;
    small.special_base = 32768 - kQwenSpecialTail;
    v.push_back({"small", "CPU measurements: hidden 1024, 12 layers, 64 experts x 512 top-8, vocab 32768 (~1 GB GPTQ)",
                 small, Quant::GptqInt4});

    Shape big;  // spec §1 exactly
    big.hidden_size = 2048;
    big.num_layers = 40;
    big.num_heads = 16;
    big.num_kv_heads = 2;
    big.head_dim = 256;
    big.linear_num_key_heads = 16;
    big.linear_num_value_heads = 32;
    big.linear_key_head_dim = 128;
    big.linear_value_head_dim = 128;
    big.num_experts = 256;
    big.num_experts_per_tok = 8;
    big.moe_intermediate_size = 512;
    big.shared_expert_intermediate_size = 512;
    big.vocab_size = 248320;
    big.special_base = 248044;
    v.push_back({"qwen3.5-35b-a3b", "the real shapes (spec §1): ~22 GB as GPTQ-Int4, ~69 GB as BF16", big, Quant::GptqInt4});
    return v;
  }();
  return p;
}

const Preset& find_preset(const std::string& name) {
  std::string names;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  fail("unknown preset '", name, "' (choose one of: ", names, ")");
}

const std::vector<std::pair<std::string, bool>>& qwen_special_tokens() {
  // Qwen's order and "special" flags (offsets from <|endoftext|>; spec §5).
  static const std::vector<std::pair<std::string, bool>> t = {
      {"<|endoftext|>", true},    {"<|im_start|>", true},      {"<|im_end|>", true},      {"<|object_ref_start|>", true},
      {"<|object_ref_end|>", true}, {"<|box_start|>", true},   {"<|box_end|>", true},     {"<|quad_start|>", true},
      {"<|quad_end|>", true},     {"<|vision_start|>", true},  {"<|vision_end|>", true},  {"<|vision_pad|>", true},
      {"<|image_pad|>", true},    {"<|video_pad|>", true},     {"<tool_call>", false},    {"</tool_call>", false},
      {"<|fim_prefix|>", false},  {"<|fim_middle|>", false},   {"<|fim_suffix|>", false}, {"<|fim_pad|>", false},
      {"<|repo_name|>", false},   {"<|file_sep|>", false},     {"<tool_response>", false}, {"</tool_response>", false},
      {"<think>", false},         {"</think>", false}};
  return t;
}

std::string config_json(const Shape& s, const Vocab& v, Quant quant) {
  ojson layer_types = ojson::array();
  for (int i = 0; i < s.num_layers; ++i)
    layer_types.push_back((i + 1) % s.full_attention_interval == 0 ? "full_attention" : "linear_attention");
  const double prf = 0.25;
  const int rotary_half = static_cast<int>(s.head_dim * prf) / 2;
  ojson text = {
      {"model_type", "qwen3_5_moe_text"},
      {"vocab_size", v.vocab_size},
      {"hidden_size", s.hidden_size},
      {"num_hidden_layers", s.num_layers},
      {"full_attention_interval", s.full_attention_interval},
      {"layer_types", layer_types},
      {"num_attention_heads", s.num_heads},
      {"num_key_value_heads", s.num_kv_heads},
      {"head_dim", s.head_dim},
      {"attn_output_gate", true},
      {"attention_bias", false},
      {"hidden_act", "silu"},
      {"linear_num_key_heads", s.linear_num_key_heads},
      {"linear_num_value_heads", s.linear_num_value_heads},
      {"linear_key_head_dim", s.linear_key_head_dim},
      {"linear_value_head_dim", s.linear_value_head_dim},
      {"linear_conv_kernel_dim", 4},
      {"mamba_ssm_dtype", "float32"},
      {"num_experts", s.num_experts},
      {"num_experts_per_tok", s.num_experts_per_tok},
      {"moe_intermediate_size", s.moe_intermediate_size},
      {"shared_expert_intermediate_size", s.shared_expert_intermediate_size},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", s.max_position_embeddings},
      {"partial_rotary_factor", prf},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", 10000000},
        {"partial_rotary_factor", prf},
        {"mrope_section", mrope_section(rotary_half)},
        {"mrope_interleaved", true}}},
      {"mtp_num_hidden_layers", 1},
      {"mtp_use_dedicated_embeddings", false},
      {"bos_token_id", v.special_base},
      {"eos_token_id", v.special_base},
      {"pad_token_id", nullptr},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.001},
      {"tie_word_embeddings", false},
  };
  ojson j = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
             {"model_type", "qwen3_5_moe"},
             {"tie_word_embeddings", false},
             {"image_token_id", v.special_base + 12},
             {"video_token_id", v.special_base + 13},
             {"vision_start_token_id", v.special_base + 9},
             {"vision_end_token_id", v.special_base + 10},
             {"text_config", text},
             {"vision_config", vision_config(s.hidden_size)}};
  if (quant == Quant::GptqInt4) {
    // The official GPTQ-Int4 block (spec §4), in its key order: GPTQModel's `dynamic` is first-match.
    ojson dynamic = {{"lm_head", ojson::object()},      {"model.language_model.embed_tokens", ojson::object()},
                     {"-:.*attn.*", ojson::object()},   {"-:.*shared_expert.*", ojson::object()},
                     {"-:.*mtp.*", ojson::object()},    {"-:.*visual.*", ojson::object()}};
    j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4},           {"group_size", 128},
                                {"sym", true},            {"desc_act", false},   {"dynamic", dynamic},
                                {"checkpoint_format", "gptq"}};
  }
  return j.dump(2) + "\n";
}

RoutingReport routing_report_in_memory(const Preset& preset, const Options& opts) {
  const Shape& s = preset.shape;
  const Vocab v{kBpeVocabTarget, s.vocab_size ? s.special_base : int64_t(kBpeVocabTarget),
                s.vocab_size ? s.vocab_size : int64_t(kBpeVocabTarget + qwen_special_tokens().size())};
  const ModelConfig cfg = parse_model_config(config_json(s, v, Quant::BF16), preset.name);
  const double spread = opts.routing_skew > 0 ? opts.routing_skew * skew_log_spread(cfg.num_experts, cfg.num_experts_per_tok) : 0.0;
  const std::vector<PlannedTensor> plan = plan_tensors(cfg, Quant::BF16, v, spread, opts.seed);
  auto find = [&](const std::string& name) -> const PlannedTensor& {
    for (const auto& t : plan)
      if (t.spec.name == name) return t;
    fail("internal: no tensor ", name);
  };
  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return measure_routing(
      cfg,
      [&](int l, std::vector<float>& router, std::vector<float>& norm) {
        const std::string p = "model.language_model.layers." + std::to_string(l) + ".";
        router = generate_as_f32(find(p + "mlp.gate.weight"), opts.seed);
        norm = generate_as_f32(find(p + "post_attention_layernorm.weight"), opts.seed);
      },
      opts.report_samples, opts.seed, threads);
}

Result synthesize(const Preset& preset, const Options& opts) {
  using clock = std::chrono::steady_clock;
  const Shape& s = preset.shape;
  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Result res;

  // Tokenizer first: tiny's vocabulary size depends on it.
  BpeTrainerOptions topt;
  topt.vocab_size = kBpeVocabTarget;
  const BpeModel bpe = train_bpe(builtin_bpe_corpus(), topt);
  const auto& specials = qwen_special_tokens();
  Vocab v;
  v.bpe_tokens = bpe.tokens.size();
  v.special_base = s.vocab_size ? s.special_base : static_cast<int64_t>(bpe.tokens.size());
  v.vocab_size = s.vocab_size ? s.vocab_size : v.special_base + static_cast<int64_t>(specials.size());
  if (v.special_base < static_cast<int64_t>(v.bpe_tokens) ||
      v.special_base + static_cast<int64_t>(specials.size()) > v.vocab_size)
    fail("preset ", preset.name, ": special tokens at ", v.special_base, " do not fit between the ", v.bpe_tokens,
         " BPE tokens and vocab_size ", v.vocab_size);
  res.bpe_tokens = v.bpe_tokens;
  res.special_base = v.special_base;

  const std::string config_text = config_json(s, v, opts.quant);
  res.config = parse_model_config(config_text, preset.name + " config.json");  // the loader's own checks
  if (!opts.config_only && opts.routing_skew > 0)
    res.skew_log_spread = opts.routing_skew * skew_log_spread(res.config.num_experts, res.config.num_experts_per_tok);
  const std::vector<PlannedTensor> plan = opts.config_only ? std::vector<PlannedTensor>{}
                                                           : plan_tensors(res.config, opts.quant, v, res.skew_log_spread, opts.seed);
  std::vector<TensorSpec> specs;
  specs.reserve(plan.size());
  for (const auto& t : plan) specs.push_back(t.spec);
  std::unique_ptr<SafetensorsStreamWriter> writer;
  if (!plan.empty()) {
    writer = std::make_unique<SafetensorsStreamWriter>(opts.out_dir, std::move(specs), opts.max_shard_bytes);
    res.num_tensors = plan.size();
    res.tensor_bytes = writer->tensor_bytes();
    for (const auto& sh : writer->shards()) res.shards.push_back({sh.file, sh.tensors.size(), sh.data_start + sh.data_bytes});
  }
  if (opts.dry_run) return res;

  const fs::path dir(opts.out_dir);
  if (fs::exists(dir) && !fs::is_directory(dir)) fail(opts.out_dir, ": exists and is not a folder");
  if (holds_model(dir) && !opts.force)
    fail(opts.out_dir, ": already holds a model (config.json or *.safetensors); pass --force to overwrite it");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(opts.out_dir, ": cannot create the folder (", ec.message(), ")");
  remove_weights(dir);  // stale shards of an earlier run would be read as part of this model

  std::vector<AddedToken> added;
  for (size_t i = 0; i < specials.size(); ++i)
    added.push_back({v.special_base + static_cast<int64_t>(i), specials[i].first, specials[i].second});
  WrittenFiles written;
  written.write(dir / "config.json", config_text);
  written.write(dir / "generation_config.json", generation_config_json(v));
  written.write(dir / "tokenizer.json", hf_tokenizer_json(bpe, added, v.special_base) + "\n");
  written.write(dir / "tokenizer_config.json", tokenizer_config_json(v, s.max_position_embeddings));
  if (!writer) {
    written.keep();
    return res;
  }

  const auto t0 = clock::now();
  write_weights(plan, *writer, opts.seed, threads, opts.work_unit_bytes, opts.log);
  for (const auto& f : writer->written_files()) written.add(f);
  res.write_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  res.gb_per_s = writer->file_bytes() / 1e9 / std::max(res.write_seconds, 1e-9);
  res.weights_written = true;
  writer.reset();

  ojson report = {{"preset", preset.name},
                  {"quant", std::string(quant_name(opts.quant))},
                  {"seed", opts.seed},
                  {"routing_skew", opts.routing_skew},
                  {"threads", threads},
                  {"tokenizer", {{"bpe_tokens", v.bpe_tokens}, {"special_base", v.special_base}, {"vocab_size", v.vocab_size}}},
                  {"num_tensors", res.num_tensors},
                  {"tensor_bytes", res.tensor_bytes},
                  {"files", ojson::array()},
                  {"write_seconds", res.write_seconds},
                  {"write_gb_per_s", res.gb_per_s}};
  for (const auto& sh : res.shards) report["files"].push_back({{"name", sh.file}, {"tensors", sh.tensors}, {"bytes", sh.bytes}});
  if (opts.report_samples > 0) {
    const Checkpoint ck = Checkpoint::open(opts.out_dir);
    const int64_t E = res.config.num_experts, H = res.config.hidden_size;
    auto read = [&](const std::string& name, std::vector<float>& out) {
      const TensorRef& t = ck.get(name);
      out.resize(static_cast<size_t>(t.info->numel()));
      for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_f32(t.data, t.dtype(), static_cast<int64_t>(i));
    };
    res.routing = measure_routing(
        res.config,
        [&](int l, std::vector<float>& router, std::vector<float>& norm) {
          const std::string p = "model.language_model.layers." + std::to_string(l) + ".";
          read(p + "mlp.gate.weight", router);
          read(p + "post_attention_layernorm.weight", norm);
          if (static_cast<int64_t>(router.size()) != E * H) fail("internal: router of layer ", l, " has the wrong size");
        },
        opts.report_samples, opts.seed, threads);
    ojson layers = ojson::array();
    for (const auto& r : res.routing.layers) layers.push_back(shares_json(r));
    report["routing"] = {{"method", "softmax top-k of random post-norm hidden states through each router"},
                         {"samples_per_layer", res.routing.samples},
                         {"experts", res.config.num_experts},
                         {"top_k", res.config.num_experts_per_tok},
                         {"log_spread", res.skew_log_spread},
                         {"target_top20_at_skew_1", kTargetTop20Share},
                         {"mean", shares_json(res.routing.mean)},
                         {"min", shares_json(res.routing.min)},
                         {"max", shares_json(res.routing.max)},
                         {"layers", layers}};
  }
  written.write(dir / "synth_report.json", report.dump(2) + "\n");
  written.keep();
  return res;
}

}  // namespace tandem::synth

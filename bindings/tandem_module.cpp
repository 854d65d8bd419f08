// bindings/tandem_module.cpp: the `tandem._tandem` extension module. The public Python API is
// bindings/tandem/__init__.py (Engine, synth, profile, Error), a thin layer over these classes.
//
// Threading: every compute call releases the GIL; callbacks into Python (streamed text) re-acquire
// it. One Engine serves one call at a time (a mutex); two Engines run in parallel from two threads.
// Errors are tandem::Error -> tandem.Error (a RuntimeError) with the same text as the CLI.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "gpu_core/device.cuh"
#include "placement/heat.h"
#include "runtime/engine/session.h"
#include "placement/planner.h"
#include "core/bytes.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/models/qwen3_5_moe/cpu_backend.h"
#include "core/error.h"
#include "core/limits.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/reply_parser.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "runtime/engine/routing_profile.h"
#include "runtime/engine/runner.h"
#include "runtime/engine/sampling.h"
#include "tools/synth/synth.h"
#include "runtime/tokenizer/tokenizer.h"

namespace py = pybind11;

namespace tandem::python {

namespace {

uint64_t bytes_of(const py::object& v, const char* what) {
  if (v.is_none()) return 0;
  if (py::isinstance<py::int_>(v)) {
    const long long b = v.cast<long long>();
    if (b <= 0) fail(what, ": must be positive (got ", b, ")");
    return static_cast<uint64_t>(b);
  }
  return parse_bytes(py::str(v).cast<std::string>(), what);
}

// A placement config from None, a YAML path, or a dict with the YAML schema (passed as JSON text).
placement::PlacementConfig config_of(const py::object& config) {
  if (config.is_none()) return placement::default_placement_config();
  if (py::isinstance<py::dict>(config)) {
    const std::string text = py::module_::import("json").attr("dumps")(config).cast<std::string>();
    return placement::parse_placement_config(text, "<config dict>");
  }
  return placement::load_placement_config(py::str(config).cast<std::string>());
}

SamplingParams sampling_of(const GenerationDefaults& defaults, const py::dict& kw) {
  SamplingParams p = defaults.sampling;
  if (kw.contains("preset") && !kw["preset"].is_none()) p = sampling_preset(kw["preset"].cast<std::string>());
  auto num = [&](const char* k, auto& field) {
    if (kw.contains(k) && !kw[k].is_none()) field = kw[k].cast<std::decay_t<decltype(field)>>();
  };
  num("temperature", p.temperature);
  num("top_k", p.top_k);
  num("top_p", p.top_p);
  num("min_p", p.min_p);
  num("presence_penalty", p.presence_penalty);
  num("frequency_penalty", p.frequency_penalty);
  num("repetition_penalty", p.repetition_penalty);
  if (kw.contains("seed") && !kw["seed"].is_none()) {
    p.seed = kw["seed"].cast<uint64_t>();
    p.seeded = true;
  }
  for (auto item : kw) {
    static const char* known[] = {"preset", "temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty", "seed"};
    const std::string k = py::str(item.first);
    if (std::find(std::begin(known), std::end(known), k) == std::end(known))
      fail("unknown sampling parameter '", k, "' (known: temperature, top_k, top_p, min_p, presence_penalty, frequency_penalty, ",
           "repetition_penalty, seed, preset)");
  }
  p.validate();
  return p;
}

class Engine {
 public:
  Engine(const std::string& model_dir, const py::object& config, const std::string& device, const py::object& gpu_mem,
         const py::object& threads, const py::object& context, bool eager, const py::object& batch, const py::object& draft,
         const py::object& experts_format, const py::object& quant_cache, const py::object& kv_format)
      : dir_(model_dir), pcfg_(config_of(config)) {
    RunnerOptions& o = ro_;
    o.device = requested_device(device, !config.is_none(), "device", "config");
    o.gpu_mem = bytes_of(gpu_mem, "gpu_mem");
    if (!threads.is_none()) {
      o.threads = threads.cast<int>();
      if (o.threads < 1) fail("threads must be at least 1 (got ", o.threads, ")");
    }
    if (!context.is_none()) {
      o.context = context.cast<int64_t>();
      o.context_set = true;
      if (o.context < 1) fail("context must be at least 1 (got ", o.context, ")");
    }
    o.eager = eager;
    if (!batch.is_none()) {
      o.batch = batch.cast<int>();
      if (o.batch < 1 || o.batch > kMaxBatch) fail("batch must be between 1 and ", kMaxBatch, " (got ", o.batch, ")");
    }
    if (!draft.is_none()) {
      o.draft_set = true;
      if (py::isinstance<py::str>(draft)) {
        if (draft.cast<std::string>() != "auto") fail("draft must be \"auto\" or a count between 0 (off) and ", kMaxDraft, " (got '", draft.cast<std::string>(), "')");
        o.draft = kDraftAuto;
      } else {
        o.draft = draft.cast<int>();
        if (o.draft < 0 || o.draft > kMaxDraft) fail("draft must be \"auto\" or between 0 (off) and ", kMaxDraft, " (got ", o.draft, ")");
      }
    }
    if (!experts_format.is_none()) {
      o.experts_format = experts_format.cast<std::string>();
      check_experts_format(o.experts_format, "experts_format");
    }
    if (!quant_cache.is_none()) o.quant_cache = quant_cache.cast<std::string>();
    if (!kv_format.is_none()) {
      o.kv_format = kv_format.cast<std::string>();
      parse_row_format(o.kv_format, "kv_format");
    }
    py::gil_scoped_release nogil;
    s_ = Session::open(dir_, false);  // the CLI's opener: logits need no tokenizer
    s_.start(o, &pcfg_);
  }

  void close() {
    std::lock_guard lock(mu_);
    py::gil_scoped_release nogil;
    s_.runner.reset();
    s_.tokenizer.reset();
    s_.model.reset();
  }
  bool closed() const { return !s_.runner; }

  // Text of a prompt (plain or a rendered chat) -> reply; on_text (optional) gets each streamed piece.
  py::dict generate(const std::string& text, int64_t max_new_tokens, const py::dict& sampling, const std::vector<std::string>& stop,
                    const py::object& on_text) {
    check_text();
    GenerateRequest req = request(sampling, max_new_tokens, stop);
    std::unique_ptr<py::error_already_set> callback_error;
    if (!on_text.is_none())
      req.on_text = [&](std::string_view piece) {
        if (callback_error) return;
        py::gil_scoped_acquire gil;
        try {
          on_text(py::bytes(piece.data(), piece.size()));
        } catch (py::error_already_set& e) {
          callback_error = std::make_unique<py::error_already_set>(std::move(e));
          cancel_.store(true);
        }
      };
    GenerateResult r;
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      set_threads();
      cancel_.store(false);
      encode_prompt(req, text, "the prompt");
      r = generate_impl(req);
    }
    if (callback_error) throw std::move(*callback_error);
    return result_dict(r);
  }

  // Several prompts at once (generate_batch): sampling[i] for prompt i; every request as generate()
  // would run it alone, the sequences decoded together in the runner's slots.
  py::list generate_batch(const std::vector<std::string>& texts, int64_t max_new_tokens, const std::vector<py::dict>& sampling,
                          const std::vector<std::string>& stop) {
    check_text();
    if (texts.empty()) fail("prompts: give at least one prompt");
    if (sampling.size() != texts.size()) fail("internal: one sampling dict per prompt");
    std::vector<GenerateRequest> reqs;
    for (size_t i = 0; i < texts.size(); ++i) reqs.push_back(request(sampling[i], max_new_tokens, stop));
    std::vector<GenerateResult> rs;
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      set_threads();
      cancel_.store(false);
      for (size_t i = 0; i < texts.size(); ++i) encode_prompt(reqs[i], texts[i], str_cat("prompt ", i).c_str());
      rs = tandem::generate_batch(*s_.runner, s_.model->config().vocab_size, *s_.tokenizer, reqs);
      if (!rs.empty()) last_ = rs.back();
    }
    py::list out;
    for (const GenerateResult& r : rs) out.append(result_dict(r));
    return out;
  }

  // Each sequence's ids fed in one step (its logits of every position, as logits(ids) with every id in
  // the prefill), the sequences together, slots() of them at a time.
  py::list logits_batch(const std::vector<std::vector<int32_t>>& seqs) {
    check_open();
    const int64_t V = s_.model->config().vocab_size;
    if (seqs.empty()) fail("sequences: give at least one sequence of ids");
    std::vector<py::array_t<float>> arrays;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].empty()) fail("sequence ", i, ": give at least one token id");
      check_token_ids(seqs[i], V, dir_, str_cat("sequence ", i).c_str());
      check_context(*s_.runner, static_cast<int64_t>(seqs[i].size()));
      arrays.emplace_back(std::vector<py::ssize_t>{static_cast<py::ssize_t>(seqs[i].size()), static_cast<py::ssize_t>(V)});
    }
    std::vector<float*> dst;
    for (auto& a : arrays) dst.push_back(a.mutable_data());
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      set_threads();
      Runner& r = *s_.runner;
      const size_t slots = static_cast<size_t>(r.slots());
      for (size_t first = 0; first < seqs.size(); first += slots) {
        std::vector<Runner::Feed> feeds;
        for (size_t i = first; i < std::min(seqs.size(), first + slots); ++i) {
          const int slot = static_cast<int>(i - first);
          r.reset_slot(slot);
          feeds.push_back({slot, seqs[i], dst[i], Qwen35Moe::LogitRows::All, false});
        }
        r.step(feeds);
      }
    }
    py::list out;
    for (auto& a : arrays) out.append(a);
    return out;
  }

  void cancel() { cancel_.store(true); }

  // messages, tools: JSON text of OpenAI-shaped messages and tool definitions (the Python layer writes it
  // with json.dumps), read by the same converters an OpenAI-compatible server uses.
  std::string render_chat_text(const std::string& messages_json, const std::string& tools_json, bool enable_thinking,
                               bool add_generation_prompt, bool add_vision_id) const {
    const auto parse = [](const std::string& text, const char* what) {
      try {
        return nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        fail(what, " are not JSON (", e.what(), ")");
      }
    };
    ChatOptions co;
    co.add_generation_prompt = add_generation_prompt;
    co.enable_thinking = enable_thinking;
    co.add_vision_id = add_vision_id;
    co.tools = chat_tools_from_json(parse(tools_json, "tools"));
    return render_chat(chat_messages_from_json(parse(messages_json, "messages")), co);
  }

  // Same semantics as `tandem logits`: the first `prefill` ids in one call, the rest one at a time.
  py::array_t<float> logits(const std::vector<int32_t>& ids, const py::object& prefill_obj) {
    check_open();
    const int64_t n = static_cast<int64_t>(ids.size()), V = s_.model->config().vocab_size;
    if (n == 0) fail("ids: give at least one token id");
    const int64_t prefill = prefill_obj.is_none() ? n : prefill_obj.cast<int64_t>();
    if (prefill < 0 || prefill > n) fail("prefill ", prefill, " must be between 0 and the number of ids (", n, ")");
    check_token_ids(ids, V, dir_, "ids");
    check_context(*s_.runner, n);
    py::array_t<float> out({n, V});
    float* dst = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      set_threads();
      s_.runner->reset();
      if (prefill > 0) s_.runner->forward(std::span(ids.data(), prefill), dst, Qwen35Moe::LogitRows::All);
      for (int64_t i = prefill; i < n; ++i) s_.runner->forward(std::span(ids.data() + i, 1), dst + i * V, Qwen35Moe::LogitRows::All);
    }
    return out;
  }

  std::vector<int32_t> encode(const std::string& text) const {
    check_text();
    py::gil_scoped_release nogil;
    return s_.tokenizer->encode(text);
  }
  py::bytes decode(const std::vector<int32_t>& ids, bool skip_special) const {
    check_text();
    check_token_ids(ids, s_.model->config().vocab_size, dir_, "decode");
    return py::bytes(s_.tokenizer->decode(ids, skip_special));
  }

  std::string plan_json() {
    check_open();
    py::gil_scoped_release nogil;
    // The CPU bandwidth is measured on the first call (as tandem plan does) and reused after.
    placement::PlanRequest req = plan_request(pcfg_, ro_.gpu_mem, ro_.context_set ? ro_.context : 0, cpu_bw_ == 0);
    if (cpu_bw_ == 0) cpu_bw_ = req.measured_cpu_bw;
    req.measured_cpu_bw = cpu_bw_;
    return placement::plan_to_json(placement::make_plan(s_.model->config(), pcfg_, req)).dump();
  }

  py::dict stats() const {
    check_open();
    py::dict d;
    d["device"] = device_name(s_.options.device);
    d["device_choice"] = s_.device_line;  // device="auto" / "hybrid": what was chosen and why (the CLI's line)
    d["context"] = s_.runner->max_context();
    d["description"] = s_.runner->describe();
    d["model"] = dir_;
    d["vocab_size"] = s_.model->config().vocab_size;
    d["peak_device_bytes"] = s_.runner->peak_device_bytes();
    d["gpu_expert_share"] = s_.runner->gpu_expert_share();
    d["prompt_tokens"] = last_.prompt_tokens;
    d["generated_tokens"] = last_.tokens.size();
    d["prefill_tok_s"] = last_.prefill_tok_s();
    d["decode_tok_s"] = last_.decode_tok_s();
    d["stop"] = last_.tokens.empty() ? "" : stop_reason_name(last_.stop);
    if (const DraftTuner* t = s_.runner->draft_tuner()) {  // --draft auto: what it chose, from what it measured
      d["draft"] = "auto";
      d["draft_auto"] = t->summary();
    } else {
      d["draft"] = s_.runner->max_draft();
    }
    if (const DraftStats& ds = last_.drafts; ds.verify_steps > 0) {  // speculative decoding: the last generation's
      d["verify_steps"] = ds.verify_steps;
      d["tokens_per_step"] = ds.tokens_per_step();
      d["drafted"] = ds.drafted;
      d["accepted"] = ds.accepted;
      d["acceptance_by_position"] = ds.acceptance();
    }
    return d;
  }

 private:
  void check_open() const {
    if (!s_.runner) fail("this Engine is closed");
  }
  // OpenMP's thread count is per calling thread: the host ops of this call use the engine's count.
  void set_threads() const {
    if (s_.options.threads > 0) omp_set_num_threads(s_.options.threads);
  }
  void check_text() const {
    check_open();
    if (!s_.tokenizer) fail(dir_, " has no tokenizer.json: text in and out needs one (logits() works on ids)");
  }
  // A request with the model's defaults under `sampling`, its eos ids, the stop strings and this
  // engine's cancel flag (the prompt comes with encode_prompt, under the lock).
  GenerateRequest request(const py::dict& sampling, int64_t max_new_tokens, const std::vector<std::string>& stop) const {
    if (max_new_tokens < 1) fail("max_new_tokens must be at least 1 (got ", max_new_tokens, ")");
    GenerateRequest req;
    req.sampling = sampling_of(s_.defaults, sampling);
    req.max_new_tokens = max_new_tokens;
    req.eos_ids = s_.eos;
    req.stop = stop;
    req.cancel = &cancel_;
    req.draft = s_.runner->request_draft();
    return req;
  }
  void encode_prompt(GenerateRequest& req, const std::string& text, const char* what) const {
    req.prompt = s_.tokenizer->encode(text);
    if (req.prompt.empty()) fail(what, " is empty");
    check_context(*s_.runner, static_cast<int64_t>(req.prompt.size()), req.max_new_tokens, "max_new_tokens");  // as the CLI
  }
  static py::dict result_dict(const GenerateResult& r) {
    py::dict out;
    out["text"] = py::bytes(r.text);
    out["tokens"] = r.tokens;
    out["prompt_tokens"] = r.prompt_tokens;
    out["prefill_tok_s"] = r.prefill_tok_s();
    out["decode_tok_s"] = r.decode_tok_s();
    out["stop"] = stop_reason_name(r.stop);
    return out;
  }
  GenerateResult generate_impl(const GenerateRequest& req) {
    last_ = tandem::generate(*s_.runner, s_.model->config().vocab_size, *s_.tokenizer, req);
    return last_;
  }

  std::string dir_;
  placement::PlacementConfig pcfg_;
  RunnerOptions ro_;
  Session s_;
  std::mutex mu_;
  std::atomic<bool> cancel_{false};
  GenerateResult last_;
  double cpu_bw_ = 0;
};

py::dict synth_py(const std::string& preset, const std::string& out, const py::object& quant, uint64_t seed, double routing_skew,
                  int threads, bool config_only, bool force) {
  synth::Options o;
  const synth::Preset& p = synth::find_preset(preset);
  o.out_dir = out;
  o.quant = quant.is_none() ? p.default_quant : synth::parse_quant(quant.cast<std::string>());
  o.seed = seed;
  o.routing_skew = routing_skew;
  o.threads = threads;
  o.config_only = config_only;
  o.force = force;
  synth::Result r;
  {
    py::gil_scoped_release nogil;
    r = synth::synthesize(p, o);
  }
  py::dict d;
  d["out"] = out;
  d["tensors"] = r.num_tensors;
  d["tensor_bytes"] = r.tensor_bytes;
  d["weights_written"] = r.weights_written;
  d["write_seconds"] = r.write_seconds;
  d["gb_per_s"] = r.gb_per_s;
  d["routing_top20_share"] = r.routing.samples ? r.routing.mean.top20 : 0.0;
  return d;
}

py::dict profile_py(const std::string& model_dir, const std::vector<std::string>& prompts, const py::object& out,
                    const std::string& device, int64_t gen, int64_t max_tokens, bool chat, int threads) {
  ProfileOptions po;
  po.device = device, po.threads = threads, po.gen = gen, po.max_tokens = max_tokens, po.chat = chat;
  RoutingCounts counts;
  ModelConfig config;
  {
    py::gil_scoped_release nogil;
    auto model = Qwen35Moe::load(model_dir);
    counts = profile_prompts(*model, Tokenizer::from_model_dir(model_dir), prompts, po);
    config = model->config();
  }
  if (!out.is_none()) placement::save_heat_map(placement::heat_from_counts(counts, config, model_dir), py::str(out).cast<std::string>());
  py::dict d;
  d["tokens"] = counts.tokens;
  d["layers"] = config.num_layers;
  d["num_experts"] = config.num_experts;
  d["top_k"] = config.num_experts_per_tok;
  d["counts"] = counts.counts;
  d["top20_share"] = top20_share(counts);
  return d;
}

// The reply parser on a fixed text (reply_parser.h), in OpenAI's message shape.
py::dict parse_reply_py(const std::string& text, const std::string& tools_json, bool thinking) {
  const nlohmann::json tools = nlohmann::json::parse(tools_json, nullptr, false);
  if (tools.is_discarded() || !(tools.is_array() || tools.is_null())) fail("tools must be a list of tool definitions");
  const ParsedReply r = parse_reply(text, thinking, tools);
  py::dict out;
  out["reasoning_content"] = py::bytes(r.reasoning);
  out["content"] = py::bytes(r.content);
  py::list calls;
  for (const ParsedToolCall& c : r.tool_calls) {
    py::dict fn, call;
    fn["name"] = py::bytes(c.name);
    fn["arguments"] = py::bytes(c.arguments);
    call["id"] = c.id;
    call["type"] = "function";
    call["function"] = fn;
    calls.append(call);
  }
  out["tool_calls"] = calls;
  return out;
}

std::string plan_for_py(const std::string& model_dir, const py::object& config, const py::object& gpu_mem, const py::object& context) {
  const ModelConfig m = load_model_config(model_dir);
  const placement::PlacementConfig c = config_of(config);
  const int64_t ctx = context.is_none() ? 0 : context.cast<int64_t>();
  const uint64_t mem = bytes_of(gpu_mem, "gpu_mem");
  py::gil_scoped_release nogil;
  return placement::plan_to_json(placement::make_plan(m, c, plan_request(c, mem, ctx, true))).dump();
}

}  // namespace

}  // namespace tandem::python

PYBIND11_MODULE(_tandem, m) {
  using namespace tandem::python;
  m.doc() = "Tandem runtime (C++ core); use the `tandem` package API.";
  py::register_exception<tandem::Error>(m, "Error", PyExc_RuntimeError);
  py::class_<Engine>(m, "Engine")
      .def(py::init<const std::string&, const py::object&, const std::string&, const py::object&, const py::object&, const py::object&,
                    bool, const py::object&, const py::object&, const py::object&, const py::object&, const py::object&>(),
           py::arg("model_dir"), py::arg("config"), py::arg("device"), py::arg("gpu_mem"), py::arg("threads"), py::arg("context"),
           py::arg("eager"), py::arg("batch"), py::arg("draft"), py::arg("experts_format"), py::arg("quant_cache"), py::arg("kv_format"))
      .def("close", &Engine::close)
      .def_property_readonly("closed", &Engine::closed)
      .def("generate", &Engine::generate, py::arg("text"), py::arg("max_new_tokens"), py::arg("sampling"), py::arg("stop"),
           py::arg("on_text"))
      .def("cancel", &Engine::cancel)
      .def("render_chat", &Engine::render_chat_text, py::arg("messages_json"), py::arg("tools_json"), py::arg("enable_thinking"),
           py::arg("add_generation_prompt"), py::arg("add_vision_id"))
      .def("logits", &Engine::logits, py::arg("ids"), py::arg("prefill"))
      .def("logits_batch", &Engine::logits_batch, py::arg("sequences"))
      .def("generate_batch", &Engine::generate_batch, py::arg("texts"), py::arg("max_new_tokens"), py::arg("sampling"), py::arg("stop"))
      .def("encode", &Engine::encode, py::arg("text"))
      .def("decode", &Engine::decode, py::arg("ids"), py::arg("skip_special") = false)
      .def("plan_json", &Engine::plan_json)
      .def("stats", &Engine::stats);
  m.def("synth", &synth_py, py::arg("preset"), py::arg("out"), py::arg("quant"), py::arg("seed"), py::arg("routing_skew"),
        py::arg("threads"), py::arg("config_only"), py::arg("force"));
  m.def("profile", &profile_py, py::arg("model_dir"), py::arg("prompts"), py::arg("out"), py::arg("device"), py::arg("gen"),
        py::arg("max_tokens"), py::arg("chat"), py::arg("threads"));
  m.def("parse_reply", &parse_reply_py, py::arg("text"), py::arg("tools_json"), py::arg("thinking"));
  m.def("plan", &plan_for_py, py::arg("model_dir"), py::arg("config"), py::arg("gpu_mem"), py::arg("context"));
}

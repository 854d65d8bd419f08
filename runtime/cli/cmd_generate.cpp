// tandem generate / tandem chat: text in, streamed text out, with a stats line on stderr.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <iostream>

#include "runtime/tokenizer/chat_template.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/device_flags.h"
#include "runtime/cli/output.h"
#include "core/error.h"
#include "runtime/engine/generate.h"

namespace tandem::cli {

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_generating{false};
std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
  if (g_generating.load()) g_cancel.store(true);
  else g_interrupted.store(true);
}

std::vector<Flag> sampling_flags() {
  return {
      {"preset", true, "sampling preset: thinking | thinking-coding | instruct | instruct-reasoning"},
      {"temperature", true, "0 = greedy (deterministic)"},
      {"top-k", true, "keep the k most likely tokens (0 = off)"},
      {"top-p", true, "nucleus: smallest set reaching this mass (1 = off)"},
      {"min-p", true, "drop tokens below min-p x the best probability"},
      {"presence-penalty", true, "subtract for every token already generated"},
      {"frequency-penalty", true, "subtract per occurrence in the output"},
      {"repetition-penalty", true, "HF repetition penalty over prompt + output (1 = off)"},
      {"seed", true, "RNG seed for reproducible sampling"},
      {"stop", true, "stop when this text appears (repeatable)"},
      {"max-new-tokens", true, "upper bound on generated tokens (default 512)"},
  };
}

// generation_config.json < --preset < individual flags.
SamplingParams sampling_from_args(const Args& a, const GenerationDefaults& defaults) {
  SamplingParams p = defaults.sampling;
  try {
    if (a.has("preset")) p = sampling_preset(a.get("preset"));
  } catch (const Error& e) {
    throw UsageError(str_cat("tandem: --preset: ", e.what()));
  }
  p.temperature = static_cast<float>(a.get_double("temperature", p.temperature));
  p.top_k = a.get_int<int>("top-k", p.top_k, INT_MIN, INT_MAX);  // validate() then says what it must be
  p.top_p = static_cast<float>(a.get_double("top-p", p.top_p));
  p.min_p = static_cast<float>(a.get_double("min-p", p.min_p));
  p.presence_penalty = static_cast<float>(a.get_double("presence-penalty", p.presence_penalty));
  p.frequency_penalty = static_cast<float>(a.get_double("frequency-penalty", p.frequency_penalty));
  p.repetition_penalty = static_cast<float>(a.get_double("repetition-penalty", p.repetition_penalty));
  if (a.has("seed")) {
    p.seed = static_cast<uint64_t>(a.get_int("seed", 0));
    p.seeded = true;
  }
  try {
    p.validate();
  } catch (const Error& e) {
    throw UsageError(str_cat("tandem: sampling: ", e.what()));
  }
  return p;
}

// A session and the sampling its flags ask for.
struct Opened {
  Session s;
  SamplingParams sampling;
};

// The sampling flags are checked before the runner is made: a usage error is one line, before the
// device's (--device auto prints what it chose).
Opened open_for_text(const Args& a) {
  RunnerOptions ro = runner_options(a);
  Opened o{Session::open(a.get("model"), true), {}};
  o.sampling = sampling_from_args(a, o.s.defaults);
  start_session(o.s, ro);
  return o;
}

void print_stats(const GenerateResult& r, const Runner& runner) {
  std::string drafts = r.drafts.summary();
  if (const DraftTuner* t = runner.draft_tuner(); t && !drafts.empty()) drafts += "; " + t->summary();
  std::fprintf(stderr, "\n[prompt %lld tokens, prefill %.1f tok/s | generated %zu tokens, decode %.1f tok/s | stop: %s%s%s]\n",
               (long long)r.prompt_tokens, r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(), stop_reason_name(r.stop),
               drafts.empty() ? "" : " | ", drafts.c_str());
}

GenerateResult run(Session& s, const Args& a, std::vector<int32_t> prompt, const SamplingParams& sp) {
  GenerateRequest req;
  req.prompt = std::move(prompt);
  req.max_new_tokens = a.get_int("max-new-tokens", 512);
  if (req.max_new_tokens < 1) throw UsageError("tandem: --max-new-tokens must be at least 1");
  req.sampling = sp;
  req.draft = s.runner->request_draft();
  req.eos_ids = s.eos;
  req.stop = a.get_all("stop");
  req.cancel = &g_cancel;
  req.on_text = [](std::string_view t) { write_stdout(t); };  // a failed write stops the generation
  check_context(*s.runner, static_cast<int64_t>(req.prompt.size()), req.max_new_tokens, "--max-new-tokens");
  g_cancel = false;
  g_generating = true;
  GenerateResult r = generate(*s.runner, s.model->config().vocab_size, *s.tokenizer, req);
  g_generating = false;
  return r;
}

void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt returns so the REPL can redraw it
  sigaction(SIGINT, &sa, nullptr);
}

std::vector<Flag> with_common(std::vector<Flag> own) {
  own.push_back({"model", true, "model folder (config.json, safetensors, tokenizer.json)"});
  for (auto& f : device_flags()) own.push_back(f);
  for (auto& f : sampling_flags()) own.push_back(f);
  own.push_back({"help", false, "show this help"});
  return own;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  Args a("generate", with_common({
                         {"prompt", true, "the prompt text"},
                         {"chat", false, "wrap the prompt as a user turn of the chat template"},
                         {"no-think", false, "with --chat: thinking off"},
                         {"system", true, "with --chat: a system message"},
                     }));
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  const std::string prompt = a.get("prompt");
  if (!a.has("chat") && (a.has("no-think") || a.has("system")))
    throw UsageError("tandem generate: --no-think and --system need --chat");
  Opened o = open_for_text(a);
  Session& s = o.s;
  const SamplingParams& sp = o.sampling;
  std::string text = prompt;
  if (a.has("chat")) {
    if (const std::string note = chat_template_note(a.get("model")); !note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    std::vector<ChatMessage> msgs;
    if (a.has("system")) msgs.push_back({"system", a.get("system"), {}, {}});
    msgs.push_back({"user", prompt, {}, {}});
    ChatOptions o;
    o.enable_thinking = !a.has("no-think");
    text = render_chat(msgs, o);
  }
  install_sigint();
  const GenerateResult r = run(s, a, s.tokenizer->encode(text), sp);
  print_stats(r, *s.runner);
  return r.stop == StopReason::Cancelled ? 130 : 0;  // 128 + SIGINT: a script can tell a cut-short reply
}

int cmd_chat(int argc, char** argv) {
  Args a("chat", with_common({
                     {"no-think", false, "thinking off"},
                     {"system", true, "a system message"},
                 }));
  a.parse(argc, argv, 2);
  if (a.has("help")) {
    std::fputs(a.usage().c_str(), stdout);
    return 0;
  }
  Opened o = open_for_text(a);
  Session& s = o.s;
  if (const std::string note = chat_template_note(a.get("model")); !note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
  const SamplingParams& sp = o.sampling;
  ChatOptions opts;
  opts.enable_thinking = !a.has("no-think");
  std::vector<ChatMessage> history;
  if (a.has("system")) history.push_back({"system", a.get("system"), {}, {}});
  const bool tty = isatty(STDIN_FILENO);
  install_sigint();
  std::fprintf(stderr, "tandem chat: Ctrl-D exits, Ctrl-C stops an answer, /reset clears the conversation, /think on|off\n");
  while (true) {
    if (tty) std::fputs("\n> ", stdout), std::fflush(stdout);
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted.load()) {  // Ctrl-C at the prompt: a fresh prompt, not an exit
        std::cin.clear();
        std::fputs("\n(Ctrl-D exits)", stdout);
        continue;
      }
      break;  // Ctrl-D / end of input
    }
    if (line.empty()) continue;
    if (line == "/reset") {
      history.erase(std::remove_if(history.begin(), history.end(), [](const ChatMessage& m) { return m.role != "system"; }),
                    history.end());
      std::fputs("(conversation cleared)\n", stdout);
      continue;
    }
    if (line == "/think on" || line == "/think off") {
      opts.enable_thinking = line == "/think on";
      continue;
    }
    history.push_back({"user", line, {}, {}});
    const std::vector<int32_t> ids = s.tokenizer->encode(render_chat(history, opts));
    GenerateResult r;
    try {
      r = run(s, a, ids, sp);
    } catch (const OutputError&) {
      throw;
    } catch (const Error& e) {  // e.g. a turn past the context: say so and keep the conversation
      history.pop_back();
      std::fprintf(stderr, "tandem: error: %s (the turn was dropped; /reset clears the conversation)\n", e.what());
      continue;
    }
    // The reply joins the conversation even when cut short by Ctrl-C.
    history.push_back({"assistant", (opts.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n") + r.text, {}, {}});
    print_stats(r, *s.runner);
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace tandem::cli

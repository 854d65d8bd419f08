// runtime/tokenizer/load.cpp: tokenizer.json -> Tokenizer::Impl, validating every part we rely on.
//
// Errors name the file and the JSON key ("model.merges[12]", "added_tokens[3].id"), say what was
// expected and what was found. Anything we do not implement exactly is rejected rather than
// approximated: a silently different tokenization is worse than a clear error.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "runtime/tokenizer/impl.h"
#include "runtime/tokenizer/unicode.h"

namespace tandem {

namespace {

using nlohmann::json;

struct Ctx {
  const std::string& source;

  template <typename... Args>
  [[noreturn]] void error(const std::string& key, const Args&... args) const {
    fail(source, ": ", key, ": ", args...);
  }

  std::string type_of(const json& j, const std::string& key) const {
    if (!j.is_object()) error(key, "expected an object, found ", j.type_name());
    const auto it = j.find("type");
    if (it == j.end() || !it->is_string()) error(key + ".type", "missing or not a string");
    return it->get<std::string>();
  }

  bool get_bool(const json& obj, const char* name, bool fallback, const std::string& key) const {
    const auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) error(key + "." + name, "expected true or false, found ", it->dump());
    return it->get<bool>();
  }
};

std::string shorten(const std::string& s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; }

bool parse_normalizer(const Ctx& c, const json& root) {
  const auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return false;
  const std::string type = c.type_of(*it, "normalizer");
  if (type == "NFC") return true;
  if (type != "Sequence") {
    c.error("normalizer.type", "'", type, "' is not supported (expected NFC, a Sequence of NFC, or null)");
  }
  const auto list = it->find("normalizers");
  if (list == it->end() || !list->is_array()) c.error("normalizer.normalizers", "missing or not an array");
  bool nfc = false;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string key = "normalizer.normalizers[" + std::to_string(i) + "]";
    const std::string t = c.type_of((*list)[i], key);
    if (t != "NFC") c.error(key + ".type", "'", t, "' is not supported (only NFC)");
    nfc = true;  // NFC is idempotent: one or several are the same
  }
  return nfc;
}

void parse_byte_level(const Ctx& c, const json& j, const std::string& key, PreTokenizerSpec& spec) {
  spec.add_prefix_space = c.get_bool(j, "add_prefix_space", true, key);
  spec.byte_level_regex = c.get_bool(j, "use_regex", true, key);
}

PreTokenizerSpec parse_pre_tokenizer(const Ctx& c, const json& root) {
  const auto it = root.find("pre_tokenizer");
  if (it == root.end() || it->is_null()) {
    c.error("pre_tokenizer", "missing; a byte-level BPE needs a ByteLevel pre-tokenizer");
  }
  PreTokenizerSpec spec;
  const std::string type = c.type_of(*it, "pre_tokenizer");
  if (type == "ByteLevel") {
    parse_byte_level(c, *it, "pre_tokenizer", spec);
    return spec;
  }
  if (type != "Sequence") {
    c.error("pre_tokenizer.type", "'", type, "' is not supported (expected ByteLevel or Sequence[Split, ByteLevel])");
  }
  const auto list = it->find("pretokenizers");
  if (list == it->end() || !list->is_array()) c.error("pre_tokenizer.pretokenizers", "missing or not an array");
  const json& steps = *list;
  const std::string kSteps = "pre_tokenizer.pretokenizers";
  if (steps.size() != 2) {
    c.error(kSteps, "expected exactly [Split, ByteLevel], found ", steps.size(), " entries");
  }
  const std::string t0 = c.type_of(steps[0], kSteps + "[0]");
  const std::string t1 = c.type_of(steps[1], kSteps + "[1]");
  if (t0 != "Split") c.error(kSteps + "[0].type", "'", t0, "' is not supported (expected Split)");
  if (t1 != "ByteLevel") c.error(kSteps + "[1].type", "'", t1, "' is not supported (expected ByteLevel)");

  const json& split = steps[0];
  const std::string skey = kSteps + "[0]";
  const auto pattern = split.find("pattern");
  if (pattern == split.end() || !pattern->is_object()) c.error(skey + ".pattern", "missing or not an object");
  const auto regex = pattern->find("Regex");
  if (regex == pattern->end() || !regex->is_string()) {
    c.error(skey + ".pattern", "expected {\"Regex\": ...}, found ", shorten(pattern->dump()));
  }
  const std::string re = regex->get<std::string>();
  spec.split = tok::split_regex_from_pattern(re);
  if (!spec.split) {
    c.error(skey + ".pattern.Regex", "unsupported regex '", shorten(re),
            "' (implemented: the Qwen3.5, Qwen2 and GPT-2 pre-tokenizer regexes)");
  }
  const auto behavior = split.find("behavior");
  if (behavior == split.end() || *behavior != "Isolated") {
    c.error(skey + ".behavior", "expected \"Isolated\", found ", behavior == split.end() ? "nothing" : behavior->dump());
  }
  if (c.get_bool(split, "invert", false, skey)) c.error(skey + ".invert", "invert=true is not supported");
  parse_byte_level(c, steps[1], kSteps + "[1]", spec);
  if (spec.byte_level_regex) {
    // Harmless to support, but no shipped tokenizer splits twice; refuse rather than guess.
    c.error(kSteps + "[1].use_regex", "expected false after a Split");
  }
  return spec;
}

void check_decoder(const Ctx& c, const json& root) {
  const auto it = root.find("decoder");
  if (it == root.end() || it->is_null()) c.error("decoder", "missing; expected ByteLevel");
  const std::string type = c.type_of(*it, "decoder");
  if (type != "ByteLevel") c.error("decoder.type", "'", type, "' is not supported (expected ByteLevel)");
}

// Model vocab + merges into impl.bpe and the id tables.
struct Vocab {
  std::vector<std::string> tokens;  // by id; "" = hole
  std::vector<uint8_t> present;
  size_t count = 0;
};

void parse_model(const Ctx& c, const json& root, Tokenizer::Impl& impl, Vocab& vocab) {
  const auto it = root.find("model");
  if (it == root.end() || it->is_null()) c.error("model", "missing");
  const json& m = *it;
  if (!m.is_object()) c.error("model", "expected an object, found ", m.type_name());
  const auto type = m.find("type");
  if (type != m.end()) {
    if (!type->is_string()) c.error("model.type", "expected a string, found ", type->dump());
    if (*type != "BPE") c.error("model.type", "'", type->get<std::string>(), "' is not supported (only BPE)");
  } else if (!m.contains("merges")) {
    c.error("model.type", "missing (and no merges: not a BPE model)");
  }
  const auto dropout = m.find("dropout");
  if (dropout != m.end() && !dropout->is_null()) c.error("model.dropout", "must be null (dropout is for training)");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto a = m.find(affix);
    if (a != m.end() && !a->is_null() && !(a->is_string() && a->get<std::string>().empty())) {
      c.error(std::string("model.") + affix, "must be null or empty for byte-level BPE, found ", a->dump());
    }
  }
  if (c.get_bool(m, "byte_fallback", false, "model")) c.error("model.byte_fallback", "true is not supported");
  impl.bpe.ignore_merges = c.get_bool(m, "ignore_merges", false, "model");
  impl.bpe.fuse_unk = c.get_bool(m, "fuse_unk", false, "model");

  // vocab
  const auto v = m.find("vocab");
  if (v == m.end() || !v->is_object()) c.error("model.vocab", "missing or not an object");
  // Ids index flat tables, so the id space is bounded (real vocabularies are dense and below 1M).
  constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;
  for (const auto& [token, idj] : v->items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() > kMaxId) {
      c.error("model.vocab[\"" + shorten(token) + "\"]", "expected an id in [0, 2^24), found ", idj.dump());
    }
    const auto id = static_cast<size_t>(idj.get<int64_t>());
    if (id >= vocab.tokens.size()) {
      vocab.tokens.resize(std::min<size_t>(std::max(id + 1, vocab.tokens.size() * 2), kMaxId + 1));
      vocab.present.resize(vocab.tokens.size());
    }
    if (vocab.present[id]) {
      c.error("model.vocab", "tokens '", shorten(vocab.tokens[id]), "' and '", shorten(token), "' share id ", id);
    }
    vocab.present[id] = 1;
    vocab.tokens[id] = token;
    ++vocab.count;
  }
  impl.token_ids = {};
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    if (vocab.present[id]) impl.token_ids.insert(vocab.tokens[id], static_cast<int32_t>(id));
  }

  // The ByteLevel alphabet and, for ignore_merges, whole tokens as raw bytes.
  const auto& bl = tok::ByteLevelMap::get();
  for (int b = 0; b < 256; ++b) impl.bpe.byte_ids[b] = impl.token_ids.find(bl.byte_to_utf8[b]);

  const auto unk = m.find("unk_token");
  if (unk != m.end() && !unk->is_null()) {
    if (!unk->is_string()) c.error("model.unk_token", "expected a string or null, found ", unk->dump());
    impl.bpe.unk_id = impl.token_ids.find(unk->get<std::string>());
    if (impl.bpe.unk_id < 0) c.error("model.unk_token", "'", unk->get<std::string>(), "' is not in model.vocab");
  }

  // merges: "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20)
  const auto mj = m.find("merges");
  if (mj == m.end() || !mj->is_array()) c.error("model.merges", "missing or not an array");
  impl.bpe.merges.reserve(mj->size());
  std::string merged;
  for (size_t rank = 0; rank < mj->size(); ++rank) {
    const json& e = (*mj)[rank];
    const std::string key = "model.merges[" + std::to_string(rank) + "]";
    std::string_view left, right;
    std::string joined;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        c.error(key, "expected \"left right\" (two tokens, one space), found ", e.dump());
      }
      left = std::string_view(s).substr(0, sp);
      right = std::string_view(s).substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get_ref<const std::string&>();
      right = e[1].get_ref<const std::string&>();
    } else {
      c.error(key, "expected \"left right\" or [\"left\", \"right\"], found ", shorten(e.dump()));
    }
    const int32_t a = impl.token_ids.find(left), b = impl.token_ids.find(right);
    if (a < 0) c.error(key, "'", shorten(std::string(left)), "' is not in model.vocab");
    if (b < 0) c.error(key, "'", shorten(std::string(right)), "' is not in model.vocab");
    merged.assign(left);
    merged.append(right);
    const int32_t ab = impl.token_ids.find(merged);
    if (ab < 0) c.error(key, "the merged token '", shorten(merged), "' is not in model.vocab");
    impl.bpe.merges.insert(a, b, static_cast<int32_t>(rank), ab);
  }
  impl.num_merges = mj->size();
}

// The bytes of a vocab string under the ByteLevel table; false when a character is outside it.
bool byte_level_bytes(std::string_view token, std::string& out) {
  const auto& bl = tok::ByteLevelMap::get();
  out.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    size_t len;
    const char32_t cp = tok::decode_utf8(s + i, len);
    if (cp >= 324 || bl.cp_to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(bl.cp_to_byte[cp]));
    i += len;
  }
  return true;
}

void parse_added_tokens(const Ctx& c, const json& root, Tokenizer::Impl& impl, Vocab& vocab) {
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return;
  if (!it->is_array()) c.error("added_tokens", "expected an array, found ", it->type_name());
  // HF ignores the ids in the file and assigns them again: a token found in the vocab keeps its id,
  // a new one takes the next id after the vocab (and after earlier added tokens). We check that this
  // agrees with the file instead of silently using different ids.
  const auto vocab_len = static_cast<int64_t>(vocab.count);
  int64_t max_added = -1;
  tok::StringIdMap seen;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object()) c.error(key, "expected an object, found ", e.type_name());
    const auto content = e.find("content");
    if (content == e.end() || !content->is_string()) c.error(key + ".content", "missing or not a string");
    const auto idj = e.find("id");
    if (idj == e.end() || !idj->is_number_integer()) c.error(key + ".id", "missing or not an integer");
    tok::AddedToken t;
    t.content = content->get<std::string>();
    if (!tok::is_valid_utf8(t.content)) c.error(key + ".content", "not valid UTF-8");
    if (t.content.empty()) continue;  // HF skips empty added tokens
    t.special = c.get_bool(e, "special", false, key);
    t.single_word = c.get_bool(e, "single_word", false, key);
    t.lstrip = c.get_bool(e, "lstrip", false, key);
    t.rstrip = c.get_bool(e, "rstrip", false, key);
    t.normalized = c.get_bool(e, "normalized", !t.special, key);
    if (!seen.insert(t.content, static_cast<int32_t>(i))) {
      c.error(key + ".content", "'", shorten(t.content), "' is listed twice");
    }
    const int64_t file_id = idj->get<int64_t>();
    if (file_id < 0 || file_id >= (int64_t{1} << 24)) c.error(key + ".id", "expected an id in [0, 2^24), found ", file_id);
    const int32_t in_vocab = impl.token_ids.find(t.content);
    int64_t hf_id;
    if (in_vocab >= 0) {
      hf_id = in_vocab;
    } else {
      hf_id = (max_added >= vocab_len) ? max_added + 1 : vocab_len;
    }
    if (file_id != hf_id) {
      c.error(key + ".id", "'", shorten(t.content), "' has id ", file_id, " but HF tokenizers would give it id ",
              hf_id, in_vocab >= 0 ? " (its id in model.vocab)" : " (added tokens follow the vocab consecutively)");
    }
    max_added = std::max(max_added, hf_id);
    if (in_vocab < 0 && hf_id < static_cast<int64_t>(vocab.present.size()) && vocab.present[hf_id]) {
      c.error(key + ".id", "'", shorten(t.content), "' and model.vocab token '", shorten(vocab.tokens[hf_id]),
              "' share id ", hf_id);
    }
    t.id = static_cast<int32_t>(hf_id);
    impl.added.push_back(std::move(t));
  }
}

void build_tables(Tokenizer::Impl& impl, const Vocab& vocab) {
  int64_t space = static_cast<int64_t>(vocab.tokens.size());
  while (space > 0 && !vocab.present[space - 1]) --space;
  for (const auto& t : impl.added) space = std::max<int64_t>(space, int64_t(t.id) + 1);

  std::vector<const std::string*> text(space, nullptr);
  impl.id_flags.assign(space, 0);
  for (int64_t id = 0; id < static_cast<int64_t>(vocab.tokens.size()) && id < space; ++id) {
    if (vocab.present[id]) {
      text[id] = &vocab.tokens[id];
      impl.id_flags[id] = Tokenizer::Impl::kIdExists;
    }
  }
  for (const auto& t : impl.added) {
    text[t.id] = &t.content;  // HF looks ids up in the added vocabulary first
    impl.id_flags[t.id] = Tokenizer::Impl::kIdExists | (t.special ? Tokenizer::Impl::kIdSpecial : 0);
  }
  impl.token_offset.assign(space + 1, 0);
  impl.bytes_offset.assign(space + 1, 0);
  std::string bytes;
  for (int64_t id = 0; id < space; ++id) {
    if (text[id]) {
      impl.token_arena.append(*text[id]);
      // A token with a character outside the ByteLevel table decodes to its raw text, as in HF.
      impl.bytes_arena.append(byte_level_bytes(*text[id], bytes) ? std::string_view(bytes) : *text[id]);
    }
    if (impl.token_arena.size() > std::numeric_limits<uint32_t>::max() ||
        impl.bytes_arena.size() > std::numeric_limits<uint32_t>::max()) {
      fail(impl.source, ": vocabulary strings exceed 4 GiB");
    }
    impl.token_offset[id + 1] = static_cast<uint32_t>(impl.token_arena.size());
    impl.bytes_offset[id + 1] = static_cast<uint32_t>(impl.bytes_arena.size());
  }

  // Added tokens win over vocab strings in token_to_id (HF: added vocabulary first).
  tok::StringIdMap ids;
  for (const auto& t : impl.added) ids.insert(t.content, t.id);
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    if (vocab.present[id]) ids.insert(vocab.tokens[id], static_cast<int32_t>(id));
  }
  impl.token_ids = std::move(ids);

  // ignore_merges looks whole words up by their raw bytes.
  if (impl.bpe.ignore_merges) {
    for (size_t id = 0; id < vocab.tokens.size(); ++id) {
      // A token with a character outside the ByteLevel table can never equal a byte-level word.
      if (vocab.present[id] && byte_level_bytes(vocab.tokens[id], bytes)) {
        impl.bpe.whole_words.insert(bytes, static_cast<int32_t>(id));
      }
    }
  }

  for (size_t i = 0; i < impl.added.size(); ++i) {
    const tok::AddedToken& t = impl.added[i];
    if (!t.normalized) {
      impl.raw_matcher.add(t.content, static_cast<int32_t>(i));
    } else {
      std::string buffer;
      const std::string_view pattern = impl.nfc ? tok::nfc(t.content, buffer) : std::string_view(t.content);
      impl.normalized_matcher.add(std::string(pattern), static_cast<int32_t>(i));
    }
  }
  impl.raw_matcher.finish();
  impl.normalized_matcher.finish();
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(std::string_view text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail(source, ": not valid JSON: ", e.what());
  }
  const Ctx c{source};
  if (!root.is_object()) fail(source, ": expected a JSON object at the top level, found ", root.type_name());

  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = source;
  try {
    impl->nfc = parse_normalizer(c, root);
    impl->pre = parse_pre_tokenizer(c, root);
    check_decoder(c, root);
    Vocab vocab;
    parse_model(c, root, *impl, vocab);
    parse_added_tokens(c, root, *impl, vocab);
    build_tables(*impl, vocab);
  } catch (const json::exception& e) {
    // Type errors that slipped past the explicit checks still name the file.
    fail(source, ": unexpected JSON structure: ", e.what());
  }
  return impl;
}

}  // namespace tandem

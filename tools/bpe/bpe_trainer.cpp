// Byte-level BPE training and tokenizer.json writing. See bpe_trainer.h.
#include "tools/bpe/bpe_trainer.h"

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "core/error.h"

namespace tandem {

const char* const kQwen35SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// GPT-2 order: bytes '!'..'~', '¡'..'¬', '®'..'ÿ' keep their code point and come first; the other 68
// bytes map to U+0100 + n in byte order and follow.
struct ByteMap {
  std::array<char32_t, 256> to_unicode{};
  std::array<int, 256> id{};
  ByteMap() {
    auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
    int next_id = 0;
    for (int b = 0; b < 256; ++b)
      if (printable(b)) {
        to_unicode[b] = static_cast<char32_t>(b);
        id[b] = next_id++;
      }
    int n = 0;
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) {
        to_unicode[b] = static_cast<char32_t>(256 + n++);
        id[b] = next_id++;
      }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// One code point and its byte span; invalid UTF-8 bytes become U+FFFD spanning one byte, so every byte
// of the input lands in exactly one pre-token.
struct CodePoint {
  char32_t cp;
  size_t begin, end;
};

std::vector<CodePoint> decode_utf8(std::string_view s) {
  std::vector<CodePoint> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc >> 6) == 2;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      len = 1;
      cp = 0xFFFD;
    }
    out.push_back({cp, i, i + len});
    i += len;
  }
  return out;
}

bool is_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_number(char32_t c) {
  return (c >= '0' && c <= '9') || c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE) ||
         (c >= 0x0660 && c <= 0x0669) || (c >= 0x06F0 && c <= 0x06F9) || (c >= 0x0966 && c <= 0x096F) ||
         (c >= 0x2070 && c <= 0x2079) || (c >= 0x2080 && c <= 0x2089) || (c >= 0x2150 && c <= 0x218B) ||
         (c >= 0x2460 && c <= 0x249B) || c == 0x3007 || (c >= 0xFF10 && c <= 0xFF19);
}

// Punctuation and symbols (P*, S*) outside ASCII, by block; everything else non-ASCII is a letter.
bool is_non_ascii_punct(char32_t c) {
  return (c >= 0xA1 && c <= 0xBF && c != 0xAA && c != 0xB5 && c != 0xBA) || c == 0xD7 || c == 0xF7 ||
         (c >= 0x02C2 && c <= 0x02C5) || c == 0x037E || c == 0x0387 || (c >= 0x055A && c <= 0x055F) ||
         c == 0x0589 || c == 0x05BE || c == 0x05C0 || c == 0x05C3 || c == 0x05F3 || c == 0x05F4 ||
         c == 0x060C || c == 0x061B || c == 0x061F || (c >= 0x066A && c <= 0x066D) || c == 0x06D4 ||
         c == 0x0964 || c == 0x0965 || c == 0x0970 || c == 0x0E3F || c == 0x0E4F || (c >= 0x2010 && c <= 0x2027) ||
         (c >= 0x2030 && c <= 0x205E) || (c >= 0x20A0 && c <= 0x20CF) || (c >= 0x2100 && c <= 0x214F) ||
         (c >= 0x2190 && c <= 0x245F) || (c >= 0x2500 && c <= 0x2BFF) || (c >= 0x2E00 && c <= 0x2E7F) ||
         (c >= 0x3001 && c <= 0x3004) || (c >= 0x3008 && c <= 0x3020) || c == 0x3030 || c == 0x30FB ||
         (c >= 0xFE10 && c <= 0xFE1F) || (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF01 && c <= 0xFF0F) ||
         (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65) ||
         c == 0xFFFD || (c >= 0x1F000 && c <= 0x1FAFF);
}

bool is_letter(char32_t c) {  // \p{L} or \p{M}
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return !is_space(c) && !is_number(c) && !is_non_ascii_punct(c) && c != 0xAD && !(c >= 0x80 && c < 0xA0);
}

bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }
bool is_punct(char32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }

char32_t lower_ascii(char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Length (in code points) of the regex match starting at i; the alternatives are tried in the
// regex's order, each with its own greedy/backtracking outcome worked out by hand.
size_t match_at(const std::vector<CodePoint>& s, size_t i) {
  const size_t n = s.size();
  auto at = [&](size_t k) -> char32_t { return k < n ? s[k].cp : 0; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (at(i) == '\'') {
    const char32_t a = lower_ascii(at(i + 1)), b = lower_ascii(at(i + 2));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
  {
    size_t j = i;
    if (i < n && !is_newline(at(i)) && !is_letter(at(i)) && !is_number(at(i)) && i + 1 < n && is_letter(at(i + 1))) ++j;
    if (j < n && is_letter(at(j))) {
      while (j < n && is_letter(at(j))) ++j;
      return j - i;
    }
  }
  // \p{N}
  if (is_number(at(i))) return 1;
  // ' ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*'
  {
    size_t j = i;
    if (at(j) == ' ' && j + 1 < n && is_punct(at(j + 1))) ++j;
    if (j < n && is_punct(at(j))) {
      while (j < n && is_punct(at(j))) ++j;
      while (j < n && is_newline(at(j))) ++j;
      return j - i;
    }
  }
  // whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
  size_t e = i;
  while (e < n && is_space(at(e))) ++e;
  if (e > i) {
    for (size_t p = e; p > i; --p)
      if (is_newline(at(p - 1))) return p - i;  // ends at the run's last newline
    if (e == n) return e - i;
    if (e - i >= 2) return e - i - 1;  // leave one space to prefix the next word
    return 1;
  }
  return 1;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }
int byte_token_id(uint8_t b) { return byte_map().id[b]; }

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

std::vector<std::string> pretokenize_qwen35_approx(std::string_view text) {
  const std::vector<CodePoint> cps = decode_utf8(text);
  std::vector<std::string> out;
  for (size_t i = 0; i < cps.size();) {
    const size_t len = match_at(cps, i);
    out.emplace_back(text.substr(cps[i].begin, cps[i + len - 1].end - cps[i].begin));
    i += len;
  }
  return out;
}

BpeModel train_bpe(std::string_view text, const BpeTrainerOptions& opts) {
  if (opts.vocab_size < 256) fail("BPE vocab_size ", opts.vocab_size, " is smaller than the 256 byte tokens");
  BpeModel m;
  m.tokens.resize(256);
  for (int b = 0; b < 256; ++b) m.tokens[byte_token_id(static_cast<uint8_t>(b))] = std::string(1, static_cast<char>(b));

  // Unique pre-tokens with their counts; std::map keeps the order (and so every tie) deterministic.
  std::map<std::string, int64_t> counts;
  for (auto& w : pretokenize_qwen35_approx(text)) ++counts[w];
  struct Word {
    std::vector<int32_t> sym;
    int64_t freq;
  };
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [w, c] : counts) {
    Word wd{{}, c};
    for (char ch : w) wd.sym.push_back(byte_token_id(static_cast<uint8_t>(ch)));
    words.push_back(std::move(wd));
  }

  auto key = [](int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;  // may hold stale or repeated entries
  // Max-heap on (count, -left, -right): most frequent first, then the smaller ids. Entries go stale
  // when a count changes; a popped entry is used only if it still matches the live count.
  using Entry = std::tuple<int64_t, int32_t, int32_t>;
  std::priority_queue<Entry> heap;
  auto push = [&](uint64_t k) {
    const int64_t c = pair_count[k];
    if (c > 0) heap.emplace(c, -static_cast<int32_t>(k >> 32), -static_cast<int32_t>(k & 0xffffffffu));
  };
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) {
    const auto& s = words[w].sym;
    for (size_t k = 0; k + 1 < s.size(); ++k) {
      pair_count[key(s[k], s[k + 1])] += words[w].freq;
      pair_words[key(s[k], s[k + 1])].push_back(w);
    }
  }
  for (const auto& [k, c] : pair_count) push(k);

  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t i = 0; i < 256; ++i) id_of[m.tokens[i]] = i;
  std::vector<uint64_t> touched;
  while (m.tokens.size() < opts.vocab_size && !heap.empty()) {
    const auto [count, na, nb] = heap.top();
    heap.pop();
    const int32_t a = -na, b = -nb;
    const uint64_t k = key(a, b);
    if (pair_count[k] != count) continue;  // stale
    if (count < opts.min_frequency) break;
    const std::string merged = m.tokens[a] + m.tokens[b];
    int32_t id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      id = it->second;  // same string reached by another split: HF's trainer reuses the id too
    } else {
      id = static_cast<int32_t>(m.tokens.size());
      m.tokens.push_back(merged);
      id_of.emplace(merged, id);
    }
    m.merges.emplace_back(a, b);

    std::vector<int32_t> affected = std::move(pair_words[k]);
    pair_words.erase(k);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    touched.clear();
    for (int32_t w : affected) {
      Word& wd = words[w];
      bool has = false;
      for (size_t j = 0; j + 1 < wd.sym.size() && !has; ++j) has = wd.sym[j] == a && wd.sym[j + 1] == b;
      if (!has) continue;
      for (size_t j = 0; j + 1 < wd.sym.size(); ++j) {
        pair_count[key(wd.sym[j], wd.sym[j + 1])] -= wd.freq;
        touched.push_back(key(wd.sym[j], wd.sym[j + 1]));
      }
      std::vector<int32_t> next;
      next.reserve(wd.sym.size());
      for (size_t j = 0; j < wd.sym.size(); ++j) {
        if (j + 1 < wd.sym.size() && wd.sym[j] == a && wd.sym[j + 1] == b) {
          next.push_back(id);
          ++j;
        } else {
          next.push_back(wd.sym[j]);
        }
      }
      wd.sym = std::move(next);
      for (size_t j = 0; j + 1 < wd.sym.size(); ++j) {
        const uint64_t nk = key(wd.sym[j], wd.sym[j + 1]);
        pair_count[nk] += wd.freq;
        pair_words[nk].push_back(w);
        touched.push_back(nk);
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t t : touched) push(t);
  }
  return m;
}

std::string hf_tokenizer_json(const BpeModel& model, const std::vector<AddedToken>& added, int64_t regular_size) {
  using ojson = nlohmann::ordered_json;
  std::vector<std::string> level(model.tokens.size());
  for (size_t i = 0; i < model.tokens.size(); ++i) level[i] = bytes_to_byte_level(model.tokens[i]);

  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  const int64_t regular = std::max<int64_t>(regular_size, static_cast<int64_t>(model.tokens.size()));
  ojson at = ojson::array();
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (t.id != regular + static_cast<int64_t>(i))
      fail("added token '", t.content, "' has id ", t.id, "; HF tokenizers numbers added tokens consecutively from ",
           regular, ", so it must be ", regular + static_cast<int64_t>(i));
    at.push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", false},
                  {"rstrip", false}, {"normalized", false}, {"special", t.special}});
  }
  j["added_tokens"] = at;
  j["normalizer"] = {{"type", "NFC"}};
  const ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", kQwen35SplitRegex}}}, {"behavior", "Isolated"}, {"invert", false}},
                          byte_level}}};
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  // The vocabulary is serialised by hand: ordered_json looks keys up linearly, which is quadratic for
  // a 248k-entry vocabulary. Keys are escaped by the JSON library.
  std::string vocab = "{";
  auto entry = [&](const std::string& token, int64_t id) {
    vocab += vocab.size() > 1 ? ",\n  " : "\n  ";
    vocab += nlohmann::json(token).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    vocab += ": " + std::to_string(id);
  };
  std::unordered_map<std::string, int64_t> seen;
  for (size_t i = 0; i < level.size(); ++i)
    if (seen.emplace(level[i], i).second) entry(level[i], static_cast<int64_t>(i));
  for (int64_t id = static_cast<int64_t>(level.size()); id < regular; ++id) entry(str_cat("<|synth_unused_", id, "|>"), id);
  vocab += "\n }";
  const std::string kVocabSlot = "@@vocab@@";
  ojson merges = ojson::array();
  for (const auto& [a, b] : model.merges) merges.push_back({level[a], level[b]});
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},          {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},   {"vocab", kVocabSlot},
                {"merges", merges}};
  std::string text = j.dump(1, ' ', false, nlohmann::json::error_handler_t::strict);
  const size_t slot = text.find("\"" + kVocabSlot + "\"");
  text.replace(slot, kVocabSlot.size() + 2, vocab);
  return text;
}

}  // namespace tandem

// libFuzzer target: the tokenizer never crashes, on any bytes, any code points, any ids, any JSON.
//
// The first input byte picks the mode (bits 0-1) and the test tokenizer (bit 2); the rest is the payload:
//   0: raw bytes as text. Invalid UTF-8 is repaired to U+FFFD first (Tokenizer's documented behaviour),
//      so decode(encode(x)) must equal NFC(lossy(x));
//   1: random code points (3 bytes each, any plane) as valid UTF-8: decode(encode(x)) == NFC(x);
//   2: 2-byte ids, in and out of range: decode is valid UTF-8 and the stream decoder agrees with it;
//   3: the payload as tokenizer.json: accepted or rejected with tandem::Error.
// The round trip is skipped when the text contains "<|": a special token is cut out of the raw text
// before NFC (as in HF), so NFC across its edges (">" + U+0338 -> U+226F) legitimately differs.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/unicode.h"

#ifndef TANDEM_TOKENIZER_DIR
#error "build with -DTANDEM_TOKENIZER_DIR=\"<repo>/tests/data/tokenizers\""
#endif

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const tandem::Tokenizer& test_tokenizer(int which) {
  static const tandem::Tokenizer qwen35 =
      tandem::Tokenizer::from_file(std::string(TANDEM_TOKENIZER_DIR) + "/qwen35_v1000_lowspecial.json");
  static const tandem::Tokenizer qwen2 =
      tandem::Tokenizer::from_file(std::string(TANDEM_TOKENIZER_DIR) + "/qwen2_v2000_ignoremerges.json");
  return which ? qwen2 : qwen35;
}

void check_decode(const tandem::Tokenizer& tok, const std::vector<int32_t>& ids, std::string* out) {
  const std::string text = tok.decode(ids);
  check(tandem::tok::is_valid_utf8(text));
  tandem::StreamDecoder stream(tok);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string piece = stream.push(id);
    check(tandem::tok::is_valid_utf8(piece));
    streamed += piece;
  }
  streamed += stream.flush();
  check(streamed == text);
  if (out) *out = text;
}

void round_trip(const tandem::Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text);
  for (const int32_t id : ids) check(id >= 0 && id < tok.vocab_size());
  std::string decoded;
  check_decode(tok, ids, &decoded);
  if (text.find("<|") != std::string::npos) return;
  std::string valid, buffer;
  tandem::tok::append_utf8_lossy(text, valid);
  check(decoded == tandem::tok::nfc(valid, buffer));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] & 3;
  const tandem::Tokenizer& tok = test_tokenizer((data[0] >> 2) & 1);
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  switch (mode) {
    case 0:
      round_trip(tok, std::string(reinterpret_cast<const char*>(p), n));
      break;
    case 1: {
      std::string text;
      for (size_t i = 0; i + 3 <= n; i += 3) {
        char32_t cp = ((char32_t(p[i]) << 16) | (char32_t(p[i + 1]) << 8) | p[i + 2]) % 0x110000;
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        tandem::tok::append_utf8(cp, text);
      }
      round_trip(tok, text);
      break;
    }
    case 2: {
      std::vector<int32_t> ids;
      for (size_t i = 0; i + 2 <= n; i += 2) ids.push_back(int32_t(p[i] | (p[i + 1] << 8)) % (tok.vocab_size() + 16) - 8);
      check_decode(tok, ids, nullptr);
      break;
    }
    default:
      try {
        const auto t = tandem::Tokenizer::from_json(std::string(reinterpret_cast<const char*>(p), n), "fuzz.json");
        round_trip(t, "fuzz <|im_end|> text 123 é");
      } catch (const tandem::Error&) {
      }
  }
  return 0;
}

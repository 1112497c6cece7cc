// Streaming detokenizer invariants on the whole corpus, for every fixture tokenizer: no delta holds invalid UTF-8 or
// ends inside a character, and the concatenation of all deltas equals the full decode (with and without special
// tokens).
#include "text/detokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/unicode.h"
#include "tokenizer_fixtures.h"

namespace kestrel::text {
namespace {

using kestrel::testing::kTokenizerData;

class DetokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DetokenizerTest, StreamingEqualsFullDecode) {
  const std::string name = GetParam();
  const auto tokenizer = Tokenizer::load(kTokenizerData + "/" + name + "/tokenizer.json");
  const auto expected = kestrel::testing::load_expectations(name);
  size_t failures = 0;
  for (const bool skip : {false, true}) {
    for (size_t i = 0; i < expected.ids.size(); ++i) {
      Detokenizer stream(*tokenizer, skip);
      std::string text;
      for (const int32_t id : expected.ids[i]) {
        const std::string delta = stream.feed(id);
        if ((find_invalid_utf8(delta) || ends_with_incomplete_utf8(delta)) && ++failures <= 5) {
          ADD_FAILURE() << name << " case " << i << ": delta is not whole UTF-8: " << nlohmann::json(delta).dump();
        }
        text += delta;
      }
      text += stream.finish();
      const std::string& full = skip ? expected.decoded_skip[i] : expected.decoded[i];
      if (text != full && ++failures <= 5) {
        ADD_FAILURE() << name << " case " << i << " skip=" << skip << "\n  streamed " << nlohmann::json(text).dump()
                      << "\n  full     " << nlohmann::json(full).dump();
      }
    }
  }
  EXPECT_EQ(failures, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DetokenizerTest, ::testing::ValuesIn(kestrel::testing::tokenizer_fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(DetokenizerTest, HoldsBackSplitCharacterUntilComplete) {
  const auto tokenizer = Tokenizer::load(kTokenizerData + "/gpt2/tokenizer.json");
  // "🦙" is several byte-level tokens in GPT-2; no delta may show a part of it.
  const std::vector<int32_t> ids = tokenizer->encode("a🦙b");
  ASSERT_GT(ids.size(), 3u);
  Detokenizer stream(*tokenizer);
  std::vector<std::string> deltas;
  for (const int32_t id : ids) deltas.push_back(stream.feed(id));
  deltas.push_back(stream.finish());
  std::string joined;
  for (const auto& d : deltas) {
    EXPECT_EQ(d.find("\xEF\xBF\xBD"), std::string::npos) << nlohmann::json(d).dump();
    joined += d;
  }
  EXPECT_EQ(joined, "a🦙b");
}

TEST(DetokenizerTest, IncompleteTailIsFlushedAsReplacementCharacter) {
  const auto tokenizer = Tokenizer::load(kTokenizerData + "/gpt2/tokenizer.json");
  std::vector<int32_t> ids = tokenizer->encode("🦙");
  ids.pop_back();  // a truncated character: the full decode ends in U+FFFD, and so does the stream, at finish
  Detokenizer stream(*tokenizer);
  std::string text;
  for (const int32_t id : ids) text += stream.feed(id);
  EXPECT_EQ(text, "");
  text += stream.finish();
  EXPECT_EQ(text, tokenizer->decode(ids));
}

TEST(DetokenizerTest, WaitsForByteFallbackGroupToClose) {
  // Found by the fuzzer: "<0x00>" alone decodes to "\0", but followed by "<0xF5>" the group is invalid and both
  // bytes become U+FFFD; the stream must not have shown the "\0".
  const auto tokenizer = Tokenizer::load(kTokenizerData + "/gen_bytefallback/tokenizer.json");
  const std::string text("\0<0xF5>Ge\0\0\0\t", 13);
  const std::vector<int32_t> ids = tokenizer->encode(text);
  Detokenizer stream(*tokenizer);
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.feed(id);
  streamed += stream.finish();
  EXPECT_EQ(streamed, tokenizer->decode(ids));
}

}  // namespace
}  // namespace kestrel::text

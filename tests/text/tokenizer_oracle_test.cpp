// The tokenizer against HF tokenizers 0.23 (fixtures from tools/make_tokenizer_fixtures.py): for every tokenizer and
// every corpus string, identical ids (add_special_tokens=True) and identical decodes (with and without special
// tokens).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace kestrel::text {
namespace {

using kestrel::testing::kTokenizerData;

std::string ids_text(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

class TokenizerOracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerOracleTest, EncodeAndDecodeMatchHuggingFace) {
  const std::string name = GetParam();
  const auto tokenizer = Tokenizer::load(kTokenizerData + "/" + name + "/tokenizer.json");
  const auto& corpus = kestrel::testing::tokenizer_corpus();
  const auto expected = kestrel::testing::load_expectations(name);
  ASSERT_GE(corpus.size(), 10000u);
  size_t encode_failures = 0, decode_failures = 0, skip_failures = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer->encode(corpus[i]);
    if (ids != expected.ids[i] && ++encode_failures <= 8) {
      ADD_FAILURE() << name << " case " << i << " " << nlohmann::json(corpus[i]).dump() << "\n  got  "
                    << ids_text(ids) << "\n  want " << ids_text(expected.ids[i]);
    }
    const std::string decoded = tokenizer->decode(expected.ids[i], false);
    if (decoded != expected.decoded[i] && ++decode_failures <= 8) {
      ADD_FAILURE() << name << " decode case " << i << "\n  got  " << nlohmann::json(decoded).dump() << "\n  want "
                    << nlohmann::json(expected.decoded[i]).dump();
    }
    const std::string skipped = tokenizer->decode(expected.ids[i], true);
    if (skipped != expected.decoded_skip[i] && ++skip_failures <= 8) {
      ADD_FAILURE() << name << " decode(skip_special_tokens) case " << i << "\n  got  "
                    << nlohmann::json(skipped).dump() << "\n  want " << nlohmann::json(expected.decoded_skip[i]).dump();
    }
  }
  EXPECT_EQ(encode_failures, 0u) << name << ": encode mismatches out of " << corpus.size();
  EXPECT_EQ(decode_failures, 0u) << name << ": decode mismatches out of " << corpus.size();
  EXPECT_EQ(skip_failures, 0u) << name << ": skip-special decode mismatches out of " << corpus.size();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerOracleTest,
                         ::testing::ValuesIn(kestrel::testing::tokenizer_fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace kestrel::text

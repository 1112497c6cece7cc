// Tokenizer loading errors, hostile input, configs and the tokenize/detokenize CLI.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "../formats/expect_error.h"
#include "../formats/safetensors_builder.h"
#include "tokenizer_fixtures.h"

namespace kestrel::text {
namespace {

using kestrel::testing::expect_error;
using kestrel::testing::kTokenizerData;
using kestrel::testing::ScratchDir;
using kestrel::testing::write_file;
using nlohmann::json;

json minimal() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [{"id": 5, "content": "<eos>", "special": true, "normalized": false,
                                        "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}, "merges": ["a b", ["Ġ", "ab"]]}})");
}

std::unique_ptr<Tokenizer> load(const json& j) { return Tokenizer::from_json(j.dump(), "tok.json"); }

TEST(TokenizerTest, MinimalTokenizerWorks) {
  const auto tok = load(minimal());
  EXPECT_EQ(tok->encode("ab ab<eos>"), (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ(tok->decode({2, 4, 5}), "ab ab<eos>");
  EXPECT_EQ(tok->decode({2, 4, 5}, true), "ab ab");
  EXPECT_EQ(tok->decode({2, 999}), "ab");  // unknown ids are skipped, as HF does
  EXPECT_EQ(tok->encode("<eos>", {.add_special_tokens = true, .split_special_tokens = false}),
            (std::vector<int32_t>{}));  // "<", "e", ... are not in this vocab: dropped without an unk token
  EXPECT_EQ(tok->vocab_size(), 6u);
}

TEST(TokenizerTest, MalformedFilesAreClearErrors) {
  expect_error([] { Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {}, )", "t.json"); },
               {"t.json", "invalid JSON"});
  expect_error([] { Tokenizer::from_json("[1, 2]", "t.json"); }, {"t.json", "expected a JSON object"});
  {
    json j = minimal();
    j.erase("model");
    expect_error([&] { load(j); }, {"tok.json", "missing the \"model\""});
  }
  {
    json j = minimal();
    j["model"]["type"] = "WordPiece";
    expect_error([&] { load(j); }, {"tok.json: model.type", "WordPiece"});
  }
  {
    json j = minimal();
    j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
    expect_error([&] { load(j); }, {"tok.json: pre_tokenizer", "unsupported pre-tokenizer type 'BertPreTokenizer'"});
  }
  {
    json j = minimal();
    j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [{"type": "Split",
        "pattern": {"Regex": "(\\p{L}+"}, "behavior": "Isolated", "invert": false}]})");
    expect_error([&] { load(j); }, {"tok.json: pre_tokenizer.pretokenizers[0].pattern.Regex",
                                    "invalid regular expression"});
  }
  {
    json j = minimal();
    j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"})");
    expect_error([&] { load(j); }, {"pre_tokenizer.behavior", "unknown split behavior 'Sideways'"});
  }
  {
    json j = minimal();
    j["model"]["merges"].push_back("a zz");
    expect_error([&] { load(j); }, {"tok.json: model.merges[2]", "\"zz\" is not in the vocab"});
  }
  {
    json j = minimal();
    j["model"]["merges"].push_back("b a");
    expect_error([&] { load(j); }, {"model.merges[2]", "merged token \"ba\" is not in the vocab"});
  }
  {
    json j = minimal();
    j["model"]["merges"].push_back("abc");
    expect_error([&] { load(j); }, {"model.merges[2]", "two tokens separated by one space"});
  }
  {
    json j = minimal();
    j["model"]["merges"].push_back(json::array({"a"}));
    expect_error([&] { load(j); }, {"model.merges[2]", "pair"});
  }
  {
    json j = minimal();
    j["model"]["dropout"] = 0.1;
    expect_error([&] { load(j); }, {"model.dropout", "not supported"});
  }
  {
    json j = minimal();
    j["model"]["vocab"]["c"] = -1;
    expect_error([&] { load(j); }, {"model.vocab[\"c\"]", "non-negative integer"});
  }
  {
    json j = minimal();
    j["normalizer"] = {{"type", "BertNormalizer"}};
    expect_error([&] { load(j); }, {"tok.json: normalizer", "unsupported normalizer type 'BertNormalizer'"});
  }
  {
    json j = minimal();
    j["decoder"] = {{"type", "WordPiece"}};
    expect_error([&] { load(j); }, {"tok.json: decoder", "unsupported decoder type 'WordPiece'"});
  }
  {
    json j = minimal();
    j["post_processor"] = json::parse(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>",
        "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}})");
    expect_error([&] { load(j); }, {"post_processor.single[0]", "\"<bos>\" is not in special_tokens"});
  }
  {
    json j = minimal();
    j["added_tokens"][0].erase("content");
    expect_error([&] { load(j); }, {"tok.json: added_tokens[0]", "missing field 'content'"});
  }
  {
    json j = minimal();
    j["added_tokens"].push_back(j["added_tokens"][0]);
    j["added_tokens"][1]["content"] = "<x>";
    expect_error([&] { load(j); }, {"added_tokens[1].id", "used by two added tokens"});
  }
  expect_error([] { Tokenizer::load("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json", "cannot open"});
}

TEST(TokenizerTest, InvalidUtf8InputIsRejected) {
  const auto tok = Tokenizer::load(kTokenizerData + "/glm_bpe/tokenizer.json");
  for (const std::string& bad : {std::string("abc\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"),
                                std::string("\xC0\xAF"), std::string("ok\xF4\x90\x80\x80"), std::string("x\x80y")}) {
    expect_error([&] { tok->encode(bad); }, {"not valid UTF-8"});
  }
  EXPECT_EQ(tok->encode(std::string("a\0b", 3)).size(), 3u);  // NUL is valid UTF-8
}

TEST(TokenizerTest, OneMegabyteInputTokenizesQuickly) {
  const auto tok = Tokenizer::load(kTokenizerData + "/glm_bpe/tokenizer.json");  // no normalizer: exact round trip
  const auto& corpus = kestrel::testing::tokenizer_corpus();
  std::string big;
  for (size_t i = 0; big.size() < (1u << 20); ++i) big += corpus[i % corpus.size()];
  const std::string one_word(1u << 20, 'x');       // one 1 MB pre-token (no cache, long merge run)
  const std::string spaces(1u << 20, ' ');          // one 1 MB whitespace run through the look-ahead regex
  const auto start = std::chrono::steady_clock::now();
  EXPECT_GT(tok->encode(big).size(), 100000u);
  EXPECT_GT(tok->encode(one_word).size(), 1000u);
  EXPECT_GT(tok->encode(spaces).size(), 10u);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 60.0);
  EXPECT_TRUE(tok->decode(tok->encode(big)) == big);
}

TEST(TokenizerTest, GlmSpecialTokensAreSingleIds) {
  const auto tok = Tokenizer::load(kTokenizerData + "/glm_bpe/tokenizer.json");
  const auto gmask = tok->token_to_id("[gMASK]"), sop = tok->token_to_id("<sop>"), think = tok->token_to_id("<think>");
  ASSERT_TRUE(gmask && sop && think);
  const auto ids = tok->encode("[gMASK]<sop><|user|>hi<|assistant|><think>");
  EXPECT_EQ(ids.front(), *gmask);
  EXPECT_EQ(ids[1], *sop);
  EXPECT_EQ(ids.back(), *think);
  EXPECT_TRUE(tok->is_special(*think));
  EXPECT_EQ(tok->decode(ids, true), "hi");
  // With special tokens treated as text, "[gMASK]" is several ordinary tokens.
  EXPECT_GT(tok->encode("[gMASK]", {.add_special_tokens = true, .split_special_tokens = false}).size(), 1u);
}

TEST(TokenizerConfigTest, LoadsTokenizerAndGenerationConfig) {
  const auto tok = Tokenizer::load(kTokenizerData + "/glm_bpe/tokenizer.json");
  const TokenizerConfig c = load_tokenizer_config(kTokenizerData + "/glm_bpe", tok.get());
  EXPECT_EQ(c.eos_token, "<|endoftext|>");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{*tok->token_to_id("<|endoftext|>"), *tok->token_to_id("<|user|>"),
                                                   *tok->token_to_id("<|observation|>")}));
  EXPECT_EQ(c.named_templates.size(), 2u);
  EXPECT_EQ(c.chat_template, c.named_templates.at("default"));

  const TokenizerConfig d = load_tokenizer_config(kTokenizerData + "/deepseek_coder");
  EXPECT_EQ(d.bos_token, "<｜begin▁of▁sentence｜>");  // from an AddedToken dict
  EXPECT_EQ(d.add_bos_token, true);

  ScratchDir dir;
  write_file(dir.file("tokenizer_config.json"), R"({"eos_token": "</s>", "chat_template": 7})");
  expect_error([&] { load_tokenizer_config(dir.path()); }, {"tokenizer_config.json", "chat_template"});
  write_file(dir.file("tokenizer_config.json"), R"({"eos_token": "</s>", "chat_template": "{{ x }}"})");
  write_file(dir.file("generation_config.json"), R"({"eos_token_id": 2})");
  const TokenizerConfig e = load_tokenizer_config(dir.path());
  EXPECT_EQ(e.chat_template, "{{ x }}");
  EXPECT_EQ(e.eos_token_ids, std::vector<int32_t>{2});
  write_file(dir.file("generation_config.json"), R"({"eos_token_id": [2, "x"]})");
  expect_error([&] { load_tokenizer_config(dir.path()); }, {"generation_config.json: eos_token_id[1]"});
}

std::string run_cli(const std::string& args, const std::string& input, int* status) {
  ScratchDir dir;
  write_file(dir.file("in"), input);
  const std::string command = std::string(KESTREL_BINARY) + " " + args + " < " + dir.file("in") + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  *status = ::pclose(pipe);
  return out;
}

TEST(TokenizeCliTest, TokenizeAndDetokenizeRoundTrip) {
  const std::string model = kTokenizerData + "/glm_bpe";
  const std::string text = "[gMASK]<sop><|user|>Hello wörld 👋🏽\n<think>";
  int status = 0;
  const std::string ids = run_cli("tokenize --model " + model, text, &status);
  ASSERT_EQ(status, 0) << ids;
  const auto tok = Tokenizer::load(model + "/tokenizer.json");
  EXPECT_EQ(json::parse(ids).get<std::vector<int32_t>>(), tok->encode(text));
  EXPECT_EQ(run_cli("detokenize --model " + model, ids, &status), text);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(run_cli("detokenize --model " + model + " --skip-special", ids, &status), "Hello wörld 👋🏽\n");
  const std::string error = run_cli("tokenize --model " + model, "bad \xFF", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(error.find("not valid UTF-8"), std::string::npos) << error;
  EXPECT_NE(run_cli("detokenize --model " + model, "[1, -2]", &status).find("not a token id"), std::string::npos);
  EXPECT_NE(status, 0);
}

}  // namespace
}  // namespace kestrel::text

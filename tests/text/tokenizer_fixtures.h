// Test helper: the oracle fixtures of tests/data/tokenizers (written by tools/make_tokenizer_fixtures.py with HF
// tokenizers): the shared corpus, and per tokenizer the expected ids and decodes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kestrel::testing {

inline const std::string kTokenizerData = std::string(KESTREL_TEST_DATA) + "/tokenizers";

// Every tokenizer fixture directory under tests/data/tokenizers.
inline const std::vector<std::string>& tokenizer_fixture_names() {
  static const std::vector<std::string> names = {"gpt2",    "qwen2",         "deepseek_coder", "llama_spm",
                                                 "glm_bpe", "gen_metaspace", "gen_misc",       "gen_bytefallback"};
  return names;
}

inline std::string read_binary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline const std::vector<std::string>& tokenizer_corpus() {
  static const std::vector<std::string> corpus = [] {
    std::vector<std::string> out;
    std::ifstream in(kTokenizerData + "/corpus.jsonl");
    if (!in) throw std::runtime_error("cannot open the tokenizer corpus");
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line).get<std::string>());
    return out;
  }();
  return corpus;
}

struct TokenizerExpectations {
  std::vector<std::vector<int32_t>> ids;   // per corpus case
  std::vector<std::string> decoded;        // decode(ids, skip_special_tokens=false)
  std::vector<std::string> decoded_skip;   // decode(ids, skip_special_tokens=true)
};

inline TokenizerExpectations load_expectations(const std::string& name) {
  const std::string dir = kTokenizerData + "/" + name;
  const auto& corpus = tokenizer_corpus();
  TokenizerExpectations e;
  const std::string blob = read_binary(dir + "/ids.bin");
  size_t pos = 0;
  auto varint = [&] {
    uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= blob.size() || shift > 35) throw std::runtime_error(name + "/ids.bin: truncated varint");
      const auto b = static_cast<uint8_t>(blob[pos++]);
      value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return value;
    }
  };
  for (size_t i = 0; i < corpus.size(); ++i) {
    std::vector<int32_t> ids(varint());
    for (auto& id : ids) id = static_cast<int32_t>(varint());
    e.ids.push_back(std::move(ids));
  }
  if (pos != blob.size()) throw std::runtime_error(name + "/ids.bin: does not match the corpus size");
  std::ifstream in(dir + "/decode.jsonl");
  std::string line;
  std::getline(in, line);
  const auto wrap = nlohmann::json::parse(line);
  for (const auto& text : corpus) {
    e.decoded.push_back(wrap["prefix"].get<std::string>() + text + wrap["suffix"].get<std::string>());
    e.decoded_skip.push_back(wrap["skip_prefix"].get<std::string>() + text + wrap["skip_suffix"].get<std::string>());
  }
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const auto i = j["i"].get<size_t>();
    if (j.contains("text")) e.decoded.at(i) = j["text"].get<std::string>();
    if (j.contains("skip")) e.decoded_skip.at(i) = j["skip"].is_null() ? e.decoded.at(i) : j["skip"].get<std::string>();
  }
  return e;
}

}  // namespace kestrel::testing

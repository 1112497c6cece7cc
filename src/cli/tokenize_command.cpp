// `kestrel tokenize` (UTF-8 text on stdin → JSON array of ids) and `kestrel detokenize` (JSON array of ids on stdin →
// text) with DIR/tokenizer.json. `kestrel tokenize --bench CORPUS` times encoding instead (one thread): CORPUS holds
// one JSON string per line (e.g. tests/data/tokenizers/corpus.jsonl).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/commands.h"
#include "text/tokenizer.h"

namespace kestrel::cli {

namespace {

std::string read_stdin() {
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

std::unique_ptr<text::Tokenizer> load_tokenizer(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "tokenizer.json";
  require(std::filesystem::exists(path), "{}: no tokenizer.json in the model directory", path.string());
  return text::Tokenizer::load(path);
}

int run_bench(const text::Tokenizer& tokenizer, const std::string& corpus_path, int repeat,
              const text::EncodeOptions& options) {
  std::ifstream in(corpus_path);
  require(in.good(), "{}: cannot open the benchmark corpus", corpus_path);
  std::vector<std::string> corpus;
  size_t bytes = 0;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not a JSON string: {}", corpus_path, n, e.what());
    }
    require(value.is_string(), "{}:{}: expected a JSON string", corpus_path, n);
    corpus.push_back(value.get<std::string>());
    bytes += corpus.back().size();
  }
  for (int pass = 0; pass < repeat; ++pass) {
    size_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const auto& s : corpus) tokens += tokenizer.encode(s, options).size();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("pass %d: %zu strings, %zu bytes, %zu tokens in %.4f s: %.2f MB/s, %.0f tokens/s\n", pass + 1,
                corpus.size(), bytes, tokens, seconds, static_cast<double>(bytes) / seconds / 1e6,
                static_cast<double>(tokens) / seconds);
  }
  return 0;
}

}  // namespace

Action add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string model, bench;
    bool no_special = false, no_add_special = false;
    int repeat = 3;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Tokenize UTF-8 text from stdin; print the ids as a JSON array");
  cmd->add_option("--model", options->model, "Model directory with tokenizer.json")->required();
  cmd->add_flag("--no-special", options->no_special, "Encode special tokens in the text as plain text");
  cmd->add_flag("--no-add-special-tokens", options->no_add_special, "Do not add BOS/EOS (the post-processor)");
  cmd->add_option("--bench", options->bench, "Time encoding of a JSONL corpus (one JSON string per line) instead");
  cmd->add_option("--repeat", options->repeat, "Benchmark passes (the first one starts with an empty cache)")
      ->check(CLI::Range(1, 1000));
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    const auto tokenizer = load_tokenizer(options->model);
    text::EncodeOptions encode;
    encode.add_special_tokens = !options->no_add_special;
    encode.split_special_tokens = !options->no_special;
    if (!options->bench.empty()) return run_bench(*tokenizer, options->bench, options->repeat, encode);
    const std::vector<int32_t> ids = tokenizer->encode(read_stdin(), encode);
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  };
}

Action add_detokenize_command(CLI::App& app) {
  struct Options {
    std::string model;
    bool skip_special = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("detokenize", "Decode a JSON array of ids from stdin; print the text");
  cmd->add_option("--model", options->model, "Model directory with tokenizer.json")->required();
  cmd->add_flag("--skip-special", options->skip_special, "Leave special tokens out of the text");
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    const auto tokenizer = load_tokenizer(options->model);
    nlohmann::json input;
    try {
      input = nlohmann::json::parse(read_stdin());
    } catch (const nlohmann::json::exception& e) {
      fail("stdin: expected a JSON array of token ids: {}", e.what());
    }
    require(input.is_array(), "stdin: expected a JSON array of token ids");
    std::vector<int32_t> ids;
    for (size_t i = 0; i < input.size(); ++i) {
      const auto& v = input[i];
      require(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
              "stdin: element {} is not a token id (a non-negative integer)", i);
      const auto id = v.get<int32_t>();
      require(tokenizer->id_to_token(id) != nullptr, "stdin: token id {} (element {}) is not in the vocabulary", id,
              i);
      ids.push_back(id);
    }
    const std::string text = tokenizer->decode(ids, options->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  };
}

}  // namespace kestrel::cli

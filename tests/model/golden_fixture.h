// The golden fixtures under tests/data/golden (written by tools/make_golden.py): where they are, the token sequence
// and prefill each was run with, and the comparison the tests apply to logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <utility>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "model/glm5_next.h"

namespace kestrel::testing {

struct GoldenFixture {
  std::string dir;
  std::vector<int32_t> tokens;
  int64_t prefill = 0;  // tokens of the reference's cached prefill, the rest decoded one at a time
};

// tests/data as configured at build time, or $KESTREL_TEST_DATA (a test binary carried to another machine).
inline std::filesystem::path test_data_root() {
  const char* moved = std::getenv("KESTREL_TEST_DATA");
  return std::filesystem::path(moved != nullptr && *moved != 0 ? moved : KESTREL_TEST_DATA);
}

inline std::string golden_dir(const std::string& name) { return (test_data_root() / "golden" / name).string(); }

inline std::vector<std::string> golden_fixture_names() {
  std::vector<std::string> names;
  const std::filesystem::path root = test_data_root() / "golden";
  if (std::filesystem::exists(root)) {
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      if (std::filesystem::exists(entry.path() / "meta.json")) names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline GoldenFixture read_golden_fixture(const std::string& name) {
  GoldenFixture fixture{.dir = golden_dir(name), .tokens = {}, .prefill = 0};
  std::ifstream in(fixture.dir + "/meta.json");
  const auto meta = nlohmann::json::parse(in);
  fixture.tokens = meta.at("tokens").get<std::vector<int32_t>>();
  fixture.prefill = meta.at("prefill").get<int64_t>();
  return fixture;
}

// Largest |a - b|; NaN anywhere counts as infinitely far.
inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}
// Mean |a - b|.
inline double mean_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double total = 0.0;
  for (size_t i = 0; i < a.size(); ++i) total += std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
  return total / static_cast<double>(a.size());
}

// Whether a fixture keeps matrices in bf16 (tools/make_golden.py names them by format: the bf16 and fp8 fixtures
// keep their non-quantized matrices in bf16, the f32 and exl3 ones in float32), which --dtype bfloat16 rounds.
inline bool has_bf16_matrices(const std::string& fixture) {
  return fixture.rfind("bf16", 0) == 0 || fixture.rfind("fp8", 0) == 0;
}

// One fixture's tokens through three sequences in batched passes (forward_batch), each pass mixing different kinds of
// call: `chunked` in uneven chunks (37, 5, 37, ...), `decoded` the reference's prefill then one-token steps, `whole`
// the whole sequence in the first pass and empty calls after. Their logits, all rows of each.
struct BatchedLogits {
  std::vector<float> chunked, decoded, whole;
};

inline BatchedLogits run_batched_sequences(Glm5NextModel& model, const GoldenFixture& fixture) {
  const std::span<const int32_t> tokens(fixture.tokens);
  const auto chunked = model.new_sequence(), decoded = model.new_sequence(), whole = model.new_sequence();
  BatchedLogits out;
  size_t chunked_next = 0, decoded_next = 0, chunk = 37;
  for (bool first = true; chunked_next < tokens.size() || decoded_next < tokens.size(); first = false) {
    const size_t chunked_count = std::min(chunk, tokens.size() - chunked_next);
    const size_t decoded_count = decoded_next < tokens.size() ? (first ? static_cast<size_t>(fixture.prefill) : 1) : 0;
    const std::vector<SequenceCall> calls = {{whole.get(), first ? tokens : tokens.first(0)},
                                             {chunked.get(), tokens.subspan(chunked_next, chunked_count)},
                                             {decoded.get(), tokens.subspan(decoded_next, decoded_count)}};
    const std::vector<std::vector<float>> logits = model.forward_batch(calls);
    out.whole.insert(out.whole.end(), logits[0].begin(), logits[0].end());
    out.chunked.insert(out.chunked.end(), logits[1].begin(), logits[1].end());
    out.decoded.insert(out.decoded.end(), logits[2].begin(), logits[2].end());
    chunked_next += chunked_count;
    decoded_next += decoded_count;
    chunk = chunk == 37 ? 5 : 37;
  }
  return out;
}

// Three sequences decoding in lockstep, the engine's steady state: the reference's prefill for each in one pass,
// then one token of each per pass (Glm5NextModel's batched decode-step ops). Each sequence's logits, all rows.
inline std::vector<std::vector<float>> run_lockstep_decoding(Glm5NextModel& model, const GoldenFixture& fixture) {
  const std::span<const int32_t> tokens(fixture.tokens);
  std::vector<std::unique_ptr<SequenceState>> sequences;
  for (int s = 0; s < 3; ++s) sequences.push_back(model.new_sequence());
  std::vector<std::vector<float>> out(sequences.size());
  for (size_t next = 0; next < tokens.size();) {
    const size_t count = next == 0 ? static_cast<size_t>(fixture.prefill) : 1;
    std::vector<SequenceCall> calls;
    for (const auto& sequence : sequences) calls.push_back({sequence.get(), tokens.subspan(next, count)});
    const std::vector<std::vector<float>> logits = model.forward_batch(calls);
    for (size_t s = 0; s < sequences.size(); ++s) out[s].insert(out[s].end(), logits[s].begin(), logits[s].end());
    next += count;
  }
  return out;
}

// Decoding with the tokens drawn on the backend (SequenceCall::draw): two sequences draw (one greedy, one at
// temperature 0.8 with top_p 0.9 and top_k 40) while two twins get their logits in the same passes, and the host draws
// from those (draw_token with the same u). Each pair: the backend's token, then the host's; every drawn call must
// come back without logits (`returned_logits` counts those that did not).
struct DrawnTokens {
  std::vector<std::pair<int32_t, int32_t>> pairs;
  int64_t returned_logits = 0;
};

inline DrawnTokens run_drawn_decoding(Glm5NextModel& model, const GoldenFixture& fixture) {
  const std::span<const int32_t> tokens(fixture.tokens);
  std::vector<std::unique_ptr<SequenceState>> sequences;
  for (int s = 0; s < 4; ++s) sequences.push_back(model.new_sequence());
  std::mt19937_64 rng(11);
  DrawnTokens out;
  for (size_t next = 0; next < tokens.size();) {
    const size_t count = next == 0 ? static_cast<size_t>(fixture.prefill) : 1;
    std::vector<BackendDraw> draws = {{.draw = TokenDraw{.temperature = 0.0f}},
                                      {.draw = TokenDraw{.temperature = 0.8f, .top_p = 0.9f, .top_k = 40,
                                                         .u = uniform_of(rng())}}};
    std::vector<SequenceCall> calls;
    for (size_t s = 0; s < sequences.size(); ++s) {
      calls.push_back({sequences[s].get(), tokens.subspan(next, count), true, s < 2 ? &draws[s] : nullptr});
    }
    std::vector<std::vector<float>> logits = model.forward_batch(calls, ForwardOptions{.all_logits = false});
    out.returned_logits += (logits[0].empty() ? 0 : 1) + (logits[1].empty() ? 0 : 1);
    for (size_t s = 0; s < 2; ++s) out.pairs.emplace_back(draws[s].token, draw_token(logits[s + 2], draws[s].draw));
    next += count;
  }
  return out;
}

}  // namespace kestrel::testing

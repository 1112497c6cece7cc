// `kestrel run` with text: a prompt through the chat template and the engine, streamed through the incremental
// detokenizer, equals the full decode of the engine's greedy tokens for the same rendered prompt; the chat form keeps
// the conversation (the second answer is the one for the whole history) and ends at /exit. Uses the serving fixture
// (tests/data/serve_model: a tiny glm5_next with a BPE tokenizer and GLM's chat template).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_core.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace kestrel {
namespace {

const std::string kModel = std::string(KESTREL_TEST_DATA) + "/serve_model";

struct Outcome {
  int status = -1;
  std::string out;
};

Outcome run_shell(const std::string& command) {
  Outcome outcome;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  std::array<char, 4096> buffer{};
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) outcome.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return outcome;
}

std::string kestrel_run(const std::string& args) {
  return std::string("'") + KESTREL_BINARY + "' run --model '" + kModel + "' " + args + " 2>/dev/null";
}

// What the CLI should print for each answer: the greedy continuation of the rendered conversation, decoded whole.
class Reference {
public:
  Reference()
      : model_(Glm5NextModel::load(kModel, backend_)),
        tokenizer_(text::Tokenizer::load(kModel + "/tokenizer.json")),
        template_(ChatTemplate::load(kModel)) {}

  std::string answer(const std::string& user, int64_t max_tokens) {
    messages_.push_back({{"role", "user"}, {"content", user}});
    const std::string rendered = template_.render_json(nlohmann::json{{"messages", messages_}}.dump());
    const std::vector<int32_t> prompt = tokenizer_->encode(rendered, {.add_special_tokens = false});

    struct Sink final : OutputSink {
      std::vector<int32_t> ids;
      void push(RequestOutput output) override {
        ids.insert(ids.end(), output.token_ids.begin(), output.token_ids.end());
      }
    };
    const auto sink = std::make_shared<Sink>();
    EngineCore core(*model_, EngineConfig{.max_num_seqs = 1,
                                          .eos_token_ids = model_eos_token_ids(kModel, model_->config())});
    core.add_request(1, prompt, SamplingParams{.temperature = 0.0f, .max_tokens = max_tokens}, "", sink);
    while (core.has_unfinished_requests()) core.step();
    const std::string reply = tokenizer_->decode(sink->ids, /*skip_special_tokens=*/true);
    messages_.push_back({{"role", "assistant"}, {"content", reply}});
    return reply;
  }

private:
  CpuBackend backend_;
  std::unique_ptr<Glm5NextModel> model_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  ChatTemplate template_;
  std::vector<nlohmann::json> messages_;
};

TEST(RunCommand, APromptIsAnsweredWithTheStreamedTextOfTheGreedyTokens) {
  if (!std::filesystem::exists(kModel + "/tokenizer.json")) GTEST_SKIP() << "no serving fixture at " << kModel;
  const Outcome outcome = run_shell(kestrel_run("-p 'Hello there' -n 12"));
  ASSERT_EQ(outcome.status, 0);
  Reference reference;
  const std::string expected = reference.answer("Hello there", 12);
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(outcome.out, expected + "\n");
}

TEST(RunCommand, ChatKeepsTheConversationAndEndsAtExit) {
  if (!std::filesystem::exists(kModel + "/tokenizer.json")) GTEST_SKIP() << "no serving fixture at " << kModel;
  const Outcome outcome =
      run_shell("printf 'Hello there\\n\\nWhat next?\\n/exit\\nnot read\\n' | " + kestrel_run("-n 10"));
  ASSERT_EQ(outcome.status, 0);
  Reference reference;
  const std::string first = reference.answer("Hello there", 10);
  const std::string second = reference.answer("What next?", 10);  // after the first exchange
  EXPECT_EQ(outcome.out, first + "\n" + second + "\n");

  Reference fresh;  // the same question without the history gets another prompt
  EXPECT_NE(second, fresh.answer("What next?", 10));
}

TEST(RunCommand, TokensAndPromptAreExclusive) {
  const Outcome outcome = run_shell(kestrel_run("-p hi --tokens 1,2"));
  EXPECT_NE(outcome.status, 0);
}

}  // namespace
}  // namespace kestrel

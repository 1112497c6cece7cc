// Chat templates against transformers: every request in tests/data/templates/requests.json rendered with each
// model directory under tests/data/templates/models must equal apply_chat_template's output byte for byte (or
// fail where transformers raised). Fixtures: tools/make_template_fixtures.py (jinja2 3.1.6, transformers 5.17).
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "template_fixtures.h"

namespace kestrel {
namespace {

using testing::read_fixture;
using testing::templates_dir;

const char* const kModels[] = {"glm53", "deepseek_r1_distill", "llama3", "phi3.5", "mistral_nemo", "hermes3_tool_use"};

class ChatTemplateFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatTemplateFixture, MatchesTransformersOnEveryRequest) {
  const std::string model = GetParam();
  const ChatTemplate chat_template = ChatTemplate::load(templates_dir() + "/models/" + model);
  const py::Value requests = read_fixture("requests.json");
  const py::Value expected = read_fixture("expected/" + model + ".json");
  ASSERT_GE(requests.list_ref().items.size(), 50u);
  int rendered = 0, raised = 0;
  for (const py::Value& item : requests.list_ref().items) {
    const std::string id = item.dict_ref().find("id")->str();
    const py::Value* want = expected.dict_ref().find(id);
    ASSERT_NE(want, nullptr) << id;
    if (want->is_string()) {
      std::string got;
      try {
        got = chat_template.render(*item.dict_ref().find("request"));
      } catch (const Error& e) {
        ADD_FAILURE() << model << "/" << id << ": unexpected error: " << e.what();
        continue;
      }
      EXPECT_EQ(got, want->str()) << model << "/" << id;
      ++rendered;
    } else {
      EXPECT_THROW(chat_template.render(*item.dict_ref().find("request")), Error)
          << model << "/" << id << " (transformers: " << want->dict_ref().find("error")->str() << ")";
      ++raised;
    }
  }
  RecordProperty("rendered", rendered);
  RecordProperty("raised", raised);
  EXPECT_GT(rendered, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, ChatTemplateFixture, ::testing::ValuesIn(kModels),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(ChatTemplate, RendersGlmCliRequestThroughTheBinary) {
  const std::string request_path = ::testing::TempDir() + "kestrel_render_request.json";
  {
    std::FILE* f = std::fopen(request_path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string body = R"({"messages":[{"role":"user","content":"Hi é"}],"chat_template_kwargs":{"enable_thinking":false}})";
    std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
  }
  const std::string cmd = std::string(KESTREL_BINARY) + " render --model " + templates_dir() + "/models/glm53 < " +
                          request_path;
  std::FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0);
  EXPECT_EQ(out, "[gMASK]<sop><|user|>Hi é<|assistant|><think></think>");
}

TEST(ChatTemplate, PicksNamedTemplatesAsTransformersDoes) {
  py::Dict special;
  ChatTemplate both({{"default", "D"}, {"tool_use", "T"}}, special);
  EXPECT_EQ(both.render_json(R"({"messages":[{"role":"user","content":"x"}]})"), "D");
  EXPECT_EQ(both.render_json(R"({"messages":[{"role":"user","content":"x"}],"tools":[]})"), "T");
  ChatTemplate no_default({{"a", "A"}, {"b", "B"}}, special);
  EXPECT_THROW(no_default.render_json(R"({"messages":[{"role":"user","content":"x"}]})"), Error);
}

TEST(ChatTemplate, RejectsMalformedRequests) {
  py::Dict special;
  ChatTemplate t({{"default", "{{ messages | length }}"}}, special);
  EXPECT_THROW(t.render_json("[]"), Error);
  EXPECT_THROW(t.render_json(R"({"messages":[]})"), Error);
  EXPECT_THROW(t.render_json(R"({"messages":"x"})"), Error);
  EXPECT_THROW(t.render_json(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":1}})"),
               Error);
  EXPECT_THROW(t.render_json("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"), Error);
  EXPECT_EQ(t.render_json(R"({"messages":[{"role":"user","content":"x"}]})"), "1");
}

TEST(ChatTemplate, MissingTemplateNamesTheDirectory) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "kestrel_no_template";
  std::filesystem::create_directories(dir);
  try {
    ChatTemplate::load(dir);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kestrel_no_template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, DeeplyNestedAndHugeRequestsDoNotCrash) {
  py::Dict special;
  ChatTemplate t({{"default", "{% for m in messages %}{{ m.content | length }}{{ m | tojson | length }}{% endfor %}"}},
                 special);
  std::string deep = R"({"messages":[{"role":"user","content":"x","extra":)";
  for (int i = 0; i < 100000; ++i) deep += "[";
  EXPECT_THROW(t.render_json(deep), Error);
  const std::string big(1 << 20, 'a');
  // content length, then len(json.dumps(message)) = len('{"role": "user", "content": ""}') + 2^20.
  EXPECT_EQ(t.render_json(R"({"messages":[{"role":"user","content":")" + big + R"("}]})"),
            std::to_string(1 << 20) + std::to_string((1 << 20) + 31));
}

}  // namespace
}  // namespace kestrel

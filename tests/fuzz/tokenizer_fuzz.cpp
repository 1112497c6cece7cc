// libFuzzer target for the tokenizer: arbitrary bytes are encoded (invalid UTF-8 must be an Error, never a crash) by
// fixture tokenizers of every family, the ids decoded and streamed through the detokenizer; the first byte also
// picks random ids to decode. Input beginning with "{" is additionally loaded as a tokenizer.json.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

#ifndef KESTREL_TEST_DATA
#define KESTREL_TEST_DATA "tests/data"
#endif

namespace {

const std::vector<std::unique_ptr<kestrel::text::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<kestrel::text::Tokenizer>> out;
    for (const char* name : {"glm_bpe", "gen_metaspace", "gen_misc", "gen_bytefallback", "llama_spm"}) {
      out.push_back(kestrel::text::Tokenizer::load(std::string(KESTREL_TEST_DATA) + "/tokenizers/" + name +
                                                   "/tokenizer.json"));
    }
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& tok : tokenizers()) {
    try {
      const std::vector<int32_t> ids = tok->encode(text);
      const std::string decoded = tok->decode(ids);
      kestrel::text::Detokenizer stream(*tok);
      std::string streamed;
      for (const int32_t id : ids) streamed += stream.feed(id);
      streamed += stream.finish();
      if (streamed != decoded) __builtin_trap();
    } catch (const kestrel::Error&) {
    }
    // Arbitrary ids (also unknown ones) decode without crashing.
    std::vector<int32_t> random_ids;
    for (size_t i = 0; i + 1 < size && i < 64; i += 2) {
      random_ids.push_back(static_cast<int32_t>((data[i] << 8 | data[i + 1]) % (tok->vocab_size() + 8)));
    }
    (void)tok->decode(random_ids, size % 2 == 0);
  }
  if (!text.empty() && text[0] == '{') {
    try {
      (void)kestrel::text::Tokenizer::from_json(text, "fuzz.json");
    } catch (const kestrel::Error&) {
    }
  }
  return 0;
}

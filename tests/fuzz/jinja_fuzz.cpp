// libFuzzer target: parse and render arbitrary template text with a fixed chat-like context. Any input must end in
// a rendered string or a kestrel::Error; crashes, sanitizer reports, hangs and stack overflows are bugs.
// Build (clang, from the repository root; sources listed explicitly so the target needs no CMake):
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/jinja_fuzz.cpp \
//     src/base/py_value.cpp src/base/py_strings.cpp src/base/python_json.cpp src/text/jinja*.cpp \
//     -lfmt -lutf8proc -o jinja_fuzz
//   ./jinja_fuzz -max_total_time=60 -timeout=10 -rss_limit_mb=2048 tests/fuzz/corpus/jinja
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "base/python_json.h"
#include "text/jinja.h"

namespace {

const kestrel::py::Value& context() {
  static const kestrel::py::Value value = kestrel::py::parse_json(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi é 😀"},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false
  })");
  return value;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  kestrel::jinja::Options options;
  options.max_steps = 200000;             // keep each input fast
  options.max_output_bytes = 1u << 20;    // and small
  try {
    const kestrel::jinja::Template t(source, options);
    (void)t.render(context().dict_ref());
  } catch (const kestrel::Error&) {
  }
  return 0;
}

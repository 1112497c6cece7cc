#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include "base/error.h"
#include "text/unicode.h"

namespace kestrel::text {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(std::string_view pattern, const std::string& what) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  require(!find_invalid_utf8(pattern), "{}: the regular expression is not valid UTF-8", what);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &error_code, &error_offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail("{}: invalid regular expression '{}': {} at offset {}", what, pattern, reinterpret_cast<const char*>(message),
         error_offset);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  require(data != nullptr, "out of memory for a regular expression match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                                data.get(), nullptr)
                              : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(),
                                            nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail("regular expression '{}' failed on the input: {}", pattern_, reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t b = ovector[0], e = ovector[1];
    if (b == e && have_last && last_end == e) {
      if (start >= text.size()) break;
      start += utf8_length(static_cast<unsigned char>(text[start]));
      continue;
    }
    start = e;
    have_last = true;
    last_end = e;
    matches.emplace_back(b, e);
  }
  return matches;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace kestrel::text

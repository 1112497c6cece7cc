// A compiled regular expression for tokenizer patterns: PCRE2 in UTF + UCP mode (so \p{L}, \s, \w are Unicode-aware
// and look-around works), JIT-compiled when the platform allows. Thread-safe: each search uses its own match data.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kestrel::text {

class Regex {
public:
  // Throws Error "<what>: invalid regular expression ...: <reason> at offset N" when `pattern` does not compile.
  Regex(std::string_view pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match in `text` (valid UTF-8) as [begin, end) byte ranges, left to right, with the iteration rules of the
  // Oniguruma binding HF tokenizers uses: an empty match right where the previous match ended is skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

// `literal` with every regex metacharacter escaped.
std::string regex_escape(std::string_view literal);

}  // namespace kestrel::text

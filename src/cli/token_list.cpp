#include "cli/token_list.h"

#include <charconv>
#include <limits>

#include "base/error.h"

namespace kestrel::cli {

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> tokens;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    require(!item.empty() && ec == std::errc() && ptr == item.data() + item.size(),
            "--tokens: '{}' is not an integer token id", item);
    require(value >= 0 && value <= std::numeric_limits<int32_t>::max(), "--tokens: {} is out of range", value);
    tokens.push_back(static_cast<int32_t>(value));
    begin = end + 1;
  }
  return tokens;
}

}  // namespace kestrel::cli

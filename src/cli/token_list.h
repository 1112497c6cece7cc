// Parsing of comma-separated token id lists given on the command line ("5,17,42").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel::cli {

// Throws Error on an empty list, a non-integer entry or a value outside int32.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace kestrel::cli

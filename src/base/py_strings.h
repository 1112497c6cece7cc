// Python str semantics over UTF-8 std::string: code point indexing, case mapping, strip/split, isprintable.
// Strings that are not valid UTF-8 are decoded with each invalid byte as U+FFFD (they cannot come from JSON input
// or from a template the engine accepted, both of which are validated).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::py {

std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t cp);
bool utf8_valid(std::string_view s);
size_t utf8_length(std::string_view s);  // code points
bool is_ascii(std::string_view s);

bool is_space(char32_t c);       // str.isspace for one code point
bool is_printable(char32_t c);   // str.isprintable for one code point
bool is_alpha(char32_t c);
bool is_digit(char32_t c);       // str.isdigit (Nd plus digits with a numeric digit value; approximated by Nd/No)
bool is_decimal(char32_t c);
bool is_alnum(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_cased(char32_t c);

std::string str_upper(std::string_view s);
std::string str_lower(std::string_view s);
std::string str_title(std::string_view s);       // str.title()
std::string str_capitalize(std::string_view s);  // str.capitalize()
std::string str_swapcase(std::string_view s);

// strip/lstrip/rstrip: chars unset means whitespace.
std::string str_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// split/rsplit: sep unset means runs of whitespace. maxsplit < 0: no limit. Throws Error on an empty separator.
std::vector<std::string> str_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> str_rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> str_splitlines(std::string_view s, bool keepends);
std::string str_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
int64_t str_count(std::string_view s, std::string_view sub);
// find/rfind/index in code points over [start, end) (Python slice-normalised); -1 when absent.
int64_t str_find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
                 bool reverse);

}  // namespace kestrel::py

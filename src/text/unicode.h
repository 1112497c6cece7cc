// Unicode helpers for the tokenizer: UTF-8 validation and iteration, the character classes HF `tokenizers` (Rust)
// uses, case mapping and normalization forms (utf8proc), GPT-2's byte <-> character map, lossy UTF-8 decoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kestrel::text {

// Byte offset of the first invalid UTF-8 sequence in `s` (overlong forms, surrogates and code points above
// U+10FFFF are invalid, as for Rust's str), or nullopt when `s` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for a stray continuation byte).
inline size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at s[pos] of a valid UTF-8 string and advances pos.
char32_t next_code_point(std::string_view s, size_t& pos);
void append_utf8(std::string& out, char32_t cp);

// Character classes as Rust defines them.
bool is_rust_whitespace(char32_t cp);  // char::is_whitespace (White_Space)
bool is_rust_numeric(char32_t cp);     // char::is_numeric (Nd, Nl, No)
bool is_regex_word(char32_t cp);       // regex crate's Unicode \w (Alphabetic, M, Nd, Pc, Join_Control)
bool is_punctuation(char32_t cp);      // tokenizers' is_punc: ASCII punctuation or a P* category

// Rust's char::to_lowercase applied to every character (full mapping: U+0130 becomes "i\u0307").
std::string lowercase(std::string_view s);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

// GPT-2's reversible map from the 256 byte values to printable characters, and its inverse (-1: not a byte char).
const std::string& byte_to_char_utf8(uint8_t byte);
int char_to_byte(char32_t cp);

// Rust's String::from_utf8_lossy: every maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// True when `s` ends inside an incomplete (but so far valid) UTF-8 sequence.
bool ends_with_incomplete_utf8(std::string_view s);

}  // namespace kestrel::text

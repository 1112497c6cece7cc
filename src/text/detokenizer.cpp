#include "text/detokenizer.h"

namespace kestrel::text {

namespace {

bool ends_with_replacement(const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0; }

}  // namespace

std::string Detokenizer::decode_range(size_t begin, size_t end) const {
  const std::vector<int32_t> window(ids_.begin() + static_cast<std::ptrdiff_t>(begin),
                                    ids_.begin() + static_cast<std::ptrdiff_t>(end));
  return tokenizer_.decode(window, skip_special_);
}

std::string Detokenizer::feed(int32_t id) {
  ids_.push_back(id);
  // An open byte-fallback group can still turn into U+FFFDs: wait for the token that closes it.
  if (tokenizer_.groups_byte_tokens() && tokenizer_.is_byte_token(id) && !(skip_special_ && tokenizer_.is_special(id))) {
    return {};
  }
  const std::string before = decode_range(prefix_, read_);
  const std::string now = decode_range(prefix_, ids_.size());
  // Hold back while the text ends in an incomplete character or the window's text is not an extension of what was
  // emitted (a later id can still change how the earlier ones decode).
  if (now.size() <= before.size() || ends_with_replacement(now) || now.compare(0, before.size(), before) != 0) {
    return {};
  }
  std::string delta = now.substr(before.size());
  prefix_ = read_;
  read_ = ids_.size();
  return delta;
}

std::string Detokenizer::finish() {
  const std::string before = decode_range(prefix_, read_);
  const std::string now = decode_range(prefix_, ids_.size());
  prefix_ = read_ = ids_.size();
  if (now.size() > before.size() && now.compare(0, before.size(), before) == 0) return now.substr(before.size());
  return {};
}

}  // namespace kestrel::text

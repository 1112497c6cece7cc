// Streaming detokenizer: feed generated ids one at a time, get text deltas. A delta never ends inside a UTF-8
// sequence (incomplete bytes — which the decoders show as U+FFFD — are held back until the next ids complete them),
// and after finish() the concatenation of all deltas equals Tokenizer::decode of all ids.
//
// Method (as HF text-generation-inference / vLLM): decode a short window of ids from `prefix_` and compare it with
// the decode of the same window without the ids not yet emitted; the window restarts at the last emitted boundary,
// so the cost per id is bounded by the window, not by the length of the sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace kestrel::text {

class Detokenizer {
public:
  explicit Detokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  // Appends `id` and returns the text that became final (possibly empty).
  std::string feed(int32_t id);
  // Returns what is still held back (an incomplete UTF-8 tail becomes U+FFFD, as in a full decode).
  std::string finish();

  const std::vector<int32_t>& ids() const { return ids_; }

private:
  std::string decode_range(size_t begin, size_t end) const;

  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;  // start of the decode window
  size_t read_ = 0;    // ids before this are emitted
};

}  // namespace kestrel::text

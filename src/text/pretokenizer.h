// Pre-tokenizers of HF tokenizer.json ("pre_tokenizer"): Split, ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Punctuation, Sequence. A pre-tokenizer cuts the pieces of a text into smaller pieces (and may
// rewrite them, as ByteLevel and Metaspace do); the model then encodes each piece on its own.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kestrel::text {

struct Piece {
  std::string text;
  // How many leading bytes of `text` come from the first character of the original input (HF alignments: a
  // normalizer can expand that character, e.g. NFKC "½" → "1⁄2"); a piece with origin_span > 0 starts at original
  // offset 0, which is what Metaspace's prepend_scheme "first" looks at.
  size_t origin_span = 0;
};

class PreTokenizer {
public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

// Builds the pre-tokenizer described by `config`; `where` names the file and JSON path for errors. null → nullptr.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config, const std::string& where);

}  // namespace kestrel::text

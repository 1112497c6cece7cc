// Normalizers of HF tokenizer.json ("normalizer"): NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace (string or regex),
// Prepend, Sequence. Each maps a string to its normalized form; HF also tracks alignments, which ids do not need.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace kestrel::text {

class Normalizer {
public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;
};

// Builds the normalizer described by `config` (a JSON object with "type"); `where` names the file and JSON path for
// errors. A null config gives nullptr (no normalization).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& where);

}  // namespace kestrel::text

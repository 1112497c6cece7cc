// Decoders of HF tokenizer.json ("decoder"): ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.
// A decoder maps the token strings of a decode call to strings that are concatenated into the text.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kestrel::text {

class Decoder {
public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// Builds the decoder described by `config`; `where` names the file and JSON path for errors. null → nullptr.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& where);

}  // namespace kestrel::text

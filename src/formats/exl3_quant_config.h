// The metadata exllamav3 writes next to an EXL3 checkpoint (shared/docs/exl3-format.md §1.3-1.4): the
// `quantization_config` object of config.json, and `quantization_config.json` = that object plus "tensor_storage",
// a ledger of every stored tensor grouped by module (the tensor name without its last component).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/exl3_codec.h"

namespace kestrel::exl3 {

struct QuantizationSummary {
  double bits = 0;  // average K over the quantized linears
  Codebook codebook = Codebook::mcg;
  int64_t calibration_rows = 0, calibration_cols = 0;
  std::string version;              // the producer, e.g. "kestrel 0.1.0"
  nlohmann::ordered_json original;  // the source's quantization_config (e.g. fp8), or null
};

// The config.json `quantization_config` object.
nlohmann::ordered_json quantization_config(const QuantizationSummary& summary);

struct StoredTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  int32_t marker = 0;  // value of a `.mcg` / `.mul1` scalar, for the ledger's multiplier entry
};

// quantization_config.json: the config object plus "tensor_storage".
nlohmann::ordered_json quantization_config_file(const QuantizationSummary& summary,
                                                const std::vector<StoredTensor>& tensors);

// PyTorch's spelling of a dtype in the ledger ("torch.int16", "torch.bfloat16", ...).
std::string torch_dtype_name(DType dtype);

}  // namespace kestrel::exl3

#include "formats/exl3_quant_config.h"

#include <map>

namespace kestrel::exl3 {

std::string torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "torch.float64";
    case DType::f32:
      return "torch.float32";
    case DType::f16:
      return "torch.float16";
    case DType::bf16:
      return "torch.bfloat16";
    case DType::f8_e4m3:
      return "torch.float8_e4m3fn";
    case DType::f8_e5m2:
      return "torch.float8_e5m2";
    case DType::i64:
      return "torch.int64";
    case DType::i32:
      return "torch.int32";
    case DType::i16:
      return "torch.int16";
    case DType::i8:
      return "torch.int8";
    case DType::u8:
      return "torch.uint8";
    case DType::boolean:
      return "torch.bool";
  }
  return "unknown";
}

nlohmann::ordered_json quantization_config(const QuantizationSummary& summary) {
  nlohmann::ordered_json config = {
      {"quant_method", "exl3"},
      {"version", summary.version},
      {"bits", summary.bits},
      {"head_bits", 16},  // lm_head stays unquantized
      {"calibration", {{"rows", summary.calibration_rows}, {"cols", summary.calibration_cols}}},
      {"out_scales", "always"},
      {"codebook", std::string(codebook_name(summary.codebook))},
  };
  if (!summary.original.is_null()) config["original_quantization_config"] = summary.original;
  return config;
}

nlohmann::ordered_json quantization_config_file(const QuantizationSummary& summary,
                                                const std::vector<StoredTensor>& tensors) {
  nlohmann::ordered_json file = quantization_config(summary);
  std::map<std::string, nlohmann::ordered_json> modules;
  for (const StoredTensor& tensor : tensors) {
    const size_t dot = tensor.name.rfind('.');
    const std::string module = dot == std::string::npos ? tensor.name : tensor.name.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? tensor.name : tensor.name.substr(dot + 1);
    nlohmann::ordered_json& entry = modules[module];
    entry["stored_tensors"][tensor.name] = {
        {"shape", tensor.shape}, {"n_bytes", tensor.nbytes}, {"dtype", torch_dtype_name(tensor.dtype)}};
    if (leaf == "trellis") {
      entry["quant_format"] = "exl3";
      entry["bits_per_weight"] = tensor.shape.back() / 16;
    } else if (leaf == "mcg" || leaf == "mul1") {
      entry[leaf + "_multiplier"] = static_cast<uint32_t>(tensor.marker);
    }
  }
  nlohmann::ordered_json storage = nlohmann::ordered_json::object();
  for (auto& [module, entry] : modules) storage[module] = std::move(entry);
  file["tensor_storage"] = std::move(storage);
  return file;
}

}  // namespace kestrel::exl3

// Element types of checkpoint tensors, named as safetensors names them.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace kestrel {

enum class DType { f64, f32, f16, bf16, f8_e4m3, f8_e5m2, i64, i32, i16, i8, u8, boolean };

std::string_view dtype_name(DType dtype);  // "F32", "BF16", "F8_E4M3", ...
size_t dtype_size(DType dtype);            // bytes per element
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace kestrel

// Names and element sizes of the safetensors dtypes.
#include "formats/dtype.h"

#include <array>

namespace kestrel {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

// Indexed by the enum's value, so the order must match the declaration in dtype.h.
constexpr std::array<DTypeInfo, 12> kDTypes = {{
    {DType::f64, "F64", 8},
    {DType::f32, "F32", 4},
    {DType::f16, "F16", 2},
    {DType::bf16, "BF16", 2},
    {DType::f8_e4m3, "F8_E4M3", 1},
    {DType::f8_e5m2, "F8_E5M2", 1},
    {DType::i64, "I64", 8},
    {DType::i32, "I32", 4},
    {DType::i16, "I16", 2},
    {DType::i8, "I8", 1},
    {DType::u8, "U8", 1},
    {DType::boolean, "BOOL", 1},
}};

constexpr bool table_matches_enum() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_matches_enum(), "kDTypes must list the DType values in declaration order");

}  // namespace

std::string_view dtype_name(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

size_t dtype_size(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace kestrel

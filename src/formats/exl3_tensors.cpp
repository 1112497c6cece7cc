#include "formats/exl3_tensors.h"

#include <fmt/format.h>

#include <cstring>

#include "base/error.h"

namespace kestrel {

namespace {

int64_t padded(int64_t n) { return (n + exl3::kHadamardBlock - 1) / exl3::kHadamardBlock * exl3::kHadamardBlock; }

}  // namespace

Exl3Tensors read_exl3_tensors(const TensorLookup& find, const std::string& module, int64_t out_features,
                              int64_t in_features) {
  Exl3Tensors t;
  t.trellis = find(module + ".trellis");
  require(t.trellis != nullptr, "tensor '{}.trellis' is missing", module);
  const TensorView& trellis = *t.trellis;
  const std::vector<int64_t>& shape = trellis.shape;
  const bool known = out_features > 0 && in_features > 0;
  const int64_t last = shape.size() == 3 ? shape[2] : 0;
  t.bits = static_cast<int>(last / 16);
  t.in_padded = known ? padded(in_features) : (shape.size() == 3 ? shape[0] * 16 : 0);
  t.out_padded = known ? padded(out_features) : (shape.size() == 3 ? shape[1] * 16 : 0);
  if (trellis.dtype != DType::i16 || shape.size() != 3 || shape[0] * 16 != t.in_padded ||
      shape[1] * 16 != t.out_padded || t.in_padded % exl3::kHadamardBlock != 0 ||
      t.out_padded % exl3::kHadamardBlock != 0 || t.in_padded == 0 || t.out_padded == 0 || last % 16 != 0 ||
      t.bits < exl3::kMinBits || t.bits > exl3::kMaxBits) {
    const std::string expected =
        known ? fmt::format("the EXL3 form of a [{}, {}] linear is I16 [{}, {}, 16*K]", out_features, in_features,
                            t.in_padded / 16, t.out_padded / 16)
              : std::string("an EXL3 trellis is I16 [k/16, n/16, 16*K] with k, n multiples of 128");
    fail("{}: tensor '{}' is {} {}; {} with K in 1..8", *trellis.path, trellis.name, dtype_name(trellis.dtype),
         trellis.shape_string(), expected);
  }
  if (find(module + ".su") || find(module + ".sv")) {
    fail("{}: module '{}' uses packed sign vectors (su/sv) of early exllamav3 releases, which Kestrel does not read; "
         "re-quantize it",
         *trellis.path, module);
  }
  const auto half_vector = [&](const std::string& suffix, int64_t size) {
    const TensorView* view = find(module + suffix);
    if (!view) fail("{}: tensor '{}{}' is missing (an EXL3 module has trellis, suh and svh)", *trellis.path, module, suffix);
    if (view->dtype != DType::f16 || view->shape != std::vector<int64_t>{size}) {
      fail("{}: tensor '{}' is {} {}; EXL3 sign/scale vectors are F16 [{}]", *view->path, view->name,
           dtype_name(view->dtype), view->shape_string(), size);
    }
    return view;
  };
  t.suh = half_vector(".suh", t.in_padded);
  t.svh = half_vector(".svh", t.out_padded);

  const TensorView* mcg = find(module + ".mcg");
  const TensorView* mul1 = find(module + ".mul1");
  if (mcg && mul1) fail("{}: module '{}' has both the mcg and the mul1 codebook marker", *trellis.path, module);
  if (mcg || mul1) {
    const TensorView& marker = mcg ? *mcg : *mul1;
    const uint32_t expected = mcg ? exl3::kMcgMultiplier : exl3::kMul1Multiplier;
    const bool scalar = marker.dtype == DType::i32 && marker.shape.empty();
    uint32_t value = 0;
    if (scalar) std::memcpy(&value, marker.data, 4);
    if (!scalar || value != expected) {
      fail("{}: codebook marker '{}' must be an I32 scalar holding {:#010x} (the multiplier exllamav3 locked); it is "
           "{} {}{}",
           *marker.path, marker.name, expected, dtype_name(marker.dtype), marker.shape_string(),
           scalar ? fmt::format(" = {:#010x}", value) : std::string());
    }
    t.marker = &marker;
    t.codebook = mcg ? exl3::Codebook::mcg : exl3::Codebook::mul1;
  }
  return t;
}

}  // namespace kestrel

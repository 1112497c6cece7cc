#include "backend/product_input.h"

#include "base/error.h"

namespace kestrel {

ProductInput parse_dtype(std::string_view flag) {
  if (flag == "auto" || flag == "float32" || flag == "float") return ProductInput::float32;
  if (flag == "bfloat16") return ProductInput::bf16;
  fail("--dtype {} is not supported (choose auto, float32, float or bfloat16: the checkpoint's matrices are bf16, "
       "so float16 activations would lose range they need)", flag);
}

std::string_view product_input_name(ProductInput input) {
  return input == ProductInput::bf16 ? "bfloat16" : "float32";
}

}  // namespace kestrel

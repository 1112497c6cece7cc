// What a product with bf16 weights (Backend::linear, linears, swiglu_linear) takes as its input: the float32
// activations as they are (the reference's math: a GPU splits them into bf16 terms that carry float32's precision),
// or rounded to bf16 first, to nearest even (`--dtype bfloat16`, as vLLM's bf16 activations: one tensor-core pass on
// a GPU where the exact input takes two or three). Norms, the residual streams and the mHC mixes (fn's product: the
// reference's and vLLM's are float32), the KDA state, attention and the EXL3 experts are the same either way.
#pragma once

#include <string_view>

namespace kestrel {

enum class ProductInput { float32, bf16 };

// vLLM's --dtype names: auto (float32 here: the reference's math), float32 / float, bfloat16. half / float16 and
// anything else throw an Error naming the choices.
ProductInput parse_dtype(std::string_view flag);
std::string_view product_input_name(ProductInput input);

}  // namespace kestrel

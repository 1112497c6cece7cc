// The options of the commands that run the model, with vLLM's names: --device (`auto` picks the GPU when the binary
// has the CUDA backend and the machine a CUDA device, else the CPU; `cpu` and `cuda` insist), --dtype and
// --kv-cache-dtype.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/backend.h"

namespace kestrel::cli {

void add_device_option(CLI::App* cmd, std::string& device);
// The value is checked when the command runs (parse_kv_cache_dtype), so that its Error names the choices.
void add_kv_cache_dtype_option(CLI::App* cmd, std::string& kv_cache_dtype);
// --dtype (vLLM's name): what the products with bf16 weights take as input; checked when the command runs
// (parse_dtype), so that its Error names the choices.
void add_dtype_option(CLI::App* cmd, std::string& dtype);
// Throws Error for `cuda` on a binary built without CUDA or a machine without a GPU.
std::unique_ptr<Backend> make_backend(const std::string& device, ProductInput input);

}  // namespace kestrel::cli

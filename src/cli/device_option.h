// The --device option of the commands that run the model (vLLM's name): `auto` picks the GPU when the binary has
// the CUDA backend and the machine a CUDA device, else the CPU; `cpu` and `cuda` insist.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/backend.h"

namespace kestrel::cli {

void add_device_option(CLI::App* cmd, std::string& device);
// Throws Error for `cuda` on a binary built without CUDA or a machine without a GPU.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace kestrel::cli

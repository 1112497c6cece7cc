// `kestrel quantize-bench` (hidden): the EXL3 quantizer's throughput on one random linear of a given shape, with or
// without a Hessian, for docs/benchmarks/exl3_quantizer.md. Registered by add_quantize_command.
#pragma once

#include "cli/commands.h"

namespace kestrel::cli {

Action add_quantize_bench_command(CLI::App& app);

}  // namespace kestrel::cli

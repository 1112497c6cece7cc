// The `kestrel` subcommands. Each registers its flags on the CLI11 app and returns the action to run when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kestrel::cli {

using Action = std::function<int()>;

Action add_logits_command(CLI::App& app);
Action add_run_command(CLI::App& app);
Action add_render_command(CLI::App& app);
Action add_tokenize_command(CLI::App& app);
Action add_detokenize_command(CLI::App& app);
Action add_exl3_command(CLI::App& app);
Action add_quantize_command(CLI::App& app);
Action add_serve_command(CLI::App& app);
Action add_bench_command(CLI::App& app);

}  // namespace kestrel::cli

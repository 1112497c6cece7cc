// kestrel: the command-line entry point. Errors in the input are printed as one line and exit with status 1.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "base/error.h"
#include "base/process_memory.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  kestrel::keep_freed_memory();  // before any thread starts
  CLI::App app{"Kestrel: a native inference server for GLM-5.3-Flash"};
  app.require_subcommand(1);
  const kestrel::cli::Action actions[] = {kestrel::cli::add_logits_command(app), kestrel::cli::add_run_command(app),
                                            kestrel::cli::add_render_command(app),
                                            kestrel::cli::add_tokenize_command(app),
                                            kestrel::cli::add_detokenize_command(app),
                                            kestrel::cli::add_exl3_command(app),
                                            kestrel::cli::add_quantize_command(app),
                                            kestrel::cli::add_serve_command(app),
                                            kestrel::cli::add_bench_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const auto& action : actions) {
      if (const int status = action(); status >= 0) return status;
    }
  } catch (const kestrel::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}

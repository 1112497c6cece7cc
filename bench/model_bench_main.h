// The entry point of the benches that run one model on the GPU: `NAME MODEL_DIR [steps]`, a CUDA device required,
// errors printed under the program's name.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "backend/cuda/device_runtime.h"

namespace kestrel::cuda {

template <typename Run>
int model_bench_main(int argc, char** argv, const char* name, int default_steps, Run run) {
  try {
    if (argc < 2) {
      std::fprintf(stderr, "usage: %s MODEL_DIR [steps]\n", name);
      return 2;
    }
    if (device_count() == 0) {
      std::fprintf(stderr, "%s: no CUDA device\n", name);
      return 1;
    }
    return run(std::string(argv[1]), argc > 2 ? std::max(1, std::atoi(argv[2])) : default_steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace kestrel::cuda

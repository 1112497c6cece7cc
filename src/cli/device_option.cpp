#include "cli/device_option.h"

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "base/log.h"
#ifdef KESTREL_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_runtime.h"
#endif

namespace kestrel::cli {

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "Where the model runs: auto (a GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
}

void add_kv_cache_dtype_option(CLI::App* cmd, std::string& kv_cache_dtype) {
  cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "The MLA latents' cache rows: auto (float32), bfloat16, or fp8 (fp8_e4m3, fp8_ds_mla: e4m3 with a "
                  "scale per 128 values)")
      ->capture_default_str();
}

void add_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--dtype", dtype,
                  "The input of the products with bf16 weights: auto (float32: the reference's math), float32, or "
                  "bfloat16 (rounded first, as vLLM's bf16 activations: faster prefill on a GPU)")
      ->capture_default_str();
}

namespace {

std::unique_ptr<Backend> backend_for(const std::string& device) {
#ifdef KESTREL_WITH_CUDA
  const int gpus = cuda::device_count();
  if (device == "cuda" || (device == "auto" && gpus > 0)) {
    require(gpus > 0, "--device cuda: no CUDA device is visible (driver missing, or CUDA_VISIBLE_DEVICES empty)");
    return std::make_unique<cuda::CudaBackend>(0);
  }
#else
  require(device != "cuda", "--device cuda: this kestrel was built without the CUDA backend (KESTREL_CUDA=OFF or "
                            "no nvcc at build time)");
#endif
  log_info("device: cpu");
  return std::make_unique<CpuBackend>();
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& device, ProductInput input) {
  std::unique_ptr<Backend> backend = backend_for(device);
  backend->set_product_input(input);
  log_info("products of bf16 matrices take {} inputs (--dtype)", product_input_name(input));
  return backend;
}

}  // namespace kestrel::cli

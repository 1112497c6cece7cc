// `kestrel logits`: the model's float32 logits for a token sequence, written as NumPy .npy [T, vocab]. With --prefill N
// the first N tokens are one forward and the rest are decoded one at a time through the caches.
#include <memory>
#include <optional>

#include "base/error.h"
#include "base/npy.h"
#include "cli/commands.h"
#include "cli/device_option.h"
#include "cli/token_list.h"
#include "model/glm5_next.h"

namespace kestrel::cli {

Action add_logits_command(CLI::App& app) {
  struct Options {
    std::string model, tokens, out, device = "auto", kv_cache_dtype = "auto", dtype = "auto";
    std::optional<int64_t> prefill;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("logits", "Write the logits of a token sequence as .npy [T, vocab]");
  cmd->add_option("--model", options->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("--tokens", options->tokens, "Comma-separated token ids, e.g. 5,17,42")->required();
  cmd->add_option("--prefill", options->prefill,
                  "Forward the first N tokens at once, then the rest one at a time (default: all at once)");
  cmd->add_option("--out", options->out, "Output .npy file")->required();
  add_device_option(cmd, options->device);
  add_kv_cache_dtype_option(cmd, options->kv_cache_dtype);
  add_dtype_option(cmd, options->dtype);
  return [cmd, options]() -> int {
    if (!cmd->parsed()) return -1;
    const std::vector<int32_t> tokens = parse_token_list(options->tokens);
    const auto T = static_cast<int64_t>(tokens.size());
    const int64_t prefill = options->prefill.value_or(T);
    require(prefill >= 1 && prefill <= T, "--prefill {} must be between 1 and the number of tokens ({})", prefill, T);
    const CacheDtype kv_cache_dtype = parse_kv_cache_dtype(options->kv_cache_dtype);
    const ProductInput product_input = parse_dtype(options->dtype);

    const auto backend = make_backend(options->device, product_input);
    const auto model = Glm5NextModel::load(options->model, *backend, kv_cache_dtype);
    const auto sequence = model->new_sequence();
    const int64_t vocab = model->config().vocab_size;
    std::vector<float> logits = model->forward(*sequence, std::span(tokens).first(static_cast<size_t>(prefill)));
    for (int64_t t = prefill; t < T; ++t) {
      const std::vector<float> step = model->forward(*sequence, std::span(tokens).subspan(static_cast<size_t>(t), 1));
      logits.insert(logits.end(), step.begin(), step.end());
    }
    write_npy_f32(options->out, {T, vocab}, logits.data());
    return 0;
  };
}

}  // namespace kestrel::cli

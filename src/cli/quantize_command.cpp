// `kestrel quantize`: converts a BF16 / FP8 / F32 glm5_next checkpoint to EXL3 the way exllamav3's convert does for
// the routed experts (shared/docs/exl3-format.md §1, §4). Each expert's gate_proj / up_proj / down_proj becomes
// `<module>.trellis` / `.suh` / `.svh` (+ `.mcg` or `.mul1`); every other tensor is copied byte for byte (FP8 weights
// keep their weight_scale_inv). Hessians come from calibration text run through our own forward on the CPU; without
// calibration, or for an expert no calibration token was routed to, a module is quantized uncalibrated (exllamav3's
// fallback). config.json gains `quantization_config`, quantization_config.json is written, and every non-weight file
// (tokenizer, chat template, generation config, ...) is copied.
//
// Only `--modules experts` is offered: attention and dense linears would need observers on every other projection
// and the loader's EXL3 binding for them, for a small share of the weights.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <span>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/linear_weight.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/quantize_bench_command.h"
#include "formats/checkpoint.h"
#include "formats/exl3_quant_config.h"
#include "formats/exl3_quantizer.h"
#include "formats/glm5_next_config.h"
#include "formats/safetensors_writer.h"
#include "model/exl3_calibration.h"
#include "model/glm5_next.h"
#include "text/regex.h"
#include "text/tokenizer.h"

namespace kestrel::cli {

namespace {

namespace fs = std::filesystem;

struct QuantizeOptions {
  std::string model, out, codebook = "mcg", modules = "experts", only, calibration, max_shard_size = "5GB";
  int bits = 4;
  int64_t calibration_rows = 250, calibration_cols = 2048;
  uint64_t seed = 0;
  int threads = 0;
  bool force = false;
};

// "5GB", "300KB", "1048576": bytes, decimal units as save_pretrained's max_shard_size.
uint64_t parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) ++digits;
  require(digits > 0 && digits <= 15, "--max-shard-size {}: expected a number of bytes, optionally with KB/MB/GB",
          text);
  const uint64_t value = std::stoull(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  const std::map<std::string, uint64_t> units = {
      {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}};
  const auto at = units.find(unit);
  require(at != units.end() && value > 0, "--max-shard-size {}: expected a positive size like 5GB or 300KB", text);
  return value * at->second;
}

// "...mlp.experts.<E>.{gate,up,down}_proj.weight" -> the module name, else nothing.
std::optional<std::string> routed_expert_module(const std::string& name) {
  const std::string suffix = ".weight";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string module = name.substr(0, name.size() - suffix.size());
  const size_t leaf = module.rfind('.');
  if (leaf == std::string::npos) return std::nullopt;
  const std::string projection = module.substr(leaf + 1);
  if (projection != "gate_proj" && projection != "up_proj" && projection != "down_proj") return std::nullopt;
  const size_t index = module.rfind('.', leaf - 1);
  if (index == std::string::npos) return std::nullopt;
  const std::string expert = module.substr(index + 1, leaf - index - 1);
  if (expert.empty() || expert.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const std::string marker = ".mlp.experts";
  if (index < marker.size() || module.compare(index - marker.size(), marker.size(), marker) != 0) {
    return std::nullopt;
  }
  return module;
}

std::vector<float> dequantize_weight(const Checkpoint& checkpoint, const TensorView& view,
                                     const Glm5NextConfig& config) {
  require(view.shape.size() == 2, "{}: expected a matrix, got shape {}", view.name, view.shape_string());
  LinearWeight weight{.name = view.name,
                      .dtype = view.dtype,
                      .out_features = view.shape[0],
                      .in_features = view.shape[1],
                      .data = view.data};
  if (view.dtype == DType::f8_e4m3) {
    const TensorView& scale = checkpoint.get(view.name + "_scale_inv");
    require(config.quantization && config.quantization->fp8_block_rows > 0,
            "{}: an fp8 weight needs quantization_config.weight_block_size in config.json", view.name);
    weight.scale = scale.data;
    weight.scale_dtype = scale.dtype;
    weight.block_rows = config.quantization->fp8_block_rows;
    weight.block_cols = config.quantization->fp8_block_cols;
  } else {
    require(view.dtype == DType::f32 || view.dtype == DType::bf16 || view.dtype == DType::f16,
            "{}: cannot quantize a {} weight (expected F32, BF16, F16 or F8_E4M3)", view.name, dtype_name(view.dtype));
  }
  std::vector<float> values(static_cast<size_t>(weight.out_features * weight.in_features));
  for (int64_t row = 0; row < weight.out_features; ++row) {
    dequantize_row(weight, row, values.data() + row * weight.in_features);
  }
  return values;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "{}: cannot read", path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

void prepare_output(const QuantizeOptions& options) {
  require(fs::is_directory(options.model), "--model {}: no such directory", options.model);
  require(fs::exists(fs::path(options.model) / "config.json"), "--model {}: no config.json", options.model);
  if (fs::exists(options.out)) {
    require(fs::is_directory(options.out), "--out {}: exists and is not a directory", options.out);
    require(!fs::equivalent(options.out, options.model), "--out {} is the input model directory", options.out);
    require(fs::is_empty(options.out) || options.force, "--out {} is not empty (use --force to write into it)",
            options.out);
    // Stale shards from an earlier run would otherwise sit next to the new ones.
    for (const auto& entry : fs::directory_iterator(options.out)) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".safetensors") || name == "model.safetensors.index.json") fs::remove(entry.path());
    }
  } else {
    fs::create_directories(options.out);
  }
}

// Calibration text -> tokens -> Hessians through our forward. Returns (rows, cols) actually used.
std::pair<int64_t, int64_t> calibrate(const QuantizeOptions& options, const Glm5NextConfig& config,
                                      ExpertHessians& hessians) {
  const fs::path tokenizer_path = fs::path(options.model) / "tokenizer.json";
  require(fs::exists(tokenizer_path), "--calibration needs {} to tokenize the text", tokenizer_path.string());
  const auto tokenizer = text::Tokenizer::load(tokenizer_path);
  const std::string corpus = read_file(options.calibration);
  const std::vector<int32_t> tokens = tokenizer->encode(corpus, text::EncodeOptions{.add_special_tokens = false});
  require(!tokens.empty(), "--calibration {}: no tokens", options.calibration);
  for (const int32_t id : tokens) {
    require(id >= 0 && id < config.vocab_size,
            "--calibration {}: token id {} is outside the model's vocabulary [0, {}) (wrong tokenizer.json?)",
            options.calibration, id, config.vocab_size);
  }
  const auto rows = calibration_rows(tokens, options.calibration_cols, options.calibration_rows);
  CpuBackend backend;
  const auto model = Glm5NextModel::load(options.model, backend);
  const auto started = std::chrono::steady_clock::now();
  const int64_t ran = run_calibration(*model, rows, hessians);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr, "quantize: calibration: %zu rows, %lld tokens through the forward in %.1f s\n", rows.size(),
               static_cast<long long>(ran), seconds);
  return {static_cast<int64_t>(rows.size()), std::min<int64_t>(options.calibration_cols, ran)};
}

int run_quantize(const QuantizeOptions& options) {
  require(options.bits >= exl3::kMinBits && options.bits <= exl3::kMaxBits, "--bits {}: must be {}..{}", options.bits,
          exl3::kMinBits, exl3::kMaxBits);
  const auto codebook = exl3::codebook_from_name(options.codebook);
  require(codebook.has_value(), "--codebook {}: expected mcg, mul1 or 3inst", options.codebook);
  require(options.modules == "experts", "--modules {}: only \"experts\" (the routed experts) is supported",
          options.modules);
  require(options.threads >= 0, "--threads {}: must not be negative", options.threads);
  const uint64_t max_shard = parse_size(options.max_shard_size);
  prepare_output(options);

  const Checkpoint checkpoint = Checkpoint::open(options.model);
  const Glm5NextConfig config = load_glm5_next_config(checkpoint.config_path());
  std::unique_ptr<text::Regex> only;  // PCRE2: std::regex trips GCC 12's -Wmaybe-uninitialized at -O1
  if (!options.only.empty()) only = std::make_unique<text::Regex>(options.only, "--only");
  const auto selected = [&](const std::string& name) -> std::optional<std::string> {
    auto module = routed_expert_module(name);
    if (module && only && only->find_all(*module).empty()) return std::nullopt;
    return module;
  };
  std::vector<std::string> modules;
  for (const std::string& name : checkpoint.names()) {
    require(!name.ends_with(".trellis"), "--model {}: already EXL3 ({})", options.model, name);
    if (auto module = selected(name)) modules.push_back(*module);
  }
  require(!modules.empty(), "--model {}: no routed expert weights (...mlp.experts.N.*_proj.weight{}) to quantize",
          options.model, only ? " matching --only" : "");

  ExpertHessians hessians;
  std::pair<int64_t, int64_t> calibration{0, 0};
  if (!options.calibration.empty()) calibration = calibrate(options, config, hessians);

  std::unique_ptr<ThreadPool> own_pool;
  if (options.threads > 0) own_pool = std::make_unique<ThreadPool>(options.threads);
  ThreadPool& pool = own_pool ? *own_pool : ThreadPool::global();

  // Signs of the input side belong to the Hessian: one sign seed per Hessian group (gate+up of an expert).
  std::map<std::string, int64_t> group_index;
  for (const std::string& module : modules) group_index.emplace(ExpertHessians::group_of(module), 0);
  int64_t next_group = 0;
  for (auto& [group, index] : group_index) index = next_group++;

  SafetensorsWriter writer(options.out, max_shard);
  std::vector<exl3::StoredTensor> ledger;
  const auto record = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, uint64_t nbytes,
                          int32_t marker = 0) {
    ledger.push_back({name, dtype, std::move(shape), nbytes, marker});
  };

  const auto started = std::chrono::steady_clock::now();
  int64_t done = 0, weights_done = 0, uncalibrated = 0;
  std::vector<std::string> skip;  // tensors replaced by a quantized module
  for (const std::string& module : modules) {
    skip.push_back(module + ".weight");
    skip.push_back(module + ".weight_scale_inv");
  }
  std::sort(skip.begin(), skip.end());

  for (const std::string& name : checkpoint.names()) {
    const TensorView& view = checkpoint.get(name);
    const auto module = selected(name);
    if (!module) {
      if (std::binary_search(skip.begin(), skip.end(), name)) continue;
      writer.add_borrowed(name, view.dtype, view.shape, std::span(view.data, view.nbytes));
      record(name, view.dtype, view.shape, view.nbytes);
      continue;
    }
    const std::vector<float> weight = dequantize_weight(checkpoint, view, config);
    const int64_t out = view.shape[0], in = view.shape[1];
    const exl3::HessianAccumulator* accumulator = hessians.find(*module);
    const std::vector<float> hessian = accumulator != nullptr ? accumulator->mean() : std::vector<float>{};
    const exl3::QuantizedLinear q = exl3::quantize_linear(
        weight.data(), out, in, hessian.empty() ? nullptr : hessian.data(),
        {.bits = options.bits,
         .codebook = *codebook,
         .seed = options.seed + static_cast<uint64_t>(done),
         .sign_seed = static_cast<int64_t>(options.seed) + group_index.at(ExpertHessians::group_of(*module)) * 7919,
         .pool = &pool});
    uncalibrated += !q.calibrated;

    const int64_t tk = q.in_padded / exl3::kTileSide, tn = q.out_padded / exl3::kTileSide;
    const std::vector<int64_t> trellis_shape = {tk, tn, exl3::kTileSide * options.bits};
    writer.add(*module + ".trellis", DType::i16, trellis_shape, bytes_of(q.trellis));
    record(*module + ".trellis", DType::i16, trellis_shape, q.trellis.size() * 2);
    writer.add(*module + ".suh", DType::f16, {q.in_padded}, bytes_of(q.suh));
    record(*module + ".suh", DType::f16, {q.in_padded}, q.suh.size() * 2);
    writer.add(*module + ".svh", DType::f16, {q.out_padded}, bytes_of(q.svh));
    record(*module + ".svh", DType::f16, {q.out_padded}, q.svh.size() * 2);
    if (*codebook != exl3::Codebook::inst3) {
      const int32_t marker = exl3::codebook_marker(*codebook);
      const std::string marker_name = *module + "." + std::string(exl3::codebook_name(*codebook));
      writer.add(marker_name, DType::i32, {}, bytes_of(std::vector<int32_t>{marker}));
      record(marker_name, DType::i32, {}, 4, marker);
    }

    ++done;
    weights_done += out * in;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::string calibration_note = "calibrated";
    if (!q.calibrated) {
      calibration_note =
          options.calibration.empty() ? "uncalibrated" : "uncalibrated: no routed calibration tokens, identity Hessian";
    }
    std::fprintf(stderr, "quantize: %lld/%zu %s [%lld x %lld] K=%d proxy error %.3g (%s), %.3g weights/s\n",
                 static_cast<long long>(done), modules.size(), module->c_str(), static_cast<long long>(out),
                 static_cast<long long>(in), options.bits, q.proxy_error, calibration_note.c_str(),
                 static_cast<double>(weights_done) / std::max(seconds, 1e-9));
  }
  const std::vector<std::string> files = writer.finish();

  // config.json: quantization_config replaces (and records) the source's.
  nlohmann::ordered_json model_config = nlohmann::ordered_json::parse(read_file(checkpoint.config_path()));
  exl3::QuantizationSummary summary{.bits = static_cast<double>(options.bits),
                                    .codebook = *codebook,
                                    .calibration_rows = calibration.first,
                                    .calibration_cols = calibration.second,
                                    .version = "kestrel",  // the producer; exllamav3 writes its own __version__ here
                                    .original = nullptr};
  if (model_config.contains("quantization_config")) {
    summary.original = model_config["quantization_config"];
  } else if (model_config.contains("text_config") && model_config["text_config"].contains("quantization_config")) {
    summary.original = model_config["text_config"]["quantization_config"];
    model_config["text_config"].erase("quantization_config");
  }
  model_config["quantization_config"] = exl3::quantization_config(summary);
  {
    std::ofstream config_out(fs::path(options.out) / "config.json");
    config_out << model_config.dump(2) << "\n";
    std::ofstream ledger_out(fs::path(options.out) / "quantization_config.json");
    ledger_out << exl3::quantization_config_file(summary, ledger).dump(2) << "\n";
    require(config_out.good() && ledger_out.good(), "--out {}: cannot write the config files", options.out);
  }

  // Every other file of the model directory (tokenizer, template, generation config, ...).
  int64_t copied = 0;
  for (const auto& entry : fs::directory_iterator(options.model)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == "config.json" || name == "quantization_config.json" ||
        name.ends_with(".safetensors") || name == "model.safetensors.index.json") {
      continue;
    }
    fs::copy_file(entry.path(), fs::path(options.out) / name, fs::copy_options::overwrite_existing);
    ++copied;
  }

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr,
               "quantize: %lld modules (%lld uncalibrated), %lld weights in %.1f s (%.3g weights/s); wrote %zu "
               "weight file(s) and copied %lld other file(s) to %s\n",
               static_cast<long long>(done), static_cast<long long>(uncalibrated), static_cast<long long>(weights_done),
               seconds, static_cast<double>(weights_done) / std::max(seconds, 1e-9), files.size(),
               static_cast<long long>(copied), options.out.c_str());
  return 0;
}

}  // namespace

Action add_quantize_command(CLI::App& app) {
  auto options = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Convert a glm5_next checkpoint's routed experts to EXL3");
  cmd->add_option("--model", options->model, "Input checkpoint directory (BF16, FP8 or F32)")->required();
  cmd->add_option("--out", options->out, "Output directory (created; must be empty unless --force)")->required();
  cmd->add_option("--bits", options->bits, "Bits per weight K, 1..8")->capture_default_str();
  cmd->add_option("--codebook", options->codebook, "mcg, mul1 or 3inst")->capture_default_str();
  cmd->add_option("--modules", options->modules, "Which linears: experts (the routed experts)")->capture_default_str();
  cmd->add_option("--only", options->only,
                  "Quantize only the expert modules matching this regular expression, e.g. 'layers\\.(3|4)\\.' "
                  "(the others are copied unchanged)");
  cmd->add_option("--calibration", options->calibration,
                  "UTF-8 text run through the model to capture Hessians (default: uncalibrated)");
  cmd->add_option("--calibration-rows", options->calibration_rows, "Calibration rows (sequences) at most")
      ->capture_default_str();
  cmd->add_option("--calibration-cols", options->calibration_cols, "Tokens per calibration row")->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of the random sign flips")->capture_default_str();
  cmd->add_option("--threads", options->threads, "Worker threads (default: KESTREL_THREADS or all cores)");
  cmd->add_option("--max-shard-size", options->max_shard_size, "Largest weight file, e.g. 5GB or 300KB")
      ->capture_default_str();
  cmd->add_flag("--force", options->force, "Write into a non-empty --out (its old weight files are removed)");
  const Action bench = add_quantize_bench_command(app);
  return [cmd, options, bench]() -> int {
    if (!cmd->parsed()) return bench();
    return run_quantize(*options);
  };
}

}  // namespace kestrel::cli

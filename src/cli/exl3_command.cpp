// `kestrel exl3 dequant`: the weight of one EXL3 module of a safetensors file as float32 NumPy, in the orientation
// EXL3 stores, [in_padded, out_padded] (y = x W) — or, with --rotated, the decoded trellis values Ŵ before the
// Hadamard rotations and sign vectors, which are exactly fp16 values. Used to check our decoder against exllamav3's
// (tools/exl3_oracle.py verify) and to build reference checkpoints (tools/make_exl3_golden.py).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/npy.h"
#include "base/numeric.h"
#include "cli/commands.h"
#include "formats/exl3_tensors.h"

namespace kestrel::cli {

namespace {

// A tensor's bytes copied into aligned 16-bit words (the mapping need not be aligned).
std::vector<uint16_t> words_of(const TensorView& view) {
  std::vector<uint16_t> words(view.nbytes / 2);
  std::memcpy(words.data(), view.data, words.size() * 2);
  return words;
}

}  // namespace

Action add_exl3_command(CLI::App& app) {
  struct Options {
    std::string file, prefix, out;
    bool rotated = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("exl3", "Inspect EXL3 tensors");
  cmd->require_subcommand(1);
  CLI::App* dequant = cmd->add_subcommand("dequant", "Write one EXL3 module's weight as float32 .npy [in, out]");
  dequant->add_option("--file", options->file, "A .safetensors file")->required();
  dequant->add_option("--prefix", options->prefix, "Module name, e.g. model.layers.3.mlp.experts.17.gate_proj")
      ->required();
  dequant->add_option("--out", options->out, "Output .npy path")->required();
  dequant->add_flag("--rotated", options->rotated, "Write the decoded trellis values before the rotations");
  return [dequant, options]() -> int {
    if (!dequant->parsed()) return -1;
    const SafetensorsFile file(options->file);
    const Exl3Tensors t =
        read_exl3_tensors([&](const std::string& name) { return file.find(name); }, options->prefix);
    const int64_t k = t.in_padded, n = t.out_padded;
    const std::vector<uint16_t> trellis = words_of(*t.trellis);
    std::vector<float> out(static_cast<size_t>(k * n));
    if (options->rotated) {
      std::vector<uint16_t> rotated(out.size());
      exl3::decode_rotated(trellis.data(), k, n, t.bits, t.codebook, rotated.data());
      for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_f32(rotated[i]);
    } else {
      exl3::dequantize(trellis.data(), words_of(*t.suh).data(), words_of(*t.svh).data(), k, n, t.bits, t.codebook,
                       out.data());
    }
    write_npy_f32(options->out, {k, n}, out.data());
    log_info("{}: {} [{}, {}], K = {}, codebook {}{} -> {}", options->file, options->prefix, k, n, t.bits,
             exl3::codebook_name(t.codebook), options->rotated ? ", rotated" : "", options->out);
    return 0;
  };
}

}  // namespace kestrel::cli

// Test helper: a scratch checkpoint directory derived from a golden fixture (tests/data/golden), with one thing
// changed — a tensor re-emitted through SafetensorsBuilder with a new name, shape, dtype or content, or an edited
// config.json — and unchanged weight files symlinked rather than copied.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "../formats/expect_error.h"
#include "../formats/safetensors_builder.h"
#include "backend/cpu/cpu_backend.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/glm5_next.h"

namespace kestrel::testing {

inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

inline std::string golden_fixture_dir(const std::string& fixture) {
  return (std::filesystem::path(KESTREL_TEST_DATA) / "golden" / fixture).string();
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(in);
}

using Tensor = SafetensorsBuilder::Tensor;
// Applied to each tensor as it is copied; returning false drops the tensor.
using TensorEdit = std::function<bool(Tensor&)>;

inline TensorEdit drop(const std::string& name) {
  return [name](Tensor& tensor) { return tensor.name != name; };
}
// Runs `change` on the tensor called `name`; keeps every tensor.
inline TensorEdit change(const std::string& name, std::function<void(Tensor&)> change_tensor) {
  return [name, change_tensor](Tensor& tensor) {
    if (tensor.name == name) change_tensor(tensor);
    return true;
  };
}
// Re-types a tensor, with zero bytes of the size the new dtype needs.
inline TensorEdit retype(const std::string& name, const std::string& dtype, size_t element_size) {
  return change(name, [dtype, element_size](Tensor& tensor) {
    int64_t numel = 1;
    for (const int64_t dim : tensor.shape) numel *= dim;
    tensor.dtype = dtype;
    tensor.bytes.assign(static_cast<size_t>(numel) * element_size, '\0');
  });
}

// A scratch checkpoint directory derived from a golden fixture. The config is held as JSON until write_config();
// weight files are either linked unchanged (link_weights) or re-emitted with edits (copy_tensors).
class BrokenCheckpoint {
public:
  explicit BrokenCheckpoint(const std::string& fixture)
      : source_(golden_fixture_dir(fixture)), config_(read_json(source_ + "/config.json")) {}

  const std::string& dir() const { return scratch_.path(); }
  std::string file(const std::string& name) const { return scratch_.file(name); }
  std::string source_file(const std::string& name) const { return source_ + "/" + name; }
  std::string config_path() const { return file("config.json"); }

  nlohmann::json& config() { return config_; }
  nlohmann::json& text_config() { return config_.contains("text_config") ? config_["text_config"] : config_; }
  void write_config() const { write_file(config_path(), config_.dump(2)); }

  // Symlinks one weight file of the fixture into the scratch dir unchanged.
  void link(const std::string& name) const { std::filesystem::create_symlink(source_file(name), file(name)); }
  // Symlinks every weight file (and the index) of the fixture, except those in `except`.
  void link_weights(std::initializer_list<std::string_view> except = {}) const {
    for (const auto& entry : std::filesystem::directory_iterator(source_)) {
      const std::string name = entry.path().filename().string();
      const bool weights = name.ends_with(".safetensors") || name == kIndexFile;
      if (weights && std::find(except.begin(), except.end(), name) == except.end()) link(name);
    }
  }

  // The tensors of the fixture's weight file `name`, in file order, through `edit`, as a builder.
  SafetensorsBuilder copy_tensors(const std::string& name, const TensorEdit& edit = {}) const {
    const SafetensorsFile file(source_file(name));
    SafetensorsBuilder builder;
    for (const TensorView& view : file.tensors()) {
      Tensor tensor{.name = view.name,
                    .dtype = std::string(dtype_name(view.dtype)),
                    .shape = view.shape,
                    .bytes = std::string(reinterpret_cast<const char*>(view.data), view.nbytes),
                    .data_offsets = {},
                    .raw_entry = {}};
      if (edit && !edit(tensor)) continue;
      builder.add_tensor(std::move(tensor));
    }
    return builder;
  }
  // Writes the fixture's config unchanged-or-edited and its single weight file re-emitted through `edit`.
  void write_single_file(const TensorEdit& edit) const {
    write_config();
    copy_tensors(kSingleFile, edit).write(file(kSingleFile));
  }

private:
  ScratchDir scratch_;
  std::string source_;
  nlohmann::json config_;
};

inline std::string load_error(const std::string& dir, std::initializer_list<std::string_view> fragments) {
  CpuBackend backend;
  return expect_error([&] { (void)Glm5NextModel::load(dir, backend); }, fragments);
}

inline std::string missing(const std::string& name) { return "tensor '" + name + "' is missing"; }

}  // namespace kestrel::testing

// Test helper: writes safetensors files (and checkpoint directories) from in-memory tensors, optionally corrupted in
// a chosen way, plus a scratch directory that cleans up after itself. Header-only, for any test that needs weights.
#pragma once

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace kestrel::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class ScratchDir {
public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kestrel_test_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

private:
  std::string path_;
};

inline void write_file(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The raw little-endian bytes of a vector of trivially copyable values.
template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Builds one safetensors file. Tensors are laid out back to back in the order added; each may override the JSON
// written for it, and `Corruption` damages the file as a whole.
class SafetensorsBuilder {
public:
  struct Tensor {
    std::string name;
    std::string dtype;  // written verbatim, so unknown dtypes can be tested
    std::vector<int64_t> shape;
    std::string bytes;  // raw data
    // Written instead of the computed [begin, end] (the data is still placed at the computed offsets).
    std::optional<std::pair<int64_t, int64_t>> data_offsets;
    // Written verbatim as this tensor's header value instead of {dtype, shape, data_offsets}.
    std::optional<std::string> raw_entry;
  };

  struct Corruption {
    std::optional<std::string> header;      // the whole header text, replacing the generated JSON
    std::optional<uint64_t> header_length;  // the 8-byte length prefix, instead of the true length
    std::optional<size_t> truncate_to;      // cut the finished file to this many bytes
    std::string extra_header_entries;       // raw text appended inside the top-level object: ,"a": {...}
    std::string trailing_bytes;             // appended after the data section
  };

  SafetensorsBuilder& add(std::string name, std::string dtype, std::vector<int64_t> shape, std::string bytes) {
    tensors_.push_back({std::move(name), std::move(dtype), std::move(shape), std::move(bytes), {}, {}});
    return *this;
  }
  // Adds a tensor whose data is `values` (element type T must match the dtype's size).
  template <typename T>
  SafetensorsBuilder& add_values(std::string name, std::string dtype, std::vector<int64_t> shape,
                                 const std::vector<T>& values) {
    return add(std::move(name), std::move(dtype), std::move(shape), bytes_of(values));
  }
  SafetensorsBuilder& add_tensor(Tensor tensor) {
    tensors_.push_back(std::move(tensor));
    return *this;
  }
  SafetensorsBuilder& metadata(std::string key, std::string value) {
    metadata_.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  Corruption& corrupt() { return corruption_; }

  // The header JSON that build() writes (before padding), unless Corruption::header replaces it.
  std::string header_json() const {
    std::string header = "{";
    bool first = true;
    const auto separator = [&] {
      if (!first) header += ",";
      first = false;
    };
    if (!metadata_.empty()) {
      separator();
      nlohmann::json metadata = nlohmann::json::object();
      for (const auto& [key, value] : metadata_) metadata[key] = value;
      header += "\"__metadata__\":" + metadata.dump();
    }
    int64_t offset = 0;
    for (const Tensor& tensor : tensors_) {
      separator();
      header += nlohmann::json(tensor.name).dump() + ":";
      const auto size = static_cast<int64_t>(tensor.bytes.size());
      if (tensor.raw_entry) {
        header += *tensor.raw_entry;
      } else {
        const auto [begin, end] = tensor.data_offsets.value_or(std::pair(offset, offset + size));
        header +=
            nlohmann::json{{"dtype", tensor.dtype}, {"shape", tensor.shape}, {"data_offsets", {begin, end}}}.dump();
      }
      offset += size;
    }
    header += corruption_.extra_header_entries + "}";
    return header;
  }

  // The complete file contents.
  std::string build() const {
    std::string header = corruption_.header.value_or(header_json());
    if (!corruption_.header) header.append((8 - header.size() % 8) % 8, ' ');  // like the Python writer
    const uint64_t length = corruption_.header_length.value_or(header.size());
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xff);
    file += header;
    for (const Tensor& tensor : tensors_) file += tensor.bytes;
    file += corruption_.trailing_bytes;
    if (corruption_.truncate_to) file.resize(std::min(file.size(), *corruption_.truncate_to));
    return file;
  }

  void write(const std::string& path) const { write_file(path, build()); }

  const std::vector<Tensor>& tensors() const { return tensors_; }

private:
  std::vector<Tensor> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  Corruption corruption_;
};

// Writes model.safetensors.index.json for `shards` (file name -> builder) and the shards themselves into `dir`.
inline void write_sharded_checkpoint(const std::string& dir,
                                     const std::vector<std::pair<std::string, SafetensorsBuilder>>& shards) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [file_name, builder] : shards) {
    builder.write(dir + "/" + file_name);
    for (const auto& tensor : builder.tensors()) weight_map[tensor.name] = file_name;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  write_file(dir + "/model.safetensors.index.json", index.dump(2));
}

}  // namespace kestrel::testing

#include "formats/safetensors_writer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "base/error.h"

namespace kestrel {

namespace {

std::string partial_name(size_t index) { return fmt::format("model-{:05d}.safetensors.partial", index + 1); }

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string dir, uint64_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {
  require(std::filesystem::is_directory(dir_), "{}: not a directory", dir_);
  require(max_shard_bytes_ > 0, "safetensors writer: the shard size limit must be positive");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (finished_) return;
  // Abandoned (an error upstream): leave no half-written shards behind.
  std::error_code ignored;
  for (size_t i = 0; i < shard_names_.size(); ++i) std::filesystem::remove(dir_ + "/" + partial_name(i), ignored);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<std::byte> data) {
  Pending tensor{name, dtype, std::move(shape), std::move(data), {}};
  tensor.data = tensor.owned;
  add_pending(std::move(tensor));
}

void SafetensorsWriter::add_borrowed(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                     std::span<const std::byte> data) {
  add_pending({name, dtype, std::move(shape), {}, data});
}

void SafetensorsWriter::add_pending(Pending tensor) {
  require(!finished_, "safetensors writer: {} added after finish()", tensor.name);
  require(!tensor.name.empty() && tensor.name != "__metadata__", "safetensors writer: bad tensor name \"{}\"",
          tensor.name);
  int64_t numel = 1;
  for (const int64_t dim : tensor.shape) {
    require(dim >= 0, "safetensors writer: {} has a negative dimension", tensor.name);
    numel *= dim;
  }
  require(static_cast<uint64_t>(numel) * dtype_size(tensor.dtype) == tensor.data.size(),
          "safetensors writer: {} holds {} bytes, but {} x {} elements need {}", tensor.name, tensor.data.size(),
          dtype_name(tensor.dtype), numel, static_cast<uint64_t>(numel) * dtype_size(tensor.dtype));
  const auto at = std::lower_bound(names_.begin(), names_.end(), tensor.name);
  require(at == names_.end() || *at != tensor.name, "safetensors writer: tensor {} added twice", tensor.name);
  names_.insert(at, tensor.name);

  const uint64_t size = tensor.data.size();
  if (!shard_.empty() && shard_bytes_ + size > max_shard_bytes_) flush_shard();
  shard_bytes_ += size;
  total_bytes_ += size;
  shard_.push_back(std::move(tensor));
}

void SafetensorsWriter::flush_shard() {
  if (shard_.empty()) return;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  std::vector<std::string> names;
  for (const Pending& tensor : shard_) {
    header[tensor.name] = {{"dtype", dtype_name(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
    names.push_back(tensor.name);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as the reference writer pads

  const std::string path = dir_ + "/" + partial_name(shard_names_.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  require(out.good(), "{}: cannot create", path);
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out.write(length, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Pending& tensor : shard_) {
    out.write(reinterpret_cast<const char*>(tensor.data.data()), static_cast<std::streamsize>(tensor.data.size()));
  }
  out.close();
  require(!out.fail(), "{}: write failed (disk full?)", path);
  shard_names_.push_back(std::move(names));
  shard_.clear();
  shard_bytes_ = 0;
}

std::vector<std::string> SafetensorsWriter::finish() {
  require(!finished_, "safetensors writer: finish() called twice");
  flush_shard();
  std::vector<std::string> files;
  const size_t count = shard_names_.size();
  require(count > 0, "safetensors writer: no tensors to write in {}", dir_);
  if (count == 1) {
    files.push_back("model.safetensors");
  } else {
    for (size_t i = 0; i < count; ++i) files.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, count));
  }
  for (size_t i = 0; i < count; ++i) {
    std::error_code error;
    std::filesystem::rename(dir_ + "/" + partial_name(i), dir_ + "/" + files[i], error);
    require(!error, "{}: cannot rename shard to {}: {}", dir_, files[i], error.message());
  }
  if (count > 1) {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    std::vector<std::pair<std::string, size_t>> entries;
    for (size_t i = 0; i < count; ++i) {
      for (const std::string& name : shard_names_[i]) entries.emplace_back(name, i);
    }
    std::sort(entries.begin(), entries.end());
    for (const auto& [name, shard] : entries) weight_map[name] = files[shard];
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map}};
    const std::string path = dir_ + "/model.safetensors.index.json";
    std::ofstream out(path, std::ios::trunc);
    out << index.dump(2) << "\n";
    out.close();
    require(!out.fail(), "{}: write failed", path);
    files.push_back("model.safetensors.index.json");
  }
  finished_ = true;
  return files;
}

}  // namespace kestrel

// Opening a checkpoint directory: one model.safetensors, or shards cross-checked against their index.
#include "formats/checkpoint.h"

#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/mapped_file.h"
#include "formats/strict_json.h"

namespace kestrel {

namespace {

constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";

// Shards must sit in the checkpoint directory itself: an index must not reach files elsewhere.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// The index's weight_map: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const MappedFile file(index_path);
  const nlohmann::json index =
      parse_json_object_strict(std::string_view(reinterpret_cast<const char*>(file.data()), file.size()), index_path);
  const auto weight_map = index.find("weight_map");
  require(weight_map != index.end(), "{}: missing 'weight_map'", index_path);
  require(weight_map->is_object(), "{}: 'weight_map' must be an object, got {}", index_path, weight_map->type_name());
  require(!weight_map->empty(), "{}: 'weight_map' is empty", index_path);
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, shard] : weight_map->items()) {
    require(shard.is_string(), "{}: weight_map: tensor '{}': shard must be a file name string, got {}", index_path,
            name, shard.type_name());
    const std::string& shard_name = shard.get_ref<const std::string&>();
    require(is_plain_file_name(shard_name),
            "{}: weight_map: tensor '{}': shard '{}' is not a plain file name in the checkpoint directory", index_path,
            name, shard_name);
    shard_of.emplace(name, shard_name);
  }
  return shard_of;
}

// Filesystem queries that report failures (e.g. permission denied) as "no" instead of throwing.
bool directory_exists(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::is_directory(path, ignored);
}
bool path_exists(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::exists(path, ignored);
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  require(directory_exists(dir), "{}: not a directory", dir);
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  const std::string single_path = dir + "/" + kSingleFileName;
  const std::string index_path = dir + "/" + kIndexFileName;

  // Like transformers, a single file wins over an index when both are present.
  if (path_exists(single_path)) {
    const auto& shard = checkpoint.shards_.emplace_back(std::make_unique<SafetensorsFile>(single_path));
    for (const TensorView& tensor : shard->tensors()) checkpoint.tensors_.emplace(tensor.name, &tensor);
    return checkpoint;
  }
  require(path_exists(index_path), "{}: no {} or {}", dir, kSingleFileName, kIndexFileName);

  const std::map<std::string, std::string> shard_of = read_weight_map(index_path);
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard_name] : shard_of) names_by_shard[shard_name].push_back(name);
  for (const auto& [shard_name, listed_names] : names_by_shard) {
    const std::string shard_path = dir + "/" + shard_name;
    require(path_exists(shard_path), "{}: tensor '{}' is listed in shard '{}', which does not exist", index_path,
            listed_names.front(), shard_name);
    const auto& shard = checkpoint.shards_.emplace_back(std::make_unique<SafetensorsFile>(shard_path));
    for (const std::string& name : listed_names) {
      require(shard->find(name) != nullptr, "{}: tensor '{}' is listed in {} but that shard does not contain it",
              shard_path, name, kIndexFileName);
    }
    for (const TensorView& tensor : shard->tensors()) {
      const auto listed = shard_of.find(tensor.name);
      require(listed != shard_of.end(), "{}: tensor '{}' is not listed in {}", shard_path, tensor.name, kIndexFileName);
      require(listed->second == shard_name, "{}: tensor '{}' is in this shard, but {} assigns it to '{}'", shard_path,
              tensor.name, kIndexFileName, listed->second);
      checkpoint.tensors_.emplace(tensor.name, &tensor);
    }
  }
  return checkpoint;
}

const TensorView* Checkpoint::find(std::string_view name) const {
  const auto found = tensors_.find(name);
  return found == tensors_.end() ? nullptr : found->second;
}

const TensorView& Checkpoint::get(std::string_view name) const {
  const TensorView* tensor = find(name);
  if (tensor == nullptr) fail("{}: tensor {} is missing", dir_, name);
  return *tensor;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> sorted;
  sorted.reserve(tensors_.size());
  for (const auto& entry : tensors_) sorted.push_back(entry.first);
  return sorted;
}

}  // namespace kestrel

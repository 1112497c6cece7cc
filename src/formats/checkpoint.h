// A Hugging Face checkpoint directory: config.json plus weights in either one `model.safetensors` or shards listed by
// `model.safetensors.index.json` ("weight_map": tensor name -> shard file). All shards are memory-mapped.
// The index and the shards must agree exactly: a tensor listed but absent from its shard, a shard file missing, a
// tensor present in a shard but not listed, or the same name in two shards is an Error naming file and tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/safetensors.h"

namespace kestrel {

class Checkpoint {
public:
  // Throws Error if `dir` holds neither weights layout, or any file is malformed.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string config_path() const { return dir_ + "/config.json"; }

  const TensorView* find(std::string_view name) const;
  // Throws Error "<dir>: tensor <name> is missing" when absent.
  const TensorView& get(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  size_t num_shards() const { return shards_.size(); }

private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*, std::less<>> tensors_;
};

}  // namespace kestrel

// Writes a checkpoint's weights as safetensors: a single `model.safetensors`, or shards
// `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` ("metadata": {"total_size"}, "weight_map")
// when they exceed the shard size limit, as Hugging Face's save_pretrained lays them out. Tensors go to the current
// shard in the order added; a shard is flushed to disk (under a temporary name, renamed by finish() once the shard
// count is known) as soon as the next tensor would push it past the limit, so at most one shard of owned data is held
// in memory. A tensor larger than the limit gets a shard of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/dtype.h"

namespace kestrel {

class SafetensorsWriter {
public:
  // `dir` must exist. max_shard_bytes counts tensor data only (headers are small).
  SafetensorsWriter(std::string dir, uint64_t max_shard_bytes);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Adds a tensor whose bytes the writer keeps. Throws Error on a duplicate name or a size that does not match
  // dtype x shape.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<std::byte> data);
  // Adds a tensor by reference (e.g. into a source checkpoint's mapping): `data` must stay valid until finish().
  void add_borrowed(const std::string& name, DType dtype, std::vector<int64_t> shape, std::span<const std::byte> data);

  // Flushes the last shard, names the files and writes the index (if sharded). Returns the file names written.
  std::vector<std::string> finish();

  uint64_t total_bytes() const { return total_bytes_; }

private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> owned;
    std::span<const std::byte> data;
  };

  void add_pending(Pending tensor);
  void flush_shard();

  std::string dir_;
  uint64_t max_shard_bytes_;
  std::vector<Pending> shard_;
  uint64_t shard_bytes_ = 0;
  std::vector<std::vector<std::string>> shard_names_;  // tensor names per flushed shard
  std::vector<std::string> names_;                     // every name added, for duplicate checks
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace kestrel

// safetensors files: an 8-byte little-endian header length, a JSON header mapping tensor names to
// {dtype, shape, data_offsets} (plus an optional "__metadata__" string map), then the raw data. The file is
// memory-mapped; TensorView points into the mapping. Every structural problem (truncation, bad JSON, offsets out of
// range or overlapping, a size that does not match dtype x shape, an unknown dtype) is an Error naming the file and,
// where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "formats/dtype.h"

namespace kestrel {

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const std::byte* data;       // into the file mapping, not necessarily aligned
  size_t nbytes;
  const std::string* path;     // the file that holds it

  int64_t numel() const;
  std::string shape_string() const;  // "[64, 32]"
};

class SafetensorsFile {
public:
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return file_->path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

private:
  std::unique_ptr<MappedFile> file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kestrel

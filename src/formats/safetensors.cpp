// Reading and validating safetensors files; see safetensors.h for the layout.
#include "formats/safetensors.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "formats/strict_json.h"

namespace kestrel {

namespace {

using nlohmann::json;

// Real headers are a few MiB at most (76k tensors in the largest checkpoints we load span 62 shards); anything far
// larger is a corrupt length field, and refusing it early avoids parsing gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr uint64_t kMaxElements = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

uint64_t read_u64_le(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint64_t>(bytes[i]);
  return value;
}

struct ByteRange {
  uint64_t begin, end;
};

// Parses one {dtype, shape, data_offsets} entry; `data_size` is the length of the data section after the header.
class TensorEntryParser {
public:
  TensorEntryParser(const std::string& path, const std::string& name, uint64_t data_size)
      : path_(path), name_(name), data_size_(data_size) {}

  DType dtype(const json& entry) const {
    const json& value = member(entry, "dtype");
    require(value.is_string(), "{}: tensor '{}': 'dtype' must be a string, got {}", path_, name_, value.type_name());
    const std::string& text = value.get_ref<const std::string&>();
    const std::optional<DType> dtype = dtype_from_name(text);
    require(dtype.has_value(), "{}: tensor '{}': unknown dtype '{}'", path_, name_, text);
    return *dtype;
  }

  std::vector<int64_t> shape(const json& entry) const {
    const json& value = member(entry, "shape");
    require(value.is_array(), "{}: tensor '{}': 'shape' must be an array of integers, got {}", path_, name_,
            value.type_name());
    std::vector<int64_t> dims;
    uint64_t elements = 1;
    for (size_t i = 0; i < value.size(); ++i) {
      const json& dim = value[i];
      require(dim.is_number_integer(), "{}: tensor '{}': shape[{}] is not an integer: {}", path_, name_, i,
              json_excerpt(dim));
      const std::optional<uint64_t> non_negative = json_non_negative_integer(dim);
      require(non_negative.has_value(), "{}: tensor '{}': shape[{}] is negative: {}", path_, name_, i, dim.dump());
      const uint64_t extent = *non_negative;
      // Checked product: huge dims must not wrap around into a small, plausible element count.
      require(extent <= kMaxElements && (extent == 0 || elements <= kMaxElements / extent),
              "{}: tensor '{}': shape {} has more than 2^63 elements", path_, name_, json_excerpt(value));
      elements *= extent;
      dims.push_back(static_cast<int64_t>(extent));
    }
    return dims;
  }

  ByteRange data_offsets(const json& entry) const {
    const json& value = member(entry, "data_offsets");
    const bool is_pair = value.is_array() && value.size() == 2;
    const std::optional<uint64_t> begin = is_pair ? json_non_negative_integer(value[0]) : std::nullopt;
    const std::optional<uint64_t> end = is_pair ? json_non_negative_integer(value[1]) : std::nullopt;
    require(begin && end, "{}: tensor '{}': 'data_offsets' must be [begin, end] with two non-negative integers, got {}",
            path_, name_, json_excerpt(value));
    const ByteRange range{*begin, *end};
    require(range.begin <= range.end, "{}: tensor '{}': data_offsets [{}, {}] end before they begin", path_, name_,
            range.begin, range.end);
    require(range.end <= data_size_, "{}: tensor '{}': data_offsets [{}, {}] exceed the data section ({} bytes)", path_,
            name_, range.begin, range.end, data_size_);
    return range;
  }

  void check_size(DType dtype, const std::vector<int64_t>& shape, ByteRange range) const {
    const uint64_t elements = std::accumulate(shape.begin(), shape.end(), uint64_t{1}, std::multiplies<>());
    const uint64_t element_size = dtype_size(dtype);
    const uint64_t span = range.end - range.begin;
    require(elements <= std::numeric_limits<uint64_t>::max() / element_size,
            "{}: tensor '{}': {} {} needs more than 2^64 bytes", path_, name_, dtype_name(dtype),
            fmt::join(shape, "x"));
    require(elements * element_size == span,
            "{}: tensor '{}': data_offsets [{}, {}] span {} bytes but {} [{}] needs {} bytes", path_, name_,
            range.begin, range.end, span, dtype_name(dtype), fmt::join(shape, ", "), elements * element_size);
  }

private:
  const json& member(const json& entry, const char* key) const {
    const auto found = entry.find(key);
    require(found != entry.end(), "{}: tensor '{}': missing '{}'", path_, name_, key);
    return *found;
  }

  const std::string& path_;
  const std::string& name_;
  uint64_t data_size_;
};

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& path) {
  require(value.is_object(), "{}: '__metadata__' must be an object of strings, got {}", path, value.type_name());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    require(item.is_string(), "{}: '__metadata__' entry '{}' must be a string, got {}", path, key, item.type_name());
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

}  // namespace

int64_t TensorView::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string TensorView::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsFile::SafetensorsFile(std::string path) : file_(std::make_unique<MappedFile>(std::move(path))) {
  const std::string& file_path = file_->path();
  const uint64_t file_size = file_->size();
  require(file_size >= 8, "{}: file is {} bytes, shorter than the 8-byte header length", file_path, file_size);
  const uint64_t header_size = read_u64_le(file_->data());
  require(header_size <= kMaxHeaderBytes, "{}: header length {} is over the {} MiB limit (corrupt file?)", file_path,
          header_size, kMaxHeaderBytes >> 20);
  require(header_size <= file_size - 8, "{}: header length {} exceeds the {} bytes that follow it", file_path,
          header_size, file_size - 8);

  const std::byte* header_begin = file_->data() + 8;
  const json header = parse_json_object_strict(
      std::string_view(reinterpret_cast<const char*>(header_begin), header_size), file_path, "tensor");
  const std::byte* data_begin = header_begin + header_size;
  const uint64_t data_size = file_size - 8 - header_size;

  std::vector<ByteRange> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = parse_metadata(entry, file_path);
      continue;
    }
    require(entry.is_object(), "{}: tensor '{}': expected an object with dtype, shape and data_offsets, got {}",
            file_path, name, entry.type_name());
    const TensorEntryParser parser(file_path, name, data_size);
    const DType dtype = parser.dtype(entry);
    std::vector<int64_t> shape = parser.shape(entry);
    const ByteRange range = parser.data_offsets(entry);
    parser.check_size(dtype, shape, range);
    tensors_.push_back({.name = name,
                        .dtype = dtype,
                        .shape = std::move(shape),
                        .data = data_begin + range.begin,
                        .nbytes = static_cast<size_t>(range.end - range.begin),
                        .path = &file_->path()});
    ranges.push_back(range);
  }

  // Overlap check over the non-empty tensors in file order; an empty tensor occupies no bytes.
  std::vector<size_t> by_offset;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].nbytes > 0) by_offset.push_back(i);
  }
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    return std::pair(ranges[a].begin, ranges[a].end) < std::pair(ranges[b].begin, ranges[b].end);
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const size_t previous = by_offset[k - 1], current = by_offset[k];
    require(ranges[current].begin >= ranges[previous].end,
            "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", file_path, tensors_[current].name,
            ranges[current].begin, ranges[current].end, tensors_[previous].name, ranges[previous].begin,
            ranges[previous].end);
  }

  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  const auto found = index_.find(name);
  return found == index_.end() ? nullptr : &tensors_[found->second];
}

}  // namespace kestrel

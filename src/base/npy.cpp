#include "base/npy.h"

#include <charconv>
#include <cstring>
#include <fstream>
#include <numeric>

#include "base/error.h"
#include "base/mapped_file.h"
#include "base/numeric.h"

namespace kestrel {

namespace {

// The string in single quotes after `key` in a .npy header dict.
std::string quoted_value_after(const std::string& header, const std::string& key, const std::string& path) {
  const size_t at = header.find(key);
  const size_t open = at == std::string::npos ? at : header.find('\'', at + key.size());
  const size_t close = open == std::string::npos ? open : header.find('\'', open + 1);
  require(close != std::string::npos, "{}: .npy header has no {}", path, key);
  return header.substr(open + 1, close - open - 1);
}

}  // namespace

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";  // a 1-tuple: "(3,)"
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path);
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&header_len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  const int64_t count = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(float)));
  if (!out) fail("{}: write failed", path);
}

NpyArray read_npy(const std::string& path) {
  const MappedFile file(path);
  const auto* bytes = reinterpret_cast<const char*>(file.data());
  require(file.size() >= 10 && std::memcmp(bytes, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    offset = 10;
  } else {
    require(file.size() >= 12, "{}: truncated .npy header", path);
    uint32_t len32;
    std::memcpy(&len32, bytes + 8, 4);
    header_len = len32;
    offset = 12;
  }
  require(offset + header_len <= file.size(), "{}: truncated .npy header", path);
  const std::string header(bytes + offset, header_len);
  const std::string descr = quoted_value_after(header, "'descr':", path);
  require(descr == "<f4" || descr == "<i4" || descr == "<f2", "{}: unsupported .npy dtype {}", path, descr);
  const size_t element_size = descr == "<f2" ? 2 : 4;
  require(header.find("'fortran_order': False") != std::string::npos, "{}: Fortran-order .npy not supported", path);
  const size_t shape_key = header.find("'shape':");
  const size_t open = header.find('(', shape_key);
  const size_t close = header.find(')', open);
  require(shape_key != std::string::npos && open != std::string::npos && close != std::string::npos,
          "{}: .npy header has no shape", path);
  NpyArray array;
  const std::string dims = header.substr(open + 1, close - open - 1);
  int64_t count = 1;
  for (size_t pos = 0; pos < dims.size();) {
    const size_t comma = std::min(dims.find(',', pos), dims.size());
    std::string digits = dims.substr(pos, comma - pos);
    pos = comma + 1;
    digits.erase(0, digits.find_first_not_of(' '));
    digits.erase(digits.find_last_not_of(' ') + 1);
    if (digits.empty()) continue;  // the trailing comma of a 1-tuple
    int64_t dim = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), dim);
    require(ec == std::errc() && end == digits.data() + digits.size() && dim >= 0,
            "{}: .npy dimension '{}' is not a valid size", path, digits);
    // The data must fit in the file, so a valid count is far below 2^60; this also rules out overflow below.
    require(dim == 0 || count <= (int64_t{1} << 60) / dim, "{}: .npy shape is too large", path);
    count *= dim;
    array.shape.push_back(dim);
  }
  const size_t data_offset = offset + header_len;
  require(data_offset + static_cast<size_t>(count) * element_size == file.size(), "{}: data size does not match shape",
          path);
  array.data.resize(static_cast<size_t>(count));
  if (descr == "<f4") {
    // An empty array's data() may be null, and memcpy from/to null is undefined even for 0 bytes.
    if (count > 0) std::memcpy(array.data.data(), bytes + data_offset, static_cast<size_t>(count) * 4);
  } else if (descr == "<f2") {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, bytes + data_offset + i * 2, 2);
      array.data[static_cast<size_t>(i)] = f16_to_f32(bits);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      int32_t value;
      std::memcpy(&value, bytes + data_offset + i * 4, 4);
      array.data[static_cast<size_t>(i)] = static_cast<float>(value);
    }
  }
  return array;
}

}  // namespace kestrel

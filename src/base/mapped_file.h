// A read-only memory mapping of a whole file (checkpoint shards are mapped, never copied).
#pragma once

#include <cstddef>
#include <string>

namespace kestrel {

class MappedFile {
public:
  // Throws Error naming the path if the file cannot be opened or mapped. An empty file maps to size 0.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kestrel

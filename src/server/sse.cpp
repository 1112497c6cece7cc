#include "server/sse.h"

#include <fmt/format.h>

namespace kestrel::server {

std::string http_chunk(std::string_view data) {
  std::string out = fmt::format("{:x}\r\n", data.size());
  out += data;
  out += "\r\n";
  return out;
}

}  // namespace kestrel::server

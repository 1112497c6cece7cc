// Wire framing for streamed responses: Server-Sent Events (`data: <json>\n\n`, ended by `data: [DONE]`), carried in
// HTTP/1.1 chunked transfer encoding so the connection can be kept alive afterwards.
#pragma once

#include <string>
#include <string_view>

namespace kestrel::server {

inline std::string sse_event(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  out += "data: ";
  out += data;
  out += "\n\n";
  return out;
}

inline std::string sse_done() { return "data: [DONE]\n\n"; }

// One chunk of a chunked body; an empty `data` would end the body, so callers pass non-empty data only.
std::string http_chunk(std::string_view data);
inline std::string http_last_chunk() { return "0\r\n\r\n"; }

}  // namespace kestrel::server

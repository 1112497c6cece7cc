#include "server/stop_strings.h"

#include <algorithm>
#include <utility>

namespace kestrel::server {

StopStrings::StopStrings(std::vector<std::string> stops, bool include_in_output)
    : stops_(std::move(stops)), include_(include_in_output), hold_(0) {
  for (const auto& s : stops_) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
}

// Bytes of `text` that may be emitted without splitting a UTF-8 sequence (a cut inside one moves back to its start).
static size_t utf8_floor(std::string_view text, size_t cut) {
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

StopStrings::Result StopStrings::feed(std::string_view delta, bool check) {
  Result out;
  if (stopped_) return out;
  pending_.append(delta);
  if (check) {
    // The earliest match wins; on a tie at one position the longer string (it contains the shorter's start).
    size_t best = std::string::npos;
    const std::string* match = nullptr;
    for (const auto& s : stops_) {
      if (s.empty()) continue;
      const size_t at = pending_.find(s);
      if (at != std::string::npos && (at < best || (at == best && s.size() > match->size()))) {
        best = at;
        match = &s;
      }
    }
    if (match) {
      stopped_ = true;
      out.text = pending_.substr(0, include_ ? best + match->size() : best);
      out.matched = *match;
      pending_.clear();
      return out;
    }
  }
  const size_t keep = std::min(hold_, pending_.size());
  const size_t emit = utf8_floor(pending_, pending_.size() - keep);
  out.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return out;
}

std::string StopStrings::finish() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

}  // namespace kestrel::server

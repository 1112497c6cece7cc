// Stop strings over streamed text, as vLLM's detokenizer applies them: text that could still be the start of a stop
// string is held back (across token boundaries), and the first stop string found ends the output there (the stop
// string itself is dropped unless include_stop_str_in_output).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::server {

class StopStrings {
public:
  StopStrings(std::vector<std::string> stops, bool include_in_output);

  struct Result {
    std::string text;                    // safe to emit now
    std::optional<std::string> matched;  // the stop string that ended the output
  };
  // Appends `delta`. With `check` false (before min_tokens) nothing can match yet, but text is still held back so a
  // stop string that starts now and ends after min_tokens is found.
  Result feed(std::string_view delta, bool check = true);
  // End of output: whatever was held back.
  std::string finish();
  bool stopped() const { return stopped_; }

private:
  std::vector<std::string> stops_;
  bool include_;
  size_t hold_;         // longest stop string - 1
  std::string pending_;  // text not emitted yet
  bool stopped_ = false;
};

}  // namespace kestrel::server

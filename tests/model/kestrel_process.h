// Test helper: runs the real `kestrel` binary (KESTREL_BINARY) through /bin/sh and collects its exit status, stdout
// and stderr, for the tests of the command-line interface.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "../formats/safetensors_builder.h"

namespace kestrel::testing {

// Single-quoted for /bin/sh.
inline std::string quote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Outcome {
  int status = -1;  // exit status, or -1 if the process did not exit normally (e.g. a signal)
  std::string out, err;

  // stderr without the log lines ("[kestrel info] ...").
  std::vector<std::string> error_lines() const {
    std::vector<std::string> kept;
    for (const std::string& line : lines_of(err)) {
      if (!line.starts_with("[kestrel ")) kept.push_back(line);
    }
    return kept;
  }
};

// Runs the kestrel binary with `args` (already quoted), stdout through popen, stderr into a scratch file.
inline Outcome run_kestrel(const std::string& args) {
  const ScratchDir scratch;
  const std::string err_path = scratch.file("stderr.txt");
  const std::string command = quote(KESTREL_BINARY) + " " + args + " 2>" + quote(err_path);
  Outcome outcome;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for: " << command;
    return outcome;
  }
  std::array<char, 4096> buffer{};
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) outcome.out.append(buffer.data(), n);
  const int raw = ::pclose(pipe);
  outcome.status = raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  outcome.err = read_text(err_path);
  return outcome;
}

}  // namespace kestrel::testing

// Shared helpers for the template fixtures under tests/data/templates (written by tools/make_template_fixtures.py).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "base/python_json.h"

namespace kestrel::testing {

inline std::string templates_dir() { return std::string(KESTREL_TEST_DATA) + "/templates"; }

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline py::Value read_fixture(const std::string& name) { return py::parse_json(read_text(templates_dir() + "/" + name)); }

}  // namespace kestrel::testing

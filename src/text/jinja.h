// A Jinja template engine for chat templates, byte-compatible with jinja2 3.1 as transformers runs it:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls, HF's tojson
// (json.dumps, ensure_ascii False), raise_exception and strftime_now, and {% generation %} blocks.
//
//   jinja::Template t(source);               // parse once (Error on a syntax error, naming line and column)
//   std::string out = t.render(variables);   // py::Dict of the template's variables
//
// Rendering errors (undefined operations, raise_exception, limits) throw kestrel::Error.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/py_value.h"
#include "text/jinja_lexer.h"

namespace kestrel::jinja {

class Template {
public:
  explicit Template(std::string_view source, Options options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  std::string render(const py::Dict& variables) const;
  const Options& options() const { return options_; }

private:
  struct Parsed;
  Options options_;
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace kestrel::jinja

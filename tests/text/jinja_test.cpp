// The Jinja engine: every case in tests/data/templates/engine_cases.json (each feature, rendered by jinja2 in
// transformers' environment by tools/make_template_fixtures.py) gives the same output or also fails; plus the
// engine's own errors (syntax with line and column, unknown filters, raise_exception) and limits (steps,
// recursion, nesting, sizes).
#include "text/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "base/python_json.h"
#include "template_fixtures.h"

namespace kestrel {
namespace {

std::string render(const std::string& source, const std::string& variables_json = "{}", jinja::Options options = {}) {
  const jinja::Template t(source, options);
  const py::Value vars = py::parse_json(variables_json);
  return t.render(vars.dict_ref());
}

std::string error_of(const std::string& source, const std::string& variables_json = "{}",
                     jinja::Options options = {}) {
  try {
    render(source, variables_json, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(JinjaEngine, MatchesJinja2OnEveryEngineCase) {
  const py::Value cases = testing::read_fixture("engine_cases.json");
  ASSERT_GE(cases.list_ref().items.size(), 100u);
  for (const py::Value& c : cases.list_ref().items) {
    const py::Dict& d = c.dict_ref();
    const std::string name = d.find("name")->str();
    const std::string source = d.find("template")->str();
    const py::Value& variables = *d.find("variables");
    std::string got;
    bool failed = false;
    std::string message;
    try {
      got = jinja::Template(source).render(variables.dict_ref());
    } catch (const Error& e) {
      failed = true;
      message = e.what();
    }
    if (const py::Value* expected = d.find("expected")) {
      EXPECT_FALSE(failed) << name << ": " << message;
      EXPECT_EQ(got, expected->str()) << "template: " << source;
    } else {
      EXPECT_TRUE(failed) << name << " should fail like jinja2 (" << d.find("error")->str() << "), rendered: " << got;
    }
  }
}

TEST(JinjaEngine, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}"),
            "template syntax error at line 3, column 10: unexpected end of print statement '}}'");
  EXPECT_EQ(error_of("{% for x in y %}"),
            "template syntax error at line 1, column 17: unexpected end of template, expected 'endfor'");
  EXPECT_EQ(error_of("ok\n  {% frobnicate %}"), "template syntax error at line 2, column 6: encountered unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("{{ 'unterminated }}"), "template syntax error at line 1, column 4: unterminated string");
  EXPECT_EQ(error_of("{# never closed"), "template syntax error at line 1, column 1: missing end of comment tag");
  EXPECT_EQ(error_of("{% break %}"), "template syntax error at line 1, column 4: 'break' outside of a loop");
}

TEST(JinjaEngine, UnknownFilterFailsAtParseOutsideIfAndWhenReachedInside) {
  EXPECT_EQ(error_of("\n{{ x | nosuch }}"), "template syntax error at line 2, column 8: no filter named 'nosuch'");
  EXPECT_EQ(render("{% if false %}{{ x | nosuch }}{% endif %}ok"), "ok");
  EXPECT_EQ(error_of("{% if true %}{{ x | nosuch }}{% endif %}"),
            "template error at line 1, column 21: no filter named 'nosuch'");
  EXPECT_EQ(error_of("{{ 1 is nosuch }}"), "template syntax error at line 1, column 9: no test named 'nosuch'");
}

TEST(JinjaEngine, RaiseExceptionBecomesTemplateRaised) {
  EXPECT_EQ(error_of("{% if true %}{{ raise_exception('Only user and assistant roles!') }}{% endif %}"),
            "template raised: Only user and assistant roles!");
}

TEST(JinjaEngine, RuntimeErrorsNameTheirPlace) {
  EXPECT_EQ(error_of("a\nb {{ x.y }}"), "template error at line 2, column 7: 'x' is undefined");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "template error at line 1, column 4: integer division or modulo by zero");
}

TEST(JinjaEngine, StepLimitStopsHugeLoops) {
  jinja::Options options;
  options.max_steps = 100000;
  const std::string e = error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}",
                                 options);
  EXPECT_NE(e.find("exceeded the limit of 100000 evaluation steps"), std::string::npos) << e;
}

TEST(JinjaEngine, RecursionLimitStopsRunawayMacros) {
  const std::string e = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(e.find("maximum recursion depth (100) exceeded in macro 'f'"), std::string::npos) << e;
  const std::string loop = error_of("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}");
  EXPECT_NE(loop.find("maximum recursion depth"), std::string::npos) << loop;
}

TEST(JinjaEngine, DeepNestingIsAnErrorNotACrash) {
  std::string parens(5000, '(');
  EXPECT_NE(error_of("{{ " + parens + "1" + std::string(5000, ')') + " }}").find("nesting too deep"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nesting too deep"), std::string::npos);
  std::string lists = "{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}";
  EXPECT_NE(error_of(lists).find("nesting too deep"), std::string::npos);
  // Values built deeper and deeper by a loop are refused at kMaxNesting, not overflowed at destruction.
  EXPECT_NE(error_of("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}")
                .find("value nesting exceeds"),
            std::string::npos);
}

TEST(JinjaEngine, OutputAndStringSizesAreBounded) {
  jinja::Options options;
  options.max_output_bytes = 1 << 20;
  EXPECT_NE(error_of("{{ 'x' * 10000000 }}", "{}", options).find("exceeds the limit"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     "{}", options)
                .find("exceeds the limit"),
            std::string::npos);
  const std::string big(1 << 20, 'z');
  EXPECT_EQ(render("{{ s | length }}{{ s.upper() | length }}{{ (s ~ s)[::-1] | length }}", "{\"s\":\"" + big + "\"}"),
            "104857610485762097152");
}

TEST(JinjaEngine, RejectsInvalidUtf8Templates) { EXPECT_THROW(jinja::Template("\xc3\x28"), Error); }

TEST(JinjaEngine, StrftimeNowFormatsTheCurrentDate) {
  const std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

}  // namespace
}  // namespace kestrel

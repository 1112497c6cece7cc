// Python-compatible JSON: json.dumps(json.loads(doc), **options) for every case in
// tests/data/templates/json_cases.json (written by tools/make_template_fixtures.py with CPython's json), plus
// float repr, parsing and hostile inputs.
#include "base/python_json.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../text/template_fixtures.h"
#include "base/error.h"

namespace kestrel::py {
namespace {

TEST(PythonJson, MatchesJsonDumpsOnEveryFixtureCase) {
  const Value cases = testing::read_fixture("json_cases.json");
  ASSERT_GE(cases.list_ref().items.size(), 60u);
  for (const Value& c : cases.list_ref().items) {
    const Dict& d = c.dict_ref();
    const Dict& opt = d.find("options")->dict_ref();
    JsonDumpOptions o;
    if (const Value* v = opt.find("ensure_ascii")) o.ensure_ascii = v->as_bool();
    if (const Value* v = opt.find("indent")) o.indent = std::string(static_cast<size_t>(v->as_int()), ' ');
    if (const Value* v = opt.find("sort_keys")) o.sort_keys = v->as_bool();
    if (const Value* v = opt.find("separators")) {
      o.item_separator = v->list_ref().items[0].str();
      o.key_separator = v->list_ref().items[1].str();
    }
    const std::string input = d.find("input")->str();
    EXPECT_EQ(json_dumps(parse_json(input), o), d.find("expected")->str()) << input << " " << py_repr(*d.find("options"));
  }
}

TEST(PythonJson, FloatReprIsPythons) {
  EXPECT_EQ(py_float_repr(1.0), "1.0");
  EXPECT_EQ(py_float_repr(1e-05), "1e-05");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py_float_repr(-0.0), "-0.0");
  EXPECT_EQ(py_float_repr(5e-324), "5e-324");
  EXPECT_EQ(py_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(py_float_repr(123456789.125), "123456789.125");
  EXPECT_EQ(py_float_repr(HUGE_VAL), "inf");
  EXPECT_EQ(py_float_repr(std::nan("")), "nan");
  EXPECT_EQ(json_dumps(Value::floating(-HUGE_VAL)), "-Infinity");
  EXPECT_EQ(json_dumps(Value::floating(std::nan(""))), "NaN");
}

TEST(PythonJson, ParsesKeepingOrderAndPythonDuplicateSemantics) {
  const Value v = parse_json(R"({"b": 1, "a": 2, "b": 3})");
  ASSERT_EQ(v.dict_ref().size(), 2u);
  EXPECT_EQ(v.dict_ref().items()[0].first.str(), "b");
  EXPECT_EQ(v.dict_ref().items()[0].second.as_int(), 3);
  EXPECT_TRUE(parse_json("1.0").is_float());
  EXPECT_TRUE(parse_json("-0").is_int());
  EXPECT_EQ(parse_json(R"("\ud83d\ude00")").str(), "\xf0\x9f\x98\x80");
}

TEST(PythonJson, HostileInputsAreErrors) {
  EXPECT_THROW(parse_json("[1,]"), Error);
  EXPECT_THROW(parse_json("{\"a\" 1}"), Error);
  EXPECT_THROW(parse_json("\"\\ud800\""), Error);
  EXPECT_THROW(parse_json("\"\xff\""), Error);
  EXPECT_THROW(parse_json("99999999999999999999"), Error);
  EXPECT_THROW(parse_json("[1] x"), Error);
  EXPECT_THROW(parse_json(std::string(1000000, '[')), Error);
  EXPECT_THROW(parse_json(std::string(1000000, '{')), Error);
  std::string ok_deep;
  for (int i = 0; i < 500; ++i) ok_deep += "[";
  for (int i = 0; i < 500; ++i) ok_deep += "]";
  EXPECT_EQ(json_dumps(parse_json(ok_deep)), ok_deep);
  const std::string big = "\"" + std::string(1 << 20, 'q') + "\"";
  EXPECT_EQ(json_dumps(parse_json(big)), big);
}

}  // namespace
}  // namespace kestrel::py

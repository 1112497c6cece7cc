// A Python-like value: the data model of the Jinja engine and of Python-compatible JSON (base/python_json.h).
// Kinds mirror what chat templates see from Python: None, bool, int (int64), float, str (UTF-8), list/tuple and
// dict (insertion-ordered, keys hashed as Python does: 1, 1.0 and True are one key), plus jinja2's Undefined and
// opaque objects (macros, namespaces, builtin functions — defined by the engine). Lists and dicts have reference
// semantics like Python's; strings are values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kestrel::py {

class Value;
struct List;
class Dict;

// An engine-defined object (macro, namespace, builtin function). The engine downcasts by kind().
class Object {
public:
  virtual ~Object() = default;
  virtual std::string_view type_name() const = 0;
  virtual std::string repr() const;
};

// Containers deeper than this are refused when built (keeps recursive printing, comparison and destruction of
// values far from the stack limit whatever a template or a JSON document does).
inline constexpr uint32_t kMaxNesting = 512;

class Value {
public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  static Value list(std::vector<Value> items = {}, bool tuple = false);  // throws Error when nested too deep
  static Value dict(std::shared_ptr<Dict> d);
  static Value dict();
  static Value object(std::shared_ptr<Object> o);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_object() const { return kind_ == Kind::Object; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? static_cast<int64_t>(b_) : i_; }
  double as_double() const;  // int, bool or float
  const std::string& str() const { return s_; }  // string content, or the undefined hint
  List& list_ref() const { return *list_; }
  Dict& dict_ref() const { return *dict_; }
  Object& object_ref() const { return *obj_; }
  const std::shared_ptr<List>& list_ptr() const { return list_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const std::shared_ptr<Object>& object_ptr() const { return obj_; }
  uint32_t depth() const;  // 0 for scalars, 1 + deepest child for containers

  // Python truthiness (Undefined is false, objects true).
  bool truthy() const;
  // Python's type(x).__name__ ("NoneType", "int", "str", "list", "tuple", "dict", ...).
  std::string_view type_name() const;

private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Object> obj_;
};

struct List {
  std::vector<Value> items;
  bool tuple = false;
  uint32_t depth = 1;
};

// Insertion-ordered dict with Python key semantics (keys must be hashable: None, bool, int, float, str, tuple).
class Dict {
public:
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value value);
  void set(std::string_view key, Value value) { set(Value::string(std::string(key)), std::move(value)); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  uint32_t depth() const { return depth_; }

private:
  static std::string hash_key(const Value& key);  // throws Error for unhashable keys
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, size_t> index_;
  uint32_t depth_ = 1;
};

// Python ==, <, str() and repr().
bool py_equal(const Value& a, const Value& b);
bool py_less(const Value& a, const Value& b);  // throws Error("'<' not supported ...") for unorderable operands
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);  // repr(float): shortest round-trip, "1.0", "1e-05", "1e+16", "inf", "nan"
std::string py_string_repr(std::string_view s);

}  // namespace kestrel::py

// The Jinja interpreter's runtime value (internal to src/model/jinja_*.cpp): a Python object as
// chat templates see one, with Python's str(), repr(), truthiness, comparisons and arithmetic.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::jinja {

// A failure without a line: the evaluator turns it into JinjaError("line N: ...") at the
// expression or statement it came from.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bounds on what one render may build, so that a hostile template fails instead of exhausting
// memory (strings and lists grow exponentially through a namespace otherwise).
inline constexpr size_t kMaxString = size_t{64} << 20;
inline constexpr size_t kMaxItems = size_t{1} << 20;

class Renderer;
struct Value;
struct Args;
using Seq = std::vector<Value>;

// A dict keeps its insertion order, as Python's does; lookups are linear (chat template dicts
// are small).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

// A function the template can call: a global, a bound method, a macro, loop.cycle.
struct Callable {
  std::string name;
  std::function<Value(Renderer&, Args&)> fn;
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  uint16_t depth = 0;  // containers nested inside (bounded: destroying a deep chain recurses)
  bool big = false;    // Int: i holds the bits of a JSON unsigned integer above INT64_MAX
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                     // String; for Undefined, the error an operation on it raises
  std::shared_ptr<const Seq> seq;    // List, Tuple
  std::shared_ptr<DictData> dict;    // Dict (not changed once built), Namespace (set ns.x changes it)
  std::shared_ptr<const Callable> fn;

  static Value undefined(std::string why);
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value list(Seq v);
  static Value tuple(Seq v);
  static Value dict_of(DictData d);
  static Value callable(std::string name, std::function<Value(Renderer&, Args&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_integral() const { return kind == Kind::Int || kind == Kind::Bool; }
  bool is_seq() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_mapping() const { return kind == Kind::Dict; }
  // A big unsigned integer saturates here; arithmetic on one fails (binary_op), printing is exact.
  int64_t as_int() const { return kind == Kind::Bool ? int64_t{b} : big ? INT64_MAX : i; }
  double as_double() const {
    return kind == Kind::Float ? f : big ? static_cast<double>(static_cast<uint64_t>(i)) : static_cast<double>(as_int());
  }
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// The arguments bound to a builtin's parameters by position, then by keyword; a missing one is
// nullopt. Too many or unknown ones fail, naming `what`.
std::vector<std::optional<Value>> bind_args(const Args& args, std::string_view what,
                                            std::initializer_list<std::string_view> params);

// Python's type name as Jinja's messages write it ('dict object' etc.).
std::string type_name(const Value& v);
bool truthy(const Value& v);
std::string to_str(const Value& v);   // str()
std::string repr(const Value& v);     // repr()
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);  // <0, 0, >0; Failure for types Python cannot order
[[noreturn]] void raise_undefined(const Value& v);

// Operators: + - * / // % ** and unary minus, with Python's rules.
Value binary_op(std::string_view op, const Value& a, const Value& b);
Value negate(const Value& v);
Value concat(const Value& a, const Value& b);  // ~
bool contains(const Value& container, const Value& item);  // Python's `in`

// The items a for loop (or a filter) walks: a list's items, a dict's keys, a string's characters.
Seq iterate(const Value& v);
int64_t length(const Value& v);

// Item and attribute access as Jinja's sandbox does it; a miss is Undefined.
Value get_item(const Value& obj, const Value& key);
Value get_attr(const Value& obj, std::string_view name);
// obj[start:stop:step] on a list, tuple or string (null: left out), as Python slices.
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);

Value from_json(const nlohmann::ordered_json& j);
// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys): `indent` unset is
// json.dumps's indent=None (one line), else the text each level indents by.
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

// UTF-8 helpers: Python's strings are sequences of code points.
std::vector<std::string> code_points(std::string_view s);
size_t code_point_count(std::string_view s);
void check_size(size_t n);  // fails past kMaxString

// The work budget of the render running on this thread: each step, and each list item or 64
// bytes of string built, costs one unit; running out fails (a template that would run for hours).
void charge(int64_t units);
class BudgetScope {
public:
  explicit BudgetScope(int64_t units);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

private:
  int64_t units_;
  int64_t* saved_;
};

}  // namespace strata::jinja

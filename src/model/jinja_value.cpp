// The Jinja interpreter's values: Python's str(), repr(), truthiness, comparisons, arithmetic and
// json.dumps, written to match CPython to the byte where chat templates print them.
#include "jinja_value.h"

#include "strata/model/chat_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace strata::jinja {

namespace {

// Nested containers deeper than this are refused by the recursive functions below (a namespace
// can hold itself).
constexpr int kMaxNesting = 400;

void check_nesting(int depth) {
  if (depth > kMaxNesting) throw Failure("values nested too deeply");
}

// Python's short type names, as its TypeError messages write them.
std::string py_type(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "object";
}

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  throw Failure("unsupported operand type(s) for " + std::string(op) + ": '" + py_type(a) + "' and '" +
                py_type(b) + "'");
}

// Length of the UTF-8 sequence starting at s[i]; 1 for a byte that does not start a valid one.
size_t utf8_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 1;
  return n;
}

uint32_t decode_at(std::string_view s, size_t i, size_t n) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0xff >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return cp;
}

std::string string_repr(std::string_view s) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char quote = dq ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    const uint32_t cp = decode_at(s, i, n);
    if (cp == static_cast<unsigned char>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7f || (n == 1 && cp >= 0x80) || (cp >= 0x80 && cp <= 0xa0) || cp == 0xad) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);  // non-printable (or a stray byte)
      out += buf;
    } else if (cp == 0x2028 || cp == 0x2029) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  out += quote;
  return out;
}

std::string repr_at(const Value& v, int depth);

std::string seq_repr(const Value& v, int depth) {
  const bool tuple = v.kind == Kind::Tuple;
  std::string out = tuple ? "(" : "[";
  for (size_t k = 0; k < v.seq->size(); ++k) {
    if (k) out += ", ";
    out += repr_at((*v.seq)[k], depth + 1);
  }
  if (tuple && v.seq->size() == 1) out += ',';
  out += tuple ? ")" : "]";
  return out;
}

std::string dict_repr(const DictData& d, int depth) {
  std::string out = "{";
  for (size_t k = 0; k < d.items.size(); ++k) {
    if (k) out += ", ";
    out += repr_at(d.items[k].first, depth + 1) + ": " + repr_at(d.items[k].second, depth + 1);
  }
  return out + "}";
}

std::string str_at(const Value& v, int depth) {
  check_nesting(depth);
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return v.big ? std::to_string(static_cast<uint64_t>(v.i)) : std::to_string(v.i);
    case Kind::Float: return python_float(v.f);
    case Kind::String: return v.s;
    case Kind::List:
    case Kind::Tuple: return seq_repr(v, depth);
    case Kind::Dict: return dict_repr(*v.dict, depth);
    case Kind::Namespace: return "<Namespace " + dict_repr(*v.dict, depth) + ">";
    case Kind::Callable: return "<function " + v.fn->name + ">";
  }
  return "";
}

std::string repr_at(const Value& v, int depth) {
  if (v.kind == Kind::String) return string_repr(v.s);
  if (v.kind == Kind::Undefined) return "Undefined";
  return str_at(v, depth);
}

bool equals_at(const Value& a, const Value& b, int depth) {
  check_nesting(depth);
  if (a.is_number() && b.is_number()) {
    if (a.big || b.big) return a.big && b.big && a.i == b.i;
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List:
    case Kind::Tuple:
      if (a.seq->size() != b.seq->size()) return false;
      for (size_t k = 0; k < a.seq->size(); ++k)
        if (!equals_at((*a.seq)[k], (*b.seq)[k], depth + 1)) return false;
      return true;
    case Kind::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, value] : a.dict->items) {
        const Value* other = b.dict->find(key);
        if (!other || !equals_at(value, *other, depth + 1)) return false;
      }
      return true;
    case Kind::Namespace: return a.dict == b.dict;
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

int compare_at(const Value& a, const Value& b, int depth) {
  check_nesting(depth);
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) {
    if ((a.big || b.big) && a.is_integral() && b.is_integral()) {
      if (a.big && b.big) return a.i == b.i ? 0 : static_cast<uint64_t>(a.i) < static_cast<uint64_t>(b.i) ? -1 : 1;
      return a.big ? 1 : -1;
    }
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::String && b.kind == Kind::String) {
    const int c = a.s.compare(b.s);  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_seq() && a.kind == b.kind) {
    const size_t n = std::min(a.seq->size(), b.seq->size());
    for (size_t k = 0; k < n; ++k)
      if (!equals_at((*a.seq)[k], (*b.seq)[k], depth + 1)) return compare_at((*a.seq)[k], (*b.seq)[k], depth + 1);
    return a.seq->size() < b.seq->size() ? -1 : a.seq->size() > b.seq->size() ? 1 : 0;
  }
  throw Failure("'<' not supported between instances of '" + py_type(a) + "' and '" + py_type(b) + "'");
}

[[noreturn]] void overflow() { throw Failure("integer overflow (Python's integers are unbounded; these are 64-bit)"); }

int64_t add_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

// Python's floor division and modulo on integers (rounding toward negative infinity).
int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw Failure("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == 0) throw Failure("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double float_mod(double a, double b) {
  if (b == 0) throw Failure("float modulo");
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(const Value& seq, int64_t n) {
  if (n <= 0) return seq.kind == Kind::String ? Value::string("") : seq.kind == Kind::Tuple ? Value::tuple({})
                                                                                            : Value::list({});
  const auto count = static_cast<uint64_t>(n);
  if (seq.kind == Kind::String) {
    if (!seq.s.empty() && count > kMaxString / seq.s.size()) throw Failure("string too long");
    std::string out;
    out.reserve(seq.s.size() * count);
    for (uint64_t k = 0; k < count; ++k) out += seq.s;
    return Value::string(std::move(out));
  }
  if (!seq.seq->empty() && count > kMaxItems / seq.seq->size()) throw Failure("list too long");
  Seq out;
  for (uint64_t k = 0; k < count; ++k) out.insert(out.end(), seq.seq->begin(), seq.seq->end());
  return seq.kind == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    const uint32_t cp = decode_at(s, i, n);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x80)) {
          if (cp >= 0x10000) {  // a surrogate pair, as json.dumps writes one
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          out.append(s.substr(i, n));
        }
    }
    i += n;
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return python_float(d);
}

void json_at(std::string& out, const Value& v, const JsonOptions& o, int level) {
  check_nesting(level);
  if (out.size() > kMaxString) throw Failure("string too long");
  auto newline = [&](int l) {
    out += '\n';
    for (int k = 0; k < l; ++k) out += *o.indent;
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += v.big ? std::to_string(static_cast<uint64_t>(v.i)) : std::to_string(v.i); return;
    case Kind::Float: out += json_float(v.f); return;
    case Kind::String: json_string(out, v.s, o.ensure_ascii); return;
    case Kind::List:
    case Kind::Tuple: {
      if (v.seq->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (o.indent) newline(level + 1);
      for (size_t k = 0; k < v.seq->size(); ++k) {
        if (k) {
          out += o.item_sep;
          if (o.indent) newline(level + 1);
        }
        json_at(out, (*v.seq)[k], o, level + 1);
      }
      if (o.indent) newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      // Keys become strings as json.dumps makes them; sort_keys orders the original keys.
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto* x, const auto* y) {
          return x->first.is_string() && y->first.is_string() ? x->first.s < y->first.s
                                                               : compare(x->first, y->first) < 0;
        });
      out += '{';
      if (o.indent) newline(level + 1);
      bool first = true;
      for (const auto* item : items) {
        if (!first) {
          out += o.item_sep;
          if (o.indent) newline(level + 1);
        }
        first = false;
        const Value& key = item->first;
        if (key.kind == Kind::String) json_string(out, key.s, o.ensure_ascii);
        else if (key.kind == Kind::Float) out += '"' + json_float(key.f) + '"';
        else if (key.kind == Kind::Int || key.kind == Kind::Bool || key.kind == Kind::None)
          out += '"' + to_json(key, o) + '"';
        else
          throw Failure("keys must be str, int, float, bool or None, not " + py_type(key));
        out += o.key_sep;
        json_at(out, item->second, o, level + 1);
      }
      if (o.indent) newline(level);
      out += '}';
      return;
    }
    default: throw Failure("Object of type " + py_type(v) + " is not JSON serializable");
  }
}

uint16_t nested_depth(const Seq& items) {
  uint16_t depth = 0;
  for (const Value& x : items) depth = std::max(depth, x.depth);
  if (depth + 1 > kMaxNesting) throw Failure("values nested too deeply");
  return static_cast<uint16_t>(depth + 1);
}

thread_local int64_t* t_budget = nullptr;

}  // namespace

void charge(int64_t units) {
  if (t_budget && (*t_budget -= units) < 0) throw Failure("template too expensive (it ran past its work budget)");
}

BudgetScope::BudgetScope(int64_t units) : units_(units), saved_(t_budget) { t_budget = &units_; }
BudgetScope::~BudgetScope() { t_budget = saved_; }

const Value* DictData::find(const Value& key) const {
  if (key.kind == Kind::String) return find(std::string_view(key.s));
  for (const auto& item : items)
    if (equals(item.first, key)) return &item.second;
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& item : items)
    if (item.first.kind == Kind::String && item.first.s == key) return &item.second;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& item : items)
    if (equals(item.first, key)) {
      item.second = std::move(value);
      return;
    }
  if (items.size() >= kMaxItems) throw Failure("dict too large");
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string why) {
  Value v;
  v.s = std::move(why);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(x);
  return v;
}
Value Value::list(Seq x) {
  if (x.size() > kMaxItems) throw Failure("list too long");
  charge(static_cast<int64_t>(x.size()));
  Value v;
  v.kind = Kind::List;
  v.depth = nested_depth(x);
  v.seq = std::make_shared<const Seq>(std::move(x));
  return v;
}
Value Value::tuple(Seq x) {
  Value v = list(std::move(x));
  v.kind = Kind::Tuple;
  return v;
}
Value Value::dict_of(DictData d) {
  charge(static_cast<int64_t>(d.items.size()));
  Value v;
  v.kind = Kind::Dict;
  for (const auto& [key, value] : d.items) v.depth = std::max<uint16_t>(v.depth, std::max(key.depth, value.depth));
  if (++v.depth > kMaxNesting) throw Failure("values nested too deeply");
  v.dict = std::make_shared<DictData>(std::move(d));
  return v;
}
Value Value::callable(std::string name, std::function<Value(Renderer&, Args&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

std::vector<std::optional<Value>> bind_args(const Args& args, std::string_view what,
                                            std::initializer_list<std::string_view> params) {
  std::vector<std::optional<Value>> out(params.size());
  if (args.pos.size() > params.size())
    throw Failure(std::string(what) + "() takes at most " + std::to_string(params.size()) + " argument(s)");
  for (size_t k = 0; k < args.pos.size(); ++k) out[k] = args.pos[k];
  for (const auto& [name, value] : args.kw) {
    size_t k = 0;
    for (const std::string_view p : params) {
      if (p == name) break;
      ++k;
    }
    if (k == params.size()) throw Failure(std::string(what) + "() got an unexpected keyword argument '" + name + "'");
    if (out[k]) throw Failure(std::string(what) + "() got multiple values for argument '" + name + "'");
    out[k] = value;
  }
  return out;
}

std::string type_name(const Value& v) { return py_type(v) + " object"; }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s.empty();
    case Kind::List:
    case Kind::Tuple: return !v.seq->empty();
    case Kind::Dict: return !v.dict->items.empty();
    default: return true;
  }
}

std::string to_str(const Value& v) { return str_at(v, 0); }
std::string repr(const Value& v) { return repr_at(v, 0); }

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
int compare(const Value& a, const Value& b) { return compare_at(a, b, 0); }

void raise_undefined(const Value& v) { throw Failure(v.s.empty() ? "undefined value" : v.s); }

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.big || b.big) overflow();
  const bool nums = a.is_number() && b.is_number(), ints = a.is_integral() && b.is_integral();
  switch (op.size() == 1 ? op[0] : op == "//" ? 'f' : op == "**" ? 'p' : '?') {
    case '+':
      if (ints) return Value::integer(add_checked(a.as_int(), b.as_int()));
      if (nums) return Value::number(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        check_size(a.s.size() + b.s.size());
        return Value::string(a.s + b.s);
      }
      if (a.is_seq() && a.kind == b.kind) {
        Seq out = *a.seq;
        out.insert(out.end(), b.seq->begin(), b.seq->end());
        return a.kind == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      break;
    case '-':
      if (ints) return Value::integer(sub_checked(a.as_int(), b.as_int()));
      if (nums) return Value::number(a.as_double() - b.as_double());
      break;
    case '*':
      if (ints) return Value::integer(mul_checked(a.as_int(), b.as_int()));
      if (nums) return Value::number(a.as_double() * b.as_double());
      if ((a.is_string() || a.is_seq()) && b.is_integral()) return repeat(a, b.as_int());
      if (a.is_integral() && (b.is_string() || b.is_seq())) return repeat(b, a.as_int());
      break;
    case '/':
      if (nums) {
        if (b.as_double() == 0) throw Failure("division by zero");
        return Value::number(a.as_double() / b.as_double());
      }
      break;
    case 'f':
      if (ints) return Value::integer(floor_div(a.as_int(), b.as_int()));
      if (nums) {
        if (b.as_double() == 0) throw Failure("float floor division by zero");
        const double x = a.as_double(), y = b.as_double();
        return Value::number(std::floor((x - float_mod(x, y)) / y + 0.5));
      }
      break;
    case '%':
      if (ints) return Value::integer(floor_mod(a.as_int(), b.as_int()));
      if (nums) return Value::number(float_mod(a.as_double(), b.as_double()));
      if (a.is_string()) throw Failure("string formatting with % is not supported");
      break;
    case 'p':
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), e = b.as_int(), acc = 1;
        while (e > 0) {
          if (e & 1) acc = mul_checked(acc, base);
          e >>= 1;
          if (e > 0) base = mul_checked(base, base);
        }
        return Value::integer(acc);
      }
      if (nums) {
        if (a.as_double() == 0 && b.as_double() < 0) throw Failure("0.0 cannot be raised to a negative power");
        return Value::number(std::pow(a.as_double(), b.as_double()));
      }
      break;
    default: break;
  }
  unsupported(op, a, b);
}

Value negate(const Value& v) {
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_integral()) {
    if (v.big || v.as_int() == INT64_MIN) overflow();
    return Value::integer(-v.as_int());
  }
  if (v.kind == Kind::Float) return Value::number(-v.f);
  throw Failure("bad operand type for unary -: '" + py_type(v) + "'");
}

Value concat(const Value& a, const Value& b) {
  std::string x = to_str(a);
  const std::string y = to_str(b);
  check_size(x.size() + y.size());
  return Value::string(x + y);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::String:
      if (!item.is_string())
        throw Failure("'in <string>' requires string as left operand, not " + py_type(item));
      return container.s.find(item.s) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      for (const Value& x : *container.seq)
        if (equals(x, item)) return true;
      return false;
    case Kind::Dict: return container.dict->find(item) != nullptr;
    case Kind::Undefined: return false;  // Jinja's Undefined iterates as empty
    default: throw Failure("argument of type '" + py_type(container) + "' is not iterable");
  }
}

Seq iterate(const Value& v) {
  switch (v.kind) {
    case Kind::List:
    case Kind::Tuple: return *v.seq;
    case Kind::Dict: {
      Seq keys;
      for (const auto& item : v.dict->items) keys.push_back(item.first);
      return keys;
    }
    case Kind::String: {
      Seq chars;
      for (std::string& c : code_points(v.s)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    case Kind::Undefined: return {};
    default: throw Failure("'" + py_type(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::String: return static_cast<int64_t>(code_point_count(v.s));
    case Kind::List:
    case Kind::Tuple: return static_cast<int64_t>(v.seq->size());
    case Kind::Dict: return static_cast<int64_t>(v.dict->items.size());
    case Kind::Undefined: return 0;
    default: throw Failure("object of type '" + py_type(v) + "' has no len()");
  }
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  check_nesting(depth);
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      Value v = Value::integer(static_cast<int64_t>(u));
      v.big = u > static_cast<uint64_t>(INT64_MAX);  // printed exactly; arithmetic on it fails
      return v;
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Seq items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json_at(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DictData d;
      d.items.reserve(j.size());
      for (const auto& [key, x] : j.items()) d.items.emplace_back(Value::string(key), from_json_at(x, depth + 1));
      return Value::dict_of(std::move(d));
    }
    default: return Value::none();
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_at(out, v, options, 0);
  return out;
}

std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t count = 0;
  for (size_t i = 0; i < s.size(); i += utf8_len(s, i)) ++count;
  return count;
}

void check_size(size_t n) {
  if (n > kMaxString) throw Failure("string too long (over 64 MiB)");
  charge(static_cast<int64_t>(n >> 6));
}

}  // namespace strata::jinja

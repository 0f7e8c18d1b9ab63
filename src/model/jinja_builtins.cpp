// The Jinja interpreter's builtins: Jinja2's filters and tests (jinja2/filters.py, tests.py),
// the Python methods of str, dict and list that the immutable sandbox allows, attribute and item
// access, and the globals transformers provides (raise_exception, strftime_now) beside Jinja's
// (namespace, range, dict).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "jinja_eval.h"

namespace strata::jinja {

namespace {

using FilterFn = Value (*)(Renderer&, const Value&, Args&);
using TestFn = bool (*)(Renderer&, const Value&, Args&);

// Jinja's sandbox refuses ranges longer than this (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

// ---- strings (Python's str works on code points; case changes here are ASCII only) ----

char lower_c(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
char upper_c(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
bool is_alpha_c(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// A non-ASCII byte counts as a letter, so that "héllo".title() keeps the word whole.
bool is_letter_byte(char c) { return is_alpha_c(c) || static_cast<unsigned char>(c) >= 0x80; }

std::string lower(std::string s) {
  for (char& c : s) c = lower_c(c);
  return s;
}
std::string upper(std::string s) {
  for (char& c : s) c = upper_c(c);
  return s;
}

// Python's str.isspace() for one code point (its whitespace is Unicode's).
bool is_py_space(std::string_view cp) {
  if (cp.size() == 1) {
    const auto c = static_cast<unsigned char>(cp[0]);
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  }
  static const std::string_view kSpaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
                                             "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008",
                                             "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
                                             "\u3000"};
  for (const std::string_view s : kSpaces)
    if (cp == s) return true;
  return false;
}

// strip / lstrip / rstrip: whitespace, or the code points of `chars`.
std::string strip(std::string_view s, const Value* chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s);
  std::vector<std::string> set;
  if (chars && !chars->is_none()) {
    if (!chars->is_string()) throw Failure("strip arg must be None or str");
    set = code_points(chars->s);
  }
  auto strippable = [&](const std::string& cp) {
    return chars && !chars->is_none() ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  std::string out;
  for (size_t k = begin; k < end; ++k) out += cps[k];
  return out;
}

std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<std::string> cps = code_points(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  std::vector<std::string> parts;
  size_t k = 0;
  while (true) {
    while (k < cps.size() && is_py_space(cps[k])) ++k;
    if (k == cps.size()) break;
    std::string word;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      // The rest as it is (Python keeps its whitespace on the far side).
      for (; k < cps.size(); ++k) word += cps[k];
      parts.push_back(word);
      break;
    }
    while (k < cps.size() && !is_py_space(cps[k])) word += cps[k++];
    parts.push_back(word);
  }
  if (from_right) {
    std::reverse(parts.begin(), parts.end());
    for (std::string& p : parts) {  // each part was built reversed, code point by code point
      std::vector<std::string> back = code_points(p);
      std::reverse(back.begin(), back.end());
      p.clear();
      for (const std::string& cp : back) p += cp;
    }
  }
  return parts;
}

std::vector<std::string> split_on(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) throw Failure("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t p = s.find(sep, start);
      if (p == std::string_view::npos) break;
      parts.emplace_back(s.substr(start, p - start));
      start = p + sep.size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t p = s.rfind(sep, end - sep.size());
    if (p == std::string_view::npos) break;
    parts.emplace_back(s.substr(p + sep.size(), end - p - sep.size()));
    end = p;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

// Python's str.splitlines: \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029 end lines.
std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t n = 0;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') n = 2;
    else if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e) n = 1;
    else if (s.substr(i, 2) == "\u0085") n = 2;
    else if (s.substr(i, 3) == "\u2028" || s.substr(i, 3) == "\u2029") n = 3;
    if (n == 0) {
      ++i;
      continue;
    }
    lines.emplace_back(s.substr(start, (keepends ? i + n : i) - start));
    i += n;
    start = i;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python puts `with` between every character (and at both ends)
    const std::vector<std::string> cps = code_points(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (k < cps.size()) out += cps[k];
      check_size(out.size());
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(old, start);
    if (p == std::string_view::npos) break;
    out.append(s.substr(start, p - start)).append(with);
    check_size(out.size());
    start = p + old.size();
    ++done;
  }
  out.append(s.substr(start));
  check_size(out.size());
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's str.title(): a letter after a non-letter is upper-cased, other letters lower-cased.
std::string py_title(std::string s) {
  bool prev_letter = false;
  for (char& c : s) {
    if (is_alpha_c(c)) c = prev_letter ? lower_c(c) : upper_c(c);
    prev_letter = is_letter_byte(c);
  }
  return s;
}

std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = upper_c(out[0]);
  return out;
}

// Python's str.center / ljust / rjust.
std::string pad(const std::string& s, int64_t width, std::string_view fill, char how) {
  const auto len = static_cast<int64_t>(code_point_count(s));
  if (width <= len) return s;
  if (width > static_cast<int64_t>(kMaxString)) throw Failure("string too long");
  const int64_t total = width - len;
  int64_t left = how == 'l' ? 0 : how == 'r' ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < total - left; ++k) out += fill;
  return out;
}

// ---- argument helpers ----

std::string need_str(const Value& v, std::string_view what) {
  if (!v.is_string()) throw Failure(std::string(what) + " must be a string, not " + type_name(v));
  return v.s;
}

int64_t need_int(const Value& v, std::string_view what) {
  if (!v.is_integral()) throw Failure(std::string(what) + " must be an integer, not " + type_name(v));
  return v.as_int();
}

bool opt_bool(const std::optional<Value>& v, bool fallback) { return v ? truthy(*v) : fallback; }

// A code point index into s, from a byte offset.
int64_t cp_index(std::string_view s, size_t byte) { return static_cast<int64_t>(code_point_count(s.substr(0, byte))); }

// Jinja's make_attrgetter: "a.b.0" reads item a, then b, then 0 (an integer part as an index).
Value attr_path(const Value& item, const Value& path) {
  if (!path.is_string()) return get_item(item, path);
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.s.find('.', start);
    const std::string part = path.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (v.is_undefined()) raise_undefined(v);  // Jinja's getitem on Undefined raises
    v = digits && part.size() < 18 ? get_item(v, Value::integer(std::stoll(part))) : get_item(v, Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Jinja's sort key: strings compared lower-cased unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(lower(v.s)) : v;
}

// A stable merge sort whose comparison may throw (incomparable types): std::sort's behaviour is
// undefined for an inconsistent comparison (NaN), this one stays in bounds whatever it says.
void stable_sort_values(std::vector<std::pair<Value, Value>>& items, bool reverse) {
  auto less = [reverse](const Value& a, const Value& b) { return reverse ? compare(b, a) < 0 : compare(a, b) < 0; };
  const size_t n = items.size();
  std::vector<std::pair<Value, Value>> tmp(n);
  for (size_t width = 1; width < n; width *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * width) {
      const size_t mid = std::min(lo + width, n), hi = std::min(lo + 2 * width, n);
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) tmp[k++] = less(items[j].first, items[i].first) ? items[j++] : items[i++];
      while (i < mid) tmp[k++] = items[i++];
      while (j < hi) tmp[k++] = items[j++];
    }
    items.swap(tmp);
  }
}

// The arguments after the first `from` positional ones (a filter's or test's own, in map/select).
void filter_args_tail(const Args& args, size_t from, Args& rest) {
  rest.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(std::min(from, args.pos.size())), args.pos.end());
  rest.kw = args.kw;
}

// ---- filters ----

Value f_abs(Renderer&, const Value& v, Args& a) {
  bind_args(a, "abs", {});
  if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
  if (v.is_integral()) return v.as_int() < 0 ? negate(v) : Value::integer(v.as_int());
  throw Failure("bad operand type for abs(): '" + type_name(v) + "'");
}

Value python_getattr(const Value& obj, std::string_view name);

Value f_attr(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "attr", {"name"});
  if (!p[0]) throw Failure("attr() needs a name");
  const Value got = python_getattr(v, to_str(*p[0]));
  return got.is_undefined() ? Value::undefined("'" + type_name(v) + "' has no attribute '" + to_str(*p[0]) + "'") : got;
}

Value f_batch(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "batch", {"linecount", "fill_with"});
  const int64_t n = p[0] ? need_int(*p[0], "linecount") : 0;
  if (n <= 0) throw Failure("batch size must be positive");
  Seq out, cur;
  for (const Value& x : iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::list(std::exchange(cur, {})));
  }
  if (!cur.empty()) {
    if (p[1] && !p[1]->is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*p[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Renderer&, const Value& v, Args& a) {
  bind_args(a, "capitalize", {});
  return Value::string(capitalize(to_str(v)));
}

Value f_center(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "center", {"width"});
  return Value::string(pad(to_str(v), p[0] ? need_int(*p[0], "width") : 80, " ", 'c'));
}

Value f_length(Renderer&, const Value& v, Args& a) {
  bind_args(a, "length", {});
  return Value::integer(length(v));
}

Value f_default(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "default", {"default_value", "boolean"});
  const bool use_default = v.is_undefined() || (opt_bool(p[1], false) && !truthy(v));
  return use_default ? (p[0] ? *p[0] : Value::string("")) : v;
}

Value f_dictsort(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is_mapping()) throw Failure("dictsort needs a dict, not " + type_name(v));
  const std::string by = p[1] ? to_str(*p[1]) : "key";
  if (by != "key" && by != "value") throw Failure("You can only sort by either 'key' or 'value'");
  std::vector<std::pair<Value, Value>> items;
  for (const auto& [key, value] : v.dict->items)
    items.emplace_back(sort_key(by == "key" ? key : value, opt_bool(p[0], false)), Value::tuple({key, value}));
  stable_sort_values(items, opt_bool(p[2], false));
  Seq out;
  for (auto& item : items) out.push_back(std::move(item.second));
  return Value::list(std::move(out));
}

Value f_escape(Renderer&, const Value& v, Args& a) {
  bind_args(a, "escape", {});
  return Value::string(html_escape(to_str(v)));
}

Value f_first(Renderer&, const Value& v, Args& a) {
  bind_args(a, "first", {});
  const Seq items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Renderer&, const Value& v, Args& a) {
  bind_args(a, "last", {});
  const Seq items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// Python's float(str): surrounding whitespace allowed, the whole rest must be the number.
std::optional<double> parse_float(const std::string& text) {
  const std::string s = strip(text, nullptr, true, true);
  if (s.empty() || s.find('_') != std::string::npos || s.find("0x") != std::string::npos ||
      s.find("0X") != std::string::npos)
    return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

Value f_float(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "float", {"default"});
  const Value fallback = p[0] ? *p[0] : Value::number(0.0);
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string())
    if (const auto d = parse_float(v.s)) return Value::number(*d);
  return fallback;
}

Value f_int(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "int", {"default", "base"});
  const Value fallback = p[0] ? *p[0] : Value::integer(0);
  const int64_t base = p[1] ? need_int(*p[1], "base") : 10;
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (!v.is_string()) return fallback;
  std::string s = strip(v.s, nullptr, true, true);
  std::string digits;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_' && k > 0 && k + 1 < s.size()) continue;  // Python's digit separator
    digits += s[k];
  }
  if (base >= 2 && base <= 36 && !digits.empty()) {
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
    if (end == digits.c_str() + digits.size() && errno == 0 && !is_py_space(std::string(1, digits[0])))
      return Value::integer(n);
  }
  // Jinja tries int(float(value)) next.
  if (const auto d = parse_float(v.s); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
    return Value::integer(static_cast<int64_t>(*d));
  return fallback;
}

Value f_indent(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "indent", {"width", "first", "blank"});
  std::string indention = "    ";
  if (p[0]) {
    if (p[0]->is_string()) indention = p[0]->s;
    else indention = std::string(static_cast<size_t>(std::clamp<int64_t>(need_int(*p[0], "width"), 0, 4096)), ' ');
  }
  const std::string s = to_str(v) + "\n";  // Jinja's quirk: a trailing newline for splitlines
  const std::vector<std::string> lines = splitlines(s, false);
  std::string out;
  if (opt_bool(p[2], false)) {
    for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + indention : "") + lines[k];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      out += "\n";
      if (!lines[k].empty()) out += indention;
      out += lines[k];
      check_size(out.size());
    }
  }
  if (opt_bool(p[1], false)) out = indention + out;
  check_size(out.size());
  return Value::string(std::move(out));
}

Value f_items(Renderer&, const Value& v, Args& a) {
  bind_args(a, "items", {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_mapping()) throw Failure("Can only get item pairs from a mapping.");
  Seq out;
  for (const auto& [key, value] : v.dict->items) out.push_back(Value::tuple({key, value}));
  return Value::list(std::move(out));
}

Value f_join(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "join", {"d", "attribute"});
  const std::string sep = p[0] ? to_str(*p[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(p[1] ? attr_path(x, *p[1]) : x);
    check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_list(Renderer&, const Value& v, Args& a) {
  bind_args(a, "list", {});
  return Value::list(iterate(v));
}

Value f_lower(Renderer&, const Value& v, Args& a) {
  bind_args(a, "lower", {});
  return Value::string(lower(to_str(v)));
}

Value f_upper(Renderer&, const Value& v, Args& a) {
  bind_args(a, "upper", {});
  return Value::string(upper(to_str(v)));
}

Value f_map(Renderer& r, const Value& v, Args& a) {
  Seq out;
  const Seq items = iterate(v);
  if (!a.pos.empty()) {  // map('filter', args...)
    const std::string name = need_str(a.pos[0], "map's filter name");
    if (!is_filter(name)) throw Failure("No filter named '" + name + "'");
    for (const Value& x : items) {
      Args rest;
      filter_args_tail(a, 1, rest);
      out.push_back(apply_filter(r, name, x, rest));
    }
    return Value::list(std::move(out));
  }
  const auto p = bind_args(a, "map", {"attribute", "default"});
  if (!p[0]) throw Failure("map() needs a filter name or attribute=");
  for (const Value& x : items) {
    Value got = attr_path(x, *p[0]);
    if (got.is_undefined() && p[1]) got = *p[1];
    out.push_back(std::move(got));
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& v, Args& a, bool max, const char* what) {
  const auto p = bind_args(a, what, {"case_sensitive", "attribute"});
  const Seq items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool cs = opt_bool(p[0], false);
  auto key = [&](const Value& x) { return sort_key(p[1] ? attr_path(x, *p[1]) : x, cs); };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t k = 1; k < items.size(); ++k) {
    Value kk = key(items[k]);
    const int c = compare(kk, best_key);
    if (max ? c > 0 : c < 0) {
      best = k;
      best_key = std::move(kk);
    }
  }
  return items[best];
}

Value f_max(Renderer&, const Value& v, Args& a) { return min_max(v, a, true, "max"); }
Value f_min(Renderer&, const Value& v, Args& a) { return min_max(v, a, false, "min"); }

Value f_replace(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "replace", {"old", "new", "count"});
  if (!p[0] || !p[1]) throw Failure("replace() needs old and new");
  const int64_t count = p[2] && !p[2]->is_none() ? need_int(*p[2], "count") : -1;
  return Value::string(replace(to_str(v), to_str(*p[0]), to_str(*p[1]), count));
}

Value select_impl(Renderer& r, const Value& v, Args& a, bool with_attr, bool keep_if) {
  Seq out;
  size_t first = 0;
  Value attr;
  if (with_attr) {
    if (a.pos.empty()) throw Failure("selectattr/rejectattr need an attribute");
    attr = a.pos[0];
    first = 1;
  }
  std::string test;
  if (a.pos.size() > first) test = need_str(a.pos[first], "the test name");
  if (!test.empty() && !is_test(test)) throw Failure("No test named '" + test + "'");
  for (const Value& x : iterate(v)) {
    const Value subject = with_attr ? attr_path(x, attr) : x;
    bool ok;
    if (test.empty()) {
      ok = truthy(subject);
    } else {
      Args rest;
      filter_args_tail(a, first + 1, rest);
      ok = apply_test(r, test, subject, rest);
    }
    if (ok == keep_if) out.push_back(x);
  }
  return Value::list(std::move(out));
}

Value f_select(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, false, true); }
Value f_reject(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, false, false); }
Value f_selectattr(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, true, true); }
Value f_rejectattr(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, true, false); }

Value f_reverse(Renderer&, const Value& v, Args& a) {
  bind_args(a, "reverse", {});
  if (v.is_string()) {
    std::vector<std::string> cps = code_points(v.s);
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value::string(std::move(out));
  }
  Seq items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// Python's round(x, n): the correctly rounded decimal (half to even on the exact binary value),
// which printf's %.*f also computes.
double py_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  if (digits < -300) return 0.0 * x;
  if (digits < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(x / scale) * scale;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(digits), x);
  return std::strtod(buf, nullptr);
}

Value f_round(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "round", {"precision", "method"});
  const int64_t precision = p[0] ? need_int(*p[0], "precision") : 0;
  const std::string method = p[1] ? to_str(*p[1]) : "common";
  if (!v.is_number()) throw Failure("round() needs a number, not " + type_name(v));
  const double x = v.as_double();
  if (method == "common")  // Python's round() keeps an int an int
    return v.is_integral() && precision >= 0 ? Value::integer(v.as_int()) : Value::number(py_round(x, precision));
  if (method != "ceil" && method != "floor") throw Failure("method must be common, ceil or floor");
  const double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -300, 300)));
  return Value::number((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
}

Value f_safe(Renderer&, const Value& v, Args& a) {
  bind_args(a, "safe", {});
  return v;
}

Value f_string(Renderer&, const Value& v, Args& a) {
  bind_args(a, "string", {});
  return Value::string(to_str(v));
}

Value f_sort(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "sort", {"reverse", "case_sensitive", "attribute"});
  std::vector<std::pair<Value, Value>> items;
  for (const Value& x : iterate(v)) items.emplace_back(sort_key(p[2] ? attr_path(x, *p[2]) : x, opt_bool(p[1], false)), x);
  stable_sort_values(items, opt_bool(p[0], false));
  Seq out;
  for (auto& item : items) out.push_back(std::move(item.second));
  return Value::list(std::move(out));
}

Value f_sum(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "sum", {"attribute", "start"});
  Value total = p[1] ? *p[1] : Value::integer(0);
  for (const Value& x : iterate(v)) total = binary_op("+", total, p[0] ? attr_path(x, *p[0]) : x);
  return total;
}

// Jinja's title filter: words start after '-', whitespace or an opening bracket.
Value f_title(Renderer&, const Value& v, Args& a) {
  bind_args(a, "title", {});
  std::string s = to_str(v), out;
  bool word_start = true;
  for (const char c : s) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' || (c >= 0x09 && c <= 0x0d);
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += word_start ? upper_c(c) : lower_c(c);
      word_start = false;
    }
  }
  return Value::string(std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = opt_bool(p[0], false);
  o.sort_keys = opt_bool(p[3], false);
  if (p[1] && !p[1]->is_none()) {
    if (p[1]->is_string()) o.indent = p[1]->s;
    else o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(need_int(*p[1], "indent"), 0, 4096)), ' ');
    o.item_sep = ",";
  }
  if (p[2] && !p[2]->is_none()) {
    if (!p[2]->is_seq() || p[2]->seq->size() != 2) throw Failure("separators must be a pair of strings");
    o.item_sep = need_str((*p[2]->seq)[0], "separator");
    o.key_sep = need_str((*p[2]->seq)[1], "separator");
  }
  return Value::string(to_json(v, o));
}

Value f_trim(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "trim", {"chars"});
  return Value::string(strip(to_str(v), p[0] ? &*p[0] : nullptr, true, true));
}

Value f_unique(Renderer&, const Value& v, Args& a) {
  const auto p = bind_args(a, "unique", {"case_sensitive", "attribute"});
  Seq out, seen;
  for (const Value& x : iterate(v)) {
    Value key = sort_key(p[1] ? attr_path(x, *p[1]) : x, opt_bool(p[0], false));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(std::move(key));
    out.push_back(x);
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Renderer&, const Value& v, Args& a) {
  bind_args(a, "wordcount", {});
  int64_t count = 0;
  bool in_word = false;
  for (const char c : to_str(v)) {
    const bool word = is_letter_byte(c) || (c >= '0' && c <= '9') || c == '_';
    if (word && !in_word) ++count;
    in_word = word;
  }
  return Value::integer(count);
}

const std::map<std::string_view, FilterFn>& filters() {
  static const std::map<std::string_view, FilterFn> table = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},       {"capitalize", f_capitalize},
      {"center", f_center},     {"count", f_length},      {"d", f_default},         {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_escape}, {"indent", f_indent},    {"int", f_int},
      {"items", f_items},       {"join", f_join},         {"last", f_last},         {"length", f_length},
      {"list", f_list},         {"lower", f_lower},       {"map", f_map},           {"max", f_max},
      {"min", f_min},           {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},         {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},     {"sum", f_sum},
      {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},         {"unique", f_unique},
      {"upper", f_upper},       {"wordcount", f_wordcount},
  };
  return table;
}

// ---- tests ----

Value one_arg(const Args& a, const char* what) {
  const auto p = bind_args(a, what, {"other"});
  if (!p[0]) throw Failure(std::string(what) + "() needs an argument");
  return *p[0];
}

bool no_args(const Args& a, const char* what) {
  bind_args(a, what, {});
  return true;
}

bool t_boolean(Renderer&, const Value& v, Args& a) { return no_args(a, "boolean") && v.kind == Kind::Bool; }
bool t_callable(Renderer&, const Value& v, Args& a) { return no_args(a, "callable") && v.kind == Kind::Callable; }
bool t_defined(Renderer&, const Value& v, Args& a) { return no_args(a, "defined") && !v.is_undefined(); }
bool t_undefined(Renderer&, const Value& v, Args& a) { return no_args(a, "undefined") && v.is_undefined(); }
bool t_divisibleby(Renderer&, const Value& v, Args& a) {
  const Value n = one_arg(a, "divisibleby");
  return equals(binary_op("%", v, n), Value::integer(0));
}
bool t_eq(Renderer&, const Value& v, Args& a) { return equals(v, one_arg(a, "eq")); }
bool t_ne(Renderer&, const Value& v, Args& a) { return !equals(v, one_arg(a, "ne")); }
bool t_even(Renderer&, const Value& v, Args& a) {
  no_args(a, "even");
  return equals(binary_op("%", v, Value::integer(2)), Value::integer(0));
}
bool t_odd(Renderer&, const Value& v, Args& a) {
  no_args(a, "odd");
  return equals(binary_op("%", v, Value::integer(2)), Value::integer(1));
}
bool t_false(Renderer&, const Value& v, Args& a) { return no_args(a, "false") && v.kind == Kind::Bool && !v.b; }
bool t_true(Renderer&, const Value& v, Args& a) { return no_args(a, "true") && v.kind == Kind::Bool && v.b; }
bool t_float(Renderer&, const Value& v, Args& a) { return no_args(a, "float") && v.kind == Kind::Float; }
bool t_integer(Renderer&, const Value& v, Args& a) { return no_args(a, "integer") && v.kind == Kind::Int; }
bool t_ge(Renderer&, const Value& v, Args& a) { return compare(v, one_arg(a, "ge")) >= 0; }
bool t_gt(Renderer&, const Value& v, Args& a) { return compare(v, one_arg(a, "gt")) > 0; }
bool t_le(Renderer&, const Value& v, Args& a) { return compare(v, one_arg(a, "le")) <= 0; }
bool t_lt(Renderer&, const Value& v, Args& a) { return compare(v, one_arg(a, "lt")) < 0; }
bool t_in(Renderer&, const Value& v, Args& a) { return contains(one_arg(a, "in"), v); }
bool t_iterable(Renderer&, const Value& v, Args& a) {
  return no_args(a, "iterable") && (v.is_string() || v.is_seq() || v.is_mapping() || v.is_undefined());
}
// Python's islower()/isupper(): some cased character, none of the other case.
bool t_lower(Renderer&, const Value& v, Args& a) {
  no_args(a, "lower");
  const std::string s = to_str(v);
  return std::any_of(s.begin(), s.end(), is_alpha_c) && lower(s) == s;
}
bool t_upper(Renderer&, const Value& v, Args& a) {
  no_args(a, "upper");
  const std::string s = to_str(v);
  return std::any_of(s.begin(), s.end(), is_alpha_c) && upper(s) == s;
}
bool t_mapping(Renderer&, const Value& v, Args& a) { return no_args(a, "mapping") && v.is_mapping(); }
bool t_none(Renderer&, const Value& v, Args& a) { return no_args(a, "none") && v.is_none(); }
bool t_number(Renderer&, const Value& v, Args& a) { return no_args(a, "number") && v.is_number(); }
bool t_string(Renderer&, const Value& v, Args& a) { return no_args(a, "string") && v.is_string(); }
bool t_sequence(Renderer&, const Value& v, Args& a) {
  return no_args(a, "sequence") && (v.is_string() || v.is_seq() || v.is_mapping());
}
// Python's `is`: the same container, or the same singleton / equal scalar of one type.
bool t_sameas(Renderer&, const Value& v, Args& a) {
  const Value o = one_arg(a, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::List:
    case Kind::Tuple: return v.seq == o.seq;
    case Kind::Dict:
    case Kind::Namespace: return v.dict == o.dict;
    case Kind::Callable: return v.fn == o.fn;
    default: return equals(v, o);
  }
}
bool t_escaped(Renderer&, const Value&, Args& a) { return !no_args(a, "escaped"); }
bool t_filter(Renderer&, const Value& v, Args& a) { return no_args(a, "filter") && v.is_string() && is_filter(v.s); }
bool t_test(Renderer&, const Value& v, Args& a) { return no_args(a, "test") && v.is_string() && is_test(v.s); }

const std::map<std::string_view, TestFn>& tests() {
  static const std::map<std::string_view, TestFn> table = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
      {"eq", t_eq},           {"equalto", t_eq},        {"==", t_eq},           {"ne", t_ne},
      {"!=", t_ne},           {"even", t_even},         {"false", t_false},     {"float", t_float},
      {"ge", t_ge},           {">=", t_ge},             {"gt", t_gt},           {">", t_gt},
      {"greaterthan", t_gt},  {"in", t_in},             {"integer", t_integer}, {"iterable", t_iterable},
      {"le", t_le},           {"<=", t_le},             {"lower", t_lower},     {"lt", t_lt},
      {"<", t_lt},            {"lessthan", t_lt},       {"mapping", t_mapping}, {"none", t_none},
      {"number", t_number},   {"odd", t_odd},           {"sameas", t_sameas},   {"sequence", t_sequence},
      {"string", t_string},   {"true", t_true},         {"undefined", t_undefined}, {"upper", t_upper},
      {"escaped", t_escaped}, {"filter", t_filter},     {"test", t_test},
  };
  return table;
}

// ---- methods ----

// str.format: {} / {0} / {name} fields without format specs; {{ and }} are braces.
std::string py_format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else throw Failure("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Failure("Single '{' encountered in format string");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) throw Failure("format specs are not supported in str.format");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= a.pos.size()) throw Failure("Replacement index out of range for positional args tuple");
      v = &a.pos[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t k = field.size() < 9 ? std::stoul(field) : a.pos.size();
      if (k >= a.pos.size()) throw Failure("Replacement index out of range for positional args tuple");
      v = &a.pos[k];
    } else {
      for (const auto& [key, value] : a.kw)
        if (key == field) v = &value;
      if (!v) throw Failure("KeyError: '" + field + "'");
    }
    out += to_str(*v);
    check_size(out.size());
    i = close;
  }
  return out;
}

bool str_predicate(const std::string& s, bool (*ok)(char)) { return !s.empty() && std::all_of(s.begin(), s.end(), ok); }

// startswith / endswith: a prefix, or a tuple of them.
bool affix(const std::string& s, const Value& what, bool start) {
  auto one = [&](const Value& x) {
    const std::string p = need_str(x, start ? "startswith's argument" : "endswith's argument");
    return start ? s.starts_with(p) : s.ends_with(p);
  };
  if (what.kind == Kind::Tuple) return std::any_of(what.seq->begin(), what.seq->end(), one);
  return one(what);
}

Value str_method(const std::string& s, const std::string& name, Args& a) {
  const std::string what = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto p = bind_args(a, what, {"chars"});
    return Value::string(strip(s, p[0] ? &*p[0] : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto p = bind_args(a, what, {"sep", "maxsplit"});
    const int64_t maxsplit = p[1] ? need_int(*p[1], "maxsplit") : -1;
    const std::vector<std::string> parts = !p[0] || p[0]->is_none()
                                               ? split_whitespace(s, maxsplit, name == "rsplit")
                                               : split_on(s, need_str(*p[0], "sep"), maxsplit, name == "rsplit");
    Seq out;
    for (const std::string& part : parts) out.push_back(Value::string(part));
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    const auto p = bind_args(a, what, {"keepends"});
    Seq out;
    for (const std::string& line : splitlines(s, opt_bool(p[0], false))) out.push_back(Value::string(line));
    return Value::list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const auto p = bind_args(a, what, {"prefix"});
    if (!p[0]) throw Failure(what + "() takes at least 1 argument");
    return Value::boolean(affix(s, *p[0], name == "startswith"));
  }
  if (name == "replace") {
    const auto p = bind_args(a, what, {"old", "new", "count"});
    if (!p[0] || !p[1]) throw Failure("replace() needs old and new");
    return Value::string(
        replace(s, need_str(*p[0], "old"), need_str(*p[1], "new"), p[2] ? need_int(*p[2], "count") : -1));
  }
  if (name == "upper") return bind_args(a, what, {}), Value::string(upper(s));
  if (name == "lower" || name == "casefold") return bind_args(a, what, {}), Value::string(lower(s));
  if (name == "title") return bind_args(a, what, {}), Value::string(py_title(s));
  if (name == "capitalize") return bind_args(a, what, {}), Value::string(capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const auto p = bind_args(a, what, {"sub"});
    if (!p[0]) throw Failure(what + "() takes at least 1 argument");
    const std::string sub = need_str(*p[0], "sub");
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") throw Failure("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(cp_index(s, at));
  }
  if (name == "count") {
    const auto p = bind_args(a, what, {"sub"});
    if (!p[0]) throw Failure("count() takes at least 1 argument");
    const std::string sub = need_str(*p[0], "sub");
    if (sub.empty()) return Value::integer(static_cast<int64_t>(code_point_count(s)) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const auto p = bind_args(a, what, {"iterable"});
    if (!p[0]) throw Failure("join() takes exactly one argument");
    std::string out;
    size_t k = 0;
    for (const Value& x : iterate(*p[0])) {
      if (!x.is_string())
        throw Failure("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(x) + " found");
      if (k++) out += s;
      out += x.s;
      check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(py_format(s, a));
  if (name == "isdigit") return bind_args(a, what, {}), Value::boolean(str_predicate(s, [](char c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") return bind_args(a, what, {}), Value::boolean(str_predicate(s, is_alpha_c));
  if (name == "isalnum")
    return bind_args(a, what, {}),
           Value::boolean(str_predicate(s, [](char c) { return is_alpha_c(c) || (c >= '0' && c <= '9'); }));
  if (name == "isspace") {
    bind_args(a, what, {});
    const std::vector<std::string> cps = code_points(s);
    return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), [](const std::string& cp) { return is_py_space(cp); }));
  }
  if (name == "islower" || name == "isupper") {
    bind_args(a, what, {});
    const bool any_cased = std::any_of(s.begin(), s.end(), is_alpha_c);
    return Value::boolean(any_cased && (name == "islower" ? lower(s) == s : upper(s) == s));
  }
  if (name == "partition" || name == "rpartition") {
    const auto p = bind_args(a, what, {"sep"});
    if (!p[0]) throw Failure(what + "() takes exactly one argument");
    const std::string sep = need_str(*p[0], "sep");
    if (sep.empty()) throw Failure("empty separator");
    const size_t at = name[0] == 'r' ? s.rfind(sep) : s.find(sep);
    if (at == std::string::npos)
      return name[0] == 'r' ? Value::tuple({Value::string(""), Value::string(""), Value::string(s)})
                            : Value::tuple({Value::string(s), Value::string(""), Value::string("")});
    return Value::tuple({Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))});
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const auto p = bind_args(a, what, {"width", "fillchar"});
    if (!p[0]) throw Failure(what + "() takes at least 1 argument");
    const std::string fill = p[1] ? need_str(*p[1], "fillchar") : " ";
    if (code_point_count(fill) != 1) throw Failure("The fill character must be exactly one character long");
    return Value::string(pad(s, need_int(*p[0], "width"), fill, name[0]));
  }
  throw Failure("'str' object has no attribute '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name, Args& a) {
  const std::string what = "dict." + name;
  if (name == "get") {
    const auto p = bind_args(a, what, {"key", "default"});
    if (!p[0]) throw Failure("get expected at least 1 argument, got 0");
    const Value* v = d.dict->find(*p[0]);
    return v ? *v : p[1] ? *p[1] : Value::none();
  }
  bind_args(a, what, {});
  Seq out;
  if (name == "copy") return Value::dict_of(*d.dict);
  for (const auto& [key, value] : d.dict->items)
    out.push_back(name == "keys" ? key : name == "values" ? value : Value::tuple({key, value}));
  return Value::list(std::move(out));
}

Value list_method(const Value& l, const std::string& name, Args& a) {
  const auto p = bind_args(a, "list." + name, {"value"});
  if (name == "copy") return Value::list(*l.seq);
  if (!p[0]) throw Failure(name + "() takes exactly one argument");
  int64_t count = 0;
  for (size_t k = 0; k < l.seq->size(); ++k) {
    if (!equals((*l.seq)[k], *p[0])) continue;
    if (name == "index") return Value::integer(static_cast<int64_t>(k));
    ++count;
  }
  if (name == "index") throw Failure(repr(*p[0]) + " is not in list");
  return Value::integer(count);
}

bool is_str_method(std::string_view n) {
  static const std::string_view kNames[] = {
      "strip",  "lstrip",     "rstrip", "split",  "rsplit",    "splitlines", "startswith", "endswith", "replace",
      "upper",  "lower",      "casefold", "title", "capitalize", "find",     "rfind",      "index",    "rindex",
      "count",  "join",       "format", "isdigit", "isalpha",  "isalnum",    "isspace",    "islower",  "isupper",
      "partition", "rpartition", "center", "ljust", "rjust"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

// What the immutable sandbox refuses to hand out: the methods that change a dict or list.
bool is_mutating(Kind kind, std::string_view n) {
  static const std::string_view kDict[] = {"clear", "pop", "popitem", "setdefault", "update"};
  static const std::string_view kList[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
  if (kind == Kind::Dict) return std::find(std::begin(kDict), std::end(kDict), n) != std::end(kDict);
  if (kind == Kind::List) return std::find(std::begin(kList), std::end(kList), n) != std::end(kList);
  return false;
}

Value bound_method(const Value& obj, std::string_view name) {
  return Value::callable(std::string(name), [obj, method = std::string(name)](Renderer&, Args& a) {
    if (obj.is_string()) return str_method(obj.s, method, a);
    if (obj.is_mapping()) return dict_method(obj, method, a);
    return list_method(obj, method, a);
  });
}

// Python's getattr(obj, name) as the sandbox allows it: a method, or a namespace's attribute.
Value python_getattr(const Value& obj, std::string_view name) {
  if (is_mutating(obj.kind, name))
    throw Failure("access to attribute '" + std::string(name) + "' of '" + type_name(obj) + "' is unsafe.");
  switch (obj.kind) {
    case Kind::String:
      if (is_str_method(name)) return bound_method(obj, name);
      break;
    case Kind::Dict:
      if (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy")
        return bound_method(obj, name);
      break;
    case Kind::List:
    case Kind::Tuple:
      if (name == "index" || name == "count" || (name == "copy" && obj.kind == Kind::List)) return bound_method(obj, name);
      break;
    case Kind::Namespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    default: break;
  }
  return Value::undefined("'" + type_name(obj) + "' has no attribute '" + std::string(name) + "'");
}

// ---- globals ----

Value g_range(Renderer&, Args& a) {
  if (!a.kw.empty()) throw Failure("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) throw Failure("range expected 1 to 3 arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) {
    stop = need_int(a.pos[0], "range's argument");
  } else {
    start = need_int(a.pos[0], "range's argument");
    stop = need_int(a.pos[1], "range's argument");
    if (a.pos.size() == 3) step = need_int(a.pos[2], "range's argument");
  }
  if (step == 0) throw Failure("range() arg 3 must not be zero");
  Seq out;
  for (int64_t v = start; step > 0 ? v < stop : v > stop;) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange)
      throw Failure("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    out.push_back(Value::integer(v));
    if (__builtin_add_overflow(v, step, &v)) break;
  }
  return Value::list(std::move(out));
}

// dict(mapping or pairs, **kwargs), as namespace() and dict() take them.
DictData dict_args(const Args& a, const char* what) {
  if (a.pos.size() > 1) throw Failure(std::string(what) + "() takes at most 1 positional argument");
  DictData d;
  if (!a.pos.empty()) {
    const Value& init = a.pos[0];
    if (init.is_mapping()) {
      d = *init.dict;
    } else {
      for (const Value& pair : iterate(init)) {
        const Seq kv = iterate(pair);
        if (kv.size() != 2) throw Failure("dictionary update sequence element has the wrong length");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : a.kw) d.set(Value::string(key), value);
  return d;
}

}  // namespace

// transformers' TemplateNamespace refuses underscore-prefixed attributes (CPython internals).
void check_namespace_name(const Value& name) {
  if (name.is_string() && !name.s.empty() && name.s[0] == '_')
    throw Failure("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " + repr(name) +
                  ". Please rename the attribute.");
}

namespace {

Value g_namespace(Renderer& r, Args& a) {
  DictData attrs = dict_args(a, "namespace");
  for (const auto& item : attrs.items) check_namespace_name(item.first);
  return r.new_namespace(std::move(attrs));
}
Value g_dict(Renderer&, Args& a) { return Value::dict_of(dict_args(a, "dict")); }

Value g_raise_exception(Renderer&, Args& a) {
  const auto p = bind_args(a, "raise_exception", {"message"});
  throw JinjaRaised(p[0] ? to_str(*p[0]) : "");
}

Value g_strftime_now(Renderer& r, Args& a) {
  const auto p = bind_args(a, "strftime_now", {"format"});
  const std::string format = p[0] ? need_str(*p[0], "format") : "";
  if (r.globals.strftime_now) return Value::string(r.globals.strftime_now(format));
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string buf(256 + format.size() * 8, '\0');
  const size_t n = format.empty() ? 0 : std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
  buf.resize(n);
  return Value::string(buf);
}

}  // namespace

bool is_filter(std::string_view name) { return filters().count(name) != 0; }
bool is_test(std::string_view name) { return tests().count(name) != 0; }

Value apply_filter(Renderer& r, std::string_view name, const Value& v, Args& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw Failure("No filter named '" + std::string(name) + "'");
  return it->second(r, v, args);
}

bool apply_test(Renderer& r, std::string_view name, const Value& v, Args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) throw Failure("No test named '" + std::string(name) + "'");
  return it->second(r, v, args);
}

const Value* find_global(std::string_view name) {
  static const std::map<std::string_view, Value> table = {
      {"range", Value::callable("range", g_range)},
      {"namespace", Value::callable("namespace", g_namespace)},
      {"dict", Value::callable("dict", g_dict)},
      {"raise_exception", Value::callable("raise_exception", g_raise_exception)},
      {"strftime_now", Value::callable("strftime_now", g_strftime_now)},
  };
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

Value get_attr(const Value& obj, std::string_view name) {
  Value v = python_getattr(obj, name);
  if (v.is_undefined() && obj.is_mapping())
    if (const Value* item = obj.dict->find(name)) return *item;
  return v;
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict->find(key)) return *v;
  } else if ((obj.is_seq() || obj.is_string()) && key.is_integral()) {
    int64_t k = key.as_int();
    if (obj.is_string()) {
      const std::vector<std::string> cps = code_points(obj.s);
      const auto n = static_cast<int64_t>(cps.size());
      if (k < 0) k += n;
      if (k >= 0 && k < n) return Value::string(cps[static_cast<size_t>(k)]);
    } else {
      const auto n = static_cast<int64_t>(obj.seq->size());
      if (k < 0) k += n;
      if (k >= 0 && k < n) return (*obj.seq)[static_cast<size_t>(k)];
    }
    return Value::undefined("'" + type_name(obj) + "' has no element " + std::to_string(key.as_int()));
  }
  // Jinja's getitem falls back to the attribute of that name.
  if (key.is_string()) return python_getattr(obj, key.s);
  return Value::undefined("'" + type_name(obj) + "' has no element " + repr(key));
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (!obj.is_seq() && !obj.is_string()) return Value::undefined("'" + type_name(obj) + "' is not sliceable");
  auto index = [](const Value* v) -> std::optional<int64_t> {
    if (!v || v->is_none()) return std::nullopt;
    if (!v->is_integral()) throw Failure("slice indices must be integers or None");
    return v->as_int();
  };
  const std::vector<std::string> cps = obj.is_string() ? code_points(obj.s) : std::vector<std::string>{};
  const auto n = static_cast<int64_t>(obj.is_string() ? cps.size() : obj.seq->size());
  const int64_t st = index(step).value_or(1);
  if (st == 0) throw Failure("slice step cannot be zero");
  // CPython's PySlice_AdjustIndices.
  auto adjust = [n, st](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = adjust(index(start), st < 0 ? n - 1 : 0), hi = adjust(index(stop), st < 0 ? -1 : n);
  std::string text;
  Seq items;
  for (int64_t k = lo; st > 0 ? k < hi : k > hi;) {
    if (obj.is_string()) text += cps[static_cast<size_t>(k)];
    else items.push_back((*obj.seq)[static_cast<size_t>(k)]);
    if (__builtin_add_overflow(k, st, &k)) break;
  }
  if (obj.is_string()) return Value::string(std::move(text));
  return obj.kind == Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

}  // namespace strata::jinja

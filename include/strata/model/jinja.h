// Jinja2 as Hugging Face chat templates use it: the subset of Jinja2 3.1 that transformers'
// apply_chat_template executes, with its settings (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, the loopcontrols extension, {% generation %}, raise_exception, strftime_now and a
// tojson that is Python's json.dumps).
//
// Supported: {{ }}, {% %}, {# #}, raw blocks and the -/+ whitespace markers; if/elif/else, for (with
// unpacking, an `if` filter, else, loop.*, break/continue), set (names, tuples, namespace
// attributes, block form), macro, call, filter, with and generation blocks; Python's literals,
// operators, truthiness, str() and repr(); Undefined as Jinja's default Undefined; the filters,
// tests, str/dict/list methods and globals (namespace, range, dict, raise_exception, strftime_now)
// chat templates use. Not supported (a JinjaError when parsed or used): template inheritance and
// includes (extends, block, include, import), recursive loops, *args/**kwargs in calls and macros,
// %-formatting of strings, format specs in str.format, and the rarely used filters (groupby,
// format, truncate, wordwrap, urlize, xmlattr, ...). Integers are 64-bit (Python's are unbounded);
// case changes (upper, lower, title) are ASCII only.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"

namespace strata {

// A template that cannot be parsed, or that fails while rendering: "line N: why".
class JinjaError : public Error {
public:
  using Error::Error;
};

// The template called raise_exception(message): what() is the message exactly as given.
class JinjaRaised : public JinjaError {
public:
  using JinjaError::JinjaError;
};

struct JinjaGlobals {
  // What strftime_now(format) returns; unset: the local time formatted by std::strftime.
  std::function<std::string(const std::string& format)> strftime_now;
};

class JinjaTemplate {
public:
  // Parses once; throws JinjaError naming the line for a syntax error or an unknown tag.
  static JinjaTemplate parse(std::string_view source);
  // Renders with `variables` (a JSON object: each member is a template variable; JSON integers are
  // Python ints, JSON floats Python floats, objects keep their key order). Const and reentrant:
  // several threads render one template at once. A render that runs away (deep recursion, a
  // string or list past 64 MiB / 1M items, tens of millions of steps) fails with JinjaError.
  std::string render(const nlohmann::ordered_json& variables, const JinjaGlobals& globals = {}) const;
  // Whether the template reads the variable `name` anywhere (as a bare name, e.g. `tools`).
  bool mentions(std::string_view name) const;

private:
  struct Program;
  std::shared_ptr<const Program> program_;
};

}  // namespace strata

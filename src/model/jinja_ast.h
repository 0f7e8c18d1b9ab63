// The Jinja interpreter's syntax tree (internal to src/model/jinja_*.cpp): what jinja_parse.cpp
// builds once per template and jinja_eval.cpp walks for each render, read-only.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja_value.h"

namespace strata::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,   // value
  Name,      // name
  List,      // items
  Tuple,     // items
  Dict,      // items: key, value, key, value, ...
  Attr,      // a.name
  Item,      // a[b]
  Slice,     // a[items[0]:items[1]:items[2]] (null where left out)
  Call,      // a(items..., kwargs...)
  Filter,    // a|name(items..., kwargs...); a is null in a filter block's chain
  Test,      // a is [not] name(items...)
  Unary,     // name ("-", "+", "not") a
  Binary,    // a name b: + - * / // % ** ~
  And,       // a and b
  Or,        // a or b
  Compare,   // a ops[0] items[0] ops[1] items[1] ...
  Cond,      // a if b else c (c null: Undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  ExprPtr a, b, c;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;  // Test: `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtKind { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Break, Continue, Scope };

// A for loop's or set's target: names (several: tuple unpacking), or a namespace's attribute.
struct Target {
  std::vector<std::string> names;
  std::string attr;  // set ns.attr = ...: names[0] is the namespace
  bool tuple = false;
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                                 // Text; Macro: its name
  ExprPtr expr;                                     // Output, Set, For (iterable), CallBlock (the call), FilterBlock
  ExprPtr cond;                                     // For: the `if` filter
  Target target;                                    // For, Set, SetBlock
  std::vector<std::pair<ExprPtr, Body>> branches;   // If: condition, body (null condition: else)
  Body body, else_body;                             // For, SetBlock, Macro, CallBlock, FilterBlock, With, Scope
  std::vector<Param> params;                        // Macro, CallBlock (caller's parameters)
  std::vector<std::pair<Target, ExprPtr>> assigns;  // With
};

// Parses a template; throws JinjaError("line N: ...").
struct Parsed {
  Body body;
  std::set<std::string, std::less<>> names;  // every variable read as a bare name
};
Parsed parse_template(std::string_view source);

// The filter and test names the builtins know (jinja_builtins.cpp): Jinja refuses others when it
// compiles the template, and so does the parser.
bool is_filter(std::string_view name);
bool is_test(std::string_view name);

}  // namespace strata::jinja

// The Jinja interpreter's renderer (internal to src/model/jinja_*.cpp): the state of one render
// (scopes, output, depth), which jinja_eval.cpp runs over the tree and the builtins call back into.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja_ast.h"
#include "strata/model/jinja.h"

namespace strata::jinja {

// A scope: the template's top level, one iteration of a for loop, a macro call, a with block.
// A name is looked up here, then in the parents.
struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find_local(std::string_view name);
  void set(std::string_view name, Value v);
};

class Renderer {
public:
  explicit Renderer(const JinjaGlobals& globals);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  const JinjaGlobals& globals;
  std::shared_ptr<Frame> frame;

  // Renders `body` in the current frame into a string of its own.
  std::string render_body(const Body& body);
  Value eval(const Expr& e);
  Value call(const Value& callee, Args& args);
  // A new namespace(); the renderer empties all of them when it ends, which breaks the cycles a
  // namespace holding itself would leak.
  Value new_namespace(DictData attrs);

private:
  enum class Flow { Normal, Break, Continue };
  std::string* out_ = nullptr;
  int depth_ = 0;
  const Value* block_input_ = nullptr;  // the text a filter block filters
  std::vector<std::shared_ptr<DictData>> namespaces_;

  struct Nest;
  Flow exec(const Body& body);
  Flow exec_stmt(const Stmt& s);
  Flow exec_for(const Stmt& s);
  Value eval_inner(const Expr& e);
  Value lookup(const std::string& name) const;
  void bind(Frame& f, const Target& t, const Value& v);
  Value make_macro(const Stmt& s);
  Value call_macro(const Stmt& m, const std::weak_ptr<Frame>& scope, Args& args, bool is_caller);
};

// Builtins (jinja_builtins.cpp).
Value apply_filter(Renderer& r, std::string_view name, const Value& v, Args& args);
bool apply_test(Renderer& r, std::string_view name, const Value& v, Args& args);
// namespace, range, dict, raise_exception, strftime_now; null for another name.
const Value* find_global(std::string_view name);
// Fails for a name transformers' namespace refuses (underscore-prefixed).
void check_namespace_name(const Value& name);

}  // namespace strata::jinja

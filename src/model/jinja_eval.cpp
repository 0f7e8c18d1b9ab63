// The Jinja interpreter's evaluator: statements and expressions over the tree of jinja_ast.h, with
// Jinja's scoping (a for loop's iteration and a macro call are scopes of their own, an if is not)
// and JinjaTemplate's public API.
#include "jinja_eval.h"

namespace strata {

namespace jinja {

namespace {

// Nested evaluations (expressions, statements, macro calls) in one render; beyond it the render
// fails instead of overflowing the stack.
constexpr int kMaxDepth = 500;
// Work units of one render (jinja_value.h's charge): a few seconds at most (more under the
// sanitizers), far more than a chat template over a long conversation needs.
constexpr int64_t kBudget = 20'000'000;

[[noreturn]] void fail_at(int line, const std::string& why) {
  throw JinjaError("line " + std::to_string(line) + ": " + why);
}

}  // namespace

Value* Frame::find_local(std::string_view name) {
  for (auto& [key, value] : vars)
    if (key == name) return &value;
  return nullptr;
}

void Frame::set(std::string_view name, Value v) {
  if (Value* slot = find_local(name)) *slot = std::move(v);
  else vars.emplace_back(std::string(name), std::move(v));
}

struct Renderer::Nest {
  Renderer& r;
  Nest(Renderer& renderer, int line) : r(renderer) {
    if (++r.depth_ > kMaxDepth) {
      --r.depth_;
      fail_at(line, "recursion too deep (over " + std::to_string(kMaxDepth) + " nested calls and expressions)");
    }
  }
  ~Nest() { --r.depth_; }
};

Renderer::Renderer(const JinjaGlobals& g) : globals(g), frame(std::make_shared<Frame>()) {}

Renderer::~Renderer() {
  // Emptied while each is still held here, so that no chain of namespaces is freed recursively.
  for (auto& ns : namespaces_) ns->items.clear();
}

Value Renderer::new_namespace(DictData attrs) {
  Value v;
  v.kind = Kind::Namespace;
  v.dict = std::make_shared<DictData>(std::move(attrs));
  v.depth = 1;
  namespaces_.push_back(v.dict);
  return v;
}

std::string Renderer::render_body(const Body& body) {
  std::string text;
  std::string* saved = std::exchange(out_, &text);
  try {
    exec(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return text;
}

Value Renderer::lookup(const std::string& name) const {
  for (Frame* f = frame.get(); f; f = f->parent.get())
    if (Value* v = f->find_local(name)) return *v;
  if (const Value* g = find_global(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

void Renderer::bind(Frame& f, const Target& t, const Value& v) {
  if (!t.tuple) {
    f.set(t.names[0], v);
    return;
  }
  const Seq items = iterate(v);
  if (items.size() < t.names.size())
    throw Failure("not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                  std::to_string(items.size()) + ")");
  if (items.size() > t.names.size())
    throw Failure("too many values to unpack (expected " + std::to_string(t.names.size()) + ")");
  for (size_t k = 0; k < items.size(); ++k) f.set(t.names[k], items[k]);
}

Renderer::Flow Renderer::exec(const Body& body) {
  for (const auto& s : body) {
    const Flow flow = exec_stmt(*s);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_stmt(const Stmt& s) {
  Nest nest(*this, s.line);
  charge(1);
  try {
    switch (s.kind) {
      case StmtKind::Text:
        check_size(out_->size() + s.text.size());
        *out_ += s.text;
        return Flow::Normal;
      case StmtKind::Output: {
        const std::string text = to_str(eval(*s.expr));
        check_size(out_->size() + text.size());
        *out_ += text;
        return Flow::Normal;
      }
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches)
          if (!cond || truthy(eval(*cond))) return exec(body);
        return Flow::Normal;
      case StmtKind::For: return exec_for(s);
      case StmtKind::Set: {
        Value v = eval(*s.expr);
        if (s.target.attr.empty()) {
          bind(*frame, s.target, v);
          return Flow::Normal;
        }
        const Value ns = lookup(s.target.names[0]);
        if (ns.kind != Kind::Namespace) throw Failure("cannot assign attribute on non-namespace object");
        Value attr = Value::string(s.target.attr);
        check_namespace_name(attr);
        ns.dict->set(std::move(attr), std::move(v));
        return Flow::Normal;
      }
      case StmtKind::SetBlock: frame->set(s.target.names[0], Value::string(render_body(s.body))); return Flow::Normal;
      case StmtKind::Macro: frame->set(s.text, make_macro(s)); return Flow::Normal;
      case StmtKind::CallBlock: {
        const Expr& call_expr = *s.expr;
        Value callee = eval(*call_expr.a);
        Args args;
        for (const auto& a : call_expr.items) args.pos.push_back(eval(*a));
        for (const auto& [key, a] : call_expr.kwargs) args.kw.emplace_back(key, eval(*a));
        const std::weak_ptr<Frame> scope = frame;
        const Stmt* block = &s;
        args.kw.emplace_back("caller", Value::callable("caller", [block, scope](Renderer& r, Args& a) {
                               return r.call_macro(*block, scope, a, true);
                             }));
        const std::string text = to_str(call(callee, args));
        check_size(out_->size() + text.size());
        *out_ += text;
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        const Value input = Value::string(render_body(s.body));
        const Value* saved = std::exchange(block_input_, &input);
        Value filtered;
        try {
          filtered = eval(*s.expr);
        } catch (...) {
          block_input_ = saved;
          throw;
        }
        block_input_ = saved;
        const std::string text = to_str(filtered);
        check_size(out_->size() + text.size());
        *out_ += text;
        return Flow::Normal;
      }
      case StmtKind::With:
      case StmtKind::Scope: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        for (const auto& [target, expr] : s.assigns) bind(*inner, target, eval(*expr));
        std::shared_ptr<Frame> saved = std::exchange(frame, inner);
        Flow flow;
        try {
          flow = exec(s.body);
        } catch (...) {
          frame = saved;
          throw;
        }
        frame = saved;
        return flow;
      }
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
    }
  } catch (const Failure& f) {
    fail_at(s.line, f.what());
  }
  return Flow::Normal;
}

// One scope per iteration (a set inside does not outlive it), with Jinja's `loop` object.
Renderer::Flow Renderer::exec_for(const Stmt& s) {
  Seq items = iterate(eval(*s.expr));
  std::shared_ptr<Frame> saved = frame;
  auto restore = [&] { frame = saved; };
  try {
    if (s.cond) {
      Seq kept;
      for (Value& item : items) {
        frame = std::make_shared<Frame>();
        frame->parent = saved;
        bind(*frame, s.target, item);
        if (truthy(eval(*s.cond))) kept.push_back(std::move(item));
        frame = saved;
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      frame = std::make_shared<Frame>();
      frame->parent = saved;
      exec(s.else_body);
      restore();
      return Flow::Normal;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      frame = std::make_shared<Frame>();
      frame->parent = saved;
      bind(*frame, s.target, items[static_cast<size_t>(k)]);
      DictData loop;
      auto put = [&loop](const char* key, Value v) { loop.items.emplace_back(Value::string(key), std::move(v)); };
      put("index", Value::integer(k + 1));
      put("index0", Value::integer(k));
      put("revindex", Value::integer(n - k));
      put("revindex0", Value::integer(n - k - 1));
      put("first", Value::boolean(k == 0));
      put("last", Value::boolean(k == n - 1));
      put("length", Value::integer(n));
      put("depth", Value::integer(1));
      put("depth0", Value::integer(0));
      if (k > 0) put("previtem", items[static_cast<size_t>(k - 1)]);
      if (k + 1 < n) put("nextitem", items[static_cast<size_t>(k + 1)]);
      put("cycle", Value::callable("cycle", [k](Renderer&, Args& a) {
            if (a.pos.empty()) throw Failure("no items for cycling given");
            return a.pos[static_cast<size_t>(k) % a.pos.size()];
          }));
      frame->set("loop", Value::dict_of(std::move(loop)));
      const Flow flow = exec(s.body);
      frame = saved;
      if (flow == Flow::Break) break;
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return Flow::Normal;
}

Value Renderer::make_macro(const Stmt& s) {
  const std::weak_ptr<Frame> scope = frame;
  const Stmt* macro = &s;
  return Value::callable(s.text, [macro, scope](Renderer& r, Args& a) { return r.call_macro(*macro, scope, a, false); });
}

// A macro (or a call block's caller) called: its parameters bound in a scope inside the one it
// was defined in, its body rendered to the string it returns.
Value Renderer::call_macro(const Stmt& m, const std::weak_ptr<Frame>& scope, Args& args, bool is_caller) {
  std::shared_ptr<Frame> parent = scope.lock();
  const std::string name = is_caller ? "caller" : m.text;
  if (!parent) throw Failure("macro '" + name + "' called after its scope ended");
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  if (args.pos.size() > m.params.size())
    throw Failure("macro '" + name + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
  std::vector<bool> given(m.params.size(), false);
  for (size_t k = 0; k < args.pos.size(); ++k) {
    f->set(m.params[k].name, args.pos[k]);
    given[k] = true;
  }
  for (auto& [key, value] : args.kw) {
    size_t k = 0;
    while (k < m.params.size() && m.params[k].name != key) ++k;
    if (k < m.params.size()) {
      if (given[k]) throw Failure("macro '" + name + "' got multiple values for argument '" + key + "'");
      given[k] = true;
      f->set(key, value);
    } else if (key == "caller" && !is_caller) {
      f->set(key, value);
    } else {
      throw Failure("macro '" + name + "' takes no keyword argument '" + key + "'");
    }
  }
  std::shared_ptr<Frame> saved = std::exchange(frame, f);
  try {
    for (size_t k = 0; k < m.params.size(); ++k) {
      if (given[k]) continue;
      // Defaults are evaluated at the call, in the macro's scope, as Jinja does.
      f->set(m.params[k].name, m.params[k].default_value
                                   ? eval(*m.params[k].default_value)
                                   : Value::undefined("parameter '" + m.params[k].name + "' was not provided"));
    }
    std::string text = render_body(m.body);
    frame = saved;
    return Value::string(std::move(text));
  } catch (...) {
    frame = saved;
    throw;
  }
}

Value Renderer::call(const Value& callee, Args& args) {
  if (callee.is_undefined()) raise_undefined(callee);
  if (callee.kind != Kind::Callable) throw Failure("'" + type_name(callee) + "' is not callable");
  return callee.fn->fn(*this, args);
}

Value Renderer::eval(const Expr& e) {
  Nest nest(*this, e.line);
  charge(1);
  try {
    return eval_inner(e);
  } catch (const Failure& f) {
    fail_at(e.line, f.what());
  }
}

Value Renderer::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Literal: return e.value;
    case ExprKind::Name: return lookup(e.name);
    case ExprKind::List:
    case ExprKind::Tuple: {
      Seq items;
      for (const auto& x : e.items) items.push_back(eval(*x));
      return e.kind == ExprKind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::Dict: {
      DictData d;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k]);
        if (key.kind == Kind::List || key.kind == Kind::Dict || key.kind == Kind::Namespace || key.is_undefined())
          throw Failure("unhashable type: '" + type_name(key) + "'");
        d.set(std::move(key), eval(*e.items[k + 1]));
      }
      return Value::dict_of(std::move(d));
    }
    case ExprKind::Attr: {
      const Value obj = eval(*e.a);
      if (obj.is_undefined()) raise_undefined(obj);
      return get_attr(obj, e.name);
    }
    case ExprKind::Item: {
      const Value obj = eval(*e.a);
      if (obj.is_undefined()) raise_undefined(obj);
      return get_item(obj, eval(*e.b));
    }
    case ExprKind::Slice: {
      const Value obj = eval(*e.a);
      if (obj.is_undefined()) raise_undefined(obj);
      Value bounds[3];
      for (size_t k = 0; k < 3; ++k)
        if (e.items[k]) bounds[k] = eval(*e.items[k]);
      return get_slice(obj, e.items[0] ? &bounds[0] : nullptr, e.items[1] ? &bounds[1] : nullptr,
                       e.items[2] ? &bounds[2] : nullptr);
    }
    case ExprKind::Call: {
      const Value callee = eval(*e.a);
      Args args;
      for (const auto& a : e.items) args.pos.push_back(eval(*a));
      for (const auto& [key, a] : e.kwargs) args.kw.emplace_back(key, eval(*a));
      return call(callee, args);
    }
    case ExprKind::Filter: {
      const Value input = e.a ? eval(*e.a) : *block_input_;
      Args args;
      for (const auto& a : e.items) args.pos.push_back(eval(*a));
      for (const auto& [key, a] : e.kwargs) args.kw.emplace_back(key, eval(*a));
      return apply_filter(*this, e.name, input, args);
    }
    case ExprKind::Test: {
      const Value input = eval(*e.a);
      Args args;
      for (const auto& a : e.items) args.pos.push_back(eval(*a));
      for (const auto& [key, a] : e.kwargs) args.kw.emplace_back(key, eval(*a));
      return Value::boolean(apply_test(*this, e.name, input, args) != e.negated);
    }
    case ExprKind::Unary: {
      const Value v = eval(*e.a);
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (e.name == "-") return negate(v);
      if (v.is_undefined()) raise_undefined(v);
      if (!v.is_number()) throw Failure("bad operand type for unary +: '" + type_name(v) + "'");
      return v.kind == Kind::Bool ? Value::integer(v.as_int()) : v;
    }
    case ExprKind::Binary: {
      const Value a = eval(*e.a), b = eval(*e.b);
      return e.name == "~" ? concat(a, b) : binary_op(e.name, a, b);
    }
    case ExprKind::And: {
      Value a = eval(*e.a);
      return truthy(a) ? eval(*e.b) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.a);
      return truthy(a) ? a : eval(*e.b);
    }
    case ExprKind::Compare: {
      // Chained as in Python: a < b < c is a < b and b < c.
      Value left = eval(*e.a);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.items[k]);
        const std::string& op = e.ops[k];
        bool ok;
        if (op == "==") ok = equals(left, right);
        else if (op == "!=") ok = !equals(left, right);
        else if (op == "in") ok = contains(right, left);
        else if (op == "not in") ok = !contains(right, left);
        else {
          const int c = compare(left, right);
          ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!ok) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::Cond:
      if (truthy(eval(*e.b))) return eval(*e.a);
      return e.c ? eval(*e.c) : Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                                  " evaluated to false and no else section was defined.");
  }
  return Value();
}

}  // namespace jinja

struct JinjaTemplate::Program {
  jinja::Parsed parsed;
};

JinjaTemplate JinjaTemplate::parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->parsed = jinja::parse_template(source);
  JinjaTemplate t;
  t.program_ = std::move(program);
  return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& variables, const JinjaGlobals& globals) const {
  if (!variables.is_object()) throw JinjaError("the variables must be a JSON object");
  jinja::BudgetScope budget(jinja::kBudget);
  jinja::Renderer r(globals);
  try {
    for (const auto& [key, value] : variables.items()) r.frame->set(key, jinja::from_json(value));
    return r.render_body(program_->parsed.body);
  } catch (const jinja::Failure& f) {  // from the variables themselves (nested too deeply)
    throw JinjaError(std::string("variables: ") + f.what());
  }
}

bool JinjaTemplate::mentions(std::string_view name) const {
  return program_->parsed.names.find(name) != program_->parsed.names.end();
}

}  // namespace strata

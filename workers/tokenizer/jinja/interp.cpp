// interp.cpp: the tree-walking interpreter: expressions, statements, loops and macro calls, with
// jinja2's scoping (interp.hpp).
#include "workers/tokenizer/jinja/internal/interp.hpp"

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/ops.hpp"
#include "workers/tokenizer/jinja/internal/text.hpp"

namespace tessera::jinja::internal {
namespace {

ScopeP child(const ScopeP& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

Value undefined_member(const Value& obj, const Value& key) {
  if (key.kind == Kind::string) return Value::undefined(py_repr_str(object_type_repr(obj)) + " has no attribute " + py_repr_str(key.s));
  return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

std::string Interp::render(const Program& prog, const Value& context) {
  auto globals = std::make_shared<Scope>();
  add_globals(*globals);
  auto top = child(globals);
  for (const auto& kv : context.dict->items) top->set(kv.first.s, kv.second);
  std::string out;
  exec(prog.body, top, out);
  return out;
}

Value Interp::eval(const Expr& e, const ScopeP& sc) {
  try {
    return eval_node(e, sc);
  } catch (Error& err) {
    if (err.line == 0) err.line = e.line;
    throw;
  }
}

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.kind == Kind::undefined) fail_undefined(callee);
  if (callee.kind != Kind::function) fail("'" + type_name(callee) + "' object is not callable");
  return callee.fn->call(*this, args);
}

Flow Interp::exec(const Body& body, const ScopeP& sc, std::string& out) {
  for (const auto& st : body) {
    Flow f;
    try {
      f = exec_stmt(*st, sc, out);
    } catch (Error& err) {
      if (err.line == 0) err.line = st->line;
      throw;
    }
    if (f != Flow::normal) return f;
  }
  return Flow::normal;
}

Value Interp::macro_value(const Stmt& st, const ScopeP& closure, std::string name) {
  closures_.push_back(closure);
  std::weak_ptr<Scope> frame = closure;
  return Value::function(name, [&st, frame, name](Interp& in, CallArgs& a) {
    const ScopeP closure = frame.lock();
    if (!closure) fail("macro '" + name + "' outlived its frame");
    return in.call_macro(st, closure, name, a);
  });
}

Interp::~Interp() {
  for (auto& weak : namespaces_) {
    if (auto ns = weak.lock()) ns->attrs.items.clear();
  }
}

CallArgs Interp::eval_args(const Expr& e, const ScopeP& sc) {
  CallArgs a;
  for (const auto& x : e.items) a.pos.push_back(eval(*x, sc));
  for (const auto& kw : e.kwargs) a.kw.emplace_back(kw.first, eval(*kw.second, sc));
  if (e.dyn_args) for (auto& v : iterate(eval(*e.dyn_args, sc))) a.pos.push_back(std::move(v));
  if (e.dyn_kwargs) {
    const Value d = eval(*e.dyn_kwargs, sc);
    if (d.kind != Kind::dict) fail("argument after ** must be a mapping, not " + type_name(d));
    for (const auto& kv : d.dict->items) {
      if (kv.first.kind != Kind::string) fail("keywords must be strings");
      a.kw.emplace_back(kv.first.s, kv.second);
    }
  }
  return a;
}

Value Interp::eval_node(const Expr& e, const ScopeP& sc) {
  switch (e.k) {
    case EK::literal: return e.value;
    case EK::name: {
      if (const Value* v = sc->find(e.name)) return *v;
      return Value::undefined(py_repr_str(e.name) + " is undefined");
    }
    case EK::getattr: return get_attr(eval(*e.a, sc), e.name);
    case EK::getitem: {
      const Value obj = eval(*e.a, sc);
      if (e.b->k == EK::slice) {
        const Expr& s = *e.b;
        auto part = [&](const ExprP& x) { return x ? eval(*x, sc) : Value::none(); };
        return slice_of(obj, part(s.a), part(s.b), part(s.c));
      }
      return get_item(obj, eval(*e.b, sc));
    }
    case EK::slice: fail("slice outside a subscript");
    case EK::call: {
      const Value callee = eval(*e.a, sc);
      CallArgs a = eval_args(e, sc);
      return call(callee, a);
    }
    case EK::filter: {
      Value v = eval(*e.a, sc);
      CallArgs a = eval_args(e, sc);
      if (!e.known) fail("No filter named '" + e.name + "' found.");
      return apply_filter(*this, e.name, std::move(v), a);
    }
    case EK::test: {
      const Value v = eval(*e.a, sc);
      CallArgs a = eval_args(e, sc);
      if (!e.known) fail("No test named '" + e.name + "' found.");
      return Value::boolean(apply_test(*this, e.name, v, a));
    }
    case EK::neg: case EK::pos: {
      const Value v = eval(*e.a, sc);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) fail(std::string("bad operand type for unary ") + (e.k == EK::neg ? "-" : "+") + ": '" + type_name(v) + "'");
      if (e.k == EK::pos) return v.kind == Kind::boolean ? Value::integer(v.as_int()) : v;
      return v.kind == Kind::floating ? Value::floating(-v.f) : Value::integer(sub64(0, v.as_int()));
    }
    case EK::binop: {
      const Value l = eval(*e.a, sc);
      const Value r = eval(*e.b, sc);
      return binary_op(e.name, l, r);
    }
    case EK::concat: {
      std::string s;
      for (const auto& x : e.items) s += to_str(eval(*x, sc));
      return Value::string(std::move(s));
    }
    case EK::compare: {
      Value left = eval(*e.a, sc);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.items[k], sc);
        if (!compare_op(e.ops[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::and_: {
      Value l = eval(*e.a, sc);
      return truthy(l) ? eval(*e.b, sc) : l;
    }
    case EK::or_: {
      Value l = eval(*e.a, sc);
      return truthy(l) ? l : eval(*e.b, sc);
    }
    case EK::not_: return Value::boolean(!truthy(eval(*e.a, sc)));
    case EK::cond: {
      if (truthy(eval(*e.b, sc))) return eval(*e.a, sc);
      if (e.c) return eval(*e.c, sc);
      return Value::undefined(fmt::format("the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
    }
    case EK::list: case EK::tuple: {
      ValueList items;
      items.reserve(e.items.size());
      for (const auto& x : e.items) items.push_back(eval(*x, sc));
      return Value::make_list(std::move(items), e.k == EK::tuple ? Seq::tuple : Seq::list);
    }
    case EK::dict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k], sc);
        if (key.kind == Kind::list && !key.is_seq(Seq::tuple) && !key.one_shot()) fail("unhashable type: '" + type_name(key) + "'");
        if (key.kind == Kind::dict) fail("unhashable type: 'dict'");
        d.set(std::move(key), eval(*e.items[k + 1], sc));
      }
      return Value::make_dict(std::move(d));
    }
  }
  fail("unknown expression");
}

void Interp::assign(const Target& t, const Value& v, Scope& sc) {
  if (!t.tuple) {
    sc.set(t.names[0], v);
    return;
  }
  if (v.is_undefined()) fail_undefined(v);
  const ValueList parts = iterate(v);
  if (parts.size() < t.names.size()) {
    fail(fmt::format("not enough values to unpack (expected {}, got {})", t.names.size(), parts.size()));
  }
  if (parts.size() > t.names.size()) fail(fmt::format("too many values to unpack (expected {})", t.names.size()));
  for (size_t k = 0; k < parts.size(); ++k) sc.set(t.names[k], parts[k]);
}

Flow Interp::exec_stmt(const Stmt& st, const ScopeP& sc, std::string& out) {
  switch (st.k) {
    case SK::text: out += st.text; return Flow::normal;
    case SK::output: out += to_str(eval(*st.expr, sc)); return Flow::normal;
    case SK::if_:
      for (const auto& br : st.branches) {
        if (!br.first || truthy(eval(*br.first, sc))) return exec(br.second, sc, out);
      }
      return Flow::normal;
    case SK::for_: return exec_for(st, sc, out);
    case SK::set: assign(st.target, eval(*st.expr, sc), *sc); return Flow::normal;
    case SK::set_attr: {
      const Value* found = sc->find(st.text);
      if (found == nullptr || found->kind != Kind::ns) fail("cannot assign attribute on non-namespace object");
      const std::shared_ptr<Namespace> ns = found->ns;
      Value v = eval(*st.expr, sc);
      check_namespace_name(st.attr);
      ns->attrs.set(Value::string(st.attr), std::move(v));
      return Flow::normal;
    }
    case SK::set_block: {
      std::string text;
      auto inner = child(sc);
      exec(st.body, inner, text);
      Value v = Value::string(std::move(text));
      if (st.expr) {
        auto holder = child(sc);
        holder->set(kBlockValue, std::move(v));
        v = eval(*st.expr, holder);
      }
      assign(st.target, v, *sc);
      return Flow::normal;
    }
    case SK::filter_block: {
      std::string text;
      exec(st.body, child(sc), text);
      auto holder = child(sc);
      holder->set(kBlockValue, Value::string(std::move(text)));
      out += to_str(eval(*st.expr, holder));
      return Flow::normal;
    }
    case SK::macro: sc->set(st.text, macro_value(st, sc, st.text)); return Flow::normal;
    case SK::call_block: {
      const Expr& call_expr = *st.expr;
      const Value callee = eval(*call_expr.a, sc);
      CallArgs a = eval_args(call_expr, sc);
      a.kw.emplace_back("caller", macro_value(st, sc, "caller"));
      out += to_str(call(callee, a));
      return Flow::normal;
    }
    case SK::with: {
      auto inner = child(sc);
      for (const auto& p : st.params) inner->set(p.first, eval(*p.second, sc));
      exec(st.body, inner, out);
      return Flow::normal;
    }
    case SK::break_: return Flow::break_;
    case SK::continue_: return Flow::continue_;
    case SK::scope: exec(st.body, child(sc), out); return Flow::normal;
  }
  return Flow::normal;
}

Flow Interp::exec_for(const Stmt& st, const ScopeP& sc, std::string& out) {
  const Value seq = eval(*st.expr, sc);
  ValueList items = iterate(seq);
  if (st.cond) {
    ValueList kept;
    for (auto& x : items) {
      auto test_scope = child(sc);
      assign(st.target, x, *test_scope);
      if (truthy(eval(*st.cond, test_scope))) kept.push_back(std::move(x));
    }
    items = std::move(kept);
  }
  // jinja2 runs `else` unless some iteration reached the end of the body: its generated code
  // clears a flag at the end of the body, so break/continue skip clearing it.
  bool body_completed = false;
  auto shared = std::make_shared<const ValueList>(std::move(items));
  const auto n = static_cast<int64_t>(shared->size());
  for (int64_t k = 0; k < n; ++k) {
    auto iter_scope = child(sc);
    assign(st.target, (*shared)[static_cast<size_t>(k)], *iter_scope);
    Value loop;
    loop.kind = Kind::loop;
    loop.loop = std::make_shared<const LoopState>(LoopState{k, n, shared});
    iter_scope->set("loop", std::move(loop));
    const Flow f = exec(st.body, iter_scope, out);
    if (f == Flow::normal) body_completed = true;
    if (f == Flow::break_) break;
  }
  if (!body_completed && !st.else_body.empty()) exec(st.else_body, child(sc), out);
  return Flow::normal;
}

void Interp::check_namespace_name(const std::string& name) {
  if (!name.empty() && name[0] == '_') {
    fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " + py_repr_str(name) +
         ". Please rename the attribute.");
  }
}

Value Interp::call_macro(const Stmt& st, const ScopeP& closure, const std::string& name, CallArgs& a) {
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x) : d(x) {
      if (++d > kMaxDepth) fail("maximum recursion depth exceeded");
    }
    ~DepthGuard() { --d; }
  } guard(depth_);
  auto sc = child(closure);
  const size_t np = st.params.size();
  std::vector<bool> bound(np, false);
  for (size_t k = 0; k < a.pos.size() && k < np; ++k) sc->set(st.params[k].first, a.pos[k]), bound[k] = true;
  if (a.pos.size() > np && !st.uses_varargs) {
    fail(fmt::format("macro '{}' takes not more than {} argument(s)", name, np));
  }
  Dict kwargs;
  Value caller = Value::undefined("No caller defined");
  for (auto& kw : a.kw) {
    size_t k = 0;
    while (k < np && st.params[k].first != kw.first) ++k;
    if (k < np) {
      if (bound[k]) fail(fmt::format("macro '{}' got multiple values for argument '{}'", name, kw.first));
      sc->set(kw.first, kw.second);
      bound[k] = true;
    } else if (kw.first == "caller" && st.uses_caller) {
      caller = kw.second;
    } else if (st.uses_kwargs) {
      kwargs.set(Value::string(kw.first), kw.second);
    } else {
      fail(fmt::format("macro '{}' takes no keyword argument '{}'", name, kw.first));
    }
  }
  for (size_t k = 0; k < np; ++k) {
    if (bound[k]) continue;
    const auto& p = st.params[k];
    sc->set(p.first, p.second ? eval(*p.second, sc) : Value::undefined("parameter " + py_repr_str(p.first) + " was not provided"));
  }
  if (st.uses_varargs) {
    ValueList extra;
    for (size_t k = np; k < a.pos.size(); ++k) extra.push_back(a.pos[k]);
    sc->set("varargs", Value::make_list(std::move(extra), Seq::tuple));
  }
  if (st.uses_kwargs) sc->set("kwargs", Value::make_dict(std::move(kwargs)));
  if (st.uses_caller) sc->set("caller", caller);
  std::string out;
  exec(st.body, sc, out);
  return Value::string(std::move(out));
}

}  // namespace tessera::jinja::internal

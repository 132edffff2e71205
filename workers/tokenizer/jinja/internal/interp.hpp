// internal/interp.hpp: the tree-walking interpreter (interp.cpp): frames of variables and the
// Interp that renders a Program. One Interp per render, on one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "workers/tokenizer/jinja/internal/ast.hpp"
#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {

// Variables of one frame. Like jinja2's generated code: the template's top level writes the
// context, each for-loop iteration and macro call gets a fresh child frame, and `if` adds none.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      for (const auto& kv : s->vars) if (kv.first == name) return &kv.second;
    }
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    for (auto& kv : vars) {
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(v));
  }
};
using ScopeP = std::shared_ptr<Scope>;

enum class Flow : uint8_t { normal, break_, continue_ };

// The Undefined that a missing attribute (string key) or item of `obj` evaluates to.
Value undefined_member(const Value& obj, const Value& key);

class Interp {
 public:
  std::string render(const Program& prog, const Value& context);

  // Evaluates `e`; an Error without a line gets e's.
  Value eval(const Expr& e, const ScopeP& sc);
  Value call(const Value& callee, CallArgs& args);
  Flow exec(const Body& body, const ScopeP& sc, std::string& out);

  // A macro (or a call block's `caller`) bound to the frame it was defined in.
  // The function holds its frame weakly and the interpreter keeps the frame alive until the
  // render ends, so a macro stored in its own frame makes no reference cycle.
  Value macro_value(const Stmt& st, const ScopeP& closure, std::string name);
  Value call_macro(const Stmt& st, const ScopeP& closure, const std::string& name, CallArgs& a);

  // Namespaces are the one mutable value, so only they can form cycles; they are emptied when
  // the render ends.
  void track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }

  ~Interp();

  static void check_namespace_name(const std::string& name);

 private:
  static constexpr int kMaxDepth = 256;  // macro recursion (CPython stops near 1000 frames)

  CallArgs eval_args(const Expr& e, const ScopeP& sc);
  Value eval_node(const Expr& e, const ScopeP& sc);
  static void assign(const Target& t, const Value& v, Scope& sc);
  Flow exec_stmt(const Stmt& st, const ScopeP& sc, std::string& out);
  Flow exec_for(const Stmt& st, const ScopeP& sc, std::string& out);

  int depth_ = 0;
  std::vector<ScopeP> closures_;
  std::vector<std::weak_ptr<Namespace>> namespaces_;
};

}  // namespace tessera::jinja::internal

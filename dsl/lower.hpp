// Lowering DSL expressions to ir::Graph. Equal subexpressions become one node.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dsl/expr.hpp"
#include "ir/graph.hpp"
#include "ir/printer.hpp"

namespace qkv::dsl {

/// An expression with an output name: named<"weights">(w).
template <FixedString Name, Expr E> struct Named {
  E expr;  ///< The expression.
  /// The output's name in the graph.
  static constexpr std::string_view name() { return Name.view(); }
};
/// e as the graph output named Name, for lower().
template <FixedString Name, Expr E> constexpr Named<Name, E> named(E e) { return {e}; }

namespace detail {

/// Emits the terms of expressions into one graph: children first, in order, each term once.
class Lowerer {
 public:
  ir::Graph& graph() { return g_; }

  ir::ValueId emit(const TermPtr& root) {
    // Post-order without recursion (an expression may be thousands of nodes deep).
    std::vector<std::pair<const Term*, std::size_t>> stack{{root.get(), 0}};
    while (!stack.empty()) {
      auto& [t, next] = stack.back();
      if (emitted_.contains(t)) {
        stack.pop_back();
        continue;
      }
      if (next < t->children.size()) {
        const Term* child = t->children[next++].get();
        stack.emplace_back(child, 0);
        continue;
      }
      emitted_.emplace(t, emit_one(*t));
      stack.pop_back();
    }
    return emitted_.at(root.get());
  }

 private:
  ir::ValueId emit_one(const Term& t) {
    // Names, expressions ("3*E") and dims derived from others' values; symbols a node's shape
    // only carries over from its operands are declared already.
    for (const DimArg* d : t.dims) declare(*d);
    switch (t.kind) {
      case Term::Kind::input: return g_.add_input(t.name, t.dtype, t.shape);
      case Term::Kind::constant: return g_.constant(t.value, t.shape, t.rsqrt_of);
      case Term::Kind::node: break;
    }
    std::vector<ir::ValueId> ids;
    ids.reserve(t.children.size());
    for (const TermPtr& c : t.children) ids.push_back(emitted_.at(c.get()));
    return g_.add(t.op, std::move(ids), t.attrs);
  }

  void declare(const DimArg& d) {
    const std::string_view name = d.name_view();
    ir::Dim declared = d.value;
    if (d.is_derived_by_value()) declared = g_.derive_dim(d.op, d.a, d.b);
    else if (name.find_first_of("+*/") != std::string_view::npos) declared = ir::parse_dim(g_, name);
    else if (!name.empty()) declared = g_.symbol(name);
    QKV_ASSERT(declared == d.value, "the DSL and the graph disagree on dim " + std::string(name));
  }

  ir::Graph g_;
  std::unordered_map<const Term*, ir::ValueId> emitted_;
};

template <class T> void add_output(Lowerer& l, const T& out, int index) {
  if constexpr (Expr<T>) {
    l.graph().set_output(index == 0 ? "out" : "out" + std::to_string(index), l.emit(out.term()));
  } else {
    l.graph().set_output(T::name(), l.emit(out.expr.term()));
  }
}

}  // namespace detail

/// Lowers expressions to a graph. A plain expression becomes output "out" (then "out1", ...);
/// named<"x">(e) names its output.
template <class... Outs> ir::Graph lower(const Outs&... outs) {
  detail::Lowerer l;
  int index = 0;
  (detail::add_output(l, outs, index++), ...);
  return std::move(l.graph());
}

}  // namespace qkv::dsl

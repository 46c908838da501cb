// Lowering DSL expressions to ir::Graph. Equal subexpressions become one node.
#pragma once

#include <boost/hana/for_each.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/unpack.hpp>

#include <string>
#include <vector>

#include "dsl/expr.hpp"
#include "ir/graph.hpp"

namespace qkv::dsl {

/// An expression with an output name: named<"weights">(w).
template <FixedString Name, Expr E>
struct Named {
  E expr;
  static constexpr std::string_view name() { return Name.view(); }
};
template <FixedString Name, Expr E>
constexpr Named<Name, E> named(E e) { return {e}; }

namespace detail {

template <DimArg... Ds>
void declare(ir::Graph& g, DimList<Ds...>) {
  // Unnamed symbols come from shapes the DSL derived; inputs declared their names already.
  ((Ds.is_named() && !Ds.name_view().empty() ? (void)g.symbol(Ds.name_view()) : (void)0), ...);
}

class Lowerer {
 public:
  ir::Graph& graph() { return g_; }

  template <FixedString Name, DType DT, DimArg... Ds>
  ir::ValueId emit(const Input<Name, DT, Ds...>& e) {
    declare(g_, DimList<Ds...>{});
    return g_.add_input(e.name(), DT, Input<Name, DT, Ds...>::shape);
  }
  template <ir::Shape S>
  ir::ValueId emit(const Constant<S>& c) {
    return g_.constant(c.value, S, c.rsqrt_of);
  }
  template <ir::Op O, ir::Attrs A, class Names, Expr... Cs>
  ir::ValueId emit(const Node<O, A, Names, Cs...>& n) {
    declare(g_, Names{});
    std::vector<ir::ValueId> ids;
    hana::for_each(n.children, [&](const auto& child) { ids.push_back(emit(child)); });
    return g_.add(O, std::move(ids), A);
  }
  template <ir::Op O, ir::Attrs A, class Names, Expr... Cs>
  ir::ValueId emit(const ValueNode<O, A, Names, Cs...>& n) {
    if (O == ir::Op::dropout_mask && n.value == 0.0) return g_.constant(1.0);  // evaluation: no mask drawn
    std::vector<ir::ValueId> ids;
    hana::for_each(n.children, [&](const auto& child) { ids.push_back(emit(child)); });
    ir::Attrs attrs = A;
    attrs.value = n.value;
    return g_.add(O, std::move(ids), attrs);
  }

 private:
  ir::Graph g_;
};

template <class T>
void add_output(Lowerer& l, const T& out, int index) {
  if constexpr (Expr<T>) {
    l.graph().set_output(index == 0 ? "out" : "out" + std::to_string(index), l.emit(out));
  } else {
    l.graph().set_output(T::name(), l.emit(out.expr));
  }
}

}  // namespace detail

/// Lowers expressions to a graph. A plain expression becomes output "out" (then "out1", ...);
/// named<"x">(e) names its output.
template <class... Outs>
ir::Graph lower(const Outs&... outs) {
  detail::Lowerer l;
  int index = 0;
  (detail::add_output(l, outs, index++), ...);
  return std::move(l.graph());
}

}  // namespace qkv::dsl

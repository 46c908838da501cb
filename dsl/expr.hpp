// Expression nodes: what a DSL expression computes, with its shape and dtype checked at compile
// time by the registry's rules. Nodes hold their children by value, so no expression dangles.
#pragma once

#include <boost/hana/tuple.hpp>

#include <array>
#include <concepts>
#include <type_traits>

#include "dsl/dims.hpp"
#include "ir/op_rules.hpp"

namespace qkv::dsl {

namespace hana = boost::hana;

/// Base of every expression type.
struct ExprBase {};

template <class E>
concept Expr = std::is_base_of_v<ExprBase, E> && requires {
  { E::shape } -> std::convertible_to<ir::Shape>;
  { E::dtype } -> std::convertible_to<DType>;
};

/// A named graph input. Name and dims are part of the type.
template <FixedString Name, DType DT, DimArg... Ds>
struct Input : ExprBase {
  static constexpr ir::Shape shape = DimList<Ds...>::shape();
  static constexpr DType dtype = DT;
  using dims = DimList<Ds...>;
  static constexpr std::string_view name() { return Name.view(); }
  /// x[i] for an index a score or mask modifier gets: at(x, i) (dsl/score_mods.hpp).
  template <class I>
  constexpr auto operator[](I i) const { return at(*this, i); }
};

/// A tensor of a static shape filled with one value (a scalar by default); with `rsqrt_of` (a
/// named dim), the value divided by the square root of that dim's size when the graph is bound.
template <ir::Shape S = ir::Shape{}>
struct Constant : ExprBase {
  static constexpr ir::Shape shape = S;
  static constexpr DType dtype = DType::f32;
  double value = 0.0;
  ir::Dim rsqrt_of = 0;
};

namespace detail {
template <class... Cs>
constexpr std::array<ir::Operand, sizeof...(Cs)> operands() {
  return {ir::Operand{Cs::shape, Cs::dtype}...};
}
template <ir::Op O, ir::Attrs A, class... Cs>
constexpr ir::ShapeResult rule() {
  constexpr auto ops = operands<Cs...>();
  return ir::infer_shape(O, std::span<const ir::Operand>(ops.data(), ops.size()), A);
}
}  // namespace detail

/// An op applied to child expressions. `Names` lists the named dims its attributes mention.
template <ir::Op O, ir::Attrs A, class Names, Expr... Cs>
struct Node : ExprBase {
  static constexpr ir::ShapeResult result = detail::rule<O, A, Cs...>();
  static constexpr ir::Shape shape = result.shape;
  static constexpr DType dtype = result.dtype;
  static constexpr ir::Op op = O;
  static constexpr ir::Attrs attrs = A;
  using names = Names;
  hana::tuple<Cs...> children;
  /// x[i] for an index a score or mask modifier gets: at(x, i) (dsl/score_mods.hpp).
  template <class I>
  constexpr auto operator[](I i) const { return at(*this, i); }
};

/// A node whose `value` attribute is known only at run time (a dropout probability): its type
/// checks the shape with A, and lowering sets attrs.value = value.
template <ir::Op O, ir::Attrs A, class Names, Expr... Cs>
struct ValueNode : Node<O, A, Names, Cs...> {
  double value = 0.0;
};

/// Instantiated only when a rule fails: the compiler prints its template arguments (the op, the
/// error and the two dims involved) under the static assertion.
template <ir::Op O, ir::ShapeErr Error, ir::Dim Lhs, ir::Dim Rhs>
struct shape_check {
  static_assert(Error == ir::ShapeErr::none,
                "qkv: shape or dtype error at this call; see shape_check<op, error, lhs, rhs> in the lines above");
  static constexpr bool ok = true;
};

/// Builds a node after checking its shape rule at the call site.
template <ir::Op O, ir::Attrs A = ir::Attrs{}, class Names = DimList<>, Expr... Cs>
constexpr auto make_node(Cs... children) {
  constexpr ir::ShapeResult r = detail::rule<O, A, Cs...>();
  static_assert(shape_check<O, r.error, r.lhs, r.rhs>::ok);
  if constexpr (r.ok()) return Node<O, A, Names, Cs...>{{}, hana::make_tuple(children...)};
  else return ExprBase{};
}

}  // namespace qkv::dsl

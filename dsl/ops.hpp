// DSL builders for every primitive op: input, constants, arithmetic, reductions, matmul,
// layout, masks and softmax. Each checks shapes where it is called.
#pragma once

#include <cstdint>
#include <limits>

#include "dsl/expr.hpp"

namespace qkv::dsl {

/// A named input: input<"q">(dim<"B">, dim<"N">, dim<64>); input<"mask", DType::boolean>(...).
template <FixedString Name, DType DT = DType::f32, DimArg... Ds>
constexpr Input<Name, DT, Ds...> input(DimC<Ds>...) {
  static_assert(sizeof...(Ds) <= ir::kMaxRank, "qkv: input rank above kMaxRank");
  return {};
}

/// A scalar constant.
constexpr Constant<> constant(double value) { return Constant<>{{}, value}; }

namespace detail {
template <class T>
constexpr auto as_expr(T x) {
  if constexpr (Expr<T>) return x;
  else return constant(static_cast<double>(x));
}
template <class A, class B>
concept Operands = (Expr<A> && (Expr<B> || std::is_arithmetic_v<B>)) || (std::is_arithmetic_v<A> && Expr<B>);

constexpr ir::Attrs shape_attrs(const ir::Shape& shape) {
  ir::Attrs a;
  a.shape = shape;
  return a;
}

constexpr ir::Attrs axis_attrs(int axis, bool keepdim = true) {
  ir::Attrs a;
  a.axis = axis;
  a.keepdim = keepdim;
  return a;
}
}  // namespace detail

// Elementwise arithmetic with NumPy broadcasting; a number operand becomes a scalar constant.
template <class A, class B> requires detail::Operands<A, B>
constexpr auto operator+(A a, B b) { return make_node<ir::Op::add>(detail::as_expr(a), detail::as_expr(b)); }
template <class A, class B> requires detail::Operands<A, B>
constexpr auto operator-(A a, B b) { return make_node<ir::Op::sub>(detail::as_expr(a), detail::as_expr(b)); }
template <class A, class B> requires detail::Operands<A, B>
constexpr auto operator*(A a, B b) { return make_node<ir::Op::mul>(detail::as_expr(a), detail::as_expr(b)); }
template <class A, class B> requires detail::Operands<A, B>
constexpr auto operator/(A a, B b) { return make_node<ir::Op::div>(detail::as_expr(a), detail::as_expr(b)); }
template <Expr A>
constexpr auto operator-(A a) { return make_node<ir::Op::neg>(a); }

template <class A, class B> requires detail::Operands<A, B>
constexpr auto maximum(A a, B b) { return make_node<ir::Op::max>(detail::as_expr(a), detail::as_expr(b)); }
template <Expr A> constexpr auto exp(A a) { return make_node<ir::Op::exp>(a); }
template <Expr A> constexpr auto log(A a) { return make_node<ir::Op::log>(a); }
template <Expr A> constexpr auto sqrt(A a) { return make_node<ir::Op::sqrt>(a); }
template <Expr A> constexpr auto tanh(A a) { return make_node<ir::Op::tanh>(a); }
template <Expr A> constexpr auto erf(A a) { return make_node<ir::Op::erf>(a); }

/// cond ? a : b elementwise, cond boolean (true keeps a). A number for a or b becomes a scalar.
template <Expr C, class A, class B>
  requires(Expr<A> || std::is_arithmetic_v<A>) && (Expr<B> || std::is_arithmetic_v<B>)
constexpr auto where(C cond, A a, B b) {
  return make_node<ir::Op::where>(cond, detail::as_expr(a), detail::as_expr(b));
}

/// Sum over Axis (negative counts from the end); the axis stays as size 1 unless KeepDim is false.
template <int Axis, bool KeepDim = true, Expr X>
constexpr auto sum(X x) { return make_node<ir::Op::reduce_sum, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis, KeepDim)>(x); }
/// Maximum over Axis, like sum.
template <int Axis, bool KeepDim = true, Expr X>
constexpr auto max(X x) { return make_node<ir::Op::reduce_max, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis, KeepDim)>(x); }
/// Mean over Axis, like sum.
template <int Axis, bool KeepDim = true, Expr X>
constexpr auto mean(X x) { return make_node<ir::Op::reduce_mean, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis, KeepDim)>(x); }
/// log(softmax(x)) over Axis (default: the last), computed stably.
template <int Axis = -1, Expr X>
constexpr auto log_softmax(X x) { return make_node<ir::Op::log_softmax, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis)>(x); }

/// Sum of every element: a scalar.
template <Expr X>
constexpr auto sum_all(X x) {
  if constexpr (X::shape.rank == 0) return x;
  else return sum_all(sum<0, false>(x));
}
/// Mean of every element: a scalar.
template <Expr X>
constexpr auto mean_all(X x) {
  if constexpr (X::shape.rank == 0) return x;
  else return mean_all(mean<0, false>(x));
}

/// a == b and a > b elementwise, as boolean tensors.
template <class A, class B> requires detail::Operands<A, B>
constexpr auto equal(A a, B b) { return make_node<ir::Op::equal>(detail::as_expr(a), detail::as_expr(b)); }
template <class A, class B> requires detail::Operands<A, B>
constexpr auto greater(A a, B b) { return make_node<ir::Op::greater>(detail::as_expr(a), detail::as_expr(b)); }

/// f32 [..., Depth] from i32 ids [...]: 1 at each id.
template <std::int64_t Depth, Expr Ids>
constexpr auto one_hot(Ids ids) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    a.depth = Depth;
    return a;
  }();
  return make_node<ir::Op::one_hot, attrs>(ids);
}

/// x repeated to a shape it broadcasts to: broadcast_to(x, dim<"B">, dim<"N">, dim<64>).
template <Expr X, DimArg... Ds>
constexpr auto broadcast_to(X x, DimC<Ds>...) {
  return make_node<ir::Op::broadcast_to, detail::shape_attrs(DimList<Ds...>::shape()), DimList<Ds...>>(x);
}

/// Numerically stable softmax over Axis (default: the last).
template <int Axis = -1, Expr X>
constexpr auto softmax(X x) { return make_node<ir::Op::softmax, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis)>(x); }

/// Batched matrix product over the last two dims, batch dims broadcast. TransposeA/B use the
/// operand's last two dims swapped without a copy.
template <bool TransposeA = false, bool TransposeB = false, Expr A, Expr B>
constexpr auto matmul(A a, B b) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs r;
    r.transpose_a = TransposeA;
    r.transpose_b = TransposeB;
    return r;
  }();
  return make_node<ir::Op::matmul, attrs>(a, b);
}

/// Out dim i is input dim Perm[i].
template <int... Perm, Expr X>
constexpr auto permute(X x) {
  static_assert(sizeof...(Perm) == X::shape.rank, "qkv: permute needs one entry per dim of its operand");
  constexpr ir::Attrs attrs = [] {
    ir::Attrs r;
    int i = 0;
    ((r.perm[static_cast<std::size_t>(i++)] = static_cast<std::int8_t>(Perm)), ...);
    return r;
  }();
  return make_node<ir::Op::permute, attrs>(x);
}

/// Swaps dims I and J (negative counts from the end).
template <int I, int J, Expr X>
constexpr auto transpose(X x) {
  constexpr int r = X::shape.rank;
  constexpr int i = I < 0 ? I + r : I, j = J < 0 ? J + r : J;
  static_assert(i >= 0 && i < r && j >= 0 && j < r, "qkv: transpose axis out of range");
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    for (int k = 0; k < r; ++k) a.perm[static_cast<std::size_t>(k)] = static_cast<std::int8_t>(k == i ? j : k == j ? i : k);
    return a;
  }();
  return make_node<ir::Op::permute, attrs>(x);
}

/// The same elements in a new shape: reshape(x, dim<"B">, dim<"N">, dim<8>, dim<64>).
template <Expr X, DimArg... Ds>
constexpr auto reshape(X x, DimC<Ds>...) {
  return make_node<ir::Op::reshape, detail::shape_attrs(DimList<Ds...>::shape()), DimList<Ds...>>(x);
}

namespace detail {
/// Reshape to a shape computed from other expressions' shapes (its symbols are already named).
template <ir::Shape S, Expr X>
constexpr auto reshape_to(X x) {
  return make_node<ir::Op::reshape, shape_attrs(S)>(x);
}
}  // namespace detail

/// Boolean [Lq, Lk] keep-mask from x's last two dims: query i sees key j when j <= i
/// (top-left aligned) or j <= i + Lk - Lq (bottom-right aligned).
template <ir::CausalAlign Align = ir::CausalAlign::top_left, Expr X>
constexpr auto causal_mask(X x) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    a.align = Align;
    return a;
  }();
  return make_node<ir::Op::causal_mask, attrs>(x);
}

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace qkv::dsl

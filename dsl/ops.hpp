// DSL builders for every primitive op: input, constants, arithmetic, reductions, matmul,
// layout, masks and softmax. Each checks shapes where it is called.
#pragma once

#include <cstdint>
#include <limits>

#include "dsl/expr.hpp"

namespace qkv::dsl {

/// A named input: input<"q">(dim<"B">, dim<"N">, dim<64>); input<"mask", DType::boolean>(...).
template <FixedString Name, DType DT = DType::f32, DimArg... Ds> constexpr Input<Name, DT, Ds...> input(DimC<Ds>...) {
  static_assert(sizeof...(Ds) <= ir::kMaxRank, "qkv: input rank above kMaxRank");
  return {};
}

/// An input named at run time: a parameter of a model whose names come from its config and
/// checkpoint ("transformer.h.3.attn.c_attn.weight"); its type is its shape and dtype, as an
/// op's result. Each call is one graph input: make one per parameter and use it where needed
/// (a tied LM head reads the token embedding's).
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<"E">) * 1.0;  // an op's result: the loop keeps its type
///   for (int i = 0; i < 2; ++i) x = x + linear(x, param("h." + std::to_string(i) + ".weight", dim<"E">, dim<"E">));
/// \endcode
template <DType DT = DType::f32, DimArg... Ds> Node<DimList<Ds...>::shape(), DT> param(std::string name, DimC<Ds>...) {
  static_assert(sizeof...(Ds) <= ir::kMaxRank, "qkv: input rank above kMaxRank");
  return {{}, detail::make_param_term(std::move(name), DT, DimList<Ds...>::shape(), detail::dim_decls(DimList<Ds...>{}))};
}

/// A scalar constant.
constexpr Constant<> constant(double value) { return Constant<>{{}, value}; }

namespace detail {
template <class T> constexpr auto as_expr(T x) {
  if constexpr (Expr<T>) return x;
  else return constant(static_cast<double>(x));
}
template <class A, class B>
concept Operands = (Expr<A> && (Expr<B> || std::is_arithmetic_v<B>)) || (std::is_arithmetic_v<A> && Expr<B>);
/// An expression or a number (which becomes a scalar constant).
template <class T>
concept ExprOrNumber = Expr<T> || std::is_arithmetic_v<T>;
/// A boolean expression.
template <class T>
concept BoolExpr = Expr<T> && T::dtype == DType::boolean;

using ir::shape_attrs;

constexpr ir::Attrs axis_attrs(int axis, bool keepdim = true) {
  ir::Attrs a;
  a.axis = axis;
  a.keepdim = keepdim;
  return a;
}
}  // namespace detail

// Elementwise arithmetic on float tensors of one dtype, with NumPy broadcasting: the result has
// the broadcast shape. A number operand becomes a scalar constant, which takes the other
// operand's dtype (x * 0.5 stays f16 when x is).

/// a + b elementwise, broadcasting; a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator+(A a, B b) { return make_node<ir::Op::add>(detail::as_expr(a), detail::as_expr(b)); }
/// a - b elementwise, broadcasting; a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator-(A a, B b) { return make_node<ir::Op::sub>(detail::as_expr(a), detail::as_expr(b)); }
/// a * b elementwise, broadcasting; a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator*(A a, B b) { return make_node<ir::Op::mul>(detail::as_expr(a), detail::as_expr(b)); }
/// a / b elementwise, broadcasting; a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator/(A a, B b) { return make_node<ir::Op::div>(detail::as_expr(a), detail::as_expr(b)); }
/// -a elementwise (the op neg).
template <Expr A> constexpr auto operator-(A a) { return make_node<ir::Op::neg>(a); }

/// The larger of a and b elementwise, broadcasting (NaN if either is, as torch.maximum); a or b may
/// be a number: maximum(x, 0.0) is ReLU.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto maximum(A a, B b) { return make_node<ir::Op::max>(detail::as_expr(a), detail::as_expr(b)); }

// f(x) elementwise for every unary op of the registry (ir/ops.def), named as the op. Each takes a
// float tensor and returns one of its shape and dtype; `qkv ops` lists them.
#define QKV_DSL_UNARY(id, ...) \
  template <Expr A> auto id(A a) { return make_node<ir::Op::id>(a); }
QKV_UNARY_OPS(QKV_DSL_UNARY)
#undef QKV_DSL_UNARY
/// \fn template <Expr A> auto neg(A a)
/// -x elementwise: the same node as the operator -x.
/// \fn template <Expr A> auto exp(A a)
/// e^x elementwise.
/// \fn template <Expr A> auto log(A a)
/// The natural logarithm elementwise (-inf at 0, NaN below).
/// \fn template <Expr A> auto sqrt(A a)
/// The square root elementwise.
/// \fn template <Expr A> auto tanh(A a)
/// The hyperbolic tangent elementwise.
/// \fn template <Expr A> auto erf(A a)
/// The error function elementwise (the exact GELU's).
/// \fn template <Expr A> auto sin(A a)
/// The sine elementwise (positional encodings, rotary embeddings).
/// \fn template <Expr A> auto cos(A a)
/// The cosine elementwise.
/// \fn template <Expr A> auto softplus(A a)
/// log(1 + e^x) elementwise, a smooth ReLU (Mamba's step sizes, gates).
/// \fn template <Expr A> auto round_f16(A a)
/// x rounded to the nearest f16 (ties to even, infinity past 65504) but kept in x's dtype: how f32
/// kernels hold f16 values. Its gradient is zero; cast<DType::f16> carries half precision's.
/// \fn template <Expr A> auto round_bf16(A a)
/// x rounded to the nearest bf16 (ties to even) but kept in x's dtype: how f32 kernels hold bf16
/// values. Its gradient is zero; cast<DType::bf16> carries half precision's.

namespace detail {
constexpr ir::Attrs dtype_attrs(DType dtype) {
  ir::Attrs a;
  a.dtype = dtype;
  return a;
}
}  // namespace detail

/// x as To (f32 unless named): an i32 or bool tensor in arithmetic (true is 1), or a float
/// between f32, f16 and bf16 (rounded to nearest even; its gradient is cast back).
/// \code
///   auto q = input<"q", DType::f16>(dim<"B">, dim<"N">, dim<64>);
///   auto y = cast(scaled_dot_product_attention(q, q, q));  // the f16 output as f32
///   auto z = cast<DType::bf16>(y);                          // and rounded to bf16
///   static_assert(decltype(z)::dtype == DType::bf16);
/// \endcode
template <DType To = DType::f32, Expr A> constexpr auto cast(A a) { return make_node<ir::Op::cast, detail::dtype_attrs(To)>(a); }

/// x[Begin:End] along Axis (negative counts from the end); the bounds and that axis are static.
/// \code
///   auto w = input<"in_proj_weight">(dim<192>, dim<64>);
///   auto wq = slice<0, 0, 64>(w);  // the first 64 rows: [64, 64]
/// \endcode
template <int Axis, std::int64_t Begin, std::int64_t End, Expr X> constexpr auto slice(X x) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    a.axis = Axis < 0 ? Axis + X::shape.rank : Axis;
    a.begin = Begin;
    a.end = End;
    return a;
  }();
  return make_node<ir::Op::slice, attrs>(x);
}

/// a then b along Axis (negative counts from the end); the other dims must agree. Joining along a
/// named dim N and M gives the derived dim "N+M".
template <int Axis, Expr A, Expr B> constexpr auto concat(A a, B b) {
  return make_node<ir::Op::concat, detail::axis_attrs(Axis < 0 ? Axis + A::shape.rank : Axis)>(a, b);
}

/// f32 of x's shape holding each element's index along Axis: positions without an input.
template <int Axis, Expr X> constexpr auto iota(X x) {
  return make_node<ir::Op::iota, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis)>(x);
}

/// A zero tensor of the shape `S` (dims may be named; they bind from the graph's inputs).
template <ir::Shape S> constexpr Constant<S> zeros() { return Constant<S>{{}, 0.0}; }

/// x with each element zeroed with probability p and the rest scaled by 1/(1-p) (inverted
/// dropout). The mask is Philox4x32-10 keyed by `seed` (an i32 scalar input in [0, 2^24)) and
/// the element's position, so a seed gives the same mask on every backend and in the backward
/// graph; feed a new seed each training step. With p = 0 (evaluation) no mask is drawn: x * 1.
/// \code
///   auto x = input<"x">(dim<"B">, dim<16>);
///   auto y = dropout(x, input<"seed", DType::i32>(), 0.1);
/// \endcode
template <Expr X, Expr S> constexpr auto dropout(X x, S seed, double p) {
  static_assert(S::dtype == DType::i32 && S::shape.rank == 0, "qkv: the dropout seed is an i32 scalar");
  if (p == 0.0) return x * constant(1.0);  // evaluation: no mask drawn
  ir::Attrs probability;
  probability.dropout = p;
  return x * make_node_with<ir::Op::dropout_mask>(probability, x, seed);
}

/// cond ? a : b elementwise, cond boolean (true keeps a). A number for a or b becomes a scalar.
template <Expr C, detail::ExprOrNumber A, detail::ExprOrNumber B> constexpr auto where(C cond, A a, B b) {
  return make_node<ir::Op::where>(cond, detail::as_expr(a), detail::as_expr(b));
}

/// Sum over Axis (negative counts from the end); the axis stays as size 1 unless KeepDim is false.
template <int Axis, bool KeepDim = true, Expr X> constexpr auto sum(X x) {
  return make_node<ir::Op::reduce_sum, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis, KeepDim)>(x);
}
/// Maximum over Axis, like sum.
template <int Axis, bool KeepDim = true, Expr X> constexpr auto max(X x) {
  return make_node<ir::Op::reduce_max, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis, KeepDim)>(x);
}
/// Mean over Axis, like sum.
template <int Axis, bool KeepDim = true, Expr X> constexpr auto mean(X x) {
  return make_node<ir::Op::reduce_mean, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis, KeepDim)>(x);
}
/// log(softmax(x)) over Axis (default: the last), computed stably.
template <int Axis = -1, Expr X> constexpr auto log_softmax(X x) {
  return make_node<ir::Op::log_softmax, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis)>(x);
}

/// Sum of every element: a scalar.
template <Expr X> constexpr auto sum_all(X x) {
  if constexpr (X::shape.rank == 0) return x;
  else return sum_all(sum<0, false>(x));
}
/// Mean of every element: a scalar.
template <Expr X> constexpr auto mean_all(X x) {
  if constexpr (X::shape.rank == 0) return x;
  else return mean_all(mean<0, false>(x));
}

/// a == b elementwise, as a boolean tensor.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto equal(A a, B b) { return make_node<ir::Op::equal>(detail::as_expr(a), detail::as_expr(b)); }
/// a > b elementwise, as a boolean tensor.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto greater(A a, B b) { return make_node<ir::Op::greater>(detail::as_expr(a), detail::as_expr(b)); }

// Comparisons and logic as operators, as Halide writes them (masks and mask_mod): boolean
// tensors of the broadcast shape, with IEEE semantics (a comparison with NaN is false, so a >= b
// is a > b or a == b, and NaN != x is true). &&, || and ! take boolean tensors and evaluate both
// sides.

/// a == b elementwise, broadcasting, as a boolean tensor (equal); a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator==(A a, B b) { return equal(a, b); }
/// a > b elementwise, broadcasting, as a boolean tensor (greater); a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator>(A a, B b) { return greater(a, b); }
/// a < b elementwise, broadcasting, as a boolean tensor (greater(b, a)); a or b may be a number.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator<(A a, B b) { return greater(b, a); }
/// Logical not of a boolean tensor.
template <detail::BoolExpr A> constexpr auto operator!(A a) { return equal(cast(a), 0.0); }
/// Logical and of boolean tensors, broadcasting (both sides are evaluated).
template <detail::BoolExpr A, detail::BoolExpr B> constexpr auto operator&&(A a, B b) { return greater(cast(a) * cast(b), 0.5); }
/// Logical or of boolean tensors, broadcasting (both sides are evaluated).
template <detail::BoolExpr A, detail::BoolExpr B> constexpr auto operator||(A a, B b) { return greater(maximum(cast(a), cast(b)), 0.5); }
/// a != b elementwise, as a boolean tensor: !(a == b), so true where either is NaN.
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator!=(A a, B b) { return !(a == b); }
/// a >= b elementwise, as a boolean tensor: a > b || a == b (false where either is NaN).
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator>=(A a, B b) { return a > b || a == b; }
/// a <= b elementwise, as a boolean tensor: b > a || a == b (false where either is NaN).
template <class A, class B>
requires detail::Operands<A, B>
constexpr auto operator<=(A a, B b) { return b > a || a == b; }

/// f32 [..., Depth] from i32 ids [...]: 1 at each id.
template <std::int64_t Depth, Expr Ids> constexpr auto one_hot(Ids ids) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    a.depth = Depth;
    return a;
  }();
  return make_node<ir::Op::one_hot, attrs>(ids);
}

/// x repeated to a shape it broadcasts to: broadcast_to(x, dim<"B">, dim<"N">, dim<64>).
template <Expr X, DimArg... Ds> constexpr auto broadcast_to(X x, DimC<Ds>...) {
  return make_node<ir::Op::broadcast_to, detail::shape_attrs(DimList<Ds...>::shape()), DimList<Ds...>>(x);
}

/// Numerically stable softmax over Axis (default: the last).
template <int Axis = -1, Expr X> constexpr auto softmax(X x) {
  return make_node<ir::Op::softmax, detail::axis_attrs(Axis < 0 ? Axis + X::shape.rank : Axis)>(x);
}

/// softmax over the last axis with one more logit per row, the sink (broadcasting to x's shape
/// with a last dim of 1, in x's dtype), that takes weight and gives none: attention sinks, as
/// torch writes them, softmax(cat([x, sink], -1))[..., :-1]. A row may so weigh "nothing".
template <Expr X, Expr S> constexpr auto sink_softmax(X x, S sink) { return make_node<ir::Op::sink_softmax>(x, sink); }

/// Batched matrix product over the last two dims, batch dims broadcast. TransposeA/B use the
/// operand's last two dims swapped without a copy.
template <bool TransposeA = false, bool TransposeB = false, Expr A, Expr B> constexpr auto matmul(A a, B b) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs r;
    r.transpose_a = TransposeA;
    r.transpose_b = TransposeB;
    return r;
  }();
  return make_node<ir::Op::matmul, attrs>(a, b);
}

/// Out dim i is input dim Perm[i].
template <int... Perm, Expr X> constexpr auto permute(X x) {
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
template <int I, int J, Expr X> constexpr auto transpose(X x) {
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
template <Expr X, DimArg... Ds> constexpr auto reshape(X x, DimC<Ds>...) {
  return make_node<ir::Op::reshape, detail::shape_attrs(DimList<Ds...>::shape()), DimList<Ds...>>(x);
}

namespace detail {
/// Reshape to a shape computed from other expressions' shapes: its symbols are named already or
/// listed in `Names` (a DimList: the heads H, a derived head dim E/H).
template <ir::Shape S, class Names = DimList<>, Expr X> constexpr auto reshape_to(X x) {
  return make_node<ir::Op::reshape, shape_attrs(S), Names>(x);
}
}  // namespace detail

/// Boolean [Lq, Lk] keep-mask from x's last two dims: query i sees key j when j <= i
/// (top-left aligned) or j <= i + Lk - Lq (bottom-right aligned).
template <ir::CausalAlign Align = ir::CausalAlign::top_left, std::int64_t Window = 0, Expr X> constexpr auto causal_mask(X x) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    a.align = Align;
    a.window = Window;
    return a;
  }();
  return make_node<ir::Op::causal_mask, attrs>(x);
}
/// The look-ahead mask of a decoder: causal_mask, named as tutorials name it.
template <Expr X> constexpr auto look_ahead_mask(X x) { return causal_mask(x); }
/// Boolean [Lq, Lk] keep-mask of sliding-window attention over the last W keys (bottom-right).
/// \code
///   auto q = input<"q">(dim<"N">, dim<16>);
///   auto scores = matmul<false, true>(q, q);
///   auto same = where(sliding_window_mask<4>(scores), scores, kNegInf);  // the sliding_window<4> option
/// \endcode
template <std::int64_t W, Expr X> constexpr auto sliding_window_mask(X x) { return causal_mask<ir::CausalAlign::bottom_right, W>(x); }

/// -inf, the score of a dropped key (where(mask, scores, kNegInf)).
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace qkv::dsl

// Gradients in the DSL: qkv::grad(loss, wrt(Wq, Wk, Wv)), and forward mode: qkv::jvp(out, wrt(q)).
#pragma once

#include "dsl/lower.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::dsl {

/// Whether X is an Input (made by input<...>), the leaves wrt() takes.
template <class X> struct is_input : std::false_type {};
template <FixedString Name, DType DT, DimArg... Ds> struct is_input<Input<Name, DT, Ds...>> : std::true_type {};

/// The inputs to differentiate with respect to.
template <class... Xs> struct Wrt {
  static_assert((is_input<Xs>::value && ...), "qkv: wrt() takes inputs (the leaves made by input<...>)");
  /// The inputs' names, in order.
  static std::vector<std::string> names() { return {std::string(Xs::name())...}; }
};
/// The inputs xs (made by input<...>) for grad() to differentiate with respect to.
template <Expr... Xs> constexpr Wrt<Xs...> wrt(Xs...) { return {}; }

/// One graph computing the scalar `loss` (output "loss") and its gradient with respect to each
/// input named in `w` (outputs "d_<name>"), by reverse-mode autodiff on the lowered IR.
/// Example:
/// \code
///   auto x = input<"x">(dim<"N">, dim<8>);
///   auto w = input<"w">(dim<8>, dim<4>);
///   ir::Graph g = grad(mean_all(matmul(x, w)), wrt(w));  // outputs: loss, d_w
/// \endcode
template <Expr L, class... Xs> ir::Graph grad(L loss, Wrt<Xs...> w) {
  static_assert(L::shape.rank == 0, "qkv: grad() needs a scalar loss (reduce it with sum_all or mean_all)");
  return ir::build_backward(lower(named<"loss">(loss)), {"loss", w.names(), {}});
}

/// Forward mode: one graph computing `outs` (lowered as lower() names them: "out", or
/// named<"y">(e)'s name) and each one's Jacobian-vector product along tangents of the inputs in
/// `w` (new inputs "t_<name>", outputs "t_<out>"), on the lowered IR (ir::build_jvp).
/// Example:
/// \code
///   auto q = input<"q">(dim<"N">, dim<64>);
///   auto k = input<"k">(dim<"M">, dim<64>);
///   auto v = input<"v">(dim<"M">, dim<64>);
///   ir::Graph g = jvp(scaled_dot_product_attention(q, k, v), wrt(q));  // inputs q, k, v, t_q; outputs out, t_out
/// \endcode
template <class... Xs, class... Outs> ir::Graph jvp(Wrt<Xs...> w, const Outs&... outs) { return ir::build_jvp(lower(outs...), {w.names(), {}}); }
/// The same for one output (an expression, or named<"y">(e)): jvp(out, wrt(q)).
template <class Y, class... Xs> ir::Graph jvp(const Y& y, Wrt<Xs...> w) { return jvp(w, y); }

}  // namespace qkv::dsl

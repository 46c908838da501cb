// Gradients in the DSL: qkv::grad(loss, wrt(Wq, Wk, Wv)).
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

}  // namespace qkv::dsl

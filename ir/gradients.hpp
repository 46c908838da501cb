// The gradient column of the op registry (ops.def): for each op, how reverse-mode autodiff gets
// through it.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "ir/graph.hpp"

namespace qkv::ir {

/// How an op is differentiated: the kind of its registry row's gradient column.
enum class GradKind : std::uint8_t {
  rule,       ///< a rule written as IR ops (emit_gradient)
  zero,       ///< boolean, integer or piecewise-constant output, or a source: no gradient flows
  decompose,  ///< differentiated through its decomposition (decompositions.cpp)
  missing,    ///< no rule: autodiff reports the op by name (the coverage test keeps this empty)
};

/// What a gradient rule reads: node `n` of the forward graph, its value `y` and the loss's
/// gradient `dy` with respect to it, its operands `in` (all values of `g`, the graph the rule
/// adds to) and a zero scalar of `g`.
struct GradientArgs {
  Graph& g;                     ///< the graph the rule adds its nodes to
  const Node& n;                ///< the forward node being differentiated
  ValueId y;                    ///< its value, in g
  ValueId dy;                   ///< the loss's gradient with respect to y, in g
  std::span<const ValueId> in;  ///< its operands, in g
  ValueId zero;                 ///< a zero scalar of g
  /// A value's shape, by value: adding nodes may move the graph's node storage.
  Shape shape(ValueId v) const { return g.node(v).shape; }
  /// `grad` summed back to the shape of operand `operand`.
  ValueId unbroadcast(ValueId grad, int operand) const;
};

/// A gradient rule: one value per operand of the node, or -1 for an operand that gets none.
using GradientRule = std::vector<ValueId> (*)(const GradientArgs&);

/// An op's gradient column: how it is differentiated, and why or with what.
struct GradientInfo {
  GradKind kind = GradKind::missing;  ///< rule, zero, decompose or missing
  std::string_view why;               ///< for zero and decompose: the reason
  GradientRule emit = nullptr;        ///< for rule: the function that emits it
};

/// How autodiff differentiates `op`: its registry row's gradient column (ops.def).
GradientInfo gradient_info(Op op);

/// Appends to `g` the gradients of node `n`'s operands, given its value `y` and the gradient `dy`
/// of the loss with respect to it (both values of `g`; `in` are its operands in `g`). Returns one
/// value per operand, or -1 for an operand that gets no gradient. Only for GradKind::rule.
std::vector<ValueId> emit_gradient(Graph& g, const Node& n, ValueId y, ValueId dy, std::span<const ValueId> in);

/// seed * d op(x)/dx for a unary op with y = op(x), from the registry row's derivative column
/// (ir/ops.def): the one place each unary op's derivative is written. Reverse mode passes the
/// output's gradient as the seed (emit_gradient), forward mode a tangent (differentiate_region).
ValueId unary_derivative(Graph& g, Op op, ValueId x, ValueId y, ValueId seed);

/// Sums `grad` over the dims along which a value of shape `target` was broadcast, giving `target`'s
/// shape back (the gradient of broadcasting).
ValueId unbroadcast(Graph& g, ValueId grad, const Shape& target);

}  // namespace qkv::ir

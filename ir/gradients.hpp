// The gradient column of the op registry: for each op, how reverse-mode autodiff gets through it.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "ir/graph.hpp"

namespace qkv::ir {

enum class GradKind : std::uint8_t {
  rule,       // a rule written as IR ops (emit_gradient)
  zero,       // boolean, integer or piecewise-constant output, or a source: no gradient flows
  decompose,  // differentiated through its decomposition (decompositions.cpp)
  missing,    // no rule: autodiff reports the op by name (the coverage test keeps this empty)
};

struct GradientInfo {
  GradKind kind = GradKind::missing;
  std::string_view why;  // for zero and decompose: the reason
};

/// How autodiff differentiates `op` (an exhaustive switch: a new op must choose).
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

// Estimated floating-point work of each op, the cost column of ops.def: what `qkv explain` and
// `qkv bench` count.
#pragma once

#include <span>

#include "ir/graph.hpp"

namespace qkv::ir {

/// Floating-point operations node `n` does on concrete operand shapes `in` and result shape `out`:
/// 2 per multiply-add of a contraction, about one per element for elementwise ops and reductions,
/// about five per element for softmax-like composites, none for data movement and generators.
double estimated_flops(const Node& n, std::span<const Shape> in, const Shape& out);

/// The same for node `v` of `g`, its shapes bound (bind_shapes).
double estimated_flops(const Graph& g, ValueId v, const std::vector<Shape>& shapes);

}  // namespace qkv::ir

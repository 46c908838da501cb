// Decompositions of composite ops into primitives: each composite's reference meaning.
#pragma once

#include <span>

#include "ir/graph.hpp"

namespace qkv::ir {

/// Whether `op` is a composite (has a decomposition).
constexpr bool is_composite(Op op) { return op_info(op).category == OpCategory::composite; }

/// Appends to `g` the primitives that compute composite node `n` from `inputs` (values of `g`)
/// and returns the result.
ValueId decompose(Graph& g, const Node& n, std::span<const ValueId> inputs);

}  // namespace qkv::ir

// The IR verifier: run after every pass in debug and test builds.
#pragma once

#include "ir/graph.hpp"

namespace qkv::ir {

/// Throws IrError, with the printed graph, when `g` breaks an invariant: nodes in topological
/// order, arities, shapes and dtypes equal to what the registry's rules infer, unique input and
/// output names, declared symbols.
void verify(const Graph& g);

}  // namespace qkv::ir

// Random graphs from the op registry, checked on every backend against the float64 reference,
// and shrunk to the smallest failing graph: the differential test behind `qkv fuzz` and the
// random-graph test.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::backend {

/// A tensor of `shape` filled as the registry's cases say (normal floats, positive floats in
/// [0.25, 4), booleans, keep-first masks, i32 ids in [-1, 6], dropout seeds in [0, 1000)).
Tensor filled_tensor(ir::Fill fill, const std::vector<std::int64_t>& shape, std::mt19937_64& rng);

struct RandomGraph {
  ir::Graph graph;
  TensorMap inputs;
};

/// A graph of about `ops` nodes composed from the registry's op cases: each op's operands are
/// earlier values of the right type (so ops chain, broadcast and share operands) or new inputs;
/// masks, ids and seeds come from the cases; with probability one half the leading dim of the
/// inputs is a named dim "N" bound at run time. Operands that must be positive (log, sqrt, a
/// divisor) and exp's operand are always fresh inputs, so values stay finite. Outputs: "out", the
/// last value, and "out<i>" for every other value nothing reads, so no node is dead.
/// Deterministic in `seed`.
RandomGraph random_graph(std::uint64_t seed, int ops = 6);

struct RandomCheck {
  bool pass = true;
  std::string failure;       // "forward on cpu: out max abs error ... > budget ..." or an error
  ir::Graph failing_graph;   // the graph that failed (the backward one when the gradients did)
  TensorMap failing_inputs;  // its inputs
  bool backward_checked = false;
  std::string backward_skipped;  // why no backward graph was checked, when autodiff refused one
};

/// Runs `rg` forward on `backends` against the float64 reference and, with `grad`, its backward
/// graph (gradients of every float input, seeds d<output> random) where every op has a gradient.
RandomCheck check_random_graph(const RandomGraph& rg, const std::vector<std::string>& backends, bool grad, double factor = kDefaultBudgetFactor);

/// The smallest failing part of `g` on `backend_name`: the cone of the first node (in graph
/// order) whose value leaves its budget computed as the only output, with dead nodes removed.
/// Returns `g` itself when no single value fails alone.
ir::Graph shrink_failure(const ir::Graph& g, const TensorMap& inputs, const std::string& backend_name, double factor = kDefaultBudgetFactor);

}  // namespace qkv::backend

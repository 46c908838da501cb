// Gradient checks: analytic gradients of a scalar loss against central finite differences in
// double precision on the reference backend.
#pragma once

#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace qkv::testing {

/// `g` with an extra input "w_<out>" of each float output's shape and an output "loss" =
/// sum over outputs of sum(out * w_out): a scalar whose gradient reaches every output element.
ir::Graph with_weighted_sum_loss(const ir::Graph& g);

/// Checks d(loss)/d(x) for each input x in `wrt` (analytic, from build_backward, on the float64
/// reference) against central differences at up to `probes` elements per input.
void expect_gradients_match_finite_differences(const ir::Graph& g_with_loss, const backend::TensorMap& inputs, const std::vector<std::string>& wrt,
                                               int probes = 12);

/// Checks the Jacobian-vector products of every float output of `g` (ir::build_jvp, on the
/// float64 reference) along random tangents of the inputs in `wrt` against central differences
/// along the same direction, (f(x + h t) - f(x - h t)) / 2h, element by element; returns the
/// inputs with their tangents ("t_<x>", float64) for reuse on other backends.
backend::TensorMap expect_jvp_matches_central_differences(const ir::Graph& g, const backend::TensorMap& inputs, const std::vector<std::string>& wrt,
                                                          std::uint64_t seed = 5);

}  // namespace qkv::testing

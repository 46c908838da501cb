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

}  // namespace qkv::testing

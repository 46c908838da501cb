// The reference backend: plain loops, double accumulation, every op. The oracle.
#pragma once

#include <memory>

#include "backends/backend.hpp"

namespace qkv::backend {

enum class Precision { f64, f32 };

struct ReferenceOptions {
  /// f64: every value and sum in double (the oracle). f32: every value rounded to float after
  /// each op and sums in float: the "plain float32 computation" that error budgets scale from.
  Precision precision = Precision::f64;
  /// Return float outputs as f64 tensors instead of the graph's f32.
  bool f64_outputs = false;
  /// Accept f64 tensors for f32 inputs (finite differences in double precision).
  bool f64_inputs = false;
  /// Take sums (reductions, matmul) from the last term to the first: a second plain float32
  /// order, so that a budget is not anchored to one order's luck (a sum with cancellation).
  bool reversed_sums = false;
  /// Nonzero: move every half-precision rounding's result one ulp of its format up or down (the
  /// direction a hash of this seed, the node and the element), as if every rounding had come
  /// out the other way. How far that moves an output bounds what a correct backend's roundings
  /// can (its sums in f32 in another order, attention's probabilities rounded to f16 before their
  /// product with v): with cancellation after the roundings (a weighted sum of terms larger than
  /// itself) far more than the output's own ulps. See half_rounding_spread.
  std::uint32_t nudged_half_roundings = 0;
};

std::unique_ptr<Backend> make_reference_backend(ReferenceOptions options = {});

/// Every primitive; composites run as their decompositions.
bool reference_supports(const ir::Node& n);

}  // namespace qkv::backend

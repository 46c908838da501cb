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
  /// Nonzero: round about half the values a half-precision rounding changes (a choice by a hash
  /// of this seed, the node and the element) to their format's other neighbour, as if those
  /// roundings had come out the other way. How far that moves an output estimates how far a
  /// correct backend's roundings can (where its f32 values differ near a rounding boundary: sums
  /// in another order, attention's probabilities rounded inside a fused kernel), magnified by
  /// what follows them: a cancelling sum of terms larger than itself moves by their ulps, not by
  /// its own. See half_rounding_spread.
  std::uint32_t flipped_half_roundings = 0;
};

std::unique_ptr<Backend> make_reference_backend(ReferenceOptions options = {});

/// Every primitive; composites run as their decompositions.
bool reference_supports(const ir::Node& n);

}  // namespace qkv::backend

// Cross-backend equivalence: run one graph on several backends and compare each output with the
// double-precision reference, within error budgets anchored to double precision.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace qkv::backend {

/// One output of one backend against the float64 reference.
struct OutputComparison {
  std::string output;        ///< the output's name
  double max_abs_error = 0;  ///< max |backend - float64 reference|
  double max_rel_error = 0;  ///< max_abs_error / max |float64 reference| (normwise)
  double budget = 0;         ///< allowed max_abs_error
  bool pass = false;         ///< max_abs_error <= budget (a NaN or infinity the reference lacks counts as infinite error)
};

/// One backend's results against the reference.
struct BackendReport {
  std::string backend;                    ///< its name
  std::string device;                     ///< the device it ran on, as `qkv devices` names it
  std::string error;                      ///< why it did not run (unavailable, unsupported op); empty when it ran
  std::vector<OutputComparison> outputs;  ///< one per output of the graph
  bool pass = false;                      ///< it ran and every output passed
};

/// What check_equivalence found, backend by backend.
struct EquivalenceReport {
  std::vector<BackendReport> backends;  ///< in the order asked for
  /// Whether every backend passed.
  bool pass() const;
  /// A fixed-width table: backend, output, max abs error, max rel error, budget, pass/fail.
  std::string table() const;
};

/// Budget for one output: `factor` times the error a plain float32 computation of the same graph
/// makes against float64 (the reference backend in single precision), plus a floor of a few
/// float32 ulps of the output's largest magnitude, so exact-in-f32 graphs still get a budget (for
/// an output computed through f16 or bf16 values, 3 sqrt(n) ulps of the narrowest such format for
/// n half roundings on its longest path: rounding once can move a value one ulp, whatever f32
/// difference came before it).
/// check_equivalence takes the plain computation's error as the larger of two summation orders
/// (first term first, and last first): one order can be lucky on a sum with cancellation (a
/// score modifier's gradient, whose terms sum to nearly zero), and a budget anchored to that luck
/// fails a backend that rounds no worse.
inline constexpr double kDefaultBudgetFactor = 8.0;

/// Runs `g` on each named backend and compares with the float64 reference. A backend that cannot
/// start or run the graph fails with its error in the report (never skipped silently).
EquivalenceReport check_equivalence(const ir::Graph& g, const TensorMap& inputs, const std::vector<std::string>& backends,
                                    double factor = kDefaultBudgetFactor);
/// The same, with the backends made by `make` from their names (create, or a wrapper of it).
EquivalenceReport check_equivalence(const ir::Graph& g, const TensorMap& inputs, const std::vector<std::string>& backends, double factor,
                                    const std::function<std::unique_ptr<Backend>(const std::string&)>& make);

/// How an output was computed, for its budget's floor: the narrowest float format among it and the
/// values it depends on (by precision, the fraction bits whose ulp a rounding costs: bf16 (7),
/// then f16 (10), f32), and for a half format, how many half-precision results lie on the longest
/// path to it (each may round to the other neighbour when an f32 difference comes before it; such
/// flips, independent, add up along a path as a random walk: the floor is 3 sqrt(n) ulps, at
/// least one).
struct ComputedIn {
  DType format = DType::f32;  ///< the narrowest float format: f32, f16 or bf16
  int roundings = 0;          ///< half-precision results on the longest path (0 for f32)
  /// How far one-ulp flips of the graph's half-precision roundings move the output (its entry of
  /// half_rounding_spread; 0 where not measured).
  double spread = 0;
};
/// How output `name` of `g` was computed (throws IrError when `g` has no such output).
ComputedIn computed_in(const ir::Graph& g, const std::string& name);

/// Per output of `g`, how far its half-precision roundings can move it: the largest
/// |flipped - oracle| over four runs of the float64 reference, each with a random half of the
/// roundings that changed a value come out the other way (ReferenceOptions::
/// flipped_half_roundings, seeds 1 to 4), capped at a sixteenth of the output's magnitude. An
/// estimate, not a bound: a backend's roundings flip only where its f32 value differs near a
/// boundary, but what follows a flip can magnify it (a loss summing half products that cancel
/// moves by the products' ulps), which ulps of the output's own magnitude miss. Empty when `g`
/// rounds nothing to half precision. check_equivalence measures it only for an output beyond the
/// rest of its budget (four reference runs cost more than the comparisons they serve).
std::map<std::string, double> half_rounding_spread(const ir::Graph& g, const TensorMap& inputs, const TensorMap& oracle);

/// Compares `actual` with the float64 `oracle` given the plain-f32 result `plain` (and, where
/// given, `plain_reversed`, the same with its sums taken in the other order: the budget scales from
/// the larger of their errors). `how` says how the output was computed (computed_in(g, name),
/// with its spread, which joins the budget); the output's own dtype counts too.
OutputComparison compare_output(const std::string& name, const Tensor& actual, const Tensor& oracle, const Tensor& plain,
                                double factor = kDefaultBudgetFactor, const Tensor* plain_reversed = nullptr, ComputedIn how = {});

/// Random inputs for every graph input: floats ~ N(0, 1), booleans true with probability 0.7,
/// i32 in [0, 8).
/// Named dims take their sizes from `dims`; throws ShapeError naming a dim that is missing.
TensorMap random_inputs(const ir::Graph& g, const std::map<std::string, std::int64_t>& dims, std::uint64_t seed);

}  // namespace qkv::backend

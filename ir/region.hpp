// Score modifiers: the region a flex attention node carries, a small graph over one score.
//
// A region is an ir::Graph of rank-0 values. Its inputs are, in order, "score" (the scaled
// score q·k * scale), "q_idx" and "kv_idx" (the query's and the key's index along the scores'
// last two axes, as f32), then one "t<i>" per tensor operand of the node (the element of operand
// fixed_operands(op) + i that broadcasts to that score). Its other nodes are elementwise ops and
// rank-0 constants; its one output, "mod", is the modified score (f32; -inf drops the key).
// Every backend reads the same region: `reference` inlines it into the decomposition, `cpu`
// interprets it on score tiles, `vulkan` emits it as GLSL.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.hpp"

namespace qkv::ir {

/// The fixed inputs of every region, before its tensors.
inline constexpr int kRegionScore = 0, kRegionQIdx = 1, kRegionKvIdx = 2, kRegionFixedInputs = 3;

/// A region with its inputs declared and nothing else: score, q_idx, kv_idx, then "t<i>" of
/// dtype tensors[i] (f32 for an f16 or bf16 tensor: the modifier reads its elements widened,
/// computing in f32 as FlexAttention's kernels do). Add nodes and set_output("mod", ...) to finish it.
Graph make_region(std::span<const DType> tensors);

/// Why `r` is not a region over tensors of dtypes `tensors`, or empty when it is one.
std::string check_region(const Graph& r, std::span<const DType> tensors);

/// The number of tensor inputs of a well-formed region.
std::size_t region_tensors(const Graph& r);

/// Structural equality (node by node, outputs included) and a hash agreeing with it; null
/// regions are equal to each other only.
bool same_region(const Graph* a, const Graph* b);
std::size_t region_hash(const Graph* r);

/// Appends `r`'s computation to `g` over whole tensors: score is `score` ([..,N,M]), q_idx and
/// kv_idx are iotas over its last two axes, t<i> is tensors[i] (broadcasting). Returns the
/// modified scores, of score's shape.
ValueId inline_region(Graph& g, const Graph& r, ValueId score, std::span<const ValueId> tensors);

/// The derivative of r's result with respect to its input `wrt` (kRegionScore, or
/// kRegionFixedInputs + i for tensor i), as a region over the same inputs (forward mode:
/// tangents of comparisons, casts and constants are zero). With `keep_primal`, a second output
/// "primal" is r's own result (what a kernel evaluating both at once reads).
Graph differentiate_region(const Graph& r, int wrt, bool keep_primal = false);

/// The values a region input or result may take over a tile of scores: every value lies in
/// [lo, hi] (infinities included) or, when `nan`, may also be NaN. Booleans are 0 and 1.
struct ValueRange {
  double lo = -HUGE_VAL, hi = HUGE_VAL;
  bool nan = true;
  static ValueRange exactly(double v);
  static ValueRange between(double lo, double hi) { return {lo, hi, false}; }
  /// Nothing known: any value, NaN included.
  static ValueRange unknown() { return {}; }
  /// Every value is v (and none NaN).
  bool is(double v) const { return !nan && lo == v && hi == v; }
  bool operator==(const ValueRange&) const = default;
};

/// Interval arithmetic over `r`: the range of its output `output` when each input i lies in
/// inputs[i] (score, q_idx, kv_idx, t0, ...). Sound (every value the region computes from such
/// inputs lies in the result), not tight. What block sparsity reads: a tile whose "mod" is
/// exactly -inf is masked whatever the scores are.
ValueRange bound_region(const Graph& r, std::span<const ValueRange> inputs, std::string_view output = "mod");

/// bound_region's ranges of every node of r, by node id.
std::vector<ValueRange> bound_region_nodes(const Graph& r, std::span<const ValueRange> inputs);

/// Whether r can mask a key (its result can be -inf whatever the score: a `where` with a -inf
/// branch): only such regions are worth bounding per tile.
bool region_masks(const Graph& r);

/// r's masking conditions: for each `where` with a -inf branch, its condition and whether it
/// keeps the score where the condition holds (the -inf branch is the other). Empty when a
/// condition masks on both sides (r has no unmasked form).
std::vector<std::pair<ValueId, bool>> masking_conditions(const Graph& r);

/// r where every masking condition keeps: each `where` on such a condition (the -inf one and
/// any other, e.g. a derivative's) replaced by the branch the condition then selects, and the
/// nodes only the conditions read dropped; the inputs and outputs as r's. What a tile runs when
/// the conditions provably hold over it (FlexAttention's full blocks).
Graph unmasked_region(const Graph& r);

/// Whether every condition of `conds` (masking_conditions) provably selects its keeping branch,
/// from bound_region_nodes' ranges: unmasked_region then equals the region over those ranges.
bool conditions_keep(std::span<const ValueRange> ranges, std::span<const std::pair<ValueId, bool>> conds);

/// A document mask in `r`: a condition `equal(a, b)` of a tensor a that does not vary along the
/// scores' keys and a tensor b that does not vary along their queries (`varies[i]`: whether
/// tensor i varies along the queries, along the keys), neither read anywhere else, whose
/// inequality makes the result -inf whatever the other inputs are (proved by bound_region with
/// a and b held apart: they reach the result only through the comparison, so any two ids that
/// differ, or a NaN, give the same). varlen's sequence numbers and document_mask's ids: a query
/// keeps no key of another id, and the kernels tile each run of equal ids as a sequence of its
/// own. The tensors' indices (i of t_i), or {-1, -1}.
std::pair<int, int> document_mask_tensors(const Graph& r, const std::vector<std::pair<bool, bool>>& varies);
/// Whether flex attention node n's modifier holds a document mask (document_mask_tensors), its
/// tensors' shapes given by `shape` (static or bound; broadcasting to the scores [.., N, M], a
/// tensor whose dim -2 is 1 does not vary along the queries, dim -1 along the keys).
bool has_document_mask(const Node& n, const std::function<const Shape&(ValueId)>& shape);

/// The modifier as one infix expression over its inputs' names, e.g.
/// "tanh(score / 30) * 30 + t0": how explain, dot and dump name it.
std::string region_expression(const Graph& r);

}  // namespace qkv::ir

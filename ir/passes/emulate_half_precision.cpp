// Half precision on f32 kernels: every f16 and bf16 value held in f32, rounded where it is made.
#include <algorithm>
#include <map>

#include "ir/passes/passes.hpp"

namespace qkv::ir {

namespace {

/// `x` (f32) rounded to `dtype`'s nearest value.
ValueId round_to_dtype(Graph& g, ValueId x, DType dtype) { return g.add(dtype == DType::f16 ? Op::round_f16 : Op::round_bf16, {x}); }

/// Whether the op's every result value is one of its float operands' values (moved, repeated or
/// selected): of operands that are all `dtype` numbers it gives `dtype` numbers, and rounding them
/// again would change nothing. The registry's layout and select ops, and page_gather (a composite
/// whose meaning is a gather through reshapes).
bool moves_values(Op op) {
  const OpCategory c = op_info(op).category;
  return c == OpCategory::layout || c == OpCategory::select || op == Op::page_gather;
}

}  // namespace

bool has_half_values(const Graph& g) {
  return std::any_of(g.nodes().begin(), g.nodes().end(), [](const Node& n) { return is_half(n.dtype); });
}

Graph emulate_half_precision(const Graph& g, HalfInputs inputs) {
  if (!has_half_values(g)) return g;
  // The values of the new graph known to hold `dtype` numbers (a half input, a rounding, what
  // moves only such values), by the half dtype.
  std::map<ValueId, DType> numbers;
  auto rewrite = [inputs, &numbers](Graph& out, ValueId, const Node& n, std::span<const ValueId> in) -> ValueId {
    const bool half = is_half(n.dtype);
    auto of = [&](ValueId v) {
      numbers[v] = n.dtype;
      return v;
    };
    if (n.op == Op::input && half && inputs == HalfInputs::kept) return of(out.cast(out.add_input(n.name, n.dtype, n.shape), DType::f32));
    if (n.op == Op::input) return half ? of(out.add_input(n.name, DType::f32, n.shape)) : -1;
    if (n.op == Op::cast) {
      const ValueId x = out.cast(in[0], DType::f32);          // a float is held in f32 now; an i32 or bool cast
      return half ? of(round_to_dtype(out, x, n.dtype)) : x;  // to f32: a half value is an f32 value
    }
    if (!half) return -1;  // its operands' dtypes decide it: the same as before
    const ValueId y = out.add(n.op, {in.begin(), in.end()}, n.attrs, n.region);
    // Moving values that are all of its dtype already (a cache's pages gathered, heads reshaped):
    // nothing to round, so that kernels may read those values where they lie.
    const bool exact = moves_values(n.op) && std::all_of(in.begin(), in.end(), [&](ValueId x) {
                         const auto it = numbers.find(x);
                         return out.node(x).dtype != DType::f32 || (it != numbers.end() && it->second == n.dtype);
                       });
    // Otherwise computed in f32 (the op's rule gives f32 from f32 operands), the result rounded once.
    return of(exact ? y : round_to_dtype(out, y, n.dtype));
  };
  if (inputs == HalfInputs::widened) return rebuild(g, rewrite);
  // A kept half input's update, and a half output, is its (rounded) value cast back to its
  // dtype: a backend storing 16-bit values stores it so.
  Graph without_results = g;
  without_results.clear_results();
  std::vector<ValueId> map;
  Graph out = rebuild(without_results, rewrite, &map);
  // The cast rounds: a value rounded only to be cast is cast unrounded (the rounding is then
  // dead). One the graph reads rounded too is cast from its rounding (the same bits: rounding
  // twice is rounding once), so that the unrounded value keeps a single reader (a kernel may
  // then write it rounded, and the cast is a view of that).
  std::vector<int> readers(out.size(), 0);
  for (const Node& n : out.nodes())
    for (ValueId x : n.inputs) ++readers[static_cast<std::size_t>(x)];
  auto stored = [&](ValueId v) {
    ValueId x = map[static_cast<std::size_t>(v)];
    const Node& r = out.node(x);
    const bool rounded = (r.op == Op::round_f16 && g.node(v).dtype == DType::f16) || (r.op == Op::round_bf16 && g.node(v).dtype == DType::bf16);
    if (rounded && readers[static_cast<std::size_t>(x)] == 0) x = r.inputs[0];
    return out.cast(x, g.node(v).dtype);
  };
  for (const auto& [name, v] : g.outputs()) out.set_output(name, stored(v));
  for (const auto& [name, v] : g.updates()) out.set_update(name, stored(v));
  return out;
}

}  // namespace qkv::ir

// Grouped-query attention as rows: G query heads that share their key/value head (k and v
// broadcast along the axis where q has the G heads) become G times the query rows of one batch
// entry, so an attention kernel reads each key/value head once for all its query heads; a decode
// step reads its cache once instead of G times. Exact where no score depends on the query's row:
// no causality (or a decode step's, one query aligned bottom-right, which keeps every key), no
// keep-mask, no modifier that reads q_idx or a tensor, no dropout (its bits are keyed by each
// weight's index). Sinks per head become sinks per row.
#include "ir/passes/passes.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

namespace {

/// Whether a flex node's modifier is the score itself: its result neither reads the query's
/// index nor a tensor.
bool identity_modifier(const Node& n) { return n.region && region_tensors(*n.region) == 0 && n.region->output("mod") == kRegionScore; }

/// `s` without its axis -3 (the query heads of a group, where k and v have 1), or `s` when it has
/// no such axis.
Shape without_group_axis(const Shape& s) {
  if (s.rank < 3) return s;
  Shape r;
  for (int i = 0; i < s.rank; ++i)
    if (i != s.rank - 3) r.push_back(s[i]);
  return r;
}

/// `s` [..., G, R, C] as [..., G R, C].
Shape rows_merged(const Shape& s) {
  Shape r = without_group_axis(s);
  r[r.rank - 2] = s.back(2) * s.back(1);
  return r;
}

/// v reshaped; a half value widened to f32 (half precision's emulation) reshaped before it is
/// widened, so that kernels still read it in 16 bits where it lies.
ValueId reshaped(Graph& g, ValueId v, const Shape& to) {
  if (g.node(v).shape == to) return v;
  const Node& n = g.node(v);
  if (n.op == Op::cast && is_half(g.node(n.inputs[0]).dtype)) {
    const Attrs widen = n.attrs;
    return g.add(Op::cast, {g.add(Op::reshape, {n.inputs[0]}, shape_attrs(to))}, widen);
  }
  return g.add(Op::reshape, {v}, shape_attrs(to));
}

}  // namespace

Graph group_query_heads(const Graph& g, const std::function<bool(const Node&)>& keep) {
  // A training graph pairs the forward with its log-sum-exp and gradients by their operands, a
  // forward-mode graph with its tangent: left as it is.
  for (const Node& n : g.nodes())
    if (is_fused_attention(n.op) && !attention_roles(n.op).forward()) return g;
  return rebuild(g, [&](Graph& out, ValueId, const Node& n, std::span<const ValueId> in) -> ValueId {
    if ((n.op != Op::attention && n.op != Op::flex_attention) || (keep && !keep(n))) return -1;
    if (n.op == Op::flex_attention && (n.attrs.dropout != 0.0 || !identity_modifier(n))) return -1;
    const Shape qs = out.node(in[0]).shape, ks = out.node(in[1]).shape, vs = out.node(in[2]).shape;
    if (qs.rank < 3 || is_symbol(qs.back(2)) || is_symbol(qs.back(1)) || qs.back(2) < 2) return -1;
    const auto shared = [](const Shape& s) { return s.rank < 3 || s.back(2) == 1; };
    if (!shared(ks) || !shared(vs)) return -1;
    Attrs a = n.attrs;
    if (a.causal) {
      if (a.align != CausalAlign::bottom_right || qs.back(1) != 1 || a.window != 0) return -1;
      a.causal = false;  // one query after its keys keeps every one
      a.align = CausalAlign::top_left;
    }
    std::vector<ValueId> operands = {reshaped(out, in[0], rows_merged(qs)), reshaped(out, in[1], without_group_axis(ks)),
                                     reshaped(out, in[2], without_group_axis(vs))};
    if (has_sink(n.op, n.attrs)) {  // a sink per query head: one per row of its group
      Shape rows = n.shape;
      rows[rows.rank - 1] = 1;
      const ValueId sink = out.add(Op::broadcast_to, {in[sink_operand(n.op, n.attrs, in.size())]}, shape_attrs(rows));
      operands.push_back(reshaped(out, sink, rows_merged(rows)));
    }
    return reshaped(out, out.add(n.op, std::move(operands), a, n.region), n.shape);
  });
}

}  // namespace qkv::ir

// The decomposition column of ops.def: each composite's meaning in primitives.
#include "ir/decompositions.hpp"

#include <cmath>

#include "ir/error.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

namespace {

Attrs transposed(bool a, bool b) {
  Attrs t;
  t.transpose_a = a;
  t.transpose_b = b;
  return t;
}

/// `s` with -inf where attention's causality or sliding window (node n's attributes) drops a key.
ValueId causal(Graph& g, const Node& n, ValueId s) {
  if (!n.attrs.causal) return s;
  Attrs align;
  align.align = n.attrs.align;
  align.window = n.attrs.window;
  return g.add(Op::where, {g.add(Op::causal_mask, {s}, align), s, g.constant(-HUGE_VAL)});
}

/// Attention's scores q kT * scale, -inf where the keep-mask (when mask >= 0), causality or the
/// sliding window drops a key.
ValueId masked_scores(Graph& g, const Node& n, ValueId q, ValueId k, ValueId mask) {
  ValueId s = g.add(Op::mul, {g.add(Op::matmul, {q, k}, transposed(false, true)), g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of)});
  if (mask >= 0) s = g.add(Op::where, {mask, s, g.constant(-HUGE_VAL)});
  return causal(g, n, s);
}

/// Flex attention's scores: its region applied to q kT * scale, then causality and the window.
/// `tensors` are the region's tensor operands.
ValueId modified_scores(Graph& g, const Node& n, ValueId q, ValueId k, std::span<const ValueId> tensors) {
  ValueId s = g.add(Op::mul, {g.add(Op::matmul, {q, k}, transposed(false, true)), g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of)});
  return causal(g, n, inline_region(g, *n.region, s, tensors));
}

/// The rows' max of `x` over its last axis, and the sink's where there is one (sink >= 0; NaN
/// where either is), 0 where it is -inf, so that x - max stays -inf rather than NaN.
ValueId row_max(Graph& g, ValueId x, ValueId sink) {
  Attrs keep;
  keep.axis = g.node(x).shape.rank - 1;
  ValueId m = g.add(Op::reduce_max, {x}, keep);
  if (sink >= 0) m = g.add(Op::max, {m, sink});
  return g.add(Op::where, {g.add(Op::equal, {m, g.constant(-HUGE_VAL)}), g.constant(0.0), m});
}

/// sum(exp(s - m)) over the last axis of s, with the sink's term exp(sink - m) where there is one.
ValueId row_sum(Graph& g, ValueId s, ValueId m, ValueId sink) {
  Attrs keep;
  keep.axis = g.node(s).shape.rank - 1;
  const ValueId sum = g.add(Op::reduce_sum, {g.add(Op::exp, {g.add(Op::sub, {s, m})})}, keep);
  return sink < 0 ? sum : g.add(Op::add, {sum, g.add(Op::exp, {g.add(Op::sub, {sink, m})})});
}

/// lse = m + log(sum(exp(s - m))), m the row max (0 for a row of -inf, whose lse is -inf); with
/// a sink (sink >= 0), over the row's scores and its sink logit.
ValueId row_lse(Graph& g, ValueId s, ValueId sink = -1) {
  if (sink >= 0) sink = g.cast(sink, g.node(s).dtype);  // in the dtype of the scores it joins
  const ValueId m = row_max(g, s, sink);
  return g.add(Op::add, {m, g.add(Op::log, {row_sum(g, s, m, sink)})});
}

/// A flex node's sink operand, or -1 without one.
ValueId sink_of(const Node& n, std::span<const ValueId> in) { return has_sink(n.op, n.attrs) ? in[sink_operand(n.op, n.attrs, in.size())] : -1; }

/// x (shaped as flex attention node n's weights) times its dropout mask when n drops weights:
/// dropout_mask(x, seed) {dropout = p}, the seed n's last operand `in.back()`.
ValueId dropped(Graph& g, const Node& n, std::span<const ValueId> in, ValueId x) {
  if (!has_dropout_seed(n.op, n.attrs)) return x;
  Attrs p;
  p.dropout = n.attrs.dropout;
  return g.add(Op::mul, {x, g.add(Op::dropout_mask, {x, in.back()}, p)});
}

/// The probabilities p = exp(s - lse), 0 where s = -inf (masked).
ValueId probabilities(Graph& g, ValueId s, ValueId lse) {
  return g.add(Op::where, {g.add(Op::equal, {s, g.constant(-HUGE_VAL)}), g.constant(0.0), g.add(Op::exp, {g.add(Op::sub, {s, lse})})});
}

/// An attention's output tangent (forward mode) from its masked scores s, their tangent ds (0
/// where s is masked), and v and its tangent tv: p = softmax(s) (sink_softmax with a sink >= 0),
/// pz = p times dropout's mask (dropped), y = pz v, and
/// y' = (pz ds) v - sum(p ds) y + pz tv, since d p / d s = p (ds - sum(p ds)) row by row.
ValueId output_tangent(Graph& g, const Node& n, std::span<const ValueId> in, ValueId s, ValueId ds, ValueId v, ValueId tv, ValueId sink) {
  Attrs last;
  last.axis = g.node(s).shape.rank - 1;
  const ValueId p = sink < 0 ? g.add(Op::softmax, {s}, last) : g.add(Op::sink_softmax, {s, g.cast(sink, g.node(s).dtype)});
  const ValueId pz = dropped(g, n, in, p);
  const ValueId y = g.add(Op::matmul, {pz, v});
  const ValueId mean = g.add(Op::reduce_sum, {g.add(Op::mul, {p, ds})}, last);
  const ValueId moved = g.add(Op::matmul, {g.add(Op::mul, {pz, ds}), v});
  return g.add(Op::add, {g.add(Op::sub, {moved, g.add(Op::mul, {mean, y})}), g.add(Op::matmul, {pz, tv})});
}

/// The scores' tangent (tq kT + q tkT) * scale before any modifier or mask.
ValueId score_tangent(Graph& g, const Node& n, std::span<const ValueId> in) {
  const ValueId dots =
      g.add(Op::add, {g.add(Op::matmul, {in[3], in[1]}, transposed(false, true)), g.add(Op::matmul, {in[0], in[4]}, transposed(false, true))});
  return g.add(Op::mul, {dots, g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of)});
}

/// ds with 0 where the masked scores s are -inf (a masked score has no tangent).
ValueId unmasked(Graph& g, ValueId s, ValueId ds) { return g.add(Op::where, {g.add(Op::equal, {s, g.constant(-HUGE_VAL)}), g.constant(0.0), ds}); }

}  // namespace

namespace decompositions {

// One function per decomposition column of ops.def: a composite's reference meaning.

ValueId softmax(Graph& g, const Node& n, std::span<const ValueId> in) {
  // softmax(x) = exp(x - max(x)) / sum(exp(x - max(x))): subtracting the max keeps exp <= 1.
  // A row of -inf (every key masked) gives zeros, not NaN: its max counts as 0 and its sum
  // of zeros as 1.
  Attrs reduce;
  reduce.axis = n.attrs.axis;
  reduce.keepdim = true;
  ValueId zero = g.constant(0.0), one = g.constant(1.0);
  ValueId m = g.add(Op::reduce_max, {in[0]}, reduce);
  m = g.add(Op::where, {g.add(Op::equal, {m, g.constant(-HUGE_VAL)}), zero, m});
  ValueId e = g.add(Op::exp, {g.add(Op::sub, {in[0], m})});
  ValueId s = g.add(Op::reduce_sum, {e}, reduce);
  return g.add(Op::div, {e, g.add(Op::where, {g.add(Op::equal, {s, zero}), one, s})});
}

ValueId sink_softmax(Graph& g, const Node&, std::span<const ValueId> in) {
  // exp(x - m) / (sum(exp(x - m)) + exp(sink - m)), m = max(max(x), sink): the softmax of the row
  // with the sink appended, its weight dropped. Rows of -inf with a sink of -inf give zeros (their
  // sum of zeros counts as 1), as softmax's do.
  const ValueId x = in[0], m = row_max(g, x, in[1]), one = g.constant(1.0), zero = g.constant(0.0);
  const ValueId z = row_sum(g, x, m, in[1]);
  return g.add(Op::div, {g.add(Op::exp, {g.add(Op::sub, {x, m})}), g.add(Op::where, {g.add(Op::equal, {z, zero}), one, z})});
}

ValueId attention(Graph& g, const Node& n, std::span<const ValueId> in) {
  // softmax(s) v over the masked scores s.
  ValueId s = masked_scores(g, n, in[0], in[1], n.op == Op::masked_attention ? in[3] : -1);
  Attrs last;
  last.axis = g.node(s).shape.rank - 1;
  return g.add(Op::matmul, {g.add(Op::softmax, {s}, last), in[2]});
}

ValueId attention_lse(Graph& g, const Node& n, std::span<const ValueId> in) {
  // lse = m + log(sum(exp(s - m))), m the row max (0 for a row of -inf, whose lse is -inf).
  return row_lse(g, masked_scores(g, n, in[0], in[1], n.op == Op::masked_attention_lse ? in[2] : -1));
}

ValueId attention_grad(Graph& g, const Node& n, std::span<const ValueId> in) {
  // p = exp(s - lse), 0 where s = -inf (masked);  dv = pT dy;  ds = p (dy vT - delta);
  // dq = ds k * scale;  dk = dsT q * scale.
  ValueId q = in[0], k = in[1], v = in[2], dy = in[3], lse = in[4], delta = in[5];
  ValueId s = masked_scores(g, n, q, k, n.op == Op::masked_attention_grad ? in[6] : -1);
  ValueId p = probabilities(g, s, lse);
  if (n.attrs.wrt == 2) return g.add(Op::matmul, {p, dy}, transposed(true, false));
  ValueId ds = g.add(Op::mul, {p, g.add(Op::sub, {g.add(Op::matmul, {dy, v}, transposed(false, true)), delta})});
  ValueId scale = g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of);
  if (n.attrs.wrt == 0) return g.add(Op::mul, {g.add(Op::matmul, {ds, k}), scale});
  return g.add(Op::mul, {g.add(Op::matmul, {ds, q}, transposed(true, false)), scale});
}

ValueId flex_attention(Graph& g, const Node& n, std::span<const ValueId> in) {
  // softmax(mod(s)) v, the region inlined over the whole score matrix; with dropout, the
  // weights times dropout_mask(weights, seed) first (the bits of the unfused graph).
  const std::span<const ValueId> tensors = in.subspan(3, modifier_tensor_count(n.op, n.attrs, in.size()));
  // With sinks, sink_softmax's weights.
  ValueId s = modified_scores(g, n, in[0], in[1], tensors);
  Attrs last;
  last.axis = g.node(s).shape.rank - 1;
  const ValueId sink = sink_of(n, in);
  const ValueId p = sink < 0 ? g.add(Op::softmax, {s}, last) : g.add(Op::sink_softmax, {s, g.cast(sink, g.node(s).dtype)});
  return g.add(Op::matmul, {dropped(g, n, in, p), in[2]});
}

// lse over the modified scores (and the sink).
ValueId flex_attention_lse(Graph& g, const Node& n, std::span<const ValueId> in) {
  const std::span<const ValueId> tensors = in.subspan(2, modifier_tensor_count(n.op, n.attrs, in.size()));
  return row_lse(g, modified_scores(g, n, in[0], in[1], tensors), sink_of(n, in));
}

ValueId flex_attention_grad(Graph& g, const Node& n, std::span<const ValueId> in) {
  // As attention_grad over m = mod(s): dm = p (dy vT - delta); the chain rule through the
  // modifier multiplies by its derivative, d mod/d s for q and k, d mod/d ti for tensor i.
  // With dropout's mask z: dv = (p z)T dy and dm = p (z (dy vT) - delta).
  ValueId q = in[0], k = in[1], v = in[2], dy = in[3], lse = in[4], delta = in[5];
  const std::span<const ValueId> tensors = in.subspan(6, modifier_tensor_count(n.op, n.attrs, in.size()));
  const ValueId scaled = g.add(Op::mul, {g.add(Op::matmul, {q, k}, transposed(false, true)), g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of)});
  const ValueId p = probabilities(g, causal(g, n, inline_region(g, *n.region, scaled, tensors)), lse);
  if (n.attrs.wrt == 2) return g.add(Op::matmul, {dropped(g, n, in, p), dy}, transposed(true, false));
  const ValueId dp = dropped(g, n, in, g.add(Op::matmul, {dy, v}, transposed(false, true)));
  const ValueId dm = g.add(Op::mul, {p, g.add(Op::sub, {dp, delta})});
  const int wrt = n.attrs.wrt < 3 ? kRegionScore : kRegionFixedInputs + n.attrs.wrt - 3;
  const ValueId d = g.add(Op::mul, {dm, inline_region(g, differentiate_region(*n.region, wrt), scaled, tensors)});
  if (n.attrs.wrt >= 3) return d;
  ValueId scale = g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of);
  if (n.attrs.wrt == 0) return g.add(Op::mul, {g.add(Op::matmul, {d, k}), scale});
  return g.add(Op::mul, {g.add(Op::matmul, {d, q}, transposed(true, false)), scale});
}

ValueId attention_jvp(Graph& g, const Node& n, std::span<const ValueId> in) {
  // (q, k, v, tq, tk, tv [, mask]): output_tangent over the masked scores.
  const ValueId s = masked_scores(g, n, in[0], in[1], n.op == Op::masked_attention_jvp ? in[6] : -1);
  return output_tangent(g, n, in, s, unmasked(g, s, score_tangent(g, n, in)), in[2], in[5], -1);
}

ValueId flex_attention_jvp(Graph& g, const Node& n, std::span<const ValueId> in) {
  // (q, k, v, tq, tk, tv, t..., [sink], [seed]): the scores' tangent times d mod/d score at the
  // unmodified scores, then output_tangent over the modified, masked ones.
  const std::span<const ValueId> tensors = in.subspan(6, modifier_tensor_count(n.op, n.attrs, in.size()));
  const ValueId scaled =
      g.add(Op::mul, {g.add(Op::matmul, {in[0], in[1]}, transposed(false, true)), g.constant(n.attrs.scale, {}, n.attrs.rsqrt_of)});
  const ValueId s = causal(g, n, inline_region(g, *n.region, scaled, tensors));
  const ValueId derivative = inline_region(g, differentiate_region(*n.region, kRegionScore), scaled, tensors);
  const ValueId ds = unmasked(g, s, g.add(Op::mul, {score_tangent(g, n, in), derivative}));
  return output_tangent(g, n, in, s, ds, in[2], in[5], sink_of(n, in));
}

ValueId log_softmax(Graph& g, const Node& n, std::span<const ValueId> in) {
  // log_softmax(x) = (x - max) - log(sum(exp(x - max))).
  Attrs reduce;
  reduce.axis = n.attrs.axis;
  ValueId s = g.add(Op::sub, {in[0], g.add(Op::reduce_max, {in[0]}, reduce)});
  return g.add(Op::sub, {s, g.add(Op::log, {g.add(Op::reduce_sum, {g.add(Op::exp, {s})}, reduce)})});
}

ValueId reduce_mean(Graph& g, const Node& n, std::span<const ValueId> in) {
  // mean(x) = sum(x) / count: the axis' size as a constant when it is static; for a named
  // dim, sum(ones) over the axis (the ones span only that axis: one axis of memory).
  const Shape xs = g.node(in[0]).shape;  // a copy: adding nodes may move the graph's storage
  Attrs r = n.attrs;
  if (!is_symbol(xs[n.attrs.axis])) {
    const double size = static_cast<double>(xs[n.attrs.axis]);
    ValueId sum = g.add(Op::reduce_sum, {in[0]}, r);
    return g.add(Op::div, {sum, g.constant(size)});
  }
  Shape axis_only;
  for (int i = 0; i < xs.rank; ++i) axis_only.push_back(i == n.attrs.axis ? xs[i] : 1);
  Attrs keep;
  keep.axis = n.attrs.axis;
  ValueId count = g.add(Op::reduce_sum, {g.constant(1.0, axis_only)}, keep);
  ValueId sum = g.add(Op::reduce_sum, {in[0]}, r);
  if (!n.attrs.keepdim) {
    Attrs scalar;  // the count is [1, ..., 1]: as a scalar it broadcasts against any result
    count = g.add(Op::reshape, {count}, scalar);
  }
  return g.add(Op::div, {sum, count});
}

// pages [P, H, pg, D] read through table [B, n]: each table entry picks a page's H pg D elements
// as embedding picks a row ([B, n, H pg D], zeros for entries outside [0, P)), then the heads go
// before the table's axis and the pages' rows join into slots: [B, H, n pg, D].
ValueId page_gather(Graph& g, const Node& n, std::span<const ValueId> in) {
  const Shape pages = g.node(in[0]).shape, table = g.node(in[1]).shape, out = n.shape;  // copies: adding nodes may move the storage
  const Dim page_elements = g.derive_dim(DimOp::product, g.derive_dim(DimOp::product, pages[1], pages[2]), pages[3]);
  const ValueId rows = g.add(Op::reshape, {in[0]}, shape_attrs(Shape{pages[0], page_elements}));
  const ValueId picked = g.add(Op::embedding, {in[1], rows});  // [B, n, H pg D]
  const ValueId split = g.add(Op::reshape, {picked}, shape_attrs(Shape{table[0], table[1], pages[1], pages[2], pages[3]}));
  Attrs heads_first;
  heads_first.perm = Perm{0, 2, 1, 3, 4};
  return g.add(Op::reshape, {g.add(Op::permute, {split}, heads_first)}, shape_attrs(out));
}

// The primitives' column: backends run them, there is nothing to decompose.
ValueId primitive(Graph&, const Node& n, std::span<const ValueId>) { QKV_UNREACHABLE(std::string(op_name(n.op)) + " is not a composite"); }

}  // namespace decompositions

ValueId decompose(Graph& g, const Node& n, std::span<const ValueId> in) {
  switch (n.op) {
#define QKV_DECOMPOSITION_COLUMN(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, ...) \
  case Op::id: return decompositions::decomposition(g, n, in);
    QKV_OPS(QKV_DECOMPOSITION_COLUMN)
#undef QKV_DECOMPOSITION_COLUMN
  }
  QKV_UNREACHABLE("an op outside the registry");
}

}  // namespace qkv::ir

// The cost column of ops.def: each function here is named by the rows of the ops it estimates.
#include "ir/op_cost.hpp"

namespace qkv::ir {

namespace cost {

namespace {

double numel(const Shape& s) { return static_cast<double>(s.numel()); }
double last(const Shape& s, int from_end) { return static_cast<double>(s.back(from_end)); }
/// Causal masking skips about half the scores.
double causal_share(const Node& n) { return n.attrs.causal ? 0.5 : 1.0; }

}  // namespace

// Data movement, generators and sources.
double none(const Node&, std::span<const Shape>, const Shape&) { return 0.0; }

// One operation per result element (elementwise ops, comparisons, selection).
double per_element(const Node&, std::span<const Shape>, const Shape& out) { return numel(out); }

// One per operand element (reductions).
double per_operand_element(const Node&, std::span<const Shape> in, const Shape&) { return numel(in[0]); }

// max, subtract, exp, sum, divide: about five per element.
double softmax(const Node&, std::span<const Shape>, const Shape& out) { return 5.0 * numel(out); }

// 2 per multiply-add: 2 M N K.
double matmul(const Node& n, std::span<const Shape> in, const Shape& out) {
  return 2.0 * numel(out) * (n.attrs.transpose_a ? last(in[0], 1) : last(in[0], 0));
}

// q kT and weights @ v: 2 N M (D + Dv) per batch entry.
double attention(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double d = last(in[0], 0), m = last(in[1], 1), dv = last(in[2], 0);
  return numel(out) / dv * m * 2.0 * (d + dv) * causal_share(n);
}

// q kT: 2 N M D per batch entry.
double attention_lse(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double d = last(in[0], 0), m = last(in[1], 1);
  return numel(out) * m * 2.0 * d * causal_share(n);
}

// Recomputing q kT, then pT dy (dv), or dy vT and ds k or dsT q (dq, dk): per batch entry
// 2 N M (D + Dv) for dv, 2 N M (2 D + Dv) for dq and dk.
double attention_grad(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double nq = last(in[0], 1), d = last(in[0], 0), m = last(in[1], 1), dv = last(in[2], 0);
  const double batches = numel(out) / (last(out, 0) * last(out, 1));
  const double per = n.attrs.wrt == 2 ? d + dv : 2.0 * d + dv;
  return batches * 2.0 * nq * m * per * causal_share(n);
}

// attention's, and the modifier's ops on each of the N M scores.
double flex_attention(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double d = last(in[0], 0), m = last(in[1], 1), dv = last(in[2], 0);
  const double mod = static_cast<double>(n.region->size());
  return numel(out) / dv * m * (2.0 * (d + dv) + mod) * causal_share(n);
}

// attention_lse's, and the modifier's ops on each score.
double flex_attention_lse(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double d = last(in[0], 0), m = last(in[1], 1);
  return numel(out) * m * (2.0 * d + static_cast<double>(n.region->size())) * causal_share(n);
}

// attention_grad's, the modifier and its derivative on each score; a tensor's gradient
// (wrt >= 3) recomputes the scores and dy vT.
double flex_attention_grad(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double nq = last(in[0], 1), d = last(in[0], 0), m = last(in[1], 1), dv = last(in[2], 0);
  const double batches = n.attrs.wrt >= 3 ? numel(out) / (nq * m) : numel(out) / (last(out, 0) * last(out, 1));
  const double per = n.attrs.wrt == 2 ? d + dv : n.attrs.wrt >= 3 ? d + dv : 2.0 * d + dv;
  return batches * nq * m * (2.0 * per + 3.0 * static_cast<double>(n.region->size())) * causal_share(n);
}

// The scores q kT and their tangent (tq kT + q tkT), then the weights times v, the weighted
// tangents times v and the weights times tv: per batch entry 2 N M (3 D + 3 Dv).
double attention_jvp(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double d = last(in[0], 0), m = last(in[1], 1), dv = last(in[2], 0);
  return numel(out) / dv * m * 6.0 * (d + dv) * causal_share(n);
}

// attention_jvp's, the modifier and its derivative on each score.
double flex_attention_jvp(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double d = last(in[0], 0), m = last(in[1], 1), dv = last(in[2], 0);
  return numel(out) / dv * m * (6.0 * (d + dv) + 2.0 * static_cast<double>(n.region->size())) * causal_share(n);
}

}  // namespace cost

double estimated_flops(const Node& n, std::span<const Shape> in, const Shape& out) {
  switch (n.op) {
#define QKV_COST_COLUMN(id, arity, category, attrs, shape_rule, gradient, cost_rule, ...) \
  case Op::id: return cost::cost_rule(n, in, out);
    QKV_OPS(QKV_COST_COLUMN)
#undef QKV_COST_COLUMN
  }
  return 0.0;
}

double estimated_flops(const Graph& g, ValueId v, const std::vector<Shape>& shapes) {
  const Node& n = g.node(v);
  std::vector<Shape> in;
  for (ValueId operand : n.inputs) in.push_back(shapes[static_cast<std::size_t>(operand)]);
  return estimated_flops(n, in, shapes[static_cast<std::size_t>(v)]);
}

}  // namespace qkv::ir

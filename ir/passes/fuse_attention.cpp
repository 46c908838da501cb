// Attention fusion: matmul(softmax(mask*(q kT * c)), v) becomes one attention node.
#include <cmath>

#include "ir/passes/passes.hpp"

namespace qkv::ir {

namespace {

struct Match {
  ValueId q = -1, k = -1, v = -1, mask = -1;
  double scale = 1.0;
  Dim scale_rsqrt_of = 0;  // the scale's dim, when it is 1/sqrt of a named one
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  std::int64_t window = 0;
};

bool is_scalar_constant(const Graph& g, ValueId v, double* value = nullptr, Dim* rsqrt_of = nullptr) {
  const Node& n = g.node(v);
  if (n.op != Op::constant || n.shape.rank != 0 || (!rsqrt_of && n.attrs.rsqrt_of != 0)) return false;
  if (value) *value = n.attrs.value;
  if (rsqrt_of) *rsqrt_of = n.attrs.rsqrt_of;
  return true;
}

/// Whether `out` is the attention pattern, every intermediate used once and not an output.
bool match(const Graph& g, const std::vector<int>& uses, ValueId out, Match& m) {
  auto single = [&](ValueId v) { return uses[static_cast<std::size_t>(v)] == 1; };
  const Node& o = g.node(out);
  if (o.op != Op::matmul || o.attrs.transpose_a || o.attrs.transpose_b) return false;
  ValueId p = o.inputs[0];
  const Node& sm = g.node(p);
  if (sm.op != Op::softmax || sm.attrs.axis != sm.shape.rank - 1 || !single(p)) return false;
  ValueId s = sm.inputs[0];
  bool have_mask = false;
  while (g.node(s).op == Op::where && single(s)) {
    const Node& w = g.node(s);
    double fill = 0;
    if (!is_scalar_constant(g, w.inputs[2], &fill) || !std::isinf(fill) || fill > 0) return false;
    if (!(g.node(w.inputs[1]).shape == w.shape)) return false;  // the mask must not enlarge the scores
    const Node& cond = g.node(w.inputs[0]);
    if (cond.op == Op::causal_mask && !m.causal) {
      m.causal = true;
      m.align = cond.attrs.align;
      m.window = cond.attrs.window;
    } else if (!have_mask) {
      have_mask = true;
      m.mask = w.inputs[0];
    } else {
      return false;
    }
    s = w.inputs[1];
  }
  if (g.node(s).op == Op::mul && single(s)) {
    const Node& mul = g.node(s);
    if (is_scalar_constant(g, mul.inputs[1], &m.scale, &m.scale_rsqrt_of)) s = mul.inputs[0];
    else if (is_scalar_constant(g, mul.inputs[0], &m.scale, &m.scale_rsqrt_of)) s = mul.inputs[1];
    else return false;
  }
  const Node& mm = g.node(s);
  if (mm.op != Op::matmul || mm.attrs.transpose_a || !mm.attrs.transpose_b || !single(s)) return false;
  m.q = mm.inputs[0];
  m.k = mm.inputs[1];
  m.v = o.inputs[1];
  return true;
}

}  // namespace

Graph fuse_attention(const Graph& g) {
  // Uses by causal_mask do not count: it reads only its operand's shape.
  std::vector<int> uses(g.size(), 0);
  for (const Node& n : g.nodes())
    if (n.op != Op::causal_mask)
      for (ValueId v : n.inputs) ++uses[static_cast<std::size_t>(v)];
  for (ValueId v : g.result_values()) uses[static_cast<std::size_t>(v)] += 2;  // a result is never fused away
  std::vector<ValueId> map(g.size(), -1);
  Graph r;
  r.copy_symbols(g);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    Match m;
    if (n.op == Op::matmul && match(g, uses, static_cast<ValueId>(i), m)) {
      Attrs a;
      a.value = m.scale;
      a.rsqrt_of = m.scale_rsqrt_of;
      a.causal = m.causal;
      a.align = m.align;
      a.window = m.window;
      auto at = [&](ValueId v) { return map[static_cast<std::size_t>(v)]; };
      map[i] = m.mask < 0 ? r.add(Op::attention, {at(m.q), at(m.k), at(m.v)}, a)
                          : r.add(Op::masked_attention, {at(m.q), at(m.k), at(m.v), at(m.mask)}, a);
      continue;
    }
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    map[i] = r.add_like(n, std::move(ins));
  }
  r.copy_results(g, map);
  return r;
}

}  // namespace qkv::ir

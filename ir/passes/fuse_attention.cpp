// Attention fusion: matmul(softmax(mod(q kT * c)) [* dropout_mask], v) becomes one attention node
// (sink_softmax for the softmax: flex attention with sinks),
// mod any chain of elementwise ops over the scores (a score modifier), in whatever order the DSL
// emitted them.
#include <algorithm>
#include <cmath>
#include <map>

#include "ir/op_rules.hpp"
#include "ir/passes/passes.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

namespace {

bool is_scalar_constant(const Graph& g, ValueId v, double* value = nullptr, Dim* rsqrt_of = nullptr) {
  const Node& n = g.node(v);
  if (n.op != Op::constant || n.shape.rank != 0 || (!rsqrt_of && n.attrs.rsqrt_of != 0)) return false;
  if (value) *value = n.attrs.value;
  if (rsqrt_of) *rsqrt_of = n.attrs.rsqrt_of;
  return true;
}

bool is_neg_inf(const Graph& g, ValueId v) {
  double fill = 0;
  return is_scalar_constant(g, v, &fill) && std::isinf(fill) && fill < 0;
}

bool is_elementwise_or_compare(Op op) {
  const OpCategory c = op_info(op).category;
  return c == OpCategory::unary || c == OpCategory::binary || c == OpCategory::select || c == OpCategory::compare;
}

/// Whether a value of shape `s` spans the scores' last two dims (N x M per entry) and
/// broadcasts to the scores: computed elementwise, such a value joins the modifier and is
/// recomputed per tile instead of kept (a position bias, a mask from document ids).
bool spans_scores(const Shape& s, const Shape& scores) {
  if (s.rank < 2 || s.rank > scores.rank || s.back(0) != scores.back(0) || s.back(1) != scores.back(1)) return false;
  for (int i = 2; i < s.rank; ++i)
    if (s.back(i) != scores.back(i) && s.back(i) != 1) return false;
  return true;
}

/// A fused attention: its operands, attributes and (for flex attention) score modifier.
struct Match {
  ValueId q = -1, k = -1, v = -1;
  Attrs attrs;
  ValueId mask = -1;                    // masked_attention's keep-mask
  ValueId seed = -1;                    // dropout's seed (attrs.dropout its probability)
  ValueId sink = -1;                    // sink_softmax's sink logits (attrs.sink)
  std::vector<ValueId> tensors;         // flex attention's modifier tensors
  std::shared_ptr<const Graph> region;  // null: plain or masked attention
};

/// Whether `out` = matmul(softmax(x), v) with x an elementwise function of one q kT matmul (the
/// scores), every score-dependent value in between used only inside it and not a result.
class Matcher {
 public:
  Matcher(const Graph& g, const std::vector<int>& uses) : g_(g), uses_(uses) {}

  bool match(ValueId out, Match& m) {
    const Node& o = g_.node(out);
    if (o.op != Op::matmul || o.attrs.transpose_a || o.attrs.transpose_b) return false;
    ValueId p = o.inputs[0];
    // Dropout on the weights, p * dropout_mask(p, seed) in either order: the mask's bits are
    // keyed by the weights' element index, which the kernel recomputes when v adds no batch dims.
    // The DSL's dropout with p = 0 (evaluation) is p * 1.
    if (const Node& d = g_.node(p); d.op == Op::mul && single(p)) {
      for (int side = 0; side < 2; ++side) {
        const ValueId w = d.inputs[static_cast<std::size_t>(side)], dm = d.inputs[static_cast<std::size_t>(1 - side)];
        double one = 0;
        if (is_scalar_constant(g_, dm, &one) && one == 1.0 && (g_.node(w).op == Op::softmax || g_.node(w).op == Op::sink_softmax)) {
          p = w;
          break;
        }
        const Node& mask = g_.node(dm);
        if (mask.op != Op::dropout_mask || mask.inputs[0] != w || !single(dm) || uses_[static_cast<std::size_t>(w)] != 2) continue;
        if (!rules::same_batch(g_.node(w).shape, o.shape)) return false;
        if (mask.attrs.dropout != 0.0) {  // p = 0 multiplies by ones: no dropout
          m.attrs.dropout = mask.attrs.dropout;
          m.seed = mask.inputs[1];
        }
        p = w;
        dropout_ = true;
        break;
      }
    }
    // The softmax over the keys, or sink_softmax with sink logits that do not read the scores.
    const Node& sm = g_.node(p);
    const bool over_keys = (sm.op == Op::softmax && sm.attrs.axis == sm.shape.rank - 1) || sm.op == Op::sink_softmax;
    if (!over_keys || uses_[static_cast<std::size_t>(p)] != (dropout_ ? 2 : 1)) return false;
    scores_shape_ = sm.shape;
    ValueId x = sm.inputs[0];
    // The outermost where(c, x, -inf) fills, in either order: one with a causal_mask condition is
    // attention's own causality (it skips key blocks), one with a boolean mask that does not read
    // the scores is masked_attention's mask, unless the mask is computed elementwise over N x M
    // (from document ids, say): that one stays in the modifier, which recomputes it per tile.
    ValueId mask = -1;
    while (g_.node(x).op == Op::where && single(x)) {
      const Node& w = g_.node(x);
      const Node& c = g_.node(w.inputs[0]);
      if (!is_neg_inf(g_, w.inputs[2]) || !(g_.node(w.inputs[1]).shape == scores_shape_)) break;
      if (c.op == Op::causal_mask && !m.attrs.causal) {
        m.attrs.causal = true;
        m.attrs.align = c.attrs.align;
        m.attrs.window = c.attrs.window;
      } else if (c.op != Op::causal_mask && mask < 0 && !depends(w.inputs[0]) &&
                 !(is_elementwise_or_compare(c.op) && spans_scores(c.shape, scores_shape_))) {
        mask = w.inputs[0];
      } else {
        break;
      }
      x = w.inputs[1];
    }
    if (!find_scores(x)) return false;
    if (sm.op == Op::sink_softmax) {
      if (depends(sm.inputs[1])) return false;
      m.sink = sm.inputs[1];
      m.attrs.sink = true;
    }
    const Node& mm = g_.node(qk_);
    m.q = mm.inputs[0];
    m.k = mm.inputs[1];
    m.v = o.inputs[1];
    m.attrs.scale = scale_;
    m.attrs.rsqrt_of = scale_rsqrt_of_;
    if (x == score_ && m.seed < 0 && m.sink < 0) {  // plain or masked attention
      m.mask = mask;
      return true;
    }
    return build_region(x, mask, m);
  }

 private:
  bool single(ValueId v) const { return uses_[static_cast<std::size_t>(v)] == 1; }

  /// Whether `v` depends on the q kT matmul (memoised over the cone searched).
  bool depends(ValueId v) {
    if (v == qk_) return true;
    if (auto it = depends_.find(v); it != depends_.end()) return it->second;
    const Node& n = g_.node(v);
    bool d = false;
    if (n.op != Op::causal_mask && n.op != Op::iota)  // these read only their operand's shape
      for (ValueId in : n.inputs) d = d || depends(in);
    return depends_[v] = d;
  }

  /// Finds the one q kT matmul of the scores' shape that x reaches through elementwise ops, and
  /// the scale it is multiplied by (score_ is then that product).
  bool find_scores(ValueId x) {
    std::vector<ValueId> found;
    std::map<ValueId, bool> seen;
    auto visit = [&](auto& self, ValueId v) -> void {
      if (seen[v]) return;
      seen[v] = true;
      const Node& n = g_.node(v);
      if (n.op == Op::matmul && !n.attrs.transpose_a && n.attrs.transpose_b && n.shape == scores_shape_) {
        found.push_back(v);
        return;
      }
      if (is_elementwise_or_compare(n.op))
        for (ValueId in : n.inputs) self(self, in);
    };
    visit(visit, x);
    if (found.size() != 1) return false;
    qk_ = score_ = found[0];
    if (!single(qk_)) return false;
    // q kT * c: the scale becomes the node's attribute when the product is used only once.
    for (std::size_t i = static_cast<std::size_t>(qk_) + 1; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      if (n.op != Op::mul || !single(static_cast<ValueId>(i))) continue;
      if (n.inputs[0] == qk_ && is_scalar_constant(g_, n.inputs[1], &scale_, &scale_rsqrt_of_)) score_ = static_cast<ValueId>(i);
      else if (n.inputs[1] == qk_ && is_scalar_constant(g_, n.inputs[0], &scale_, &scale_rsqrt_of_)) score_ = static_cast<ValueId>(i);
      if (score_ != qk_) break;
    }
    return true;
  }

  /// The modifier: every score-dependent value between score_ and x, as a region over score_,
  /// the query and key indices (iota over the scores' last two axes), scalar constants and the
  /// other tensors they read (which must broadcast to the scores and not enlarge them).
  bool build_region(ValueId x, ValueId mask, Match& m) {
    if (x == score_) {  // no modifier but dropout or a sink: the identity, and the mask if any
      Graph r = make_region(mask >= 0 ? std::vector<DType>{DType::boolean} : std::vector<DType>{});
      ValueId mod = kRegionScore;
      if (mask >= 0) {
        m.tensors.push_back(mask);
        mod = r.add(Op::where, {kRegionFixedInputs, mod, r.constant(-HUGE_VAL)});
      }
      r.set_output("mod", mod);
      m.region = std::make_shared<const Graph>(std::move(r));
      return true;
    }
    // The body: the score-dependent values from score_ to x, each used only by others of them
    // (x by the softmax) and none a result, and the score-sized elementwise values they read
    // that do not depend on the scores (a bias computed from positions: recomputed per tile
    // rather than kept as an N x M tensor).
    std::vector<ValueId> body;
    std::map<ValueId, bool> in_body;
    auto collect = [&](auto& self, ValueId v) -> bool {
      if (v == score_ || in_body.contains(v)) return true;
      const Node& n = g_.node(v);
      if (!is_elementwise_or_compare(n.op)) return false;
      if (depends(v) ? !(n.shape == scores_shape_) : !spans_scores(n.shape, scores_shape_)) return false;
      for (ValueId in : n.inputs) {
        const Node& l = g_.node(in);
        const bool pulled = is_elementwise_or_compare(l.op) && spans_scores(l.shape, scores_shape_);
        if ((depends(in) || pulled) && !self(self, in)) return false;
      }
      in_body[v] = true;
      body.push_back(v);
      return true;
    };
    if (!single(x) || !collect(collect, x)) return false;
    std::sort(body.begin(), body.end());
    std::map<ValueId, int> inner_uses;
    for (ValueId v : body)
      for (ValueId in : g_.node(v).inputs) ++inner_uses[in];
    for (ValueId v : body)
      if (v != x && depends(v) && inner_uses[v] != uses_[static_cast<std::size_t>(v)]) return false;
    if (inner_uses[score_] != uses_[static_cast<std::size_t>(score_)]) return false;

    // The leaves the body reads: scalar constants (inlined), iotas along the scores' last two
    // axes (the query and key indices), and tensors broadcasting to the scores.
    std::vector<DType> dtypes;
    std::map<ValueId, int> leaf_input;  // leaf -> region input
    for (ValueId v : body)
      for (ValueId in : g_.node(v).inputs) {
        if (in == score_ || in_body.contains(in) || leaf_input.contains(in) || is_scalar_constant(g_, in)) continue;
        const Node& l = g_.node(in);
        const int from_right = l.shape.rank - 1 - l.attrs.axis;
        if (l.op == Op::iota && from_right <= 1 && l.shape[l.attrs.axis] == scores_shape_.back(from_right)) {
          leaf_input[in] = from_right == 1 ? kRegionQIdx : kRegionKvIdx;
          continue;
        }
        if (depends(in)) return false;
        leaf_input[in] = kRegionFixedInputs + static_cast<int>(m.tensors.size());
        m.tensors.push_back(in);
        dtypes.push_back(l.dtype);
      }
    if (mask >= 0) {  // peeled above, it masks the modified scores
      m.tensors.push_back(mask);
      dtypes.push_back(DType::boolean);
    }
    Graph r = make_region(dtypes);
    std::map<ValueId, ValueId> map = {{score_, kRegionScore}};
    for (const auto& [leaf, input] : leaf_input) map[leaf] = input;
    for (ValueId v : body) {
      const Node& n = g_.node(v);
      std::vector<ValueId> ins;
      for (ValueId in : n.inputs) {
        if (!map.contains(in)) map[in] = r.constant(g_.node(in).attrs.value);  // a scalar constant
        ins.push_back(map[in]);
      }
      map[v] = r.add(n.op, std::move(ins), n.attrs);
    }
    if (r.node(map[x]).dtype != DType::f32) return false;
    ValueId mod = map[x];
    if (mask >= 0) mod = r.add(Op::where, {static_cast<ValueId>(kRegionFixedInputs + m.tensors.size() - 1), mod, r.constant(-HUGE_VAL)});
    r.set_output("mod", mod);
    m.region = std::make_shared<const Graph>(std::move(r));
    return true;
  }

  const Graph& g_;
  const std::vector<int>& uses_;
  Shape scores_shape_;
  bool dropout_ = false;  // the weights pass through a dropout mask
  ValueId qk_ = -1, score_ = -1;
  double scale_ = 1.0;
  Dim scale_rsqrt_of_ = 0;
  std::map<ValueId, bool> depends_;
};

/// Whether the backend keeps `fused` (its shape and dtype filled in from its operands in `r`):
/// what it does not run fused stays as it was, rather than being fused and decomposed again.
bool kept(const Graph& r, Node& fused, const std::function<bool(const Node&)>& keep) {
  if (!keep) return true;
  std::vector<Operand> operands;
  for (ValueId v : fused.inputs) operands.push_back({r.node(v).shape, r.node(v).dtype});
  const ShapeResult s = infer_shape(fused.op, operands, fused.attrs);
  if (!s.ok()) return true;  // let add report it
  fused.shape = s.shape;
  fused.dtype = s.dtype;
  return keep(fused);
}

}  // namespace

Graph fuse_attention(const Graph& g, const std::function<bool(const Node&)>& keep) {
  // Uses by causal_mask and iota do not count: they read only their operand's shape.
  std::vector<int> uses(g.size(), 0);
  for (const Node& n : g.nodes())
    if (n.op != Op::causal_mask && n.op != Op::iota)
      for (ValueId v : n.inputs) ++uses[static_cast<std::size_t>(v)];
  for (ValueId v : g.result_values()) uses[static_cast<std::size_t>(v)] += 2;  // a result is never fused away
  // Filled by rebuild in node order: a match reads its operands, all earlier nodes, from it.
  std::vector<ValueId> map;
  auto at = [&](ValueId v) { return map[static_cast<std::size_t>(v)]; };
  return rebuild(
      g,
      [&](Graph& r, ValueId id, const Node& n, std::span<const ValueId>) -> ValueId {
        Match m;
        if (n.op != Op::matmul || !Matcher(g, uses).match(id, m)) return -1;
        Node fused;
        fused.attrs = m.attrs;
        if (m.region) {
          fused.op = Op::flex_attention;
          fused.inputs = {at(m.q), at(m.k), at(m.v)};
          for (ValueId t : m.tensors) fused.inputs.push_back(at(t));
          if (m.sink >= 0) fused.inputs.push_back(at(m.sink));
          if (m.seed >= 0) fused.inputs.push_back(at(m.seed));
          fused.region = m.region;
        } else {
          fused.op = m.mask < 0 ? Op::attention : Op::masked_attention;
          fused.inputs = {at(m.q), at(m.k), at(m.v)};
          if (m.mask >= 0) fused.inputs.push_back(at(m.mask));
        }
        if (!kept(r, fused, keep)) return -1;
        return r.add(fused.op, std::move(fused.inputs), fused.attrs, fused.region);
      },
      &map);
}

}  // namespace qkv::ir

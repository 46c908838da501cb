// Reverse-mode autodiff: the forward graph plus, in reverse order, each node's gradient rule.
#include <functional>
#include <set>

#include "ir/error.hpp"
#include "ir/gradients.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::ir {

namespace {

void check_spec(const Graph& g, const GradientSpec& spec) {
  if (spec.wrt.empty()) throw ShapeError("autodiff: no inputs to differentiate with respect to");
  for (const auto& name : spec.wrt) {
    bool found = false;
    for (ValueId v : g.inputs()) {
      const Node& n = g.node(v);
      if (n.name != name) continue;
      found = true;
      if (!is_float(n.dtype) || n.dtype == DType::f64)
        throw ShapeError("autodiff: cannot differentiate with respect to '" + name + "' (" + g.type_string(v) + "): not a float input");
    }
    if (!found) throw ShapeError("autodiff: the graph has no input '" + name + "'");
  }
  if (!spec.loss.empty()) {
    ValueId loss = g.output(spec.loss);
    const Shape& s = g.node(loss).shape;
    const DType dt = g.node(loss).dtype;
    if (!is_float(dt) || dt == DType::f64 || !s.is_static() || s.numel() != 1)
      throw ShapeError("autodiff: loss '" + spec.loss + "' must be a float scalar, is " + g.type_string(loss));
  } else if (spec.seeds.empty()) {
    throw ShapeError("autodiff: give a scalar loss output or outputs to seed with gradients");
  }
  for (const auto& name : spec.seeds) g.output(name);
}

}  // namespace

Graph build_backward(const Graph& forward, const GradientSpec& spec, const std::function<GradientInfo(Op)>& rules) {
  check_spec(forward, spec);
  // Attention is fused first, so that its own rule (a fused backward) applies rather than the
  // rules of the softmax it would otherwise keep; composites without a rule of their own are
  // differentiated through their decompositions.
  const Graph f = decompose_composites(fuse_attention(forward), [&](const Node& n) { return rules(n.op).kind != GradKind::decompose; });

  std::vector<ValueId> map;  // forward value -> its copy in the backward graph
  Graph out = rebuild(f, {}, &map);

  // Only nodes that depend on a wrt input and feed a seeded output need gradients.
  std::vector<bool> depends(f.size(), false), feeds(f.size(), false);
  std::set<std::string> wrt(spec.wrt.begin(), spec.wrt.end());
  for (std::size_t i = 0; i < f.size(); ++i) {
    const Node& n = f.nodes()[i];
    depends[i] = n.op == Op::input && wrt.contains(n.name);
    for (ValueId v : n.inputs) depends[i] = depends[i] || depends[static_cast<std::size_t>(v)];
  }
  std::vector<ValueId> grads(f.size(), -1);
  auto accumulate = [&](ValueId v, ValueId g) {
    auto& slot = grads[static_cast<std::size_t>(v)];
    slot = slot < 0 ? g : out.add(Op::add, {slot, g});
  };
  if (!spec.loss.empty()) {
    ValueId loss = f.output(spec.loss);
    feeds[static_cast<std::size_t>(loss)] = true;
    accumulate(loss, out.cast(out.constant(1.0, f.node(loss).shape), f.node(loss).dtype));
  }
  for (const auto& name : spec.seeds) {
    ValueId o = f.output(name);
    feeds[static_cast<std::size_t>(o)] = true;
    accumulate(o, out.add_input("d" + name, f.node(o).dtype, f.node(o).shape));
  }
  for (std::size_t i = f.size(); i-- > 0;)
    if (feeds[i])
      for (ValueId v : f.nodes()[i].inputs) feeds[static_cast<std::size_t>(v)] = true;

  for (std::size_t i = f.size(); i-- > 0;) {
    const Node& n = f.nodes()[i];
    if (grads[i] < 0 || !depends[i] || !feeds[i] || n.inputs.empty()) continue;
    bool any = false;
    for (ValueId v : n.inputs) any = any || depends[static_cast<std::size_t>(v)];
    if (!any) continue;
    GradientInfo info = rules(n.op);
    switch (info.kind) {
      case GradKind::zero: continue;
      // Not with qkv's rules (GradientCoverage keeps every op covered), but build_backward takes
      // the caller's rule table, which may lack an op or mark a primitive for decomposition.
      case GradKind::missing:
        throw UnsupportedError("autodiff: op '" + std::string(op_name(n.op)) + "' (%" + std::to_string(i) +
                               ") has no gradient rule, and a gradient must flow through it");
      case GradKind::decompose:
        throw UnsupportedError("autodiff: op '" + std::string(op_name(n.op)) + "' is marked for decomposition but is not a composite");
      case GradKind::rule: break;
    }
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    std::vector<ValueId> in_grads = emit_gradient(out, n, map[i], grads[i], ins);
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (in_grads[k] >= 0 && depends[static_cast<std::size_t>(n.inputs[k])]) accumulate(n.inputs[k], in_grads[k]);
  }
  for (const auto& name : spec.wrt) {
    for (ValueId v : f.inputs()) {
      if (f.node(v).name != name) continue;
      ValueId g = grads[static_cast<std::size_t>(v)];
      out.set_output("d_" + name, g >= 0 ? g : out.cast(out.constant(0.0, f.node(v).shape), f.node(v).dtype));
    }
  }
  return eliminate_dead_code(eliminate_common_subexpressions(out));
}

}  // namespace qkv::ir

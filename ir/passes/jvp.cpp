// Forward-mode autodiff (Jacobian-vector products), node by node in topological order: each
// value's tangent from its operands' tangents. Fused attention has a rule of its own: its tangent
// is an op (attention_jvp and its masked and flex forms) that backends compute in the forward's
// streaming pass, in O(N D) memory. Every other op's JVP is derived exactly from reverse mode: a
// VJP u -> J^T u is linear in u, so its own VJP with respect to u, seeded with a tangent t, is J t
// (the "transpose of the transpose"). It is thus the op's gradient rule differentiated once more,
// through the rules and decompositions autodiff already has and the sweeps check; the cotangent u
// is a zero (any value gives the same J t), so what only fed u's own products is folded away by
// dead-code elimination.
#include <algorithm>
#include <set>

#include "ir/error.hpp"
#include "ir/gradients.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::ir {

namespace {

bool has_tangent(const Node& n) { return is_float(n.dtype) && n.dtype != DType::f64; }

/// Node n's tangent, derived from reverse mode: n alone in a graph of its own (operands as inputs
/// "x<k>", output "y"), its VJP's VJP seeded with the tangents, inlined into `out` over the
/// operands `in` and their tangents `tin` (-1 where an operand has none).
ValueId derived_tangent(Graph& out, const Node& n, std::span<const ValueId> in, std::span<const ValueId> tin) {
  Graph one;
  one.copy_symbols(out);
  std::vector<ValueId> xs;
  std::vector<std::string> wrt, grads;
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::string name = "x" + std::to_string(k);
    xs.push_back(one.add_input(name, out.node(in[k]).dtype, out.node(in[k]).shape));
    if (tin[k] < 0) continue;
    wrt.push_back(name);
    grads.push_back("d_" + name);
  }
  one.set_output("y", one.add_like(n, xs));
  // u -> J^T u: input "dy", outputs "d_x<k>"; then its VJP seeded with "dd_x<k>" = t_k, whose
  // output "d_dy" is J t.
  const Graph vjp = build_backward(one, {"", wrt, {"y"}});
  const Graph twice = eliminate_dead_code(select_outputs(build_backward(vjp, {"", {"dy"}, grads}), {"d_dy"}));
  out.copy_symbols(twice);
  std::vector<ValueId> map(twice.size(), -1);
  for (std::size_t i = 0; i < twice.size(); ++i) {
    const Node& m = twice.nodes()[i];
    if (m.op == Op::input) {
      if (m.name == "dy") {
        map[i] = out.cast(out.constant(0.0, m.shape), m.dtype);
        continue;
      }
      const bool seed = m.name.starts_with("dd_x");
      const auto k = static_cast<std::size_t>(std::stoi(m.name.substr(seed ? 4 : 1)));
      map[i] = seed ? tin[k] : in[k];
      continue;
    }
    std::vector<ValueId> ins;
    for (ValueId v : m.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    map[i] = out.add_like(m, std::move(ins));
  }
  return map[static_cast<std::size_t>(twice.output("d_dy"))];
}

/// Whether fused attention node n's tangent has a rule of its own: only q, k and v carry
/// tangents (`carries`: whether operand k does), not a mask, a modifier's tensor or a sink.
bool fused_tangent(const Node& n, const std::vector<bool>& carries) {
  const AttentionRoles& roles = attention_roles(n.op);
  if (!roles.forward()) return false;
  bool any = false;
  for (std::size_t k = 0; k < carries.size(); ++k) {
    const bool streamed = k == static_cast<std::size_t>(roles.q) || k == static_cast<std::size_t>(roles.k) || k == static_cast<std::size_t>(roles.v);
    if (carries[k] && !streamed) return false;
    any = any || carries[k];
  }
  return any;
}

/// The operands of fused attention n's tangent op: q, k, v, their tangents `tin` (zeros where -1),
/// then n's other operands (the mask, or the modifier's tensors, sink and seed).
std::vector<ValueId> tangent_operands(Graph& out, const Node& n, std::span<const ValueId> in, std::span<const ValueId> tin) {
  const AttentionRoles& roles = attention_roles(n.op);
  std::vector<ValueId> ops = {in[0], in[1], in[2]};
  for (int r : {roles.q, roles.k, roles.v}) {
    const auto k = static_cast<std::size_t>(r);
    ops.push_back(tin[k] >= 0 ? tin[k] : out.cast(out.constant(0.0, out.node(in[k]).shape), out.node(in[k]).dtype));
  }
  ops.insert(ops.end(), in.begin() + 3, in.end());
  return ops;
}

}  // namespace

Graph build_jvp(const Graph& g, const JvpSpec& spec) {
  if (spec.wrt.empty()) throw ShapeError("jvp: no inputs to give tangents");
  std::set<std::string> names;
  for (ValueId v : g.inputs()) names.insert(g.node(v).name);
  for (const auto& [name, v] : g.outputs()) names.insert(name);
  std::vector<ValueId> wrt;
  for (const auto& x : spec.wrt) {
    ValueId found = -1;
    for (ValueId v : g.inputs())
      if (g.node(v).name == x) found = v;
    if (found < 0) throw ShapeError("jvp: the graph has no input '" + x + "'");
    if (!has_tangent(g.node(found))) throw ShapeError("jvp: input '" + x + "' (" + g.type_string(found) + ") is not a float value to give a tangent");
    if (names.contains("t_" + x)) throw ShapeError("jvp: the graph already has a value named 't_" + x + "' (the tangent of '" + x + "')");
    wrt.push_back(found);
  }
  std::vector<std::string> outs = spec.outputs;
  if (outs.empty())
    for (const auto& [name, v] : g.outputs())
      if (has_tangent(g.node(v))) outs.push_back(name);
  if (outs.empty()) throw ShapeError("jvp: the graph has no float output to give a tangent");
  for (const auto& o : outs) {
    bool is_output = false;
    for (const auto& [name, v] : g.outputs()) is_output = is_output || name == o;
    if (!is_output) throw ShapeError("jvp: the graph has no output '" + o + "'");
    const ValueId v = g.output(o);
    if (!has_tangent(g.node(v))) throw ShapeError("jvp: output '" + o + "' (" + g.type_string(v) + ") is not a float value to give a tangent");
    if (names.contains("t_" + o)) throw ShapeError("jvp: the graph already has a value named 't_" + o + "' (the tangent of '" + o + "')");
  }

  // Attention fused first, so that its own rule applies rather than those of the softmax it
  // would otherwise keep (as build_backward does). Each node is copied, then its tangent follows
  // it, so a fused attention's tangent op comes right after it (backends compute the two in one
  // pass); g's inputs come first, then the tangents'.
  const Graph f = fuse_attention(g);
  // Only values an output with a tangent reads get one (what feeds only other outputs, or
  // updates, is not differentiated), and not through an op with no gradient (iota reads only
  // its operand's shape: a grid taken from q needs no tangent).
  std::vector<bool> needed(f.size(), false);
  for (const auto& o : outs) needed[static_cast<std::size_t>(f.output(o))] = true;
  for (std::size_t i = f.size(); i-- > 0;)
    if (needed[i] && gradient_info(f.nodes()[i].op).kind != GradKind::zero)
      for (ValueId v : f.nodes()[i].inputs) needed[static_cast<std::size_t>(v)] = true;
  Graph out;
  out.copy_symbols(f);
  std::vector<ValueId> map(f.size(), -1), tangent(f.size(), -1);
  for (ValueId v : f.inputs()) map[static_cast<std::size_t>(v)] = out.add_like(f.node(v), {});
  for (std::size_t i = 0; i < wrt.size(); ++i) {
    const Node& x = g.node(wrt[i]);
    for (ValueId v : f.inputs())
      if (f.node(v).name == spec.wrt[i]) tangent[static_cast<std::size_t>(v)] = out.add_input("t_" + spec.wrt[i], x.dtype, x.shape);
  }
  for (std::size_t i = 0; i < f.size(); ++i) {
    const Node& n = f.nodes()[i];
    if (n.op == Op::input) continue;
    std::vector<ValueId> in, tin;
    std::vector<bool> carries;
    for (ValueId v : n.inputs) {
      in.push_back(map[static_cast<std::size_t>(v)]);
      tin.push_back(tangent[static_cast<std::size_t>(v)]);
      carries.push_back(tin.back() >= 0);
    }
    // An op through which no gradient flows (a source, a step function, iota and causal_mask,
    // which read only their operand's shape) has a zero tangent: none is made.
    const bool any = needed[i] && gradient_info(n.op).kind != GradKind::zero && std::find(carries.begin(), carries.end(), true) != carries.end();
    if (any && has_tangent(n) && fused_tangent(n, carries)) {
      std::vector<ValueId> ops = tangent_operands(out, n, in, tin);  // zeros for a missing tangent before the node
      map[i] = out.add_like(n, in);
      tangent[i] = out.add(tangent_op(n.op), std::move(ops), n.attrs, n.region);
      continue;
    }
    map[i] = out.add_like(n, in);
    if (any && has_tangent(n)) tangent[i] = derived_tangent(out, n, in, tin);
  }
  out.copy_results(f, map);
  for (const auto& o : outs) {
    const auto v = static_cast<std::size_t>(f.output(o));
    const ValueId t = tangent[v];
    out.set_output("t_" + o, t >= 0 ? t : out.cast(out.constant(0.0, f.node(static_cast<ValueId>(v)).shape), f.node(static_cast<ValueId>(v)).dtype));
  }
  return eliminate_dead_code(eliminate_common_subexpressions(out));
}

}  // namespace qkv::ir

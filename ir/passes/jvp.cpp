// Forward-mode autodiff (Jacobian-vector products), derived exactly from reverse mode: a VJP
// u -> J^T u is linear in u, so its own VJP with respect to u, seeded with a tangent t, is J t
// (the "transpose of the transpose"). Every op's JVP is thus its gradient rule differentiated once
// more, through the rules and decompositions autodiff already has and the sweeps check; the
// cotangent u is a zero (any value gives the same J t), so what only fed u's own products is
// folded away by dead-code elimination.
#include <set>

#include "ir/error.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph build_jvp(const Graph& g, const JvpSpec& spec) {
  if (spec.wrt.empty()) throw ShapeError("jvp: no inputs to give tangents");
  std::vector<std::string> outs = spec.outputs;
  if (outs.empty())
    for (const auto& [name, v] : g.outputs())
      if (is_float(g.node(v).dtype) && g.node(v).dtype != DType::f64) outs.push_back(name);
  if (outs.empty()) throw ShapeError("jvp: the graph has no float output to give a tangent");
  std::set<std::string> names;
  for (ValueId v : g.inputs()) names.insert(g.node(v).name);
  for (const auto& [name, v] : g.outputs()) names.insert(name);
  for (const auto& x : spec.wrt)
    if (names.contains("t_" + x)) throw ShapeError("jvp: the graph already has a value named 't_" + x + "' (the tangent of '" + x + "')");
  for (const auto& o : outs) {
    const ValueId v = g.output(o);
    if (!is_float(g.node(v).dtype) || g.node(v).dtype == DType::f64)
      throw ShapeError("jvp: output '" + o + "' (" + g.type_string(v) + ") is not a float value");
    if (names.contains("t_" + o)) throw ShapeError("jvp: the graph already has a value named 't_" + o + "' (the tangent of '" + o + "')");
  }

  // u -> J^T u: inputs "d<out>", outputs "d_<x>"; then its VJP seeded with "dd_<x>" = t_x, whose
  // outputs "d_d<out>" are J t.
  const Graph vjp = build_backward(g, {"", spec.wrt, outs});
  std::vector<std::string> cotangents, grads;
  for (const auto& o : outs) cotangents.push_back("d" + o);
  for (const auto& x : spec.wrt) grads.push_back("d_" + x);
  const Graph twice = build_backward(vjp, {"", cotangents, grads});

  std::set<std::string> zero(cotangents.begin(), cotangents.end()), tangent;
  for (const auto& x : spec.wrt) tangent.insert("dd_" + x);
  std::vector<ValueId> map;
  Graph r = rebuild(
      twice,
      [&](Graph& out, ValueId, const Node& n, std::span<const ValueId>) -> ValueId {
        if (n.op != Op::input) return -1;
        if (zero.contains(n.name)) return out.cast(out.constant(0.0, n.shape), n.dtype);
        if (tangent.contains(n.name)) return out.add_input("t_" + n.name.substr(3), n.dtype, n.shape);
        return -1;
      },
      &map);
  r.clear_results();
  auto at = [&](std::string_view name) { return map[static_cast<std::size_t>(twice.output(name))]; };
  for (const auto& [name, v] : g.outputs()) r.set_output(name, at(name));
  for (const auto& o : outs) r.set_output("t_" + o, at("d_d" + o));
  for (const auto& [name, v] : twice.updates()) r.set_update(name, map[static_cast<std::size_t>(v)]);
  return eliminate_dead_code(eliminate_common_subexpressions(r));
}

}  // namespace qkv::ir

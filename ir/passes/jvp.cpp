// Forward-mode autodiff (Jacobian-vector products), derived exactly from reverse mode: a VJP
// u -> J^T u is linear in u, so its own VJP with respect to u, seeded with a tangent t, is J t
// (the "transpose of the transpose"). Every op's JVP is thus its gradient rule differentiated once
// more, through the rules and decompositions autodiff already has and the sweeps check; the
// cotangent u is a zero (any value gives the same J t), so what only fed u's own products is
// folded away by dead-code elimination.
#include <algorithm>
#include <set>

#include "ir/error.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::ir {

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
    if (!is_float(g.node(found).dtype) || g.node(found).dtype == DType::f64)
      throw ShapeError("jvp: input '" + x + "' (" + g.type_string(found) + ") is not a float value to give a tangent");
    if (names.contains("t_" + x)) throw ShapeError("jvp: the graph already has a value named 't_" + x + "' (the tangent of '" + x + "')");
    wrt.push_back(found);
  }
  std::vector<std::string> outs = spec.outputs;
  if (outs.empty())
    for (const auto& [name, v] : g.outputs())
      if (is_float(g.node(v).dtype) && g.node(v).dtype != DType::f64) outs.push_back(name);
  if (outs.empty()) throw ShapeError("jvp: the graph has no float output to give a tangent");
  for (const auto& o : outs) {
    bool is_output = false;
    for (const auto& [name, v] : g.outputs()) is_output = is_output || name == o;
    if (!is_output) throw ShapeError("jvp: the graph has no output '" + o + "'");
    const ValueId v = g.output(o);
    if (!is_float(g.node(v).dtype) || g.node(v).dtype == DType::f64)
      throw ShapeError("jvp: output '" + o + "' (" + g.type_string(v) + ") is not a float value to give a tangent");
    if (names.contains("t_" + o)) throw ShapeError("jvp: the graph already has a value named 't_" + o + "' (the tangent of '" + o + "')");
  }

  // The inputs and outputs differentiated take internal names no name of g contains, so that the
  // seeds and gradients autodiff names after them ("d" + output, "d_" + input, and the second
  // pass's "dd_" + input and "d_d" + output) meet none of g's own (a backward graph's seeds
  // among them: forward over reverse).
  std::string prefix = "jvp#";
  auto contained = [&] {
    for (const auto& n : names)
      if (n.find(prefix) != std::string::npos) return true;
    return false;
  };
  while (contained()) prefix += '#';
  auto input_name = [&](std::size_t i) { return prefix + "in" + std::to_string(i); };
  auto output_name = [&](std::size_t i) { return prefix + "out" + std::to_string(i); };
  std::vector<ValueId> map;
  Graph renamed = rebuild(
      g,
      [&](Graph& out, ValueId v, const Node& n, std::span<const ValueId>) -> ValueId {
        for (std::size_t i = 0; i < wrt.size(); ++i)
          if (wrt[i] == v) return out.add_input(input_name(i), n.dtype, n.shape);
        return -1;
      },
      &map);
  renamed.clear_results();
  std::vector<std::string> inner_wrt, inner_outs, cotangents, grads;
  for (std::size_t i = 0; i < wrt.size(); ++i) {
    inner_wrt.push_back(input_name(i));
    grads.push_back("d_" + input_name(i));
  }
  for (const auto& [name, v] : g.outputs()) {
    const auto at = std::find(outs.begin(), outs.end(), name);
    renamed.set_output(at == outs.end() ? name : output_name(static_cast<std::size_t>(at - outs.begin())), map[static_cast<std::size_t>(v)]);
  }
  // An update of an input differentiated names it by its internal name until the end.
  auto inner = [&](const std::string& input) {
    for (std::size_t i = 0; i < wrt.size(); ++i)
      if (spec.wrt[i] == input) return input_name(i);
    return input;
  };
  auto outer = [&](const std::string& input) {
    for (std::size_t i = 0; i < wrt.size(); ++i)
      if (input_name(i) == input) return spec.wrt[i];
    return input;
  };
  for (const auto& [name, v] : g.updates()) renamed.set_update(inner(name), map[static_cast<std::size_t>(v)]);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    inner_outs.push_back(output_name(i));
    cotangents.push_back("d" + output_name(i));
  }

  // u -> J^T u: inputs "d<out>", outputs "d_<x>"; then its VJP seeded with "dd_<x>" = t_x, whose
  // outputs "d_d<out>" are J t.
  const Graph vjp = build_backward(renamed, {"", inner_wrt, inner_outs});
  const Graph twice = build_backward(vjp, {"", cotangents, grads});

  const std::set<std::string> zero(cotangents.begin(), cotangents.end());
  Graph r = rebuild(
      twice,
      [&](Graph& out, ValueId, const Node& n, std::span<const ValueId>) -> ValueId {
        if (n.op != Op::input) return -1;
        if (zero.contains(n.name)) return out.cast(out.constant(0.0, n.shape), n.dtype);
        for (std::size_t i = 0; i < wrt.size(); ++i) {
          if (n.name == input_name(i)) return out.add_input(spec.wrt[i], n.dtype, n.shape);
          if (n.name == "dd_" + input_name(i)) return out.add_input("t_" + spec.wrt[i], n.dtype, n.shape);
        }
        return -1;
      },
      &map);
  r.clear_results();
  auto at = [&](const std::string& name) { return map[static_cast<std::size_t>(twice.output(name))]; };
  for (const auto& [name, v] : g.outputs()) {
    const auto o = std::find(outs.begin(), outs.end(), name);
    r.set_output(name, at(o == outs.end() ? name : output_name(static_cast<std::size_t>(o - outs.begin()))));
  }
  for (std::size_t i = 0; i < outs.size(); ++i) r.set_output("t_" + outs[i], at("d_d" + output_name(i)));
  for (const auto& [name, v] : twice.updates()) r.set_update(outer(name), map[static_cast<std::size_t>(v)]);
  return eliminate_dead_code(eliminate_common_subexpressions(r));
}

}  // namespace qkv::ir

// Graph invariants, checked against the registry's rules.
#include "ir/verifier.hpp"

#include <set>

#include "ir/error.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

namespace {

std::string check(const Graph& g) {
  std::set<std::string> names;
  auto check_symbols = [&](const Shape& s) {
    for (int i = 0; i < s.rank; ++i)
      if (is_symbol(s[i]) && !g.symbols().contains(s[i])) return false;
    return true;
  };
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string where = "%" + std::to_string(i) + " (" + std::string(op_name(n.op)) + "): ";
    if (!arity_accepts(n.op, n.inputs.size())) return where + "wrong number of inputs";
    if (is_flex_attention(n.op) != (n.region != nullptr))
      return where + (n.region ? "a region on an op that takes none" : "no score modifier region");
    std::vector<Operand> operands;
    for (ValueId v : n.inputs) {
      if (v < 0 || static_cast<std::size_t>(v) >= i) return where + "operand %" + std::to_string(v) + " is not defined before use";
      operands.push_back({g.node(v).shape, g.node(v).dtype});
    }
    if (!check_symbols(n.shape)) return where + "undeclared dim symbol";
    if (n.op == Op::input) {
      if (n.name.empty()) return where + "input without a name";
      if (!names.insert(n.name).second) return where + "input name '" + n.name + "' used twice";
    }
    if (n.region) {
      std::vector<DType> tensors;
      for (std::size_t j = 0; j < modifier_tensor_count(n.op, n.attrs, operands.size()); ++j)
        tensors.push_back(operands[fixed_operands(n.op) + j].dtype);
      if (std::string why = check_region(*n.region, tensors); !why.empty()) return where + why;
    }
    ShapeResult r = infer_shape(n.op, operands, n.attrs);
    if (!r.ok()) return where + shape_error_message(n.op, r, {});
    if (!(r.shape == n.shape) || r.dtype != n.dtype)
      return where + "recorded type " + g.type_string(n.dtype, n.shape) + " but rules infer " + g.type_string(r.dtype, r.shape);
  }
  std::set<std::string> updated;
  for (const auto& [name, v] : g.updates()) {
    if (v < 0 || static_cast<std::size_t>(v) >= g.size()) return "update of '" + name + "' names no value";
    if (!updated.insert(name).second) return "input '" + name + "' updated twice";
    bool ok = false;
    for (ValueId in : g.inputs()) ok = ok || (g.node(in).name == name && g.node(in).dtype == g.node(v).dtype && g.node(in).shape == g.node(v).shape);
    if (!ok) return "update of '" + name + "' does not match an input of the same type";
  }
  std::set<std::string> outs;
  for (const auto& [name, v] : g.outputs()) {
    if (v < 0 || static_cast<std::size_t>(v) >= g.size()) return "output '" + name + "' names no value";
    if (!outs.insert(name).second) return "output '" + name + "' named twice";
  }
  return {};
}

}  // namespace

void verify(const Graph& g) {
  std::string problem = check(g);
  if (!problem.empty()) throw IrError("invalid IR: " + problem + "\n" + print(g));
}

}  // namespace qkv::ir

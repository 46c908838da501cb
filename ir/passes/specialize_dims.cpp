// Fixing some named dims of a graph to sizes: what a model does with the sizes it is built for.
#include <algorithm>
#include <cmath>

#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/verifier.hpp"

namespace qkv::ir {

Graph specialize_dims(const Graph& g, const std::map<std::string, std::int64_t>& sizes) {
  Graph out;
  std::map<Dim, std::int64_t> fixed;
  for (const auto& entry : sizes) {
    const std::string& name = entry.first;  // not a structured binding: the lambda below captures it
    const std::int64_t size = entry.second;
    auto it = std::find_if(g.symbols().begin(), g.symbols().end(), [&](const auto& s) { return s.second == name; });
    if (it == g.symbols().end() || g.derived_dims().contains(it->first)) throw ShapeError("the graph has no named dim '" + name + "' to fix");
    if (size < 1) throw ShapeError("dim " + name + " must be at least 1, got " + std::to_string(size));
    fixed.emplace(it->first, size);
  }
  for (const auto& [id, name] : g.symbols())
    if (!g.derived_dims().contains(id) && !fixed.contains(id)) out.symbol(name);
  // A dim of `g` as a dim of `out`: fixed names become sizes and derived dims are derived again.
  std::map<Dim, Dim> memo;
  auto dim = [&](auto& self, Dim d) -> Dim {
    if (!is_symbol(d)) return d;
    if (auto f = fixed.find(d); f != fixed.end()) return f->second;
    auto p = g.derived_dims().find(d);
    if (p == g.derived_dims().end()) return d;
    if (auto m = memo.find(d); m != memo.end()) return m->second;
    const Dim a = self(self, p->second.a), b = self(self, p->second.b);
    if (!is_symbol(a) && !is_symbol(b) && !size_of(p->second.op, a, b))
      throw ShapeError(p->second.op == DimOp::quotient
                           ? "dim " + g.dim_name(d) + ": " + std::to_string(a) + " is not divisible by " + std::to_string(b)
                           : "dim " + g.dim_name(d) + " exceeds 63 bits with these sizes");
    return memo[d] = out.derive_dim(p->second.op, a, b);
  };
  auto shape = [&](Shape s) {
    for (int i = 0; i < s.rank; ++i) s[i] = dim(dim, s[i]);
    return s;
  };
  std::vector<ValueId> map(g.size(), -1);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::input) {
      map[i] = out.add_input(n.name, n.dtype, shape(n.shape));
      continue;
    }
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs) inputs.push_back(map[static_cast<std::size_t>(v)]);
    Attrs a = n.attrs;
    a.shape = shape(a.shape);
    if (a.rsqrt_of != 0) a.rsqrt_of = dim(dim, a.rsqrt_of);
    if (a.rsqrt_of != 0 && !is_symbol(a.rsqrt_of)) {                          // the scale of a dim that is now a size, as if built so
      double& scaled = op_info(n.op).attrs & kAttrScale ? a.scale : a.value;  // attention's scale, a constant's value
      scaled = rsqrt_scaled(scaled, a.rsqrt_of);
      a.rsqrt_of = 0;
    }
    map[i] = out.add(n.op, std::move(inputs), a, n.region);
  }
  out.copy_results(g, map);
  verify(out);
  return out;
}

}  // namespace qkv::ir

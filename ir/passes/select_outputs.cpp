// Keeping some outputs: the rest, and whatever only they needed, are dropped.
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph select_outputs(const Graph& g, const std::vector<std::string>& keep) {
  Graph r;
  r.copy_symbols(g);
  std::vector<ValueId> map(g.size(), -1);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    map[i] = r.add_like(n, std::move(ins));
  }
  for (const auto& name : keep) r.set_output(name, map[static_cast<std::size_t>(g.output(name))]);
  for (const auto& [name, v] : g.updates()) r.set_update(name, map[static_cast<std::size_t>(v)]);
  return eliminate_dead_code(r);
}

}  // namespace qkv::ir

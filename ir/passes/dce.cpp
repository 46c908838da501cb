// Dead code elimination.
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph eliminate_dead_code(const Graph& g) {
  std::vector<bool> live(g.size(), false);
  for (ValueId v : g.result_values()) live[static_cast<std::size_t>(v)] = true;
  for (std::size_t i = g.size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::input) live[i] = true;
    if (!live[i]) continue;
    for (ValueId v : n.inputs) live[static_cast<std::size_t>(v)] = true;
  }
  Graph out;
  out.copy_symbols(g);
  std::vector<ValueId> map(g.size(), -1);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!live[i]) continue;
    const Node& n = g.nodes()[i];
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs) inputs.push_back(map[static_cast<std::size_t>(v)]);
    map[i] = out.add_like(n, std::move(inputs));
  }
  out.copy_results(g, map);
  return out;
}

}  // namespace qkv::ir

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
  return rebuild(g, [&](Graph&, ValueId id, const Node&, std::span<const ValueId>) { return live[static_cast<std::size_t>(id)] ? -1 : kDropNode; });
}

}  // namespace qkv::ir

// Node-by-node copy of a graph, the base of the rewriting passes.
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph rebuild(const Graph& g, const std::function<ValueId(Graph&, ValueId, const Node&, std::span<const ValueId>)>& rewrite,
              std::vector<ValueId>* map_out) {
  Graph out;
  out.copy_symbols(g);
  std::vector<ValueId> own;
  std::vector<ValueId>& map = map_out ? *map_out : own;
  map.assign(g.size(), -1);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    std::vector<ValueId> inputs;
    for (ValueId v : n.inputs) inputs.push_back(map[static_cast<std::size_t>(v)]);
    ValueId r = -1;
    if (rewrite) r = rewrite(out, static_cast<ValueId>(i), n, inputs);
    if (r == kDropNode) r = -1;
    else if (r < 0) r = out.add_like(n, std::move(inputs));
    map[i] = r;
  }
  out.copy_results(g, map);
  return out;
}

}  // namespace qkv::ir

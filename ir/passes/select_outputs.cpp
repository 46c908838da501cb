// Keeping some outputs: the rest, and whatever only they needed, are dropped.
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph select_outputs(const Graph& g, const std::vector<std::string>& keep) {
  std::vector<ValueId> map;
  Graph r = rebuild(g, {}, &map);
  r.clear_results();
  for (const auto& name : keep) r.set_output(name, map[static_cast<std::size_t>(g.output(name))]);
  for (const auto& [name, v] : g.updates()) r.set_update(name, map[static_cast<std::size_t>(v)]);
  return eliminate_dead_code(r);
}

}  // namespace qkv::ir

// Decomposition of the composites a backend does not implement directly.
#include "ir/decompositions.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph decompose_composites(const Graph& g, const std::function<bool(const Node&)>& keep) {
  // A decomposition may itself use composites (attention uses softmax): repeat until none is left
  // that the backend does not keep.
  Graph r = g;
  while (true) {
    bool pending = false;
    for (const Node& n : r.nodes()) pending |= is_composite(n.op) && !keep(n);
    if (!pending) return r;
    r = rebuild(r, [&](Graph& out, ValueId, const Node& n, std::span<const ValueId> inputs) -> ValueId {
      if (!is_composite(n.op) || keep(n)) return -1;
      return decompose(out, n, inputs);
    });
  }
}

}  // namespace qkv::ir

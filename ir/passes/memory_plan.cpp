// First-fit memory planning over value lifetimes.
#include "ir/passes/memory_plan.hpp"

#include <algorithm>

namespace qkv::ir {

MemoryPlan plan_memory(const Graph& g, const std::vector<std::int64_t>& bytes, const std::function<bool(const Node&)>& in_place,
                       std::int64_t alignment, const std::vector<std::vector<ValueId>>* reads, const std::vector<std::int64_t>* views,
                       const std::vector<Placement>* placed) {
  const std::size_t n = g.size();
  MemoryPlan plan;
  plan.offset.assign(n, -1);
  plan.storage_of.resize(n);
  plan.view_offset.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) plan.storage_of[i] = static_cast<ValueId>(i);
  // Values written into a later value's storage (never a view's): that value's storage, at its
  // offset there plus theirs; later values first, so chains (a concat into a concat) resolve.
  if (placed)
    for (std::size_t i = n; i-- > 0;)
      if (const Placement& p = (*placed)[i]; p.into >= 0) {
        plan.storage_of[i] = plan.storage_of[static_cast<std::size_t>(p.into)];
        plan.view_offset[i] = plan.view_offset[static_cast<std::size_t>(p.into)] + p.at;
      }
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    const std::int64_t at = views ? (*views)[i] : node.op == Op::reshape ? 0 : -1;
    if (at < 0 || plan.storage_of[i] != static_cast<ValueId>(i)) continue;
    const auto operand = static_cast<std::size_t>(node.inputs[0]);
    plan.storage_of[i] = plan.storage_of[operand];
    plan.view_offset[i] = plan.view_offset[operand] + at;
  }
  // Last reader of each storage root; outputs are read at the end.
  std::vector<std::size_t> last_use(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    last_use[static_cast<std::size_t>(plan.storage_of[i])] = std::max(last_use[static_cast<std::size_t>(plan.storage_of[i])], i);
    for (ValueId v : reads ? (*reads)[i] : g.nodes()[i].inputs) {
      auto root = static_cast<std::size_t>(plan.storage_of[static_cast<std::size_t>(v)]);
      last_use[root] = std::max(last_use[root], i);
    }
  }
  // Results live to the end; so do inputs, which may be held between runs as state.
  for (ValueId v : g.result_values()) last_use[static_cast<std::size_t>(plan.storage_of[static_cast<std::size_t>(v)])] = n;
  for (ValueId v : g.inputs()) last_use[static_cast<std::size_t>(v)] = n;

  struct Block {
    std::int64_t offset, size;
    std::size_t until;
  };
  std::vector<Block> live;
  auto round_up = [&](std::int64_t x) { return (x + alignment - 1) / alignment * alignment; };
  // Inputs are placed first: their storage is written before the graph runs, so it must not
  // share bytes with any value computed before the input's position in the node order.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i)
    if (g.nodes()[i].op == Op::input) order.push_back(i);
  for (std::size_t i = 0; i < n; ++i)
    if (g.nodes()[i].op != Op::input) order.push_back(i);
  // Each storage is placed when the first value in it is: its own, or one written into it.
  std::vector<bool> placed_yet(n, false);
  for (std::size_t i : order) {
    if (g.nodes()[i].op != Op::input) std::erase_if(live, [&](const Block& b) { return b.until < i; });
    const Node& node = g.nodes()[i];
    const bool into_later = placed && (*placed)[i].into >= 0;
    if ((plan.storage_of[i] != static_cast<ValueId>(i) && !into_later) || in_place(node)) continue;
    const auto root = static_cast<std::size_t>(plan.storage_of[i]);
    if (placed_yet[root]) continue;
    placed_yet[root] = true;
    std::int64_t size = round_up(std::max<std::int64_t>(bytes[root], 1));
    std::sort(live.begin(), live.end(), [](const Block& a, const Block& b) { return a.offset < b.offset; });
    std::int64_t at = 0;
    for (const Block& b : live) {
      if (at + size <= b.offset) break;
      at = std::max(at, round_up(b.offset + b.size));
    }
    plan.offset[root] = at;
    live.push_back({at, size, last_use[root]});
    plan.total_bytes = std::max(plan.total_bytes, at + size);
  }
  return plan;
}

}  // namespace qkv::ir

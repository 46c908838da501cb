// The random-graph differential test: graphs composed from the registry (chained ops,
// broadcasts, masks, named dims), forward and backward on every backend against the float64
// reference. A fixed-seed few hundred here; `qkv fuzz --graphs N` runs thousands on demand.
#include <gtest/gtest.h>

#include <set>

#include "ir/printer.hpp"
#include "sweeps/random_graph.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

constexpr int kShards = 12, kGraphsPerShard = 20;

class RandomGraphs : public ::testing::TestWithParam<int> {};

TEST_P(RandomGraphs, MatchTheReferenceForwardAndBackward) {
  std::vector<std::string> backends{"reference", "cpu"};
  std::string why;
  const bool vulkan = testing::backend_or_reason("vulkan", why) != nullptr;
  if (!vulkan && testing::vulkan_required()) FAIL() << "vulkan: " << why;
  for (int i = 0; i < kGraphsPerShard; ++i) {
    const std::uint64_t seed = static_cast<std::uint64_t>(GetParam() * kGraphsPerShard + i);
    const auto rg = backend::random_graph(seed);
    // Vulkan on every other graph: on lavapipe each graph's kernels take seconds to compile
    // (a shard of 20 took about a minute, the cpu's a third of a second), which made these
    // shards a fifth of CI. `qkv fuzz --graphs N --grad` runs any number on every backend.
    std::vector<std::string> on = backends;
    if (vulkan && i % 2 == 0) on.push_back("vulkan");
    const auto result = backend::check_random_graph(rg, on, true);
    EXPECT_TRUE(result.pass) << "seed " << seed << ": " << result.failure << "\n"
                             << ir::print(result.failing_graph) << "reproduce: qkv fuzz --seed " << seed << " --graphs 1 --grad";
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomGraphs, ::testing::Range(0, kShards));

TEST(RandomGraph, CoversTheRegistryNamedDimsAndGradients) {
  std::set<ir::Op> seen;
  int named = 0, two_outputs = 0, chained = 0;
  for (std::uint64_t seed = 0; seed < kShards * kGraphsPerShard; ++seed) {
    const auto rg = backend::random_graph(seed);
    for (const auto& n : rg.graph.nodes()) seen.insert(n.op);
    named += !rg.graph.symbols().empty();
    two_outputs += rg.graph.outputs().size() > 1;
    for (const auto& n : rg.graph.nodes())
      for (ir::ValueId v : n.inputs) chained += rg.graph.node(v).op != ir::Op::input && rg.graph.node(v).op != ir::Op::constant;
  }
  for (ir::Op op : ir::all_ops()) {
    if (op == ir::Op::constant) continue;
    EXPECT_TRUE(seen.contains(op)) << ir::op_name(op) << " never drawn";
  }
  EXPECT_GT(named, 20);
  EXPECT_GT(two_outputs, 20);
  EXPECT_GT(chained, 130);  // ops whose operands are i32 (one_hot, embedding, cache_write's start, the page ops' slots and tables) chain less
}

TEST(RandomGraph, IsDeterministicInItsSeed) {
  EXPECT_EQ(ir::print(backend::random_graph(7).graph), ir::print(backend::random_graph(7).graph));
  EXPECT_NE(ir::print(backend::random_graph(7).graph), ir::print(backend::random_graph(8).graph));
}

TEST(RandomGraph, ShrinkingKeepsTheFirstFailingNodesCone) {
  // A long f32 sum leaves a budget of a few ulps (factor 0): the shrunk graph is the cone of the
  // sum, the first node that fails, without what follows it. (Over the outer axis: the cpu sums
  // each column in float, one term after another; contiguous rows it sums in double.)
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", DType::f32, {20000, 8});
  g.add_input("unused", DType::f32, {3});
  const ir::ValueId a = g.add(ir::Op::neg, {x});
  ir::Attrs last;
  last.axis = 0;
  const ir::ValueId s = g.add(ir::Op::reduce_sum, {a}, last);
  g.set_output("out", g.add(ir::Op::mul, {s, s}));
  std::mt19937_64 rng(3);
  const backend::TensorMap inputs{{"x", backend::filled_tensor(ir::Fill::normal, {20000, 8}, rng)}, {"unused", Tensor(DType::f32, {3})}};
  ASSERT_FALSE(backend::check_equivalence(g, inputs, {"cpu"}, 0.0).pass());
  const ir::Graph small = backend::shrink_failure(g, inputs, "cpu", 0.0);
  EXPECT_EQ(small.node(small.outputs().at(0).second).op, ir::Op::reduce_sum) << ir::print(small);
  EXPECT_EQ(small.size(), 3u) << ir::print(small);  // x, neg, reduce_sum: nothing else, no unused input
}

}  // namespace
}  // namespace qkv

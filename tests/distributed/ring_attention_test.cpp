// Ring attention equals attention over the whole sequence in one process, forward and backward,
// causal and not, in both layouts; run alone and under mpirun -np 2 and -np 4. Every rank builds
// the whole q, k, v from one seed, keeps its shard, and compares its rows with the one-process
// result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/equivalence.hpp"
#include "distributed/ring_attention.hpp"
#include "dsl/dsl.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/region.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using distributed::Communicator;
using distributed::SequenceLayout;

struct Case {
  bool causal;
  SequenceLayout layout;
  bool modifier = false;  // ALiBi-style bias and a sliding window, both by position
};

/// score + 0.1 (kv_idx - q_idx), and -inf where the key is more than 5 positions before the
/// query: wrong wherever a block's positions are not the sequence's.
std::shared_ptr<const ir::Graph> position_modifier() {
  auto r = std::make_shared<ir::Graph>(ir::make_region({}));
  const ir::ValueId back = r->add(ir::Op::sub, {ir::kRegionQIdx, ir::kRegionKvIdx});
  const ir::ValueId biased = r->add(ir::Op::sub, {ir::kRegionScore, r->add(ir::Op::mul, {back, r->constant(0.1)})});
  const ir::ValueId far = r->add(ir::Op::greater, {back, r->constant(5.0)});
  r->set_output("mod", r->add(ir::Op::where, {far, r->constant(-HUGE_VAL), biased}));
  return r;
}

class RingAttention : public ::testing::TestWithParam<Case> {};

TEST_P(RingAttention, EqualsAttentionOverTheWholeSequence) {
  const Case c = GetParam();
  Communicator& comm = Communicator::world();
  const int P = comm.size();
  const std::int64_t B = 2, H = 2, N = 8 * P, D = 16, Dv = 8;
  const double scale = 0.3;

  // One process, the whole sequence, float64: attention and its gradients.
  ir::Graph g;
  const ir::ValueId qi = g.add_input("q", DType::f32, {B, H, N, D});
  const ir::ValueId ki = g.add_input("k", DType::f32, {B, H, N, D});
  const ir::ValueId vi = g.add_input("v", DType::f32, {B, H, N, Dv});
  ir::Attrs a;
  a.scale = scale;
  a.causal = c.causal;
  const auto mod = c.modifier ? position_modifier() : nullptr;
  g.set_output("y", mod ? g.add(ir::Op::flex_attention, {qi, ki, vi}, a, mod) : g.add(ir::Op::attention, {qi, ki, vi}, a));
  const ir::Graph backward = ir::build_backward(g, {"", {"q", "k", "v"}, {"y"}});
  const backend::TensorMap inputs = backend::random_inputs(backward, {}, 7);
  const Tensor &q = inputs.at("q"), &k = inputs.at("k"), &v = inputs.at("v"), &dy = inputs.at("dy");
  auto oracle = backend::create("reference")->compile(backward)->run(inputs);

  auto cpu = backend::create("cpu");
  distributed::RingAttention ring(comm, *cpu, {.scale = scale, .causal = c.causal, .layout = c.layout, .score_mod = mod});
  auto mine = [&](const Tensor& t) { return distributed::shard_sequence(t, comm.rank(), P, c.layout); };
  const Tensor y = ring.forward(mine(q), mine(k), mine(v));
  EXPECT_LE(testing::normwise_error(y, mine(oracle.at("y"))), 1e-5) << comm.describe();
  const int forward_blocks = ring.stats().blocks, forward_transfers = ring.stats().transfers;
  const distributed::RingAttention::Gradients grads = ring.backward(mine(dy));
  EXPECT_LE(testing::normwise_error(grads.dq, mine(oracle.at("d_q"))), 1e-5) << comm.describe();
  EXPECT_LE(testing::normwise_error(grads.dk, mine(oracle.at("d_k"))), 1e-5) << comm.describe();
  EXPECT_LE(testing::normwise_error(grads.dv, mine(oracle.at("d_v"))), 1e-5) << comm.describe();
  EXPECT_EQ(ring.stats().blocks, forward_blocks);
  // Messages: P - 1 blocks forward; backward P - 1 blocks, P - 1 accumulators and the last one home.
  EXPECT_EQ(forward_transfers, P > 1 ? P - 1 : 0);
  EXPECT_EQ(ring.stats().transfers, P > 1 ? 2 * (P - 1) + 1 : 0);
  EXPECT_LE(ring.stats().hidden_transfers, ring.stats().transfers - (P > 1));  // the last one has no compute to hide behind

  // Work per rank: without a mask every block; causal, the blocks at or below the diagonal, the
  // same on every rank under zigzag (2P + 1 of 4P chunk pairs), skewed when contiguous.
  const int per = c.layout == SequenceLayout::zigzag ? 2 : 1;
  const std::vector<std::string> all = comm.allgather(std::to_string(forward_blocks));
  if (!c.causal) {
    EXPECT_EQ(forward_blocks, P * per * per);
    EXPECT_EQ(ring.stats().skipped, 0);
  } else if (c.layout == SequenceLayout::zigzag) {
    EXPECT_EQ(forward_blocks, 2 * P + 1);
    for (const auto& b : all) EXPECT_EQ(b, all.front()) << "zigzag balances the causal work";
  } else {
    EXPECT_EQ(forward_blocks, comm.rank() + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingAttention,
                         ::testing::Values(Case{false, SequenceLayout::contiguous}, Case{false, SequenceLayout::zigzag},
                                           Case{true, SequenceLayout::contiguous}, Case{true, SequenceLayout::zigzag},
                                           Case{false, SequenceLayout::zigzag, true}, Case{true, SequenceLayout::zigzag, true}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.causal ? "Causal" : "Full") +
                                  (param_info.param.layout == SequenceLayout::zigzag ? "Zigzag" : "Contiguous") +
                                  (param_info.param.modifier ? "WithPositionModifier" : "");
                         });

TEST(RingAttentionShards, NameTheRowsEachRankHolds) {
  EXPECT_EQ(distributed::shard_rows(8, 1, 2, SequenceLayout::contiguous), (std::vector<std::int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(distributed::shard_rows(8, 0, 2, SequenceLayout::zigzag), (std::vector<std::int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(distributed::shard_rows(8, 1, 2, SequenceLayout::zigzag), (std::vector<std::int64_t>{2, 3, 4, 5}));
  try {
    distributed::shard_rows(6, 0, 2, SequenceLayout::zigzag);
    ADD_FAILURE() << "6 rows in 4 chunks";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("a sequence of 6 rows does not divide into 4 equal chunks"), std::string::npos) << e.what();
  }
}

// Sinks, one per row and sharded with the rows, folded in after the ring as the kernels fold them
// after the keys: -inf, large, NaN and +inf sinks (the last two make their rows NaN) give one
// process's float64 rows, NaN where it has NaN.
TEST(RingAttentionSinks, FoldIntoEachRowAfterTheRing) {
  using namespace dsl;
  Communicator& comm = Communicator::world();
  const int P = comm.size();
  const std::int64_t N = 8 * P;
  auto q = input<"q">(dim<2>, dim<2>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<2>, dim<2>, dim<"N">, dim<16>);
  auto v = input<"v">(dim<2>, dim<2>, dim<"N">, dim<8>);
  auto s = input<"sinks">(dim<2>, dim<2>, dim<"N">, dim<1>);
  const ir::Graph g = lower(named<"y">(scaled_dot_product_attention(q, k, v, causal, sinks(s))));
  backend::TensorMap inputs = backend::random_inputs(g, {{"N", N}}, 11);
  float* sv = inputs.at("sinks").data<float>();
  const float inf = std::numeric_limits<float>::infinity();
  sv[0] = -inf, sv[1] = inf, sv[2] = std::numeric_limits<float>::quiet_NaN(), sv[3] = 4.0f, sv[N + 5] = -inf;
  const Tensor want = backend::create("reference")->compile(g)->run(inputs).at("y");
  auto cpu = backend::create("cpu");
  distributed::RingAttention ring(comm, *cpu, {.scale = 0.25, .causal = true, .layout = SequenceLayout::zigzag, .score_mod = nullptr});
  auto mine = [&](const Tensor& t) { return distributed::shard_sequence(t, comm.rank(), P, SequenceLayout::zigzag); };
  const Tensor sinks = mine(inputs.at("sinks"));
  const Tensor y = ring.forward(mine(inputs.at("q")), mine(inputs.at("k")), mine(inputs.at("v")), &sinks);
  const Tensor expected = mine(want);
  double err = 0, scale = 0;
  int nan_values = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_EQ(std::isnan(y.at(i)), std::isnan(expected.at(i))) << "element " << i << " on " << comm.describe();
    if (std::isnan(y.at(i))) {
      ++nan_values;
      continue;
    }
    err = std::max(err, std::fabs(y.at(i) - expected.at(i)));
    scale = std::max(scale, std::fabs(expected.at(i)));
  }
  EXPECT_LE(err, 1e-5 * std::max(scale, 1.0)) << comm.describe();
  const std::vector<std::string> nans = comm.allgather(std::to_string(nan_values));
  int all = 0;
  for (const auto& c : nans) all += std::stoi(c);
  EXPECT_EQ(all, 2 * 8);  // rows 1 and 2 of the first head, 8 values each
}

}  // namespace
}  // namespace qkv

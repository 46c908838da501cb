// Models written in the DSL, run sequence-parallel (each rank holding its rows of the sequence,
// attention as ring attention), equal the same model in one process; graphs that mix positions
// other than by attention are refused by name. Run alone and under mpirun -np 2 and -np 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/equivalence.hpp"
#include "distributed/sequence_parallel.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "models/models.hpp"

namespace qkv {
namespace {

using distributed::Communicator;

/// The model run sequence-parallel on the cpu, within the equivalence budget against one process's
/// float64 (as every backend is held), with `rings` ring attentions.
void expect_as_one_process(const ir::Graph& g, const std::map<std::string, std::int64_t>& dims, distributed::SequenceLayout layout, int rings) {
  Communicator& comm = Communicator::world();
  auto cpu = backend::create("cpu");
  EXPECT_EQ(distributed::SequenceParallel(comm, *cpu, g, {"N", "M"}, layout).ring_attentions(), rings);
  // Inputs at half scale: unit-normal weights make a block's activations and gradients large
  // enough that any change of summation order (the ring's, by chunks) meets the budget's edge.
  backend::TensorMap inputs = backend::random_inputs(g, dims, 1);
  for (auto& [name, t] : inputs)
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 0.5f;
  const backend::EquivalenceReport report =
      backend::check_equivalence(g, inputs, {"cpu"}, backend::kDefaultBudgetFactor, [&](const std::string& name) {
        return distributed::sequence_parallel_backend(comm, backend::create(name), {"N", "M"}, layout);
      });
  EXPECT_TRUE(report.pass()) << comm.describe() << "\n" << report.table();
}

const models::ModelSpec& model(const std::string& name) { return models::find_model(name); }

TEST(SequenceParallel, DecoderBlockEqualsOneProcess) {
  const auto& m = model("decoder-block");
  const ir::Graph g = m.build(models::resolve_options(m, {}), {});
  const std::int64_t n = 8 * Communicator::world().size();
  expect_as_one_process(g, {{"B", 2}, {"N", n}}, distributed::SequenceLayout::zigzag, 1);
  expect_as_one_process(g, {{"B", 1}, {"N", n}}, distributed::SequenceLayout::contiguous, 1);
}

TEST(SequenceParallel, SdpaWithAScoreModifierEqualsOneProcess) {
  const auto& m = model("sdpa");
  const ir::Graph g = m.build(models::resolve_options(m, {{"causal", "true"}, {"weights", "false"}, {"softcap", "2"}}), {});
  const std::int64_t n = 4 * Communicator::world().size();
  expect_as_one_process(g, {{"B", 3}, {"N", n}, {"M", n}, {"D", 8}, {"Dv", 5}}, distributed::SequenceLayout::zigzag, 1);
}

TEST(SequenceParallel, TwoBlocksMakeTwoRingsAndThreeStages) {
  // The decoder block applied twice: stages before, between and after the two attentions.
  const auto& m = model("decoder-block");
  const ir::Graph block = m.build(models::resolve_options(m, {}), {});
  ir::Graph g;
  g.copy_symbols(block);
  // Feed the block's output into a second copy of it (same weights).
  std::vector<ir::ValueId> first(block.size(), -1), second(block.size(), -1);
  for (std::size_t i = 0; i < block.size(); ++i) {
    const ir::Node& n = block.nodes()[i];
    std::vector<ir::ValueId> in;
    for (ir::ValueId v : n.inputs) in.push_back(first[static_cast<std::size_t>(v)]);
    first[i] = g.add_like(n, std::move(in));
  }
  const ir::ValueId x2 = first[static_cast<std::size_t>(block.output("out"))];
  for (std::size_t i = 0; i < block.size(); ++i) {
    const ir::Node& n = block.nodes()[i];
    if (n.op == ir::Op::input) {
      second[i] = n.name == "x" ? x2 : first[i];
      continue;
    }
    std::vector<ir::ValueId> in;
    for (ir::ValueId v : n.inputs) in.push_back(second[static_cast<std::size_t>(v)]);
    second[i] = g.add_like(n, std::move(in));
  }
  g.set_output("out", second[static_cast<std::size_t>(block.output("out"))]);
  const std::int64_t n = 8 * Communicator::world().size();
  Communicator& comm = Communicator::world();
  auto cpu = backend::create("cpu");
  distributed::SequenceParallel sp(comm, *cpu, g, {"N"});
  EXPECT_EQ(sp.ring_attentions(), 2);
  EXPECT_EQ(sp.stages(), 3);
  expect_as_one_process(g, {{"B", 1}, {"N", n}}, distributed::SequenceLayout::zigzag, 2);
}

// A backward graph: ring attention's backward for the attention, and the weights' gradients
// (sums over the sequence) summed over the ranks.
TEST(SequenceParallel, DecoderBlockBackwardEqualsOneProcess) {
  const auto& m = model("decoder-block");
  const ir::Graph forward = m.build(models::resolve_options(m, {}), {});
  std::vector<std::string> wrt;
  for (ir::ValueId v : forward.inputs()) wrt.push_back(forward.node(v).name);
  const ir::Graph backward = ir::build_backward(forward, {"", wrt, {"out"}});
  const std::int64_t n = 8 * Communicator::world().size();
  expect_as_one_process(backward, {{"B", 2}, {"N", n}}, distributed::SequenceLayout::zigzag, 5);  // attention, lse and 3 gradients
}

// Attention sinks (one logit per head, or one per row, sharded with the rows): folded into each
// row after the ring, forward and backward (the sinks' gradient a sum over the rows, summed over
// the ranks), with causality and a score modifier.
TEST(SequenceParallel, AttentionSinksEqualOneProcess) {
  using namespace dsl;
  auto q = input<"q">(dim<"B">, dim<3>, dim<"N">, dim<8>);
  auto k = input<"k">(dim<"B">, dim<3>, dim<"N">, dim<8>);
  auto v = input<"v">(dim<"B">, dim<3>, dim<"N">, dim<5>);
  auto per_head = input<"sinks">(dim<3>);
  auto per_row = input<"row_sinks">(dim<"B">, dim<3>, dim<"N">, dim<1>);
  const std::int64_t n = 4 * Communicator::world().size();
  const ir::Graph heads = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, sinks(per_head), softcap_scores(2.0))));
  const ir::Graph rows = lower(named<"out">(scaled_dot_product_attention(q, k, v, sinks(per_row))));
  for (const ir::Graph& g : {heads, rows}) {
    expect_as_one_process(g, {{"B", 2}, {"N", n}}, distributed::SequenceLayout::zigzag, 1);
    std::vector<std::string> wrt;
    for (ir::ValueId in : g.inputs()) wrt.push_back(g.node(in).name);
    const ir::Graph backward = ir::build_backward(g, {"", wrt, {"out"}});
    expect_as_one_process(backward, {{"B", 2}, {"N", n}}, distributed::SequenceLayout::contiguous, 5);
  }
}

// Sums over the sequence: each rank's part, summed over the ranks.
TEST(SequenceParallel, SumsOverTheSequenceAreSummedOverTheRanks) {
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", DType::f32, {g.symbol("B"), g.symbol("N"), 4});
  ir::Attrs a;
  a.axis = 1;
  const ir::ValueId pooled = g.add(ir::Op::reduce_sum, {x}, a);
  g.set_output("pooled", pooled);
  g.set_output("scaled", g.add(ir::Op::mul, {x, pooled}));  // read after the sum: by every rank's rows
  expect_as_one_process(g, {{"B", 2}, {"N", 4 * Communicator::world().size()}}, distributed::SequenceLayout::zigzag, 0);
}

// A mean over the sequence: each rank's sum and count, summed over the ranks, so the count is the
// whole sequence's; and a loss of that kind, differentiated.
TEST(SequenceParallel, MeansOverTheSequenceCountTheWholeSequence) {
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", DType::f32, {g.symbol("B"), g.symbol("N"), 4});
  ir::Attrs a;
  a.axis = 1;
  const ir::ValueId mean = g.add(ir::Op::reduce_mean, {x}, a);
  g.set_output("mean", mean);
  g.set_output("centered", g.add(ir::Op::sub, {x, mean}));
  const std::int64_t n = 4 * Communicator::world().size();
  expect_as_one_process(g, {{"B", 2}, {"N", n}}, distributed::SequenceLayout::zigzag, 0);

  // The decoder block trained on the mean of its output's squares over batch and sequence.
  const auto& m = model("decoder-block");
  ir::Graph loss = m.build(models::resolve_options(m, {}), {});
  const ir::ValueId out = loss.output("out");
  ir::ValueId l = loss.add(ir::Op::mul, {out, out});
  for (int axis : {2, 1, 0}) {
    ir::Attrs r;
    r.axis = axis;
    r.keepdim = false;
    l = loss.add(ir::Op::reduce_mean, {l}, r);
  }
  loss.set_output("loss", l);
  std::vector<std::string> wrt;
  for (ir::ValueId v : loss.inputs()) wrt.push_back(loss.node(v).name);
  const ir::Graph backward = ir::select_outputs(ir::build_backward(loss, {"loss", wrt, {}}), {"loss", "d_x", "d_linear1.weight"});
  expect_as_one_process(backward, {{"B", 2}, {"N", 8 * Communicator::world().size()}}, distributed::SequenceLayout::zigzag, 5);
}

// Positions made inside the graph (iota over the sequence: rotary embeddings here) are each
// rank's rows' positions in the whole sequence.
TEST(SequenceParallel, RotaryEmbeddingsSeeWholeSequencePositions) {
  const auto& m = model("gqa");
  const ir::Graph g = m.build(models::resolve_options(m, {{"rope", "true"}, {"embed", "32"}, {"heads", "4"}, {"kv_heads", "2"}}), {});
  const std::int64_t n = 4 * Communicator::world().size();
  expect_as_one_process(g, {{"B", 2}, {"N", n}}, distributed::SequenceLayout::zigzag, 1);
  expect_as_one_process(g, {{"B", 1}, {"N", n}}, distributed::SequenceLayout::contiguous, 1);
  // Its backward: k and v have fewer heads than q (grouped-query), so their gradients sum the group's.
  std::vector<std::string> wrt;
  for (ir::ValueId v : g.inputs()) wrt.push_back(g.node(v).name);
  expect_as_one_process(ir::build_backward(g, {"", wrt, {"out"}}), {{"B", 2}, {"N", n}}, distributed::SequenceLayout::zigzag, 5);
}

TEST(SequenceParallel, RefusesWhatMixesPositionsByName) {
  Communicator& comm = Communicator::world();
  auto cpu = backend::create("cpu");
  auto refused = [&](const ir::Graph& g, const std::string& expect) {
    try {
      distributed::SequenceParallel sp(comm, *cpu, g, {"N", "M"});
      ADD_FAILURE() << "accepted; expected: " << expect;
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  // The weights as an output keep the score matrix, so the attention is not fused.
  const auto& sdpa = model("sdpa");
  refused(sdpa.build(models::resolve_options(sdpa, {}), {}), ": f32[B,N,M] holds the sequence on two axes: attention that is not fused");
  // A maximum over the sequence.
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", DType::f32, {g.symbol("B"), g.symbol("N"), 4});
  ir::Attrs a;
  a.axis = 1;
  g.set_output("pooled", g.add(ir::Op::reduce_max, {x}, a));
  refused(g, "sequence parallel: reduce_max %1 : f32[B,1,4] takes a maximum over the sequence (the sequence: N)");
  // A value of the sequence's length: x / sqrt(N).
  ir::Graph len;
  const ir::ValueId y = len.add_input("x", DType::f32, {len.symbol("N"), 4});
  len.set_output("y", len.add(ir::Op::mul, {y, len.constant(1.0, {}, len.symbol("N"))}));
  refused(len, "constant %1 : f32[] is a value of the sequence's length");
  // No sequence dim at all.
  ir::Graph h;
  h.set_output("y", h.add(ir::Op::neg, {h.add_input("x", DType::f32, {4})}));
  EXPECT_THROW(distributed::SequenceParallel(comm, *cpu, h, {"N"}), UsageError);
}

}  // namespace
}  // namespace qkv

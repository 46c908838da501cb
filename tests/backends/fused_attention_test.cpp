// The CPU backend runs attention fused: no score matrix in its memory plan.
#include <gtest/gtest.h>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "dsl/dsl.hpp"

namespace qkv {
namespace {

TEST(FusedAttention, CpuMemoryIsLinearInSequenceLength) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);
  ir::Graph g = lower(scaled_dot_product_attention(q, q, q, causal));
  auto exe = backend::create("cpu")->compile(g);
  bool fused = false;
  for (const auto& n : exe->graph().nodes()) fused |= n.op == ir::Op::attention;
  EXPECT_TRUE(fused) << "the cpu backend did not fuse attention";
  const std::int64_t n = 2048;
  exe->run(backend::random_inputs(g, {{"B", 1}, {"N", n}}, 1));
  // The output (N x 64 floats) is all it plans; the N x N scores would be 16 MiB.
  EXPECT_LE(exe->planned_bytes(), 2 * n * 64 * 4);
  auto unfused = backend::create("reference")->compile(g);
  unfused->run(backend::random_inputs(g, {{"B", 1}, {"N", 64}}, 1));
  EXPECT_GE(unfused->planned_bytes(), 64 * 64 * 8) << "the reference materialises the scores";
}

}  // namespace
}  // namespace qkv

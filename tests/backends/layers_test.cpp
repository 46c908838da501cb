// Attention options and model building blocks: known values, every backend against the float64
// reference, and gradients by finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

class Blocks : public ::testing::TestWithParam<std::string> {};

TEST_P(Blocks, FullyMaskedRowsGiveZerosAndZeroGradients) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<3>, dim<4>);
  auto k = input<"k">(dim<5>, dim<4>);
  auto v = input<"v">(dim<5>, dim<2>);
  auto mask = input<"mask", DType::boolean>(dim<3>, dim<5>);
  auto w = attention_weights(q, k, mask);
  ir::Graph forward = lower(named<"out">(matmul(w, v)), named<"weights">(w));
  auto in = backend::random_inputs(forward, {}, 4);
  for (int j = 0; j < 5; ++j) in.at("mask").data<std::uint8_t>()[5 + j] = 0;  // query 1 sees no key
  in.at("mask").data<std::uint8_t>()[0] = 1;
  in.at("mask").data<std::uint8_t>()[10] = 1;
  auto r = b->compile(forward)->run(in);
  for (int j = 0; j < 5; ++j) EXPECT_EQ(r.at("weights").at(5 + j), 0.0) << j;
  EXPECT_EQ(r.at("out").at(2), 0.0);
  EXPECT_EQ(r.at("out").at(3), 0.0);
  ir::Graph backward = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
  in.emplace("dout", Tensor::from<float>({3, 2}, {1, 2, 3, 4, 5, 6}));
  auto g = b->compile(backward)->run(in);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(g.at("d_q").at(4 + j), 0.0) << "query 1 gets no gradient";
  for (std::int64_t i = 0; i < g.at("d_k").numel(); ++i) EXPECT_TRUE(std::isfinite(g.at("d_k").at(i)));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Blocks, TemperatureDividesTheScores) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<1>, dim<2>);
  auto k = input<"k">(dim<2>, dim<2>);
  // scores [1, 0] with scale 1 and temperature 2 are [0.5, 0]: weights e^0.5 / (e^0.5 + 1).
  auto exe = b->compile(lower(attention_weights(q, k, scale(1.0), temperature(2.0))));
  auto r = exe->run({{"q", Tensor::from<float>({1, 2}, {1, 0})}, {"k", Tensor::from<float>({2, 2}, {1, 0, 0, 1})}});
  EXPECT_NEAR(r.at("out").at(0), std::exp(0.5) / (std::exp(0.5) + 1), 1e-6);
}

TEST_P(Blocks, KnownValues) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<1>, dim<3>);
  auto gamma = input<"gamma">(dim<3>);
  auto beta = input<"beta">(dim<3>);
  auto exe =
      b->compile(lower(named<"ln">(layer_norm(x, gamma, beta)), named<"rms">(rms_norm(x, gamma)), named<"gelu">(gelu(x)),
                       named<"gelu_tanh">(gelu_tanh(x)), named<"silu">(silu(x)), named<"relu">(relu(x - 2.0)), named<"cap">(softcap(x * 10.0, 5.0))));
  auto r = exe->run(
      {{"x", Tensor::from<float>({1, 3}, {1, 2, 3})}, {"gamma", Tensor::from<float>({3}, {1, 1, 2})}, {"beta", Tensor::from<float>({3}, {0, 0, 1})}});
  const double sd = std::sqrt(2.0 / 3.0 + 1e-5);  // mean 2, biased variance 2/3
  EXPECT_NEAR(r.at("ln").at(0), -1 / sd, 1e-5);
  EXPECT_NEAR(r.at("ln").at(2), 2 / sd + 1, 1e-5);
  EXPECT_NEAR(r.at("rms").at(0), 1 / std::sqrt(14.0 / 3 + 1e-6), 1e-6);
  EXPECT_NEAR(r.at("gelu").at(0), 0.8413447460685429, 1e-6);  // torch.nn.functional.gelu(1.0)
  EXPECT_NEAR(r.at("gelu_tanh").at(0), 0.8411919906082768, 1e-6);
  EXPECT_NEAR(r.at("silu").at(1), 2 / (1 + std::exp(-2.0)), 1e-6);
  EXPECT_EQ(r.at("relu").at(0), 0.0);
  EXPECT_EQ(r.at("relu").at(2), 1.0);
  EXPECT_NEAR(r.at("cap").at(2), 5 * std::tanh(6.0), 1e-5);
}

TEST_P(Blocks, MatchTheReference) {
  auto x = input<"x">(dim<"N">, dim<16>);
  auto w = input<"w">(dim<8>, dim<16>);
  auto bias = input<"bias">(dim<8>);
  auto gamma = input<"gamma">(dim<8>);
  auto beta = input<"beta">(dim<8>);
  auto h = linear(x, w, bias);
  ir::Graph g = lower(named<"a">(gelu(layer_norm(h, gamma, beta))), named<"b">(silu(rms_norm(h, gamma))), named<"c">(gelu_tanh(h)),
                      named<"d">(softcap(h, 2.0)));
  testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 5}}, 8), GetParam());
}

INSTANTIATE_TEST_SUITE_P(All, Blocks, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

TEST(BlockGradients, MatchFiniteDifferences) {
  auto x = input<"x">(dim<"N">, dim<6>);
  auto w = input<"w">(dim<4>, dim<6>);
  auto bias = input<"bias">(dim<4>);
  auto gamma = input<"gamma">(dim<4>);
  auto beta = input<"beta">(dim<4>);
  auto h = linear(x, w, bias);
  ir::Graph g = testing::with_weighted_sum_loss(
      lower(named<"a">(gelu(layer_norm(h, gamma, beta))), named<"b">(silu(rms_norm(h, gamma))), named<"c">(gelu_tanh(h) + softcap(h, 1.5))));
  testing::expect_gradients_match_finite_differences(g, backend::random_inputs(g, {{"N", 3}}, 6), {"x", "w", "bias", "gamma", "beta"});
}

}  // namespace
}  // namespace qkv

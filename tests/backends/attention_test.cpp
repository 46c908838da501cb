// Scaled dot-product attention on every backend: shapes, masks, known values.
#include <gtest/gtest.h>

#include <cmath>

#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using backend::TensorMap;

struct Shape4 {
  std::int64_t b, n, m, d;
};

/// Graph for q [B, N, D], k/v [B, M, D] with the options the test asks for; D is named, so the
/// scale is passed explicitly.
template <class... Opts> ir::Graph sdpa_graph(double s, Opts... opts) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<"D">);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<"D">);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<"D">);
  auto w = attention_weights(q, k, scale(s), opts...);
  return lower(named<"out">(matmul(w, v)), named<"weights">(w));
}

class Attention : public ::testing::TestWithParam<std::tuple<std::string, Shape4>> {};

TEST_P(Attention, MatchesReferenceWithAndWithoutMasks) {
  auto [name, s] = GetParam();
  std::map<std::string, std::int64_t> dims{{"B", s.b}, {"N", s.n}, {"M", s.m}, {"D", s.d}};
  double sc = 1.0 / std::sqrt(static_cast<double>(s.d));
  {
    SCOPED_TRACE("plain");
    ir::Graph g = sdpa_graph(sc);
    testing::expect_equivalent(g, backend::random_inputs(g, dims, 1), name);
  }
  {
    SCOPED_TRACE("causal");
    ir::Graph g = sdpa_graph(sc, causal);
    testing::expect_equivalent(g, backend::random_inputs(g, dims, 2), name);
  }
  {
    SCOPED_TRACE("boolean mask");
    auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"M">);
    ir::Graph g = sdpa_graph(sc, mask);
    TensorMap in = backend::random_inputs(g, dims, 3);
    auto& m = in.at("mask");
    for (std::int64_t i = 0; i < s.n; ++i) m.data<std::uint8_t>()[i * s.m] = 1;  // every row keeps a key
    testing::expect_equivalent(g, in, name);
  }
}

std::vector<Shape4> shapes_for(const std::string& backend) {
  std::vector<Shape4> r = {{1, 1, 1, 8}, {2, 7, 7, 8}, {2, 7, 12, 64}, {1, 64, 64, 80}, {3, 12, 5, 8}};
  if (backend != "vulkan") r.push_back({1, 300, 300, 64});  // lavapipe runs shaders on the CPU: big shapes live in bench/
  else r.push_back({1, 300, 40, 8});
  return r;
}

std::vector<std::tuple<std::string, Shape4>> params() {
  std::vector<std::tuple<std::string, Shape4>> r;
  for (const char* b : {"reference", "cpu", "vulkan"})
    for (auto s : shapes_for(b)) r.emplace_back(b, s);
  return r;
}

std::string shape_name(const ::testing::TestParamInfo<std::tuple<std::string, Shape4>>& info) {
  const auto& [b, s] = info.param;
  return b + "_B" + std::to_string(s.b) + "_N" + std::to_string(s.n) + "_M" + std::to_string(s.m) + "_D" + std::to_string(s.d);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention, ::testing::ValuesIn(params()), shape_name);

class AttentionBackends : public ::testing::TestWithParam<std::string> {};

TEST_P(AttentionBackends, HeadsAndBroadcastMask) {
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<4>, dim<"M">, dim<16>);
  auto v = input<"v">(dim<"B">, dim<4>, dim<"M">, dim<16>);
  auto mask = input<"mask", DType::boolean>(dim<"B">, dim<1>, dim<1>, dim<"M">);  // a padding mask
  ir::Graph g = lower(scaled_dot_product_attention(q, k, v, mask, causal_bottom_right));
  TensorMap in = backend::random_inputs(g, {{"B", 2}, {"N", 5}, {"M", 9}}, 7);
  for (std::int64_t b = 0; b < 2; ++b) in.at("mask").data<std::uint8_t>()[b * 9] = 1;
  testing::expect_equivalent(g, in, GetParam());
}

/// Worked by hand: q = [[1, 0]], k = [[1, 0], [0, 1]], v = [[1, 2], [3, 4]], scale 1.
/// scores = [1, 0]; weights = [e/(e+1), 1/(e+1)] = [0.731059, 0.268941];
/// out = 0.731059*[1,2] + 0.268941*[3,4] = [1.537883, 2.537883].
TEST_P(AttentionBackends, KnownValues) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<1>, dim<2>);
  auto k = input<"k">(dim<2>, dim<2>);
  auto v = input<"v">(dim<2>, dim<2>);
  auto w = attention_weights(q, k, scale(1.0));
  auto exe = b->compile(lower(named<"out">(matmul(w, v)), named<"weights">(w)));
  TensorMap r = exe->run({{"q", Tensor::from<float>({1, 2}, {1, 0})},
                          {"k", Tensor::from<float>({2, 2}, {1, 0, 0, 1})},
                          {"v", Tensor::from<float>({2, 2}, {1, 2, 3, 4})}});
  EXPECT_NEAR(r.at("weights").at(0), 0.731059, 1e-4);
  EXPECT_NEAR(r.at("weights").at(1), 0.268941, 1e-4);
  EXPECT_NEAR(r.at("out").at(0), 1.537883, 1e-4);
  EXPECT_NEAR(r.at("out").at(1), 2.537883, 1e-4);
}

/// Causal, 3 tokens, identical keys: row i attends uniformly to keys 0..i, so the weights are
/// [1,0,0], [1/2,1/2,0], [1/3,1/3,1/3] and the outputs running means of v.
TEST_P(AttentionBackends, KnownCausalValues) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<3>, dim<2>);
  auto k = input<"k">(dim<3>, dim<2>);
  auto v = input<"v">(dim<3>, dim<1>);
  auto w = attention_weights(q, k, causal);
  auto exe = b->compile(lower(named<"out">(matmul(w, v)), named<"weights">(w)));
  TensorMap r = exe->run({{"q", Tensor::from<float>({3, 2}, {1, 2, 3, 4, 5, 6})},
                          {"k", Tensor::from<float>({3, 2}, {1, 1, 1, 1, 1, 1})},
                          {"v", Tensor::from<float>({3, 1}, {3, 6, 9})}});
  // q·k differs per row but is equal across keys within a row, so the weights are uniform.
  const double expected_w[9] = {1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3};
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(r.at("weights").at(i), expected_w[i], 1e-4) << i;
  EXPECT_NEAR(r.at("out").at(0), 3.0, 1e-4);
  EXPECT_NEAR(r.at("out").at(1), 4.5, 1e-4);
  EXPECT_NEAR(r.at("out").at(2), 6.0, 1e-4);
}

TEST_P(AttentionBackends, RunsAgainWithOtherShapesAndBadInputsLeaveNoTrace) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  ir::Graph g = sdpa_graph(0.5);
  auto exe = b->compile(g);
  TensorMap small = backend::random_inputs(g, {{"B", 1}, {"N", 3}, {"M", 4}, {"D", 8}}, 1);
  TensorMap big = backend::random_inputs(g, {{"B", 2}, {"N", 9}, {"M", 5}, {"D", 8}}, 2);
  TensorMap first = exe->run(small);
  TensorMap bad = small;
  bad.at("k") = Tensor(DType::f32, {1, 4, 7});
  EXPECT_THROW(exe->run(bad), ShapeError);
  exe->run(big);
  TensorMap again = exe->run(small);
  for (std::int64_t i = 0; i < first.at("out").numel(); ++i) EXPECT_EQ(first.at("out").at(i), again.at("out").at(i));
}

INSTANTIATE_TEST_SUITE_P(All, AttentionBackends, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

class EmptyTensors : public ::testing::TestWithParam<std::string> {};

TEST_P(EmptyTensors, ZeroSizedDimsRunAndGiveEmptyOutputs) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<"N">, dim<3>);
  auto exe = b->compile(lower(exp(x) + 1.0));
  auto r = exe->run({{"x", Tensor(DType::f32, {0, 3})}});
  EXPECT_EQ(r.at("out").shape(), (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(exe->run({{"x", Tensor::from<float>({1, 3}, {0, 0, 0})}}).at("out").at(2), 2.0);
}

INSTANTIATE_TEST_SUITE_P(All, EmptyTensors, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv

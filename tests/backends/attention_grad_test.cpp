// Gradients of attention written in the DSL: finite differences on the float64 reference, and
// the same backward graph on cpu and vulkan against the reference.
#include <gtest/gtest.h>

#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

/// `weight_scale` multiplies inputs whose names start with 'w' (the weight matrices).
void check(const ir::Graph& forward, const std::map<std::string, std::int64_t>& dims, const std::vector<std::string>& wrt,
           float weight_scale = 1.0f) {
  ir::Graph g = testing::with_weighted_sum_loss(forward);
  auto in = backend::random_inputs(g, dims, 5);
  for (auto& [name, t] : in)
    if (name[0] == 'w' && name.rfind("w_", 0) != 0)
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= weight_scale;
  {
    SCOPED_TRACE("finite differences");
    testing::expect_gradients_match_finite_differences(g, in, wrt, 8);
  }
  ir::Graph backward = ir::build_backward(g, {"loss", wrt, {}});
  for (const char* b : {"cpu", "vulkan"}) {
    SCOPED_TRACE(b);
    testing::expect_equivalent(backward, in, b);
  }
}

auto q = input<"q">(dim<"B">, dim<"N">, dim<8>);
auto k = input<"k">(dim<"B">, dim<"M">, dim<8>);
auto v = input<"v">(dim<"B">, dim<"M">, dim<6>);
const std::map<std::string, std::int64_t> kDims{{"B", 2}, {"N", 5}, {"M", 7}};

TEST(AttentionGradients, Plain) { check(lower(scaled_dot_product_attention(q, k, v)), kDims, {"q", "k", "v"}); }

TEST(AttentionGradients, Causal) { check(lower(scaled_dot_product_attention(q, k, v, causal)), kDims, {"q", "k", "v"}); }

TEST(AttentionGradients, AdditiveMaskIsDifferentiated) {
  auto bias = input<"bias">(dim<"N">, dim<"M">);  // an additive mask or bias, broadcast over the batch
  check(lower(scaled_dot_product_attention(q, k, v, bias, causal_bottom_right)), kDims, {"q", "k", "v", "bias"});
}

TEST(AttentionGradients, MultiHeadBlock) {
  // x [B, T, 16] -> 4 heads of 4 -> causal attention -> merge -> output projection.
  auto x = input<"x">(dim<"B">, dim<"T">, dim<16>);
  auto wq = input<"wq">(dim<16>, dim<16>);
  auto wk = input<"wk">(dim<16>, dim<16>);
  auto wv = input<"wv">(dim<16>, dim<16>);
  auto wo = input<"wo">(dim<16>, dim<16>);
  auto heads = [](auto t) { return permute<0, 2, 1, 3>(reshape(t, dim<"B">, dim<"T">, dim<4>, dim<4>)); };
  auto attn = scaled_dot_product_attention(heads(matmul(x, wq)), heads(matmul(x, wk)), heads(matmul(x, wv)), causal);
  auto merged = reshape(permute<0, 2, 1, 3>(attn), dim<"B">, dim<"T">, dim<16>);
  // Weights at Xavier scale (1/sqrt(16)): with unit-variance weights the scores have a standard
  // deviation near 16, the softmax is one-hot to float precision, and its gradient cancels
  // nearly equal numbers, so any float32 computation's error there is a matter of luck.
  check(lower(matmul(merged, wo)), {{"B", 2}, {"T", 5}}, {"x", "wq", "wk", "wv", "wo"}, 0.25f);
}

TEST(LossGradients, MseAndCrossEntropy) {
  auto logits = input<"logits">(dim<"N">, dim<5>);
  auto target = input<"target">(dim<"N">, dim<5>);
  auto classes = input<"classes", DType::i32>(dim<"N">);
  ir::Graph g = lower(named<"loss">(mse(logits, target) + cross_entropy(logits, classes)));
  auto in = backend::random_inputs(g, {{"N", 6}}, 3);
  for (std::int64_t i = 0; i < 6; ++i) in.at("classes").data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 5);
  testing::expect_gradients_match_finite_differences(g, in, {"logits", "target"});
  ir::Graph backward = ir::build_backward(g, {"loss", {"logits", "target"}, {}});
  for (const char* b : {"cpu", "vulkan"}) {
    SCOPED_TRACE(b);
    testing::expect_equivalent(backward, in, b);
  }
}

TEST(LossGradients, CrossEntropyValue) {
  // logits 0 everywhere over 4 classes: the loss is log(4) whatever the targets.
  auto logits = input<"logits">(dim<3>, dim<4>);
  auto classes = input<"classes", DType::i32>(dim<3>);
  auto exe = backend::create("reference")->compile(lower(cross_entropy(logits, classes)));
  auto r = exe->run({{"logits", Tensor(DType::f32, {3, 4})}, {"classes", Tensor::from<std::int32_t>({3}, {0, 3, 1})}});
  EXPECT_NEAR(r.at("out").at(0), std::log(4.0), 1e-6);
}

TEST(DslGrad, GradOfLossWrtWeights) {
  auto x = input<"x">(dim<"N">, dim<8>);
  auto w = input<"w">(dim<8>, dim<4>);
  ir::Graph g = grad(mean_all(matmul(x, w)), wrt(w));
  EXPECT_NO_THROW(g.output("loss"));
  EXPECT_EQ(g.type_string(g.output("d_w")), "f32[8,4]");
  // d/dw mean(x w) = column means of x, divided by 4 (the mean over the 4 outputs too).
  auto r =
      backend::create("cpu")->compile(g)->run({{"x", Tensor::from<float>({2, 8}, std::vector<float>(16, 2.0f))}, {"w", Tensor(DType::f32, {8, 4})}});
  EXPECT_NEAR(r.at("d_w").at(0), 2.0 / 4.0, 1e-6);
}

}  // namespace
}  // namespace qkv

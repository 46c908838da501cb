// Multi-head and grouped-query attention: every backend against the reference, forward and
// backward, and the properties that define them.
#include <gtest/gtest.h>

#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

auto x = input<"x">(dim<"B">, dim<"T">, dim<16>);
auto wq = input<"wq">(dim<16>, dim<16>);
auto wk = input<"wk">(dim<16>, dim<16>);
auto wv = input<"wv">(dim<16>, dim<16>);
auto wo = input<"wo">(dim<16>, dim<16>);
auto bq = input<"bq">(dim<16>);
auto bk = input<"bk">(dim<16>);
auto bv = input<"bv">(dim<16>);
auto bo = input<"bo">(dim<16>);

/// Weights at Xavier scale, so scores are moderate (see attention_grad_test.cpp).
backend::TensorMap inputs(const ir::Graph& g, std::int64_t t, std::uint64_t seed) {
  auto in = backend::random_inputs(g, {{"B", 2}, {"T", t}}, seed);
  for (auto& [name, tensor] : in)
    if (name[0] == 'w')
      for (std::int64_t i = 0; i < tensor.numel(); ++i) tensor.data<float>()[i] *= 0.25f;
  return in;
}

class MultiHead : public ::testing::TestWithParam<std::string> {};

TEST_P(MultiHead, ForwardAndBackwardMatchTheReference) {
  auto kpm = input<"key_padding_mask", DType::boolean>(dim<"B">, dim<"T">);
  auto r = multi_head_attention<4>(x, x, x, wq, wk, wv, bq, bk, bv, wo, bo, causal, key_padding_bias(kpm));
  ir::Graph g = lower(named<"out">(r.output), named<"weights">(mean_over_heads(r.weights)));
  auto in = inputs(g, 6, 3);
  for (std::int64_t i = 0; i < in.at("key_padding_mask").numel(); ++i) in.at("key_padding_mask").data<std::uint8_t>()[i] = i % 6 == 5;
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward = ir::build_backward(g, {"", {"x", "wq", "wk", "wv", "wo", "bq", "bo"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"B", 2}, {"T", 6}}, 9).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(MultiHead, GroupedQueryWithAsManyKvHeadsIsMultiHead) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = linear(x, wq, bq);
  auto k = linear(x, wk, bk);
  auto v = linear(x, wv, bv);
  ir::Graph g = lower(named<"gqa">(grouped_query_attention<4, 4>(q, k, v, causal)),
                      named<"mha">(merge_heads(scaled_dot_product_attention(split_heads<4>(q), split_heads<4>(k), split_heads<4>(v), causal))),
                      named<"mqa">(grouped_query_attention<4, 1>(q, matmul(k, input<"shrink">(dim<16>, dim<4>)),
                                                                 matmul(v, input<"shrink">(dim<16>, dim<4>)), causal)));
  auto r = b->compile(g)->run(inputs(g, 5, 4));
  for (std::int64_t i = 0; i < r.at("gqa").numel(); ++i) EXPECT_NEAR(r.at("gqa").at(i), r.at("mha").at(i), 1e-5) << i;
  EXPECT_EQ(r.at("mqa").shape(), r.at("gqa").shape());
  testing::expect_equivalent(g, inputs(g, 5, 4), GetParam());
}

TEST_P(MultiHead, CausalOutputIgnoresLaterTokensAndPaddedKeys) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto kpm = input<"key_padding_mask", DType::boolean>(dim<"B">, dim<"T">);
  ir::Graph g = lower(multi_head_attention<2>(x, x, x, wq, wk, wv, bq, bk, bv, wo, bo, causal, key_padding_bias(kpm)).output);
  auto exe = b->compile(g);
  auto in = inputs(g, 5, 7);
  auto before = exe->run(in).at("out");
  // Change the last token: positions 0..3 must not change.
  for (std::int64_t e = 0; e < 16; ++e) in.at("x").data<float>()[4 * 16 + e] += 1.0f;
  auto after = exe->run(in).at("out");
  for (std::int64_t i = 0; i < 4 * 16; ++i) EXPECT_NEAR(after.at(i), before.at(i), 1e-6) << i;
  // Mark key 2 of batch 1 as padding: changing that token then only changes its own output row.
  in.at("key_padding_mask").data<std::uint8_t>()[5 + 2] = 1;
  auto masked = exe->run(in).at("out");
  for (std::int64_t e = 0; e < 16; ++e) in.at("x").data<float>()[(5 + 2) * 16 + e] -= 3.0f;
  auto changed = exe->run(in).at("out");
  for (std::int64_t t : {0, 1, 3, 4})
    for (std::int64_t e = 0; e < 16; ++e) EXPECT_NEAR(changed.at((5 + t) * 16 + e), masked.at((5 + t) * 16 + e), 1e-5) << t;
}

// Models at any size: multi-head attention (torch's packed parameters), grouped-query attention
// and rotary embeddings written with a named embedding E and heads H. With the heads fixed, one
// graph runs at every E they divide (the packed blocks, the head dim E/H, the default scale and
// the rotary frequencies resolved when E is bound), forward and backward; at E = 16 it computes
// what the model written for that size computes.
TEST_P(MultiHead, NamedEmbeddingAndHeadsRunAtAnySize) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  constexpr DimArg E = "E", H = "H", Hkv = "Hkv";
  auto xe = input<"x">(dim<"B">, dim<"T">, dim<E>);
  auto mha = self_attention<H>(xe, mha_params<"attn", E>(), causal);
  auto kv = linear(xe, input<"k_proj">(dim<Hkv*(E / H)>, dim<E>));
  auto gqa = grouped_query_attention<H, Hkv>(merge_heads<E.value>(rotary(split_heads<H>(xe))), kv, kv, causal);
  const ir::Graph written = lower(named<"mha">(mha.output), named<"gqa">(gqa));
  const ir::Graph g = ir::specialize_dims(written, {{"H", 4}, {"Hkv", 2}});
  EXPECT_EQ(g.type_string(g.output("mha")), "f32[B,T,E]");
  const ir::Graph backward = ir::build_backward(g, {"", {"x", "attn.in_proj_weight", "k_proj"}, {"mha", "gqa"}});
  for (std::int64_t e : {16, 24}) {
    auto in = backend::random_inputs(backward, {{"B", 2}, {"T", 5}, {"E", e}}, 11);
    testing::expect_equivalent(backward, in, *b);
  }
  // At E = 16 the same numbers as the model written for 16 (and 4 heads).
  auto x16 = input<"x">(dim<"B">, dim<"T">, dim<16>);
  const ir::Graph fixed = lower(named<"mha">(self_attention<4>(x16, mha_params<"attn", 16>(), causal).output));
  auto in = backend::random_inputs(g, {{"B", 2}, {"T", 5}, {"E", 16}}, 12);
  const auto a = b->compile(g)->run(in).at("mha");
  in.erase("k_proj");
  const auto f = b->compile(fixed)->run(in).at("mha");
  ASSERT_EQ(a.shape(), f.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.at(i), f.at(i), 1e-6) << i;
  // An embedding the heads do not divide fails when bound, naming the dims.
  try {
    b->compile(g)->run(backend::random_inputs(g, {{"B", 2}, {"T", 5}, {"E", 18}}, 13));
    ADD_FAILURE() << "E = 18 ran with 4 heads";
  } catch (const ShapeError& err) {
    EXPECT_NE(std::string(err.what()).find("E = 18 is not divisible by 4"), std::string::npos) << err.what();
  }
}

INSTANTIATE_TEST_SUITE_P(All, MultiHead, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv

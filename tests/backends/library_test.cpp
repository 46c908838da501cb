// The attention library on every backend: dropout, sliding windows, ALiBi, positions (sinusoidal,
// rotary), padding masks from ids, packed and kdim/vdim multi-head attention, the multi-head
// wrapper, whole blocks, the KV cache and the analysis helpers. Forward and backward against the
// float64 reference, plus the property that defines each.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

class Library : public ::testing::TestWithParam<std::string> {};

/// Scales inputs whose names start with `prefix` (weights at Xavier scale keep softmax moderate).
void scale_inputs(backend::TensorMap& in, std::string_view prefix, float s) {
  for (auto& [name, t] : in)
    if (name.starts_with(prefix) && t.dtype() == DType::f32)
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= s;
}

backend::TensorMap with_seed(backend::TensorMap in, std::int32_t seed) {
  in.insert_or_assign("seed", Tensor::from<std::int32_t>({}, {seed}));
  return in;
}

TEST_P(Library, DropoutMasksAreTheSameBitsOnEveryBackendAndInTheBackward) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<"N">, dim<37>);
  auto seed = input<"seed", DType::i32>();
  ir::Graph g = lower(dropout(x, seed, 0.25));
  auto in = with_seed(backend::random_inputs(g, {{"N", 50}}, 1), 1234);
  auto ref = backend::create("reference")->compile(g)->run(in).at("out");
  auto out = b->compile(g)->run(in).at("out");
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    ASSERT_EQ(out.at(i) == 0.0, ref.at(i) == 0.0) << "element " << i << " differs between backends";
    if (out.at(i) == 0.0) ++dropped;
    else EXPECT_NEAR(out.at(i), in.at("x").at(i) / 0.75, 1e-6);
  }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(out.numel()), 0.25, 0.03);
  // The backward reuses the forward's mask: d_x is dout / (1 - p) exactly where x survived.
  ir::Graph backward = ir::build_backward(g, {"", {"x"}, {"out"}});
  in.emplace("dout", Tensor::from<float>({50, 37}, std::vector<float>(50 * 37, 1.0f)));
  auto dx = b->compile(backward)->run(in).at("d_x");
  for (std::int64_t i = 0; i < dx.numel(); ++i) EXPECT_NEAR(dx.at(i), ref.at(i) == 0.0 ? 0.0 : 1.0 / 0.75, 1e-6) << i;
  // Another seed, another mask; p = 0 draws none.
  in.erase("dout");
  auto other = b->compile(g)->run(with_seed(in, 99)).at("out");
  std::int64_t same = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i) same += (other.at(i) == 0.0) == (out.at(i) == 0.0);
  EXPECT_LT(same, out.numel() - 50);
  // A seed outside [0, 2^24) is refused before anything runs, on every backend alike.
  for (std::int32_t bad : {-1, 1 << 24}) {
    try {
      b->compile(g)->run(with_seed(in, bad));
      ADD_FAILURE() << "seed " << bad << " was accepted";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("input 'seed': dropout seed"), std::string::npos) << e.what();
    }
  }
  auto none = b->compile(lower(dropout(x, seed, 0.0)))->run({{"x", in.at("x")}}).at("out");
  for (std::int64_t i = 0; i < none.numel(); ++i) EXPECT_EQ(none.at(i), in.at("x").at(i));
}

TEST_P(Library, AttentionDropoutDropsWeights) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<2>, dim<"N">, dim<8>);
  auto k = input<"k">(dim<2>, dim<"N">, dim<8>);
  auto v = input<"v">(dim<2>, dim<"N">, dim<8>);
  auto seed = input<"seed", DType::i32>();
  auto w = attention_weights(q, k, causal, attn_dropout(0.5, seed));
  ir::Graph g = lower(named<"out">(matmul(w, v)), named<"weights">(w));
  auto in = with_seed(backend::random_inputs(g, {{"N", 9}}, 2), 7);
  testing::expect_equivalent(g, in, GetParam());
  auto r = b->compile(g)->run(in);
  int zeros_below_diagonal = 0;
  for (std::int64_t i = 0; i < 9; ++i)
    for (std::int64_t j = 0; j <= i; ++j) zeros_below_diagonal += r.at("weights").at(i * 9 + j) == 0.0;
  EXPECT_GT(zeros_below_diagonal, 5);
  ir::Graph backward = ir::build_backward(g, {"", {"q", "k", "v"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"N", 9}}, 3).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Library, SlidingWindowSeesOnlyTheLastWKeys) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<"N">, dim<8>);
  auto k = input<"k">(dim<"N">, dim<8>);
  auto v = input<"v">(dim<"N">, dim<4>);
  ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, sliding_window<3>)),
                      named<"explicit">(scaled_dot_product_attention(q, k, v, sliding_window_mask<3>(matmul<false, true>(q, k)))),
                      named<"weights">(attention_weights(q, k, sliding_window<3>)));
  auto in = backend::random_inputs(g, {{"N", 10}}, 5);
  auto r = b->compile(g)->run(in);
  for (std::int64_t i = 0; i < 10; ++i)
    for (std::int64_t j = 0; j < 10; ++j) {
      const bool inside = j <= i && j > i - 3;
      if (!inside) EXPECT_EQ(r.at("weights").at(i * 10 + j), 0.0) << i << "," << j;
      else EXPECT_GT(r.at("weights").at(i * 10 + j), 0.0) << i << "," << j;
    }
  for (std::int64_t i = 0; i < r.at("out").numel(); ++i) EXPECT_NEAR(r.at("out").at(i), r.at("explicit").at(i), 1e-5);
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward = ir::build_backward(lower(scaled_dot_product_attention(q, k, v, sliding_window<3>)), {"", {"q", "k", "v"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"N", 10}}, 6).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Library, SoftcapScoresCapsTheScoresBeforeMasking) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<"N">, dim<8>);
  auto k = input<"k">(dim<"N">, dim<8>);
  auto v = input<"v">(dim<"N">, dim<4>);
  const double s = 1.0 / std::sqrt(8.0);
  auto manual = softmax<-1>(where(causal_mask(matmul<false, true>(q, k)), softcap(matmul<false, true>(q, k) * s, 2.0), kNegInf));
  ir::Graph g = lower(named<"capped">(attention_weights(q, k, causal, softcap_scores(2.0))), named<"manual">(manual),
                      named<"out">(scaled_dot_product_attention(q, k, v, causal, softcap_scores(2.0))));
  auto in = backend::random_inputs(g, {{"N", 7}}, 8);
  scale_inputs(in, "q", 3.0f);  // scores well beyond the cap
  auto r = b->compile(g)->run(in);
  for (std::int64_t i = 0; i < r.at("capped").numel(); ++i) EXPECT_NEAR(r.at("capped").at(i), r.at("manual").at(i), 1e-6) << i;
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward =
      ir::build_backward(lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, softcap_scores(2.0)))), {"", {"q", "k", "v"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"N", 7}}, 9).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Library, AlibiBiasesFollowTheSlopes) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto k8 = input<"k8">(dim<1>, dim<8>, dim<"M">, dim<4>);
  auto k6 = input<"k6">(dim<1>, dim<6>, dim<"M">, dim<4>);
  ir::Graph g = lower(named<"b8">(alibi_bias<8>(k8)), named<"b6">(alibi_bias<6>(k6)));
  auto r = b->compile(g)->run(backend::random_inputs(g, {{"M", 5}}, 1));
  auto check = [&](const Tensor& t, std::int64_t heads) {
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t j = 0; j < 5; ++j) {
        const double slope = alibi_slope(h, heads);
        EXPECT_NEAR(t.at(h * 5 + j), -slope * static_cast<double>(4 - j), 1e-6) << heads << " heads, head " << h << ", key " << j;
      }
  };
  check(r.at("b8"), 8);
  check(r.at("b6"), 6);
  EXPECT_NEAR(alibi_slope(0, 8), 0.5, 1e-12);  // the paper's 1/2, 1/4, ..., 1/256
  EXPECT_NEAR(alibi_slope(7, 8), 1.0 / 256, 1e-12);
  // In attention, forward and backward.
  auto q = input<"q">(dim<1>, dim<8>, dim<"M">, dim<4>);
  auto v = input<"v">(dim<1>, dim<8>, dim<"M">, dim<4>);
  ir::Graph att = lower(scaled_dot_product_attention(q, k8, v, causal, alibi_bias<8>(k8)));
  auto in = backend::random_inputs(att, {{"M", 6}}, 2);
  testing::expect_equivalent(att, in, GetParam());
  ir::Graph backward = ir::build_backward(att, {"", {"q", "k8", "v"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"M", 6}}, 3).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Library, SinusoidalPositionsHaveTheirDefinition) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<"B">, dim<"N">, dim<16>);
  ir::Graph g = lower(named<"pe">(sinusoidal_positions(x)), named<"y">(x + sinusoidal_positions(x)));
  auto in = backend::random_inputs(g, {{"B", 2}, {"N", 50}}, 1);
  auto r = b->compile(g)->run(in);
  ASSERT_EQ(r.at("pe").shape(), (std::vector<std::int64_t>{50, 16}));
  for (std::int64_t p = 0; p < 50; ++p)
    for (std::int64_t i = 0; i < 8; ++i) {
      const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * static_cast<double>(i) / 16.0);
      EXPECT_NEAR(r.at("pe").at(p * 16 + 2 * i), std::sin(angle), 2e-5) << p << "," << i;
      EXPECT_NEAR(r.at("pe").at(p * 16 + 2 * i + 1), std::cos(angle), 2e-5) << p << "," << i;
    }
  testing::expect_equivalent(g, in, GetParam());
}

TEST_P(Library, RotaryEmbeddingsRotatePairs) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<2>, dim<"N">, dim<8>);
  auto pos = cast(input<"pos", DType::i32>(dim<"N">));
  ir::Graph g = lower(named<"half">(rotary(x)), named<"inter">(rotary<RopeStyle::interleaved>(x)), named<"at">(rotary_at(x, pos)));
  auto in = backend::random_inputs(g, {{"N", 5}}, 3);
  for (std::int32_t i = 0; i < 5; ++i) in.at("pos").data<std::int32_t>()[i] = i;
  auto r = b->compile(g)->run(in);
  const Tensor& xs = in.at("x");
  for (std::int64_t bt = 0; bt < 2; ++bt)
    for (std::int64_t p = 0; p < 5; ++p)
      for (std::int64_t i = 0; i < 4; ++i) {
        const double th = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0);
        const std::int64_t row = (bt * 5 + p) * 8;
        // Half-split: (x_i, x_{i+4}); interleaved: (x_{2i}, x_{2i+1}).
        const double a = xs.at(row + i), c = xs.at(row + i + 4);
        EXPECT_NEAR(r.at("half").at(row + i), a * std::cos(th) - c * std::sin(th), 1e-5);
        EXPECT_NEAR(r.at("half").at(row + i + 4), c * std::cos(th) + a * std::sin(th), 1e-5);
        const double e = xs.at(row + 2 * i), o = xs.at(row + 2 * i + 1);
        EXPECT_NEAR(r.at("inter").at(row + 2 * i), e * std::cos(th) - o * std::sin(th), 1e-5);
        EXPECT_NEAR(r.at("inter").at(row + 2 * i + 1), e * std::sin(th) + o * std::cos(th), 1e-5);
        EXPECT_NEAR(r.at("at").at(row + i), r.at("half").at(row + i), 1e-6);
      }
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward = ir::build_backward(lower(named<"out">(rotary<RopeStyle::interleaved>(x) * rotary(x))), {"", {"x"}, {"out"}});
  in.erase("pos");
  in.emplace("dout", backend::random_inputs(backward, {{"N", 5}}, 4).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST(LibraryProperties, RotaryScoresDependOnlyOnRelativePositions) {
  auto q = input<"q">(dim<1>, dim<8>);
  auto k = input<"k">(dim<1>, dim<8>);
  auto pq = cast(input<"pq", DType::i32>(dim<1>));
  auto pk = cast(input<"pk", DType::i32>(dim<1>));
  ir::Graph g = lower(matmul<false, true>(rotary_at(q, pq), rotary_at(k, pk)));
  auto exe = backend::create("reference")->compile(g);
  auto in = backend::random_inputs(g, {}, 8);
  auto score = [&](std::int32_t m, std::int32_t n) {
    in.insert_or_assign("pq", Tensor::from<std::int32_t>({1}, {m}));
    in.insert_or_assign("pk", Tensor::from<std::int32_t>({1}, {n}));
    return exe->run(in).at("out").at(0);
  };
  EXPECT_NEAR(score(3, 1), score(10, 8), 1e-6);
  EXPECT_NEAR(score(0, 5), score(7, 12), 1e-6);
  EXPECT_GT(std::abs(score(3, 1) - score(3, 2)), 1e-4);
}

TEST_P(Library, PaddingMasksFromTokenIds) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto ids = input<"ids", DType::i32>(dim<2>, dim<4>);
  ir::Graph g = lower(named<"keep">(padding_mask(ids, 0)), named<"kpm">(key_padding_mask(ids, 0)));
  auto r = b->compile(g)->run({{"ids", Tensor::from<std::int32_t>({2, 4}, {5, 3, 0, 0, 7, 1, 2, 0})}});
  ASSERT_EQ(r.at("keep").shape(), (std::vector<std::int64_t>{2, 1, 1, 4}));
  const std::vector<double> keep = {1, 1, 0, 0, 1, 1, 1, 0};
  for (std::int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(r.at("keep").at(i), keep[static_cast<std::size_t>(i)]) << i;
    EXPECT_EQ(r.at("kpm").at(i), 1.0 - keep[static_cast<std::size_t>(i)]) << i;
  }
}

TEST_P(Library, PackedAndSeparateProjectionsAgree) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<"B">, dim<"T">, dim<8>);
  auto mem = input<"mem">(dim<"B">, dim<"S">, dim<6>);
  auto val = input<"val">(dim<"B">, dim<"S">, dim<5>);
  auto packed = self_attention<2>(x, mha_params<"attn", 8>(), causal);
  auto p = mha_params<"attn", 8>();
  auto separate = multi_head_attention<2>(x, x, x, p.wq, p.wk, p.wv, p.bq, p.bk, p.bv, p.wo, p.bo, causal);
  auto kv = multi_head_attention<2>(x, mem, val, mha_params_kv<"kv", 8, 6, 5>());
  auto nobias = cross_attention<2>(x, x, mha_params<"nb", 8, false>());
  ir::Graph g = lower(named<"packed">(packed.output), named<"separate">(separate.output), named<"kv">(kv.output), named<"kv_weights">(kv.weights),
                      named<"nobias">(nobias.output));
  auto in = backend::random_inputs(g, {{"B", 2}, {"T", 4}, {"S", 7}}, 1);
  scale_inputs(in, "attn.", 0.3f);
  scale_inputs(in, "kv.", 0.3f);
  scale_inputs(in, "nb.", 0.3f);
  auto r = b->compile(g)->run(in);
  for (std::int64_t i = 0; i < r.at("packed").numel(); ++i) EXPECT_NEAR(r.at("packed").at(i), r.at("separate").at(i), 1e-6);
  EXPECT_EQ(r.at("kv").shape(), (std::vector<std::int64_t>{2, 4, 8}));
  EXPECT_EQ(r.at("kv_weights").shape(), (std::vector<std::int64_t>{2, 2, 4, 7}));
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward =
      ir::build_backward(lower(named<"out">(kv.output)), {"", {"x", "mem", "kv.k_proj_weight", "kv.in_proj_bias", "kv.out_proj.weight"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"B", 2}, {"T", 4}, {"S", 7}}, 2).at("dout"));
  in.erase("attn.in_proj_weight");
  in.erase("attn.in_proj_bias");
  in.erase("attn.out_proj.weight");
  in.erase("attn.out_proj.bias");
  for (const char* name : {"nb.in_proj_weight", "nb.out_proj.weight"}) in.erase(name);
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Library, MultiHeadWrapperIsMultiHeadWithStackedWeights) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto x = input<"x">(dim<"B">, dim<6>, dim<3>);
  auto q0 = input<"q0">(dim<3>, dim<2>);
  auto k0 = input<"k0">(dim<3>, dim<2>);
  auto v0 = input<"v0">(dim<3>, dim<2>);
  auto q1 = input<"q1">(dim<3>, dim<2>);
  auto k1 = input<"k1">(dim<3>, dim<2>);
  auto v1 = input<"v1">(dim<3>, dim<2>);
  auto wrapper = concat_heads(self_attention_raw(x, q0, k0, v0, causal), self_attention_raw(x, q1, k1, v1, causal));
  // The same heads as one multi-head attention: W [out, in] is the heads' matrices side by side, transposed.
  auto stack = [](auto a, auto c) { return transpose<0, 1>(concat<-1>(a, c)); };
  auto eye = input<"eye">(dim<4>, dim<4>);
  auto mha = multi_head_attention<2>(x, x, x, stack(q0, q1), stack(k0, k1), stack(v0, v1), no_bias, no_bias, no_bias, eye, no_bias, causal);
  ir::Graph g = lower(named<"wrapper">(wrapper), named<"mha">(mha.output));
  auto in = backend::random_inputs(g, {{"B", 2}}, 3);
  in.insert_or_assign("eye", Tensor::from<float>({4, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}));
  auto r = b->compile(g)->run(in);
  ASSERT_EQ(r.at("wrapper").shape(), (std::vector<std::int64_t>{2, 6, 4}));
  for (std::int64_t i = 0; i < r.at("wrapper").numel(); ++i) EXPECT_NEAR(r.at("wrapper").at(i), r.at("mha").at(i), 1e-5) << i;
  ir::Graph backward = ir::build_backward(lower(named<"out">(wrapper)), {"", {"x", "q0", "k1", "v0"}, {"out"}});
  in.erase("eye");
  in.emplace("dout", backend::random_inputs(backward, {{"B", 2}}, 4).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST(LibraryProperties, SimplifiedSelfAttentionOfTheJourneySentence) {
  // "Your journey starts with one step": the 3-d embeddings of the tutorial (Raschka, ch. 3); the
  // context vector of "journey" is [0.4419, 0.6515, 0.5683].
  auto x = input<"x">(dim<6>, dim<3>);
  auto r = backend::create("reference")
               ->compile(lower(simple_self_attention(x)))
               ->run({{"x", Tensor::from<float>({6, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f, 0.58f, 0.33f, 0.77f,
                                                         0.25f, 0.10f, 0.05f, 0.80f, 0.55f})}});
  EXPECT_NEAR(r.at("out").at(3), 0.4419, 1e-4);
  EXPECT_NEAR(r.at("out").at(4), 0.6515, 1e-4);
  EXPECT_NEAR(r.at("out").at(5), 0.5683, 1e-4);
}

TEST_P(Library, BlocksMatchTheReferenceForwardAndBackward) {
  auto x = input<"x">(dim<"B">, dim<"T">, dim<8>);
  auto mem = input<"memory">(dim<"B">, dim<"S">, dim<8>);
  ir::Graph g =
      lower(named<"dec">(decoder_block<"blk", 8, 2, 16, Activation::gelu>(x)), named<"encdec">(encoder_decoder_block<"ed", 8, 2, 16>(x, mem)));
  auto in = backend::random_inputs(g, {{"B", 2}, {"T", 5}, {"S", 3}}, 5);
  for (auto& [name, t] : in)
    if (name.find("weight") != std::string::npos && name.find("norm") == std::string::npos) scale_inputs(in, name, 0.35f);
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward = ir::build_backward(
      g, {"",
          {"x", "memory", "blk.self_attn.in_proj_weight", "blk.linear1.weight", "blk.norm2.weight", "ed.multihead_attn.in_proj_bias"},
          {"dec", "encdec"}});
  auto seeds = backend::random_inputs(backward, {{"B", 2}, {"T", 5}, {"S", 3}}, 6);
  in.emplace("ddec", seeds.at("ddec"));
  in.emplace("dencdec", seeds.at("dencdec"));
  testing::expect_equivalent(backward, in, GetParam());
}

TEST_P(Library, KvCacheStepsEqualTheFullCausalComputation) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto params = mha_params<"attn", 8>();
  auto full_x = input<"x">(dim<1>, dim<"T">, dim<8>);
  ir::Graph full = lower(causal_self_attention<2>(full_x, params).output);
  auto past_k = input<"past_k">(dim<1>, dim<2>, dim<"P">, dim<4>);
  auto past_v = input<"past_v">(dim<1>, dim<2>, dim<"P">, dim<4>);
  auto step = cached_self_attention<2>(full_x, past_k, past_v, params);
  ir::Graph step_graph = lower(named<"out">(step.output), named<"k">(step.keys), named<"v">(step.values));
  auto in = backend::random_inputs(full, {{"T", 7}}, 9);
  scale_inputs(in, "attn.", 0.35f);
  auto expected = b->compile(full)->run(in).at("out");
  auto exe = b->compile(step_graph);
  // A prompt of 3 tokens at once (P = 0), then one token at a time.
  Tensor k(DType::f32, {1, 2, 0, 4}), v(DType::f32, {1, 2, 0, 4});
  std::int64_t done = 0;
  for (std::int64_t t : {3, 1, 1, 1, 1}) {
    backend::TensorMap step_in = in;
    Tensor xt(DType::f32, {1, t, 8});
    for (std::int64_t i = 0; i < t * 8; ++i) xt.data<float>()[i] = in.at("x").data<float>()[done * 8 + i];
    step_in.insert_or_assign("x", std::move(xt));
    step_in.emplace("past_k", k);
    step_in.emplace("past_v", v);
    auto r = exe->run(step_in);
    for (std::int64_t i = 0; i < t * 8; ++i) EXPECT_NEAR(r.at("out").at(i), expected.at(done * 8 + i), 1e-5) << "token " << done + i / 8;
    k = r.at("k");
    v = r.at("v");
    done += t;
    EXPECT_EQ(k.shape()[2], done);
  }
}

TEST_P(Library, AnalysisHelpers) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto w = input<"w">(dim<3>, dim<4>);
  ir::Graph g = lower(named<"entropy">(attention_entropy(w)), named<"max">(max_weight(w)));
  backend::TensorMap in{{"w", Tensor::from<float>({3, 4}, {0.25f, 0.25f, 0.25f, 0.25f, 1, 0, 0, 0, 0.5f, 0.5f, 0, 0})}};
  auto r = b->compile(g)->run(in);
  EXPECT_NEAR(r.at("entropy").at(0), std::log(4.0), 1e-6);
  EXPECT_NEAR(r.at("entropy").at(1), 0.0, 1e-7);
  EXPECT_NEAR(r.at("entropy").at(2), std::log(2.0), 1e-6);
  EXPECT_NEAR(r.at("max").at(0), 0.25, 1e-7);
  EXPECT_NEAR(r.at("max").at(1), 1.0, 1e-7);
  // The gradient is finite where weights are 0.
  ir::Graph backward = ir::build_backward(lower(named<"loss">(sum_all(attention_entropy(w)))), {"loss", {"w"}, {}});
  auto d = b->compile(backward)->run(in).at("d_w");
  for (std::int64_t i = 0; i < d.numel(); ++i) EXPECT_TRUE(std::isfinite(d.at(i))) << i;
}

TEST_P(Library, ModulesForwardAndBackward) {
  // Token and learned position embeddings, a padding mask from the ids, causal self-attention,
  // grouped-query attention and cross-attention in one graph.
  auto ids = input<"ids", DType::i32>(dim<2>, dim<"T">);
  auto pos_ids = input<"pos_ids", DType::i32>(dim<"T">);
  auto x = learned_positions(embedding(ids, input<"wte">(dim<8>, dim<16>)), pos_ids, input<"wpe">(dim<12>, dim<16>));
  auto memory = input<"memory">(dim<2>, dim<"S">, dim<16>);
  auto self = causal_self_attention<4>(x, mha_params<"sa", 16>(), padding_mask(ids, 0));
  auto gqa = grouped_query_attention<4, 2>(self.output, linear(x, input<"wk">(dim<8>, dim<16>)), linear(x, input<"wv">(dim<8>, dim<16>)), causal);
  auto cross = cross_attention<2>(gqa, memory, mha_params<"ca", 16>());
  ir::Graph g = lower(named<"out">(cross.output), named<"entropy">(attention_entropy(self.weights)));
  auto in = backend::random_inputs(g, {{"T", 6}, {"S", 4}}, 12);
  for (std::int32_t t = 0; t < 6; ++t) in.at("pos_ids").data<std::int32_t>()[t] = t;
  in.at("ids").data<std::int32_t>()[0] = 3;  // the first token of each sequence is never padding
  in.at("ids").data<std::int32_t>()[6] = 5;
  scale_inputs(in, "w", 0.3f);
  scale_inputs(in, "sa.", 0.3f);
  scale_inputs(in, "ca.", 0.3f);
  testing::expect_equivalent(g, in, GetParam());
  ir::Graph backward = ir::build_backward(lower(named<"out">(cross.output)),
                                          {"", {"wte", "wpe", "memory", "sa.in_proj_weight", "wk", "wv", "ca.out_proj.bias"}, {"out"}});
  in.emplace("dout", backend::random_inputs(backward, {{"T", 6}, {"S", 4}}, 13).at("dout"));
  testing::expect_equivalent(backward, in, GetParam());
}

INSTANTIATE_TEST_SUITE_P(All, Library, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

TEST(LibraryGradients, RopeSlidingWindowAlibiAndEntropyMatchFiniteDifferences) {
  auto x = input<"x">(dim<2>, dim<5>, dim<8>);
  auto k = input<"k">(dim<2>, dim<5>, dim<8>);
  auto v = input<"v">(dim<2>, dim<5>, dim<8>);
  auto heads_k = input<"hk">(dim<1>, dim<2>, dim<5>, dim<8>);
  ir::Graph g = lower(named<"rope">(rotary(x) + rotary<RopeStyle::interleaved>(k)),
                      named<"window">(scaled_dot_product_attention(x, k, v, sliding_window<2>, softcap_scores(3.0))),
                      named<"alibi">(scaled_dot_product_attention(heads_k, heads_k, heads_k, causal, alibi_bias<2>(heads_k))),
                      named<"entropy">(attention_entropy(attention_weights(x, k, causal))));
  ir::Graph with_loss = testing::with_weighted_sum_loss(g);
  testing::expect_gradients_match_finite_differences(with_loss, backend::random_inputs(with_loss, {}, 11), {"x", "k", "v", "hk"});
}

}  // namespace
}  // namespace qkv

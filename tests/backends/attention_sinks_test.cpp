// Attention sinks (gpt-oss, StreamingLLM): a logit per head that joins each row's softmax and
// gives no value. What they mean (torch's concatenated sink column, dropped), fused on every
// backend with the library's options, forward and backward; split-KV decoding; grouped heads; and
// rows that keep no key or meet a non-finite sink.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "backends/cpu/attention.hpp"
#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

using namespace dsl;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

/// The fused attention nodes of the graph `b` runs for g: {forward or lse with sinks, gradients}.
std::pair<int, int> fused_sink_nodes(backend::Backend& b, const ir::Graph& g) {
  const ir::Graph lowered = ir::lower_for_backend(g, [&](const ir::Node& n) { return b.supports(n); });
  int sunk = 0, grads = 0;
  for (const ir::Node& n : lowered.nodes()) {
    EXPECT_NE(n.op, ir::Op::sink_softmax) << "decomposed:\n" << ir::print(lowered);
    sunk += ir::has_sink(n.op, n.attrs);
    grads += n.op == ir::Op::flex_attention_grad;
  }
  return {sunk, grads};
}

// The option means what torch users write: the scores with a column of sink logits, softmax over
// the row, the column dropped. Forward, and the gradients of the sinks (summed over batch entries
// and rows) against finite differences.
TEST(AttentionSinks, MeanTheSoftmaxWithASinkColumnDropped) {
  auto q = input<"q">(dim<2>, dim<3>, dim<5>, dim<8>);
  auto k = input<"k">(dim<2>, dim<3>, dim<7>, dim<8>);
  auto v = input<"v">(dim<2>, dim<3>, dim<7>, dim<4>);
  auto s = input<"sinks">(dim<3>);
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, sinks(s))));
  auto scores = matmul<false, true>(q, k) * (1.0 / std::sqrt(8.0));
  auto masked = where(causal_mask<ir::CausalAlign::bottom_right>(scores), scores, kNegInf);
  constexpr ir::Shape per_head{3, 1, 1};
  auto column = broadcast_to(dsl::detail::reshape_to<per_head>(s), dim<2>, dim<3>, dim<5>, dim<1>);
  auto weights = slice<-1, 0, 7>(softmax(concat<-1>(masked, column)));
  const ir::Graph torch_way = lower(named<"out">(matmul(weights, v)));
  auto in = backend::random_inputs(g, {}, 3);
  in.at("sinks").data<float>()[1] = 2.5f;  // a sink above the scores: most of the weight
  auto reference = backend::make_reference_backend({backend::Precision::f64, true});
  const Tensor want = reference->compile(torch_way)->run(in).at("out"), have = reference->compile(g)->run(in).at("out");
  for (std::int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(have.at(i), want.at(i), 1e-12) << i;
  const ir::Graph loss = testing::with_weighted_sum_loss(g);
  testing::expect_gradients_match_finite_differences(loss, backend::random_inputs(loss, {}, 4), {"q", "k", "v", "sinks"});
}

class Sinks : public ::testing::TestWithParam<std::string> {};

// With each option of the library and compositions of them: one fused flex attention with its
// sinks forward, its gradients fused, and the reference's numbers for the output and the
// gradients of q, k, v and the sinks (per head, and per row).
TEST_P(Sinks, ComposeWithTheLibrarysOptionsFusedForwardAndBackward) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<4>, dim<"M">, dim<16>);
  auto v = input<"v">(dim<"B">, dim<4>, dim<"M">, dim<8>);
  auto s = input<"sinks">(dim<4>);
  auto row_sinks = input<"sinks">(dim<"B">, dim<4>, dim<"N">, dim<1>);
  auto keep = input<"keep", DType::boolean>(dim<"N">, dim<"M">);
  auto q_docs = input<"q_docs", DType::i32>(dim<"B">, dim<"N">);
  auto kv_docs = input<"kv_docs", DType::i32>(dim<"B">, dim<"M">);
  auto seed = input<"seed", DType::i32>();
  auto sdpa = [&](auto... opts) { return lower(named<"out">(scaled_dot_product_attention(q, k, v, opts...))); };
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"plain", sdpa(sinks(s))},
      {"causal", sdpa(causal_bottom_right, sinks(s))},
      {"sliding window (gpt-oss)", sdpa(sliding_window<5>, sinks(s))},
      {"softcap", sdpa(sinks(s), softcap_scores(2.0))},
      {"alibi causal", sdpa(causal_bottom_right, alibi_bias<4>(k), sinks(s))},
      {"keep-mask", sdpa(keep, sinks(s))},
      {"documents", sdpa(document_mask(q_docs, kv_docs), sinks(s))},
      {"score_mod and mask_mod",
       sdpa(sinks(s), score_mod([](auto score, auto, auto, auto q_idx, auto kv_idx) { return score - 0.1 * (q_idx - kv_idx); }),
            mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return kv_idx <= q_idx + 2.0; }))},
      {"softcap window dropout", sdpa(softcap_scores(3.0), sliding_window<4>, attn_dropout(0.2, seed), sinks(s))},
      {"evaluation's dropout (p = 0)", sdpa(causal_bottom_right, attn_dropout(0.0, seed), sinks(s))},
      {"a sink per row", sdpa(causal_bottom_right, sinks(row_sinks))}};
  // On vulkan, the models whose rows the sink meets differently: masked, skipped, dropped, per
  // row; a modifier of the scores alone is code before the softmax, the same with a sink or
  // without (the conformance cases run softcap, slopes and documents with sinks), and each model
  // costs lavapipe some ten seconds of compiling.
  const std::set<std::string> vulkan_models = {
      "plain", "sliding window (gpt-oss)", "documents", "score_mod and mask_mod", "softcap window dropout", "a sink per row"};
  for (const auto& [name, forward] : models) {
    if (GetParam() == "vulkan" && !vulkan_models.contains(name)) continue;
    SCOPED_TRACE(name);
    std::vector<std::string> wrt = {"q", "k", "v", "sinks"};
    const ir::Graph g = ir::build_backward(forward, {"", wrt, {"out"}});
    const auto [sunk, grads] = fused_sink_nodes(*b, g);
    EXPECT_EQ(sunk, 2) << "the forward, and its lse beside it";
    EXPECT_EQ(grads, 3) << "dq, dk, dv";
    for (const auto& [n, m] : std::vector<std::pair<std::int64_t, std::int64_t>>{{9, 9}, {1, 1}, {3, 40}, {1, 70}}) {
      SCOPED_TRACE("N " + std::to_string(n) + ", M " + std::to_string(m));
      auto in = backend::random_inputs(g, {{"B", 2}, {"N", n}, {"M", m}}, 11);
      if (in.contains("q_docs"))  // two documents, the second starting past the first query
        for (const char* docs : {"q_docs", "kv_docs"}) {
          Tensor& t = in.at(docs);
          const std::int64_t len = t.shape()[1];
          for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int32_t>()[i] = i % len < (len + 1) / 2 ? 0 : 1;
        }
      if (in.contains("seed")) in.insert_or_assign("seed", Tensor::from<std::int32_t>({}, {77}));
      testing::expect_equivalent(g, in, *b);
    }
  }
}

// Rows whose keys are all masked weigh only their sink: zeros out, and an lse of the sink (the
// backward reads it). A sink of -inf is no sink; a NaN or +inf sink makes its row NaN, as the
// meaning's exp(inf - inf) does; NaN in the scores propagates as without sinks.
TEST_P(Sinks, EmptyRowsAndNonFiniteSinksAsTheReference) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<1>, dim<4>, dim<6>, dim<8>);
  auto k = input<"k">(dim<1>, dim<4>, dim<9>, dim<8>);
  auto v = input<"v">(dim<1>, dim<4>, dim<9>, dim<8>);
  auto s = input<"sinks">(dim<4>);
  auto keep = input<"keep", DType::boolean>(dim<6>, dim<9>);
  const ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, keep, sinks(s))));
  const ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v", "sinks"}, {"out"}});
  auto in = backend::random_inputs(g, {}, 5);
  std::fill_n(in.at("keep").data<bool>() + 2 * 9, 9, false);  // query 2 keeps no key
  float* sink = in.at("sinks").data<float>();
  sink[1] = -static_cast<float>(kInf);
  sink[2] = static_cast<float>(kNaN);
  sink[3] = static_cast<float>(kInf);
  in.at("q").data<float>()[(0 * 6 + 4) * 8 + 3] = static_cast<float>(kNaN);  // head 0, query 4
  auto want = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(in);
  auto have = b->compile(g)->run(in);
  for (const char* name : {"out", "d_q", "d_k", "d_v", "d_sinks"}) {
    SCOPED_TRACE(name);
    const Tensor &w = want.at(name), &h = have.at(name);
    int nan = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      nan += std::isnan(w.at(i));
      if (std::isnan(w.at(i))) EXPECT_TRUE(std::isnan(h.at(i))) << i;
      else EXPECT_NEAR(h.at(i), w.at(i), 1e-4 * (1.0 + std::abs(w.at(i)))) << i;
    }
    EXPECT_GT(nan, 0) << "heads 2 and 3 are NaN";
  }
  // Head 0's row 2 has no key: zeros; heads 0 and 1 elsewhere finite.
  const Tensor& out = have.at("out");
  for (std::int64_t d = 0; d < 8; ++d) EXPECT_EQ(out.at(2 * 8 + d), 0.0) << d;
  for (std::int64_t i = 0; i < 6 * 8; ++i) EXPECT_FALSE(std::isnan(out.at(6 * 8 + i))) << "head 1, a sink of -inf: " << i;
}

// Grouped-query attention: each query head its own sink, the key/value heads shared (one, and
// two for eight query heads).
TEST_P(Sinks, GroupedQueryHeadsEachHaveTheirSink) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);
  auto k1 = input<"k">(dim<"B">, dim<"M">, dim<8>);
  auto k2 = input<"k">(dim<"B">, dim<"M">, dim<16>);
  auto s = input<"sinks">(dim<8>);
  const ir::Graph one = lower(named<"out">(grouped_query_attention<8, 1>(q, k1, k1, causal_bottom_right, sinks(s))));
  const ir::Graph two = lower(named<"out">(grouped_query_attention<8, 2>(q, k2, k2, causal_bottom_right, sinks(s))));
  for (const ir::Graph* forward : {&one, &two}) {
    const ir::Graph g = ir::build_backward(*forward, {"", {"q", "k", "sinks"}, {"out"}});
    EXPECT_EQ(fused_sink_nodes(*b, g).first, 2) << "the forward and its lse";
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 2}, {"N", 3}, {"M", 20}}, 6), *b);
    testing::expect_equivalent(*forward, backend::random_inputs(*forward, {{"B", 1}, {"N", 1}, {"M", 1300}}, 7), *b);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Sinks, ::testing::Values("cpu", "vulkan"));

// Split-KV decoding merges its parts' partial softmaxes first (the cpu's tasks; vulkan's
// invocations and workgroups, in a GPU's geometry), then folds the sink in once: a decode step
// (and a few queries) against keys split in parts, against the reference.
TEST_P(Sinks, SplitKvDecodingFoldsTheSinkOnce) {
  QKV_GET_BACKEND_OR_SKIP(found, GetParam());
  std::shared_ptr<backend::Backend> b = found;
  if (GetParam() == "vulkan") {
    auto options = backend::vulkan_options_from_env();
    options.tuning = backend::VulkanOptions::Tuning::gpu;
    b = backend::make_vulkan_backend(options);
  }
  ASSERT_GT(backend::cpu::key_splits(1, 2000), 1);
  auto q = input<"q">(dim<1>, dim<4>, dim<"N">, dim<32>);
  auto k = input<"k">(dim<1>, dim<1>, dim<"M">, dim<32>);
  auto v = input<"v">(dim<1>, dim<1>, dim<"M">, dim<32>);
  auto s = input<"sinks">(dim<4>);
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, sinks(s))));
  for (std::int64_t n : {1, 5}) {
    auto in = backend::random_inputs(g, {{"N", n}, {"M", 2000}}, 8);
    in.at("sinks").data<float>()[2] = 6.0f;  // a sink that outweighs every key
    testing::expect_equivalent(g, in, *b);
    if (n > 1) continue;
    auto exe = b->compile(g);
    const std::vector<ir::Shape> shapes = ir::bind_shapes(exe->graph(), in);
    std::string split;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) split += b->work_split(exe->graph(), static_cast<ir::ValueId>(i), shapes);
    EXPECT_NE(split.find("split-KV"), std::string::npos) << "four query rows against 2000 keys: " << split;
  }
}

}  // namespace
}  // namespace qkv

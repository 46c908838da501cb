// Packed batches of sequences of different lengths (varlen, FlashAttention's cu_seqlens): the
// packed attention equals each sequence run alone, forward and backward, with its options applied
// within each sequence; fused on cpu and vulkan with tiles of other sequences skipped.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>

#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using namespace dsl;

/// Offsets [S + 1] of sequences of these lengths.
Tensor offsets(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int32_t> cu = {0};
  for (std::int64_t l : lengths) cu.push_back(cu.back() + static_cast<std::int32_t>(l));
  return Tensor::from<std::int32_t>({static_cast<std::int64_t>(cu.size())}, cu);
}

/// Rows [first, first + count) of x [H, R, D] as an f32 tensor [H, count, D].
Tensor rows(const Tensor& any, std::int64_t first, std::int64_t count) {
  const Tensor x = any.to(DType::f32);
  const std::int64_t h = x.shape()[0], r = x.shape()[1], d = x.shape()[2];
  Tensor out = Tensor::uninitialized(DType::f32, {h, count, d});
  for (std::int64_t i = 0; i < h; ++i) std::copy_n(x.data<float>() + (i * r + first) * d, count * d, out.data<float>() + i * count * d);
  return out;
}

struct Model {
  std::string name;
  ir::Graph packed, alone;  // the same attention over packed sequences, and over one
};

class Varlen : public ::testing::TestWithParam<std::string> {};

// Lengths 0 and 1 among them, keys of their own (a cache before each sequence's queries): every
// packed row of the output and of dq, dk, dv equals its sequence's alone (the float64 reference),
// on every backend; fused into one flex attention where the backend fuses.
TEST_P(Varlen, PackedSequencesEqualEachSequenceAlone) {
  const std::string backend_name = GetParam();
  std::shared_ptr<backend::Backend> b;
  if (backend_name != "reference") {
    std::string why;
    b = testing::backend_or_reason(backend_name, why);
    if (!b && testing::vulkan_required()) FAIL() << "backend " << backend_name << ": " << why;
    if (!b) GTEST_SKIP() << why;
  }
  auto q = input<"q">(dim<4>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<4>, dim<"M">, dim<16>);
  auto v = input<"v">(dim<4>, dim<"M">, dim<8>);
  auto cu_q = input<"cu_q", DType::i32>(dim<"S1">);
  auto cu_k = input<"cu_k", DType::i32>(dim<"S1">);
  auto slopes = input<"slopes">(dim<4>);
  // Scores [4, N, M]: the head is their first axis, which a modifier gets as b.
  auto alibi = score_mod([=](auto score, auto head, auto, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  auto near = mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return kv_idx > q_idx - 3.0; });
  auto sink_logits = input<"sinks">(dim<4>);
  auto both = [&](std::string name, auto... opts) {
    return Model{std::move(name), lower(named<"out">(scaled_dot_product_attention(q, k, v, varlen(cu_q, cu_k), opts...))),
                 lower(named<"out">(scaled_dot_product_attention(q, k, v, opts...)))};
  };
  const std::vector<Model> models = {both("plain"),
                                     both("causal", causal_bottom_right),
                                     both("causal top-left", causal),
                                     both("sliding window", sliding_window<3>),
                                     both("alibi causal (positions within the sequence)", causal_bottom_right, alibi),
                                     both("mask_mod (positions within the sequence)", near, softcap_scores(2.0)),
                                     both("sinks, causal", causal_bottom_right, sinks(sink_logits))};
  // The last sequence's queries have no key: their rows keep none (zeros out, no gradient).
  const std::vector<std::int64_t> q_lengths = {5, 0, 1, 13, 7, 4}, k_lengths = {9, 3, 1, 13, 10, 0};
  const std::int64_t n = std::accumulate(q_lengths.begin(), q_lengths.end(), std::int64_t{0});
  const std::int64_t m = std::accumulate(k_lengths.begin(), k_lengths.end(), std::int64_t{0});
  auto reference = backend::make_reference_backend({backend::Precision::f64, true});
  for (const Model& model : models) {
    SCOPED_TRACE(model.name);
    const ir::Graph packed = ir::build_backward(model.packed, {"", {"q", "k", "v"}, {"out"}});
    const ir::Graph alone = ir::build_backward(model.alone, {"", {"q", "k", "v"}, {"out"}});
    backend::TensorMap in = backend::random_inputs(packed, {{"N", n}, {"M", m}, {"S1", 7}}, 3);
    in.insert_or_assign("cu_q", offsets(q_lengths));
    in.insert_or_assign("cu_k", offsets(k_lengths));
    if (in.contains("slopes")) in.insert_or_assign("slopes", Tensor::from<float>({4}, {0.5f, 0.25f, 0.125f, 0.0625f}));
    const backend::TensorMap got = b ? b->compile(packed)->run(in) : reference->compile(packed)->run(in);
    std::int64_t q0 = 0, k0 = 0;
    for (std::size_t s = 0; s < q_lengths.size(); ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const std::int64_t nq = q_lengths[s], nk = k_lengths[s];
      if (nq > 0 && nk == 0) {  // queries without keys
        for (const char* name : {"out", "d_q"}) {
          const Tensor have = rows(got.at(name), q0, nq);
          for (std::int64_t i = 0; i < have.numel(); ++i) ASSERT_EQ(have.at(i), 0.0) << name << " " << i;
        }
      } else if (nq > 0) {
        backend::TensorMap one = {
            {"q", rows(in.at("q"), q0, nq)}, {"k", rows(in.at("k"), k0, nk)}, {"v", rows(in.at("v"), k0, nk)}, {"dout", rows(in.at("dout"), q0, nq)}};
        for (const char* shared : {"slopes", "sinks"})
          if (in.contains(shared)) one.emplace(shared, in.at(shared));
        const backend::TensorMap want = reference->compile(alone)->run(one);
        for (const auto& [name, first, count] :
             {std::tuple{"out", q0, nq}, std::tuple{"d_q", q0, nq}, std::tuple{"d_k", k0, nk}, std::tuple{"d_v", k0, nk}}) {
          const Tensor have = rows(got.at(name), first, count), w = want.at(name);
          for (std::int64_t i = 0; i < w.numel(); ++i) ASSERT_NEAR(have.at(i), w.at(i), 2e-5 * (1.0 + std::abs(w.at(i)))) << name << " " << i;
        }
      } else {  // no query: its keys get no gradient
        for (const char* name : {"d_k", "d_v"}) {
          const Tensor have = rows(got.at(name), k0, nk);
          for (std::int64_t i = 0; i < have.numel(); ++i) ASSERT_EQ(have.at(i), 0.0) << name << " " << i;
        }
      }
      q0 += nq;
      k0 += nk;
    }
    if (!b) continue;
    const ir::Graph lowered = ir::lower_for_backend(packed, [&](const ir::Node& node) { return b->supports(node); });
    int flex = 0, grads = 0;
    for (const ir::Node& node : lowered.nodes()) {
      EXPECT_NE(node.op, ir::Op::softmax) << ir::print(lowered);
      flex += node.op == ir::Op::flex_attention;
      grads += node.op == ir::Op::flex_attention_grad;
    }
    EXPECT_EQ(flex, 1);
    EXPECT_EQ(grads, 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Varlen, ::testing::Values("reference", "cpu", "vulkan"));

// The cpu skips the tiles that pair no query and key of one sequence: eight sequences of 64 to
// 1024 rows, causal, compute about what they would one by one.
TEST(VarlenCpu, SkipsTheTilesOfOtherSequences) {
  auto q = input<"q">(dim<2>, dim<"N">, dim<32>);
  auto cu = input<"cu", DType::i32>(dim<9>);
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, q, q, varlen(cu), causal)));
  const std::vector<std::int64_t> lengths = {64, 1024, 128, 512, 256, 896, 384, 640};
  const std::int64_t n = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  backend::TensorMap in = backend::random_inputs(g, {{"N", n}}, 5);
  in.insert_or_assign("cu", offsets(lengths));
  auto exe = backend::create("cpu")->compile(g);
  exe->run(in);
  const auto counts = exe->tile_counts();
  ASSERT_EQ(counts.size(), 1u);
  std::int64_t alone = 0;  // the scores of each sequence's causal triangle
  for (std::int64_t l : lengths) alone += 2 * l * (l + 1) / 2;
  EXPECT_EQ(counts[0].computed + counts[0].skipped, 2 * n * n);
  EXPECT_LT(counts[0].computed, 2 * alone) << "computed " << counts[0].computed << " of " << 2 * n * n << " scores";
}

// Causality within packed sequences is a diagonal the kernels cut each row at
// (ScoreModifier::diagonal_conditions), as they cut the causal attribute: the packed batch
// computes exactly the scores its sequences compute alone with the attribute, in the same
// slices, top-left and bottom-right (keys of their own before the queries). Evaluated per score
// instead, with its slices bounded chunk by chunk, it computes more.
TEST(VarlenCpu, CausalityIsCutWhereTheCausalAttributeIs) {
  auto q = input<"q">(dim<2>, dim<"N">, dim<32>);
  auto k = input<"k">(dim<2>, dim<"M">, dim<32>);
  auto cu_q = input<"cu_q", DType::i32>(dim<5>);
  auto cu_k = input<"cu_k", DType::i32>(dim<5>);
  const std::vector<std::int64_t> q_lengths = {300, 37, 530, 5}, k_lengths = {300, 60, 530, 21};
  auto computed = [](backend::Executable& exe, const backend::TensorMap& in) {
    exe.run(in);
    return exe.tile_counts().at(0).computed;
  };
  auto cpu = backend::create("cpu");
  auto check = [&](const ir::Graph& packed, const ir::Graph& alone) {
    auto ep = cpu->compile(packed), ea = cpu->compile(alone);
    const std::int64_t n = std::accumulate(q_lengths.begin(), q_lengths.end(), std::int64_t{0});
    const std::int64_t m = std::accumulate(k_lengths.begin(), k_lengths.end(), std::int64_t{0});
    backend::TensorMap in = backend::random_inputs(packed, {{"N", n}, {"M", m}}, 7);
    in.insert_or_assign("cu_q", offsets(q_lengths));
    if (in.contains("cu_k")) in.insert_or_assign("cu_k", offsets(k_lengths));
    std::int64_t each = 0;
    for (std::size_t s = 0; s < q_lengths.size(); ++s)
      each += computed(*ea, backend::random_inputs(alone, {{"N", q_lengths[s]}, {"M", k_lengths[s]}}, 8));
    EXPECT_EQ(computed(*ep, in), each);
  };
  {
    SCOPED_TRACE("top-left, self-attention");
    check(lower(named<"out">(scaled_dot_product_attention(q, q, q, varlen(cu_q), causal))),
          lower(named<"out">(scaled_dot_product_attention(q, q, q, causal))));
  }
  {
    SCOPED_TRACE("bottom-right, keys of their own");
    check(lower(named<"out">(scaled_dot_product_attention(q, k, k, varlen(cu_q, cu_k), causal_bottom_right))),
          lower(named<"out">(scaled_dot_product_attention(q, k, k, causal_bottom_right))));
  }
}

/// x [H, R, D] tensors' rows concatenated along R, in f32.
Tensor concat_rows(const std::vector<Tensor>& parts) {
  const std::int64_t h = parts.front().shape()[0], d = parts.front().shape()[2];
  std::int64_t r = 0;
  for (const Tensor& t : parts) r += t.shape()[1];
  Tensor out = Tensor::uninitialized(DType::f32, {h, r, d});
  for (std::int64_t i = 0, at = 0; i < h; ++i)
    for (const Tensor& t : parts) {
      const std::int64_t n = t.shape()[1] * d;
      std::copy_n(t.to(DType::f32).data<float>() + i * n, n, out.data<float>() + at);
      at += n;
    }
  return out;
}

/// Batch invariance of packed batches (docs/backends.md, "Determinism"): a sequence's rows of the
/// output, of the gradients and of forward mode's tangent are the same bits alone (a packed batch
/// of one) and anywhere in a packed batch of other sequences, on backend `b`. Lengths across the
/// cpu's 256-row tiles and off the register tiles; one or three heads (the cpu backward's
/// per-operand and fused kernels); decode, one query per sequence against 1,300 keys. The cases
/// `which` names (all by default).
void expect_packed_sequences_invariant(backend::Backend& b, const std::function<bool(const std::string&)>& which = {}) {
  auto q = input<"q">(dim<"H">, dim<"N">, dim<32>);
  auto k = input<"k">(dim<"H">, dim<"M">, dim<32>);
  auto v = input<"v">(dim<"H">, dim<"M">, dim<16>);
  auto cu_q = input<"cu_q", DType::i32>(dim<"S1">);
  auto cu_k = input<"cu_k", DType::i32>(dim<"S1">);
  auto slopes = input<"slopes">(dim<"H">);
  auto sink_logits = input<"sinks">(dim<"H">);
  auto alibi = score_mod([=](auto score, auto head, auto, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  auto near = mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return kv_idx > q_idx - 100.0; });
  auto attend = [&](auto... opts) { return lower(named<"out">(scaled_dot_product_attention(q, k, v, varlen(cu_q, cu_k), opts...))); };
  auto train = [](const ir::Graph& g) { return ir::build_backward(g, {"", {"q", "k", "v"}, {"out"}}); };
  struct Packed {
    std::string name;
    ir::Graph graph;
    std::int64_t heads;
    std::vector<std::pair<std::int64_t, std::int64_t>> lengths;  // (queries, keys): the sequence, then its neighbours
  };
  const std::vector<std::pair<std::int64_t, std::int64_t>> prefill = {{300, 300}, {37, 37}, {261, 261}, {5, 5}};
  const std::vector<Packed> cases = {
      {"causal, ALiBi, sinks", train(attend(causal_bottom_right, alibi, sinks(sink_logits))), 1, prefill},
      {"a window as mask_mod, softcap", train(attend(near, softcap_scores(3.0))), 3, prefill},
      {"forward mode, causal", ir::build_jvp(attend(causal_bottom_right), {{"q", "k", "v"}, {}}), 3, prefill},
      {"decode", attend(causal_bottom_right, sinks(sink_logits)), 3, {{1, 1300}, {1, 700}, {1, 3}, {1, 513}}},
  };
  for (const Packed& c : cases) {
    if (which && !which(c.name)) continue;
    SCOPED_TRACE(c.name);
    auto exe = b.compile(c.graph);
    // Each sequence's own random tensors, by input name (q-like: rows along N, k-like: along M).
    std::vector<backend::TensorMap> own;
    for (std::size_t s = 0; s < c.lengths.size(); ++s)
      own.push_back(backend::random_inputs(c.graph, {{"H", c.heads}, {"N", c.lengths[s].first}, {"M", c.lengths[s].second}, {"S1", 2}}, 11 + s));
    auto along_keys = [](const std::string& name) {
      return name == "k" || name == "v" || name == "t_k" || name == "t_v" || name == "d_k" || name == "d_v";
    };
    // The sequence's rows of every output of a batch of these sequences (the sequence one of them).
    auto run = [&](const std::vector<std::size_t>& order) {
      backend::TensorMap in = own[0];
      std::vector<std::int64_t> lq, lk;
      std::int64_t q0 = 0, k0 = 0;
      for (std::size_t s : order) {
        if (s == 0) q0 = std::accumulate(lq.begin(), lq.end(), std::int64_t{0}), k0 = std::accumulate(lk.begin(), lk.end(), std::int64_t{0});
        lq.push_back(c.lengths[s].first);
        lk.push_back(c.lengths[s].second);
      }
      for (auto& [name, t] : in) {
        if (t.rank() != 3) continue;  // the offsets, the slopes and the sinks: the batch's own
        std::vector<Tensor> parts;
        for (std::size_t s : order) parts.push_back(own[s].at(name));
        t = concat_rows(parts);
      }
      in.insert_or_assign("cu_q", offsets(lq));
      in.insert_or_assign("cu_k", offsets(lk));
      backend::TensorMap mine;
      for (const auto& [name, t] : exe->run(in))
        mine.emplace(name, along_keys(name) ? rows(t, k0, c.lengths[0].second) : rows(t, q0, c.lengths[0].first));
      return mine;
    };
    const backend::TensorMap alone = run({0});
    if (c.name == "decode" && b.name() == "cpu") {  // qkv explain says how the packed decode splits
      backend::TensorMap in = own[0];
      in.insert_or_assign("cu_q", offsets({1}));
      in.insert_or_assign("cu_k", offsets({c.lengths[0].second}));
      const std::vector<ir::Shape> shapes = ir::bind_shapes(exe->graph(), in);
      std::string split;
      for (std::size_t i = 0; i < exe->graph().size(); ++i) split += b.work_split(exe->graph(), static_cast<ir::ValueId>(i), shapes);
      EXPECT_NE(split.find("split-KV by packed sequence: a sequence with 1 to 16 queries and more than 512 keys"), std::string::npos) << split;
      // The packed decode splits the sequence's own keys as the same attention unpacked does
      // (1,300 keys: three parts from its first): the same bits as that one's.
      const ir::Graph plain = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, sinks(sink_logits))));
      backend::TensorMap one = own[0];
      one.erase("cu_q");
      one.erase("cu_k");
      const Tensor want = b.compile(plain)->run(one).at("out");
      ASSERT_EQ(want.nbytes(), alone.at("out").nbytes());
      EXPECT_EQ(std::memcmp(want.raw(), alone.at("out").raw(), want.nbytes()), 0) << "the packed decode's bits differ from the unpacked one's";
    }
    for (const std::vector<std::size_t>& order : std::vector<std::vector<std::size_t>>{{1, 0}, {2, 0, 3}, {1, 3, 2, 0}, {0, 2}}) {
      std::string where;
      for (std::size_t s : order) where += std::to_string(c.lengths[s].first) + "/" + std::to_string(c.lengths[s].second) + " ";
      SCOPED_TRACE("packed: " + where);
      const backend::TensorMap packed = run(order);
      ASSERT_EQ(packed.size(), alone.size());
      for (const auto& [name, t] : alone) {
        ASSERT_EQ(packed.at(name).nbytes(), t.nbytes()) << name;
        EXPECT_EQ(std::memcmp(packed.at(name).raw(), t.raw(), t.nbytes()), 0) << name << " differs alone and packed";
      }
    }
  }
}

// The cpu tiles each sequence from its own first query and key, and splits a decoding
// sequence's own keys.
TEST(VarlenCpu, ASequenceHasTheSameBitsAloneAndAnywhereInAPackedBatch) { expect_packed_sequences_invariant(*backend::create("cpu")); }

// Vulkan's scalar kernels add each row's keys one at a time, so no tile boundary moves its sums:
// lavapipe's geometry as it is, a GPU's with QKV_DETERMINISTIC's option, under which a packed
// decode takes neither the decode layout nor the key split (their lanes and parts group keys by
// packed position: without it, the decode's bits differ). Cold, lavapipe's LLVM compiles are
// nearly all of the time (15-20 s for a forward and backward's five kernels): the mask_mod case,
// the same kernels as the first but for the modifier, runs on the cpu only, and a GPU's geometry
// takes the first and decode.
TEST(VarlenVulkan, ASequenceHasTheSameBitsAloneAndAnywhereInAPackedBatch) {
  QKV_GET_BACKEND_OR_SKIP(b, "vulkan");
  for (auto tuning : {backend::VulkanOptions::Tuning::cpu, backend::VulkanOptions::Tuning::gpu}) {
    const bool gpu = tuning == backend::VulkanOptions::Tuning::gpu;
    SCOPED_TRACE(gpu ? "a GPU's geometry, deterministic" : "lavapipe's geometry");
    backend::VulkanOptions options = backend::vulkan_options_from_env();
    options.tuning = tuning;
    options.deterministic = gpu;
    expect_packed_sequences_invariant(*backend::make_vulkan_backend(options), [&](const std::string& name) {
      return name == "causal, ALiBi, sinks" || name == "decode" || (!gpu && name == "forward mode, causal");
    });
  }
  // The split as qkv explain gives it for a packed decode of two sequences in a GPU's geometry.
  auto q = input<"q">(dim<2>, dim<"N">, dim<32>);
  auto k = input<"k">(dim<2>, dim<"M">, dim<32>);
  auto cu_q = input<"cu_q", DType::i32>(dim<3>);
  auto cu_k = input<"cu_k", DType::i32>(dim<3>);
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, k, varlen(cu_q, cu_k), causal_bottom_right)));
  for (bool deterministic : {false, true}) {
    backend::VulkanOptions options = backend::vulkan_options_from_env();
    options.tuning = backend::VulkanOptions::Tuning::gpu;
    options.deterministic = deterministic;
    auto gpu = backend::make_vulkan_backend(options);
    auto exe = gpu->compile(g);
    backend::TensorMap in = backend::random_inputs(g, {{"N", 2}, {"M", 1500}}, 1);
    in.insert_or_assign("cu_q", offsets({1, 1}));
    in.insert_or_assign("cu_k", offsets({700, 800}));
    const std::vector<ir::Shape> shapes = ir::bind_shapes(exe->graph(), in);
    std::string split;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) split += gpu->work_split(exe->graph(), static_cast<ir::ValueId>(i), shapes);
    EXPECT_EQ(split.find("decode layout") != std::string::npos, !deterministic) << split;
    EXPECT_EQ(split.find("split-KV") != std::string::npos, !deterministic) << split;
    testing::expect_equivalent(g, in, *gpu);  // the decode layout's lanes and parts, each adding its keys one at a time
  }
}

}  // namespace
}  // namespace qkv

// The determinism contract (docs/backends.md, "Determinism"), bit for bit on cpu and vulkan:
// - run to run: the same graph and inputs give the same bits on every run, and when compiled again;
// - thread count: the cpu gives the same bits on one thread as on the pool's (a child process of
//   this program with QKV_NUM_THREADS=1 computes the digests the parent compares);
// - batch invariance: a sequence's outputs and gradients do not depend on what else is in the
//   batch: alone, or at any position of a batch of random neighbours.
// Over attention forward and backward with causality, modifiers, sinks and dropout, attention's
// tangent (forward mode), a decoder block's forward and backward, and decode against a long cache
// (split-KV on the cpu).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>

#include "backends/cpu/thread_pool.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "models/models.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using namespace dsl;

/// A graph and its named dims (B, the batch, on axis 0 of what is per sequence).
struct Case {
  std::string name;
  ir::Graph graph;
  std::map<std::string, std::int64_t> dims;
  std::string slug;  ///< the name in the test's name
};

/// Forward and backward (gradients of every float input from a given d_out) of attention with
/// each kind of option, and a decoder block's; decode at 8,192 keys (split-KV on the cpu).
std::vector<Case> cases() {
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<32>);
  auto k = input<"k">(dim<"B">, dim<4>, dim<"M">, dim<32>);
  auto v = input<"v">(dim<"B">, dim<4>, dim<"M">, dim<16>);
  auto s = input<"sinks">(dim<4>);
  auto seed = input<"seed", DType::i32>();
  auto train = [](const ir::Graph& forward) {
    std::vector<std::string> wrt;
    for (ir::ValueId in : forward.inputs())
      if (forward.node(in).dtype == DType::f32) wrt.push_back(forward.node(in).name);
    return ir::build_backward(forward, {"", wrt, {"out"}});
  };
  auto sdpa = [&](auto... opts) { return train(lower(named<"out">(scaled_dot_product_attention(q, k, v, opts...)))); };
  const std::map<std::string, std::int64_t> prefill = {{"B", 3}, {"N", 77}, {"M", 77}};
  const auto& block = models::find_model("decoder-block");
  return {
      {"causal attention", sdpa(causal), prefill, "causal"},
      {"softcap, ALiBi, causal", sdpa(causal, softcap_scores(5.0), alibi_bias<4>(k)), prefill, "softcap_alibi"},
      {"sliding window with sinks", sdpa(sliding_window<16>, sinks(s)), prefill, "window_sinks"},
      {"dropout", sdpa(causal, attn_dropout(0.1, seed)), prefill, "dropout"},
      {"decoder block", train(block.build(models::resolve_options(block, {}), {})), {{"B", 3}, {"N", 40}}, "decoder_block"},
      {"forward mode (attention's tangent), softcap, ALiBi, causal",
       ir::build_jvp(lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, softcap_scores(5.0), alibi_bias<4>(k)))),
                     {{"q", "k", "v"}, {}}),
       prefill, "forward_mode"},
      {"decode against 8192 keys",
       lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right))),
       {{"B", 3}, {"N", 1}, {"M", 8192}},
       "decode"},
  };
}
constexpr int kCases = 7;
/// The cases' slugs in order, for the tests' names: made in every process of the test program,
/// so not from cases() (which builds the graphs); each test checks its case has its slug.
constexpr std::array<const char*, kCases> kSlugs = {"causal", "softcap_alibi", "window_sinks", "dropout", "decoder_block", "forward_mode", "decode"};

/// FNV-1a over every output's dtype, shape and bytes, in name order.
std::uint64_t digest(const backend::TensorMap& outputs) {
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&](const void* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  for (const auto& [name, t] : outputs) {
    add(name.data(), name.size());
    for (std::int64_t d : t.shape()) add(&d, sizeof d);
    add(t.raw(), t.nbytes());
  }
  return h;
}

backend::TensorMap inputs_of(const Case& c, std::uint64_t seed) {
  backend::TensorMap in = backend::random_inputs(c.graph, c.dims, seed);
  if (in.contains("seed")) in.at("seed") = Tensor::from<std::int32_t>({}, {1234});
  return in;
}

/// A backend and one of cases(): each its own test, so that ctest spreads them over its jobs and
/// a subgroup size's run can pick some (tests/CMakeLists.txt).
class Determinism : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

/// Batch entry `i` of every input and output that has the batch on axis 0 (B > 1), as a batch of one.
Tensor entry(const Tensor& t, std::int64_t i) {
  std::vector<std::int64_t> shape = t.shape();
  shape[0] = 1;
  Tensor one = Tensor::uninitialized(t.dtype(), shape);
  const std::size_t bytes = t.nbytes() / static_cast<std::size_t>(t.shape()[0]);
  std::memcpy(one.raw(), static_cast<const std::byte*>(t.raw()) + static_cast<std::size_t>(i) * bytes, bytes);
  return one;
}

// Run to run and compiled again, the same bits; and a sequence's outputs and its own gradients
// the same bits alone (B = 1) and at each position of a batch of random neighbours (B = 3). One
// compile per case serves both (on lavapipe the kernels' compiles are most of the time). (The
// weights' gradients of the decoder block are sums over the batch, not one sequence's: compared
// are the outputs and d_x. Dropout's mask is keyed by the element's index in the batch, so it
// depends on where the sequence sits: not compared alone.)
TEST_P(Determinism, TheSameBitsEveryRunAndForASequenceAloneOrAnywhereInABatch) {
  QKV_GET_BACKEND_OR_SKIP(b, std::get<0>(GetParam()));
  const std::vector<Case> all = cases();
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kCases));
  const Case& c = all[static_cast<std::size_t>(std::get<1>(GetParam()))];
  SCOPED_TRACE(c.name);
  ASSERT_TRUE(std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()).ends_with("_" + c.slug)) << "the names' slugs";
  const backend::TensorMap batch = inputs_of(c, 5);
  auto exe = b->compile(c.graph);
  const backend::TensorMap together = exe->run(batch);
  EXPECT_EQ(digest(exe->run(batch)), digest(together)) << "a second run";
  EXPECT_EQ(digest(b->compile(c.graph)->run(batch)), digest(together)) << "compiled again";
  if (c.name == "dropout") return;
  const std::int64_t batch_size = c.dims.at("B");
  for (std::int64_t at = 0; at < batch_size; ++at) {
    SCOPED_TRACE("position " + std::to_string(at));
    backend::TensorMap one;
    for (const auto& [name, t] : batch) {
      const ir::ValueId v = [&] {
        for (ir::ValueId in : c.graph.inputs())
          if (c.graph.node(in).name == name) return in;
        return ir::ValueId{-1};
      }();
      const bool batched = t.rank() > 0 && c.graph.node(v).shape[0] == ir::symbol_id("B");
      one.emplace(name, batched ? entry(t, at) : t);
    }
    const backend::TensorMap alone = exe->run(one);
    for (const auto& [name, t] : alone) {
      const ir::ValueId out = c.graph.output(name);
      if (c.graph.node(out).shape.rank == 0 || c.graph.node(out).shape[0] != ir::symbol_id("B")) continue;  // a sum over the batch
      const Tensor mine = entry(together.at(name), at);
      ASSERT_EQ(mine.nbytes(), t.nbytes()) << name;
      EXPECT_EQ(std::memcmp(mine.raw(), t.raw(), t.nbytes()), 0) << name << " differs alone and at position " << at << " of " << batch_size;
    }
  }
}

std::string case_digests(const std::string& backend_name) {
  auto b = backend::create(backend_name);
  std::ostringstream s;
  for (const Case& c : cases()) s << digest(b->compile(c.graph)->run(inputs_of(c, 5))) << "\n";
  return s.str();
}

// The cpu's threads split work by data, not by their number: one thread gives the same bits as
// the pool. The child (this program, QKV_NUM_THREADS=1) prints its digests; the parent compares.
TEST(DeterminismCpu, OneThreadGivesThePoolsBits) {
  if (std::getenv("QKV_DETERMINISM_CHILD")) {
    std::printf("digests:\n%s", case_digests("cpu").c_str());
    return;
  }
  if (backend::cpu::ThreadPool::global().size() < 2) GTEST_SKIP() << "the pool has one thread: nothing to compare";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  // Not a shard of a sharded run, nor writing the parent's report.
  const std::string cmd = "env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX -u GTEST_OUTPUT QKV_DETERMINISM_CHILD=1 QKV_NUM_THREADS=1 '" + self +
                          "' --gtest_filter=DeterminismCpu.OneThreadGivesThePoolsBits 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  ASSERT_TRUE(pipe);
  std::string child;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe.get())) child += buf;
  const std::size_t at = child.find("digests:\n");
  ASSERT_NE(at, std::string::npos) << child;
  const std::string pool = case_digests("cpu");
  EXPECT_EQ(child.substr(at + 9, pool.size()), pool) << "with " << backend::cpu::ThreadPool::global().size() << " threads against one";
}

INSTANTIATE_TEST_SUITE_P(Backends, Determinism, ::testing::Combine(::testing::Values("cpu", "vulkan"), ::testing::Range(0, kCases)),
                         [](const ::testing::TestParamInfo<Determinism::ParamType>& param) {
                           return std::get<0>(param.param) + "_" + kSlugs[static_cast<std::size_t>(std::get<1>(param.param))];
                         });

}  // namespace
}  // namespace qkv

// Runs that write their outputs into the caller's tensors (Executable::run_into): the values a
// plain run returns, the caller's storage reused where it fits, and on the cpu a planned small
// graph's run that allocates nothing (what a decode loop pays per step).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"

// Every allocation through operator new in this test program counted, aligned or not (not under
// AddressSanitizer, whose own operator new checks what this would hide). What OpenBLAS mallocs
// itself is not seen (the backend pins it to one thread, which allocates nothing per call).
#if !defined(__SANITIZE_ADDRESS__)
// GCC sees these replacements' malloc and free where it inlines them, and would warn that free
// meets operator new's pointers: it does, as the replacement makes it.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<long> allocations{0};
}  // namespace
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
// Aligned too (the cpu's packed GEMM buffers are): counted, from aligned_alloc, freed by free.
void* operator new(std::size_t n, std::align_val_t a) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto align = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align + (n == 0 ? align : 0))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return ::operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif

namespace qkv {
namespace {

using namespace dsl;

/// `y` (f32), `positive` (bool) and `half` (f16) from x.
ir::Graph three_outputs() {
  ir::Graph g;
  ir::Dim n = g.symbol("N");
  auto x = g.add_input("x", DType::f32, {n});
  auto y = g.add(ir::Op::tanh, {g.add(ir::Op::mul, {x, x})});
  g.set_output("y", y);
  g.set_output("positive", g.add(ir::Op::greater, {x, g.constant(0.0)}));
  ir::Attrs to_half;
  to_half.dtype = DType::f16;
  g.set_output("half", g.add(ir::Op::cast, {y}, to_half));
  return g;
}

std::vector<std::byte> bytes(const Tensor& t) { return {t.raw(), t.raw() + t.nbytes()}; }

class RunInto : public ::testing::TestWithParam<std::string> {};

TEST_P(RunInto, WritesWhatRunReturnsIntoTheCallersTensorsWhereTheyFit) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto exe = b->compile(three_outputs());
  const backend::TensorMap in = {{"x", Tensor::from<float>({5}, {0.5f, -1, 2, 0.25f, -3})}};
  const backend::TensorMap plain = exe->run(in);
  // Into an empty map: every output, as run returns it.
  backend::TensorMap out;
  exe->run_into(in, out);
  ASSERT_EQ(out.size(), 3u);
  for (const auto& [name, t] : plain) {
    EXPECT_EQ(out.at(name).dtype(), t.dtype()) << name;
    EXPECT_EQ(out.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(bytes(out.at(name)), bytes(t)) << name;
  }
  // Again, with other values, into the same tensors: their storage where the backend copies its
  // outputs from host memory (cpu, vulkan), the values of this run.
  const backend::TensorMap in2 = {{"x", Tensor::from<float>({5}, {-0.5f, 1, -2, 4, 3})}};
  const backend::TensorMap plain2 = exe->run(in2);
  const std::byte* y_storage = out.at("y").raw();
  const std::byte* half_storage = out.at("half").raw();
  out.emplace("unrelated", Tensor::from<float>({1}, {7}));
  exe->run_into(in2, out);
  for (const auto& [name, t] : plain2) EXPECT_EQ(bytes(out.at(name)), bytes(t)) << name;
  if (GetParam() != "reference") {
    EXPECT_EQ(out.at("y").raw(), y_storage);
    EXPECT_EQ(out.at("half").raw(), half_storage);
  }
  EXPECT_EQ(out.at("unrelated").at(0), 7.0) << "entries of other names stay";
  // Inputs that do not fit: the run's ShapeError, and the outputs as they were.
  std::map<std::string, std::vector<std::byte>> before;
  for (const auto& [name, t] : out) before.emplace(name, bytes(t));
  EXPECT_THROW(exe->run_into({{"x", Tensor::from<float>({2, 2}, {1, 2, 3, 4})}}, out), ShapeError);
  EXPECT_THROW(exe->run_into({}, out), ShapeError);
  for (const auto& [name, t] : out) EXPECT_EQ(bytes(t), before.at(name)) << name;
  // Tensors that do not fit (another shape, another dtype, a view of someone else's bytes) are
  // replaced, never written through.
  const float outside[5] = {9, 9, 9, 9, 9};
  out.at("y") = Tensor::from<float>({4}, {0, 0, 0, 0});
  out.at("positive") = Tensor::from<float>({5}, {0, 0, 0, 0, 0});
  out.at("half") = Tensor::view(DType::f32, {5}, reinterpret_cast<const std::byte*>(outside), sizeof outside, nullptr);
  exe->run_into(in2, out);
  for (const auto& [name, t] : plain2) {
    EXPECT_EQ(out.at(name).dtype(), t.dtype()) << name;
    EXPECT_EQ(bytes(out.at(name)), bytes(t)) << name;
  }
  EXPECT_EQ(outside[0], 9.0f);
}

INSTANTIATE_TEST_SUITE_P(All, RunInto, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

TEST(RunIntoCpu, APlannedSmallAttentionRunAllocatesNothing) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "allocations are counted outside AddressSanitizer";
#else
  QKV_GET_BACKEND_OR_SKIP(b, "cpu");
  // The graph bench's tiny row: attention at (1, 1, 16, 8), and a causal one with a score
  // modifier, whose kernel evaluates the modifier per score.
  auto q = input<"q">(dim<1>, dim<1>, dim<16>, dim<8>);
  auto k = input<"k">(dim<1>, dim<1>, dim<16>, dim<8>);
  auto v = input<"v">(dim<1>, dim<1>, dim<16>, dim<8>);
  auto alibi = score_mod([](auto score, auto, auto, auto q_idx, auto kv_idx) { return score + 0.25 * (kv_idx - q_idx); });
  for (const ir::Graph& g :
       {lower(named<"out">(scaled_dot_product_attention(q, k, v))), lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, alibi)))}) {
    auto exe = b->compile(g);
    const backend::TensorMap in = backend::random_inputs(g, {}, 3);
    backend::TensorMap out;
    exe->run_into(in, out);  // plans, and makes the output
    exe->run_into(in, out);  // the kernels' thread-local buffers at their size
    const long before = allocations.load();
    exe->run_into(in, out);
    EXPECT_EQ(allocations.load() - before, 0) << ir::print(exe->graph());
    EXPECT_EQ(bytes(out.at("out")), bytes(exe->run(in).at("out")));
  }
#endif
}

// The cpu builds a flex kernel's modifier once per plan and points it at each run's tensors:
// later runs with other values (in other tensors) give what a fresh executable gives.
TEST(RunIntoCpu, AModifiersTensorsAreEachRunsOwn) {
  QKV_GET_BACKEND_OR_SKIP(b, "cpu");
  auto q = input<"q">(dim<2>, dim<"N">, dim<8>);
  auto k = input<"k">(dim<2>, dim<"N">, dim<8>);
  auto v = input<"v">(dim<2>, dim<"N">, dim<8>);
  auto slopes = input<"slopes">(dim<2>);
  auto alibi = score_mod([=](auto score, auto head, auto, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, alibi)));
  auto exe = b->compile(g);
  backend::TensorMap out;
  for (std::uint64_t seed : {1, 2, 3}) {
    const backend::TensorMap in = backend::random_inputs(g, {{"N", 37}}, seed);
    exe->run_into(in, out);
    EXPECT_EQ(bytes(out.at("out")), bytes(b->compile(g)->run(in).at("out"))) << "seed " << seed;
  }
}

}  // namespace
}  // namespace qkv

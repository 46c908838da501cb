// A paged key/value cache (vLLM's PagedAttention): pages [P, H, page, D] that sequences take as
// they grow, read through a block table [B, n] and written at slots. Attention through the table
// means attention over the keys the pages hold in the table's order, forward and backward (each
// page's gradient the sum of the rows that read it), on every backend and with the library's
// options; writes land at their slots and nowhere else.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "codegen/storage_plan.hpp"
#include "dsl/dsl.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/storage_plan.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

using namespace dsl;

constexpr std::int64_t kPages = 9, kHeads = 2, kPage = 3, kDim = 8, kBatch = 2, kTable = 4;

/// Block tables [2, 4] over 9 pages of 3 rows: a page boundary every 3 keys, pages in no order,
/// a page read twice (its gradient sums both), and unallocated entries (-1, and 9 past the
/// pool) that read zeros.
Tensor block_table() { return Tensor::from<std::int32_t>({kBatch, kTable}, {4, 0, 7, 4, 8, 2, -1, 9}); }

/// pages [P, H, page, D] gathered through table [B, n] on the host: [B, H, n page, D].
Tensor gathered(const Tensor& any_pages, const Tensor& table) {
  const Tensor pages = any_pages.to(DType::f32);
  const std::int64_t p = pages.shape()[0], h = pages.shape()[1], page = pages.shape()[2], d = pages.shape()[3];
  const std::int64_t b_count = table.shape()[0], n = table.shape()[1];
  Tensor out(DType::f32, {b_count, h, n * page, d});
  for (std::int64_t b = 0; b < b_count; ++b)
    for (std::int64_t head = 0; head < h; ++head)
      for (std::int64_t s = 0; s < n * page; ++s) {
        const std::int32_t at = table.data<std::int32_t>()[b * n + s / page];
        if (at < 0 || at >= p) continue;
        std::copy_n(pages.data<float>() + ((at * h + head) * page + s % page) * d, d, out.data<float>() + ((b * h + head) * n * page + s) * d);
      }
  return out;
}

/// The gradient of the pages from that of the gathered keys: each row added to the page row it read.
Tensor scattered(const Tensor& any_grad, const Tensor& table, std::int64_t pages) {
  const Tensor grad = any_grad.to(DType::f64);
  const std::int64_t b_count = grad.shape()[0], h = grad.shape()[1], d = grad.shape()[3], n = table.shape()[1], page = grad.shape()[2] / n;
  Tensor out(DType::f64, {pages, h, page, d});
  for (std::int64_t b = 0; b < b_count; ++b)
    for (std::int64_t head = 0; head < h; ++head)
      for (std::int64_t s = 0; s < n * page; ++s) {
        const std::int32_t at = table.data<std::int32_t>()[b * n + s / page];
        if (at < 0 || at >= pages) continue;
        for (std::int64_t e = 0; e < d; ++e)
          out.data<double>()[((at * h + head) * page + s % page) * d + e] += grad.data<double>()[((b * h + head) * n * page + s) * d + e];
      }
  return out;
}

// The decomposition's gradient (embedding's rule through the reshapes) against central
// differences, the twice-read page included.
TEST(PagedAttention, GradientsOfThePagesMatchFiniteDifferences) {
  auto q = input<"q">(dim<kBatch>, dim<kHeads>, dim<5>, dim<kDim>);
  auto kp = input<"k_pages">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>);
  auto vp = input<"v_pages">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>);
  auto table = input<"table", DType::i32>(dim<kBatch>, dim<kTable>);
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, page_gather(kp, table), page_gather(vp, table), causal_bottom_right)));
  const ir::Graph loss = testing::with_weighted_sum_loss(g);
  backend::TensorMap in = backend::random_inputs(loss, {}, 5);
  in.insert_or_assign("table", block_table());
  testing::expect_gradients_match_finite_differences(loss, in, {"q", "k_pages", "v_pages"}, 24);
}

class Paged : public ::testing::TestWithParam<std::string> {};

// With each option of the library: the output and dq equal attention over the gathered keys (the
// float64 reference), the pages' gradients equal the gathered keys' scattered back, and the
// attention stays fused where the backend fuses.
TEST_P(Paged, AttentionThroughTheBlockTableEqualsTheGatheredCache) {
  const std::string backend_name = GetParam();
  QKV_GET_BACKEND_OR_SKIP(b, backend_name);
  auto q = input<"q">(dim<kBatch>, dim<kHeads>, dim<5>, dim<kDim>);
  auto kp = input<"k_pages">(dim<kPages>, dim<kHeads>, dim<"page">, dim<kDim>);
  auto vp = input<"v_pages">(dim<kPages>, dim<kHeads>, dim<"page">, dim<kDim>);
  auto table = input<"table", DType::i32>(dim<kBatch>, dim<"NP">);
  auto k = input<"k">(dim<kBatch>, dim<kHeads>, dim<"M">, dim<kDim>);
  auto v = input<"v">(dim<kBatch>, dim<kHeads>, dim<"M">, dim<kDim>);
  auto slopes = input<"slopes">(dim<kHeads>);
  auto alibi = score_mod([=](auto score, auto, auto head, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  auto near = mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return kv_idx > q_idx + 3.0; });
  auto sink_logits = input<"sinks">(dim<kHeads>);
  struct Model {
    std::string name;
    ir::Graph paged, contiguous;
  };
  auto both = [&](std::string name, auto... opts) {
    return Model{std::move(name), lower(named<"out">(scaled_dot_product_attention(q, page_gather(kp, table), page_gather(vp, table), opts...))),
                 lower(named<"out">(scaled_dot_product_attention(q, k, v, opts...)))};
  };
  const std::vector<Model> models = {both("plain"),
                                     both("causal", causal_bottom_right),
                                     both("sliding window", sliding_window<4>),
                                     both("alibi", alibi),
                                     both("mask_mod, soft-capped", near, softcap_scores(2.0)),
                                     both("sinks, causal", causal_bottom_right, sinks(sink_logits))};
  // Pages of 3 (a tile of keys spans several: gathered per tile) and of 12 (a table of one page:
  // a tile read where it lies).
  const std::vector<std::pair<std::int64_t, Tensor>> layouts = {{kPage, block_table()}, {12, Tensor::from<std::int32_t>({kBatch, 1}, {5, 1})}};
  auto reference = backend::make_reference_backend({backend::Precision::f64, true});
  for (const auto& [page, pages_of] : layouts)
    for (const Model& model : models) {
      SCOPED_TRACE(model.name + ", pages of " + std::to_string(page));
      const ir::Graph paged = ir::build_backward(model.paged, {"", {"q", "k_pages", "v_pages"}, {"out"}});
      const ir::Graph contiguous = ir::build_backward(model.contiguous, {"", {"q", "k", "v"}, {"out"}});
      backend::TensorMap in = backend::random_inputs(paged, {{"page", page}, {"NP", pages_of.shape()[1]}}, 7);
      in.insert_or_assign("table", pages_of);
      if (in.contains("slopes")) in.insert_or_assign("slopes", Tensor::from<float>({kHeads}, {0.5f, 0.25f}));
      const backend::TensorMap got = b->compile(paged)->run(in);
      backend::TensorMap flat = {{"q", in.at("q")},
                                 {"dout", in.at("dout")},
                                 {"k", gathered(in.at("k_pages"), in.at("table"))},
                                 {"v", gathered(in.at("v_pages"), in.at("table"))}};
      for (const char* shared : {"slopes", "sinks"})
        if (in.contains(shared)) flat.emplace(shared, in.at(shared));
      const backend::TensorMap want = reference->compile(contiguous)->run(flat);
      const std::vector<std::pair<std::string, Tensor>> expected = {{"out", want.at("out")},
                                                                    {"d_q", want.at("d_q")},
                                                                    {"d_k_pages", scattered(want.at("d_k"), in.at("table"), kPages)},
                                                                    {"d_v_pages", scattered(want.at("d_v"), in.at("table"), kPages)}};
      for (const auto& [name, w] : expected) {
        const Tensor& have = got.at(name);
        ASSERT_EQ(have.shape(), w.shape()) << name;
        for (std::int64_t i = 0; i < w.numel(); ++i) ASSERT_NEAR(have.at(i), w.at(i), 2e-5 * (1.0 + std::abs(w.at(i)))) << name << " " << i;
      }
      if (backend_name == "reference") continue;
      const ir::Graph lowered = ir::lower_for_backend(paged, [&](const ir::Node& node) { return b->supports(node); });
      int fused = 0;
      for (const ir::Node& node : lowered.nodes()) {
        EXPECT_NE(node.op, ir::Op::softmax) << ir::print(lowered);
        fused += node.op == ir::Op::flex_attention || node.op == ir::Op::attention;
      }
      EXPECT_EQ(fused, 1) << ir::print(lowered);
      // cpu's and vulkan's kernels read the pages through the table, forward and backward:
      // nothing gathered.
      const ir::StoragePlan storage = b->storage_plan(lowered);
      int read_in_place = 0;
      for (std::size_t i = 0; i < lowered.size(); ++i) read_in_place += storage.values[i].kind == ir::StorageKind::paged;
      EXPECT_EQ(read_in_place, 2) << ir::print_storage(lowered, storage);
    }
}

// A step's keys land at their slots and nowhere else, in place where the graph updates the held
// pages (the generator's case) and as a copy where it does not: tokens of two sequences at slots
// in other pages, a -1 and a slot past the pool dropped.
TEST_P(Paged, WritesLandAtTheirSlotsAndNowhereElse) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto pages = input<"past.0.key">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>);
  auto fresh = input<"k">(dim<kBatch>, dim<kHeads>, dim<"T">, dim<kDim>);
  auto slots = input<"slots", DType::i32>(dim<kBatch>, dim<"T">);
  auto written = page_write(pages, fresh, slots);
  ir::Graph copy = lower(named<"pages">(written));
  dsl::detail::Lowerer l;
  l.graph().set_output("first", l.emit(page_gather(written, input<"table", DType::i32>(dim<1>, dim<2>)).term()));
  l.graph().set_update("past.0.key", l.emit(written.term()));
  const ir::Graph updating = l.graph();
  ASSERT_TRUE(ir::writes_into_operand(updating, updating.updates().at(0).second));
  const Tensor keys = backend::random_inputs(copy, {{"T", 3}}, 11).at("k");
  const Tensor slot_map = Tensor::from<std::int32_t>({kBatch, 3}, {7, 8, -1, 13, 2, 27});  // 27 = 9 pages x 3: past the pool
  Tensor before(DType::f32, {kPages, kHeads, kPage, kDim});
  for (std::int64_t i = 0; i < before.numel(); ++i) before.data<float>()[i] = static_cast<float>(1000 + i);
  // What each slot of the pool holds after the write: (sequence, token) or none.
  auto source = [&](std::int64_t slot) -> std::pair<std::int64_t, std::int64_t> {
    for (std::int64_t i = 0; i < kBatch * 3; ++i)
      if (slot_map.data<std::int32_t>()[i] == slot) return {i / 3, i % 3};
    return {-1, -1};
  };
  auto check = [&](const Tensor& after) {
    for (std::int64_t p = 0; p < kPages; ++p)
      for (std::int64_t h = 0; h < kHeads; ++h)
        for (std::int64_t r = 0; r < kPage; ++r)
          for (std::int64_t e = 0; e < kDim; ++e) {
            const std::int64_t at = ((p * kHeads + h) * kPage + r) * kDim + e;
            const auto [seq, token] = source(p * kPage + r);
            const double want = seq < 0 ? before.at(at) : keys.at(((seq * kHeads + h) * 3 + token) * kDim + e);
            ASSERT_EQ(after.at(at), want) << "page " << p << " head " << h << " row " << r;
          }
  };
  check(b->compile(copy)->run({{"past.0.key", before}, {"k", keys}, {"slots", slot_map}}).at("pages"));
  auto exe = b->compile(updating);
  exe->set_state({{"past.0.key", before}});
  // Pages 2 and 4 (slots 6..8 and 12..14) through a table: the written rows and the rest kept.
  const Tensor first = exe->run({{"k", keys}, {"slots", slot_map}, {"table", Tensor::from<std::int32_t>({1, 2}, {2, 4})}}).at("first");
  for (std::int64_t h = 0; h < kHeads; ++h)
    for (std::int64_t s = 0; s < 2 * kPage; ++s)
      for (std::int64_t e = 0; e < kDim; ++e) {
        const std::int64_t slot = (s < kPage ? 2 * kPage : 4 * kPage) + s % kPage;
        const auto [seq, token] = source(slot);
        const double want = seq < 0 ? before.at((((slot / kPage) * kHeads + h) * kPage + slot % kPage) * kDim + e)
                                    : keys.at(((seq * kHeads + h) * 3 + token) * kDim + e);
        ASSERT_EQ(first.at((h * 2 * kPage + s) * kDim + e), want) << "head " << h << " slot " << slot;
      }
  // The held pages after the run: written where the slots say, kept elsewhere.
  check(exe->state().at("past.0.key"));
}

INSTANTIATE_TEST_SUITE_P(Backends, Paged, ::testing::Values("reference", "cpu", "vulkan"));

// Kernels that read pages where a graph writes them too: attention over pages that page_write
// fills in the same graph (no held state), the pages and the table living until the attention
// that reads them through its gathers runs (the gathers have no kernel of their own). And one
// block table [1, n] and one key/value head broadcast over a batch of two sequences of two heads.
TEST_P(Paged, PagesWrittenInTheSameGraphLiveUntilAttentionReadsThem) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto q = input<"q">(dim<kBatch>, dim<kHeads>, dim<2>, dim<kDim>);
  auto table = input<"table", DType::i32>(dim<kBatch>, dim<kTable>);
  auto slots = input<"slots", DType::i32>(dim<kBatch>, dim<2>);
  auto pages = [&](auto fresh, auto pool) { return page_gather(page_write(pool * 1.0, fresh, slots), table); };
  auto k = pages(input<"k">(dim<kBatch>, dim<kHeads>, dim<2>, dim<kDim>), input<"k_pages">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>));
  auto v = pages(input<"v">(dim<kBatch>, dim<kHeads>, dim<2>, dim<kDim>), input<"v_pages">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>));
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right)));
  backend::TensorMap in = backend::random_inputs(g, {}, 3);
  in.insert_or_assign("table", block_table());
  in.insert_or_assign("slots", Tensor::from<std::int32_t>({kBatch, 2}, {13, 14, 25, 7}));
  testing::expect_equivalent(g, in, *b);

  auto shared_table = input<"table", DType::i32>(dim<1>, dim<kTable>);
  auto one_head = [&](auto pool) { return page_gather(pool, shared_table); };  // [1, 1, 12, D]
  const ir::Graph broadcast =
      lower(named<"out">(scaled_dot_product_attention(q, one_head(input<"k_pages">(dim<kPages>, dim<1>, dim<kPage>, dim<kDim>)),
                                                      one_head(input<"v_pages">(dim<kPages>, dim<1>, dim<kPage>, dim<kDim>)))));
  backend::TensorMap shared = backend::random_inputs(broadcast, {}, 4);
  shared.insert_or_assign("table", Tensor::from<std::int32_t>({1, kTable}, {8, 3, -1, 0}));
  testing::expect_equivalent(broadcast, shared, *b);
}

// A decode step's few queries (on cpu kFewRows and fewer take the products over the keys as
// stored; on vulkan a GPU's geometry takes the decode layout), past 512 keys (split-KV), two
// query heads to a key/value head (reshapes of the gathers), with pages in f32 and in f16 read
// through the table where they lie (f16 pages read as they are held, widened where loaded), a
// page boundary every 16 keys and a table entry not allocated (zeros).
void expect_paged_decode_steps(const std::string& name, backend::Backend& b) {
  auto q = input<"q">(dim<3>, dim<2>, dim<2>, dim<1>, dim<32>);  // [B, Hkv, G, T, D]
  auto table = input<"table", DType::i32>(dim<3>, dim<40>);
  constexpr ir::Shape grouped{3, 2, 1, 640, 32};
  auto k = dsl::detail::reshape_to<grouped>(page_gather(input<"k_pages">(dim<130>, dim<2>, dim<16>, dim<32>), table));
  auto v = dsl::detail::reshape_to<grouped>(page_gather(input<"v_pages">(dim<130>, dim<2>, dim<16>, dim<32>), table));
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right)));
  std::vector<std::int32_t> entries(3 * 40);
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i] = static_cast<std::int32_t>((i * 37) % 130);
  entries[45] = -1;
  for (DType dtype : {DType::f32, DType::f16}) {
    SCOPED_TRACE(name + ", " + std::string(dtype_name(dtype)));
    const ir::Graph typed = dtype == DType::f32 ? g : ir::to_dtype(g, dtype);
    backend::TensorMap in = backend::random_inputs(typed, {}, 4);
    in.insert_or_assign("table", Tensor::from<std::int32_t>({3, 40}, entries));
    testing::expect_equivalent(typed, in, b);
    auto exe = b.compile(typed);
    const ir::Graph& lowered = exe->graph();
    const ir::StoragePlan storage = b.storage_plan(lowered);
    int paged = 0;
    for (std::size_t i = 0; i < lowered.size(); ++i) paged += storage.values[i].kind == ir::StorageKind::paged;
    EXPECT_EQ(paged, 2) << "nothing gathered\n" << ir::print_storage(lowered, storage);
    // f16 pages are read as they are held: no kernel converts the pools.
    for (std::size_t i = 0; i < lowered.size(); ++i) {
      const ir::Node& n = lowered.nodes()[i];
      if (n.op == ir::Op::cast && lowered.node(n.inputs[0]).op == ir::Op::input && lowered.node(n.inputs[0]).name.ends_with("_pages")) {
        EXPECT_EQ(storage.values[i].kind, ir::StorageKind::half_view) << ir::print_storage(lowered, storage);
      }
    }
    if (name != "vulkan, a GPU's geometry" || dtype != DType::f32) continue;
    const std::vector<ir::Shape> shapes = ir::bind_shapes(lowered, in);
    std::string split;
    for (std::size_t i = 0; i < lowered.size(); ++i)
      if (ir::is_fused_attention(lowered.nodes()[i].op)) split = b.work_split(lowered, static_cast<ir::ValueId>(i), shapes);
    EXPECT_NE(split.find("split-KV"), std::string::npos) << split;
  }
}

// Vulkan reads pages in place only where the block tables fit beside a flash kernel's operands
// in the storage buffers one shader may bind (the forward binds q, k, v, the output, its tile
// counts and its split buffer: six, eight with the tables).
TEST(PagedVulkanPlan, TheTablesMustFitTheDevicesStorageBuffers) {
  auto q = input<"q">(dim<kBatch>, dim<kHeads>, dim<1>, dim<kDim>);
  auto table = input<"table", DType::i32>(dim<kBatch>, dim<kTable>);
  auto k = page_gather(input<"k_pages">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>), table);
  auto v = page_gather(input<"v_pages">(dim<kPages>, dim<kHeads>, dim<kPage>, dim<kDim>), table);
  const ir::Graph g = ir::lower_for_backend(lower(named<"out">(scaled_dot_product_attention(q, k, v))), [](const ir::Node&) { return true; });
  auto paged = [&](std::uint32_t buffers) {
    const ir::StoragePlan plan = codegen::plan_storage(g, 16, buffers);
    int n = 0;
    for (const auto& value : plan.values) n += value.kind == ir::StorageKind::paged;
    return n;
  };
  EXPECT_EQ(paged(0), 2);
  EXPECT_EQ(paged(8), 2);
  EXPECT_EQ(paged(7), 0) << "a gathered copy where the tables do not fit";
}

TEST(PagedDecode, CpuStepsReadTheirPagesSplitAndInHalfPrecision) {
  QKV_GET_BACKEND_OR_SKIP(cpu, "cpu");
  expect_paged_decode_steps("cpu", *cpu);
}

// In both launch geometries (lavapipe's, and a GPU's, which takes the decode layout and splits the
// keys over workgroups past 512), whichever device runs the test.
TEST(PagedDecode, VulkanStepsReadTheirPagesSplitAndInHalfPrecision) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  for (auto t : {backend::VulkanOptions::Tuning::cpu, backend::VulkanOptions::Tuning::gpu}) {
    auto options = backend::vulkan_options_from_env();
    options.tuning = t;
    expect_paged_decode_steps(t == backend::VulkanOptions::Tuning::gpu ? "vulkan, a GPU's geometry" : "vulkan, lavapipe's geometry",
                              *backend::make_vulkan_backend(options));
  }
}

}  // namespace
}  // namespace qkv

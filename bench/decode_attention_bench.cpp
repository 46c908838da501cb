// Decode attention on a backend against the machine's limit: one new query per sequence
// against a key/value cache of M tokens (H = 32 query heads over Hkv = 8 key/value heads, head
// dim 128), batch 1 and 8, the cache in f32 and in bf16. Decoding is bound by memory: the bound is
// the cache's bytes (each key and value read once) over the read bandwidth measured in the same
// run. Each shape runs split along the keys (flash-decoding: backend::cpu::key_splits on the cpu,
// the flash forward's decode layout and split on a GPU through vulkan; lavapipe keeps both off)
// and, for the gain, unsplit (QKV_CPU_SPLIT_KV=0, QKV_VULKAN_SPLIT_KV=0). Grouped-query heads run two ways: as heads (q
// [B, Hkv, 4, 1, D] against k [B, Hkv, 1, M, D], a batch entry per query head, each reading its
// key/value head) and as rows (q [B, Hkv, 4, D]: the four query heads of a key/value head are four
// query rows of one batch entry, which reads its key/value head once; exact for decoding, where
// every query keeps every cached key). Then the same rows over a paged cache (pages of 16
// positions, vLLM's block size, read through a shuffled block table) against the contiguous cache:
// issue 42 asks for at most 1.1x. Then one sequence with one head, where the unsplit
// kernel has a single task however many cores there are. Last, where the bench was configured with
// a ggml built for measurement (-DQKV_GGML_DIR=<its install prefix>, as docs/benchmarks.md builds one),
// ggml's CPU flash attention (ggml_flash_attn_ext, what llama.cpp decodes with) at each decode
// shape, with as many threads, against the grouped rows' split time: issue 42 asks for 1.5x.
//
// On vulkan (--backend vulkan) each time is the kernels' device time (timestamps: the cache is
// uploaded on every run, which a server keeps resident), the bound the cache's bytes over the
// device's copy bandwidth measured in the same run (a 128 MiB negation: bytes read and written over
// its device time). PyTorch's peer on the same GPU: bench/torch_decode_sdpa.py.
//
//   build/default/bench/qkv_decode_attention_bench [--repeat 5] [--max-cache 32768] [--grouped 0: only the one-head rows]
//                                                  [--backend cpu|vulkan]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/equivalence.hpp"
#include "bench/limits.hpp"
#include "ir/error.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"

#ifdef QKV_HAVE_GGML
#include <ggml-cpu.h>
#include <ggml.h>
#endif

namespace {

using namespace qkv;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kHeads = 32, kKvHeads = 8, kGroup = kHeads / kKvHeads, kHeadDim = 128;

/// The cache's positions per page in the paged rows (vLLM's default block size).
constexpr std::int64_t kPage = 16;

/// Decode attention over a paged cache: q [B, Hkv, 4, D] (grouped heads as rows) against the keys
/// and values of pages [B M / 16, Hkv, 16, D] read through a block table [B, M / 16] (page_gather).
ir::Graph paged_decode_graph(std::int64_t b, std::int64_t m) {
  ir::Graph g;
  const ir::ValueId q = g.add_input("q", DType::f32, {b, kKvHeads, kGroup, kHeadDim});
  const ir::Shape pages{b * m / kPage, kKvHeads, kPage, kHeadDim};
  const ir::ValueId table = g.add_input("block_table", DType::i32, {b, m / kPage});
  const ir::ValueId k = g.add(ir::Op::page_gather, {g.add_input("k_pages", DType::f32, pages), table});
  const ir::ValueId v = g.add(ir::Op::page_gather, {g.add_input("v_pages", DType::f32, pages), table});
  ir::Attrs a;
  a.scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
  return g;
}

/// A block table [b, n] naming every page of the pool once, in a shuffled order (pages a server
/// hands out as sequences come and go are anywhere in the pool).
Tensor shuffled_table(std::int64_t b, std::int64_t n) {
  std::vector<std::int32_t> pages(static_cast<std::size_t>(b * n));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(7));
  return Tensor::from<std::int32_t>({b, n}, pages);
}

/// Decode attention over a cache of `m` tokens for `b` sequences: grouped query heads as heads
/// (`rows` false) or as query rows of their key/value head's batch entry.
ir::Graph decode_graph(std::int64_t b, std::int64_t m, bool rows) {
  ir::Graph g;
  const ir::Shape qs = rows ? ir::Shape{b, kKvHeads, kGroup, kHeadDim} : ir::Shape{b, kKvHeads, kGroup, 1, kHeadDim};
  const ir::Shape ks = rows ? ir::Shape{b, kKvHeads, m, kHeadDim} : ir::Shape{b, kKvHeads, 1, m, kHeadDim};
  const ir::ValueId q = g.add_input("q", DType::f32, qs), k = g.add_input("k", DType::f32, ks), v = g.add_input("v", DType::f32, ks);
  ir::Attrs a;
  a.scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
  return g;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string backend_name = "cpu";

/// Median seconds of `repeat` runs of `g` (after one warm-up run): the wall clock on the cpu,
/// the kernels' device time on vulkan.
double seconds(const ir::Graph& g, const backend::TensorMap& in, int repeat) {
  auto exe = backend::create(backend_name)->compile(g);
  const bool device_time = backend_name == "vulkan";
  exe->set_profiling(device_time);
  exe->run(in);
  std::vector<double> t;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    exe->run(in);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (device_time) {
      s = 0;
      for (const auto& k : exe->profile()) s += k.seconds;
    }
    t.push_back(s);
  }
  return median(t);
}

/// The split run's seconds, and the unsplit run's (QKV_CPU_SPLIT_KV=0 or QKV_VULKAN_SPLIT_KV=0:
/// each backend is created after the switch is set).
std::pair<double, double> split_and_unsplit(const ir::Graph& g, const backend::TensorMap& in, int repeat) {
  const char* name = backend_name == "vulkan" ? "QKV_VULKAN_SPLIT_KV" : "QKV_CPU_SPLIT_KV";
  setenv(name, "1", 1);
  const double split = seconds(g, in, repeat);
  setenv(name, "0", 1);
  const double unsplit = seconds(g, in, repeat);
  unsetenv(name);
  return {split, unsplit};
}

/// `v` in a column `width` wide with `digits` decimals and `unit`, or "-" for NaN.
std::string cell(double v, int width, int digits, const char* unit = "") {
  char buf[64];
  if (std::isnan(v)) std::snprintf(buf, sizeof buf, "%*s", width, "-");
  else std::snprintf(buf, sizeof buf, "%*.*f%s", width - static_cast<int>(std::strlen(unit)), digits, v, unit);
  return buf;
}

/// The device's copy bandwidth: a 128 MiB f32 tensor negated (the most one binding may span on
/// some devices; more than a GPU's L2 holds), bytes read and written over the
/// kernel's device time.
double device_copy_bandwidth(int repeat) {
  ir::Graph g;
  const std::int64_t n = std::int64_t{1} << 25;
  g.set_output("y", g.add(ir::Op::neg, {g.add_input("x", DType::f32, {n})}));
  const backend::TensorMap in = backend::random_inputs(g, {}, 1);
  return 2.0 * static_cast<double>(n * 4) / seconds(g, in, repeat);
}

#ifdef QKV_HAVE_GGML
/// Median seconds of ggml_flash_attn_ext for `b` sequences of one query (H heads over Hkv)
/// against a cache of `m` positions in f32 or bf16 (ggml's layout: q [D, 1, H, B], k and v [D, M,
/// Hkv, B]), on `threads` threads, its work buffer planned once.
double ggml_seconds(std::int64_t b, std::int64_t m, DType dtype, int threads, int repeat) {
  const ggml_type kv = dtype == DType::bf16 ? GGML_TYPE_BF16 : GGML_TYPE_F32;
  const std::size_t kv_bytes = ggml_row_size(kv, kHeadDim) * static_cast<std::size_t>(m * kKvHeads * b);
  const std::size_t q_bytes = sizeof(float) * static_cast<std::size_t>(kHeadDim * kHeads * b);
  ggml_init_params params{2 * kv_bytes + 2 * q_bytes + 16 * ggml_tensor_overhead() + ggml_graph_overhead() + (1 << 20), nullptr, false};
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kHeadDim, 1, kHeads, b);
  ggml_tensor* k = ggml_new_tensor_4d(ctx, kv, kHeadDim, m, kKvHeads, b);
  ggml_tensor* v = ggml_new_tensor_4d(ctx, kv, kHeadDim, m, kKvHeads, b);
  std::uint32_t state = 12345;
  std::vector<float> row(static_cast<std::size_t>(kHeadDim));
  auto fill = [&](ggml_tensor* t) {  // uniform in [-1, 1), a row at a time
    for (std::int64_t r = 0; r < ggml_nrows(t); ++r) {
      for (float& x : row) x = static_cast<float>((state = state * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
      char* at = static_cast<char*>(t->data) + static_cast<std::size_t>(r) * t->nb[1];
      if (t->type == GGML_TYPE_BF16) ggml_fp32_to_bf16_row(row.data(), reinterpret_cast<ggml_bf16_t*>(at), kHeadDim);
      else std::memcpy(at, row.data(), row.size() * sizeof(float));
    }
  };
  fill(q), fill(k), fill(v);
  ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, nullptr, static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim))), 0.0f, 0.0f);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  ggml_cplan plan = ggml_graph_plan(graph, threads, nullptr);
  std::vector<std::uint8_t> work(plan.work_size);
  plan.work_data = work.data();
  ggml_graph_compute(graph, &plan);
  std::vector<double> t;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    ggml_graph_compute(graph, &plan);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  ggml_free(ctx);
  return median(t);
}

/// ggml's rows at the shapes of qkv's grouped rows, each against qkv's split time there.
void print_ggml_peer(const std::vector<std::tuple<std::int64_t, std::int64_t, DType, double>>& rows_split, double bandwidth, int repeat) {
  const int threads = backend::cpu::ThreadPool::global().size();
  std::printf("\nggml's CPU flash attention (ggml_flash_attn_ext, %d threads, ggml %s) at the same shapes against qkv's grouped rows, split:\n",
              threads, ggml_version());
  std::printf("%-5s %-6s %-6s %10s %10s %9s %10s\n", "B", "cache", "dtype", "ggml ms", "GB/s", "of bound", "qkv x");
  for (const auto& [b, m, dtype, qkv_split] : rows_split) {
    const double s = ggml_seconds(b, m, dtype, threads, repeat);
    const double rate = 2.0 * static_cast<double>(b * kKvHeads * m * kHeadDim * static_cast<std::int64_t>(dtype_size(dtype))) / s;
    std::printf("%-5lld %-6lld %-6s %10.3f %10.1f %8.0f%% %9.2fx\n", static_cast<long long>(b), static_cast<long long>(m),
                std::string(dtype_name(dtype)).c_str(), s * 1e3, rate / 1e9, 100.0 * rate / bandwidth, s / qkv_split);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it is measured
  int repeat = 5;
  std::int64_t max_cache = 32768;
  bool grouped = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
    else if (flag == "--max-cache") max_cache = std::atoll(argv[i + 1]);
    else if (flag == "--grouped") grouped = std::string(argv[i + 1]) != "0";
    else if (flag == "--backend") backend_name = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--repeat N] [--max-cache M] [--grouped 0|1] [--backend cpu|vulkan]\n", argv[0]);
      return 2;
    }
  }
  if (backend_name != "cpu" && backend_name != "vulkan") {
    std::fprintf(stderr, "--backend %s: give cpu or vulkan\n", backend_name.c_str());
    return 2;
  }
  double bandwidth = 0;
  if (backend_name == "cpu") {
    bandwidth = bench::read_bandwidth();
    std::printf("decode attention on cpu, %d threads; read bandwidth %.1f GB/s (measured in this run)\n", backend::cpu::ThreadPool::global().size(),
                bandwidth / 1e9);
  } else {
    bandwidth = device_copy_bandwidth(repeat);
    std::printf("decode attention on vulkan (%s), kernels' device time; copy bandwidth %.1f GB/s (measured in this run)\n",
                backend::create(backend_name)->device().c_str(), bandwidth / 1e9);
  }
  std::printf("H %lld over Hkv %lld, D %lld; median of %d runs; bound = cache bytes / bandwidth\n", static_cast<long long>(kHeads),
              static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim), repeat);
  std::printf("%-5s %-6s %-6s %-6s %10s %10s %9s %10s %9s\n", "B", "cache", "dtype", "GQA as", "split ms", "GB/s", "of bound", "unsplit ms",
              "split x");
  std::vector<std::tuple<std::int64_t, std::int64_t, DType, double>> rows_split;  // the grouped rows' split times, for the peer
  for (std::int64_t b : {1, 8})
    for (std::int64_t m : {4096, 32768}) {
      if (m > max_cache || !grouped) continue;
      for (DType dtype : {DType::f32, DType::bf16})
        for (bool rows : {false, true}) {
          ir::Graph g = decode_graph(b, m, rows);
          if (dtype != DType::f32) g = ir::to_dtype(g, dtype);
          const backend::TensorMap in = backend::random_inputs(g, {}, 1);
          const double cache_bytes = 2.0 * static_cast<double>(b * kKvHeads * m * kHeadDim * static_cast<std::int64_t>(dtype_size(dtype)));
          double split = 0, unsplit = 0;
          try {
            std::tie(split, unsplit) = split_and_unsplit(g, in, repeat);
          } catch (const ResourceError& e) {  // a cache larger than the device binds (lavapipe: 128 MiB)
            std::printf("%-5lld %-6lld %-6s %-6s   beyond the device: %s\n", static_cast<long long>(b), static_cast<long long>(m),
                        std::string(dtype_name(dtype)).c_str(), rows ? "rows" : "heads", e.what());
            continue;
          }
          const double rate = cache_bytes / split;
          if (rows) rows_split.emplace_back(b, m, dtype, split);
          std::printf("%-5lld %-6lld %-6s %-6s %10.3f %10.1f %8.0f%% %s %s\n", static_cast<long long>(b), static_cast<long long>(m),
                      std::string(dtype_name(dtype)).c_str(), rows ? "rows" : "heads", split * 1e3, rate / 1e9, 100.0 * rate / bandwidth,
                      cell(unsplit * 1e3, 10, 3).c_str(), cell(unsplit / split, 9, 2, "x").c_str());
        }
    }
  // A paged cache against the same cache held contiguously (grouped heads as rows, f32): the
  // pages of 16 positions read through a shuffled block table where they lie.
  std::printf("\npaged cache (pages of %lld positions, a shuffled block table) against contiguous, GQA as rows, f32:\n",
              static_cast<long long>(kPage));
  std::printf("%-5s %-6s %10s %10s %9s %13s %9s\n", "B", "cache", "paged ms", "GB/s", "of bound", "contiguous ms", "paged /");
  for (std::int64_t b : {1, 8})
    for (std::int64_t m : {4096, 32768}) {
      if (m > max_cache) continue;
      const ir::Graph paged = paged_decode_graph(b, m);
      backend::TensorMap in = backend::random_inputs(paged, {}, 1);
      in.insert_or_assign("block_table", shuffled_table(b, m / kPage));
      const ir::Graph contiguous = decode_graph(b, m, true);
      const backend::TensorMap flat = backend::random_inputs(contiguous, {}, 1);
      double paged_s = 0, contiguous_s = 0;
      try {
        paged_s = seconds(paged, in, repeat);
        contiguous_s = seconds(contiguous, flat, repeat);
      } catch (const ResourceError& e) {
        std::printf("%-5lld %-6lld   beyond the device: %s\n", static_cast<long long>(b), static_cast<long long>(m), e.what());
        continue;
      }
      const double rate = 2.0 * static_cast<double>(b * kKvHeads * m * kHeadDim * 4) / paged_s;
      std::printf("%-5lld %-6lld %10.3f %10.1f %8.0f%% %13.3f %8.2fx\n", static_cast<long long>(b), static_cast<long long>(m), paged_s * 1e3,
                  rate / 1e9, 100.0 * rate / bandwidth, contiguous_s * 1e3, paged_s / contiguous_s);
    }
  // One sequence with one head: the unsplit kernel has one task, whatever the cores.
  std::printf("\none head (q [1, 1, 1, D] against k, v [1, 1, M, D]), f32:\n");
  std::printf("%-6s %10s %10s %9s %10s %9s\n", "cache", "split ms", "GB/s", "of bound", "unsplit ms", "split x");
  for (std::int64_t m : {4096, 32768, 262144}) {
    if (m > 8 * max_cache) continue;  // 262144 with the default
    ir::Graph g;
    const ir::ValueId q = g.add_input("q", DType::f32, {1, 1, 1, kHeadDim}), k = g.add_input("k", DType::f32, {1, 1, m, kHeadDim}),
                      v = g.add_input("v", DType::f32, {1, 1, m, kHeadDim});
    ir::Attrs a;
    a.scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
    g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
    const backend::TensorMap in = backend::random_inputs(g, {}, 1);
    const auto [split, unsplit] = split_and_unsplit(g, in, repeat);
    const double rate = 2.0 * static_cast<double>(m * kHeadDim * 4) / split;
    std::printf("%-6lld %10.3f %10.1f %8.0f%% %s %s\n", static_cast<long long>(m), split * 1e3, rate / 1e9, 100.0 * rate / bandwidth,
                cell(unsplit * 1e3, 10, 3).c_str(), cell(unsplit / split, 9, 2, "x").c_str());
  }
#ifdef QKV_HAVE_GGML
  if (backend_name == "cpu") print_ggml_peer(rows_split, bandwidth, repeat);
#endif
  return 0;
}

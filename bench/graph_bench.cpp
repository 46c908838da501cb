// Whole graphs beside a peer measured in the same run, for the Vulkan code generator's targets:
//   matmul/M512_N512_K512   one matmul on each backend against OpenBLAS sgemm on every core
//                           (the peer): "vs peer" is the rate as a share of sgemm's; in f16 and
//                           bf16 too (rows "cpu-f16", ...), each against its backend's f32 in
//                           a table of its own;
//   decoder-block/B*_N*     the built-in pre-norm decoder block (qkv models) forward, and forward
//                           + backward (gradients of every parameter and x from an output
//                           gradient), on vulkan against the cpu backend (the peer): "x peer" is
//                           vulkan's time over the cpu's;
//   tiny/B1_N16_D8          scaled dot-product attention at (1, 1, 16, 8): the cost of one run
//                           (dispatch, upload, download) where the arithmetic is nothing; the
//                           "-run_into" rows write into the last run's outputs (a decode loop's
//                           call) where the others return new tensors;
//   rows/R4096_C256         softmax, sum and max along the rows of an R x C matrix, on vulkan
//                           with a subgroup per row (where rows are a subgroup long) and with
//                           one invocation per row (QKV_VULKAN_SUBGROUP_REDUCTIONS=0), against
//                           the cpu (QKV_BENCH_ROWS=R,C).
// Run: build/default/bench/qkv_graph_bench (QKV_BENCH_BACKENDS=cpu,vulkan picks backends;
// QKV_BENCH_MATMUL=4096,4096,4096 the matmul shape; QKV_BENCH_DECODER=8,512 the decoder's B and N;
// --benchmark_filter narrows the rows; --benchmark_repetitions=5 for medians on a noisy machine).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "bench/report.hpp"
#include "ir/passes/passes.hpp"
#include "models/models.hpp"

namespace {

using qkv::backend::TensorMap;

struct MatmulShape {
  std::int64_t m = 512, n = 512, k = 512;
  std::string label() const { return "M" + std::to_string(m) + "_N" + std::to_string(n) + "_K" + std::to_string(k); }
  double flops() const { return 2.0 * static_cast<double>(m * n * k); }
};

/// softmax, sum and max along the rows of x [R, C].
qkv::ir::Graph rows_graph() {
  qkv::ir::Graph g;
  const auto x = g.add_input("x", qkv::DType::f32, {g.symbol("R"), g.symbol("C")});
  qkv::ir::Attrs axis;
  axis.axis = 1;
  g.set_output("p", g.add(qkv::ir::Op::softmax, {x}, axis));
  g.set_output("s", g.add(qkv::ir::Op::reduce_sum, {x}, axis));
  g.set_output("m", g.add(qkv::ir::Op::reduce_max, {x}, axis));
  return g;
}

/// out = a b in `dtype`; in f16 or bf16, the half-precision graph the backends run (operands
/// and output held in 16 bits, the product accumulated in f32 and rounded once).
qkv::ir::Graph matmul_graph(qkv::DType dtype = qkv::DType::f32) {
  qkv::ir::Graph g;
  const auto m = g.symbol("M"), n = g.symbol("N"), k = g.symbol("K");
  g.set_output("out", g.add(qkv::ir::Op::matmul, {g.add_input("a", dtype, {m, k}), g.add_input("b", dtype, {k, n})}));
  return g;
}

/// The decoder block's forward, or its forward + backward: d_x and every parameter's gradient
/// from an output gradient "dout".
qkv::ir::Graph decoder_graph(const qkv::models::Dims& dims, bool backward) {
  const auto& model = qkv::models::find_model("decoder-block");
  qkv::ir::Graph g = model.build(qkv::models::resolve_options(model, {}), dims);
  if (!backward) return g;
  std::vector<std::string> wrt;
  for (auto v : g.inputs()) wrt.push_back(g.node(v).name);
  return qkv::ir::build_backward(g, {"", wrt, {"out"}});
}

void set_rate(benchmark::State& state, double flops) {
  if (flops > 0) state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

/// Times runs of `g` on backend `name` at `dims`, planned once before timing; `per_invocation`
/// turns the vulkan backend's subgroup reductions off; with `into`, each run writes into the last
/// run's outputs (Executable::run_into, what a decode loop calls) rather than returning new ones.
void bench_graph(benchmark::State& state, const std::string& name, const qkv::ir::Graph& g, const qkv::models::Dims& dims, double flops,
                 bool per_invocation = false, bool into = false) {
  std::unique_ptr<qkv::backend::Backend> backend;
  std::unique_ptr<qkv::backend::Executable> exe;
  try {
    if (per_invocation) setenv("QKV_VULKAN_SUBGROUP_REDUCTIONS", "0", 1);
    backend = qkv::backend::create(name);
    if (per_invocation) unsetenv("QKV_VULKAN_SUBGROUP_REDUCTIONS");
    exe = backend->compile(g);
  } catch (const qkv::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const TensorMap in = qkv::backend::random_inputs(g, dims, 42);
  TensorMap out = exe->run(in);
  if (into) {
    for (auto _ : state) {
      exe->run_into(in, out);
      benchmark::DoNotOptimize(out.begin()->second.raw());
    }
  } else {
    for (auto _ : state) benchmark::DoNotOptimize(exe->run(in));
  }
  set_rate(state, flops);
}

void bench_sgemm(benchmark::State& state, MatmulShape s) {
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k), 0.5f), b(static_cast<std::size_t>(s.k * s.n), 0.25f),
      c(static_cast<std::size_t>(s.m * s.n));
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  set_rate(state, s.flops());
}

/// Google Benchmark's table, then per group (the part after '/') each row against the group's
/// first row, the peer: its share of the peer's rate and its time over the peer's.
class PeerReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (!qkv::bench::reported_row(r)) continue;
      const auto [what, group] = qkv::bench::row_name_parts(r);
      auto rate = r.counters.find("GFLOP/s");
      rows_.push_back({group, what, r.GetAdjustedRealTime(), rate == r.counters.end() ? -1.0 : rate->second.value});
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::map<std::string, double> peer;
    for (const auto& r : rows_) peer.emplace(r.group, r.ms);  // the first row of each group
    std::printf("\n%-22s %-28s %12s %10s %12s %10s\n", "group", "implementation", "ms", "GFLOP/s", "% of peer", "x peer");
    for (const auto& r : rows_) {
      const double p = peer[r.group];
      std::printf("%-22s %-28s %12.3f", r.group.c_str(), r.what.c_str(), r.ms);
      if (r.gflops >= 0) std::printf(" %10.2f", r.gflops);
      else std::printf(" %10s", "");
      std::printf(" %11.2f%% %9.1fx\n", 100.0 * p / r.ms, r.ms / p);
    }
    // Half precision against f32 on the same backend and group ("vulkan-f16" against "vulkan";
    // target: no slower, with operands and output in half the memory).
    bool header = false;
    for (const auto& r : rows_)
      for (const std::string suffix : {"-f16", "-bf16"}) {
        if (!r.what.ends_with(suffix)) continue;
        const std::string base = r.what.substr(0, r.what.size() - suffix.size());
        const auto f32 = std::find_if(rows_.begin(), rows_.end(), [&](const Row& o) { return o.group == r.group && o.what == base; });
        if (f32 == rows_.end()) continue;
        if (!header) std::printf("\n%-22s %-28s %12s %12s\n", "group", "half precision", "ms", "vs its f32");
        header = true;
        std::printf("%-22s %-28s %12.3f %11.2fx\n", r.group.c_str(), r.what.c_str(), r.ms, f32->ms / r.ms);
      }
  }

 private:
  struct Row {
    std::string group, what;
    double ms, gflops;
  };
  std::vector<Row> rows_;
};

std::vector<std::int64_t> numbers(const char* env, std::size_t count) {
  std::vector<std::int64_t> v;
  const char* text = std::getenv(env);
  if (!text) return v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::strtoll(item.c_str(), nullptr, 10));
  if (v.size() != count || std::any_of(v.begin(), v.end(), [](std::int64_t x) { return x < 1; })) {
    std::fprintf(stderr, "%s: '%s' is not %zu positive sizes\n", env, text, count);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::string> backends = {"cpu", "vulkan"};
  if (const char* env = std::getenv("QKV_BENCH_BACKENDS")) {
    backends.clear();
    std::stringstream ss(env);
    for (std::string b; std::getline(ss, b, ',');) backends.push_back(b);
  }
  MatmulShape mm;
  if (auto v = numbers("QKV_BENCH_MATMUL", 3); !v.empty()) mm = {v[0], v[1], v[2]};
  qkv::models::Dims decoder = qkv::models::find_model("decoder-block").dims;
  if (auto v = numbers("QKV_BENCH_DECODER", 2); !v.empty()) decoder = {{"B", v[0]}, {"N", v[1]}};
  const std::string decoder_label = "B" + std::to_string(decoder.at("B")) + "_N" + std::to_string(decoder.at("N"));
  qkv::models::Dims rows_dims = {{"R", 4096}, {"C", 256}};
  if (auto v = numbers("QKV_BENCH_ROWS", 2); !v.empty()) rows_dims = {{"R", v[0]}, {"C", v[1]}};
  const std::string rows_label = "R" + std::to_string(rows_dims.at("R")) + "_C" + std::to_string(rows_dims.at("C"));
  static const qkv::ir::Graph rows = rows_graph();

  static const qkv::ir::Graph matmul = matmul_graph();
  static const qkv::ir::Graph forward = decoder_graph(decoder, false), backward = decoder_graph(decoder, true);
  qkv::models::SdpaOptions tiny_options;
  tiny_options.weights = false;
  static const qkv::ir::Graph tiny = qkv::models::sdpa(tiny_options);
  const qkv::models::Dims mm_dims = {{"M", mm.m}, {"N", mm.n}, {"K", mm.k}};
  const qkv::models::Dims tiny_dims = {{"B", 1}, {"N", 16}, {"M", 16}, {"D", 8}, {"Dv", 8}};
  auto add = [](const std::string& name, auto fn, auto... args) {
    benchmark::RegisterBenchmark(name.c_str(), fn, args...)->Unit(benchmark::kMillisecond)->UseRealTime();
  };
  add("sgemm/matmul_" + mm.label(), bench_sgemm, mm);
  for (const auto& b : backends) add(b + "/matmul_" + mm.label(), bench_graph, b, matmul, mm_dims, mm.flops(), false, false);
  static const qkv::ir::Graph matmul_f16 = matmul_graph(qkv::DType::f16), matmul_bf16 = matmul_graph(qkv::DType::bf16);
  for (const auto& b : backends) {
    add(b + "-f16/matmul_" + mm.label(), bench_graph, b, matmul_f16, mm_dims, mm.flops(), false, false);
    add(b + "-bf16/matmul_" + mm.label(), bench_graph, b, matmul_bf16, mm_dims, mm.flops(), false, false);
  }
  for (const auto& b : backends) add(b + "/decoder-block_" + decoder_label, bench_graph, b, forward, decoder, 0.0, false, false);
  for (const auto& b : backends) add(b + "-fwd+bwd/decoder-block-fwd+bwd_" + decoder_label, bench_graph, b, backward, decoder, 0.0, false, false);
  for (const auto& b : backends) add(b + "/tiny-sdpa_B1_N16_D8", bench_graph, b, tiny, tiny_dims, 0.0, false, false);
  for (const auto& b : backends) add(b + "-run_into/tiny-sdpa_B1_N16_D8", bench_graph, b, tiny, tiny_dims, 0.0, false, true);
  for (const auto& b : backends) {
    add(b + "/rows_" + rows_label, bench_graph, b, rows, rows_dims, 0.0, false, false);
    if (b == "vulkan") add("vulkan-per-invocation/rows_" + rows_label, bench_graph, b, rows, rows_dims, 0.0, true, false);
  }
  benchmark::Initialize(&argc, argv);
  PeerReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}

// Scaled dot-product attention on each backend, against the FMA peak measured in the same run
// (bench/limits.hpp), with OpenBLAS sgemm and qkv's own GEMM (the same FLOPs as two plain matrix
// products) and a plain sgemm-softmax-sgemm measured as peers. FLOPs are counted as 4*B*H*N^2*D per forward, also for causal rows (so their rate over
// the full rows' is the speed-up of skipping masked blocks), and as 3x that for forward + backward rows (the training graph: dq, dk, dv from an
// output gradient). Flex rows add a score modifier
// (-softcap: 30 tanh(s / 30); -alibi-causal: ALiBi's per-head slopes with causality, counted as
// full rows like -causal; -dropout-fwd+bwd: dropout 0.1 on the weights, drawn inside the fused
// kernels, forward + backward; -document: packed documents of 128 tokens, a mask_mod from their
// ids, counted as full rows, so its rate over the plain row's is what block sparsity gains, and
// its "skip%" the share of score tiles the kernels left out); vulkan's -unfused row also returns the weights, so its scores are
// materialised (the path every vulkan run took before the flash kernels). Each backend row reports the
// memory its plan holds ("MiB"). Run: build/default/bench/qkv_bench (QKV_BENCH_BACKENDS=cpu,vulkan
// picks backends; QKV_BENCH_SHAPES=1,8,4096,64;4,8,512,64 replaces the shapes; --benchmark_filter
// narrows the rows). -f16 and -bf16 rows run the forward with q, k, v and the output in half
// precision (every op computing in f32 and rounding its result), -fwd+bwd-f16 the training graph
// so (on a GPU with cooperative matrices: the forward, its lse, dq, dk and dv on them; PyTorch's
// peer is ../shared/gpu/torch_sdpa.py's f16 forward+backward), and a last table gives their rate
// over the f32 row's. -jvp rows run forward mode (the output and its tangent along q, k and v:
// the fused tangent kernel on cpu; on vulkan the forward's kernel and the tangent's), counted as the forward's FLOPs, so that a last table gives
// their time over the forward's (issue 44's target: <= 2.2x); cpu-jvp at N = 8192 gives its memory
// ("MiB": the output and its tangent, no score matrix). QKV_BENCH_DEVICE_TIME=1 times vulkan rows by the device's kernel timestamps
// (Executable::profile) instead of the wall clock, which on a discrete GPU also counts the PCIe
// uploads of q, k, v and the download of the output on every run.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cpu/gemm.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/equivalence.hpp"
#include "bench/limits.hpp"
#include "bench/report.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"

namespace {

using qkv::backend::TensorMap;

struct Shape {
  std::int64_t b, h, n, d;
  double flops() const { return 4.0 * static_cast<double>(b * h * n * n * d); }
  std::string label() const { return "B" + std::to_string(b) + "_H" + std::to_string(h) + "_N" + std::to_string(n) + "_D" + std::to_string(d); }
};

const std::vector<Shape> kShapes = {{1, 8, 128, 64}, {4, 8, 512, 64}, {1, 4, 1024, 64}, {1, 1, 16, 8}};
/// Long sequences: forward + backward on cpu only (the memory row of the flex-attention issue).
const std::vector<Shape> kLongShapes = {{1, 8, 8192, 64}};

/// What a row runs: plain attention forward, causal, forward + backward; flex attention with a
/// score modifier (soft-capping at 30; ALiBi with causality; soft-capping forward + backward);
/// dropout on the weights forward + backward (training); the unfused path (the softmax weights
/// are also returned, so the scores are materialised); half precision; and forward mode (the
/// output and its tangent along q, k and v).
enum class Mode { forward, causal, backward, softcap, alibi, softcap_backward, dropout_backward, document, unfused, f16, bf16, f16_backward, jvp };

const char* mode_suffix(Mode m) {
  switch (m) {
    case Mode::forward: return "";
    case Mode::causal: return "-causal";
    case Mode::backward: return "-fwd+bwd";
    case Mode::softcap: return "-softcap";
    case Mode::alibi: return "-alibi-causal";
    case Mode::softcap_backward: return "-softcap-fwd+bwd";
    case Mode::dropout_backward: return "-dropout-fwd+bwd";
    case Mode::document: return "-document";
    case Mode::unfused: return "-unfused";
    case Mode::f16: return "-f16";
    case Mode::bf16: return "-bf16";
    case Mode::f16_backward: return "-fwd+bwd-f16";
    case Mode::jvp: return "-jvp";
  }
  return "";
}

bool is_backward(Mode m) { return m == Mode::backward || m == Mode::softcap_backward || m == Mode::dropout_backward || m == Mode::f16_backward; }

/// ALiBi's slopes need a static head count and alibi_bias a static head dim: H = 8, D = 64 (rows
/// of other shapes skip it).
qkv::ir::Graph alibi_graph(double scale) {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<8>, dim<"N">, dim<64>);
  auto k = input<"k">(dim<"B">, dim<8>, dim<"N">, dim<64>);
  auto v = input<"v">(dim<"B">, dim<8>, dim<"N">, dim<64>);
  return lower(scaled_dot_product_attention(q, k, v, causal, alibi_bias<8>(k), qkv::scale(scale)));
}

qkv::ir::Graph sdpa_graph(double scale, Mode mode) {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<"H">, dim<"N">, dim<"D">);
  auto k = input<"k">(dim<"B">, dim<"H">, dim<"N">, dim<"D">);
  auto v = input<"v">(dim<"B">, dim<"H">, dim<"N">, dim<"D">);
  switch (mode) {
    case Mode::causal: return lower(scaled_dot_product_attention(q, k, v, causal, qkv::scale(scale)));
    case Mode::softcap: return lower(scaled_dot_product_attention(q, k, v, softcap_scores(30.0), qkv::scale(scale)));
    case Mode::alibi: return alibi_graph(scale);
    case Mode::document: {
      auto docs = input<"docs", DType::i32>(dim<"B">, dim<"N">);
      return lower(scaled_dot_product_attention(q, k, v, qkv::scale(scale),
                                                mask_mod([=](auto b, auto, auto i, auto j) { return at(docs, b, i) == at(docs, b, j); })));
    }
    case Mode::unfused: {
      auto weights = attention_weights(q, k, qkv::scale(scale));
      return lower(named<"out">(matmul(weights, v)), named<"weights">(weights));
    }
    case Mode::softcap_backward:
      return ir::build_backward(lower(named<"out">(scaled_dot_product_attention(q, k, v, softcap_scores(30.0), qkv::scale(scale)))),
                                {"", {"q", "k", "v"}, {"out"}});
    case Mode::dropout_backward: {
      auto seed = input<"seed", DType::i32>();
      return ir::build_backward(lower(named<"out">(scaled_dot_product_attention(q, k, v, attn_dropout(0.1, seed), qkv::scale(scale)))),
                                {"", {"q", "k", "v"}, {"out"}});
    }
    case Mode::backward:
      return ir::build_backward(lower(named<"out">(scaled_dot_product_attention(q, k, v, qkv::scale(scale)))), {"", {"q", "k", "v"}, {"out"}});
    case Mode::f16:
    case Mode::bf16:
      return ir::to_dtype(lower(named<"out">(scaled_dot_product_attention(q, k, v, qkv::scale(scale)))),
                          mode == Mode::f16 ? DType::f16 : DType::bf16);
    case Mode::f16_backward:
      return ir::build_backward(ir::to_dtype(lower(named<"out">(scaled_dot_product_attention(q, k, v, qkv::scale(scale)))), DType::f16),
                                {"", {"q", "k", "v"}, {"out"}});
    case Mode::jvp: return ir::build_jvp(lower(named<"out">(scaled_dot_product_attention(q, k, v, qkv::scale(scale)))), {{"q", "k", "v"}, {}});
    case Mode::forward: break;
  }
  return lower(named<"out">(scaled_dot_product_attention(q, k, v, qkv::scale(scale))));
}

/// Random inputs; document ids (when the graph reads them) pack documents of 128 tokens.
TensorMap inputs_for(const qkv::ir::Graph& g, const Shape& s) {
  auto in = qkv::backend::random_inputs(g, {{"B", s.b}, {"H", s.h}, {"N", s.n}, {"D", s.d}}, 42);
  if (auto it = in.find("docs"); it != in.end())
    for (std::int64_t i = 0; i < it->second.numel(); ++i) it->second.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % s.n / 128);
  return in;
}

/// Runs fn(first, last, thread) over [0, n) split across every core with single-threaded sgemm: the peers'
/// best use of OpenBLAS on independent heads (toggling OpenBLAS's own threads between rows
/// measured unstable), and the same ownership of threads as the cpu backend.
template <class F> void on_all_cores(std::int64_t n, F fn) {
  const auto cores = std::min<std::int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (cores <= 1) return fn(0, n, 0);
  std::vector<std::thread> threads;
  for (std::int64_t t = 0; t < cores; ++t) threads.emplace_back([&, t] { fn(n * t / cores, n * (t + 1) / cores, t); });
  for (auto& t : threads) t.join();
}

void set_rate(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

bool uses_device_time(const std::string& backend) { return backend == "vulkan" && std::getenv("QKV_BENCH_DEVICE_TIME"); }

void bench_backend(benchmark::State& state, const std::string& name, Shape s, Mode mode) {
  std::unique_ptr<qkv::backend::Backend> backend;
  try {
    backend = qkv::backend::create(name);
  } catch (const qkv::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  auto g = sdpa_graph(1.0 / std::sqrt(static_cast<double>(s.d)), mode);
  auto exe = backend->compile(g);
  auto in = inputs_for(g, s);
  const bool device_time = uses_device_time(name);
  exe->set_profiling(device_time);
  exe->run(in);  // plans buffers and kernels once
  if (device_time && exe->profile().empty()) {
    state.SkipWithError("QKV_BENCH_DEVICE_TIME: this device writes no timestamps");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(exe->run(in));
    if (!device_time) continue;
    double seconds = 0;
    for (const auto& k : exe->profile()) seconds += k.seconds;
    state.SetIterationTime(seconds);
  }
  set_rate(state, (is_backward(mode) ? 3.0 : 1.0) * s.flops());
  state.counters["MiB"] = static_cast<double>(exe->planned_bytes()) / (1 << 20);
  std::int64_t computed = 0, skipped = 0;
  for (const auto& t : exe->tile_counts()) {
    computed += t.computed;
    skipped += t.skipped;
  }
  if (computed + skipped > 0) state.counters["skip%"] = 100.0 * static_cast<double>(skipped) / static_cast<double>(computed + skipped);
}

/// The limit: the two products of attention as plain sgemm calls, no softmax; one N x N score
/// buffer per thread.
void bench_sgemm(benchmark::State& state, Shape s) {
  const auto heads = s.b * s.h;
  const auto threads = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<float> q(static_cast<std::size_t>(heads * s.n * s.d), 0.5f), scores(static_cast<std::size_t>(threads * s.n * s.n), 0.25f),
      out(q.size());
  const int n = static_cast<int>(s.n), d = static_cast<int>(s.d);
  for (auto _ : state)
    on_all_cores(heads, [&](std::int64_t first, std::int64_t last, std::int64_t thread) {
      float* sh = scores.data() + thread * s.n * s.n;
      for (std::int64_t h = first; h < last; ++h) {
        float* qh = q.data() + h * s.n * s.d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, 1.0f, qh, d, qh, d, 0.0f, sh, n);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, sh, n, qh, d, 0.0f, out.data() + h * s.n * s.d, d);
      }
    });
  benchmark::DoNotOptimize(out.data());
  set_rate(state, s.flops());
}

/// The same two products through the cpu backend's GEMM (backends/cpu/gemm.hpp), a head per
/// thread of its pool at a time (one N x N score buffer per thread, as the sgemm row).
void bench_qkv_gemm(benchmark::State& state, Shape s) {
  using namespace qkv::backend::cpu;
  const auto heads = s.b * s.h, threads = static_cast<std::int64_t>(ThreadPool::global().size());
  std::vector<float> q(static_cast<std::size_t>(heads * s.n * s.d), 0.5f), scores(static_cast<std::size_t>(threads * s.n * s.n), 0.25f),
      out(q.size());
  const GemmShape qk{s.n, s.n, s.d, false, true, s.d, s.d, s.n, qkv::DType::f32}, pv{s.n, s.d, s.n, false, false, s.n, s.d, s.d, qkv::DType::f32};
  std::vector<GemmOperands> first, second;
  for (auto _ : state)
    for (std::int64_t h0 = 0; h0 < heads; h0 += threads) {
      first.clear();
      second.clear();
      for (std::int64_t h = h0; h < std::min(heads, h0 + threads); ++h) {
        float* qh = q.data() + h * s.n * s.d;
        float* sh = scores.data() + (h - h0) * s.n * s.n;
        first.push_back({qh, qh, sh});
        second.push_back({sh, qh, out.data() + h * s.n * s.d});
      }
      gemm(qk, first);
      gemm(pv, second);
    }
  benchmark::DoNotOptimize(out.data());
  set_rate(state, s.flops());
}

/// The plain composition: sgemm, a scalar softmax loop, sgemm (the score matrix materialised).
void bench_sgemm_softmax_sgemm(benchmark::State& state, Shape s) {
  const auto heads = s.b * s.h;
  std::vector<float> q(static_cast<std::size_t>(heads * s.n * s.d), 0.5f), scores(static_cast<std::size_t>(heads * s.n * s.n)), out(q.size());
  const int n = static_cast<int>(s.n), d = static_cast<int>(s.d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (auto _ : state)
    on_all_cores(heads, [&](std::int64_t first, std::int64_t last, std::int64_t) {
      for (std::int64_t h = first; h < last; ++h) {
        float* qh = q.data() + h * s.n * s.d;
        float* sh = scores.data() + h * s.n * s.n;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, scale, qh, d, qh, d, 0.0f, sh, n);
        for (int i = 0; i < n; ++i) {
          float* row = sh + static_cast<std::ptrdiff_t>(i) * n;
          float m = row[0], total = 0;
          for (int j = 1; j < n; ++j) m = std::max(m, row[j]);
          for (int j = 0; j < n; ++j) total += row[j] = std::exp(row[j] - m);
          for (int j = 0; j < n; ++j) row[j] /= total;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, sh, n, qh, d, 0.0f, out.data() + h * s.n * s.d, d);
      }
    });
  benchmark::DoNotOptimize(out.data());
  set_rate(state, s.flops());
}

/// Prints Google Benchmark's table, then each row's GFLOP/s as a ratio of sgemm's for its shape.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (!qkv::bench::reported_row(r)) continue;
      auto it = r.counters.find("GFLOP/s");
      if (it == r.counters.end()) continue;
      const auto [what, shape] = qkv::bench::row_name_parts(r);
      auto mib = r.counters.find("MiB"), skip = r.counters.find("skip%");
      rates_.push_back(
          {what, shape, it->second.value, mib == r.counters.end() ? -1.0 : mib->second.value, skip == r.counters.end() ? -1.0 : skip->second.value});
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::map<std::string, double> peer;
    for (const auto& r : rates_)
      if (r.what == "sgemm") peer[r.shape] = r.gflops;
    // The cpu rows' limit: the FMA peak of every core, measured now (the vulkan rows on lavapipe
    // run on the same cores, through LLVM's vectoriser).
    const double peak = qkv::bench::fma_peak_flops(qkv::backend::cpu::ThreadPool::global().size()) / 1e9;
    std::printf("\nFMA peak: %.0f GFLOP/s (%s, %d threads, measured in this run)\n", peak, qkv::backend::cpu::isa_name(qkv::backend::cpu::host_isa()),
                qkv::backend::cpu::ThreadPool::global().size());
    std::printf("%-24s %-22s %12s %10s %14s %12s %8s\n", "shape", "implementation", "GFLOP/s", "of peak", "vs sgemm", "plan MiB", "skip%");
    for (const auto& r : rates_) {
      std::printf("%-24s %-22s %12.2f %9.1f%% %13.1f%%", r.shape.c_str(), r.what.c_str(), r.gflops, 100.0 * r.gflops / peak,
                  peer.contains(r.shape) ? 100.0 * r.gflops / peer[r.shape] : 0.0);
      if (r.mib >= 0) std::printf(" %12.1f", r.mib);
      if (r.skip >= 0) std::printf(" %8.1f", r.skip);
      std::printf("\n");
    }
    // Half precision against f32 on the same backend and shape (target: >= 0.95x, with q, k, v
    // and the output in half the memory).
    std::map<std::pair<std::string, std::string>, double> f32;
    for (const auto& r : rates_) f32[{r.what, r.shape}] = r.gflops;
    bool header = false;
    for (const auto& r : rates_) {
      for (const char* suffix : {"-f16", "-bf16"}) {
        const std::string sx = suffix;
        if (r.what.size() <= sx.size() || r.what.compare(r.what.size() - sx.size(), sx.size(), sx) != 0) continue;
        const auto base = f32.find({r.what.substr(0, r.what.size() - sx.size()), r.shape});
        if (base == f32.end()) continue;
        if (!header) std::printf("\n%-24s %-22s %12s %14s\n", "shape", "half precision", "GFLOP/s", "vs its f32");
        header = true;
        std::printf("%-24s %-22s %12.2f %13.2fx\n", r.shape.c_str(), r.what.c_str(), r.gflops, r.gflops / base->second);
      }
    }
    // Forward mode against the forward on the same backend and shape: time over the forward's.
    header = false;
    for (const auto& r : rates_) {
      const std::string sx = "-jvp";
      if (r.what.size() <= sx.size() || r.what.compare(r.what.size() - sx.size(), sx.size(), sx) != 0) continue;
      const auto base = f32.find({r.what.substr(0, r.what.size() - sx.size()), r.shape});
      if (base == f32.end()) continue;
      if (!header) std::printf("\n%-24s %-22s %14s %10s\n", "shape", "forward mode", "vs forward", "plan MiB");
      header = true;
      std::printf("%-24s %-22s %13.2fx %10.1f\n", r.shape.c_str(), r.what.c_str(), base->second / r.gflops, r.mib);
    }
  }

 private:
  struct Rate {
    std::string what, shape;
    double gflops;
    double mib;   // the backend's planned memory, or -1 for peers
    double skip;  // the share of score tiles its kernels skipped, or -1 when not counted
  };
  std::vector<Rate> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // every row owns threads itself (see on_all_cores)
  std::vector<std::string> backends = {"cpu", "vulkan"};
  if (const char* env = std::getenv("QKV_BENCH_BACKENDS")) {
    backends.clear();
    std::stringstream ss(env);
    for (std::string b; std::getline(ss, b, ',');) backends.push_back(b);
  }
  std::vector<Shape> shapes = kShapes;
  if (const char* env = std::getenv("QKV_BENCH_SHAPES")) {
    shapes.clear();
    std::stringstream ss(env);
    for (std::string item; std::getline(ss, item, ';');) {
      Shape s{};
      if (std::sscanf(item.c_str(), "%" SCNd64 ",%" SCNd64 ",%" SCNd64 ",%" SCNd64, &s.b, &s.h, &s.n, &s.d) != 4 || s.b < 1 || s.h < 1 || s.n < 1 ||
          s.d < 1) {
        std::fprintf(stderr, "QKV_BENCH_SHAPES: '%s' is not B,H,N,D\n", item.c_str());
        return 2;
      }
      shapes.push_back(s);
    }
  }
  for (const auto& s : shapes) {
    benchmark::RegisterBenchmark(("sgemm/" + s.label()).c_str(), bench_sgemm, s)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("qkv-gemm/" + s.label()).c_str(), bench_qkv_gemm, s)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("sgemm-softmax-sgemm/" + s.label()).c_str(), bench_sgemm_softmax_sgemm, s)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (const auto& b : backends) {
      if (b == "reference" && s.n > 128) continue;  // plain double loops: minutes per run
      if (b == "vulkan" && s.n > 512 && std::getenv("QKV_BENCH_SMALL_VULKAN")) continue;
      for (Mode m : {Mode::forward, Mode::causal, Mode::backward, Mode::softcap, Mode::alibi, Mode::softcap_backward, Mode::dropout_backward,
                     Mode::document, Mode::unfused, Mode::f16, Mode::bf16, Mode::f16_backward, Mode::jvp}) {
        if (b == "reference" && m != Mode::forward) continue;
        if (m == Mode::alibi && (s.h != 8 || s.d != 64)) continue;
        if (m == Mode::unfused && b != "vulkan") continue;  // the cpu's own unfused peer is sgemm-softmax-sgemm
        auto* row =
            benchmark::RegisterBenchmark((b + mode_suffix(m) + "/" + s.label()).c_str(), bench_backend, b, s, m)->Unit(benchmark::kMillisecond);
        if (uses_device_time(b)) row->UseManualTime();
        else row->UseRealTime();
      }
    }
  }
  for (const auto& s : kLongShapes) {
    benchmark::RegisterBenchmark(("sgemm/" + s.label()).c_str(), bench_sgemm, s)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("cpu-fwd+bwd/" + s.label()).c_str(), bench_backend, std::string("cpu"), s, Mode::backward)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(1);
    benchmark::RegisterBenchmark(("cpu-jvp/" + s.label()).c_str(), bench_backend, std::string("cpu"), s, Mode::jvp)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(1);
  }
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}

// The cpu backend's GEMM (backends/cpu/gemm.hpp) at the real models' shapes, against the FMA peak
// measured in the same run and beside OpenBLAS: the core it picks for this CPU, and its best core
// for the ISA (OPENBLAS_CORETYPE=SkylakeX or Haswell, read when the library loads: measured in a
// child process of this one).
//
//   build/default/bench/qkv_gemm_bench [--reps N] [--threads T] [--no-peers]
//
// Prints one row per shape: GFLOP/s and fraction of the peak of qkv f32, qkv with bf16 B (a half
// checkpoint's weights), OpenBLAS as installed and OpenBLAS's best, each the median of N runs.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm.hpp"
#include "backends/cpu/isa.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "bench/limits.hpp"
#include "ir/half.hpp"

namespace {

using namespace qkv;
using namespace qkv::backend::cpu;
using Clock = std::chrono::steady_clock;

struct Case {
  const char* what;
  std::int64_t m, n, k;
  bool ta, tb;
};

/// GPT-2 small's prefill of 512 tokens (Conv1D weights: B as stored, [k, n]), its LM head over
/// 128 positions, a Llama-1B-shaped projection and MLP (nn.Linear: B transposed), MiniLM's batch
/// of 32 x 24 tokens, and a weight gradient (A transposed).
const Case kCases[] = {
    {"gpt2 qkv proj", 512, 2304, 768, false, false},   {"gpt2 attn out", 512, 768, 768, false, false},
    {"gpt2 mlp up", 512, 3072, 768, false, false},     {"gpt2 mlp down", 512, 768, 3072, false, false},
    {"gpt2 lm head", 128, 50257, 768, false, true},    {"llama-1b q proj", 512, 2048, 2048, false, true},
    {"llama-1b mlp up", 512, 8192, 2048, false, true}, {"minilm qkv", 768, 384, 384, false, true},
    {"minilm mlp up", 768, 1536, 384, false, true},    {"grad W mlp up", 768, 3072, 512, true, false},
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Operands {
  std::vector<float> a, b, c;
  std::vector<std::uint16_t> b16;
  explicit Operands(const Case& s)
      : a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n)), c(static_cast<std::size_t>(s.m * s.n)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    b16.resize(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) b16[i] = qkv::to_bfloat16(b[i]).bits;
  }
};

template <class Fn> double gflops(const Case& s, int reps, Fn&& fn) {
  fn();  // warm: pages touched, buffers grown
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(s.m * s.n * s.k) / median(t) / 1e9;
}

/// OpenBLAS's sgemm over the pool's threads, the rows split between them (as the backend used to).
double openblas_gflops(const Case& s, int reps) {
  Operands o(s);
  ThreadPool& pool = ThreadPool::global();
  const std::int64_t parts = pool.size(), rows = (s.m + parts - 1) / parts;
  return gflops(s, reps, [&] {
    pool.parallel_for(parts, [&](std::int64_t t) {
      const std::int64_t r0 = t * rows, r = std::min(rows, s.m - r0);
      if (r <= 0) return;
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, static_cast<int>(r), static_cast<int>(s.n),
                  static_cast<int>(s.k), 1.0f, o.a.data() + (s.ta ? r0 : r0 * s.k), static_cast<int>(s.ta ? s.m : s.k), o.b.data(),
                  static_cast<int>(s.tb ? s.k : s.n), 0.0f, o.c.data() + r0 * s.n, static_cast<int>(s.n));
    });
  });
}

double qkv_gflops(const Case& s, int reps, DType b_dtype) {
  Operands o(s);
  const GemmShape shape{s.m, s.n, s.k, s.ta, s.tb, s.ta ? s.m : s.k, s.tb ? s.k : s.n, s.n, b_dtype};
  const GemmOperands e{o.a.data(), b_dtype == DType::f32 ? static_cast<const void*>(o.b.data()) : o.b16.data(), o.c.data()};
  return gflops(s, reps, [&] { gemm(shape, {&e, 1}); });
}

/// OpenBLAS's best core for this ISA, or "" when the installed build already runs it.
std::string best_openblas_core() {
  switch (host_isa()) {
    case Isa::avx512: return "SkylakeX";
    case Isa::avx2: return "Haswell";
    case Isa::baseline: break;
  }
  return "";
}

/// Runs this program again with OPENBLAS_CORETYPE=core and returns the OpenBLAS rows it prints.
std::map<std::string, double> openblas_in_child(const char* self, const std::string& core, int reps) {
  std::map<std::string, double> rows;
  const std::string cmd = "OPENBLAS_CORETYPE=" + core + " QKV_GEMM_BENCH_CHILD=1 '" + std::string(self) + "' --reps " + std::to_string(reps);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return rows;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    char what[128];
    double g = 0;
    if (std::sscanf(line, "%127[^\t]\t%lf", what, &g) == 2) rows[what] = g;
  }
  pclose(p);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  bool peers = true;
  for (int i = 1; i < argc; ++i) {
    const bool value = i + 1 < argc;
    if (std::strcmp(argv[i], "--no-peers") == 0) peers = false;
    else if (std::strcmp(argv[i], "--reps") == 0 && value) reps = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--threads") == 0 && value) setenv("QKV_NUM_THREADS", argv[++i], 1);
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads T] [--no-peers]\n", argv[0]);
      return 2;
    }
  }
  if (std::getenv("QKV_GEMM_BENCH_CHILD")) {  // OpenBLAS's rows only, under the core the parent chose
    for (const Case& s : kCases) std::printf("%s\t%.3f\n", s.what, openblas_gflops(s, reps));
    return 0;
  }
  const int threads = ThreadPool::global().size();
  const double peak = bench::fma_peak_flops(threads) / 1e9;
  const std::string best = best_openblas_core();
  std::map<std::string, double> best_rows;
  if (peers && !best.empty() && best != openblas_get_corename()) best_rows = openblas_in_child(argv[0], best, reps);
  std::printf("qkv GEMM: %s, %d threads; FMA peak %.0f GFLOP/s (%s, measured); OpenBLAS as installed: %s core\n", gemm_kernel_name(), threads, peak,
              isa_name(host_isa()), openblas_get_corename());
  std::printf("GFLOP/s, median of %d, and the share of the peak:\n\n", reps);
  std::printf("%-17s %-17s %15s %15s %15s %15s %9s\n", "shape", "M x N x K", "qkv f32", "qkv bf16 B", "OpenBLAS",
              best.empty() ? "-" : ("OpenBLAS " + best).c_str(), "vs best");
  for (const Case& s : kCases) {
    char dims[64];
    std::snprintf(dims, sizeof dims, "%lldx%lldx%lld%s%s", static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                  s.ta ? " At" : "", s.tb ? " Bt" : "");
    const double f32 = qkv_gflops(s, reps, DType::f32), b16 = qkv_gflops(s, reps, DType::bf16), ob = peers ? openblas_gflops(s, reps) : 0;
    const auto it = best_rows.find(s.what);
    const double ob_best = it != best_rows.end() ? it->second : ob;
    auto cell = [&](double g) {
      static char buf[4][32];
      static int i = 0;
      i = (i + 1) % 4;
      if (g <= 0) return "-";  // not measured (--no-peers)
      std::snprintf(buf[i], sizeof buf[i], "%6.0f (%3.0f%%)", g, 100 * g / peak);
      return static_cast<const char*>(buf[i]);
    };
    std::printf("%-17s %-17s %15s %15s %15s %15s %8.2fx\n", s.what, dims, cell(f32), cell(b16), cell(ob), cell(ob_best),
                ob_best > 0 ? f32 / ob_best : 0.0);
  }
  return 0;
}

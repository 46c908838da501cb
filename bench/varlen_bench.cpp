// A packed batch of sequences of different lengths (varlen: offsets, no padding) against the same
// sequences run one by one, and against the padded batch, on one backend (cpu unless named), in
// one run: eight sequences of 64 to 1024 tokens, 8 heads of 64, causal, f32, forward and forward
// + backward. Targets (issue 42): packed within 1.1x of one by one, and 2x faster than padded.
//
//   build/default/bench/qkv_varlen_bench [--repeat 5] [--backend cpu]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/equivalence.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"

namespace {

using namespace qkv;
using namespace qkv::dsl;
using Clock = std::chrono::steady_clock;

const std::vector<std::int64_t> kLengths = {64, 1024, 128, 512, 256, 896, 384, 640};
constexpr std::int64_t kMax = 1024;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median seconds of `repeat` rounds of running each input set once (after one warm-up round),
/// each into its own outputs as a serving loop would (run_into): with run, every round would also
/// allocate them, and the packed batch's one output of 8 MiB, fresh huge pages the kernel zeroes,
/// cost more than the eight smaller ones of the sequences one by one.
double seconds(backend::Executable& exe, const std::vector<backend::TensorMap>& inputs, int repeat) {
  std::vector<backend::TensorMap> outputs(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) exe.run_into(inputs[i], outputs[i]);
  std::vector<double> t;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < inputs.size(); ++i) exe.run_into(inputs[i], outputs[i]);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

/// The graph, or its backward for q, k and v (dout an input) when `train`.
ir::Graph trained(const ir::Graph& g, bool train) { return train ? ir::build_backward(g, {"", {"q", "k", "v"}, {"out"}}) : g; }

}  // namespace

int main(int argc, char** argv) {
  int repeat = 5;
  std::string backend_name = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
    else if (flag == "--backend") backend_name = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--repeat N] [--backend cpu|vulkan]\n", argv[0]);
      return 2;
    }
  }
  auto b = backend::create(backend_name);
  const std::int64_t total = std::accumulate(kLengths.begin(), kLengths.end(), std::int64_t{0});
  std::vector<std::int32_t> cu = {0};
  std::vector<bool> keep(static_cast<std::size_t>(kLengths.size() * kMax));
  for (std::size_t s = 0; s < kLengths.size(); ++s) {
    cu.push_back(cu.back() + static_cast<std::int32_t>(kLengths[s]));
    for (std::int64_t j = 0; j < kMax; ++j) keep[s * kMax + static_cast<std::size_t>(j)] = j < kLengths[s];
  }
  auto q = input<"q">(dim<8>, dim<"N">, dim<64>);
  auto k = input<"k">(dim<8>, dim<"N">, dim<64>);
  auto v = input<"v">(dim<8>, dim<"N">, dim<64>);
  auto offsets = input<"cu", DType::i32>(dim<9>);
  const ir::Graph packed = lower(named<"out">(scaled_dot_product_attention(q, k, v, varlen(offsets), causal)));
  const ir::Graph alone = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal)));
  // Padded: [8 sequences, 8 heads, 1024, 64], the padding keys masked (queries past a sequence's
  // end are computed and thrown away).
  auto pq = input<"q">(dim<8>, dim<8>, dim<kMax>, dim<64>);
  auto pk = input<"k">(dim<8>, dim<8>, dim<kMax>, dim<64>);
  auto pv = input<"v">(dim<8>, dim<8>, dim<kMax>, dim<64>);
  auto valid = input<"keep", DType::boolean>(dim<8>, dim<1>, dim<1>, dim<kMax>);
  const ir::Graph padded = lower(named<"out">(scaled_dot_product_attention(pq, pk, pv, valid, causal)));

  const std::string threads = backend_name == "cpu" ? ", " + std::to_string(backend::cpu::ThreadPool::global().size()) + " threads" : "";
  std::printf("varlen on %s%s: %zu sequences of 64..1024 tokens (%lld in all), 8 heads of 64, causal, f32; median of %d\n", backend_name.c_str(),
              threads.c_str(), kLengths.size(), static_cast<long long>(total), repeat);
  std::printf("%-18s %12s %14s %12s %14s %14s\n", "", "packed ms", "one by one ms", "padded ms", "packed / one", "padded / packed");
  for (bool train : {false, true}) {
    const ir::Graph gp = trained(packed, train), ga = trained(alone, train), gd = trained(padded, train);
    backend::TensorMap in = backend::random_inputs(gp, {{"N", total}}, 1);
    in.insert_or_assign("cu", Tensor::from<std::int32_t>({static_cast<std::int64_t>(cu.size())}, cu));
    std::vector<backend::TensorMap> each;
    for (std::int64_t l : kLengths) each.push_back(backend::random_inputs(ga, {{"N", l}}, 2));
    backend::TensorMap din = backend::random_inputs(gd, {}, 3);
    std::copy(keep.begin(), keep.end(), din.at("keep").data<bool>());
    auto ep = b->compile(gp), ea = b->compile(ga), ed = b->compile(gd);
    const double tp = seconds(*ep, {in}, repeat), ta = seconds(*ea, each, repeat), td = seconds(*ed, {din}, repeat);
    std::printf("%-18s %12.2f %14.2f %12.2f %13.2fx %13.2fx\n", train ? "forward+backward" : "forward", tp * 1e3, ta * 1e3, td * 1e3, tp / ta,
                td / tp);
  }
  return 0;
}

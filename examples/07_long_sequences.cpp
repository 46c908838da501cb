// Long sequences: the score matrix of attention grows as N². When nothing else needs the weights,
// the cpu backend fuses attention and streams key blocks through an online softmax, holding
// O(N·D) memory; asking for the weights (or a backend without the fused kernel) keeps N² floats.
//   example_07_long_sequences [backend]
#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  try {
    auto q = input<"q">(dim<1>, dim<"N">, dim<16>);
    auto k = input<"k">(dim<1>, dim<"N">, dim<16>);
    auto v = input<"v">(dim<1>, dim<"N">, dim<16>);
    auto w = attention_weights(q, k, causal);
    ir::Graph out_only = lower(named<"out">(matmul(w, v)));
    ir::Graph with_weights = lower(named<"out">(matmul(w, v)), named<"weights">(w));
    auto fused = be->compile(out_only);
    auto full = be->compile(with_weights);
    bool any_fused = false;
    for (const auto& n : fused->graph().nodes()) any_fused |= n.op == ir::Op::attention;
    std::printf("%s %s attention when only the output is asked for\n\n", be->name().c_str(), any_fused ? "fuses" : "does not fuse");
    std::printf("%8s %16s %16s %12s\n", "N", "out only (MB)", "with weights", "N^2 floats");
    for (std::int64_t n : {128, 512, 2048}) {
      auto in = backend::random_inputs(out_only, {{"N", n}}, 1);
      fused->run(in);
      full->run(in);
      std::printf("%8lld %16.2f %16.2f %12.2f\n", static_cast<long long>(n), static_cast<double>(fused->planned_bytes()) / 1e6,
                  static_cast<double>(full->planned_bytes()) / 1e6, static_cast<double>(n * n * 4) / 1e6);
      if (any_fused && fused->planned_bytes() >= n * n * 4) return 1;  // the fused path must not hold the scores
    }
    std::printf("\n(qkv explain sdpa --set weights=false --dim N=2048 shows the same per node)\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
